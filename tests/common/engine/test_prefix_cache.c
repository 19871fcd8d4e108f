/*
 * Prefix cache in the engine (docs/PREFIX_CACHE.md), on the trained tiny
 * hybrid and dense checkpoints: every request's tokens AND logprobs (the
 * sampled token's and the top 5) are compared bit for bit with an engine
 * whose cache is off, while the cache-on engine must actually hit:
 * - a three-turn conversation (each turn's prompt = the last prompt, its
 *   answer and new text): the hybrid hits on the state grid at the last
 *   grid point of the previous prompt, the dense model on whole blocks
 *   including the previous answer's;
 * - a prompt shorter than one attention block that hits on the state grid
 *   (no shared block, a restored partial block and Mamba state);
 * - two salts never share, the same salt does;
 * - eviction: distinct prompts worth 3x the pool and 3x the state budget,
 *   revisited, with concurrent requests sharing a prefix; no failure, every
 *   token and logprob equal, blocks and states evicted;
 * - a state budget that holds no checkpoint is refused at create.
 */
#include "kvf_model_test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXOUT 16
#define MAXLEN 1024

typedef struct {
    int32_t tok[MAXOUT];
    float   lp[MAXOUT];
    int32_t top_ids[MAXOUT][5];
    float   top_lp[MAXOUT][5];
    int     n;
    int     hit;
} kvf_pc_out_t;

static char g_hybrid[512], g_dense[512];

static int g_tp = 1;

static kvf_engine_h kvf_pc_engine(const char *dir, bool on, int grid, size_t state_bytes,
                                  int num_blocks, int max_batch_tokens, kvf_status_t want)
{
    kvf_engine_params_t ep = {0};
    kvf_model_config_t cfg;
    kvf_engine_h eng = NULL;

    assert_int_equal(kvf_model_config_load(dir, &cfg), KVF_OK);
    kvf_cache_params_default(&cfg, &ep.cache);
    ep.cache.kv_dtype = KVF_DTYPE_BF16;               /* kvf generate's default */
    ep.cache.ssm_dtype = cfg.ssm_cache_dtype;
    ep.field_mask = KVF_ENGINE_PARAM_FIELD_CACHE | KVF_ENGINE_PARAM_FIELD_NUM_BLOCKS |
                    KVF_ENGINE_PARAM_FIELD_MAX_BATCH_TOKENS | KVF_ENGINE_PARAM_FIELD_PREFIX;
    ep.model_dir = dir;
    ep.tp_size = g_tp;
    ep.num_blocks = num_blocks;
    ep.max_batch_tokens = max_batch_tokens;
    ep.prefix.enabled = on;
    ep.prefix.state_grid = grid;
    ep.prefix.state_bytes = state_bytes;
    assert_int_equal(kvf_engine_create(&ep, &eng), want);
    return eng;
}

static void kvf_pc_collect(const kvf_engine_event_t *ev, int n, uint64_t id, kvf_pc_out_t *o)
{
    for (int i = 0; i < n; ++i) {
        if ((ev[i].id == id) && (ev[i].kind == KVF_EVENT_TOKEN) && (o->n < MAXOUT)) {
            o->tok[o->n] = ev[i].token;
            o->lp[o->n] = ev[i].logprob;
            assert_int_equal(ev[i].num_top, 5);
            memcpy(o->top_ids[o->n], ev[i].top_ids, sizeof(o->top_ids[0]));
            memcpy(o->top_lp[o->n], ev[i].top_logprobs, sizeof(o->top_lp[0]));
            o->n++;
        }
        assert_false((ev[i].id == id) && (ev[i].kind == KVF_EVENT_FINISHED) &&
                     (ev[i].reason == KVF_FINISH_ERROR));
    }
}

/* Run @a n requests at once to the end; outputs in @a out[n]. */
static void kvf_pc_run_many(kvf_engine_h eng, const int32_t *const *prompts, const int *lens,
                            int n, int max_tokens, const char *salt, kvf_pc_out_t *out)
{
    uint64_t ids[8];
    kvf_engine_event_t ev[256];
    int nev;

    assert_true(n <= 8);
    for (int i = 0; i < n; ++i) {
        kvf_req_params_t rp = {.prompt = prompts[i], .prompt_len = lens[i]};
        rp.sampling.max_tokens = max_tokens;
        rp.sampling.ignore_eos = true;
        rp.sampling.want_logprobs = true;
        rp.sampling.logprobs = 5;
        rp.cache_salt = (const uint8_t *)salt;
        rp.cache_salt_len = (salt != NULL) ? strlen(salt) : 0;
        memset(&out[i], 0, sizeof(out[i]));
        assert_int_equal(kvf_engine_add_request(eng, &rp, &ids[i]), KVF_OK);
    }
    for (int guard = 0; kvf_engine_has_work(eng); ++guard) {
        assert_true(guard < 10000);
        assert_int_equal(kvf_engine_step(eng, ev, 256, &nev), KVF_OK);
        for (int i = 0; i < n; ++i) {
            kvf_pc_collect(ev, nev, ids[i], &out[i]);
            if (out[i].hit == 0) {
                out[i].hit = kvf_engine_request_prefix_hit(eng, ids[i]);
            }
        }
    }
    for (int i = 0; i < n; ++i) {
        assert_int_equal(out[i].n, max_tokens);
        assert_int_equal(kvf_engine_release(eng, ids[i]), KVF_OK);
    }
}

static kvf_pc_out_t kvf_pc_run(kvf_engine_h eng, const int32_t *prompt, int len, int max_tokens,
                               const char *salt)
{
    kvf_pc_out_t o;
    kvf_pc_run_many(eng, &prompt, &len, 1, max_tokens, salt, &o);
    return o;
}

static void kvf_pc_same(const kvf_pc_out_t *a, const kvf_pc_out_t *b)
{
    assert_int_equal(a->n, b->n);
    assert_memory_equal(a->tok, b->tok, sizeof(a->tok[0]) * (size_t)a->n);
    assert_memory_equal(a->lp, b->lp, sizeof(a->lp[0]) * (size_t)a->n);        /* bits */
    assert_memory_equal(a->top_ids, b->top_ids, sizeof(a->top_ids[0]) * (size_t)a->n);
    assert_memory_equal(a->top_lp, b->top_lp, sizeof(a->top_lp[0]) * (size_t)a->n);
}

static void kvf_pc_fill(int32_t *p, int n, uint64_t *seed, int vocab)
{
    for (int i = 0; i < n; ++i) {
        *seed = *seed * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = 3 + (int32_t)((*seed >> 33) % (uint64_t)(vocab - 3));
    }
}

/* Three turns on on/off engines; returns the turns' hits on the cache-on engine. */
static void kvf_pc_conversation(const char *dir, int grid, int first_len, int hits[3])
{
    kvf_engine_h on = kvf_pc_engine(dir, true, grid, 0, 64, 64, KVF_OK);
    kvf_engine_h off = kvf_pc_engine(dir, false, grid, 0, 64, 64, KVF_OK);
    const int vocab = kvf_engine_model_config(on)->vocab_size;
    int32_t conv[MAXLEN];
    int len = first_len;
    uint64_t seed = 99;

    kvf_pc_fill(conv, len, &seed, vocab);
    for (int turn = 0; turn < 3; ++turn) {
        kvf_pc_out_t a = kvf_pc_run(on, conv, len, 12, NULL);
        kvf_pc_out_t b = kvf_pc_run(off, conv, len, 12, NULL);
        kvf_pc_same(&a, &b);
        assert_int_equal(b.hit, 0);
        hits[turn] = a.hit;
        memcpy(conv + len, a.tok, sizeof(a.tok[0]) * (size_t)a.n);   /* the answer */
        len += a.n;
        kvf_pc_fill(conv + len, 37, &seed, vocab);                   /* the next question */
        len += 37;
    }
    kvf_engine_destroy(on);
    kvf_engine_destroy(off);
}

static void test_conversation_hybrid(void **state)
{
    int hits[3];
    (void)state;

    /* 150 tokens, grid 16: the state at 144 (the prompt's last grid point) is checkpointed;
     * turn 2 (150 + 12 + 37 = 199 tokens) hits there, turn 3 at 192 */
    kvf_pc_conversation(g_hybrid, 16, 150, hits);
    assert_int_equal(hits[0], 0);
    assert_int_equal(hits[1], 144);
    assert_int_equal(hits[2], 192);
}

/* TP 2: checkpoints copied and restored by each rank on its own pool */
static void test_conversation_hybrid_tp2(void **state)
{
    int hits[3];
    (void)state;

    g_tp = 2;
    kvf_pc_conversation(g_hybrid, 16, 150, hits);
    g_tp = 1;
    assert_int_equal(hits[1], 144);
    assert_int_equal(hits[2], 192);
}

/* Six requests sharing a 100-token prefix at once on a pool too small for them: they are
 * preempted and recomputed (a recompute asks the cache again); each gives the tokens and
 * logprobs it gives alone on a cache-off engine. */
static void test_preemption_shared_prefix(void **state)
{
    enum { N = 6, PLEN = 156 };
    kvf_engine_h on = kvf_pc_engine(g_hybrid, true, 16, 0, 14, 64, KVF_OK);
    kvf_engine_h off = kvf_pc_engine(g_hybrid, false, 16, 0, 64, 64, KVF_OK);
    const int vocab = kvf_engine_model_config(on)->vocab_size;
    static int32_t p[N][PLEN];
    const int32_t *pp[N];
    int lens[N];
    kvf_pc_out_t a[N], b;
    kvf_engine_stats_t st;
    kvf_engine_prefix_stats_t ps;
    uint64_t seed = 21;
    (void)state;

    for (int i = 0; i < N; ++i) {
        kvf_pc_fill(p[i], PLEN, &seed, vocab);
        if (i > 0) {
            memcpy(p[i], p[0], 100 * sizeof(int32_t));
        }
        pp[i] = p[i];
        lens[i] = PLEN - i;   /* decode crosses the 160-token block boundary */
    }
    b = kvf_pc_run(on, p[0], 100, 1, NULL);   /* the shared prefix, checkpointed at 96 */
    kvf_pc_run_many(on, pp, lens, N, 16, NULL, a);
    for (int i = 0; i < N; ++i) {
        b = kvf_pc_run(off, p[i], lens[i], 16, NULL);
        kvf_pc_same(&a[i], &b);
    }
    kvf_engine_get_stats(on, &st);
    kvf_engine_get_prefix_stats(on, &ps);
    assert_true(st.preemptions > 0);
    assert_true(ps.hits >= (uint64_t)N * 96);
    assert_int_equal(kvf_block_manager_num_free(kvf_engine_block_manager(on)), 14);
    kvf_engine_destroy(on);
    kvf_engine_destroy(off);
}

static void test_conversation_dense(void **state)
{
    kvf_model_config_t cfg;
    int hits[3], B;
    kvf_engine_h on;
    (void)state;

    on = kvf_pc_engine(g_dense, true, 0, 0, 64, 64, KVF_OK);
    B = kvf_block_manager_block_size(kvf_engine_block_manager(on));
    kvf_engine_destroy(on);
    assert_int_equal(kvf_model_config_load(g_dense, &cfg), KVF_OK);
    kvf_pc_conversation(g_dense, 0, 150, hits);
    /* whole blocks of everything computed, the answer's tokens included */
    assert_int_equal(hits[0], 0);
    assert_int_equal(hits[1], (150 + 11) / B * B);
    assert_int_equal(hits[2], (150 + 12 + 37 + 11) / B * B);
    assert_true(hits[1] > 0);
}

static void test_short_prompt_hits_on_grid(void **state)
{
    kvf_engine_h on = kvf_pc_engine(g_hybrid, true, 16, 0, 64, 64, KVF_OK);
    kvf_engine_h off = kvf_pc_engine(g_hybrid, false, 16, 0, 64, 64, KVF_OK);
    const int vocab = kvf_engine_model_config(on)->vocab_size;
    const int B = kvf_block_manager_block_size(kvf_engine_block_manager(on));
    kvf_engine_prefix_stats_t st;
    int32_t p[64];
    uint64_t seed = 5;
    kvf_pc_out_t a, b;
    (void)state;

    assert_true(B > 50);
    kvf_pc_fill(p, 50, &seed, vocab);
    a = kvf_pc_run(on, p, 40, 4, NULL);        /* checkpoint at 32 */
    b = kvf_pc_run(off, p, 40, 4, NULL);
    kvf_pc_same(&a, &b);
    a = kvf_pc_run(on, p, 50, 6, NULL);        /* shorter than one block, hits at 32 */
    b = kvf_pc_run(off, p, 50, 6, NULL);
    assert_int_equal(a.hit, 32);
    kvf_pc_same(&a, &b);
    /* one token past the checkpoint: the last prompt token alone, a one-token recurrent step
     * with the prompt's dt clamp, where the cache-off run scans it inside its chunk */
    a = kvf_pc_run(on, p, 33, 6, NULL);
    b = kvf_pc_run(off, p, 33, 6, NULL);
    assert_int_equal(a.hit, 32);
    kvf_pc_same(&a, &b);
    kvf_engine_get_prefix_stats(on, &st);
    assert_true(st.states_restored == 2);
    assert_true(st.hit_state_tokens == 64);
    assert_true(st.hit_attn_tokens == 0);
    assert_true(st.queries == 123);
    assert_true(st.hits == 64);
    kvf_engine_destroy(on);
    kvf_engine_destroy(off);
}

static void test_salts_never_share(void **state)
{
    kvf_engine_h on = kvf_pc_engine(g_hybrid, true, 16, 0, 64, 64, KVF_OK);
    kvf_engine_h off = kvf_pc_engine(g_hybrid, false, 16, 0, 64, 64, KVF_OK);
    const int vocab = kvf_engine_model_config(on)->vocab_size;
    int32_t p[200];
    uint64_t seed = 7;
    kvf_pc_out_t a, b, ref;
    char big[KVF_CACHE_SALT_MAX + 2];
    uint64_t id;
    (void)state;

    kvf_pc_fill(p, 200, &seed, vocab);
    ref = kvf_pc_run(off, p, 200, 5, NULL);
    a = kvf_pc_run(on, p, 200, 5, "tenant-a");
    assert_int_equal(a.hit, 0);
    b = kvf_pc_run(on, p, 200, 5, "tenant-b");
    assert_int_equal(b.hit, 0);                    /* same tokens, another salt */
    kvf_pc_same(&a, &ref);
    kvf_pc_same(&b, &ref);
    b = kvf_pc_run(on, p, 200, 5, NULL);
    assert_int_equal(b.hit, 0);                    /* no salt is a salt of its own */
    a = kvf_pc_run(on, p, 200, 5, "tenant-a");
    assert_int_equal(a.hit, 192);                  /* the same salt shares */
    kvf_pc_same(&a, &ref);
    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    {
        kvf_req_params_t rp = {.prompt = p, .prompt_len = 10};
        rp.sampling.max_tokens = 1;
        rp.cache_salt = (const uint8_t *)big;
        rp.cache_salt_len = strlen(big);
        assert_int_equal(kvf_engine_add_request(on, &rp, &id), KVF_ERR_INVALID_PARAM);
    }
    kvf_engine_destroy(on);
    kvf_engine_destroy(off);
}

/* Prompts worth 3x the pool and 3x the state budget, each run alone then with one sharing
 * its first 150 tokens (at once), then all revisited: no failure, every result the cache-off
 * one (computed once per prompt: a request's result does not depend on its batch), blocks
 * and states evicted. */
static void kvf_pc_eviction(const char *dir, int grid)
{
    enum { MAXP = 32, PLEN = 230, OUT = 6 };
    size_t ckpt;
    kvf_engine_h on, off;
    kvf_engine_prefix_stats_t st;
    static int32_t prompts[MAXP][PLEN];
    static kvf_pc_out_t ref[MAXP];
    const int32_t *pp[MAXP];
    int vocab, B, blocks, np, lens[MAXP];
    uint64_t seed = 11;

    on = kvf_pc_engine(dir, true, grid, 1, 64, 64, (grid > 0) ? KVF_ERR_INVALID_PARAM : KVF_OK);
    kvf_engine_destroy(on);
    on = kvf_pc_engine(dir, true, grid, (size_t)64 << 20, 64, 64, KVF_OK);
    kvf_engine_get_prefix_stats(on, &st);
    ckpt = st.state_bytes;
    B = kvf_block_manager_block_size(kvf_engine_block_manager(on));
    kvf_engine_destroy(on);
    /* a pool that holds the two requests of a step and little more; 4 checkpoints; enough
     * distinct prompts that their full blocks are 3x the pool */
    blocks = 2 * ((PLEN + OUT + B - 1) / B + 2) + 2;
    np = (3 * blocks + PLEN / B - 1) / (PLEN / B);
    np += np % 2;
    assert_true(np <= MAXP);
    assert_true(np * (PLEN / B) >= 3 * blocks);
    on = kvf_pc_engine(dir, true, grid, (grid > 0) ? 4 * ckpt : 0, blocks, 64, KVF_OK);
    off = kvf_pc_engine(dir, false, grid, 0, blocks, 64, KVF_OK);
    vocab = kvf_engine_model_config(on)->vocab_size;
    for (int i = 0; i < np; ++i) {
        kvf_pc_fill(prompts[i], PLEN, &seed, vocab);
        if (i % 2 == 1) {
            memcpy(prompts[i], prompts[i - 1], 150 * sizeof(int32_t));   /* shared prefix */
        }
        pp[i] = prompts[i];
        lens[i] = PLEN - 9 * (i % 3);
    }
    for (int i = 0; i < np; i += 2) {
        kvf_pc_run_many(off, pp + i, lens + i, 2, OUT, NULL, ref + i);
    }
    for (int round = 0; round < 2; ++round) {
        for (int i = 0; i < np; i += 2) {
            kvf_pc_out_t a[2];
            kvf_pc_run_many(on, pp + i, lens + i, 1, OUT, NULL, a);   /* alone, then a pair */
            kvf_pc_same(&a[0], &ref[i]);
            kvf_pc_run_many(on, pp + i, lens + i, 2, OUT, NULL, a);
            kvf_pc_same(&a[0], &ref[i]);
            kvf_pc_same(&a[1], &ref[i + 1]);
        }
    }
    kvf_engine_get_prefix_stats(on, &st);
    assert_true(st.hits > 0);
    assert_true(st.blocks_evicted > 0);
    if (grid > 0) {
        assert_true(st.states_evicted > 0);
        assert_true(st.states <= 4);
        assert_true(st.states_restored > 0);
    }
    assert_int_equal(kvf_block_manager_num_free(kvf_engine_block_manager(on)), blocks);
    kvf_engine_destroy(on);
    kvf_engine_destroy(off);
}

static void test_eviction_hybrid(void **state)
{
    (void)state;
    kvf_pc_eviction(g_hybrid, 16);
}

static void test_eviction_dense(void **state)
{
    (void)state;
    kvf_pc_eviction(g_dense, 0);
}

int main(void)
{
    const char *src = KVF_SOURCE_DIR;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conversation_hybrid),
        cmocka_unit_test(test_conversation_hybrid_tp2),
        cmocka_unit_test(test_preemption_shared_prefix),
        cmocka_unit_test(test_conversation_dense),
        cmocka_unit_test(test_short_prompt_hits_on_grid),
        cmocka_unit_test(test_salts_never_share),
        cmocka_unit_test(test_eviction_hybrid),
        cmocka_unit_test(test_eviction_dense),
    };
    snprintf(g_hybrid, sizeof(g_hybrid), "%s/models-trained/tiny-hybrid", src);
    snprintf(g_dense, sizeof(g_dense), "%s/models-trained/tiny-dense", src);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
