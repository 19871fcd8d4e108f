/*
 * FlashInfer's paged attention in the GPU forward (KVF_GPU_ATTN=flashinfer): the start-time
 * choice, the plan of a step (built once, before the layers, and read by every attention
 * layer of the step) and the per-layer launches (kernels/kvf_fi_decode.h, kvf_fi_prefill.h,
 * kvf_fi_plan.h).
 *
 * Which kernel a token takes depends on the token alone, never on the batch around it nor on
 * how its prompt was chunked or cache-hit: a prompt token (position below prompt_len, or a
 * chunk marked prompt) goes to FlashInfer's prefill (one fixed query tile, no split-KV: a
 * row's sums run over its KV in one order, and the masked tail of its tile adds exact
 * zeros), an output token to FlashInfer's decode (kvferry's fixed split-KV plan of the
 * token's own context length). So a decode step, a mixed step, a prompt step and the
 * recompute of a preempted request (its outputs become decode entries, one per token, with
 * their own context length) give a token the same bits. A GQA group FlashInfer's decode does
 * not dispatch (5, 7, 10...: kvf_fi_geom_t.decode_on_prefill) sends each output token to its
 * prefill instead, as a request of one query token over its own context (listed before the
 * prompt spans, so the row order stays the same); its plan is the prefill's fixed one, so
 * the token's bits still depend on its context alone.
 *
 * Rows. FlashInfer reads q and writes o in its own row order: the step's decode entries
 * first, then each prompt span's tokens. The K/V of the new tokens are written first (one
 * kvf_attn_write_paged_seqs call, the write alone); q (with k and v: the projection rows [T][R] as they
 * are, q_ld = R) is rounded to bf16 in one conversion, gathered into that order first when
 * the step's rows are not already in it; the bf16 output is widened back into the layer's
 * fp32 rows (gathered back the same way).
 *
 * Pages. A request's page indices are those of slot 0 of its group (kvf_fi_pages_kv(), by the
 * geometry's strides: --kv-layout layer-major or head-major); a layer in slot j passes the
 * pool's base moved by j slots (j * kvf_kv_strides_t.slot bytes: a multiple of FlashInfer's
 * page unit, kvf_fi_plan.h), so one plan per cache group serves every layer.
 *
 * Rejected: the kernel chosen by the step (prefill for any step with a prompt token, decode
 * for pure decode steps): an output token would get other bits when a prompt shares its
 * step (test_devsim_fi_invariance fails that way); FlashInfer's own planner (it sizes split-KV
 * from the batch); a plan per layer (the same arrays uploaded once per attention layer);
 * for the group of 5, split-KV on the prefill kernel for output tokens (its merge is a
 * second kernel per layer; at the 2k contexts a 2048-token split gives one chunk
 * anyway) or padding the group to 6 with a zero query head (FlashInfer's decode would read
 * a q layout kvferry does not hold; 20 % more work).
 *
 * Refused at start, by name, when this build has no FlashInfer for the cache (dtype,
 * head_dim) or FlashInfer cannot read the cache (kvf_fi_geometry()'s reason). Served by
 * kvferry's kernel, said once at start: sliding-window layers, and attention sinks. Why
 * not window_left (FlashInfer 0.7.4's headers): its decode applies it as a mask only, over
 * the whole KV from position 0, so it reads the pages of blocks already freed (their
 * masked NaN or stale values reach the output through 0 x V); its prefill starts a tile's
 * KV loop at the window start of the tile's first query row, so the loop's tile grid, and
 * with it a row's sums, moves with where the prompt was chunked (the batch). The way that
 * keeps the bits: decode entries' pages from the window's first page on (whole pages
 * dropped: no RoPE in the kernel, the masks are relative to kv_len) with window_left as
 * the mask; prompt spans through a variant whose window_left member is kv_len (the loop
 * anchored at 0) and whose mask holds the window, freed pages given a written page's
 * index. Sinks: the prefill kernel has a hook for them (the variant's update_m_d, as
 * FlashInfer's JIT sink variant uses), its decode none. Served by kvferry's kernel for one
 * step: a step over the capacities sized at start (more than 2 x max_seqs decode entries:
 * only a recompute of many outputs). Refused with KVF_GPU_GRAPHS=decode (a graphed step
 * would take kvferry's kernel: the plan is not in the graph's published inputs yet).
 */
#include "kvf_model_int.h"
#include "kvf_fi_decode.h"
#include "kvf_fi_prefill.h"
#include "kvf_attention_seqs.h"

#include <stdint.h>

/* the arrays of one cache group's plan (int32 unless said), in its host and device twins */
enum { D_IDX, D_INDPTR, D_LAST, D_REQ, D_TILE, D_OIND, D_CHUNK, D_VALID /* bool */,
       P_IDX, P_INDPTR, P_LAST, P_QIND, P_REQ, P_QT, P_KT, P_CHUNK, FI_NARR };
/* the device buffers after the groups' plans */
enum { B_TMPV, B_TMPS, B_QB, B_OB, B_LSE, FI_NBUF };

struct kvf_fwd_fi {
    kvf_fi_geom_t geom;
    int      S, T, R, dcap;          /* capacities: requests, rows, row width, decode entries */
    int      preq;                   /* prefill requests: S, + dcap with decode_on_prefill */
    int      mpr, dw, pw;            /* pages of a request, decode and prefill plan entries */
    int      qh, hd, group;
    bool     grp_on[KVF_MAX_KV_GROUPS];   /* the group has a full-attention layer */
    int      ngrp;                   /* groups uploaded: the highest on + 1 */
    size_t   off[FI_NARR], grp_bytes;     /* one group's plan: offsets, 256-byte size */
    size_t   boff[FI_NBUF];          /* buffers, from the device block's start */
    uint8_t *host;                   /* [ngrp] plans (host twin) */
    void    *dev;                    /* [ngrp] plans, then the buffers */
    int32_t *kv_len, *dseq;          /* [dcap] each decode entry's context and request */
    int32_t *qo_len, *pkv, *pseq;    /* [preq] each prefill request's tokens, context, request
                                      * (decode_on_prefill: the decode entries first) */
    int32_t *perm, *inv;             /* [T] FlashInfer's row -> the step's row, and back */
    /* the step's plan (kvf_fwd_fi_step) */
    bool     step_on, identity;
    int      nd, np, prow, dwork, pwork;
    unsigned long long steps, reordered, layer_calls;
};

static size_t kvf_fi_up(size_t v)
{
    return (v + 255) & ~(size_t)255;
}

/* KVF_GPU_ATTN asks for FlashInfer. */
static bool kvf_fi_wanted(void)
{
    const char *env = getenv("KVF_GPU_ATTN");
    return (env != NULL) && (strcmp(env, "flashinfer") == 0);
}

/* The capacities and the byte layout of the blocks (sizes from the step limits). */
static void kvf_fi_layout(struct kvf_fwd_fi *fi, size_t *total)
{
    const int cp = fi->geom.chunk_pages;
    const size_t maxpd = (size_t)fi->dcap * (size_t)fi->mpr;
    const size_t maxpp = (size_t)fi->preq * (size_t)fi->mpr;
    size_t sz[FI_NARR], bs[FI_NBUF], o = 0;

    fi->dw = fi->dcap + (int)((maxpd + (size_t)cp - 1) / (size_t)cp);
    fi->pw = fi->preq + (fi->T * fi->group + KVF_FI_PREFILL_TILE_Q - 1) / KVF_FI_PREFILL_TILE_Q;
    sz[D_IDX] = maxpd * 4;
    sz[D_INDPTR] = sz[D_OIND] = (size_t)(fi->dcap + 1) * 4;
    sz[D_LAST] = (size_t)fi->dcap * 4;
    sz[D_REQ] = sz[D_TILE] = (size_t)fi->dw * 4;
    sz[D_CHUNK] = sz[P_CHUNK] = 4;
    sz[D_VALID] = (size_t)fi->dw * sizeof(bool);
    sz[P_IDX] = maxpp * 4;
    sz[P_INDPTR] = sz[P_QIND] = (size_t)(fi->preq + 1) * 4;
    sz[P_LAST] = (size_t)fi->preq * 4;
    sz[P_REQ] = sz[P_QT] = sz[P_KT] = (size_t)fi->pw * 4;
    for (int i = 0; i < FI_NARR; ++i) {
        fi->off[i] = o;
        o += kvf_fi_up(sz[i]);
    }
    fi->grp_bytes = o;
    o *= (size_t)fi->ngrp;
    bs[B_TMPV] = (size_t)fi->dw * (size_t)fi->qh * (size_t)fi->hd * 2;
    bs[B_TMPS] = (size_t)fi->dw * (size_t)fi->qh * 4;
    bs[B_QB] = (size_t)fi->T * (size_t)fi->R * 2;
    bs[B_OB] = (size_t)fi->T * (size_t)fi->qh * (size_t)fi->hd * 2;
    bs[B_LSE] = (size_t)fi->T * (size_t)fi->qh * 4;
    for (int i = 0; i < FI_NBUF; ++i) {
        fi->boff[i] = o;
        o += kvf_fi_up(bs[i]);
    }
    *total = o;
}

/* The groups FlashInfer serves (a full-attention layer in them); the widest projection. */
static void kvf_fi_groups(kvf_model_h m, const kvf_rank_ctx_t *ctx, struct kvf_fwd_fi *fi,
                          int *windowed)
{
    *windowed = 0;
    for (int l = 0; l < m->cfg.num_layers; ++l) {
        const int g = ctx->layout->layer_group[l];
        if ((m->cfg.layer_kinds[l] != KVF_LAYER_ATTENTION) || (g < 0)) {
            continue;
        }
        if (m->cfg.layer_window[l] > 0) {
            ++*windowed;
            continue;
        }
        fi->grp_on[g] = true;
        fi->ngrp = (g + 1 > fi->ngrp) ? g + 1 : fi->ngrp;
        if (m->ranks[ctx->rank].layers[l].qkv_rows > fi->R) {
            fi->R = m->ranks[ctx->rank].layers[l].qkv_rows;
        }
    }
}

static void kvf_fi_free(struct kvf_fwd_fi *fi)
{
    free(fi->host);
    free(fi->kv_len);
    free(fi->dseq);
    free(fi->qo_len);
    free(fi->pkv);
    free(fi->pseq);
    free(fi->perm);
    free(fi->inv);
    free(fi);
}

kvf_status_t kvf_fwd_fi_prepare(kvf_model_h m, const kvf_rank_ctx_t *ctx,
                                const kvf_step_limits_t *lim)
{
    const kvf_shard_t *s = &m->ranks[ctx->rank].shard;
    const kvf_rank_geometry_t *geo = ctx->geom;
    const int hd = m->cfg.head_dim, qh = s->attn_heads;
    struct kvf_model_ws *ws = ctx->ws;
    struct kvf_fwd_fi *fi;
    kvf_fi_geom_t g;
    const char *why;
    size_t total;
    int windowed;

    if (!kvf_fi_wanted() || (ws->fi != NULL) || (kvf_page_pool_device(ctx->pool)->kind ==
                                                  KVF_DEVICE_CPU) || (qh == 0)) {
        return KVF_OK;
    }
    if ((getenv("KVF_GPU_GRAPHS") != NULL) && (strcmp(getenv("KVF_GPU_GRAPHS"), "decode") == 0)) {
        /* a graphed step reads its inputs from the published block, which holds no FlashInfer
         * plan: it would run kvferry's kernel, and a request's bits would depend on whether
         * its step was graphed */
        kvf_error("KVF_GPU_ATTN=flashinfer with KVF_GPU_GRAPHS=decode: not supported (graphed "
                  "decode steps would take kvferry's attention kernel, so a request's bits "
                  "would depend on its batch); unset one of them");
        return KVF_ERR_UNSUPPORTED;
    }
    if (!kvf_fi_built(geo->kv_dtype, hd)) {
        kvf_error("KVF_GPU_ATTN=flashinfer: this build has no FlashInfer attention for a %s KV "
                  "cache of head_dim %d (builds with -DKVF_FLASHINFER=ON hold bf16, head_dim "
                  "32, 64, 128 and 256)", kvf_dtype_name(geo->kv_dtype), hd);
        return KVF_ERR_UNSUPPORTED;
    }
    why = kvf_fi_geometry_kv(geo->kv_dtype, hd, qh, s->kv_heads, geo->kernel_block_size,
                             &geo->attn, kvf_page_pool_bytes(ctx->pool), 1, &g);
    if (why != NULL) {
        kvf_error("KVF_GPU_ATTN=flashinfer: FlashInfer cannot serve this KV cache: %s", why);
        return KVF_ERR_UNSUPPORTED;
    }
    fi = calloc(1, sizeof(*fi));
    if (fi == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    fi->geom = g;
    fi->qh = qh;
    fi->hd = hd;
    fi->group = qh / s->kv_heads;
    fi->S = (lim->max_seqs > 0) ? lim->max_seqs : 1;
    fi->T = (lim->max_tokens > 0) ? lim->max_tokens : 1;
    fi->dcap = 2 * fi->S;
    fi->preq = fi->S + (g.decode_on_prefill ? fi->dcap : 0);
    fi->mpr = ((lim->max_blocks > 0) ? lim->max_blocks : 1) * geo->ppl;
    kvf_fi_groups(m, ctx, fi, &windowed);
    if (fi->ngrp == 0) {
        kvf_fi_free(fi);   /* every attention layer slides: kvferry's kernel throughout */
        kvf_notice("attention: KVF_GPU_ATTN=flashinfer: every attention layer has a sliding "
                   "window: kvferry's kernel");
        return KVF_OK;
    }
    if (m->cfg.attn_sinks) {
        kvf_notice("attention: KVF_GPU_ATTN=flashinfer: attention sinks (gpt_oss): kvferry's "
                   "kernel");
    }
    if (m->cfg.attn_softcap > 0.0) {
        /* FlashInfer's logits_soft_cap is not in kvferry's batch-invariant FlashInfer
         * variants (their scores are fixed at build): the capped layers take kvferry's
         * kernel, which caps on every path */
        kvf_notice("attention: KVF_GPU_ATTN=flashinfer: attn_logit_softcapping %g: kvferry's "
                   "kernel (FlashInfer's soft cap is not in the batch-invariant variants "
                   "built)", m->cfg.attn_softcap);
    }
    kvf_fi_layout(fi, &total);
    fi->host = calloc((size_t)fi->ngrp, fi->grp_bytes);   /* unplanned groups upload zeros */
    fi->kv_len = malloc((size_t)fi->dcap * 4);
    fi->dseq = malloc((size_t)fi->dcap * 4);
    fi->qo_len = malloc((size_t)fi->preq * 4);
    fi->pkv = malloc((size_t)fi->preq * 4);
    fi->pseq = malloc((size_t)fi->preq * 4);
    fi->perm = malloc((size_t)fi->T * 4);
    fi->inv = malloc((size_t)fi->T * 4);
    if ((fi->host == NULL) || (fi->kv_len == NULL) || (fi->dseq == NULL) ||
        (fi->qo_len == NULL) || (fi->pkv == NULL) || (fi->pseq == NULL) || (fi->perm == NULL) ||
        (fi->inv == NULL) || (kvf_device_alloc(&ws->dev, total, &fi->dev) != KVF_KERN_OK)) {
        kvf_error("KVF_GPU_ATTN=flashinfer: %zu bytes of plans and buffers cannot be "
                  "allocated", total);
        kvf_fi_free(fi);
        return KVF_ERR_NO_MEMORY;
    }
    ws->fi = fi;
    if (ctx->rank == 0) {
        if (g.decode_on_prefill) {
            kvf_notice("attention: FlashInfer (KVF_GPU_ATTN=flashinfer): prompt tokens on its "
                       "prefill (query tiles of %d rows, no split-KV), outputs on its prefill "
                       "too, one query token each (GQA group %d: its decode dispatches 1, 2, "
                       "3, 4, 6, 8, 16), whatever the batch; %d sliding-window layer(s) on "
                       "kvferry's kernel", KVF_FI_PREFILL_TILE_Q, fi->group, windowed);
        } else {
            kvf_notice("attention: FlashInfer (KVF_GPU_ATTN=flashinfer): prompt tokens on its "
                       "prefill (query tiles of %d rows, no split-KV), outputs on its decode "
                       "(split-KV chunks of %d pages of %d tokens), whatever the batch; %d "
                       "sliding-window layer(s) on kvferry's kernel", KVF_FI_PREFILL_TILE_Q,
                       g.chunk_pages, g.page_tokens, windowed);
        }
    }
    return KVF_OK;
}

void kvf_fwd_fi_destroy(struct kvf_model_ws *ws)
{
    if ((ws == NULL) || (ws->fi == NULL)) {
        return;
    }
    if (ws->fi->steps > 0) {
        kvf_notice("attention: FlashInfer ran %llu layer calls on %llu step plans (%llu with "
                   "rows reordered)", ws->fi->layer_calls, ws->fi->steps, ws->fi->reordered);
    }
    kvf_device_free(&ws->dev, ws->fi->dev);
    kvf_fi_free(ws->fi);
    ws->fi = NULL;
}

#define FI_H(_fi, _g, _i) ((int32_t *)((_fi)->host + (size_t)(_g) * (_fi)->grp_bytes + \
                                       (_fi)->off[_i]))
#define FI_D(_fi, _g, _i) ((void *)((uint8_t *)(_fi)->dev + (size_t)(_g) * (_fi)->grp_bytes + \
                                    (_fi)->off[_i]))
#define FI_B(_fi, _i) ((void *)((uint8_t *)(_fi)->dev + (_fi)->boff[_i]))

/* Prompt tokens of @a sq's chunk: [0, np) of its n tokens (the rest are outputs). */
static int kvf_fi_prompt_tokens(const kvf_fwd_seq_t *sq)
{
    const int n = sq->num_tokens, pl = sq->prompt_len - sq->start;

    if (sq->prompt_len > 0) {
        return (pl < 0) ? 0 : (pl > n) ? n : pl;
    }
    return sq->prompt ? n : 0;
}

/* The step's rows in FlashInfer's order (decode entries, then prompt spans) and each entry's
 * request and context; false when over the capacities. */
static bool kvf_fi_rows(struct kvf_fwd_fi *fi, const kvf_fwd_batch_t *batch)
{
    int nd = 0, np = 0, prow = 0, di = 0, pr, o = 0;

    for (int i = 0; i < batch->num_seqs; ++i) {
        const int npr = kvf_fi_prompt_tokens(&batch->seqs[i]);
        nd += batch->seqs[i].num_tokens - npr;
        np += (npr > 0);
        prow += npr;
    }
    if ((nd > fi->dcap) || (np > fi->S) || (nd + prow > fi->T)) {
        return false;
    }
    fi->nd = nd;
    fi->prow = prow;
    pr = nd;
    np = fi->geom.decode_on_prefill ? nd : 0;   /* the decode entries' own prefill requests */
    for (int i = 0; i < batch->num_seqs; ++i) {
        const kvf_fwd_seq_t *sq = &batch->seqs[i];
        const int npr = kvf_fi_prompt_tokens(sq);
        if (npr > 0) {
            fi->qo_len[np] = npr;
            fi->pkv[np] = sq->start + npr;
            fi->pseq[np++] = i;
            for (int t = 0; t < npr; ++t) {
                fi->perm[pr++] = o + t;
            }
        }
        for (int t = npr; t < sq->num_tokens; ++t, ++di) {
            fi->kv_len[di] = sq->start + t + 1;
            fi->dseq[di] = i;
            fi->perm[di] = o + t;
            if (fi->geom.decode_on_prefill) {   /* one query token, its own context */
                fi->qo_len[di] = 1;
                fi->pkv[di] = fi->kv_len[di];
                fi->pseq[di] = i;
            }
        }
        o += sq->num_tokens;
    }
    fi->np = np;
    if (fi->geom.decode_on_prefill) {
        fi->nd = 0;   /* FlashInfer's decode does not run; rows unchanged: outputs first */
    }
    fi->identity = true;
    for (int j = 0; j < o; ++j) {
        fi->inv[fi->perm[j]] = j;
        fi->identity = fi->identity && (fi->perm[j] == j);
    }
    return true;
}

/* Page indices (slot 0) of @a n entries of requests @a seq with contexts @a len into group
 * @a g's IDX / INDPTR / LAST arrays; false when they do not fit. */
static bool kvf_fi_pages_of(struct kvf_fwd_fi *fi, const kvf_rank_ctx_t *ctx,
                            const kvf_fwd_batch_t *batch, int g, int n, const int32_t *seq,
                            const int32_t *len, int idx, int cap)
{
    const kvf_rank_geometry_t *geo = ctx->geom;
    int32_t *pages = FI_H(fi, g, idx), *indptr = FI_H(fi, g, idx + 1);
    int32_t *last = FI_H(fi, g, idx + 2);
    int k = 0;

    indptr[0] = 0;
    for (int i = 0; i < n; ++i) {
        const int pn = kvf_fi_pages_kv(&fi->geom, batch->seqs[seq[i]].group_blocks[g],
                                       geo->block_size, 0, len[i], pages + k, cap - k);
        if (pn < 1) {
            return false;
        }
        k += pn;
        indptr[i + 1] = k;
        last[i] = len[i] - (pn - 1) * fi->geom.page_tokens;
    }
    return true;
}

void kvf_fwd_fi_step(const kvf_rank_ctx_t *ctx, const kvf_device_t *dev,
                     const kvf_fwd_batch_t *batch)
{
    struct kvf_model_ws *ws = ctx->ws;
    struct kvf_fwd_fi *fi = ws->fi;

    if (fi == NULL) {
        return;
    }
    fi->step_on = false;
    if ((ws->in != NULL) || !kvf_fi_rows(fi, batch)) {
        return;
    }
    for (int g = 0; g < fi->ngrp; ++g) {
        if (!fi->grp_on[g]) {
            continue;
        }
        if ((fi->nd > 0) &&
            (!kvf_fi_pages_of(fi, ctx, batch, g, fi->nd, fi->dseq, fi->kv_len, D_IDX,
                              fi->dcap * fi->mpr) ||
             ((fi->dwork = kvf_fi_decode_plan(&fi->geom, fi->kv_len, fi->nd,
                                              FI_H(fi, g, D_REQ), FI_H(fi, g, D_TILE),
                                              FI_H(fi, g, D_OIND), fi->dw)) < 1))) {
            return;
        }
        FI_H(fi, g, D_CHUNK)[0] = fi->geom.chunk_pages * fi->geom.page_tokens;
        for (int i = 0; i < fi->dwork; ++i) {
            ((bool *)FI_H(fi, g, D_VALID))[i] = true;
        }
        if ((fi->np > 0) &&
            (!kvf_fi_pages_of(fi, ctx, batch, g, fi->np, fi->pseq, fi->pkv, P_IDX,
                              fi->preq * fi->mpr) ||
             ((fi->pwork = kvf_fi_prefill_plan(fi->qo_len, fi->np, fi->group,
                                               FI_H(fi, g, P_REQ), FI_H(fi, g, P_QT),
                                               FI_H(fi, g, P_KT), FI_H(fi, g, P_QIND),
                                               fi->pw)) < 1))) {
            return;
        }
        FI_H(fi, g, P_CHUNK)[0] = 0;   /* read only with split-KV */
    }
    /* the step's one upload: every group's plan */
    if (kvf_device_memcpy(dev, fi->dev, fi->host, (size_t)fi->ngrp * fi->grp_bytes,
                          KVF_COPY_H2D) != KVF_KERN_OK) {
        return;
    }
    fi->steps++;
    fi->reordered += !fi->identity;
    fi->step_on = true;
}

/* FlashInfer's two launches of layer @a l's attention from the bf16 rows in B_QB (@a R
 * wide) into B_OB. */
static int kvf_fi_launch(kvf_model_h m, const kvf_rank_ctx_t *ctx, const kvf_device_t *dev,
                         int l, int R)
{
    struct kvf_fwd_fi *fi = ctx->ws->fi;
    const kvf_shard_t *s = &m->ranks[ctx->rank].shard;
    const int g = ctx->layout->layer_group[l], qd = fi->qh * fi->hd;
    uint8_t *pool = (uint8_t *)kvf_page_pool_base(ctx->pool) +
                    (size_t)ctx->layout->layer_slot[l] * ctx->geom->attn.slot;
    const float scale = (m->cfg.attention_multiplier > 0.0) ? (float)m->cfg.attention_multiplier :
                        1.0f / sqrtf((float)fi->hd);
    uint16_t *qb = FI_B(fi, B_QB), *ob = FI_B(fi, B_OB);
    float *lse = FI_B(fi, B_LSE);
    int e = KVF_KERN_OK;

    if (fi->nd > 0) {
        const kvf_fi_decode_args_t a = {
            .geom = fi->geom, .head_dim = fi->hd, .q_heads = fi->qh, .kv_heads = s->kv_heads,
            .batch = fi->nd, .work = fi->dwork, .sm_scale = scale, .q = qb, .q_ld = R,
            .pool = pool, .indices = FI_D(fi, g, D_IDX), .indptr = FI_D(fi, g, D_INDPTR),
            .last_page_len = FI_D(fi, g, D_LAST), .request_indices = FI_D(fi, g, D_REQ),
            .kv_tile_indices = FI_D(fi, g, D_TILE), .o_indptr = FI_D(fi, g, D_OIND),
            .chunk_tokens = FI_D(fi, g, D_CHUNK), .valid = FI_D(fi, g, D_VALID),
            .tmp_v = FI_B(fi, B_TMPV), .tmp_s = FI_B(fi, B_TMPS), .o = ob, .lse = lse,
        };
        e = kvf_fi_decode(dev, &a);
    }
    if ((e == KVF_KERN_OK) && (fi->np > 0)) {
        const kvf_fi_prefill_args_t a = {
            .geom = fi->geom, .head_dim = fi->hd, .q_heads = fi->qh, .kv_heads = s->kv_heads,
            .batch = fi->np, .work = fi->pwork, .sm_scale = scale,
            .q = qb + (size_t)fi->nd * (size_t)R, .q_ld = R, .pool = pool,
            .indices = FI_D(fi, g, P_IDX), .indptr = FI_D(fi, g, P_INDPTR),
            .last_page_len = FI_D(fi, g, P_LAST), .q_indptr = FI_D(fi, g, P_QIND),
            .request_indices = FI_D(fi, g, P_REQ), .qo_tile_indices = FI_D(fi, g, P_QT),
            .kv_tile_indices = FI_D(fi, g, P_KT), .kv_chunk_tokens = FI_D(fi, g, P_CHUNK),
            .o = ob + (size_t)fi->nd * (size_t)qd, .lse = lse + (size_t)fi->nd * fi->qh,
        };
        e = kvf_fi_prefill(dev, &a);
    }
    return e;
}

bool kvf_fwd_fi_try(kvf_model_h m, const kvf_rank_ctx_t *ctx, const kvf_device_t *dev,
                    const kvf_fwd_batch_t *batch, int l, const int32_t *pos,
                    kvf_status_t *status_p)
{
    struct kvf_model_ws *ws = ctx->ws;
    struct kvf_fwd_fi *fi = ws->fi;
    const int R = m->ranks[ctx->rank].layers[l].qkv_rows, hd = m->cfg.head_dim;
    const int g = ctx->layout->layer_group[l], slot = ctx->layout->layer_slot[l];
    kvf_status_t status = *status_p;
    int o = 0, T;

    if ((fi == NULL) || (ws->in != NULL) || !fi->step_on || (status != KVF_OK) ||
        (m->cfg.layer_window[l] > 0) || m->cfg.attn_sinks || (m->cfg.attn_softcap > 0.0) ||
        (R > fi->R)) {
        /* kvferry's kernel (said at start): a sliding-window layer (kvf_paged_kv_t.window),
         * attention sinks (gpt_oss: kvf_paged_kv_t.sinks) */
        return false;
    }
    const int qd = fi->qh * hd, kd = m->ranks[ctx->rank].shard.kv_heads * hd;
    /* every request's new K/V first: one call, the write alone (the forward filled the
     * requests' token counts and tables, ws->seq_*) */
    const kvf_attn_seqs_t seqs = {
        .num_seqs = batch->num_seqs, .num_tokens = ws->seq_n, .block_tables = ws->seq_tab,
        .num_blocks = ws->seq_nb,
    };
    kvf_paged_kv_t kv;
    kvf_page_pool_attn_view(ctx->pool, ctx->geom, hd, slot, batch->seqs[0].group_blocks[g],
                            batch->seqs[0].group_num_blocks[g], &kv);
    KVF_KCALL(kvf_attn_write_paged_seqs(dev, &kv, &seqs, ws->proj + qd, ws->proj + qd + kd, R,
                                        NULL, 0, pos, 0, 0.0f, NULL));
    for (int i = 0; i < batch->num_seqs; ++i) {
        o += batch->seqs[i].num_tokens;
    }
    T = o;
    if (fi->identity) {
        KVF_KCALL(kvf_convert(dev, FI_B(fi, B_QB), KVF_DTYPE_BF16, ws->proj, KVF_DTYPE_FP32,
                              (size_t)T * (size_t)R));
    } else {   /* FlashInfer's row order: gathered (fp32, the Mamba rows' scratch), rounded */
        KVF_KCALL(kvf_gather_rows(dev, ws->proj, KVF_DTYPE_FP32, R, fi->perm, T, ws->ybuf));
        KVF_KCALL(kvf_convert(dev, FI_B(fi, B_QB), KVF_DTYPE_BF16, ws->ybuf, KVF_DTYPE_FP32,
                              (size_t)T * (size_t)R));
    }
    KVF_KCALL(kvf_fi_launch(m, ctx, dev, l, R));
    if (fi->identity) {
        KVF_KCALL(kvf_convert(dev, ws->g, KVF_DTYPE_FP32, FI_B(fi, B_OB), KVF_DTYPE_BF16,
                              (size_t)T * (size_t)qd));
    } else {
        KVF_KCALL(kvf_gather_rows(dev, FI_B(fi, B_OB), KVF_DTYPE_BF16, qd, fi->inv, T, ws->g));
    }
    fi->layer_calls++;
    *status_p = status;
    return true;
}
