/*
 * Transfer planner on the tiny hybrid (Nemotron-H pattern "M*M-M*M-": 2
 * attention layers with 2 KV heads of 32, 4 Mamba layers with 8 heads of 32,
 * state 16, 2 groups, conv kernel 4): every layout 1p1d..4p4d, bf16 and fp32
 * KV, prompts ending mid-block and on block boundaries, and block sizes equal,
 * decode larger, prefill larger and not dividing, with several kernel block
 * sizes. TP4 replicates the KV heads and the B/C groups on both sides.
 * Each case is checked byte for byte by the harness (xfer_plan_harness.c).
 */
#include "xfer_plan_harness.h"

#include "kvf_log.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <cmocka.h>

static unsigned long run(const xp_block_cfg_t *cfgs, int n, const char *what)
{
    xp_totals_t t = {0};
    xp_run_matrix(xp_tiny_hybrid_json, cfgs, n, &t);
    print_message("%s: %lu cases, %lu rank plans, %lu descriptors, %llu bytes, %llu zeroed,"
                  " %llu elements checked; %lu rank plans also by the gather's templates\n", what,
                  t.cases, t.rank_plans, t.descs, t.bytes, t.zero_bytes, t.elements,
                  t.tmpl_plans);
    assert_true(t.cases > 0);
    return t.tmpl_plans;
}

/* The TP-stable default (80 tokens, one kernel block) and other kernel sizes at 80. */
static void test_hybrid_equal_blocks(void **state)
{
    static const xp_block_cfg_t cfgs[] = {
        {0, 0, 0, 0},        /* derived: 80 / MultipleOf(16) -> 80 */
        {80, 16, 80, 80},    /* same logical size, prefill kernel 16 (ppl 5) */
        {80, 40, 80, 16},    /* kernel 40 vs 16 */
    };
    (void)state;
    assert_true(run(cfgs, 3, "hybrid equal") > 0);   /* the derived sizes: templates ran */
}

static void test_hybrid_decode_larger(void **state)
{
    static const xp_block_cfg_t cfgs[] = {
        {80, 80, 160, 32},   /* decode 2x, kernel 32 */
        {80, 16, 240, 80},   /* decode 3x */
    };
    (void)state;
    (void)run(cfgs, 2, "hybrid decode larger");
}

static void test_hybrid_prefill_larger(void **state)
{
    static const xp_block_cfg_t cfgs[] = {
        {160, 32, 80, 16},   /* prefill 2x */
        {160, 160, 80, 80},  /* one kernel block each */
    };
    (void)state;
    (void)run(cfgs, 2, "hybrid prefill larger");
}

static void test_hybrid_not_dividing(void **state)
{
    static const xp_block_cfg_t cfgs[] = {
        {96, 32, 80, 80},    /* neither divides the other */
        {80, 16, 112, 16},
        {80, 40, 96, 48},
    };
    (void)state;
    (void)run(cfgs, 3, "hybrid not dividing");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hybrid_equal_blocks),
        cmocka_unit_test(test_hybrid_decode_larger),
        cmocka_unit_test(test_hybrid_prefill_larger),
        cmocka_unit_test(test_hybrid_not_dividing),
    };
    kvf_log_init("test");
    return cmocka_run_group_tests(tests, NULL, NULL);
}
