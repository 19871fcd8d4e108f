/*
 * The scheduling policy on its own (no model): decode tokens first, then
 * FCFS prefill chunks within the token budget; blocks allocated per entry;
 * recompute preemption of the most recent running request when a decode
 * needs a block; and the sampler (argmax with lowest-id ties, seeded
 * temperature draws that follow the softmax).
 */
#include "kvf_scheduler.h"
#include "kvf_model_config.h"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static kvf_model_config_t cfg;
static kvf_cache_layout_t layout;

static kvf_block_manager_h kvf_bm(int blocks)
{
    kvf_block_manager_params_t p = {0};
    kvf_block_manager_h bm;
    p.field_mask = KVF_BLOCK_MANAGER_PARAM_FIELD_NUM_BLOCKS | KVF_BLOCK_MANAGER_PARAM_FIELD_BLOCK_SIZE |
                   KVF_BLOCK_MANAGER_PARAM_FIELD_LAYOUT;
    p.num_blocks = blocks;
    p.block_size = 80;
    p.layout = &layout;
    assert_int_equal(kvf_block_manager_create(&p, &bm), KVF_OK);
    return bm;
}

static void kvf_req(kvf_request_t *r, uint64_t id, int tokens, int computed, kvf_req_state_t st)
{
    memset(r, 0, sizeof(*r));
    r->id = id;
    r->arrival = id;
    r->num_tokens = tokens;
    r->prompt_len = tokens;
    r->num_computed = computed;
    r->state = st;
}

static void test_decode_first_then_fair_chunks(void **state)
{
    kvf_block_manager_h bm = kvf_bm(20);
    kvf_request_t a, b, c, d;
    kvf_request_t *reqs[4] = {&d, &c, &b, &a};   /* any order in, arrival order out */
    kvf_scheduler_params_t sp = {.max_batch_tokens = 64, .max_seqs = 8};
    kvf_sched_entry_t plan[8];
    int n;

    (void)state;
    kvf_req(&a, 1, 100, 0, KVF_REQ_WAITING);       /* arrives first: a long prompt */
    kvf_req(&b, 2, 41, 40, KVF_REQ_RUNNING);       /* decoding: one pending token */
    assert_int_equal(kvf_block_manager_allocate(bm, &b.blocks, 40), KVF_OK);
    kvf_req(&c, 3, 30, 0, KVF_REQ_WAITING);        /* a short prompt behind the long one */
    kvf_req(&d, 4, 10, 0, KVF_REQ_PREFILLED);      /* holds blocks, never scheduled */
    assert_int_equal(kvf_scheduler_schedule(&sp, bm, reqs, 4, plan, &n), KVF_OK);
    assert_int_equal(n, 3);
    assert_ptr_equal(plan[0].req, &b);
    assert_int_equal(plan[0].start, 40);
    assert_int_equal(plan[0].num_tokens, 1);
    assert_true(plan[0].samples);
    /* 63 tokens left: a quarter (16) each in arrival order, then the rest to
     * the one closest to done: the short prompt gets all it needs (30) now,
     * the long one the rest (33), instead of 63 + nothing */
    assert_ptr_equal(plan[1].req, &a);
    assert_int_equal(plan[1].start, 0);
    assert_int_equal(plan[1].num_tokens, 33);
    assert_false(plan[1].samples);
    assert_ptr_equal(plan[2].req, &c);
    assert_int_equal(plan[2].start, 0);
    assert_int_equal(plan[2].num_tokens, 30);
    assert_true(plan[2].samples);                  /* its first token comes out this step */
    assert_int_equal(a.state, KVF_REQ_RUNNING);
    assert_int_equal(c.state, KVF_REQ_RUNNING);
    assert_int_equal(a.blocks.num_blocks[0], 1);   /* 33 tokens: one attention block */
    assert_int_equal(a.blocks.num_blocks[1], 1);   /* one block per Mamba group */
    assert_int_equal(kvf_block_manager_num_free(bm), 20 - 3 - 3 - 3);
    kvf_block_manager_free(bm, &a.blocks);
    kvf_block_manager_free(bm, &b.blocks);
    kvf_block_manager_free(bm, &c.blocks);
    assert_int_equal(kvf_block_manager_num_free(bm), 20);
    kvf_block_manager_destroy(bm);
}

/* Many prompts waiting: a quarter of the budget each in arrival order, the
 * rest to the first; a pool that runs out stops admitting (FCFS). */
static void test_fair_shares_and_fcfs_blocks(void **state)
{
    kvf_block_manager_h bm = kvf_bm(7);
    kvf_request_t r[3];
    kvf_request_t *reqs[3] = {&r[0], &r[1], &r[2]};
    kvf_scheduler_params_t sp = {.max_batch_tokens = 60, .max_seqs = 8};
    kvf_sched_entry_t plan[8];
    int n;

    (void)state;
    for (int i = 0; i < 3; ++i) {
        kvf_req(&r[i], (uint64_t)i + 1, 1000, 0, KVF_REQ_WAITING);
    }
    assert_int_equal(kvf_scheduler_schedule(&sp, bm, reqs, 3, plan, &n), KVF_OK);
    /* 16 + 16 + 16, the 12 left to the first (equal remainders: arrival
     * order); 7 blocks hold two requests (3 each), so the third waits */
    assert_int_equal(n, 2);
    assert_ptr_equal(plan[0].req, &r[0]);
    assert_int_equal(plan[0].num_tokens, 28);
    assert_ptr_equal(plan[1].req, &r[1]);
    assert_int_equal(plan[1].num_tokens, 16);
    assert_int_equal(r[2].state, KVF_REQ_WAITING);
    assert_int_equal(r[2].sched_tokens, 0);
    for (int i = 0; i < 3; ++i) {
        kvf_block_manager_free(bm, &r[i].blocks);
    }
    kvf_block_manager_destroy(bm);
}

static void test_preempt_latest_running(void **state)
{
    kvf_block_manager_h bm = kvf_bm(6);          /* two requests of 3 blocks fill it */
    kvf_request_t a, b;
    kvf_request_t *reqs[2] = {&a, &b};
    kvf_scheduler_params_t sp = {.max_batch_tokens = 64, .max_seqs = 8};
    kvf_sched_entry_t plan[8];
    int n;

    (void)state;
    kvf_req(&a, 1, 81, 80, KVF_REQ_RUNNING);     /* token 81 opens a second attention block */
    kvf_req(&b, 2, 11, 10, KVF_REQ_RUNNING);
    assert_int_equal(kvf_block_manager_allocate(bm, &a.blocks, 80), KVF_OK);
    assert_int_equal(kvf_block_manager_allocate(bm, &b.blocks, 10), KVF_OK);
    assert_int_equal(kvf_block_manager_num_free(bm), 0);
    assert_int_equal(kvf_scheduler_schedule(&sp, bm, reqs, 2, plan, &n), KVF_OK);
    /* b (arrived later) loses its blocks and a gets its block; b waits to be
     * prefilled again over its 11 known tokens (3 blocks; 2 are free) */
    assert_int_equal(b.preemptions, 1);
    assert_int_equal(n, 1);
    assert_ptr_equal(plan[0].req, &a);
    assert_int_equal(a.blocks.num_blocks[0], 2);
    assert_int_equal(b.state, KVF_REQ_WAITING);
    assert_int_equal(b.num_computed, 0);
    assert_int_equal(b.blocks.num_groups, 0);
    assert_int_equal(kvf_block_manager_num_free(bm), 2);   /* b would need 3 */
    kvf_block_manager_free(bm, &a.blocks);     /* a finishes */
    a.state = KVF_REQ_FINISHED;
    assert_int_equal(kvf_scheduler_schedule(&sp, bm, reqs, 2, plan, &n), KVF_OK);
    assert_int_equal(n, 1);
    assert_ptr_equal(plan[0].req, &b);
    assert_int_equal(plan[0].start, 0);
    assert_int_equal(plan[0].num_tokens, 11);
    assert_true(plan[0].samples);
    kvf_block_manager_free(bm, &a.blocks);
    kvf_block_manager_free(bm, &b.blocks);
    kvf_block_manager_destroy(bm);
}

static void test_sampler(void **state)
{
    kvf_request_t r;
    float logits[4] = {1.0f, 3.0f, 3.0f, 0.0f};
    int counts[4] = {0};
    const int draws = 20000;

    (void)state;
    memset(&r, 0, sizeof(r));
    assert_int_equal(kvf_sample_token(&r, logits, 4), 1);   /* greedy, lowest id of the tie */
    r.sampling.temperature = 1.0f;
    r.rng = 99;
    for (int i = 0; i < draws; ++i) {
        counts[kvf_sample_token(&r, logits, 4)]++;
    }
    double z = exp(1.0) + 2.0 * exp(3.0) + 1.0;
    for (int i = 0; i < 4; ++i) {
        double p = exp((double)logits[i]) / z;
        double sd = sqrt(draws * p * (1.0 - p));
        assert_true(fabs(counts[i] - draws * p) < 5.0 * sd + 1.0);   /* 5 sigma */
    }
    {   /* the same seed gives the same draws */
        kvf_request_t x = r, y = r;
        for (int i = 0; i < 100; ++i) {
            assert_int_equal(kvf_sample_token(&x, logits, 4), kvf_sample_token(&y, logits, 4));
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode_first_then_fair_chunks),
        cmocka_unit_test(test_fair_shares_and_fcfs_blocks),
        cmocka_unit_test(test_preempt_latest_running),
        cmocka_unit_test(test_sampler),
    };
    if ((kvf_model_config_load(KVF_SOURCE_DIR "/tests/data/models/tiny-hybrid.config.json", &cfg) !=
         KVF_OK) || (kvf_cache_layout_build(&cfg, &layout) != KVF_OK)) {
        return 1;
    }
    return cmocka_run_group_tests(tests, NULL, NULL);
}
