/*
 * Descriptors per pull scale with blocks, not blocks x layers x heads (issue 41 item 4).
 *
 * For every layout of the matrix (1p1d .. 4p4d), equal and unequal block sizes, the tiny
 * hybrid (Mamba state + attention) and two dense models, the planner's descriptor count is
 * measured at N and at N + one decode block (the same partial tail, so the Mamba state and
 * the last block's runs cancel): the increment is what one more block costs. Every plan is
 * also verified byte for byte by the harness (xp_run_case). The increment must be
 *   - at equal TP and block sizes: at most one descriptor per decode rank and attention
 *     group (a block's layer slots and heads are contiguous on both sides);
 *   - elsewhere: at most the uncoalesced increment (one run per layer, K/V, head and cut)
 *     with the heads divided out and the source ranks multiplied in, i.e. it grows with
 *     blocks x layer slots x source ranks, never with the heads of a rank;
 * and the uncoalesced count itself must break that bound wherever a rank holds two heads or
 * more (so the bound tells the two apart and a regression to per-head runs fails here).
 * At the head-major KV layout (kernels/kvf_kv_layout.h) with equal block sizes the increment
 * must be at most one descriptor per decode rank, source rank and attention group at EVERY
 * TP ratio (a source rank's head range of all layer slots of a block is one range on both
 * sides); with unequal block sizes only a head's K and V runs join (slots x heads x cuts:
 * head-major is for pairs of equal block sizes, docs/ARCHITECTURE.md §7).
 */
#include "xfer_plan_harness.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <cmocka.h>

typedef struct descs_model {
    const char *name;
    const char *const *json;
    int kv_heads;       /* num_key_value_heads */
    int attn_groups;    /* attention KV cache groups of the layout */
} descs_model_t;

static const descs_model_t models[] = {
    {"dense-kv4", &xp_dense_kv4_json, 4, 1},
    {"dense-kv2", &xp_dense_kv2_json, 2, 1},
    {"tiny-hybrid", &xp_tiny_hybrid_json, 2, 1},
};

static const int layouts[][2] = {
    {1, 1}, {1, 2}, {2, 1}, {2, 2}, {4, 2}, {2, 4}, {1, 4}, {4, 1}, {4, 4},
};

/* Descriptors of one request, summed over the decode ranks (each plan verified). */
static unsigned long descs_of(const descs_model_t *m, int P, int D, int p_block, int d_block,
                              int64_t n, bool no_coalesce, kvf_kv_layout_t layout)
{
    xp_totals_t t = {0};
    xp_case_t c = {
        .model_json = *m->json, .P = P, .D = D, .kv_dtype = KVF_DTYPE_BF16,
        .p_block = p_block, .p_kernel = 16, .d_block = d_block, .d_kernel = 16,
        .num_tokens = n, .id_mode = XP_IDS_SHUFFLED, .no_coalesce = no_coalesce,
        .seed = 41, .p_layout = layout, .d_layout = layout,
    };

    xp_run_case(&c, &t);
    assert_int_equal((int)t.rank_plans, D);
    return t.descs;
}

/* One (model, layout, block sizes) cell: the increment of one decode block, checked. */
static void check_cell_kv(const descs_model_t *m, int P, int D, int p_block, int d_block,
                          kvf_kv_layout_t layout)
{
    xp_case_t probe = {.model_json = *m->json, .P = P, .D = D, .kv_dtype = KVF_DTYPE_BF16,
                       .p_block = p_block, .p_kernel = 16, .d_block = d_block,
                       .d_kernel = 16};
    int pb, db, heads_rank, nsrc;
    int64_t n;
    long inc, inc_nc, bound;
    unsigned long a, b;

    xp_case_block_sizes(&probe, &pb, &db);
    n = 3 * (int64_t)db + db / 2;   /* three whole decode blocks and half of one */
    a = descs_of(m, P, D, p_block, d_block, n, false, layout);
    b = descs_of(m, P, D, p_block, d_block, n + db, false, layout);
    inc = (long)b - (long)a;
    inc_nc = (long)descs_of(m, P, D, p_block, d_block, n + db, true, layout) -
             (long)descs_of(m, P, D, p_block, d_block, n, true, layout);
    heads_rank = (m->kv_heads >= D) ? m->kv_heads / D : 1;
    nsrc = (P > D) ? P / D : 1;
    if ((layout == KVF_KV_HEAD_MAJOR) && (pb == db)) {
        /* a source rank's heads (at most heads_rank of them) of a block: one range */
        bound = (long)D * ((nsrc < heads_rank) ? nsrc : heads_rank) * m->attn_groups;
    } else if (layout == KVF_KV_HEAD_MAJOR) {
        /* a head's K and V of its kernel blocks from one source block join, nothing more:
         * layer slots x heads x cuts (worse than layer-major's slots x cuts) */
        bound = inc_nc / 2;
    } else if ((P == D) && (pb == db)) {
        bound = (long)D * m->attn_groups;
    } else {
        bound = inc_nc / heads_rank * nsrc;
    }
    printf("descs %-11s %-11s %dp%dd blocks %4d:%-4d N %5lld: %5lu per pull, +%ld per decode "
           "block (bound %ld; uncoalesced +%ld)\n", m->name, kvf_kv_layout_name((int)layout),
           P, D, pb, db, (long long)n, a, inc, bound, inc_nc);
    assert_true(inc >= 0);
    assert_true(inc <= bound);
    if ((heads_rank >= 2) && (nsrc < heads_rank)) {
        assert_true(inc_nc > bound);   /* per-head runs would fail the check above */
    }
}

static void check_cell(const descs_model_t *m, int P, int D, int p_block, int d_block)
{
    check_cell_kv(m, P, D, p_block, d_block, KVF_KV_LAYER_MAJOR);
}

/* Head-major: one descriptor per (decode rank, source rank) per full block at every layout. */
static void test_descs_head_major(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(models) / sizeof(models[0]); ++i) {
        for (size_t l = 0; l < sizeof(layouts) / sizeof(layouts[0]); ++l) {
            check_cell_kv(&models[i], layouts[l][0], layouts[l][1], 0, 0, KVF_KV_HEAD_MAJOR);
        }
    }
    for (size_t l = 0; l < sizeof(layouts) / sizeof(layouts[0]); ++l) {
        check_cell_kv(&models[0], layouts[l][0], layouts[l][1], 16, 32, KVF_KV_HEAD_MAJOR);
        check_cell_kv(&models[0], layouts[l][0], layouts[l][1], 64, 32, KVF_KV_HEAD_MAJOR);
    }
}

static void test_descs_scale_with_blocks(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(models) / sizeof(models[0]); ++i) {
        for (size_t l = 0; l < sizeof(layouts) / sizeof(layouts[0]); ++l) {
            check_cell(&models[i], layouts[l][0], layouts[l][1], 0, 0);
        }
    }
}

/* Prefill and decode blocks differ (either way), kernel blocks equal: a decode block's
 * kernel blocks are whole remote kernel blocks, so still no heads in the count. */
static void test_descs_unequal_blocks(void **state)
{
    (void)state;
    for (size_t l = 0; l < sizeof(layouts) / sizeof(layouts[0]); ++l) {
        check_cell(&models[0], layouts[l][0], layouts[l][1], 16, 32);
        check_cell(&models[0], layouts[l][0], layouts[l][1], 64, 32);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_descs_scale_with_blocks),
        cmocka_unit_test(test_descs_unequal_blocks),
        cmocka_unit_test(test_descs_head_major),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
