/*
 * Blocks that leave a sliding window are given back (docs/ARCHITECTURE.md §7): the mistral
 * checkpoint transformers saved (tests/data/families/mistral-swa: both layers slide, W 40),
 * block 16, one request of a 60-token prompt generating 300 tokens greedily. The blocks the
 * instance uses stay within the window's (ceil(W / B) + 1, the block being written and the
 * zero block standing for the freed ones) at every step, where an engine that keeps them
 * (keep_window_blocks) ends holding ceil(360 / 16) = 23; the tokens are the same bits. With
 * the prefix cache on, the prompt's blocks it indexed while prefilling stay cached through
 * the release (their references): the same prompt asked again is served them and answers
 * the same tokens. The same for the checkpoints mixing full and sliding layers (gpt-oss and
 * gemma3-swa, layers [S, F, S], W 40): their sliding layers sit in cache groups of their own
 * (KVF_GROUP_SLIDING) whose blocks are given back as they leave the window, while the full
 * group keeps every block: at most ceil(360 / 16) full blocks plus the window's sliding ones.
 */
#include "kvf_model_test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { PROMPT = 60, OUT = 300, BS = 16, W = 40, NB = 128 };

static char g_dir[512];

static kvf_engine_h wf_engine(bool keep, bool prefix)
{
    kvf_engine_params_t ep = {0};
    kvf_model_config_t cfg;
    kvf_engine_h eng = NULL;

    assert_int_equal(kvf_model_config_load(g_dir, &cfg), KVF_OK);
    assert_int_equal(cfg.sliding_window, W);   /* mistral-swa, gpt-oss, gemma3-swa */
    kvf_cache_params_default(&cfg, &ep.cache);
    ep.cache.kv_dtype = KVF_DTYPE_FP32;
    ep.cache.block_size = BS;
    ep.field_mask = KVF_ENGINE_PARAM_FIELD_CACHE | KVF_ENGINE_PARAM_FIELD_NUM_BLOCKS |
                    (prefix ? KVF_ENGINE_PARAM_FIELD_PREFIX : 0);
    ep.model_dir = g_dir;
    ep.tp_size = 1;
    ep.num_blocks = NB;
    ep.keep_window_blocks = keep;
    ep.prefix.enabled = prefix;
    ep.prefix.state_grid = 64;
    assert_int_equal(kvf_engine_create(&ep, &eng), KVF_OK);
    assert_int_equal(kvf_block_manager_block_size(kvf_engine_block_manager(eng)), BS);
    return eng;
}

/* Generate @a nout tokens after @a prompt; @a out gets them, @return the most blocks in use
 * at any step. */
static int wf_gen(kvf_engine_h eng, const int32_t *prompt, int plen, int nout, int32_t *out)
{
    kvf_block_manager_h bm = kvf_engine_block_manager(eng);
    kvf_engine_event_t ev[64];
    kvf_req_params_t rp = {0};
    kvf_req_info_t info;
    uint64_t id;
    int n, most = 0;

    rp.prompt = prompt;
    rp.prompt_len = plen;
    rp.sampling.max_tokens = nout;
    rp.sampling.temperature = 0;
    rp.sampling.ignore_eos = true;
    assert_int_equal(kvf_engine_add_request(eng, &rp, &id), KVF_OK);
    while (kvf_engine_has_work(eng)) {
        assert_int_equal(kvf_engine_step(eng, ev, 64, &n), KVF_OK);
        const int used = kvf_block_manager_num_blocks(bm) - kvf_block_manager_num_free(bm);
        most = (used > most) ? used : most;
    }
    assert_int_equal(kvf_engine_request_info(eng, id, &info), KVF_OK);
    assert_int_equal(info.num_tokens, plen + nout);
    memcpy(out, info.tokens + plen, (size_t)nout * sizeof(int32_t));
    assert_int_equal(kvf_engine_release(eng, id), KVF_OK);
    /* idle: every block free again (or cached), the zero block too */
    assert_int_equal(kvf_block_manager_num_free(bm), kvf_block_manager_num_blocks(bm));
    return most;
}

/* The 60-token prompt, 300 outputs. */
static int wf_run(kvf_engine_h eng, int32_t *out)
{
    int32_t prompt[PROMPT];

    for (int i = 0; i < PROMPT; ++i) {
        prompt[i] = 3 + (i * 37) % 250;
    }
    return wf_gen(eng, prompt, PROMPT, OUT, out);
}

/*
 * The next turn of the conversation: the prompt, 250 of its outputs and 4 new tokens. The
 * engine that ran the first turn indexed the outputs' blocks as they completed, their
 * sliding blocks given back since (-1 in the index): the hit needs only the window's, so it
 * serves most of the 314 tokens, and the 100 tokens generated equal a cache-off engine's.
 * With @a filler, another 400-token prompt first takes more blocks than are free, so the
 * pool evicts the least recently freed cached blocks: the sliding blocks the first turn gave
 * back earliest. A model with a full group keeps serving the hit from its full blocks and
 * the window's sliding ones, the evicted entries fresh zero blocks (never read).
 */
static void wf_next_turn(kvf_engine_h eng, const int32_t *first, bool filler)
{
    enum { KEEP = 250, NEW = 4, N2 = 100, P2 = PROMPT + KEEP + NEW };
    static int32_t a[N2], b[N2];
    int32_t prompt[P2];
    kvf_engine_prefix_stats_t before, after;

    for (int i = 0; i < PROMPT; ++i) {
        prompt[i] = 3 + (i * 37) % 250;
    }
    memcpy(prompt + PROMPT, first, KEEP * sizeof(int32_t));
    for (int i = 0; i < NEW; ++i) {
        prompt[PROMPT + KEEP + i] = 7 + i;
    }
    if (filler) {
        enum { NF = 400 };
        int32_t fp[NF], fo[1];
        for (int i = 0; i < NF; ++i) {
            fp[i] = 5 + (i * 53) % 240;
        }
        (void)wf_gen(eng, fp, NF, 1, fo);
    }
    kvf_engine_get_prefix_stats(eng, &before);
    if (filler) {
        print_message("filler: %llu cached blocks evicted\n",
                      (unsigned long long)before.blocks_evicted);
        assert_true(before.blocks_evicted > 0);
    }
    (void)wf_gen(eng, prompt, P2, N2, a);
    kvf_engine_get_prefix_stats(eng, &after);
    print_message("next turn: %llu of %d prompt tokens from the prefix cache\n",
                  (unsigned long long)(after.hits - before.hits), P2);
    assert_true(after.hits - before.hits >= (uint64_t)((PROMPT + KEEP) / BS * BS - BS));
    kvf_engine_h off = wf_engine(false, false);
    (void)wf_gen(off, prompt, P2, N2, b);
    kvf_engine_destroy(off);
    assert_memory_equal(a, b, sizeof(a));
}

/* The model in g_dir: its full and sliding cache groups. */
static void wf_groups(int *full_p, int *sliding_p)
{
    kvf_model_config_t cfg;
    kvf_cache_layout_t lay;

    assert_int_equal(kvf_model_config_load(g_dir, &cfg), KVF_OK);
    assert_int_equal(kvf_cache_layout_build(&cfg, &lay), KVF_OK);
    *full_p = *sliding_p = 0;
    for (int g = 0; g < lay.num_groups; ++g) {
        *full_p += (lay.groups[g].kind == KVF_GROUP_ATTENTION);
        *sliding_p += (lay.groups[g].kind == KVF_GROUP_SLIDING);
        assert_int_equal(lay.groups[g].window, (lay.groups[g].kind == KVF_GROUP_SLIDING) ? W : 0);
    }
}

static void window_free_bounded(const char *family)
{
    static int32_t a[OUT], b[OUT], c[OUT];
    kvf_engine_stats_t st;
    int full = 0, sliding = 0;
    const int all = (PROMPT + OUT + BS - 1) / BS;

    snprintf(g_dir, sizeof(g_dir), "%s/tests/data/families/%s", KVF_SOURCE_DIR, family);
    wf_groups(&full, &sliding);
    assert_true(sliding > 0);
    /* each sliding group: the window, the block written; the full groups: everything; and
     * the one zero block */
    const int bound = sliding * ((W + BS - 1) / BS + 1 + 1) + full * all + 1;

    kvf_engine_h keep = wf_engine(true, false);
    const int most_keep = wf_run(keep, a);
    kvf_engine_get_stats(keep, &st);
    assert_int_equal(st.window_freed_blocks, 0);
    kvf_engine_destroy(keep);

    kvf_engine_h eng = wf_engine(false, true);
    const int most = wf_run(eng, b);
    kvf_engine_get_stats(eng, &st);
    const kvf_cache_layout_t *lay = kvf_tp_runner_layout(kvf_engine_runner(eng));
    const size_t block_bytes = (size_t)lay->slots *
                               kvf_tp_runner_geometry(kvf_engine_runner(eng), 0)->page_size;
    print_message("%s (%d full, %d sliding groups, %zu bytes a block): blocks in use at most:"
                  " %d = %zu bytes given back (bound %d, %llu freed), %d = %zu bytes kept\n",
                  family, full, sliding, block_bytes, most, (size_t)most * block_bytes, bound,
                  (unsigned long long)st.window_freed_blocks, most_keep,
                  (size_t)most_keep * block_bytes);
    assert_int_equal(most_keep, (full + sliding) * all);
    assert_true(most <= bound);
    assert_true(st.window_freed_blocks >=
                (uint64_t)sliding * (uint64_t)((PROMPT + OUT - W) / BS - 1));
    assert_memory_equal(a, b, sizeof(a));
    /* the prompt's blocks the cache indexed survived the release: a hit, the same tokens */
    kvf_engine_prefix_stats_t ps;
    (void)wf_run(eng, c);
    kvf_engine_get_prefix_stats(eng, &ps);
    print_message("second run: %llu prompt tokens from the prefix cache\n",
                  (unsigned long long)ps.hits);
    assert_true(ps.hits >= (uint64_t)(PROMPT / BS * BS) - BS);
    assert_memory_equal(a, c, sizeof(a));
    wf_next_turn(eng, a, full > 0);
    kvf_engine_destroy(eng);
}

static void test_window_free_bounded(void **state)
{
    (void)state;
    window_free_bounded("mistral-swa");
}

/* gpt-oss and gemma3 mix full and sliding layers: only the sliding groups give blocks back */
static void test_window_free_mixed(void **state)
{
    (void)state;
    window_free_bounded("gpt-oss");
    window_free_bounded("gemma3-swa");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_window_free_bounded),
        cmocka_unit_test(test_window_free_mixed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
