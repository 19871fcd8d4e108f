/*
 * Decode steps as CUDA graphs (KVF_GPU_GRAPHS=decode; kernels/kvf_device_graph.h): the
 * forward of a decode step of S requests is recorded once per S, then each later step of S
 * requests uploads its inputs (one host->device copy) and launches the recording: one
 * launch in place of every kernel launch of the step and the host work around them. The
 * head's pick (argmax or the device sampler, and the one copy back) stays eager.
 *
 * What makes a replay give the eager step's bits: every host input of the step's kernels
 * (token ids, positions, block tables, Mamba state pages and dt clamps, the head's rows) is
 * laid out by kvf_step_in_fill() in one block (ws->in), at offsets that depend on S alone,
 * whose device copy has a fixed address; the attention's table width is the step limits'
 * max_blocks and its split-K is sized for the longest context the limits allow, so the
 * launch shape depends on S alone too (the extra ranges are empty and change no bit:
 * kernels/kvf_attention_math.h); the workspace's (dev) buffers are fixed from start
 * (ws->gen: a growth forgets the recordings). A capture that CUDA refuses turns graphs off
 * with one warning and the steps run eagerly.
 *
 * Which steps: TP 1 (NCCL collectives are not recorded here), no MoE layer (its router
 * copies the choice to the host), SiLU Mamba or Gated DeltaNet (the batched decode steps,
 * kvf_ssm_decode_seqs / kvf_gdn_decode_seqs, read the requests' state pointers from the
 * packed inputs, laid out alike for both kinds), every request one
 * token on a cache with its head row wanted, within the step limits, and not under
 * `kvf bench-model --profile` (which times eager calls). Everything else runs eagerly.
 * Rejected: padding S up to buckets (dummy requests would need pages to write; a recording
 * per S up to the limit costs a capture each, once).
 */
#include "kvf_model_int.h"
#include "kvf_device_graph.h"
#include "kvf_fwd_profile.h"

/* The graph cache of a rank and its inputs' block. */
struct kvf_fwd_graphs {
    kvf_device_graphs_t *cache;
    void                *host, *dev;   /* the inputs' block and its device copy */
    size_t               cap;          /* bytes of each */
    int                  max_seqs;
    uint64_t             gen;          /* ws->gen the recordings were made at */
    struct kvf_step_in   in;
};

/* KVF_GPU_GRAPHS: 0 off (unset, empty, "off"), 1 decode, -1 anything else (logged). */
static int kvf_graphs_mode(void)
{
    const char *env = getenv("KVF_GPU_GRAPHS");

    if ((env == NULL) || (env[0] == '\0') || (strcmp(env, "off") == 0)) {
        return 0;
    }
    if (strcmp(env, "decode") == 0) {
        return 1;
    }
    kvf_error("bad value '%s' for KVF_GPU_GRAPHS: off (the default: every step launched "
              "kernel by kernel) or decode (decode steps recorded as CUDA graphs per batch "
              "size, then replayed)", env);
    return -1;
}

static size_t kvf_al8(size_t n)
{
    return (n + 7u) & ~(size_t)7u;
}

/* Bytes of the inputs of a decode step of @a S requests (the layout of kvf_step_in_fill). */
static size_t kvf_step_in_bytes(const kvf_model_config_t *cfg, const kvf_cache_layout_t *lay,
                                int S, int maxb)
{
    size_t b = 3 * kvf_al8((size_t)S * 4);

    for (int g = 0; g < lay->num_groups; ++g) {
        if (lay->groups[g].kind != KVF_GROUP_MAMBA) {
            b += kvf_al8(kvf_attn_seqs_packed_words(S, S, maxb) * 4);
        }
    }
    for (int l = 0; l < cfg->num_layers; ++l) {
        if (cfg->layer_kinds[l] == KVF_LAYER_MAMBA) {
            b += kvf_al8(kvf_ssm_seqs_packed_bytes(S));
        }
    }
    return b;
}

kvf_status_t kvf_fwd_graphs_prepare(kvf_model_h m, const kvf_rank_ctx_t *ctx,
                                    const kvf_step_limits_t *lim)
{
    const kvf_device_t *dev = kvf_page_pool_device(ctx->pool);
    const kvf_model_config_t *cfg = &m->cfg;
    struct kvf_model_ws *ws = ctx->ws;
    const int mode = kvf_graphs_mode();
    const kvf_step_limits_t dec = {
        .max_tokens = lim->max_seqs, .max_seqs = lim->max_seqs, .max_blocks = lim->max_blocks,
        .max_fresh_pages = 1, .max_context = lim->max_context,
        .kernel_block_size = lim->kernel_block_size,
    };
    struct kvf_fwd_graphs *gr;
    size_t arena = 0, staging = 0;
    bool moe = false, other = false;
    int e;

    if (mode < 0) {
        return KVF_ERR_INVALID_PARAM;
    }
    if ((mode == 0) || (ws->graphs != NULL) || (dev->kind == KVF_DEVICE_CPU)) {
        return KVF_OK;
    }
    for (int l = 0; l < cfg->num_layers; ++l) {
        moe |= kvf_model_layer_has_moe(cfg, l);
        other |= (cfg->layer_kinds[l] == KVF_LAYER_MAMBA) && (cfg->mamba_act != KVF_ACT_SILU);
    }
    if ((ctx->comm->size > 1) || moe || other) {
        if (ctx->rank == 0) {
            kvf_warn("KVF_GPU_GRAPHS=decode: %s, so every step runs eagerly (graphs cover TP 1 "
                     "models without MoE layers, Mamba / Gated DeltaNet layers with SiLU)",
                     moe ? "the model has MoE layers" :
                     other ? "the model's Mamba activation is not SiLU" :
                     "the instance runs TP > 1");
        }
        return KVF_OK;
    }
    gr = calloc(1, sizeof(*gr));
    if (gr == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    gr->max_seqs = lim->max_seqs;
    gr->in.maxb = (lim->max_blocks > 0) ? lim->max_blocks : 1;
    gr->in.split_blocks = ((lim->max_context > 0) ? lim->max_context : 1) /
                          ((lim->kernel_block_size > 0) ? lim->kernel_block_size : 1) + 1;
    gr->in.attn = calloc((size_t)ctx->layout->num_groups + 1, sizeof(*gr->in.attn));
    gr->in.mamba = calloc((size_t)cfg->num_layers + 1, sizeof(*gr->in.mamba));
    gr->cap = kvf_step_in_bytes(cfg, ctx->layout, lim->max_seqs, gr->in.maxb);
    gr->host = malloc(gr->cap);
    ws->graphs = gr;   /* freed by kvf_fwd_graphs_destroy() whatever follows */
    if ((gr->in.attn == NULL) || (gr->in.mamba == NULL) || (gr->host == NULL)) {
        return KVF_ERR_NO_MEMORY;
    }
    /* the recordings' scratch: the arena of a decode step of max_seqs requests */
    kvf_model_ws_device_bytes(m, ctx->rank, &dec, &arena, &staging);
    e = kvf_device_alloc(dev, gr->cap, &gr->dev);
    if (e == KVF_KERN_OK) {
        e = kvf_device_graphs_create(dev, arena, lim->max_seqs, &gr->cache);
    }
    if (e != KVF_KERN_OK) {
        kvf_error("rank %d: KVF_GPU_GRAPHS=decode: the graph cache (%zu bytes of inputs, "
                  "%zu of scratch) cannot be set up on %s:%d: %s", ctx->rank, gr->cap, arena,
                  kvf_device_kind_name(dev->kind), dev->ordinal, kvf_kern_strerror(e));
        return kvf_status_from_kern(e);
    }
    gr->gen = ws->gen;
    kvf_info("rank %d: decode steps of up to %d requests recorded as CUDA graphs "
             "(KVF_GPU_GRAPHS=decode: %zu bytes of inputs, %zu of scratch)", ctx->rank,
             lim->max_seqs, gr->cap, arena);
    return KVF_OK;
}

void kvf_fwd_graphs_destroy(struct kvf_model_ws *ws)
{
    struct kvf_fwd_graphs *gr = ws->graphs;

    if (gr == NULL) {
        return;
    }
    if (gr->cache != NULL) {
        kvf_device_graphs_stats_t st;
        kvf_device_graphs_stats(gr->cache, &st);
        kvf_info("CUDA graphs of decode steps: %d recorded, %llu replays, %llu failed "
                 "captures", st.graphs, (unsigned long long)st.replays,
                 (unsigned long long)st.failures);
        kvf_device_graphs_destroy(gr->cache);
    }
    if (gr->dev != NULL) {
        kvf_device_free(&ws->dev, gr->dev);
    }
    free(gr->in.attn);
    free(gr->in.mamba);
    free(gr->host);
    free(gr);
    ws->graphs = NULL;
}

/* Whether @a batch is a decode step a recording can run (see the opening comment). */
static bool kvf_graph_step_ok(const kvf_rank_ctx_t *ctx, const struct kvf_fwd_graphs *gr,
                              const kvf_fwd_batch_t *batch)
{
    const kvf_cache_layout_t *lay = ctx->layout;
    const int max_ctx = (gr->in.split_blocks - 1) * ((ctx->geom->kernel_block_size > 0) ?
                                                     ctx->geom->kernel_block_size : 1);

    /* TP, MoE and the Mamba activation were checked at start (kvf_fwd_graphs_prepare) */
    if (kvf_fwd_profile_active() || (batch->num_seqs < 1) || (batch->num_seqs > gr->max_seqs)) {
        return false;
    }
    for (int i = 0; i < batch->num_seqs; ++i) {
        const kvf_fwd_seq_t *sq = &batch->seqs[i];
        if ((sq->num_tokens != 1) || (sq->start <= 0) || (sq->start >= max_ctx) ||
            ((sq->logits == NULL) && (sq->token == NULL) && (sq->sample == NULL))) {
            return false;
        }
        for (int g = 0; g < lay->num_groups; ++g) {
            if ((lay->groups[g].kind != KVF_GROUP_MAMBA) &&
                (sq->group_num_blocks[g] > gr->in.maxb)) {
                return false;
            }
        }
    }
    return true;
}

/* The step's inputs into the block, at offsets that depend on S alone, the packed parts
 * laid out by the kernels' own packers (kvf_attn_seqs_pack, kvf_ssm_seqs_pack) from the
 * workspace's per-request arrays, as an eager step hands them over. Bytes used. */
static size_t kvf_step_in_fill(const kvf_model_h m, const kvf_rank_ctx_t *ctx,
                               struct kvf_fwd_graphs *gr, const kvf_fwd_batch_t *batch)
{
    const kvf_model_config_t *cfg = &m->cfg;
    const kvf_cache_layout_t *lay = ctx->layout;
    struct kvf_model_ws *ws = ctx->ws;
    const int S = batch->num_seqs, B = gr->in.maxb;
    char *p = gr->host;

    gr->in.ids = (int32_t *)p;
    p += kvf_al8((size_t)S * 4);
    gr->in.pos = (int32_t *)p;
    p += kvf_al8((size_t)S * 4);
    gr->in.last_rows = (int32_t *)p;
    p += kvf_al8((size_t)S * 4);
    for (int i = 0; i < S; ++i) {
        gr->in.ids[i] = batch->seqs[i].tokens[0];
        gr->in.pos[i] = batch->seqs[i].start;
        gr->in.last_rows[i] = i;
        ws->seq_n[i] = 1;        /* one row per request */
        ws->dec_rows[i] = i;
    }
    for (int g = 0; g < lay->num_groups; ++g) {
        const kvf_attn_seqs_t seqs = {
            .num_seqs = S, .num_tokens = ws->seq_n, .block_tables = ws->seq_tab,
            .num_blocks = ws->seq_nb,
        };
        gr->in.attn[g] = NULL;
        if (lay->groups[g].kind == KVF_GROUP_MAMBA) {
            continue;
        }
        for (int i = 0; i < S; ++i) {
            ws->seq_tab[i] = batch->seqs[i].group_blocks[g];
            ws->seq_nb[i] = batch->seqs[i].group_num_blocks[g];
        }
        gr->in.attn[g] = (int32_t *)p;
        kvf_attn_seqs_pack(&seqs, gr->in.pos, S, B, gr->in.attn[g]);
        p += kvf_al8(kvf_attn_seqs_packed_words(S, S, B) * 4);
    }
    for (int l = 0; l < cfg->num_layers; ++l) {
        const int g = lay->layer_group[l], slot = lay->layer_slot[l];
        const kvf_ssm_seqs_t dec = {
            .num_seqs = S, .rows = ws->dec_rows, .conv_states = ws->dec_conv,
            .ssm_states = ws->dec_ssm, .dt_min = ws->dec_dtmin, .dt_max = ws->dec_dtmax,
        };
        gr->in.mamba[l] = NULL;
        if (cfg->layer_kinds[l] != KVF_LAYER_MAMBA) {
            continue;
        }
        for (int i = 0; i < S; ++i) {
            const kvf_fwd_seq_t *sq = &batch->seqs[i];
            ws->dec_conv[i] = kvf_page_pool_conv_state(ctx->pool, sq->group_blocks[g][0], slot);
            ws->dec_ssm[i] = kvf_page_pool_ssm_state(ctx->pool, ctx->geom,
                                                     sq->group_blocks[g][0], slot);
            ws->dec_dtmin[i] = kvf_fwd_step_dt_min(cfg, sq);
            ws->dec_dtmax[i] = kvf_fwd_step_dt_max(cfg, sq);
        }
        gr->in.mamba[l] = p;
        kvf_ssm_seqs_pack(&dec, p);
        p += kvf_al8(kvf_ssm_seqs_packed_bytes(S));
    }
    return (size_t)(p - (char *)gr->host);
}

typedef struct {
    kvf_model_h            m;
    const kvf_rank_ctx_t  *ctx;
    const kvf_fwd_batch_t *batch;
    int                    T;
} kvf_graph_arg_t;

/* What a recording holds: the forward on the capture stream, inputs from the block. */
static int kvf_graph_body(const kvf_device_t *dev, void *argp)
{
    kvf_graph_arg_t *a = argp;
    struct kvf_model_ws *ws = a->ctx->ws;
    kvf_status_t status;

    ws->run_dev = dev;
    status = kvf_fwd_body(a->m, a->ctx, a->batch, a->T);
    ws->run_dev = NULL;
    return (status == KVF_OK) ? KVF_KERN_OK : KVF_KERN_EUNSUPPORTED;
}

bool kvf_fwd_graph_try(kvf_model_h m, const kvf_rank_ctx_t *ctx, const kvf_fwd_batch_t *batch,
                       int T, kvf_status_t *status_p)
{
    struct kvf_model_ws *ws = ctx->ws;
    struct kvf_fwd_graphs *gr = ws->graphs;
    const kvf_device_t *dev = kvf_page_pool_device(ctx->pool);
    kvf_graph_arg_t arg = {m, ctx, batch, T};
    kvf_graph_how_t how = KVF_GRAPH_EAGER;
    kvf_device_graphs_stats_t st;
    size_t bytes;
    int e;

    if ((gr == NULL) || (gr->cache == NULL) || !kvf_graph_step_ok(ctx, gr, batch)) {
        return false;
    }
    for (int i = 0; (m->scan_grid > 0) && (i < batch->num_seqs); ++i) {
        if (kvf_fwd_step_is_prompt(&batch->seqs[i])) {
            return false;   /* a lone prompt token runs the chunked scan (eager) */
        }
    }
    kvf_device_graphs_stats(gr->cache, &st);
    if (st.disabled) {
        return false;   /* a capture failed (warned once): no inputs to lay out any more */
    }
    if (gr->gen != ws->gen) {
        kvf_device_graphs_clear(gr->cache);   /* the buffers they point into moved */
        gr->gen = ws->gen;
    }
    bytes = kvf_step_in_fill(m, ctx, gr, batch);
    e = kvf_device_memcpy(dev, gr->dev, gr->host, bytes, KVF_COPY_H2D);
    if (e == KVF_KERN_OK) {
        ws->in = &gr->in;
        e = kvf_device_graph_run(gr->cache, (uint64_t)batch->num_seqs, kvf_graph_body, &arg,
                                 gr->host, gr->dev, bytes, &how);
        ws->in = NULL;
    }
    if (e != KVF_KERN_OK) {
        kvf_error("rank %d: a decode step's CUDA graph: %s", ctx->rank, kvf_kern_strerror(e));
        *status_p = kvf_status_from_kern(e);
        return true;
    }
    if (how == KVF_GRAPH_EAGER) {
        return false;   /* nothing ran: the caller runs the step kernel by kernel */
    }
    *status_p = (ctx->rank == 0) ? kvf_fwd_head_pick(m, ctx, batch, KVF_OK) : KVF_OK;
    return true;
}
