/*
 * Transfer planner: refusals (bad ids, short block lists, mismatched or
 * tampered geometries, TPs that do not divide), descriptor counts worked out
 * by hand for layouts where coalescing must collapse runs, kvf_xfer_plan_apply_local()
 * bounds, and planning figures on real models' geometry.
 */
#include "xfer_plan_harness.h"

#include "kvf_log.h"

#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

/* ---- stderr capture, to check that refusals name the field and values ---- */

static int  cap_saved = -1;
static FILE *cap_file;

static void capture_begin(void)
{
    fflush(stderr);
    cap_file = tmpfile();
    assert_non_null(cap_file);
    cap_saved = dup(STDERR_FILENO);
    assert_true(cap_saved >= 0);
    assert_true(dup2(fileno(cap_file), STDERR_FILENO) >= 0);
}

/* Returns the captured text (static buffer). */
static const char *capture_end(void)
{
    static char buf[8192];
    size_t n;
    fflush(stderr);
    assert_true(dup2(cap_saved, STDERR_FILENO) >= 0);
    close(cap_saved);
    rewind(cap_file);
    n = fread(buf, 1, sizeof(buf) - 1, cap_file);
    buf[n] = '\0';
    fclose(cap_file);
    return buf;
}

/* ---- a small world: model, layout, geometries, ids ---- */

typedef struct world {
    kvf_model_config_t      cfg;
    kvf_cache_layout_t      layout;
    kvf_rank_geometry_t     pg[8], dg[8];
    int64_t                 remote_nb[8];
    int32_t                 lids[KVF_MAX_KV_GROUPS][16], rids[KVF_MAX_KV_GROUPS][16];
    kvf_xfer_group_blocks_t groups[KVF_MAX_KV_GROUPS];
    kvf_xfer_plan_params_t  params;
} world_t;

static void geom_params(const kvf_model_config_t *cfg, kvf_dtype_t kv, int block, int kernel,
                        kvf_cache_params_t *p)
{
    kvf_cache_params_default(cfg, p);
    p->kv_dtype = kv;
    p->conv_dtype = KVF_DTYPE_FP32;   /* docs/ARCHITECTURE.md tiny hybrid: fp32 conv and SSM state */
    p->ssm_dtype = KVF_DTYPE_FP32;
    p->block_size = block;
    if (kernel > 0) {
        memset(&p->kernel_sizes, 0, sizeof(p->kernel_sizes));
        p->kernel_sizes.num_exact = 1;
        p->kernel_sizes.exact[0] = kernel;
    }
}

/*
 * P-prefill, D-decode world for decode rank d_rank; block sizes as given (0 = derive).
 * Ids: group g's local block i is 16*g + i + lofs, remote 16*g + i + rofs (consecutive).
 */
static world_t *world_make(const char *json, int P, int D, int d_rank, int block, int kernel,
                           int64_t num_tokens, int lofs, int rofs)
{
    world_t *w = calloc(1, sizeof(*w));
    kvf_cache_params_t p;

    assert_non_null(w);
    assert_int_equal(kvf_model_config_parse(json, "test", &w->cfg), KVF_OK);
    assert_int_equal(kvf_cache_layout_build(&w->cfg, &w->layout), KVF_OK);
    geom_params(&w->cfg, KVF_DTYPE_BF16, block, kernel, &p);
    for (int r = 0; r < P; ++r) {
        assert_int_equal(kvf_rank_geometry_compute(&w->cfg, &p, P, r, &w->pg[r]), KVF_OK);
        w->remote_nb[r] = 16 * w->layout.num_groups + 2;
    }
    for (int r = 0; r < D; ++r) {
        assert_int_equal(kvf_rank_geometry_compute(&w->cfg, &p, D, r, &w->dg[r]), KVF_OK);
    }
    for (int g = 0; g < w->layout.num_groups; ++g) {
        bool attn = kvf_group_is_attention(w->layout.groups[g].kind);
        int n = attn ? (int)((num_tokens + w->dg[0].block_size - 1) / w->dg[0].block_size) : 1;
        for (int i = 0; i < 16; ++i) {
            w->lids[g][i] = 16 * g + i + lofs;
            w->rids[g][i] = 16 * g + i + rofs;
        }
        w->groups[g] = (kvf_xfer_group_blocks_t){.local_ids = w->lids[g], .num_local = n,
                                                 .remote_ids = w->rids[g], .num_remote = n};
    }
    w->params = (kvf_xfer_plan_params_t){
        .cfg = &w->cfg, .layout = &w->layout,
        .local_tp = D, .local_rank = d_rank, .local_geom = &w->dg[d_rank],
        .local_num_blocks = 16 * w->layout.num_groups + 2,
        .remote_tp = P, .remote_geoms = w->pg, .remote_num_blocks = w->remote_nb,
        .num_groups = w->layout.num_groups, .groups = w->groups, .num_tokens = num_tokens,
    };
    return w;
}

/* Expect @a want, no plan, and (when @a needle is set) a logged line containing it. */
static void expect_refused(const kvf_xfer_plan_params_t *params, kvf_status_t want,
                           const char *needle)
{
    kvf_xfer_plan_t *plan = (kvf_xfer_plan_t *)(uintptr_t)0x1;   /* must stay untouched */
    kvf_status_t status;
    const char *log;

    capture_begin();
    status = kvf_xfer_plan_create(params, &plan);
    log = capture_end();
    if (status != want) {
        fail_msg("status %d (%s), want %d; log: %s", status, kvf_status_str(status), want, log);
    }
    assert_ptr_equal(plan, (kvf_xfer_plan_t *)(uintptr_t)0x1);
    if ((needle != NULL) && (strstr(log, needle) == NULL)) {
        fail_msg("log does not mention '%s': %s", needle, log);
    }
}

static void expect_ok(const kvf_xfer_plan_params_t *params)
{
    kvf_xfer_plan_t *plan = NULL;
    assert_int_equal(kvf_xfer_plan_create(params, &plan), KVF_OK);
    kvf_xfer_plan_destroy(plan);
}

/* ---- refusals ---- */

static void test_refuse_block_ids(void **state)
{
    /* tiny hybrid 2p2d, block 80, 100 tokens: attention group needs 2 ids, Mamba groups 1 */
    world_t *w = world_make(xp_tiny_hybrid_json, 2, 2, 1, 0, 0, 100, 0, 0);
    int attn = -1, mamba = -1;
    int32_t saved;
    (void)state;

    for (int g = 0; g < w->layout.num_groups; ++g) {
        if (kvf_group_is_attention(w->layout.groups[g].kind)) {
            attn = g;
        } else if (mamba < 0) {
            mamba = g;
        }
    }
    assert_true((attn >= 0) && (mamba >= 0));
    assert_int_equal(w->groups[attn].num_local, 2);
    expect_ok(&w->params);

    saved = w->lids[attn][1];
    w->lids[attn][1] = (int32_t)w->params.local_num_blocks;      /* one past the end */
    expect_refused(&w->params, KVF_ERR_OUT_OF_RANGE, "local block id 50 (index 1) is outside [0, 50)");
    w->lids[attn][1] = -1;
    expect_refused(&w->params, KVF_ERR_OUT_OF_RANGE, "local block id -1");
    w->lids[attn][1] = saved;

    saved = w->rids[mamba][0];
    w->rids[mamba][0] = 1000000;
    expect_refused(&w->params, KVF_ERR_OUT_OF_RANGE, "remote block id 1000000 (index 0) is outside");
    w->rids[mamba][0] = saved;

    /* a prefill pool smaller than the ids it sent */
    w->remote_nb[1] = 20;
    expect_refused(&w->params, KVF_ERR_OUT_OF_RANGE, "remote block id");
    w->remote_nb[1] = w->remote_nb[0];
    expect_ok(&w->params);

    /* short lists: 100 tokens need 2 blocks of 80 on each side, and 1 Mamba block */
    w->groups[attn].num_local = 1;
    expect_refused(&w->params, KVF_ERR_OUT_OF_RANGE, "has 1 local block ids, 2 needed");
    w->groups[attn].num_local = 2;
    w->groups[attn].num_remote = 1;
    expect_refused(&w->params, KVF_ERR_OUT_OF_RANGE, "has 1 remote block ids, 2 needed");
    w->groups[attn].num_remote = 2;
    w->groups[mamba].num_local = 0;
    expect_refused(&w->params, KVF_ERR_OUT_OF_RANGE, "has 0 local block ids, 1 needed");
    w->groups[mamba].num_local = 1;
    w->params.num_tokens = 161;                                  /* needs 3 blocks */
    expect_refused(&w->params, KVF_ERR_OUT_OF_RANGE, "3 needed");
    w->params.num_tokens = 0;
    expect_refused(&w->params, KVF_ERR_INVALID_PARAM, "num_tokens 0");
    w->params.num_tokens = 100;

    /* one local block listed twice (here by two groups) */
    saved = w->lids[mamba][0];
    w->lids[mamba][0] = w->lids[attn][0];
    expect_refused(&w->params, KVF_ERR_INVALID_PARAM, "appears twice");
    w->lids[mamba][0] = saved;

    /* pool sizes */
    w->params.local_num_blocks = 0;
    expect_refused(&w->params, KVF_ERR_INVALID_PARAM, "num_blocks 0");
    w->params.local_num_blocks = INT64_MAX / 2;                   /* region size overflows */
    expect_refused(&w->params, KVF_ERR_INVALID_PARAM, "not a valid region size");
    w->params.local_num_blocks = 16 * w->layout.num_groups + 2;
    expect_ok(&w->params);
    free(w);
}

static void test_refuse_geometry(void **state)
{
    world_t *w = world_make(xp_tiny_hybrid_json, 4, 2, 0, 0, 0, 100, 0, 0);
    kvf_rank_geometry_t saved = w->pg[1];
    kvf_model_config_t other;
    kvf_cache_params_t p;
    (void)state;

    expect_ok(&w->params);

    /* dtype mismatch, each cache */
    w->pg[1].kv_dtype = KVF_DTYPE_FP32;   /* sizes no longer follow from the dtype */
    expect_refused(&w->params, KVF_ERR_INVALID_PARAM, "head_run_bytes");
    w->pg[1] = saved;
    /* an unknown KV layout, and strides that do not follow from the one named */
    w->pg[1].kv_layout = (kvf_kv_layout_t)7;
    expect_refused(&w->params, KVF_ERR_INVALID_PARAM, "kv_layout 7 is not a KV cache layout");
    w->pg[1] = saved;
    w->pg[1].kv_layout = KVF_KV_HEAD_MAJOR;   /* layer-major strides under a head-major name */
    expect_refused(&w->params, KVF_ERR_INVALID_PARAM, "head-major strides");
    w->pg[1] = saved;
    w->pg[1].attn.head += 64;
    expect_refused(&w->params, KVF_ERR_INVALID_PARAM, "do not follow from the model");
    w->pg[1] = saved;
    geom_params(&w->cfg, KVF_DTYPE_FP32, 0, 0, &p);
    for (int r = 0; r < 4; ++r) {   /* a consistent fp32 prefill is still refused */
        assert_int_equal(kvf_rank_geometry_compute(&w->cfg, &p, 4, r, &w->pg[r]), KVF_OK);
    }
    expect_refused(&w->params, KVF_ERR_INVALID_PARAM, "kv_dtype prefill=fp32 decode=bf16");
    geom_params(&w->cfg, KVF_DTYPE_BF16, 0, 0, &p);
    p.ssm_dtype = KVF_DTYPE_BF16;
    for (int r = 0; r < 4; ++r) {
        assert_int_equal(kvf_rank_geometry_compute(&w->cfg, &p, 4, r, &w->pg[r]), KVF_OK);
    }
    expect_refused(&w->params, KVF_ERR_INVALID_PARAM, "ssm_dtype prefill=bf16 decode=fp32");
    geom_params(&w->cfg, KVF_DTYPE_BF16, 0, 0, &p);
    for (int r = 0; r < 4; ++r) {
        assert_int_equal(kvf_rank_geometry_compute(&w->cfg, &p, 4, r, &w->pg[r]), KVF_OK);
    }
    expect_ok(&w->params);

    /* head_dim mismatch: prefill geometry of a model with head_dim 64 */
    other = w->cfg;
    other.head_dim = 64;
    geom_params(&other, KVF_DTYPE_BF16, 160, 0, &p);
    assert_int_equal(kvf_rank_geometry_compute(&other, &p, 4, 1, &w->pg[1]), KVF_OK);
    expect_refused(&w->params, KVF_ERR_INVALID_PARAM, "head_dim 32");
    w->pg[1] = saved;

    /* a peer claiming a bigger page than its block size and heads give */
    w->pg[1].page_size *= 2;
    expect_refused(&w->params, KVF_ERR_INVALID_PARAM, "page_size");
    w->pg[1] = saved;
    w->pg[1].kernel_block_size = 48;   /* 80 is not a multiple of 48 */
    expect_refused(&w->params, KVF_ERR_INVALID_PARAM, "kernel_block_size 48");
    w->pg[1] = saved;
    w->pg[1].shard.kv_head_start = 1;
    expect_refused(&w->params, KVF_ERR_INVALID_PARAM, "does not follow from the model");
    w->pg[1] = saved;
    w->pg[1].mamba_bytes += 4;
    expect_refused(&w->params, KVF_ERR_INVALID_PARAM, "Mamba sizes");
    w->pg[1] = saved;
    /* prefill ranks that disagree on the logical block size */
    geom_params(&w->cfg, KVF_DTYPE_BF16, 160, 0, &p);
    assert_int_equal(kvf_rank_geometry_compute(&w->cfg, &p, 4, 1, &w->pg[1]), KVF_OK);
    expect_refused(&w->params, KVF_ERR_INVALID_PARAM, "disagree on block_size");
    w->pg[1] = saved;
    expect_ok(&w->params);

    /* decode rank 0 of 4p2d reads prefill ranks 0 and 1 only: rank 3's entries are ignored */
    memset(&w->pg[3], 0, sizeof(w->pg[3]));
    w->remote_nb[3] = 0;
    expect_ok(&w->params);
    free(w);
}

static void test_refuse_params(void **state)
{
    static const char *const dense12 =
        "{\"model_type\":\"llama\",\"hidden_size\":192,\"vocab_size\":260,"
        "\"num_hidden_layers\":2,\"num_attention_heads\":12,\"num_key_value_heads\":6,"
        "\"head_dim\":16,\"intermediate_size\":384,\"rms_norm_eps\":1e-5}";
    world_t *w = world_make(xp_dense_kv4_json, 1, 2, 1, 16, 0, 40, 0, 0);
    world_t *w3;
    kvf_xfer_plan_params_t p;
    kvf_xfer_plan_t *plan = NULL;
    (void)state;

    expect_ok(&w->params);
    expect_refused(NULL, KVF_ERR_INVALID_PARAM, "params is NULL");
    p = w->params;
    p.field_mask = KVF_BIT(7);
    expect_refused(&p, KVF_ERR_INVALID_PARAM, "unknown params field_mask bits 0x80");
    p = w->params;
    p.groups = NULL;
    expect_refused(&p, KVF_ERR_INVALID_PARAM, "must be set");
    p = w->params;
    p.num_groups = 2;
    expect_refused(&p, KVF_ERR_INVALID_PARAM, "num_groups 2 does not match");
    p = w->params;
    p.local_rank = 2;
    expect_refused(&p, KVF_ERR_INVALID_PARAM, "local_rank 2 is outside [0, 2)");
    p = w->params;
    p.local_tp = 4;      /* decode geometry was computed for TP2 */
    expect_refused(&p, KVF_ERR_INVALID_PARAM, "does not follow from the model");
    capture_begin();
    assert_int_equal(kvf_xfer_plan_create(&w->params, NULL), KVF_ERR_INVALID_PARAM);
    assert_non_null(strstr(capture_end(), "plan_p is NULL"));

    /* TPs that do not divide each other: prefill 2, decode 3 of a 12-head model */
    w3 = world_make(dense12, 2, 3, 0, 16, 0, 40, 0, 0);
    expect_refused(&w3->params, KVF_ERR_INVALID_PARAM,
                   "tp_size prefill 2 decode 3: neither divides the other");
    w3->params.remote_tp = 3;       /* 3p3d of the same model is fine */
    {
        kvf_cache_params_t cp;
        geom_params(&w3->cfg, KVF_DTYPE_BF16, 16, 0, &cp);
        for (int r = 0; r < 3; ++r) {
            assert_int_equal(kvf_rank_geometry_compute(&w3->cfg, &cp, 3, r, &w3->pg[r]), KVF_OK);
            w3->remote_nb[r] = w3->remote_nb[0];
        }
    }
    assert_int_equal(kvf_xfer_plan_create(&w3->params, &plan), KVF_OK);
    assert_int_equal(plan->num_ranks, 1);
    assert_int_equal(plan->ranks[0].remote_rank, 0);
    kvf_xfer_plan_destroy(plan);
    kvf_xfer_plan_destroy(NULL);
    free(w3);
    free(w);
}

/*
 * A hostile or broken peer: random damage to the prefill geometries, ids, pool
 * sizes and token count. The planner must refuse or return a plan whose every
 * descriptor lies inside both regions as the caller described them.
 */
static uint64_t rnd_state = 12345;

static uint64_t rnd(void)
{
    uint64_t x = (rnd_state += 0x9e3779b97f4a7c15ull);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static int rnd_int(void)
{
    static const int picks[] = {0, 1, -1, 2, 16, 48, 80, 160, 4096, 65536, INT32_MAX, INT32_MIN};
    return (rnd() % 2) ? picks[rnd() % 12] : (int)(rnd() % 400) - 8;
}

static void test_refuse_hostile_random(void **state)
{
    unsigned long ok = 0, refused = 0;
    (void)state;

    capture_begin();   /* thousands of refusal lines */
    for (int it = 0; it < 3000; ++it) {
        const char *json = (it % 2) ? xp_tiny_hybrid_json : xp_dense_kv2_json;
        int P = (it % 3 == 0) ? 4 : 2, D = (it % 5 == 0) ? 4 : 2;
        world_t *w = world_make(json, P, D, it % D, 0, 0, 1 + (int64_t)(rnd() % 200), 0, 0);
        int damage = 1 + (int)(rnd() % 3);
        kvf_xfer_plan_t *plan = NULL;
        kvf_status_t status;

        for (int k = 0; k < damage; ++k) {
            kvf_rank_geometry_t *g = &w->pg[rnd() % (uint64_t)P];
            int g_i = (int)(rnd() % (uint64_t)w->layout.num_groups);
            switch (rnd() % 14) {
            case 0: g->block_size = rnd_int(); break;
            case 1: g->kernel_block_size = rnd_int(); break;
            case 2: g->ppl = rnd_int(); break;
            case 3: g->page_size = (size_t)rnd_int(); break;
            case 4: g->kernel_block_bytes = (size_t)rnd_int(); break;
            case 5: g->shard.kv_heads = rnd_int(); break;
            case 6: g->shard.kv_head_start = rnd_int(); break;
            case 7: g->shard.mamba_head_start = rnd_int(); break;
            case 8: w->rids[g_i][rnd() % 16] = (int32_t)rnd(); break;
            case 9: w->groups[g_i].num_remote = rnd_int() % 17; break;
            case 10: w->remote_nb[rnd() % (uint64_t)P] = (int64_t)rnd_int(); break;
            case 11: g->attn.slot = (size_t)rnd_int(); break;
            case 12: g->kv_layout = (kvf_kv_layout_t)rnd_int(); break;
            default: w->params.num_tokens = (int64_t)rnd_int(); break;
            }
        }
        status = kvf_xfer_plan_create(&w->params, &plan);
        if (status != KVF_OK) {
            assert_true(status < 0);
            ++refused;
            free(w);
            continue;
        }
        ++ok;
        for (int i = 0; i < plan->num_ranks; ++i) {
            int r = plan->ranks[i].remote_rank;
            uint64_t rlen = (uint64_t)w->remote_nb[r] * (uint64_t)w->layout.slots *
                            w->pg[r].page_size;
            uint64_t llen = (uint64_t)w->params.local_num_blocks * (uint64_t)w->layout.slots *
                            w->params.local_geom->page_size;
            for (size_t k = 0; k < plan->ranks[i].num_descs; ++k) {
                const kvf_xfer_desc_t *d = &plan->ranks[i].descs[k];
                assert_true(d->remote_off + d->len <= rlen);
                assert_true(d->local_off + d->len <= llen);
            }
        }
        kvf_xfer_plan_destroy(plan);
        free(w);
    }
    capture_end();
    print_message("hostile peer: %lu refused, %lu planned within bounds\n", refused, ok);
    assert_true(refused > 0);
}

/* ---- descriptor counts worked out by hand ---- */

static size_t count_descs(const kvf_xfer_plan_params_t *params, kvf_xfer_plan_t **plan_p)
{
    assert_int_equal(kvf_xfer_plan_create(params, plan_p), KVF_OK);
    return (*plan_p)->total_descs;
}

static void test_coalesce_counts(void **state)
{
    /*
     * Dense kv4 (4 layers -> one attention group, slots 4), bf16, head_dim 16,
     * block = kernel = 16. TP1 page = 16 tokens x 2 x 4 heads x 16 x 2 B = 4096 B;
     * a block is 4 pages (one per layer), 16384 B.
     */
    const uint64_t page = 16 * 2 * 4 * 16 * 2, block = 4 * page;
    kvf_xfer_plan_t *plan;
    world_t *w;
    (void)state;

    /* 1p1d, 4 full blocks, consecutive ids equal on both sides: one descriptor */
    w = world_make(xp_dense_kv4_json, 1, 1, 0, 16, 16, 64, 1, 1);
    assert_int_equal(count_descs(&w->params, &plan), 1);
    assert_int_equal(plan->num_ranks, 1);
    assert_int_equal(plan->ranks[0].descs[0].local_off, 1 * block);
    assert_int_equal(plan->ranks[0].descs[0].remote_off, 1 * block);
    assert_int_equal(plan->ranks[0].descs[0].len, 4 * block);
    assert_int_equal(plan->num_zero, 0);
    kvf_xfer_plan_destroy(plan);
    free(w);

    /* different offsets on the two sides still make one descriptor */
    w = world_make(xp_dense_kv4_json, 1, 1, 0, 16, 16, 64, 3, 7);
    assert_int_equal(count_descs(&w->params, &plan), 1);
    assert_int_equal(plan->ranks[0].descs[0].local_off, 3 * block);
    assert_int_equal(plan->ranks[0].descs[0].remote_off, 7 * block);
    kvf_xfer_plan_destroy(plan);
    free(w);

    /*
     * 69 tokens: the 5th block holds 5 tokens. Its first run (layer 0, K, head 0)
     * continues the 4-block run; the other 4 layers x 2 x 4 heads - 1 = 31 runs stand
     * alone: 32 descriptors. Zeroed: each (layer, K/V, head) tail of 11 tokens x 32 B.
     */
    w = world_make(xp_dense_kv4_json, 1, 1, 0, 16, 16, 69, 0, 0);
    assert_int_equal(count_descs(&w->params, &plan), 32);
    assert_int_equal(plan->ranks[0].descs[0].len, 4 * block + 5 * 32);
    assert_int_equal(plan->total_bytes, 69 * 4 * (2 * 4 * 16 * 2));
    assert_int_equal(plan->num_zero, 32);
    assert_int_equal(plan->zero_bytes, 32 * 11 * 32);
    kvf_xfer_plan_destroy(plan);
    /* the same without coalescing: one descriptor per (block, layer, K/V, head) run */
    w->params.field_mask = KVF_XFER_PLAN_PARAM_FIELD_FLAGS;
    w->params.flags = KVF_XFER_PLAN_FLAG_NO_COALESCE;
    assert_int_equal(count_descs(&w->params, &plan), 5 * 4 * 2 * 4);
    kvf_xfer_plan_destroy(plan);
    free(w);

    /* non-adjacent ids: one descriptor per block (its 4 layer pages are adjacent) */
    w = world_make(xp_dense_kv4_json, 1, 1, 0, 16, 16, 64, 0, 0);
    for (int i = 0; i < 4; ++i) {
        w->lids[0][i] = 2 * i;
        w->rids[0][i] = 2 * i + 1;
    }
    assert_int_equal(count_descs(&w->params, &plan), 4);
    kvf_xfer_plan_destroy(plan);
    free(w);

    /*
     * 2p1d: decode holds heads 0..3 in [K h0 h1 h2 h3][V h0..h3]; prefill rank 0
     * holds [K h0 h1][V h0 h1]. Per (block, layer) and prefill rank: one K run and
     * one V run (2 heads each, contiguous on both sides): 4 blocks x 4 layers x 2 = 32.
     */
    w = world_make(xp_dense_kv4_json, 2, 1, 0, 16, 16, 64, 0, 0);
    assert_int_equal(count_descs(&w->params, &plan), 64);
    assert_int_equal(plan->num_ranks, 2);
    assert_int_equal(plan->ranks[0].num_descs, 32);
    assert_int_equal(plan->ranks[1].num_descs, 32);
    assert_int_equal(plan->ranks[0].descs[0].len, 2 * 16 * 16 * 2);
    kvf_xfer_plan_destroy(plan);
    free(w);

    /*
     * Tiny hybrid 1p1d at the default 80 tokens, 160 tokens, consecutive ids:
     * the attention group (2 layers = 2 slots) is one run; each Mamba group's two
     * layers are one run too, the first page's padding read with it (equal pads on
     * both sides): 1 + 2 groups x 1 = 3 (5 without reading the pad).
     */
    w = world_make(xp_tiny_hybrid_json, 1, 1, 0, 0, 0, 160, 0, 0);
    assert_int_equal(count_descs(&w->params, &plan), 3);
    /* conv 320 channels x 3 taps x 4 B + SSM 8 x 32 x 16 x 4 B, per Mamba layer */
    assert_int_equal(plan->mamba_bytes, 4 * (320 * 3 * 4 + 8 * 32 * 16 * 4));
    assert_int_equal(plan->attn_bytes, 2 * 160 * (2 * 2 * 32 * 2));
    /* one pad per group (not after a group's last slot): page - M, page = 80 x A1 */
    assert_int_equal(plan->pad_bytes,
                     2 * (80 * (2 * 2 * 32 * 2) - (320 * 3 * 4 + 8 * 32 * 16 * 4)));
    assert_int_equal(plan->total_bytes, plan->attn_bytes + plan->mamba_bytes + plan->pad_bytes);
    kvf_xfer_plan_destroy(plan);
    /* the same without coalescing: no pad read */
    w->params.field_mask = KVF_XFER_PLAN_PARAM_FIELD_FLAGS;
    w->params.flags = KVF_XFER_PLAN_FLAG_NO_COALESCE;
    assert_int_equal(kvf_xfer_plan_create(&w->params, &plan), KVF_OK);
    assert_int_equal(plan->pad_bytes, 0);
    assert_int_equal(plan->total_bytes, plan->attn_bytes + plan->mamba_bytes);
    kvf_xfer_plan_destroy(plan);
    free(w);
}

/* ---- kvf_xfer_plan_apply_local() bounds ---- */

static void test_apply_local_bounds(void **state)
{
    world_t *w = world_make(xp_dense_kv4_json, 2, 1, 0, 16, 16, 40, 0, 0);
    kvf_xfer_plan_t *plan = NULL;
    size_t llen, rlen;
    uint8_t *local, *copy, *r0, *r1;
    const void *bases[2];
    size_t lens[2];
    (void)state;

    assert_int_equal(kvf_xfer_plan_create(&w->params, &plan), KVF_OK);
    llen = plan->local_region_bytes;
    rlen = plan->remote_region_bytes[0];
    assert_int_equal(llen, (uint64_t)w->params.local_num_blocks * 4 * w->dg[0].page_size);
    local = malloc(llen);
    copy = malloc(llen);
    r0 = malloc(rlen);
    r1 = malloc(rlen);
    assert_non_null(local);
    assert_non_null(copy);
    assert_non_null(r0);
    assert_non_null(r1);
    memset(local, 0xEE, llen);
    memset(r0, 0x11, rlen);
    memset(r1, 0x22, rlen);
    memcpy(copy, local, llen);
    bases[0] = r0;
    bases[1] = r1;
    lens[0] = lens[1] = rlen;

    /* too small a local region: refused before any byte moves */
    capture_begin();
    assert_int_equal(kvf_xfer_plan_apply_local(plan, local, llen / (size_t)w->params.local_num_blocks,
                                               bases, lens),
                     KVF_ERR_OUT_OF_RANGE);
    lens[1] = 100;
    assert_int_equal(kvf_xfer_plan_apply_local(plan, local, llen, bases, lens),
                     KVF_ERR_OUT_OF_RANGE);
    lens[1] = rlen;
    bases[1] = NULL;
    assert_int_equal(kvf_xfer_plan_apply_local(plan, local, llen, bases, lens),
                     KVF_ERR_INVALID_PARAM);
    capture_end();
    assert_memory_equal(local, copy, llen);
    bases[1] = r1;
    assert_int_equal(kvf_xfer_plan_apply_local(plan, local, llen, bases, lens), KVF_OK);
    assert_memory_not_equal(local, copy, llen);

    kvf_xfer_plan_destroy(plan);
    free(local);
    free(copy);
    free(r0);
    free(r1);
    free(w);
}

/* ---- figures on real models' geometry (printed; the planner is on the request path) ---- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void plan_real(const char *model, int P, int D, int64_t tokens, kvf_dtype_t kv)
{
    kvf_model_config_t cfg;
    kvf_cache_layout_t layout;
    kvf_cache_params_t cp;
    kvf_rank_geometry_t pg[8], dg;
    int64_t nb[8];
    int32_t *lids, *rids;
    kvf_xfer_group_blocks_t groups[KVF_MAX_KV_GROUPS];
    kvf_xfer_plan_t *plan = NULL;
    char path[1024];
    int64_t need, per = 0, pos = 0;
    double t0;

    snprintf(path, sizeof(path), "%s/tests/data/models/%s.config.json", KVF_SOURCE_DIR, model);
    assert_int_equal(kvf_model_config_load(path, &cfg), KVF_OK);
    assert_int_equal(kvf_cache_layout_build(&cfg, &layout), KVF_OK);
    kvf_cache_params_default(&cfg, &cp);
    cp.kv_dtype = kv;
    for (int r = 0; r < P; ++r) {
        assert_int_equal(kvf_rank_geometry_compute(&cfg, &cp, P, r, &pg[r]), KVF_OK);
    }
    assert_int_equal(kvf_rank_geometry_compute(&cfg, &cp, D, 0, &dg), KVF_OK);
    need = (tokens + dg.block_size - 1) / dg.block_size;
    lids = malloc((size_t)(need * layout.num_groups) * sizeof(*lids));
    rids = malloc((size_t)(need * layout.num_groups) * sizeof(*rids));
    assert_non_null(lids);
    assert_non_null(rids);
    for (int g = 0; g < layout.num_groups; ++g) {
        per = kvf_group_is_attention(layout.groups[g].kind) ? need : 1;
        for (int64_t i = 0; i < per; ++i) {   /* every other block: nothing coalesces across */
            lids[pos + i] = (int32_t)(2 * (pos + i));
            rids[pos + i] = (int32_t)(2 * (pos + i) + 1);
        }
        groups[g] = (kvf_xfer_group_blocks_t){.local_ids = lids + pos, .num_local = (int)per,
                                              .remote_ids = rids + pos, .num_remote = (int)per};
        pos += per;
    }
    for (int r = 0; r < P; ++r) {
        nb[r] = 2 * pos + 2;
    }
    kvf_xfer_plan_params_t params = {
        .cfg = &cfg, .layout = &layout, .local_tp = D, .local_rank = 0, .local_geom = &dg,
        .local_num_blocks = 2 * pos + 2, .remote_tp = P, .remote_geoms = pg,
        .remote_num_blocks = nb, .num_groups = layout.num_groups, .groups = groups,
        .num_tokens = tokens,
    };
    t0 = now_s();
    assert_int_equal(kvf_xfer_plan_create(&params, &plan), KVF_OK);
    print_message("%s %dp%dd %" PRId64 " tokens (block %d, kernel %d): %d ranks, %zu descriptors,"
                  " %.1f MiB (attention %.1f, mamba %.1f), %zu zero ranges, planned in %.2f ms\n",
                  model, P, D, tokens, dg.block_size, dg.kernel_block_size, plan->num_ranks,
                  plan->total_descs, (double)plan->total_bytes / 1048576.0,
                  (double)plan->attn_bytes / 1048576.0, (double)plan->mamba_bytes / 1048576.0,
                  plan->num_zero, 1e3 * (now_s() - t0));
    assert_true(plan->total_bytes > 0);
    kvf_xfer_plan_destroy(plan);
    free(lids);
    free(rids);
}

static void test_real_model_figures(void **state)
{
    (void)state;
    plan_real("llama-3.1-8b", 4, 2, 8000, KVF_DTYPE_BF16);
    plan_real("llama-3.1-8b", 1, 4, 8000, KVF_DTYPE_BF16);
    plan_real("llama-3.1-8b", 4, 2, 32768, KVF_DTYPE_BF16);
    plan_real("nemotron-nano-9b-v2", 4, 2, 8000, KVF_DTYPE_BF16);
    plan_real("nemotron-3-nano-30b-a3b", 2, 4, 8000, KVF_DTYPE_FP8);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refuse_block_ids),
        cmocka_unit_test(test_refuse_geometry),
        cmocka_unit_test(test_refuse_params),
        cmocka_unit_test(test_refuse_hostile_random),
        cmocka_unit_test(test_coalesce_counts),
        cmocka_unit_test(test_apply_local_bounds),
        cmocka_unit_test(test_real_model_figures),
    };
    kvf_log_init("test");
    return cmocka_run_group_tests(tests, NULL, NULL);
}
