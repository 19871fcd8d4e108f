/*
 * Transfer planner harness (see xfer_plan_harness.h).
 *
 * Every prefill pool is filled through a reference writer: element
 * (layer, global KV head, token, dim, K/V) of attention, (layer, part, global
 * conv channel, tap) of conv state and (layer, global Mamba head, p, n) of SSM
 * state get a value that is a pure function of those coordinates, placed with
 * the geometry offset helpers; every other byte is 0xFF (a NaN pattern). The
 * decode pools start as 0xEE. After the plan ran, each decode element must hold
 * the value of its global coordinates (tokens < N) or zero (attention tokens
 * >= N of the request's blocks), and every other byte must still be 0xEE.
 * Because the value depends on global coordinates only, the check does not
 * care which prefill rank a replicated head was read from.
 *
 * The minimal descriptor count is computed independently: list every
 * transferred row as (local offset, prefill rank, remote offset, length), sort
 * by local offset and count maximal runs that are contiguous on both sides.
 */
#include "xfer_plan_harness.h"
#include "kvf_xfer_tmpl.h"

#include "kvf_log.h"
#include "kvf_tp_map.h"

#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

const char *const xp_tiny_hybrid_json =
    "{\"model_type\":\"nemotron_h\",\"hidden_size\":256,\"vocab_size\":260,"
    "\"num_hidden_layers\":8,\"hybrid_override_pattern\":\"M*M-M*M-\","
    "\"num_attention_heads\":8,\"num_key_value_heads\":2,\"head_dim\":32,"
    "\"intermediate_size\":512,\"mamba_num_heads\":8,\"mamba_head_dim\":32,"
    "\"ssm_state_size\":16,\"n_groups\":2,\"conv_kernel\":4}";

const char *const xp_dense_kv4_json =
    "{\"model_type\":\"llama\",\"hidden_size\":128,\"vocab_size\":260,"
    "\"num_hidden_layers\":4,\"num_attention_heads\":8,\"num_key_value_heads\":4,"
    "\"head_dim\":16,\"intermediate_size\":256,\"rms_norm_eps\":1e-5}";

const char *const xp_dense_kv2_json =
    "{\"model_type\":\"llama\",\"hidden_size\":128,\"vocab_size\":260,"
    "\"num_hidden_layers\":6,\"num_attention_heads\":8,\"num_key_value_heads\":2,"
    "\"head_dim\":16,\"intermediate_size\":256,\"rms_norm_eps\":1e-5}";

#define XP_PREFILL_POISON 0xFF
#define XP_DECODE_POISON  0xEE
#define XP_MAX_TP         8

enum { XP_KIND_ATTN = 1, XP_KIND_CONV = 2, XP_KIND_SSM = 3 };

static uint64_t xp_mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Hash of one row of elements: attention (layer, head, token, kv), conv (layer, part, channel),
 * SSM (layer, head, p). Element i of the row hashes (row, i). */
static uint64_t xp_row(uint64_t kind, uint64_t layer, uint64_t a, uint64_t b, uint64_t c)
{
    return xp_mix(xp_mix(xp_mix(xp_mix(kind * 1315423911ull + layer) ^ a) ^ b) ^ c);
}

/* Element bytes: never 0x00, 0xFF or 0xEE, so zeroing and both poisons are told apart. */
static void xp_elem(uint64_t row, int i, size_t esize, uint8_t *out)
{
    uint64_t v = xp_mix(row + (uint64_t)i);
    for (size_t k = 0; k < esize; ++k) {
        out[k] = (uint8_t)(((v >> (8 * k)) & 0x7F) | 0x01);
    }
}

typedef struct xp_pair {
    uint64_t loff, roff, len;
    int      rank;
} xp_pair_t;

typedef struct xp_pairs {
    xp_pair_t *v;
    size_t     n, cap;
} xp_pairs_t;

static void xp_pairs_push(xp_pairs_t *ps, uint64_t loff, int rank, uint64_t roff, uint64_t len)
{
    if (ps->n == ps->cap) {
        ps->cap = ps->cap ? 2 * ps->cap : 1024;
        ps->v = realloc(ps->v, ps->cap * sizeof(*ps->v));
        assert_non_null(ps->v);
    }
    ps->v[ps->n++] = (xp_pair_t){.loff = loff, .roff = roff, .len = len, .rank = rank};
}

static int xp_pair_cmp(const void *a, const void *b)
{
    uint64_t x = ((const xp_pair_t *)a)->loff, y = ((const xp_pair_t *)b)->loff;
    return (x > y) - (x < y);
}

/* The whole world of one case. */
typedef struct xp_world {
    kvf_model_config_t  cfg;
    kvf_cache_layout_t  layout;
    int                 P, D;
    kvf_rank_geometry_t pg[XP_MAX_TP], dg[XP_MAX_TP];
    int64_t             p_blocks, d_blocks;           /* blocks per pool on each side */
    int64_t             N;
    int64_t             skip;                         /* decode's prefix hit, tokens */
    int32_t            *lids[KVF_MAX_KV_GROUPS], *rids[KVF_MAX_KV_GROUPS];
    int                 nl[KVF_MAX_KV_GROUPS], nr[KVF_MAX_KV_GROUPS];
    uint8_t            *ppool[XP_MAX_TP];
    size_t              ppool_len[XP_MAX_TP];
    uint64_t            seed;
} xp_world_t;

static uint64_t xp_page(int32_t id, int slots, int slot, size_t page_size)
{
    return ((uint64_t)id * (uint64_t)slots + (uint64_t)slot) * (uint64_t)page_size;
}

static void xp_params(const xp_world_t *w, kvf_dtype_t kv, int block, int kernel,
                      kvf_kv_layout_t layout, kvf_cache_params_t *p)
{
    kvf_cache_params_default(&w->cfg, p);
    p->kv_layout = layout;
    p->kv_dtype = kv;
    p->conv_dtype = kv;               /* bf16 runs get bf16 conv state, fp32 runs fp32 */
    p->ssm_dtype = KVF_DTYPE_FP32;
    p->block_size = block;
    if (kernel > 0) {
        memset(&p->kernel_sizes, 0, sizeof(p->kernel_sizes));
        p->kernel_sizes.num_exact = 1;
        p->kernel_sizes.exact[0] = kernel;
    }
}

/* Global conv channel of rank-local channel c: part 0 x, 1 B, 2 C; index within the part. */
static void xp_conv_global(const kvf_model_config_t *cfg, const kvf_shard_t *s, int c, int *part,
                           int *global)
{
    if (c < s->conv_x_channels) {
        *part = 0;
        *global = s->conv_x_start + c;
    } else if (c < s->conv_x_channels + s->conv_bc_channels) {
        *part = 1;
        *global = s->group_start * cfg->ssm_state_size + (c - s->conv_x_channels);
    } else {
        *part = 2;
        *global = s->group_start * cfg->ssm_state_size +
                  (c - s->conv_x_channels - s->conv_bc_channels);
    }
}

/* Rank-local channel of (part, global) on shard s, or -1. Written from the shard fields. */
static int xp_conv_local(const kvf_model_config_t *cfg, const kvf_shard_t *s, int part, int global)
{
    int first = (part == 0) ? s->conv_x_start : s->group_start * cfg->ssm_state_size;
    int count = (part == 0) ? s->conv_x_channels : s->conv_bc_channels;
    int base = (part == 0) ? 0 : s->conv_x_channels + ((part == 2) ? s->conv_bc_channels : 0);
    if ((global < first) || (global >= first + count)) {
        return -1;
    }
    return base + (global - first);
}

/* ---- reference writer ---- */

static void xp_fill_prefill(xp_world_t *w, int r)
{
    const kvf_model_config_t *cfg = &w->cfg;
    const kvf_rank_geometry_t *g = &w->pg[r];
    const kvf_shard_t *s = &g->shard;
    uint8_t *pool = w->ppool[r];
    size_t kv_elt = kvf_dtype_size(g->kv_dtype);
    size_t conv_elt = kvf_dtype_size(g->conv_dtype), ssm_elt = kvf_dtype_size(g->ssm_dtype);
    int slots = w->layout.slots;

    memset(pool, XP_PREFILL_POISON, w->ppool_len[r]);
    for (int gi = 0; gi < w->layout.num_groups; ++gi) {
        const kvf_kv_group_t *grp = &w->layout.groups[gi];
        if (kvf_group_is_attention(grp->kind)) {
            int64_t nb = (w->N + g->block_size - 1) / g->block_size;
            for (int64_t b = 0; b < nb; ++b) {
                for (int j = 0; j < grp->num_layers; ++j) {
                    uint64_t page = kvf_attn_slot_off(g, w->rids[gi][b], j);
                    for (int t = 0; t < g->block_size; ++t) {
                        int64_t T = b * g->block_size + t;
                        if (T >= w->N) {
                            break;   /* the untransferred tail keeps the NaN pattern */
                        }
                        for (int kv = 0; kv < 2; ++kv) {
                            for (int h = 0; h < s->kv_heads; ++h) {
                                uint64_t row = xp_row(XP_KIND_ATTN, (uint64_t)grp->layers[j],
                                                      (uint64_t)(s->kv_head_start + h),
                                                      (uint64_t)T, (uint64_t)kv);
                                for (int d = 0; d < cfg->head_dim; ++d) {
                                    xp_elem(row, d, kv_elt,
                                            pool + page + kvf_attn_offset(g, cfg, t, kv, h, d));
                                }
                            }
                        }
                    }
                }
            }
        } else {
            int32_t id = w->rids[gi][w->nr[gi] - 1];
            for (int j = 0; j < grp->num_layers; ++j) {
                uint64_t page = xp_page(id, slots, j, g->page_size);
                for (int c = 0; c < s->conv_dim; ++c) {
                    int part, global;
                    xp_conv_global(cfg, s, c, &part, &global);
                    uint64_t row = xp_row(XP_KIND_CONV, (uint64_t)grp->layers[j], (uint64_t)part,
                                          (uint64_t)global, 0);
                    for (int k = 0; k < cfg->conv_kernel - 1; ++k) {
                        xp_elem(row, k, conv_elt, pool + page + kvf_conv_offset(g, cfg, c, k));
                    }
                }
                for (int h = 0; h < s->mamba_heads; ++h) {
                    for (int p = 0; p < cfg->mamba_head_dim; ++p) {
                        uint64_t row = xp_row(XP_KIND_SSM, (uint64_t)grp->layers[j],
                                              (uint64_t)(s->mamba_head_start + h), (uint64_t)p, 0);
                        for (int n = 0; n < cfg->ssm_state_size; ++n) {
                            xp_elem(row, n, ssm_elt,
                                    pool + page + kvf_ssm_offset(g, cfg, h, p, n));
                        }
                    }
                }
            }
        }
    }
}

/* ---- verification of one decode rank ---- */

typedef struct xp_check {
    const uint8_t *pool;
    uint8_t       *mask;
    size_t         len;
    unsigned long long elements;
    unsigned long long zero_bytes;
} xp_check_t;

static void xp_expect(xp_check_t *ck, uint64_t off, const uint8_t *want, size_t n,
                      const char *what, int layer, int a, int64_t b, int c, int d)
{
    assert_true(off + n <= ck->len);
    if (memcmp(ck->pool + off, want, n) != 0) {
        fail_msg("%s layer %d (%d, %" PRId64 ", %d, %d) at byte %" PRIu64 ": got %02x%02x.."
                 " want %02x%02x..", what, layer, a, b, c, d, off, ck->pool[off],
                 ck->pool[off + (n > 1)], want[0], want[n > 1]);
    }
    memset(ck->mask + off, 1, n);
    ck->elements++;
}

/*
 * With coalescing, a Mamba page's padding is read too exactly when that joins the page's last
 * row and the next layer slot's first row (pairs[first]) into one run on both sides: the last
 * row ends both pages' data, the next row starts both next pages, both come from one prefill
 * rank, and both pads are equally long. Then the decode pad holds the prefill pad's bytes, and it is one more
 * pair of the minimal list.
 */
static void xp_bridge_pad(const xp_world_t *w, int dr, xp_check_t *ck, xp_pairs_t *pairs,
                          size_t first, uint64_t prev_page)
{
    const kvf_rank_geometry_t *g = &w->dg[dr];
    const xp_pair_t a = pairs->v[first - 1], b = pairs->v[first];
    const kvf_rank_geometry_t *rg = &w->pg[a.rank];
    uint64_t pad = g->page_size - g->mamba_bytes, lend = a.loff + a.len, rend = a.roff + a.len;

    assert_int_equal(lend, prev_page + g->mamba_bytes);
    assert_int_equal(b.loff, prev_page + g->page_size);
    if ((pad == 0) || (a.rank != b.rank) || (rg->page_size - rg->mamba_bytes != pad) ||
        (rend % rg->page_size != rg->mamba_bytes) || (b.roff != rend + pad)) {
        return;
    }
    if (memcmp(ck->pool + lend, w->ppool[a.rank] + rend, pad) != 0) {
        fail_msg("P%d D%d decode rank %d: the Mamba pad at byte %" PRIu64 " is not prefill"
                 " rank %d's (%02x, want %02x; pad %" PRIu64 ", N %" PRId64 ")", w->P, w->D, dr,
                 lend, a.rank, ck->pool[lend], w->ppool[a.rank][rend], pad, w->N);
    }
    memset(ck->mask + lend, 1, pad);
    xp_pairs_push(pairs, lend, a.rank, rend, pad);
}

/* xp_verify_decode for Mamba group @gi: every conv and SSM state row of the request's last
 * block on decode rank @dr, and where each row comes from; with @pad_reads, the padding
 * bridged between consecutive layers' pages. */
static void xp_verify_mamba_group(xp_world_t *w, int dr, int gi, bool pad_reads, xp_check_t *ck,
                                  xp_pairs_t *pairs)
{
    const kvf_model_config_t *cfg = &w->cfg;
    const kvf_rank_geometry_t *g = &w->dg[dr];
    const kvf_shard_t *s = &g->shard;
    const kvf_kv_group_t *grp = &w->layout.groups[gi];
    size_t conv_elt = kvf_dtype_size(g->conv_dtype), ssm_elt = kvf_dtype_size(g->ssm_dtype);
    int slots = w->layout.slots;
    uint8_t want[8];
    int32_t id = w->lids[gi][w->nl[gi] - 1];
    int32_t rid = w->rids[gi][w->nr[gi] - 1];
    for (int j = 0; j < grp->num_layers; ++j) {
        int layer = grp->layers[j];
        uint64_t page = xp_page(id, slots, j, g->page_size);
        size_t first = pairs->n;   /* this page's first row */
        for (int c = 0; c < s->conv_dim; ++c) {
            int part, global, r;
            xp_conv_global(cfg, s, c, &part, &global);
            uint64_t row = xp_row(XP_KIND_CONV, (uint64_t)layer, (uint64_t)part,
                                  (uint64_t)global, 0);
            for (int k = 0; k < cfg->conv_kernel - 1; ++k) {
                xp_elem(row, k, conv_elt, want);
                xp_expect(ck, page + kvf_conv_offset(g, cfg, c, k), want, conv_elt,
                          "conv", layer, part, global, k, dr);
            }
            r = (part == 0) ?
                kvf_tp_mamba_head_source(cfg, w->P, global / cfg->mamba_head_dim) :
                kvf_tp_group_source(cfg, w->P, w->D, dr, global / cfg->ssm_state_size);
            int rc = xp_conv_local(cfg, &w->pg[r].shard, part, global);
            assert_true(rc >= 0);
            xp_pairs_push(pairs, page + kvf_conv_offset(g, cfg, c, 0), r,
                          xp_page(rid, slots, j, w->pg[r].page_size) +
                          kvf_conv_offset(&w->pg[r], cfg, rc, 0),
                          (uint64_t)(cfg->conv_kernel - 1) * conv_elt);
        }
        for (int h = 0; h < s->mamba_heads; ++h) {
            int gh = s->mamba_head_start + h;
            int r = kvf_tp_mamba_head_source(cfg, w->P, gh);
            int rh = gh - w->pg[r].shard.mamba_head_start;
            assert_true((rh >= 0) && (rh < w->pg[r].shard.mamba_heads));
            for (int p = 0; p < cfg->mamba_head_dim; ++p) {
                uint64_t row = xp_row(XP_KIND_SSM, (uint64_t)layer, (uint64_t)gh,
                                      (uint64_t)p, 0);
                for (int n = 0; n < cfg->ssm_state_size; ++n) {
                    xp_elem(row, n, ssm_elt, want);
                    xp_expect(ck, page + kvf_ssm_offset(g, cfg, h, p, n), want, ssm_elt,
                              "ssm", layer, gh, p, n, dr);
                }
                xp_pairs_push(pairs, page + kvf_ssm_offset(g, cfg, h, p, 0), r,
                              xp_page(rid, slots, j, w->pg[r].page_size) +
                              kvf_ssm_offset(&w->pg[r], cfg, rh, p, 0),
                              (uint64_t)cfg->ssm_state_size * ssm_elt);
            }
        }
        if ((j > 0) && pad_reads) {   /* coalescing on */
            xp_bridge_pad(w, dr, ck, pairs, first, page - g->page_size);
        }
    }
}

static void xp_verify_decode(xp_world_t *w, int dr, bool pad_reads, const uint8_t *pool,
                             size_t len, xp_pairs_t *pairs, unsigned long long *elements_p,
                             unsigned long long *zero_bytes_p)
{
    const kvf_model_config_t *cfg = &w->cfg;
    const kvf_rank_geometry_t *g = &w->dg[dr];
    const kvf_shard_t *s = &g->shard;
    size_t kv_elt = kvf_dtype_size(g->kv_dtype);
    size_t row_bytes = (size_t)cfg->head_dim * kv_elt;
    int bp = w->pg[0].block_size;
    uint8_t want[8], zero[8] = {0};
    xp_check_t ck = {.pool = pool, .len = len};

    ck.mask = calloc(1, len);
    assert_non_null(ck.mask);
    for (int gi = 0; gi < w->layout.num_groups; ++gi) {
        const kvf_kv_group_t *grp = &w->layout.groups[gi];
        if (kvf_group_is_attention(grp->kind)) {
            /* blocks of a prefix hit are the decode's own: untouched (still poison) */
            for (int b = (int)(w->skip / g->block_size); b < w->nl[gi]; ++b) {
                for (int j = 0; j < grp->num_layers; ++j) {
                    int layer = grp->layers[j];
                    uint64_t page = kvf_attn_slot_off(g, w->lids[gi][b], j);
                    for (int t = 0; t < g->block_size; ++t) {
                        int64_t T = (int64_t)b * g->block_size + t;
                        for (int kv = 0; kv < 2; ++kv) {
                            for (int h = 0; h < s->kv_heads; ++h) {
                                int gh = s->kv_head_start + h;
                                uint64_t row = xp_row(XP_KIND_ATTN, (uint64_t)layer,
                                                      (uint64_t)gh, (uint64_t)T, (uint64_t)kv);
                                for (int d = 0; d < cfg->head_dim; ++d) {
                                    uint64_t off = page + kvf_attn_offset(g, cfg, t, kv, h, d);
                                    if (T < w->N) {
                                        xp_elem(row, d, kv_elt, want);
                                        xp_expect(&ck, off, want, kv_elt, kv ? "V" : "K", layer,
                                                  gh, T, d, dr);
                                    } else {
                                        xp_expect(&ck, off, zero, kv_elt, kv ? "V tail" : "K tail",
                                                  layer, gh, T, d, dr);
                                        ck.zero_bytes += kv_elt;
                                    }
                                }
                                if (T < w->N) {   /* where this row comes from */
                                    int r = kvf_tp_kv_head_source(cfg, w->P, w->D, dr, gh);
                                    const kvf_rank_geometry_t *rg = &w->pg[r];
                                    int rh = gh - rg->shard.kv_head_start;
                                    assert_true((rh >= 0) && (rh < rg->shard.kv_heads));
                                    uint64_t roff = kvf_attn_slot_off(rg, w->rids[gi][T / bp],
                                                                      j) +
                                                    kvf_attn_offset(rg, cfg, (int)(T % bp), kv,
                                                                    rh, 0);
                                    xp_pairs_push(pairs, page + kvf_attn_offset(g, cfg, t, kv, h,
                                                                                0),
                                                  r, roff, row_bytes);
                                }
                            }
                        }
                    }
                }
            }
        } else {
            xp_verify_mamba_group(w, dr, gi, pad_reads, &ck, pairs);
        }
    }
    for (size_t i = 0; i < len; ++i) {   /* nothing else changed: padding, other blocks, slots */
        if (!ck.mask[i] && (pool[i] != XP_DECODE_POISON)) {
            fail_msg("decode rank %d byte %zu outside the request's state changed to %02x"
                     " (page %zu, offset %zu in page)", dr, i, pool[i], i / g->page_size,
                     i % g->page_size);
        }
    }
    free(ck.mask);
    assert_true((ck.elements > 0) || (w->skip == w->N));   /* a full hit of a dense model */
    *elements_p = ck.elements;
    *zero_bytes_p = ck.zero_bytes;
}

/*
 * The plan's source ranks (derived once, handed on to the connector): those of the TP map
 * (kvf_tp_source_ranks()), ascending; every rank with descriptors is one of them, and with
 * nothing skipped each of them has descriptors (every source holds a head or group of this
 * decode rank, and N >= 1 reads at least one block or state of it).
 */
static void xp_check_sources(const kvf_xfer_plan_params_t *params, const kvf_xfer_plan_t *plan)
{
    int want[1024];
    int n = 0, k = 0;

    assert_true(params->remote_tp <= 1024);
    assert_int_equal(kvf_tp_source_ranks(params->cfg, params->remote_tp, params->local_tp,
                                         params->local_rank, want, &n), KVF_OK);
    assert_int_equal(plan->num_sources, n);
    assert_non_null(plan->sources);
    assert_memory_equal(plan->sources, want, (size_t)n * sizeof(int));
    for (int i = 0; i < plan->num_ranks; ++i) {
        while ((k < n) && (want[k] < plan->ranks[i].remote_rank)) {
            ++k;
        }
        assert_true(k < n);
        assert_int_equal(want[k], plan->ranks[i].remote_rank);
    }
    if (!(params->field_mask & KVF_XFER_PLAN_PARAM_FIELD_SKIP) || (params->skip_tokens == 0)) {
        assert_int_equal(plan->num_ranks, n);
    }
}

/*
 * The same plan from the pair's pieces (kvf_xfer_pieces_create, as a connector reuses them
 * per pull): every descriptor, zero range and counter equal; and pieces of another decode
 * rank are refused.
 */
static void xp_check_pieces(const kvf_xfer_plan_params_t *params, const kvf_xfer_plan_t *want)
{
    kvf_xfer_plan_params_t pp = *params;
    kvf_xfer_pieces_t *pc = NULL;
    kvf_xfer_plan_t *got = NULL;

    assert_int_equal(kvf_xfer_pieces_create(params, &pc), KVF_OK);
    pp.field_mask |= KVF_XFER_PLAN_PARAM_FIELD_PIECES;
    pp.pieces = pc;
    assert_true(kvf_xfer_pieces_match(pc, &pp));
    assert_int_equal(kvf_xfer_plan_create(&pp, &got), KVF_OK);
    assert_int_equal(got->num_sources, want->num_sources);
    assert_memory_equal(got->sources, want->sources,
                        (size_t)want->num_sources * sizeof(*want->sources));
    assert_int_equal(got->num_ranks, want->num_ranks);
    assert_int_equal(got->total_descs, want->total_descs);
    assert_int_equal(got->total_bytes, want->total_bytes);
    assert_int_equal(got->pad_bytes, want->pad_bytes);
    for (int i = 0; i < want->num_ranks; ++i) {
        assert_int_equal(got->ranks[i].remote_rank, want->ranks[i].remote_rank);
        assert_int_equal(got->ranks[i].num_descs, want->ranks[i].num_descs);
        assert_memory_equal(got->ranks[i].descs, want->ranks[i].descs,
                            want->ranks[i].num_descs * sizeof(*want->ranks[i].descs));
    }
    assert_int_equal(got->num_zero, want->num_zero);
    if (want->num_zero > 0) {
        assert_memory_equal(got->zero, want->zero, want->num_zero * sizeof(*want->zero));
    }
    kvf_xfer_plan_destroy(got);
    if (params->local_tp > 1) {   /* another rank's pieces */
        pp.local_rank = (params->local_rank + 1) % params->local_tp;
        pp.local_geom = params->local_geom - params->local_rank + pp.local_rank;   /* dg[] */
        assert_false(kvf_xfer_pieces_match(pc, &pp));
        assert_int_equal(kvf_xfer_plan_create(&pp, &got), KVF_ERR_INVALID_PARAM);
    }
    kvf_xfer_pieces_destroy(pc);
}

/*
 * The same-node gather by templates (transfer/plan/kvf_xfer_tmpl.h, kernels/kvf_gather_tmpl.h)
 * on the CPU twin: every byte of the decode pool equal to the plan's @a want (copies and zero
 * ranges from the same poisoned pool), bytes and zeroed bytes equal to the plan's counts; a
 * pair whose block sizes differ has no templates and its jobs are refused. Returns whether the
 * templates ran.
 */
static bool xp_check_tmpl(const xp_world_t *w, const kvf_xfer_plan_params_t *params,
                          const kvf_xfer_plan_t *plan, const uint8_t *want, size_t dlen)
{
    kvf_xfer_plan_params_t pp = *params;
    kvf_xfer_pieces_t *pc = NULL;
    kvf_xfer_tmpls_t t;
    kvf_gather_table_desc_t d;
    kvf_gather_table_t *table = NULL;
    kvf_gather_job_t *jobs;
    kvf_device_t cpu = kvf_device_cpu();
    uint64_t bytes = 0, zero = 0;
    size_t n = 0;
    char why[160];
    uint8_t *got;
    kvf_status_t st;

    assert_int_equal(kvf_xfer_pieces_create(params, &pc), KVF_OK);
    pp.field_mask |= KVF_XFER_PLAN_PARAM_FIELD_PIECES;
    pp.pieces = pc;
    jobs = calloc(kvf_xfer_tmpl_jobs_max(&pp) + 1, sizeof(*jobs));
    assert_non_null(jobs);
    st = kvf_xfer_tmpls_build(pc, &t, why, sizeof(why));
    if (st != KVF_OK) {
        assert_int_equal(st, KVF_ERR_UNSUPPORTED);
        assert_int_equal(kvf_xfer_tmpl_jobs(&pp, jobs, &n, &bytes, &zero), KVF_ERR_UNSUPPORTED);
        free(jobs);
        kvf_xfer_pieces_destroy(pc);
        return false;
    }
    got = malloc(dlen);
    assert_non_null(got);
    memset(got, XP_DECODE_POISON, dlen);
    memset(&d, 0, sizeof(d));
    d.dst_base = (uint64_t)(uintptr_t)got;
    d.dst_page = params->local_geom->page_size;
    d.dst_blocks = w->d_blocks;
    d.slots = (uint32_t)w->layout.slots;
    d.num_src = (uint32_t)w->P;
    for (int r = 0; r < w->P; ++r) {
        d.src_base[r] = (uint64_t)(uintptr_t)w->ppool[r];
        d.src_page[r] = w->pg[r].page_size;
        d.src_blocks[r] = w->p_blocks;
    }
    d.pieces = t.pieces;
    d.num_pieces = t.num_pieces;
    d.tmpls = t.tmpls;
    d.num_tmpls = KVF_XFER_TMPL_COUNT;
    assert_int_equal(kvf_gather_table_create(&cpu, &d, &table), KVF_KERN_OK);
    assert_int_equal(t.num_sources, plan->num_sources);
    assert_memory_equal(t.sources, plan->sources, (size_t)t.num_sources * sizeof(int));
    assert_int_equal(kvf_xfer_tmpl_jobs(&pp, jobs, &n, &bytes, &zero), KVF_OK);
    assert_int_equal(kvf_gather_tmpl_run(&cpu, table, jobs, NULL, n), KVF_KERN_OK);
    assert_memory_equal(got, want, dlen);
    assert_int_equal(bytes, plan->total_bytes);
    assert_int_equal(zero, plan->zero_bytes);
    kvf_gather_table_destroy(&cpu, table);
    kvf_xfer_tmpls_free(&t);
    free(got);
    free(jobs);
    kvf_xfer_pieces_destroy(pc);
    return true;
}

/* ---- block ids ---- */

static uint64_t xp_rand(uint64_t *state)
{
    *state += 1;
    return xp_mix(*state);
}

static void xp_id_pool(int64_t n, xp_id_mode_t mode, uint64_t *rng, int32_t *ids)
{
    for (int64_t i = 0; i < n; ++i) {
        ids[i] = (int32_t)i;
    }
    if (mode == XP_IDS_CONSECUTIVE) {
        for (int64_t i = 0; i + 1 < n; ++i) {   /* start at 1: block 0 stays a bystander */
            ids[i] = (int32_t)(i + 1);
        }
        return;
    }
    for (int64_t i = n - 1; i > 0; --i) {
        int64_t k = (int64_t)(xp_rand(rng) % (uint64_t)(i + 1));
        int32_t t = ids[i];
        ids[i] = ids[k];
        ids[k] = t;
    }
}

static void xp_assign_ids(xp_world_t *w, const xp_case_t *c)
{
    int64_t ltot = 0, rtot = 0, lpos = 0, rpos = 0;
    int32_t *lpool, *rpool;
    uint64_t rng = c->seed * 7919u + 17u;
    int bd = w->dg[0].block_size, bp = w->pg[0].block_size;

    for (int gi = 0; gi < w->layout.num_groups; ++gi) {
        if (kvf_group_is_attention(w->layout.groups[gi].kind)) {
            w->nl[gi] = (int)((w->N + bd - 1) / bd) + c->extra_local;
            w->nr[gi] = (int)((w->N + bp - 1) / bp);
        } else {
            w->nl[gi] = w->nr[gi] = (c->extra_local > 0) ? 2 : 1;
        }
        ltot += w->nl[gi];
        rtot += w->nr[gi];
    }
    w->d_blocks = ltot + 3;
    w->p_blocks = rtot + 3;
    lpool = malloc((size_t)w->d_blocks * sizeof(*lpool));
    rpool = malloc((size_t)w->p_blocks * sizeof(*rpool));
    assert_non_null(lpool);
    assert_non_null(rpool);
    xp_id_pool(w->d_blocks, c->id_mode, &rng, lpool);
    xp_id_pool(w->p_blocks, c->id_mode, &rng, rpool);
    for (int gi = 0; gi < w->layout.num_groups; ++gi) {
        w->lids[gi] = malloc((size_t)w->nl[gi] * sizeof(int32_t));
        w->rids[gi] = malloc((size_t)w->nr[gi] * sizeof(int32_t));
        assert_non_null(w->lids[gi]);
        assert_non_null(w->rids[gi]);
        memcpy(w->lids[gi], lpool + lpos, (size_t)w->nl[gi] * sizeof(int32_t));
        memcpy(w->rids[gi], rpool + rpos, (size_t)w->nr[gi] * sizeof(int32_t));
        lpos += w->nl[gi];
        rpos += w->nr[gi];
    }
    free(lpool);
    free(rpool);
}

/* ---- execution by the harness itself (independent of kvf_xfer_plan_apply_local) ---- */

/* No local byte is written twice: descriptors of all ranks and zero ranges are disjoint. */
static void xp_cover(uint8_t *cover, uint64_t off, uint64_t len, const char *what)
{
    for (uint64_t i = off; i < off + len; ++i) {
        if (cover[i]) {
            fail_msg("local byte %" PRIu64 " written twice (%s)", i, what);
        }
        cover[i] = 1;
    }
}

static void xp_execute(const xp_world_t *w, const kvf_xfer_plan_t *plan, uint8_t *local,
                       size_t local_len)
{
    uint8_t *cover = calloc(1, local_len);

    assert_non_null(cover);
    for (int i = 0; i < plan->num_ranks; ++i) {
        const kvf_xfer_rank_plan_t *rp = &plan->ranks[i];
        int r = rp->remote_rank;
        assert_true((r >= 0) && (r < w->P));
        assert_true((i == 0) || (r > plan->ranks[i - 1].remote_rank));
        assert_true(rp->num_descs > 0);
        for (size_t k = 0; k < rp->num_descs; ++k) {
            const kvf_xfer_desc_t *d = &rp->descs[k];
            assert_true(d->len > 0);
            assert_true(d->local_off + d->len <= local_len);
            assert_true(d->remote_off + d->len <= w->ppool_len[r]);
            assert_true((k == 0) || (d->local_off > rp->descs[k - 1].local_off));
            xp_cover(cover, d->local_off, d->len, "descriptor");
            memcpy(local + d->local_off, w->ppool[r] + d->remote_off, d->len);
        }
    }
    for (size_t k = 0; k < plan->num_zero; ++k) {
        const kvf_xfer_range_t *z = &plan->zero[k];
        assert_true(z->len > 0);
        assert_true(z->off + z->len <= local_len);
        assert_true((k == 0) || (z->off > plan->zero[k - 1].off + plan->zero[k - 1].len - 1));
        xp_cover(cover, z->off, z->len, "zero range");
        memset(local + z->off, 0, z->len);
    }
    free(cover);
}

static void xp_world_free(xp_world_t *w)
{
    for (int gi = 0; gi < KVF_MAX_KV_GROUPS; ++gi) {
        free(w->lids[gi]);
        free(w->rids[gi]);
    }
    for (int r = 0; r < XP_MAX_TP; ++r) {
        free(w->ppool[r]);
    }
    free(w);
}

void xp_case_block_sizes(const xp_case_t *c, int *p_block_p, int *d_block_p)
{
    xp_world_t *w = calloc(1, sizeof(*w));
    kvf_cache_params_t p;

    assert_non_null(w);
    assert_int_equal(kvf_model_config_parse(c->model_json, "test", &w->cfg), KVF_OK);
    xp_params(w, c->kv_dtype, c->p_block, c->p_kernel, c->p_layout, &p);
    assert_int_equal(kvf_block_size_select(&w->cfg, &p, c->P, p_block_p), KVF_OK);
    xp_params(w, c->kv_dtype, c->d_block, c->d_kernel, c->d_layout, &p);
    assert_int_equal(kvf_block_size_select(&w->cfg, &p, c->D, d_block_p), KVF_OK);
    free(w);
}

/* Decode rank @dr's plan against its expected (local, remote) pairs: the byte totals (exactly
 * what the rank needs, each piece read once, per prefill rank in order) and, coalescing on,
 * the minimal descriptor count. @pairs is sorted here. */
static void xp_check_totals(const xp_world_t *w, const xp_case_t *c, int dr,
                            const kvf_xfer_plan_t *plan, xp_pairs_t *pairs,
                            unsigned long long zero_bytes)
{
    unsigned long long want_bytes = 0, rank_bytes[XP_MAX_TP] = {0};
    size_t runs = 0;

    /* byte totals: exactly what the rank needs, each piece read once */
    for (size_t i = 0; i < pairs->n; ++i) {
        want_bytes += pairs->v[i].len;
        rank_bytes[pairs->v[i].rank] += pairs->v[i].len;
    }
    assert_int_equal(plan->total_bytes, want_bytes);
    assert_int_equal(plan->attn_bytes + plan->mamba_bytes + plan->pad_bytes, want_bytes);
    assert_int_equal(plan->zero_bytes, zero_bytes);
    {
        int i = 0;
        for (int r = 0; r < w->P; ++r) {
            if (rank_bytes[r] == 0) {
                continue;
            }
            assert_true(i < plan->num_ranks);
            assert_int_equal(plan->ranks[i].remote_rank, r);
            assert_int_equal(plan->ranks[i].bytes, rank_bytes[r]);
            ++i;
        }
        assert_int_equal(i, plan->num_ranks);
    }

    /* minimal descriptor count: maximal runs contiguous on both sides */
    if (pairs->n > 0) {   /* a whole-prompt hit reads nothing: no array (qsort wants one) */
        qsort(pairs->v, pairs->n, sizeof(*pairs->v), xp_pair_cmp);
    }
    for (size_t i = 0; i < pairs->n; ++i) {
        const xp_pair_t *q = &pairs->v[i], *prev = (i > 0) ? &pairs->v[i - 1] : NULL;
        if ((prev == NULL) || (prev->rank != q->rank) ||
            (prev->loff + prev->len != q->loff) || (prev->roff + prev->len != q->roff)) {
            ++runs;
        }
    }
    if (c->no_coalesce) {
        assert_true(plan->total_descs >= runs);
    } else {
        if (plan->total_descs != runs) {
            fail_msg("P%d D%d rank %d N %" PRId64 ": %zu descriptors, minimal is %zu",
                     w->P, w->D, dr, w->N, plan->total_descs, runs);
        }
    }
}

void xp_run_case(const xp_case_t *c, xp_totals_t *totals)
{
    xp_world_t *w = calloc(1, sizeof(*w));
    kvf_cache_params_t pp, dp;
    kvf_xfer_group_blocks_t groups[KVF_MAX_KV_GROUPS];
    int64_t remote_nb[XP_MAX_TP];
    int slots;

    assert_non_null(w);
    assert_true((c->P <= XP_MAX_TP) && (c->D <= XP_MAX_TP));
    assert_int_equal(kvf_model_config_parse(c->model_json, "test", &w->cfg), KVF_OK);
    assert_int_equal(kvf_cache_layout_build(&w->cfg, &w->layout), KVF_OK);
    slots = w->layout.slots;
    w->P = c->P;
    w->D = c->D;
    w->N = c->num_tokens;
    w->skip = c->skip_tokens;
    xp_params(w, c->kv_dtype, c->p_block, c->p_kernel, c->p_layout, &pp);
    xp_params(w, c->kv_dtype, c->d_block, c->d_kernel, c->d_layout, &dp);
    for (int r = 0; r < w->P; ++r) {
        assert_int_equal(kvf_rank_geometry_compute(&w->cfg, &pp, w->P, r, &w->pg[r]), KVF_OK);
    }
    for (int r = 0; r < w->D; ++r) {
        assert_int_equal(kvf_rank_geometry_compute(&w->cfg, &dp, w->D, r, &w->dg[r]), KVF_OK);
    }
    xp_assign_ids(w, c);
    for (int r = 0; r < w->P; ++r) {
        w->ppool_len[r] = (size_t)w->p_blocks * (size_t)slots * w->pg[r].page_size;
        w->ppool[r] = malloc(w->ppool_len[r]);
        assert_non_null(w->ppool[r]);
        xp_fill_prefill(w, r);
        remote_nb[r] = w->p_blocks;
    }
    for (int gi = 0; gi < w->layout.num_groups; ++gi) {
        groups[gi] = (kvf_xfer_group_blocks_t){.local_ids = w->lids[gi], .num_local = w->nl[gi],
                                               .remote_ids = w->rids[gi],
                                               .num_remote = w->nr[gi]};
    }

    for (int dr = 0; dr < w->D; ++dr) {
        kvf_xfer_plan_params_t params = {
            .field_mask = c->no_coalesce ? KVF_XFER_PLAN_PARAM_FIELD_FLAGS : 0,
            .cfg = &w->cfg, .layout = &w->layout,
            .local_tp = w->D, .local_rank = dr, .local_geom = &w->dg[dr],
            .local_num_blocks = w->d_blocks,
            .remote_tp = w->P, .remote_geoms = w->pg, .remote_num_blocks = remote_nb,
            .num_groups = w->layout.num_groups, .groups = groups, .num_tokens = w->N,
            .flags = c->no_coalesce ? KVF_XFER_PLAN_FLAG_NO_COALESCE : 0,
            .skip_tokens = c->skip_tokens,
        };
        size_t dlen = (size_t)w->d_blocks * (size_t)slots * w->dg[dr].page_size;
        const void *bases[XP_MAX_TP];
        size_t lens[XP_MAX_TP];
        xp_pairs_t pairs = {0};
        unsigned long long elements, zero_bytes;
        kvf_xfer_plan_t *plan = NULL;
        uint8_t *a, *b;

        if (c->skip_tokens != 0) {
            params.field_mask |= KVF_XFER_PLAN_PARAM_FIELD_SKIP;
        }
        assert_int_equal(kvf_xfer_plan_create(&params, &plan), KVF_OK);
        assert_non_null(plan);
        assert_int_equal(plan->local_region_bytes, dlen);
        xp_check_sources(&params, plan);
        xp_check_pieces(&params, plan);
        a = malloc(dlen);
        b = malloc(dlen);
        assert_non_null(a);
        assert_non_null(b);
        memset(a, XP_DECODE_POISON, dlen);
        memset(b, XP_DECODE_POISON, dlen);
        xp_execute(w, plan, a, dlen);
        for (int r = 0; r < w->P; ++r) {
            bases[r] = w->ppool[r];
            lens[r] = w->ppool_len[r];
        }
        assert_int_equal(kvf_xfer_plan_apply_local(plan, b, dlen, bases, lens), KVF_OK);
        assert_memory_equal(a, b, dlen);
        totals->tmpl_plans += xp_check_tmpl(w, &params, plan, a, dlen) ? 1 : 0;

        xp_verify_decode(w, dr, !c->no_coalesce, a, dlen, &pairs, &elements, &zero_bytes);

        xp_check_totals(w, c, dr, plan, &pairs, zero_bytes);

        totals->rank_plans++;
        totals->descs += plan->total_descs;
        totals->bytes += plan->total_bytes;
        totals->zero_bytes += plan->zero_bytes;
        totals->elements += elements;
        free(pairs.v);
        free(a);
        free(b);
        kvf_xfer_plan_destroy(plan);
    }
    totals->cases++;
    xp_world_free(w);
}

static int xp_gcd(int a, int b)
{
    while (b != 0) {
        int t = a % b;
        a = b;
        b = t;
    }
    return a;
}

void xp_run_matrix(const char *model_json, const xp_block_cfg_t *cfgs, int num_cfgs,
                   xp_totals_t *totals)
{
    xp_run_matrix_kv(model_json, cfgs, num_cfgs, KVF_KV_LAYER_MAJOR, KVF_KV_LAYER_MAJOR, totals);
}

void xp_run_matrix_kv(const char *model_json, const xp_block_cfg_t *cfgs, int num_cfgs,
                      kvf_kv_layout_t p_layout, kvf_kv_layout_t d_layout, xp_totals_t *totals)
{
    static const int layouts[][2] = {{1, 1}, {1, 2}, {2, 1}, {2, 2}, {4, 2},
                                     {2, 4}, {1, 4}, {4, 1}, {4, 4}};
    static const kvf_dtype_t dtypes[] = {KVF_DTYPE_BF16, KVF_DTYPE_FP32};
    uint64_t counter = 0;

    for (int ci = 0; ci < num_cfgs; ++ci) {
        for (size_t li = 0; li < sizeof(layouts) / sizeof(layouts[0]); ++li) {
            for (size_t di = 0; di < sizeof(dtypes) / sizeof(dtypes[0]); ++di) {
                xp_case_t c = {
                    .model_json = model_json, .P = layouts[li][0], .D = layouts[li][1],
                    .kv_dtype = dtypes[di],
                    .p_block = cfgs[ci].p_block, .p_kernel = cfgs[ci].p_kernel,
                    .d_block = cfgs[ci].d_block, .d_kernel = cfgs[ci].d_kernel,
                    .p_layout = p_layout, .d_layout = d_layout,
                };
                int bp, bd, mx;
                int64_t lens[5];
                xp_case_block_sizes(&c, &bp, &bd);
                mx = (bp > bd) ? bp : bd;
                lens[0] = 1;                      /* a single token */
                lens[1] = 2 * (int64_t)bd;        /* decode block boundary */
                lens[2] = 2 * (int64_t)bp;        /* prefill block boundary */
                lens[3] = 3 * (int64_t)mx - 7;    /* mid-block on both sides */
                lens[4] = (int64_t)bp / xp_gcd(bp, bd) * bd;   /* both boundaries */
                for (int k = 0; k < 5; ++k) {
                    bool dup = false;
                    for (int q = 0; q < k; ++q) {
                        dup = dup || (lens[q] == lens[k]);
                    }
                    if (dup || (lens[k] > 4 * (int64_t)mx)) {
                        continue;
                    }
                    ++counter;
                    c.num_tokens = lens[k];
                    c.seed = counter;
                    c.id_mode = (counter % 2) ? XP_IDS_SHUFFLED : XP_IDS_CONSECUTIVE;
                    c.extra_local = (int)(counter % 3);
                    c.no_coalesce = (counter % 11) == 5;
                    xp_run_case(&c, totals);
                }
            }
        }
    }
}
