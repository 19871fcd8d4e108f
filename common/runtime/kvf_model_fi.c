/*
 * FlashInfer's paged decode attention in the GPU forward (KVF_GPU_ATTN=flashinfer): the
 * start-time choice, the per-step plan and the launch (kernels/kvf_fi_decode.h,
 * kvf_fi_plan.h).
 *
 * Which steps: a decode step (every request one token on its cache) outside a CUDA graph;
 * prompt and mixed steps keep kvferry's own attention kernel. The K/V of the new tokens
 * are written by kvf_attn_cache_write, q is rounded to bf16 (FlashInfer's input), the plan
 * is kvferry's fixed split-KV one (a request's chunks depend on its own length only, so its
 * attention does not depend on the batch), and the bf16 output is widened back into the
 * layer's fp32 rows.
 *
 * Refused at start, by name, when this build has no FlashInfer for the cache (dtype,
 * head_dim) or FlashInfer cannot read the cache (kvf_fi_geometry()'s reason), and said
 * once when on. Buffers: one device block of plan arrays (uploaded each step from a host
 * twin in one copy) and FlashInfer's partial outputs, sized from the step limits.
 */
#include "kvf_model_int.h"
#include "kvf_fi_decode.h"

#include <stdint.h>

struct kvf_fwd_fi {
    kvf_fi_geom_t geom;
    int      S, maxp, maxw;      /* capacities: requests, page indices, plan entries */
    size_t   int_bytes;          /* the uploaded part: int32 arrays, then bool valid */
    uint8_t *host;               /* its host twin */
    void    *dev;                /* device block: the uploaded part, then the buffers */
    int32_t *kv_len;             /* [S] host scratch */
    size_t   off[13];            /* byte offsets of the arrays below in both blocks */
};

enum { FI_IDX, FI_INDPTR, FI_LAST, FI_REQ, FI_TILE, FI_OIND, FI_CHUNK, FI_VALID, FI_TMPV,
       FI_TMPS, FI_Q, FI_O, FI_LSE };

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
    size_t sz[13], total = 0;

    if (!kvf_fi_wanted() || (ws->fi != NULL) || (kvf_page_pool_device(ctx->pool)->kind ==
                                                  KVF_DEVICE_CPU) || (qh == 0)) {
        return KVF_OK;
    }
    if (!kvf_fi_built(geo->kv_dtype, hd)) {
        kvf_error("KVF_GPU_ATTN=flashinfer: this build has no FlashInfer decode for a %s KV "
                  "cache of head_dim %d (builds with -DKVF_FLASHINFER=ON hold bf16, head_dim "
                  "32 and 128)", kvf_dtype_name(geo->kv_dtype), hd);
        return KVF_ERR_UNSUPPORTED;
    }
    why = kvf_fi_geometry(geo->kv_dtype, hd, qh, s->kv_heads, geo->kernel_block_size,
                          geo->page_size, kvf_page_pool_bytes(ctx->pool), 1, &g);
    if (why != NULL) {
        kvf_error("KVF_GPU_ATTN=flashinfer: FlashInfer cannot serve this KV cache: %s", why);
        return KVF_ERR_UNSUPPORTED;
    }
    fi = calloc(1, sizeof(*fi));
    if (fi == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    fi->geom = g;
    fi->S = (lim->max_seqs > 0) ? lim->max_seqs : 1;
    fi->maxp = fi->S * ((lim->max_blocks > 0) ? lim->max_blocks : 1) * geo->ppl;
    fi->maxw = fi->S + (fi->maxp + g.chunk_pages - 1) / g.chunk_pages;
    sz[FI_IDX] = (size_t)fi->maxp * 4;
    sz[FI_INDPTR] = sz[FI_OIND] = (size_t)(fi->S + 1) * 4;
    sz[FI_LAST] = (size_t)fi->S * 4;
    sz[FI_REQ] = sz[FI_TILE] = (size_t)fi->maxw * 4;
    sz[FI_CHUNK] = 4;
    sz[FI_VALID] = (size_t)fi->maxw * sizeof(bool);
    sz[FI_TMPV] = (size_t)fi->maxw * (size_t)qh * (size_t)hd * 2;
    sz[FI_TMPS] = (size_t)fi->maxw * (size_t)qh * 4;
    sz[FI_Q] = sz[FI_O] = (size_t)fi->S * (size_t)qh * (size_t)hd * 2;
    sz[FI_LSE] = (size_t)fi->S * (size_t)qh * 4;
    for (int i = 0; i < 13; ++i) {
        fi->off[i] = total;
        total += kvf_fi_up(sz[i]);
        if (i == FI_VALID) {
            fi->int_bytes = total;
        }
    }
    fi->host = malloc(fi->int_bytes);
    fi->kv_len = malloc((size_t)fi->S * sizeof(int32_t));
    if ((fi->host == NULL) || (fi->kv_len == NULL) ||
        (kvf_device_alloc(&ws->dev, total, &fi->dev) != KVF_KERN_OK)) {
        kvf_error("KVF_GPU_ATTN=flashinfer: %zu bytes of plan and partial outputs cannot be "
                  "allocated", total);
        free(fi->host);
        free(fi->kv_len);
        free(fi);
        return KVF_ERR_NO_MEMORY;
    }
    ws->fi = fi;
    if (ctx->rank == 0) {
        kvf_notice("attention: FlashInfer decode (KVF_GPU_ATTN=flashinfer; split-KV chunks of "
                   "%d pages of %d tokens, whatever the batch); prompt steps on kvferry's "
                   "kernel", g.chunk_pages, g.page_tokens);
    }
    return KVF_OK;
}

void kvf_fwd_fi_destroy(struct kvf_model_ws *ws)
{
    if ((ws == NULL) || (ws->fi == NULL)) {
        return;
    }
    kvf_device_free(&ws->dev, ws->fi->dev);
    free(ws->fi->host);
    free(ws->fi->kv_len);
    free(ws->fi);
    ws->fi = NULL;
}

#define FI_H(_fi, _i) ((int32_t *)((_fi)->host + (_fi)->off[_i]))
#define FI_D(_fi, _i) ((void *)((uint8_t *)(_fi)->dev + (_fi)->off[_i]))

/* The step's page indices and plan into the host twin; the plan's entries, or -1 when the
 * step does not fit the capacities (the caller's kernel runs it). */
static int kvf_fi_fill(struct kvf_fwd_fi *fi, const kvf_rank_ctx_t *ctx,
                       const kvf_fwd_batch_t *batch, int g, int slot)
{
    const kvf_rank_geometry_t *geo = ctx->geom;
    int32_t *idx = FI_H(fi, FI_IDX), *indptr = FI_H(fi, FI_INDPTR), *last = FI_H(fi, FI_LAST);
    int work, n = 0;

    indptr[0] = 0;
    for (int i = 0; i < batch->num_seqs; ++i) {
        const kvf_fwd_seq_t *sq = &batch->seqs[i];
        const int tokens = sq->start + 1;
        const int np = kvf_fi_pages(&fi->geom, sq->group_blocks[g], geo->block_size,
                                    ctx->layout->slots, slot, geo->page_size,
                                    tokens, idx + n, fi->maxp - n);
        if (np < 1) {
            return -1;
        }
        n += np;
        indptr[i + 1] = n;
        last[i] = tokens - (np - 1) * fi->geom.page_tokens;
        fi->kv_len[i] = tokens;
    }
    work = kvf_fi_decode_plan(&fi->geom, fi->kv_len, batch->num_seqs, FI_H(fi, FI_REQ),
                              FI_H(fi, FI_TILE), FI_H(fi, FI_OIND), fi->maxw);
    FI_H(fi, FI_CHUNK)[0] = fi->geom.chunk_pages * fi->geom.page_tokens;
    for (int i = 0; i < work; ++i) {
        ((bool *)(fi->host + fi->off[FI_VALID]))[i] = true;
    }
    return work;
}

bool kvf_fwd_fi_try(kvf_model_h m, const kvf_rank_ctx_t *ctx, const kvf_device_t *dev,
                    const kvf_fwd_batch_t *batch, int l, const int32_t *pos,
                    kvf_status_t *status_p)
{
    struct kvf_model_ws *ws = ctx->ws;
    struct kvf_fwd_fi *fi = ws->fi;
    const kvf_shard_t *s = &m->ranks[ctx->rank].shard;
    const int hd = m->cfg.head_dim, R = m->ranks[ctx->rank].layers[l].qkv_rows;
    const int qd = s->attn_heads * hd, kd = s->kv_heads * hd, S = batch->num_seqs;
    const int g = ctx->layout->layer_group[l], slot = ctx->layout->layer_slot[l];
    kvf_status_t status = *status_p;
    int work;

    if ((fi == NULL) || (ws->in != NULL) || (S > fi->S) || (status != KVF_OK)) {
        return false;
    }
    if ((m->cfg.layer_window[l] > 0) || m->cfg.attn_sinks) {
        /* a sliding-window layer: kvferry's kernel (kvf_paged_kv_t.window). Rejected for now:
         * FlashInfer's window_left, whose plan would also need the window's first page;
         * attention sinks (gpt_oss) likewise: kvferry's kernel (kvf_paged_kv_t.sinks) */
        return false;
    }
    for (int i = 0; i < S; ++i) {
        if ((batch->seqs[i].num_tokens != 1) || (batch->seqs[i].start < 1)) {
            return false;   /* a prompt step: kvferry's kernel */
        }
    }
    work = kvf_fi_fill(fi, ctx, batch, g, slot);
    if (work < 1) {
        return false;
    }
    for (int i = 0; i < S; ++i) {   /* row i is request i's one token */
        kvf_paged_kv_t kv;
        kvf_page_pool_attn_view(ctx->pool, ctx->geom, hd, slot, batch->seqs[i].group_blocks[g],
                                batch->seqs[i].group_num_blocks[g], &kv);
        KVF_KCALL(kvf_attn_cache_write(dev, &kv, ws->proj + (size_t)i * R + qd,
                                       ws->proj + (size_t)i * R + qd + kd, R, pos + i, 1));
        KVF_KCALL(kvf_convert(dev, (uint8_t *)FI_D(fi, FI_Q) + (size_t)i * qd * 2,
                              KVF_DTYPE_BF16, ws->proj + (size_t)i * R, KVF_DTYPE_FP32,
                              (size_t)qd));
    }
    KVF_KCALL(kvf_device_memcpy(dev, fi->dev, fi->host, fi->int_bytes, KVF_COPY_H2D));
    const kvf_fi_decode_args_t a = {
        .geom = fi->geom, .head_dim = hd, .q_heads = s->attn_heads, .kv_heads = s->kv_heads,
        .batch = S, .work = work, .sm_scale = (m->cfg.attention_multiplier > 0.0) ?
                                            (float)m->cfg.attention_multiplier :
                                            1.0f / sqrtf((float)hd),
        .q = FI_D(fi, FI_Q), .pool = kvf_page_pool_base(ctx->pool),
        .indices = FI_D(fi, FI_IDX), .indptr = FI_D(fi, FI_INDPTR),
        .last_page_len = FI_D(fi, FI_LAST), .request_indices = FI_D(fi, FI_REQ),
        .kv_tile_indices = FI_D(fi, FI_TILE), .o_indptr = FI_D(fi, FI_OIND),
        .chunk_tokens = FI_D(fi, FI_CHUNK), .valid = FI_D(fi, FI_VALID),
        .tmp_v = FI_D(fi, FI_TMPV), .tmp_s = FI_D(fi, FI_TMPS), .o = FI_D(fi, FI_O),
        .lse = FI_D(fi, FI_LSE),
    };
    KVF_KCALL(kvf_fi_decode(dev, &a));
    KVF_KCALL(kvf_convert(dev, ws->g, KVF_DTYPE_FP32, FI_D(fi, FI_O), KVF_DTYPE_BF16,
                          (size_t)S * (size_t)qd));
    *status_p = status;
    return true;
}
