/*
 * Decode's side of the prefix cache in the engine (docs/PREFIX_CACHE.md §6): what
 * kvf_engine_import_begin() serves from the cache and what import_commit() keeps, on the
 * trained tiny checkpoints. The KV itself is not pulled here (the fresh blocks stay zero;
 * test_e2e_prefix_cache compares tokens through real pulls): this checks the bookkeeping.
 * - an import's full prompt blocks are kept at commit under its source's numerics class, and
 *   the next import of that prompt's continuation from the same class shares them (the same
 *   pool blocks), a multiple of the block size, never past the prompt;
 * - another class, or an unknown one (0), is a miss, and nothing of an unknown one is kept;
 * - a model without Mamba layers whose source is the engine's own class also keeps the
 *   blocks its decode steps complete; a hybrid keeps prompt blocks only;
 * - an import that is aborted before its commit keeps nothing;
 * - an import whose pull zeroed blocks after its hit (a sliding window) keeps none;
 * - the counters: queries (prompt tokens), hits (tokens served), pulled (the rest).
 */
#include "kvf_model_test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char g_hybrid[512], g_dense[512];

static kvf_engine_h kvf_pi_engine(const char *dir)
{
    kvf_engine_params_t ep = {0};
    kvf_model_config_t cfg;
    kvf_engine_h eng = NULL;

    assert_int_equal(kvf_model_config_load(dir, &cfg), KVF_OK);
    kvf_cache_params_default(&cfg, &ep.cache);
    ep.cache.kv_dtype = KVF_DTYPE_BF16;
    ep.cache.ssm_dtype = cfg.ssm_cache_dtype;
    ep.field_mask = KVF_ENGINE_PARAM_FIELD_CACHE | KVF_ENGINE_PARAM_FIELD_NUM_BLOCKS |
                    KVF_ENGINE_PARAM_FIELD_PREFIX;
    ep.model_dir = dir;
    ep.tp_size = 1;
    ep.num_blocks = 128;
    ep.prefix.enabled = true;
    ep.prefix.state_grid = 64;
    assert_int_equal(kvf_engine_create(&ep, &eng), KVF_OK);
    return eng;
}

/* Import @a n tokens of @a prompt from @a source; @return its hit; *id_p its id. */
static int kvf_pi_begin(kvf_engine_h eng, const int32_t *prompt, int n, uint64_t source,
                        int max_tokens, uint64_t *id_p)
{
    kvf_req_params_t rp = {0};
    const kvf_req_blocks_t *blocks;

    rp.prompt = prompt;
    rp.prompt_len = n;
    rp.sampling.max_tokens = max_tokens;
    rp.sampling.temperature = 0;
    rp.sampling.ignore_eos = true;
    rp.rng_skip = 1;
    rp.import_source = source;
    assert_int_equal(kvf_engine_import_begin(eng, &rp, id_p, &blocks), KVF_OK);
    return kvf_engine_request_prefix_hit(eng, *id_p);
}

/* Commit with a first token and decode to the end; the tokens it holds then go to @a seq
 * (prompt and outputs) and @a first_blocks gets its first attention group's block ids. */
static int kvf_pi_finish(kvf_engine_h eng, uint64_t id, int32_t *seq, int32_t *first_blocks,
                         int nblocks)
{
    kvf_engine_event_t ev[64];
    kvf_req_info_t info;
    int n;

    assert_int_equal(kvf_engine_import_commit(eng, id, 7), KVF_OK);
    assert_int_equal(kvf_engine_request_info(eng, id, &info), KVF_OK);   /* held until done */
    for (int g = 0, done = 0; (g < info.blocks->num_groups) && !done; ++g) {
        if (info.blocks->num_blocks[g] >= nblocks) {   /* an attention group */
            memcpy(first_blocks, info.blocks->blocks[g], (size_t)nblocks * sizeof(int32_t));
            done = 1;
        }
    }
    while (kvf_engine_has_work(eng)) {
        assert_int_equal(kvf_engine_step(eng, ev, 64, &n), KVF_OK);
    }
    assert_int_equal(kvf_engine_request_info(eng, id, &info), KVF_OK);
    assert_int_equal(info.state, KVF_REQ_FINISHED);
    memcpy(seq, info.tokens, (size_t)info.num_tokens * sizeof(int32_t));
    n = info.num_tokens;
    assert_int_equal(kvf_engine_release(eng, id), KVF_OK);
    return n;
}

static void kvf_pi_run(const char *dir, bool hybrid)
{
    kvf_engine_h eng = kvf_pi_engine(dir);
    const uint64_t cls = kvf_engine_numerics_class(eng);
    const int B = kvf_block_manager_block_size(kvf_engine_block_manager(eng));
    static int32_t a[600], seq[700], seq2[800];
    int32_t blocks1[16], blocks2[16];
    kvf_engine_prefix_stats_t st;
    uint64_t id, queries = 0, hits = 0;
    int hit, len, n1 = 3 * B - 4, n2;   /* its outputs complete a third block */

    assert_true(cls != 0);
    assert_int_equal(cls, kvf_engine_numerics_class(eng));   /* stable */
    for (int i = 0; i < 600; ++i) {
        a[i] = 3 + (i * 37) % 250;
    }
    /* first import: nothing cached; its two full prompt blocks are kept at commit */
    assert_int_equal(kvf_pi_begin(eng, a, n1, cls, 8, &id), 0);
    queries += (uint64_t)n1;
    len = kvf_pi_finish(eng, id, seq, blocks1, 2);
    assert_int_equal(len, n1 + 8);

    /* its continuation from the same class: the two blocks, the same pool blocks; a dense
     * model of the engine's own class also kept the blocks its decode steps completed */
    memcpy(seq + len, a + 300, 100 * sizeof(int32_t));
    n2 = len + 100;
    hit = kvf_pi_begin(eng, seq, n2, cls, 4, &id);
    assert_int_equal(hit, hybrid ? 2 * B : (n1 + 7) / B * B);   /* the last output: no KV */
    assert_int_equal(hit % B, 0);
    queries += (uint64_t)n2;
    hits += (uint64_t)hit;
    (void)kvf_pi_finish(eng, id, seq2, blocks2, 2);
    assert_memory_equal(blocks1, blocks2, 2 * sizeof(int32_t));

    /* the same prompt as the first: at most its own full blocks (never past the prompt) */
    hit = kvf_pi_begin(eng, a, 2 * B, cls, 2, &id);
    assert_int_equal(hit, 2 * B);                     /* a full attention hit */
    queries += (uint64_t)(2 * B);
    hits += (uint64_t)hit;
    assert_int_equal(kvf_engine_abort(eng, id), KVF_OK);   /* aborted: nothing kept */
    assert_int_equal(kvf_engine_release(eng, id), KVF_OK);

    /* another class, and an unknown one: misses */
    assert_int_equal(kvf_pi_begin(eng, a, n1, cls ^ 1, 2, &id), 0);
    assert_int_equal(kvf_engine_release(eng, id), KVF_OK);
    assert_int_equal(kvf_pi_begin(eng, a + 1, n1, 0, 2, &id), 0);
    (void)kvf_pi_finish(eng, id, seq2, blocks2, 2);
    assert_int_equal(kvf_pi_begin(eng, a + 1, n1, cls, 2, &id), 0);   /* nothing was kept */
    assert_int_equal(kvf_engine_release(eng, id), KVF_OK);
    queries += 3 * (uint64_t)n1;

    kvf_engine_get_prefix_stats(eng, &st);
    assert_int_equal(st.imports, 6);
    assert_int_equal(st.import_unknown_source, 1);
    assert_int_equal(st.queries, queries);
    assert_int_equal(st.hits, hits);
    assert_int_equal(st.hit_attn_tokens, hits);
    assert_int_equal(st.pulled_tokens, queries - hits);
    assert_int_equal(st.hit_state_tokens, 0);          /* decode restores no checkpoint */
    kvf_engine_destroy(eng);
}

static void test_import_hybrid(void **state)
{
    (void)state;
    kvf_pi_run(g_hybrid, true);
}

static void test_import_dense(void **state)
{
    (void)state;
    kvf_pi_run(g_dense, false);
}

/*
 * A sliding-window pull zeroes prompt blocks after the hit (kvf_engine_import_zeroed()): the
 * commit indexes none of the prompt's blocks, so its repeat is a miss, even once its decode
 * steps completed a later block; zeroed tokens within the hit change nothing (kept as
 * always). Bad calls are refused.
 */
static void test_import_zeroed(void **state)
{
    kvf_engine_h eng = kvf_pi_engine(g_dense);
    const uint64_t cls = kvf_engine_numerics_class(eng);
    const int B = kvf_block_manager_block_size(kvf_engine_block_manager(eng));
    static int32_t a[600], seq[700], seq2[800];
    int32_t blocks[16];
    uint64_t id;
    const int n1 = 3 * B - 4;   /* its outputs complete a third block */
    (void)state;

    for (int i = 0; i < 600; ++i) {
        a[i] = 3 + (i * 41) % 250;
    }
    assert_int_equal(kvf_pi_begin(eng, a, n1, cls, 8, &id), 0);
    assert_int_equal(kvf_engine_import_zeroed(eng, id, n1 + 1), KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_engine_import_zeroed(eng, id, -1), KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_engine_import_zeroed(eng, id + 1000, B), KVF_ERR_NOT_FOUND);
    assert_int_equal(kvf_engine_import_zeroed(eng, id, B), KVF_OK);   /* block 0 zeroed */
    (void)kvf_pi_finish(eng, id, seq, blocks, 2);
    assert_int_equal(kvf_pi_begin(eng, a, n1, cls, 2, &id), 0);      /* nothing was kept */
    assert_int_equal(kvf_engine_import_zeroed(eng, id, 0), KVF_OK);   /* nothing zeroed */
    (void)kvf_pi_finish(eng, id, seq, blocks, 2);
    assert_int_equal(kvf_engine_import_commit(eng, id, 7), KVF_ERR_NOT_FOUND);
    /* now kept: a continuation's window starting inside the hit keeps its blocks too */
    memcpy(seq2, a, (size_t)n1 * sizeof(int32_t));
    memcpy(seq2 + n1, a + 300, 100 * sizeof(int32_t));
    assert_int_equal(kvf_pi_begin(eng, seq2, n1 + 100, cls, 2, &id), 2 * B);
    assert_int_equal(kvf_engine_import_zeroed(eng, id, B), KVF_OK);   /* within the hit */
    (void)kvf_pi_finish(eng, id, seq, blocks, 2);
    assert_int_equal(kvf_pi_begin(eng, seq2, n1 + 100, cls, 2, &id), (n1 + 100) / B * B);
    assert_int_equal(kvf_engine_release(eng, id), KVF_OK);
    kvf_engine_destroy(eng);
}

int main(void)
{
    const char *src = KVF_SOURCE_DIR;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_import_hybrid),
        cmocka_unit_test(test_import_dense),
        cmocka_unit_test(test_import_zeroed),
    };
    snprintf(g_hybrid, sizeof(g_hybrid), "%s/models-trained/tiny-hybrid", src);
    snprintf(g_dense, sizeof(g_dense), "%s/models-trained/tiny-dense", src);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
