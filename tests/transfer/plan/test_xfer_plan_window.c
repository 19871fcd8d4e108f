/*
 * The KV pull bounded by a sliding window (KVF_XFER_PLAN_FLAG_WINDOW): for a mistral model
 * whose every layer slides (window 40, decode blocks of 16), the bytes a plan reads stay at
 * most ceil(W / block) + 1 blocks whatever the prompt (50 to 5000 tokens), while a full pull
 * grows with it; and decode's attention over the windowed pull is bit for bit the attention
 * over the full pull (the kernel with the window, several decode steps, layouts 1p1d, 2p1d
 * and 1p2d). The blocks before the window are zeroed, not read: the decode region starts as
 * NaN bytes, so a byte the kernel read there and the plan left stale would poison its
 * output. Models mixing full and sliding layers (qwen3 with max_window_layers 1: [full,
 * sliding]; qwen3 with layer_types [sliding, full, sliding], gpt_oss's and gemma3's pattern)
 * keep them in cache groups of their own (KVF_GROUP_ATTENTION, KVF_GROUP_SLIDING), each with
 * its own block ids: the full groups are read whole, the sliding groups from the window's
 * first block on, so the bytes read are exactly the full layers' whole prompt plus the
 * sliding layers' window blocks, with the same attention bit for bit. And what the
 * prefix-cache guard prevents: a later request served those blocks as a prefix hit attends
 * to zeros and answers wrong. Every windowed pull also runs by the pair's block templates
 * (the same-node path without a plan), equal to the plan's region in every byte.
 */
#include "kvf_attention.h"
#include "kvf_xfer_plan.h"
#include "kvf_xfer_tmpl.h"
#include "kvf_layout.h"
#include "kvf_model_config.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#define DENSE "\"vocab_size\":260,\"hidden_size\":64,\"num_hidden_layers\":2," \
              "\"num_attention_heads\":8,\"num_key_value_heads\":2,\"head_dim\":16," \
              "\"intermediate_size\":128,\"max_position_embeddings\":32768"
static const char *const mistral_json = "{\"model_type\":\"mistral\"," DENSE
                                        ",\"sliding_window\":40}";
static const char *const qwen3_json = "{\"model_type\":\"qwen3\"," DENSE
                                      ",\"use_sliding_window\":true,\"sliding_window\":40,"
                                      "\"max_window_layers\":1}";
static const char *const qwen3_sfs_json = "{\"model_type\":\"qwen3\","
    "\"vocab_size\":260,\"hidden_size\":64,\"num_hidden_layers\":3,"
    "\"num_attention_heads\":8,\"num_key_value_heads\":2,\"head_dim\":16,"
    "\"intermediate_size\":128,\"max_position_embeddings\":32768,"
    "\"use_sliding_window\":true,\"sliding_window\":40,\"layer_types\":"
    "[\"sliding_attention\",\"full_attention\",\"sliding_attention\"]}";
enum { W = 40, BS = 16, STEPS = 4, MAX_TP = 2, MAX_G = 4 };

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static float rng_float(uint64_t *s)
{
    return (float)(rng_next(s) >> 40) / (float)(1u << 24) * 2.0f - 1.0f;
}

typedef struct world {
    kvf_model_config_t  cfg;
    kvf_cache_layout_t  layout;
    kvf_rank_geometry_t pg[MAX_TP], dg[MAX_TP];
    int                 P, D;
} world_t;

static void world_init(world_t *w, const char *json, int P, int D)
{
    kvf_cache_params_t cp;
    memset(w, 0, sizeof(*w));
    assert_int_equal(kvf_model_config_parse(json, "test", &w->cfg), KVF_OK);
    assert_int_equal(kvf_cache_layout_build(&w->cfg, &w->layout), KVF_OK);
    kvf_cache_params_default(&w->cfg, &cp);
    cp.kv_dtype = KVF_DTYPE_FP32;
    cp.block_size = BS;
    w->P = P;
    w->D = D;
    for (int r = 0; r < P; ++r) {
        assert_int_equal(kvf_rank_geometry_compute(&w->cfg, &cp, P, r, &w->pg[r]), KVF_OK);
    }
    for (int r = 0; r < D; ++r) {
        assert_int_equal(kvf_rank_geometry_compute(&w->cfg, &cp, D, r, &w->dg[r]), KVF_OK);
    }
    assert_int_equal(w->dg[0].block_size, BS);
}

/* Group @a g's block ids: ids[0, nids) shifted by g * nb, so each cache group has blocks of
 * its own in a region of num_groups * nb blocks. */
static void group_ids(const world_t *w, const int32_t *ids, int nids, int nb, int32_t *gids,
                      kvf_xfer_group_blocks_t *groups)
{
    assert_true(w->layout.num_groups <= MAX_G);
    for (int g = 0; g < w->layout.num_groups; ++g) {
        for (int b = 0; b < nids; ++b) {
            gids[g * nids + b] = ids[b] + g * nb;
        }
        groups[g] = (kvf_xfer_group_blocks_t){.local_ids = gids + g * nids, .num_local = nids,
                                              .remote_ids = gids + g * nids,
                                              .num_remote = nids};
    }
}

/* Plan decode rank @a dr's pull of @a n tokens (ids[0, nids) in every group, group_ids();
 * regions of @a nb blocks a group), windowed or not, tokens [0, skip) already there (a
 * prefix hit). */
static kvf_xfer_plan_t *plan_skip(const world_t *w, int dr, int64_t n, int32_t *ids, int nids,
                                  int nb, bool window, int64_t skip)
{
    const int G = w->layout.num_groups;
    int64_t remote_nb[MAX_TP] = {(int64_t)nb * G, (int64_t)nb * G};
    int32_t *gids = malloc((size_t)G * (size_t)nids * sizeof(int32_t));
    kvf_xfer_group_blocks_t g[MAX_G];
    assert_non_null(gids);
    group_ids(w, ids, nids, nb, gids, g);
    kvf_xfer_plan_params_t p = {
        .field_mask = KVF_XFER_PLAN_PARAM_FIELD_FLAGS | KVF_XFER_PLAN_PARAM_FIELD_SKIP,
        .cfg = &w->cfg, .layout = &w->layout,
        .local_tp = w->D, .local_rank = dr, .local_geom = &w->dg[dr],
        .local_num_blocks = nb * G,
        .remote_tp = w->P, .remote_geoms = w->pg, .remote_num_blocks = remote_nb,
        .num_groups = G, .groups = g, .num_tokens = n,
        .flags = window ? KVF_XFER_PLAN_FLAG_WINDOW : 0, .skip_tokens = skip,
    };
    kvf_xfer_plan_t *pl = NULL;
    assert_int_equal(kvf_xfer_plan_create(&p, &pl), KVF_OK);
    free(gids);
    return pl;
}

/* Whether the model has both full and sliding attention layers. */
static bool mixes(const kvf_model_config_t *cfg)
{
    bool full = false, slide = false;

    for (int l = 0; l < cfg->num_layers; ++l) {
        if (cfg->layer_kinds[l] == KVF_LAYER_ATTENTION) {
            full = full || (cfg->layer_window[l] <= 0);
            slide = slide || (cfg->layer_window[l] > 0);
        }
    }
    return full && slide;
}

/* The same pull by the pair's block templates (kvf_xfer_tmpl.h) on the CPU twin: every byte
 * of the region equal to the plan's @a want (both from a region of 0xff). */
static void tmpl_equals(const world_t *w, int dr, int64_t n, int32_t *ids, int nb, bool window,
                        void *const *pre, const uint8_t *want, size_t dlen)
{
    const int G = w->layout.num_groups;
    int64_t remote_nb[MAX_TP] = {(int64_t)nb * G, (int64_t)nb * G};
    int32_t gids[MAX_G * 512];
    kvf_xfer_group_blocks_t g[MAX_G];
    assert_true(G * nb <= MAX_G * 512);
    group_ids(w, ids, nb, nb, gids, g);
    kvf_xfer_plan_params_t p = {
        .field_mask = KVF_XFER_PLAN_PARAM_FIELD_FLAGS, .cfg = &w->cfg, .layout = &w->layout,
        .local_tp = w->D, .local_rank = dr, .local_geom = &w->dg[dr],
        .local_num_blocks = nb * G,
        .remote_tp = w->P, .remote_geoms = w->pg, .remote_num_blocks = remote_nb,
        .num_groups = G, .groups = g, .num_tokens = n,
        .flags = window ? KVF_XFER_PLAN_FLAG_WINDOW : 0,
    };
    kvf_device_t cpu = kvf_device_cpu();
    kvf_gather_table_desc_t d = {.dst_page = w->dg[dr].page_size,
                                 .dst_blocks = (uint32_t)(nb * G),
                                 .slots = (uint32_t)w->layout.slots, .num_src = (uint32_t)w->P,
                                 .num_tmpls = KVF_XFER_TMPL_COUNT};
    kvf_gather_job_t *jobs = calloc((size_t)(nb * G) + 1, sizeof(*jobs));
    kvf_xfer_pieces_t *pc = NULL;
    kvf_gather_table_t *t = NULL;
    kvf_xfer_tmpls_t tm;
    uint64_t bytes, zero;
    uint8_t *got = malloc(dlen);
    size_t nj = 0;
    char why[160];

    assert_non_null(jobs);
    assert_non_null(got);
    memset(got, 0xff, dlen);
    assert_int_equal(kvf_xfer_pieces_create(&p, &pc), KVF_OK);
    p.field_mask |= KVF_XFER_PLAN_PARAM_FIELD_PIECES;
    p.pieces = pc;
    assert_int_equal(kvf_xfer_tmpls_build(pc, &tm, why, sizeof(why)), KVF_OK);
    d.dst_base = (uint64_t)(uintptr_t)got;
    for (int r = 0; r < w->P; ++r) {
        d.src_base[r] = (uint64_t)(uintptr_t)pre[r];
        d.src_page[r] = w->pg[r].page_size;
        d.src_blocks[r] = (uint32_t)(nb * G);
    }
    d.pieces = tm.pieces;
    d.num_pieces = tm.num_pieces;
    d.tmpls = tm.tmpls;
    assert_int_equal(kvf_gather_table_create(&cpu, &d, &t), KVF_KERN_OK);
    /* every group slides in all its layers or in none: the templates take every pull */
    assert_int_equal(kvf_xfer_tmpl_jobs(&p, jobs, &nj, &bytes, &zero), KVF_OK);
    assert_int_equal(kvf_gather_tmpl_run(&cpu, t, jobs, NULL, nj), KVF_KERN_OK);
    assert_memory_equal(got, want, dlen);
    kvf_gather_table_destroy(&cpu, t);
    kvf_xfer_tmpls_free(&tm);
    kvf_xfer_pieces_destroy(pc);
    free(got);
    free(jobs);
}

static kvf_xfer_plan_t *plan(const world_t *w, int dr, int64_t n, int32_t *ids, int nb,
                             bool window)
{
    return plan_skip(w, dr, n, ids, nb, nb, window, 0);
}

/* Decode steps at positions n .. n + STEPS - 1 on one decode rank's region @a base: the
 * same random q / k / v rows (seeded) written and attended in every layer slot of every
 * group (group_ids()), outputs in (group, slot) order. */
static void decode(const world_t *w, int dr, void *base, int32_t *ids, int nb, int region_nb,
                   int64_t n, float *out)
{
    const kvf_rank_geometry_t *g = &w->dg[dr];
    const int hd = w->cfg.head_dim, kvh = g->shard.kv_heads, qh = g->shard.attn_heads;
    const int ld = (qh + 2 * kvh) * hd;
    float *row = malloc((size_t)ld * sizeof(float));
    uint64_t s = 0x5eed + (uint64_t)n;

    int32_t gids[MAX_G * 512];
    kvf_xfer_group_blocks_t gb[MAX_G];
    assert_non_null(row);
    assert_true(w->layout.num_groups * nb <= MAX_G * 512);
    group_ids(w, ids, nb, region_nb, gids, gb);
    for (int gj = 0; gj < w->layout.num_groups * w->layout.slots; ++gj) {
        const kvf_kv_group_t *grp = &w->layout.groups[gj / w->layout.slots];
        const int j = gj % w->layout.slots;
        if (j >= grp->num_layers) {
            continue;
        }
        kvf_paged_kv_t kv = {
            .base = base, .page_size = g->page_size, .slots = w->layout.slots, .slot = j,
            .dtype = KVF_DTYPE_FP32, .kv_heads = kvh, .head_dim = hd,
            .block_size = g->block_size, .kernel_block_size = g->kernel_block_size,
            .block_table = gids + (gj / w->layout.slots) * nb, .num_blocks = nb,
            .window = w->cfg.layer_window[grp->layers[j]],
        };
        for (int t = 0; t < STEPS; ++t) {
            const int32_t pos = (int32_t)(n + t);
            for (int i = 0; i < ld; ++i) {
                row[i] = rng_float(&s);
            }
            assert_int_equal(kvf_attn_cache_write(NULL, &kv, row + qh * hd,
                                                  row + (qh + kvh) * hd, ld, &pos, 1),
                             KVF_KERN_OK);
            assert_int_equal(kvf_attn_paged(NULL, &kv, row, ld, &pos, 1, qh, 0.0f,
                                            out + ((size_t)gj * STEPS + t) * qh * hd),
                             KVF_KERN_OK);
        }
    }
    free(row);
}

/* One prompt length: both pulls of every decode rank, bytes and attention compared. Returns
 * the windowed plan's attention bytes of decode rank 0. */
static size_t g_descs[2];   /* decode rank 0's last plans: descriptors windowed, whole */

static uint64_t run_len(const world_t *w, int64_t n, uint64_t *full_p)
{
    const int nb = (int)((n + STEPS + BS - 1) / BS);
    const int slots = w->layout.slots * w->layout.num_groups;   /* pages per group block */
    int32_t *ids = malloc((size_t)nb * sizeof(int32_t));
    void *pre[MAX_TP];
    size_t plen[MAX_TP];
    uint64_t s = 0xabc + (uint64_t)n, wbytes = 0;

    assert_non_null(ids);
    for (int b = 0; b < nb; ++b) {
        ids[b] = nb - 1 - b;   /* not the identity */
    }
    for (int r = 0; r < w->P; ++r) {   /* prefill regions: finite random K/V everywhere */
        plen[r] = (size_t)nb * (size_t)slots * w->pg[r].page_size;
        pre[r] = malloc(plen[r]);
        assert_non_null(pre[r]);
        for (size_t i = 0; i < plen[r] / sizeof(float); ++i) {
            ((float *)pre[r])[i] = rng_float(&s);
        }
    }
    for (int dr = 0; dr < w->D; ++dr) {
        const kvf_rank_geometry_t *g = &w->dg[dr];
        const size_t dlen = (size_t)nb * (size_t)slots * g->page_size;
        const size_t nout = (size_t)slots * STEPS * (size_t)g->shard.attn_heads *
                            (size_t)w->cfg.head_dim;
        kvf_xfer_plan_t *pf = plan(w, dr, n, ids, nb, false);
        kvf_xfer_plan_t *pw = plan(w, dr, n, ids, nb, true);
        uint8_t *a = malloc(dlen), *b = malloc(dlen);
        float *oa = malloc(nout * sizeof(float)), *ob = malloc(nout * sizeof(float));
        const void *bases[MAX_TP] = {pre[0], (w->P > 1) ? pre[1] : NULL};

        assert_non_null(a);
        assert_non_null(b);
        assert_non_null(oa);
        assert_non_null(ob);
        memset(a, 0xff, dlen);   /* NaN in every float */
        memset(b, 0xff, dlen);
        assert_int_equal(kvf_xfer_plan_apply_local(pf, a, dlen, bases, plen), KVF_OK);
        assert_int_equal(kvf_xfer_plan_apply_local(pw, b, dlen, bases, plen), KVF_OK);
        tmpl_equals(w, dr, n, ids, nb, false, pre, a, dlen);
        tmpl_equals(w, dr, n, ids, nb, true, pre, b, dlen);
        decode(w, dr, a, ids, nb, nb, n, oa);
        decode(w, dr, b, ids, nb, nb, n, ob);
        for (size_t i = 0; i < nout; ++i) {
            assert_false(isnan(oa[i]));
        }
        assert_memory_equal(oa, ob, nout * sizeof(float));
        assert_true(pw->attn_bytes <= pf->attn_bytes);
        if (dr == 0) {
            wbytes = pw->attn_bytes;
            *full_p = pf->attn_bytes;
            g_descs[0] = pw->total_descs;
            g_descs[1] = pf->total_descs;
        }
        free(ob);
        free(oa);
        free(b);
        free(a);
        kvf_xfer_plan_destroy(pw);
        kvf_xfer_plan_destroy(pf);
    }
    for (int r = 0; r < w->P; ++r) {
        free(pre[r]);
    }
    free(ids);
    return wbytes;
}

/* The attention bytes a windowed pull of @a n tokens reads on decode rank 0: the full layers'
 * whole prompt, the sliding layers' tokens from the window's first block on. */
static uint64_t window_bytes(const world_t *w, int64_t n)
{
    const uint64_t tok = 2u * (uint64_t)w->dg[0].shard.kv_heads * (uint64_t)w->cfg.head_dim * 4u;
    const int64_t first = (n > W) ? (n - W) / BS * BS : 0;
    uint64_t bytes = 0;

    for (int l = 0; l < w->cfg.num_layers; ++l) {
        const bool slides = w->cfg.layer_window[l] > 0;
        bytes += (uint64_t)(slides ? n - first : n) * tok;
    }
    return bytes;
}

static void check_bounded(const char *json, const char *name)
{
    static const int layouts[][2] = {{1, 1}, {2, 1}, {1, 2}};
    static const int64_t lens[] = {50, 200, 1001, 5000};

    for (size_t li = 0; li < sizeof(layouts) / sizeof(layouts[0]); ++li) {
        world_t w;
        int sliding = 0;
        world_init(&w, json, layouts[li][0], layouts[li][1]);
        for (int g = 0; g < w.layout.num_groups; ++g) {   /* a group slides in all or none */
            const kvf_kv_group_t *grp = &w.layout.groups[g];
            for (int j = 0; j < grp->num_layers; ++j) {
                assert_int_equal(w.cfg.layer_window[grp->layers[j]] > 0,
                                 grp->kind == KVF_GROUP_SLIDING);
            }
        }
        assert_int_equal(w.layout.num_groups > 1, mixes(&w.cfg));
        for (int l = 0; l < w.cfg.num_layers; ++l) {
            sliding += w.cfg.layer_window[l] > 0;
        }
        /* a whole block of one decode rank's sliding layers: their K and V */
        const uint64_t block = (uint64_t)sliding * (uint64_t)BS * 2u *
                               (uint64_t)w.dg[0].shard.kv_heads * (uint64_t)w.cfg.head_dim * 4u;
        const uint64_t bound = (uint64_t)((W + BS - 1) / BS + 1) * block;
        const int full_layers = w.cfg.num_attention_layers - sliding;
        uint64_t last_full = 0;
        for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); ++i) {
            uint64_t full = 0;
            const uint64_t win = run_len(&w, lens[i], &full);
            /* the full layers' share of the whole pull, read whatever the window */
            const uint64_t full_part = full / (uint64_t)w.cfg.num_attention_layers *
                                       (uint64_t)full_layers;
            print_message("%s %dp%dd N %5lld: window pull %7llu bytes (full layers %llu,"
                          " sliding %llu; bound %llu), whole pull %8llu bytes; descriptors"
                          " %zu (whole %zu)\n", name,
                          layouts[li][0], layouts[li][1], (long long)lens[i],
                          (unsigned long long)win, (unsigned long long)full_part,
                          (unsigned long long)(win - full_part), (unsigned long long)bound,
                          (unsigned long long)full, g_descs[0], g_descs[1]);
            assert_int_equal(win, window_bytes(&w, lens[i]));
            assert_true(win - full_part <= bound);
            assert_true(full > last_full);   /* the whole pull grows with the prompt */
            if (lens[i] > 1000) {
                assert_true(win < full);
            }
            last_full = full;
        }
    }
}

static void test_window_bounded(void **state)
{
    (void)state;
    check_bounded(mistral_json, "mistral");
}

/* qwen3 [full, sliding] and [sliding, full, sliding]: the sliding slots bounded by the window,
 * the full slots whole, attention bit for bit the whole pull's. */
static void test_mixed_group_bounded(void **state)
{
    (void)state;
    check_bounded(qwen3_json, "qwen3 [F,S]");
    check_bounded(qwen3_sfs_json, "qwen3 [S,F,S]");
}

/*
 * Why decode's prefix cache must not index a windowed pull's blocks (the guard:
 * kvf_xfer_window_first_block() > 0, handed to kvf_engine_import_zeroed()): request A (N1 =
 * 600 tokens) is pulled with the window, then request B, A's first 300 tokens, is served A's
 * blocks as a prefix hit (the guard off) and pulls only the rest. B's sliding layers attend
 * inside its own window, which lies in A's zeroed blocks: its decode output differs from a
 * whole pull of B. With the guard on, B has no hit and pulls whole: the reference answer.
 */
static void test_zeroed_blocks_not_a_prefix(void **state)
{
    const char *const models[] = {mistral_json, qwen3_sfs_json};
    const int64_t n1 = 600, n2 = 300, hit = n2 / BS * BS;
    const int nb = (int)((n1 + STEPS + BS - 1) / BS), nb2 = (int)((n2 + STEPS + BS - 1) / BS);
    (void)state;

    for (size_t m = 0; m < sizeof(models) / sizeof(models[0]); ++m) {
        world_t w;
        int32_t ids[64];
        uint64_t s = 0x77;
        world_init(&w, models[m], 1, 1);
        assert_true(kvf_xfer_window_first_block(&w.cfg, &w.layout, n1, BS) > 0);   /* guarded */
        const int pages = w.layout.slots * w.layout.num_groups;   /* a block in every group */
        const size_t len = (size_t)nb * (size_t)pages * w.pg[0].page_size;
        const size_t nout = (size_t)pages * STEPS * (size_t)w.dg[0].shard.attn_heads *
                            (size_t)w.cfg.head_dim;
        uint8_t *pre = malloc(len), *a = malloc(len), *b = malloc(len);
        float *oa = malloc(nout * sizeof(float)), *ob = malloc(nout * sizeof(float));
        const void *bases[MAX_TP] = {NULL, NULL};
        size_t plen[MAX_TP] = {len, len};
        assert_non_null(pre);
        assert_non_null(a);
        assert_non_null(b);
        assert_non_null(oa);
        assert_non_null(ob);
        for (int i = 0; i < nb; ++i) {
            ids[i] = nb - 1 - i;
        }
        for (size_t i = 0; i < len / sizeof(float); ++i) {
            ((float *)pre)[i] = rng_float(&s);
        }
        bases[0] = pre;
        memset(a, 0xff, len);
        memset(b, 0xff, len);
        kvf_xfer_plan_t *pa = plan_skip(&w, 0, n1, ids, nb, nb, true, 0);     /* A, windowed */
        kvf_xfer_plan_t *pb = plan_skip(&w, 0, n2, ids, nb2, nb, true, hit);  /* B on A's hit */
        kvf_xfer_plan_t *pr = plan_skip(&w, 0, n2, ids, nb2, nb, true, 0);    /* B, no hit */
        assert_int_equal(kvf_xfer_plan_apply_local(pa, a, len, bases, plen), KVF_OK);
        assert_int_equal(kvf_xfer_plan_apply_local(pb, a, len, bases, plen), KVF_OK);
        assert_int_equal(kvf_xfer_plan_apply_local(pr, b, len, bases, plen), KVF_OK);
        decode(&w, 0, a, ids, nb2, nb, n2, oa);
        decode(&w, 0, b, ids, nb2, nb, n2, ob);
        assert_true(memcmp(oa, ob, nout * sizeof(float)) != 0);   /* guard off: wrong */
        /* the full groups were read whole: only the sliding layers' outputs differ */
        for (int gj = 0; gj < pages; ++gj) {
            const size_t per = nout / (size_t)pages;
            const kvf_kv_group_t *grp = &w.layout.groups[gj / w.layout.slots];
            if (gj % w.layout.slots >= grp->num_layers) {
                continue;
            }
            const bool slides = w.cfg.layer_window[grp->layers[gj % w.layout.slots]] > 0;
            assert_int_equal(slides, grp->kind == KVF_GROUP_SLIDING);
            assert_int_equal(memcmp(oa + (size_t)gj * per, ob + (size_t)gj * per,
                                    per * sizeof(float)) != 0, slides);
        }
        kvf_xfer_plan_destroy(pr);
        kvf_xfer_plan_destroy(pb);
        kvf_xfer_plan_destroy(pa);
        free(ob);
        free(oa);
        free(b);
        free(a);
        free(pre);
    }
}

/*
 * kvf_xfer_window_first_block(), what decode tells its engine not to index: the first block
 * the window reads in every slot, floor(max(0, N - W) / block), for mistral and for qwen3
 * mixing full and sliding layers alike.
 */
static void test_window_first_block(void **state)
{
    static const int64_t ns[] = {1, 40, 55, 56, 57, 200, 601, 5000};
    world_t m, q;
    (void)state;

    world_init(&m, mistral_json, 1, 1);
    world_init(&q, qwen3_json, 1, 1);
    for (size_t i = 0; i < sizeof(ns) / sizeof(ns[0]); ++i) {
        const int64_t n = ns[i];
        const int64_t want = (n > W) ? (n - W) / BS : 0;
        assert_int_equal(kvf_xfer_window_first_block(&m.cfg, &m.layout, n, BS), want);
        assert_int_equal(kvf_xfer_window_first_block(&m.cfg, &m.layout, n, 2 * BS),
                         (n > W) ? (n - W) / (2 * BS) : 0);
        assert_int_equal(kvf_xfer_window_first_block(&q.cfg, &q.layout, n, BS), want);
    }
    assert_int_equal(kvf_xfer_window_first_block(&m.cfg, &m.layout, 601, BS), 35);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_window_bounded),
        cmocka_unit_test(test_mixed_group_bounded),
        cmocka_unit_test(test_zeroed_blocks_not_a_prefix),
        cmocka_unit_test(test_window_first_block),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
