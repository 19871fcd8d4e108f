/*
 * Transfer planner on two dense GQA models: 4 layers with 4 KV heads (TP4
 * gives one head per rank) and 6 layers with 2 KV heads (TP4 replicates each
 * head on two ranks, so a decode rank must read it once). Every layout
 * 1p1d..4p4d, bf16 and fp32 KV, block sizes equal / decode larger / prefill
 * larger / not dividing, several kernel block sizes, prompts ending mid-block
 * and on boundaries. Checked byte for byte by xfer_plan_harness.c.
 */
#include "xfer_plan_harness.h"

#include "kvf_log.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <cmocka.h>

static const xp_block_cfg_t dense_cfgs[] = {
    {16, 16, 16, 16},    /* equal */
    {32, 32, 32, 16},    /* equal logical, kernel 32 vs 16 */
    {16, 16, 32, 32},    /* decode larger */
    {16, 16, 64, 32},    /* decode 4x */
    {32, 16, 16, 16},    /* prefill larger */
    {48, 16, 16, 16},    /* prefill 3x */
    {48, 16, 32, 32},    /* not dividing */
    {80, 16, 96, 32},    /* not dividing, both ppl > 1 */
    {0, 0, 0, 0},        /* derived defaults */
};

static void run(const char *json, const char *what)
{
    xp_totals_t t = {0};
    xp_run_matrix(json, dense_cfgs, (int)(sizeof(dense_cfgs) / sizeof(dense_cfgs[0])), &t);
    print_message("%s: %lu cases, %lu rank plans, %lu descriptors, %llu bytes, %llu zeroed,"
                  " %llu elements checked; %lu rank plans also by the gather's templates\n", what,
                  t.cases, t.rank_plans, t.descs, t.bytes, t.zero_bytes, t.elements,
                  t.tmpl_plans);
    assert_true(t.cases > 0);
    assert_true(t.tmpl_plans > 0);   /* every config list has equal block sizes */
}

static void test_dense_kv4(void **state)
{
    (void)state;
    run(xp_dense_kv4_json, "dense kv4");
}

static void test_dense_kv2_replicated(void **state)
{
    (void)state;
    run(xp_dense_kv2_json, "dense kv2");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dense_kv4),
        cmocka_unit_test(test_dense_kv2_replicated),
    };
    kvf_log_init("test");
    return cmocka_run_group_tests(tests, NULL, NULL);
}
