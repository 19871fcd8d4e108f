/*
 * Compatibility check at handshake.
 *
 * Design: we do not trust the peer's arithmetic. Everything that decides
 * where bytes live (page size, slots, region length) is recomputed from the
 * advertised *parameters* with the same kvf_rank_geometry_compute() both
 * sides use, and compared to what was advertised; the planner then works
 * from the recomputed geometry only. Checks run cheapest and most
 * fundamental first (version, fingerprint) and stop before geometry when
 * those fail, since geometry against a different model means nothing.
 * Rejected alternative: exchanging whole geometry structs and comparing
 * bytes — that refuses the translatable cases (different block sizes, TP).
 */
#include "kvf_compat.h"

#include "kvf_log.h"
#include "kvf_tp_map.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct kvf_compat_ctx {
    kvf_refusal_t *out;
    int            max;
    int            num;
} kvf_compat_ctx_t;

static void kvf_compat_refuse(kvf_compat_ctx_t *c, const char *field, const char *local,
                              const char *remote, const char *why_fmt, ...)
    __attribute__((format(printf, 5, 6)));

static void kvf_compat_refuse(kvf_compat_ctx_t *c, const char *field, const char *local,
                              const char *remote, const char *why_fmt, ...)
{
    va_list ap;
    kvf_refusal_t *r;

    if (c->num >= c->max) {
        return;
    }
    r = &c->out[c->num++];
    snprintf(r->field, sizeof(r->field), "%s", field);
    snprintf(r->local, sizeof(r->local), "%s", local);
    snprintf(r->remote, sizeof(r->remote), "%s", remote);
    va_start(ap, why_fmt);
    vsnprintf(r->why, sizeof(r->why), why_fmt, ap);
    va_end(ap);
}

static void kvf_compat_refuse_u64(kvf_compat_ctx_t *c, const char *field, uint64_t local,
                                  uint64_t remote, const char *why)
{
    char l[32], r[32];
    snprintf(l, sizeof(l), "%" PRIu64, local);
    snprintf(r, sizeof(r), "%" PRIu64, remote);
    kvf_compat_refuse(c, field, l, r, "%s", why);
}

void kvf_compat_params_from_meta(const kvf_model_config_t *cfg, const kvf_rank_meta_t *meta,
                                 kvf_cache_params_t *params_p)
{
    kvf_cache_params_default(cfg, params_p);
    params_p->kv_dtype = meta->kv_dtype;
    params_p->conv_dtype = meta->conv_dtype;
    params_p->ssm_dtype = meta->ssm_dtype;
    params_p->user_block_size = meta->user_block_size;
    params_p->align = meta->align;
    params_p->block_size = meta->block_size;
    params_p->kv_layout = meta->kv_layout;
    memset(&params_p->kernel_sizes, 0, sizeof(params_p->kernel_sizes));
    params_p->kernel_sizes.num_exact = 1;
    params_p->kernel_sizes.exact[0] = meta->kernel_block_size;
}

/* Rank-independent fields every rank must agree on with rank 0. */
static bool kvf_compat_same_instance(const kvf_rank_meta_t *a, const kvf_rank_meta_t *b)
{
    return (strcmp(a->engine_id, b->engine_id) == 0) &&
           (a->protocol_version == b->protocol_version) &&
           (a->model_fingerprint == b->model_fingerprint) &&
           (strcmp(a->model_digest, b->model_digest) == 0) && (a->tp_size == b->tp_size) &&
           (a->sliding_window == b->sliding_window) &&
           (a->sliding_layers_len == b->sliding_layers_len) &&
           (memcmp(a->sliding_layers, b->sliding_layers, sizeof(a->sliding_layers)) == 0) &&
           (a->kv_dtype == b->kv_dtype) && (a->conv_dtype == b->conv_dtype) &&
           (a->ssm_dtype == b->ssm_dtype) && (a->block_size == b->block_size) &&
           (strcmp(a->layout_tag, b->layout_tag) == 0) && (a->kv_layout == b->kv_layout);
}

static void kvf_compat_check_rank(kvf_compat_ctx_t *c, const kvf_model_config_t *cfg,
                                  const kvf_cache_layout_t *layout, const kvf_rank_meta_t *r,
                                  kvf_rank_geometry_t *geom_p)
{
    kvf_cache_params_t params;
    kvf_rank_geometry_t g;
    char field[48];
    uint64_t expect;

    kvf_compat_params_from_meta(cfg, r, &params);
    if (kvf_rank_geometry_compute(cfg, &params, r->tp_size, r->tp_rank, &g) != KVF_OK) {
        char l[32], v[32];
        snprintf(l, sizeof(l), "valid");
        snprintf(v, sizeof(v), "%d/%d", r->block_size, r->kernel_block_size);
        kvf_compat_refuse(c, "block_size", l, v,
                          "rank %d: advertised block/kernel block size is not a valid geometry "
                          "for this model", r->tp_rank);
        return;
    }
    if (g.kernel_block_size != r->kernel_block_size) {
        kvf_compat_refuse_u64(c, "kernel_block_size", (uint64_t)g.kernel_block_size,
                              (uint64_t)r->kernel_block_size,
                              "advertised kernel block size does not divide the block size");
        return;
    }
    if (g.page_size != r->page_size) {
        snprintf(field, sizeof(field), "page_size");
        kvf_compat_refuse_u64(c, field, g.page_size, r->page_size,
                              "advertised page size differs from the geometry recomputed from "
                              "the advertised block size and dtypes");
        return;
    }
    if (r->slots != layout->slots) {
        kvf_compat_refuse_u64(c, "slots", (uint64_t)layout->slots, (uint64_t)r->slots,
                              "pages per block differ for the same model");
        return;
    }
    if (r->num_regions != 1) {
        kvf_compat_refuse_u64(c, "num_regions", 1, (uint64_t)r->num_regions,
                              "expected exactly one registered page-pool region");
        return;
    }
    /* a hostile peer could pick sizes whose product wraps: that never matches */
    if ((r->num_blocks < 0) || (r->slots < 0) ||
        __builtin_mul_overflow((uint64_t)r->num_blocks, (uint64_t)r->slots, &expect) ||
        __builtin_mul_overflow(expect, r->page_size, &expect)) {
        expect = 0;
    }
    if ((expect == 0) || (r->regions[0].length != expect)) {
        char why[160];
        snprintf(why, sizeof(why),
                 "rank %d: region length must be num_blocks*slots*page_size = "
                 "%" PRId64 "*%d*%" PRIu64, r->tp_rank, r->num_blocks, r->slots, r->page_size);
        kvf_compat_refuse_u64(c, "region_length", expect, r->regions[0].length, why);
        return;
    }
    if (geom_p != NULL) {
        *geom_p = g;
    }
}

/* "<digest> (<folder>)", or "none" for a side that advertises no digest. */
static void kvf_compat_digest_str(const kvf_rank_meta_t *m, char *buf, size_t len)
{
    if (m->model_digest[0] == '\0') {
        snprintf(buf, len, "none");
    } else {
        snprintf(buf, len, "%.*s (%.*s)", KVF_MODEL_DIGEST_HEX, m->model_digest,
                 (int)(len > KVF_MODEL_DIGEST_HEX + 4 ? len - KVF_MODEL_DIGEST_HEX - 4 : 0),
                 m->model_path);
    }
}

/* Same config, other weights or tokenizer: refused, naming both digests and folders. */
static bool kvf_compat_check_digest(kvf_compat_ctx_t *c, const kvf_rank_meta_t *local,
                                    const kvf_rank_meta_t *r0)
{
    char l[sizeof(c->out->local)], v[sizeof(c->out->remote)];

    if (strcmp(local->model_digest, r0->model_digest) == 0) {
        return true;                    /* equal, or neither side loaded a model folder */
    }
    kvf_compat_digest_str(local, l, sizeof(l));
    kvf_compat_digest_str(r0, v, sizeof(v));
    kvf_compat_refuse(c, "model_digest", l, v, "%s",
                      ((local->model_digest[0] == '\0') || (r0->model_digest[0] == '\0')) ?
                      "one side advertises no model digest: weights and tokenizer cannot be "
                      "compared" : "weights or tokenizer differ");
    return false;
}

void kvf_rank_meta_set_window(kvf_rank_meta_t *meta, const kvf_model_config_t *cfg)
{
    meta->sliding_window = 0;
    meta->sliding_layers_len = 0;
    memset(meta->sliding_layers, 0, sizeof(meta->sliding_layers));
    for (int l = 0; (l < cfg->num_layers) && (l < KVF_MAX_LAYERS); ++l) {
        if (cfg->layer_window[l] > 0) {
            meta->sliding_window = (cfg->layer_window[l] > meta->sliding_window) ?
                                   cfg->layer_window[l] : meta->sliding_window;
            meta->sliding_layers[l / 8] |= (uint8_t)(1u << (l % 8));
            meta->sliding_layers_len = l / 8 + 1;
        }
    }
}

/* "0,2" (the sliding layers of @a m, truncated to @a len), or "none". */
static void kvf_compat_layers_str(const kvf_rank_meta_t *m, char *buf, size_t len)
{
    size_t n = 0;

    snprintf(buf, len, "none");
    for (int l = 0; (l < m->sliding_layers_len * 8) && (n + 1 < len); ++l) {
        if (m->sliding_layers[l / 8] & (1u << (l % 8))) {
            int w = snprintf(buf + n, len - n, "%s%d", (n > 0) ? "," : "", l);
            n += (w > 0) ? (size_t)w : 0;
        }
    }
}

/* The sliding window: a window-bounded pull reads and zeroes by it, the kernels attend by it. */
static bool kvf_compat_check_window(kvf_compat_ctx_t *c, const kvf_rank_meta_t *local,
                                    const kvf_rank_meta_t *r0)
{
    char l[sizeof(c->out->local)], v[sizeof(c->out->remote)];

    if (r0->sliding_window != local->sliding_window) {
        kvf_compat_refuse_u64(c, "sliding_window", (uint64_t)local->sliding_window,
                              (uint64_t)r0->sliding_window, "the sliding windows differ (0: no "
                              "sliding layer or not advertised): the instances attend to "
                              "different keys");
        return false;
    }
    if ((r0->sliding_layers_len != local->sliding_layers_len) ||
        (memcmp(r0->sliding_layers, local->sliding_layers,
                (size_t)local->sliding_layers_len) != 0)) {
        kvf_compat_layers_str(local, l, sizeof(l));
        kvf_compat_layers_str(r0, v, sizeof(v));
        kvf_compat_refuse(c, "sliding_layers", l, v, "the layers that slide differ");
        return false;
    }
    return true;
}

kvf_status_t kvf_compat_check(const kvf_model_config_t *cfg, const kvf_rank_meta_t *local,
                              const kvf_rank_meta_t *remote, int num_remote,
                              kvf_rank_geometry_t *remote_geoms, kvf_refusal_t *refusals,
                              int max_refusals, int *num_refusals_p)
{
    kvf_compat_ctx_t c = {refusals, max_refusals, 0};
    const kvf_rank_meta_t *r0 = remote;
    kvf_cache_layout_t *layout = NULL;
    char l[48], v[48];
    bool hybrid;

    if ((cfg == NULL) || (local == NULL) || (remote == NULL) || (num_remote < 1) ||
        (refusals == NULL) || (max_refusals < 1) || (num_refusals_p == NULL)) {
        return KVF_ERR_INVALID_PARAM;
    }
    *num_refusals_p = 0;
    hybrid = kvf_model_is_hybrid(cfg);

    if (r0->protocol_version != local->protocol_version) {
        kvf_compat_refuse_u64(&c, "protocol_version", local->protocol_version,
                              r0->protocol_version, "protocol versions differ");
        goto out;
    }
    if (r0->model_fingerprint != local->model_fingerprint) {
        snprintf(l, sizeof(l), "%016" PRIx64, local->model_fingerprint);
        snprintf(v, sizeof(v), "%016" PRIx64, r0->model_fingerprint);
        kvf_compat_refuse(&c, "model_fingerprint", l, v,
                          "the instances serve different models (geometry-defining config "
                          "fields differ)");
        goto out;
    }
    if (!kvf_compat_check_digest(&c, local, r0) || !kvf_compat_check_window(&c, local, r0)) {
        goto out;
    }
    if ((r0->tp_size != num_remote)) {
        kvf_compat_refuse_u64(&c, "tp_size", (uint64_t)num_remote, (uint64_t)r0->tp_size,
                              "rank list does not match the advertised TP size");
        goto out;
    }
    for (int i = 1; i < num_remote; ++i) {
        if (!kvf_compat_same_instance(r0, &remote[i])) {
            snprintf(v, sizeof(v), "rank 0 vs rank %d", i);   /* both prefill's */
            kvf_compat_refuse(&c, "rank_metadata", "-", v,
                              "ranks of one instance advertise different instance-wide fields");
            goto out;
        }
    }
    if (r0->kv_dtype != local->kv_dtype) {
        kvf_compat_refuse(&c, "kv_dtype", kvf_dtype_name(local->kv_dtype),
                          kvf_dtype_name(r0->kv_dtype),
                          "KV cache dtypes differ; blocks cannot be copied without conversion");
    }
    if (hybrid && (r0->ssm_dtype != local->ssm_dtype)) {
        kvf_compat_refuse(&c, "ssm_dtype", kvf_dtype_name(local->ssm_dtype),
                          kvf_dtype_name(r0->ssm_dtype),
                          "Mamba SSM state dtypes differ; state cannot be copied without "
                          "conversion");
    }
    if (hybrid && (r0->conv_dtype != local->conv_dtype)) {
        kvf_compat_refuse(&c, "conv_dtype", kvf_dtype_name(local->conv_dtype),
                          kvf_dtype_name(r0->conv_dtype),
                          "Mamba conv state dtypes differ; state cannot be copied without "
                          "conversion");
    }
    if (strcmp(r0->layout_tag, local->layout_tag) != 0) {
        kvf_compat_refuse(&c, "layout_tag", local->layout_tag, r0->layout_tag,
                          "KV cache memory layouts differ");
    }
    if ((kvf_tp_ratio(r0->tp_size, local->tp_size) == 0) ||
        !kvf_shard_probe(cfg, r0->tp_size)) {
        kvf_compat_refuse_u64(&c, "tp_size", (uint64_t)local->tp_size, (uint64_t)r0->tp_size,
                              kvf_shard_probe(cfg, r0->tp_size) ?
                              "neither TP size divides the other" :
                              "the remote TP size cannot shard this model");
    }
    if (c.num > 0) {
        goto out;
    }

    layout = malloc(sizeof(*layout));
    if (layout == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    if (kvf_cache_layout_build(cfg, layout) != KVF_OK) {
        free(layout);
        return KVF_ERR_INVALID_PARAM;
    }
    for (int i = 0; (i < num_remote) && (c.num == 0); ++i) {
        kvf_compat_check_rank(&c, cfg, layout, &remote[i],
                              (remote_geoms != NULL) ? &remote_geoms[i] : NULL);
    }
    free(layout);

out:
    *num_refusals_p = c.num;
    if (c.num > 0) {
        char line[512];
        kvf_refusal_format(&refusals[0], false, line, sizeof(line));   /* decode checks */
        kvf_log(KVF_LOG_INFO, KVF_SUB_XFER, "%s", line);
        return KVF_ERR_REFUSED;
    }
    return KVF_OK;
}
