/*
 * The NemotronH forward against an independent reference, and tensor
 * parallelism: TP1, TP2 and TP4 give the same greedy tokens and logits
 * within 1e-4 relative. TP4 on the tiny models replicates KV heads (2 KV
 * heads) and Mamba groups (n_groups 2), so the gated norm all-reduces its
 * partial sums of squares across the two ranks sharing a group.
 */
#include "kvf_model_test_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define GEN 8

static const char *const kvf_prompts[] = {
    "The quick brown fox",
    "a",
    "Disaggregated prefill and decode with hybrid Mamba models!",
};

static void kvf_check_against_reference(const char *name)
{
    char dir[256];
    int32_t prompt[128], seq[160], toks[GEN];
    kvf_test_engine_opts_t o = kvf_test_engine_defaults();
    kvf_engine_h eng;
    float *lg, ref[1024];
    int vocab;

    kvf_test_mkmodel(name, 11, dir);
    eng = kvf_test_engine(dir, &o);
    vocab = kvf_engine_model_config(eng)->vocab_size;
    lg = malloc((size_t)GEN * (size_t)vocab * sizeof(float));
    assert_non_null(lg);
    for (size_t p = 0; p < sizeof(kvf_prompts) / sizeof(kvf_prompts[0]); ++p) {
        int n = kvf_test_prompt(kvf_prompts[p], prompt, 128);
        kvf_test_greedy(eng, prompt, n, GEN, toks, lg);
        /* logits after the prompt (prefill) */
        kvf_ref_forward(dir, prompt, n, ref);
        assert_true(kvf_test_rel_diff(lg, ref, vocab) < 1e-4);
        /* logits of the last decode step: prompt + first GEN-1 outputs */
        memcpy(seq, prompt, (size_t)n * sizeof(int32_t));
        memcpy(seq + n, toks, (GEN - 1) * sizeof(int32_t));
        kvf_ref_forward(dir, seq, n + GEN - 1, ref);
        double d = kvf_test_rel_diff(lg + (size_t)(GEN - 1) * vocab, ref, vocab);
        print_message("%s prompt %zu: decode logits rel diff vs reference %.3g\n", name, p, d);
        assert_true(d < 1e-4);
    }
    free(lg);
    kvf_engine_destroy(eng);
    kvf_test_rmmodel(dir);
}

static void test_hybrid_matches_reference(void **state)
{
    (void)state;
    kvf_check_against_reference("tiny-hybrid");
}

static void test_dense_matches_reference(void **state)
{
    (void)state;
    kvf_check_against_reference("tiny-dense");
}

static void kvf_check_tp(const char *name)
{
    static const int tps[] = {1, 2, 4};
    char dir[256];
    int32_t prompt[128], toks[3][GEN];
    float *lg[3];
    int vocab = 0;

    kvf_test_mkmodel(name, 5, dir);
    for (size_t p = 0; p < sizeof(kvf_prompts) / sizeof(kvf_prompts[0]); ++p) {
        int n = kvf_test_prompt(kvf_prompts[p], prompt, 128);
        for (int i = 0; i < 3; ++i) {
            kvf_test_engine_opts_t o = kvf_test_engine_defaults();
            kvf_engine_h eng;
            o.tp = tps[i];
            eng = kvf_test_engine(dir, &o);
            vocab = kvf_engine_model_config(eng)->vocab_size;
            lg[i] = malloc((size_t)GEN * (size_t)vocab * sizeof(float));
            assert_non_null(lg[i]);
            kvf_test_greedy(eng, prompt, n, GEN, toks[i], lg[i]);
            kvf_engine_destroy(eng);
        }
        for (int i = 1; i < 3; ++i) {
            assert_memory_equal(toks[0], toks[i], sizeof(toks[0]));
            for (int s = 0; s < GEN; ++s) {
                double d = kvf_test_rel_diff(lg[i] + (size_t)s * vocab, lg[0] + (size_t)s * vocab,
                                             vocab);
                assert_false(isnan(d));
                assert_true(d < 1e-4);
            }
        }
        for (int i = 0; i < 3; ++i) {
            free(lg[i]);
        }
    }
    kvf_test_rmmodel(dir);
}

static void test_hybrid_tp_equal(void **state)
{
    (void)state;
    kvf_check_tp("tiny-hybrid");
}

static void test_dense_tp_equal(void **state)
{
    (void)state;
    kvf_check_tp("tiny-dense");
}

/* transformers-5 spelled hybrid with Mamba and MLP biases, gelu after the conv, silu MLP */
static void test_hybrid_bias_tp_equal(void **state)
{
    (void)state;
    kvf_check_tp("tiny-hybrid-bias");
}

/* Nemotron-H MoE: experts split whole over the ranks (8 experts: 8, 4, 2 per rank) */
static void test_moe_tp_equal(void **state)
{
    (void)state;
    kvf_check_tp("tiny-moe");
}

/* dense Llama with Llama-3 rope scaling; TP4 replicates its 2 KV heads */
static void test_llama_tp_equal(void **state)
{
    (void)state;
    kvf_check_tp("tiny-llama");
}

/* dense Qwen3: q/k RMSNorm per head, attention biases (o_proj bias once, on rank 0) */
static void test_qwen3_tp_equal(void **state)
{
    (void)state;
    kvf_check_tp("tiny-qwen3");
}

/* Greedy output depends on the prompt (the synthetic init is not degenerate). */
static void test_output_varies(void **state)
{
    char dir[256];
    int32_t p1[64], p2[64], t1[GEN], t2[GEN];
    kvf_test_engine_opts_t o = kvf_test_engine_defaults();
    kvf_engine_h eng;
    int n1, n2;

    (void)state;
    kvf_test_mkmodel("tiny-hybrid", 1, dir);
    eng = kvf_test_engine(dir, &o);
    n1 = kvf_test_prompt("hello world", p1, 64);
    n2 = kvf_test_prompt("goodbye moon", p2, 64);
    kvf_test_greedy(eng, p1, n1, GEN, t1, NULL);
    kvf_test_greedy(eng, p2, n2, GEN, t2, NULL);
    assert_memory_not_equal(t1, t2, sizeof(t1));
    kvf_engine_destroy(eng);
    kvf_test_rmmodel(dir);
}

/* Outside pool memory (what the daemons' --pool-alloc ucx hands in), per rank. */
typedef struct {
    void  *mem[4];
    size_t bytes[4];
    int    calls;
    int    fail_rank;   /* -1: none */
} outside_pools_t;

static kvf_status_t outside_alloc(void *ctx, int rank, int num_blocks, size_t bytes,
                                  void **base_p)
{
    outside_pools_t *o = ctx;

    assert_true((rank >= 0) && (rank < 4) && (num_blocks > 0));
    o->calls++;
    if (rank == o->fail_rank) {
        return KVF_ERR_NO_MEMORY;
    }
    o->mem[rank] = aligned_alloc(4096, (bytes + 4095) & ~(size_t)4095);
    assert_non_null(o->mem[rank]);
    memset(o->mem[rank], 0xff, bytes);   /* stale bytes: fresh blocks must still be zeroed */
    o->bytes[rank] = bytes;
    *base_p = o->mem[rank];
    return KVF_OK;
}

/* The engine computes in the memory it is given, with the same tokens as in its own. */
static void test_outside_pool_memory(void **state)
{
    char dir[256];
    int32_t p[64], own[GEN], outside[GEN];
    outside_pools_t op = {.fail_rank = -1};
    kvf_test_engine_opts_t o = kvf_test_engine_defaults();
    kvf_engine_params_t bad = {0};
    kvf_engine_h eng;
    int n;

    (void)state;
    kvf_test_mkmodel("tiny-hybrid", 1, dir);
    n = kvf_test_prompt("hello world", p, 64);
    o.tp = 2;
    eng = kvf_test_engine(dir, &o);
    kvf_test_greedy(eng, p, n, GEN, own, NULL);
    kvf_engine_destroy(eng);

    o.pool_alloc = outside_alloc;
    o.pool_alloc_ctx = &op;
    eng = kvf_test_engine(dir, &o);
    assert_int_equal(op.calls, 2);
    for (int r = 0; r < 2; ++r) {
        kvf_page_pool_h pool = kvf_tp_runner_pool(kvf_engine_runner(eng), r);
        assert_ptr_equal(kvf_page_pool_base(pool), op.mem[r]);
        assert_int_equal(kvf_page_pool_bytes(pool), op.bytes[r]);
    }
    kvf_test_greedy(eng, p, n, GEN, outside, NULL);
    assert_memory_equal(own, outside, sizeof(own));
    kvf_engine_destroy(eng);
    for (int r = 0; r < 2; ++r) {
        free(op.mem[r]);   /* the caller's: destroy left it alone */
    }

    /* an allocator that fails rank 1 fails the create; a set bit without a function too */
    memset(&op, 0, sizeof(op));
    op.fail_rank = 1;
    bad.field_mask = KVF_ENGINE_PARAM_FIELD_POOL_ALLOC;
    bad.model_dir = dir;
    bad.tp_size = 2;
    bad.pool_alloc = outside_alloc;
    bad.pool_alloc_ctx = &op;
    eng = NULL;
    assert_int_equal(kvf_engine_create(&bad, &eng), KVF_ERR_NO_MEMORY);
    assert_int_equal(op.calls, 2);
    free(op.mem[0]);
    bad.pool_alloc = NULL;
    assert_int_equal(kvf_engine_create(&bad, &eng), KVF_ERR_INVALID_PARAM);
    kvf_test_rmmodel(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hybrid_matches_reference),
        cmocka_unit_test(test_dense_matches_reference),
        cmocka_unit_test(test_hybrid_tp_equal),
        cmocka_unit_test(test_dense_tp_equal),
        cmocka_unit_test(test_output_varies),
        cmocka_unit_test(test_outside_pool_memory),
        cmocka_unit_test(test_hybrid_bias_tp_equal),
        cmocka_unit_test(test_moe_tp_equal),
        cmocka_unit_test(test_llama_tp_equal),
        cmocka_unit_test(test_qwen3_tp_equal),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
