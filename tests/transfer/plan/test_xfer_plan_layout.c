/*
 * Transfer planner at the head-major attention block layout (kernels/kvf_kv_layout.h):
 * both sides head-major, and mixed (prefill head-major, decode layer-major and the
 * reverse), on the tiny hybrid and both dense models, every layout 1p1d..4p4d (4p2d,
 * 1p4d, 4p1d among them), bf16 and fp32, equal and unequal block and kernel block sizes.
 * Each case is checked byte for byte by the harness (xfer_plan_harness.c), which also
 * computes the minimal descriptor count independently and requires the plan to meet it.
 */
#include "xfer_plan_harness.h"

#include "kvf_log.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <cmocka.h>

static const xp_block_cfg_t hybrid_cfgs[] = {
    {0, 0, 0, 0},        /* derived: 80 / 80 */
    {80, 16, 80, 80},    /* same logical size, prefill kernel 16 */
    {160, 32, 80, 16},   /* prefill 2x */
    {96, 32, 80, 80},    /* neither divides the other */
};

static const xp_block_cfg_t dense_cfgs[] = {
    {16, 16, 16, 16},
    {32, 16, 16, 16},
    {16, 16, 48, 16},
};

static void run(const char *json, const xp_block_cfg_t *cfgs, int n, kvf_kv_layout_t p,
                kvf_kv_layout_t d, const char *what)
{
    xp_totals_t t = {0};
    xp_run_matrix_kv(json, cfgs, n, p, d, &t);
    print_message("%s (prefill %s, decode %s): %lu cases, %lu rank plans, %lu descriptors,"
                  " %llu bytes, %llu zeroed, %llu elements checked; %lu by templates\n", what,
                  kvf_kv_layout_name((int)p), kvf_kv_layout_name((int)d), t.cases,
                  t.rank_plans, t.descs, t.bytes, t.zero_bytes, t.elements, t.tmpl_plans);
    assert_true(t.cases > 0);
    assert_int_equal(t.tmpl_plans, 0);   /* templates refuse a head-major side */
}

static void test_hybrid_head_major(void **state)
{
    (void)state;
    run(xp_tiny_hybrid_json, hybrid_cfgs, 4, KVF_KV_HEAD_MAJOR, KVF_KV_HEAD_MAJOR, "hybrid");
}

static void test_hybrid_mixed(void **state)
{
    (void)state;
    run(xp_tiny_hybrid_json, hybrid_cfgs, 2, KVF_KV_HEAD_MAJOR, KVF_KV_LAYER_MAJOR, "hybrid");
    run(xp_tiny_hybrid_json, hybrid_cfgs + 2, 2, KVF_KV_LAYER_MAJOR, KVF_KV_HEAD_MAJOR,
        "hybrid");
}

static void test_dense_head_major(void **state)
{
    (void)state;
    run(xp_dense_kv4_json, dense_cfgs, 3, KVF_KV_HEAD_MAJOR, KVF_KV_HEAD_MAJOR, "dense kv4");
    run(xp_dense_kv2_json, dense_cfgs, 2, KVF_KV_HEAD_MAJOR, KVF_KV_HEAD_MAJOR, "dense kv2");
}

static void test_dense_mixed(void **state)
{
    (void)state;
    run(xp_dense_kv4_json, dense_cfgs, 2, KVF_KV_HEAD_MAJOR, KVF_KV_LAYER_MAJOR, "dense kv4");
    run(xp_dense_kv2_json, dense_cfgs + 1, 2, KVF_KV_LAYER_MAJOR, KVF_KV_HEAD_MAJOR,
        "dense kv2");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hybrid_head_major),
        cmocka_unit_test(test_hybrid_mixed),
        cmocka_unit_test(test_dense_head_major),
        cmocka_unit_test(test_dense_mixed),
    };
    kvf_log_init("test");
    return cmocka_run_group_tests(tests, NULL, NULL);
}
