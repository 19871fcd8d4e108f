/*
 * Batch invariance of the engine: a request's logits do not depend on what
 * else runs in its steps. The held-out questions of models-trained/tiny-hybrid
 * and a mix of long (300-520 tokens) and short (1-4 tokens) prompts are each
 * run alone (the reference, as `kvf generate` runs them), then together in
 * several batch compositions: all at once, reversed arrival, staggered
 * arrival, odd step budgets (so every prompt is chunked at other points),
 * few sequences per step, a pool small enough to preempt (recompute), two
 * kernel threads, and two compositions at TP 2 (against solo runs at TP 2).
 * Every generated token's logits must equal the solo run's BIT FOR BIT
 * (memcmp), not to a tolerance. On the code before issue 33's fix every
 * request differed (max |logit diff| 0.03 to 0.22).
 *
 * KVF_INVARIANCE_PICK=1,4 runs only those compositions (0-based, in the table's order).
 * KVF_INVARIANCE_DEVICE=cuda:0 runs the same check on a GPU engine (the
 * solo references then come from that device too); the cache dtypes are
 * `kvf generate`'s defaults for the model (KV bf16, conv state bf16, SSM
 * state fp32 for this checkpoint).
 * KVF_INVARIANCE_STATE_GRID=N sets the engine's state grid (scheduler chunks) and the
 * model's scan grid (kvf_model_set_state_grid, as the daemons do): on a GPU the Mamba2 /
 * Gated DeltaNet prompt scans are then chunked on it.
 * KVF_INVARIANCE_MODEL=DIR runs another checkpoint (kvf mkmodel's, e.g. a GQA group of 5);
 * the prompts stay tiny-hybrid's held-out questions, encoded by DIR's tokenizer.
 */
#include "kvf_model_test_util.h"
#include "kvf_geometry.h"
#include "kvf_model.h"
#include "kvf_tok_model.h"
#include "kvf_tokenizer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GEN       8      /* generated tokens per request */
#define MAXP      600    /* prompt capacity */
#define NHELD     24     /* held-out questions: every 12th line of the 300 */
#define NMIX      7      /* long and short prompts */
#define NREQ      (NHELD + NMIX)

typedef struct {
    int32_t ids[MAXP];
    int     n;
    int32_t toks[GEN];
    float  *logits[2];   /* [GEN][vocab], solo at TP 1 and TP 2 */
} kvf_case_t;

static char        g_dir[512];
static kvf_case_t  g_case[NREQ];
static int         g_vocab;
static kvf_device_t g_dev;

static kvf_engine_h kvf_inv_engine(int tp, int max_batch_tokens, int max_seqs, int num_blocks)
{
    kvf_engine_params_t ep = {0};
    kvf_model_config_t cfg;
    kvf_engine_h eng = NULL;
    const char *grid = getenv("KVF_INVARIANCE_STATE_GRID");

    assert_int_equal(kvf_model_config_load(g_dir, &cfg), KVF_OK);
    kvf_cache_params_default(&cfg, &ep.cache);       /* conv state: the model's dtype */
    ep.cache.kv_dtype = KVF_DTYPE_BF16;              /* kvf generate's default */
    ep.cache.ssm_dtype = cfg.ssm_cache_dtype;
    ep.field_mask = KVF_ENGINE_PARAM_FIELD_CACHE | KVF_ENGINE_PARAM_FIELD_NUM_BLOCKS |
                    KVF_ENGINE_PARAM_FIELD_MAX_BATCH_TOKENS | KVF_ENGINE_PARAM_FIELD_MAX_SEQS |
                    KVF_ENGINE_PARAM_FIELD_DEVICE;
    ep.model_dir = g_dir;
    ep.tp_size = tp;
    ep.num_blocks = num_blocks;
    ep.max_batch_tokens = max_batch_tokens;
    ep.max_seqs = max_seqs;
    ep.device = g_dev;
    if ((grid != NULL) && (grid[0] != '\0')) {   /* the scheduler's chunk grid too */
        ep.field_mask |= KVF_ENGINE_PARAM_FIELD_PREFIX;
        ep.prefix.state_grid = atoi(grid);
    }
    assert_int_equal(kvf_engine_create(&ep, &eng), KVF_OK);
    if ((grid != NULL) && (grid[0] != '\0')) {
        assert_int_equal(kvf_model_set_state_grid(kvf_tp_runner_model(kvf_engine_runner(eng)),
                                                  atoi(grid)), KVF_OK);
    }
    return eng;
}

/* TP degrees checked: 2 on the CPU; on a GPU 1 (rank r would need cuda:N+r). */
static int kvf_inv_max_tp(void)
{
    return (g_dev.kind == KVF_DEVICE_CPU) ? 2 : 1;
}

/* "prompt": "..." of one heldout.jsonl line (no escapes in that file). */
static int kvf_inv_prompt_of(const char *line, char *out, size_t cap)
{
    const char *p = strstr(line, "\"prompt\": \"");
    const char *e;
    if (p == NULL) {
        return -1;
    }
    p += strlen("\"prompt\": \"");
    e = strchr(p, '"');
    if ((e == NULL) || ((size_t)(e - p) >= cap)) {
        return -1;
    }
    memcpy(out, p, (size_t)(e - p));
    out[e - p] = '\0';
    return 0;
}

static int kvf_inv_setup(void **state)
{
    const char *devname = getenv("KVF_INVARIANCE_DEVICE");
    const char *src_dir = getenv("KVF_TEST_SOURCE_DIR");   /* a GPU bundle's src/ */
    const char *model = getenv("KVF_INVARIANCE_MODEL");
    char held[400];
    kvf_model_config_t cfg;
    kvf_tokenizer_t tok;
    kvf_tok_config_t tc;
    char path[600], line[4096], text[4096], all[8192];
    FILE *f;
    int li = 0, nh = 0;
    size_t alen = 0;

    (void)state;

    snprintf(held, sizeof(held), "%s/models-trained/tiny-hybrid",
             ((src_dir != NULL) && (src_dir[0] != '\0')) ? src_dir : KVF_SOURCE_DIR);
    snprintf(g_dir, sizeof(g_dir), "%s",
             ((model != NULL) && (model[0] != '\0')) ? model : held);
    g_dev = kvf_device_cpu();
    if ((devname != NULL) && (devname[0] != '\0')) {
        assert_int_equal(kvf_model_device_open("KVF_INVARIANCE_DEVICE", devname, &g_dev),
                         KVF_OK);
    }
    assert_int_equal(kvf_model_config_load(g_dir, &cfg), KVF_OK);
    g_vocab = cfg.vocab_size;
    tc = kvf_tok_config_of_model(&cfg);
    assert_int_equal(kvf_tokenizer_load(g_dir, &tc, &tok), KVF_OK);
    snprintf(path, sizeof(path), "%s/heldout.jsonl", held);
    f = fopen(path, "r");
    assert_non_null(f);
    all[0] = '\0';
    while ((fgets(line, sizeof(line), f) != NULL) && (nh < NHELD)) {
        if ((li++ % 12) != 0) {
            continue;
        }
        assert_int_equal(kvf_inv_prompt_of(line, text, sizeof(text)), 0);
        g_case[nh].n = kvf_tokenizer_encode(&tok, text, strlen(text), true, g_case[nh].ids,
                                            MAXP);
        assert_true(g_case[nh].n > 0);
        if (alen + strlen(text) + 2 < sizeof(all)) {
            alen += (size_t)snprintf(all + alen, sizeof(all) - alen, "%s\n", text);
        }
        ++nh;
    }
    fclose(f);
    assert_int_equal(nh, NHELD);
    /* long prompts: the questions run together, cut at 520, 512, 300 and 301 tokens */
    {
        static const int cut[4] = {520, 512, 300, 301};
        int32_t ids[2 * MAXP * 4];
        int n = kvf_tokenizer_encode(&tok, all, alen, true, ids, (int)(sizeof(ids) / 4));
        assert_true(n >= 520);
        for (int i = 0; i < 4; ++i) {
            kvf_case_t *c = &g_case[NHELD + i];
            const int32_t *src = ids + (i == 3 ? 40 : 0);    /* one starts elsewhere */
            c->ids[0] = ids[0];
            memcpy(c->ids + 1, src + 1, (size_t)(cut[i] - 1) * sizeof(int32_t));
            c->n = cut[i];
        }
    }
    /* short prompts: BOS alone, and two to four tokens */
    for (int i = 0; i < 3; ++i) {
        static const char *s[3] = {"", "rev", "add 1"};
        kvf_case_t *c = &g_case[NHELD + 4 + i];
        c->n = kvf_tokenizer_encode(&tok, s[i], strlen(s[i]), true, c->ids, MAXP);
        assert_true(c->n >= 1);
    }
    kvf_tokenizer_cleanup(&tok);

    /* the references: each request alone, as kvf generate runs it, at TP 1 and TP 2
     * (the bits are equal within one TP degree; across degrees the sums differ) */
    for (int tp = 1; tp <= kvf_inv_max_tp(); ++tp) {
        kvf_engine_h eng = kvf_inv_engine(tp, 512, 64, 256);
        for (int i = 0; i < NREQ; ++i) {
            float *lg = malloc((size_t)GEN * (size_t)g_vocab * sizeof(float));
            assert_non_null(lg);
            g_case[i].logits[tp - 1] = lg;
            kvf_test_greedy(eng, g_case[i].ids, g_case[i].n, GEN, g_case[i].toks, lg);
        }
        kvf_engine_destroy(eng);
    }
    return 0;
}

static int kvf_inv_teardown(void **state)
{
    (void)state;
    for (int i = 0; i < NREQ; ++i) {
        free(g_case[i].logits[0]);
        free(g_case[i].logits[1]);
    }
    return 0;
}

/* One batch composition. */
typedef struct {
    const char *name;
    int  max_batch_tokens, max_seqs, num_blocks;
    int  per_step;       /* requests admitted per step (0: all before the first step) */
    bool reverse;        /* admit in reverse order */
    int  blas_threads;   /* KVF_BLAS_THREADS of the engine (0: unset) */
    int  stride, first;  /* held-out questions first, first + stride, ... (0: all) */
    bool preempts;       /* the pool is small enough that some request must be recomputed */
    int  tp;             /* 0: 1 */
} kvf_comp_t;

/* Runs @a c, compares every request's logits with its solo run; returns the
 * number of requests whose logits differ in any bit. */
static int kvf_inv_run(const kvf_comp_t *c)
{
    kvf_engine_h eng;
    kvf_engine_event_t ev[512];
    uint64_t ids[NREQ];
    int order[NREQ], nsel = 0, added = 0, bad = 0, flips = 0, guard = 0;
    double maxd = 0.0;
    char env[16];
    kvf_engine_stats_t st;
    const int tp = (c->tp > 0) ? c->tp : 1;

    for (int k = 0; k < NREQ; ++k) {
        if ((c->stride == 0) || ((k % c->stride) == c->first) || (k >= NHELD)) {
            order[nsel++] = k;
        }
    }
    if (c->reverse) {
        for (int a = 0, b = nsel - 1; a < b; ++a, --b) {
            int t = order[a];
            order[a] = order[b];
            order[b] = t;
        }
    }
    if (c->blas_threads > 0) {
        snprintf(env, sizeof(env), "%d", c->blas_threads);
        setenv("KVF_BLAS_THREADS", env, 1);
    }
    eng = kvf_inv_engine(tp, c->max_batch_tokens, c->max_seqs, c->num_blocks);
    unsetenv("KVF_BLAS_THREADS");
    while ((added < nsel) || kvf_engine_has_work(eng)) {
        int ne, admit = (c->per_step > 0) ? c->per_step : nsel;
        for (int k = 0; (k < admit) && (added < nsel); ++k, ++added) {
            kvf_req_params_t rp = {0};
            const kvf_case_t *kc = &g_case[order[added]];
            rp.prompt = kc->ids;
            rp.prompt_len = kc->n;
            rp.sampling.max_tokens = GEN;
            rp.sampling.ignore_eos = true;
            rp.record_logits = true;
            assert_int_equal(kvf_engine_add_request(eng, &rp, &ids[added]), KVF_OK);
        }
        assert_int_equal(kvf_engine_step(eng, ev, 512, &ne), KVF_OK);
        assert_true(++guard < 100000);
    }
    for (int k = 0; k < nsel; ++k) {
        const kvf_case_t *kc = &g_case[order[k]];
        const float *solo = kc->logits[tp - 1];
        kvf_req_info_t info;
        assert_int_equal(kvf_engine_request_info(eng, ids[k], &info), KVF_OK);
        assert_int_equal(info.state, KVF_REQ_FINISHED);
        assert_int_equal(info.num_logits, GEN);
        if (memcmp(info.logits, solo, (size_t)GEN * (size_t)g_vocab * sizeof(float)) != 0) {
            int first = -1;
            for (int t = 0; t < GEN; ++t) {
                for (int v = 0; v < g_vocab; ++v) {
                    size_t i = (size_t)t * (size_t)g_vocab + (size_t)v;
                    double d = fabs((double)info.logits[i] - (double)solo[i]);
                    if ((d != 0.0) || (isnan(info.logits[i]) != isnan(solo[i]))) {
                        first = (first < 0) ? t : first;
                    }
                    maxd = (d > maxd) ? d : maxd;
                }
            }
            for (int t = 0; t < GEN; ++t) {
                if (info.tokens[info.prompt_len + t] != kc->toks[t]) {
                    ++flips;
                    printf("  %s: request %d (%d prompt tokens): token %d is %d, alone %d\n",
                           c->name, order[k], kc->n, t, info.tokens[info.prompt_len + t],
                           kc->toks[t]);
                    break;
                }
            }
            if (bad < 3) {
                printf("  %s: request %d (%d prompt tokens): logits differ from token %d on\n",
                       c->name, order[k], kc->n, first);
            }
            ++bad;
        }
    }
    kvf_engine_get_stats(eng, &st);
    printf("%-34s %2d requests, %3llu steps, %2llu preemptions: %2d differ from their solo run "
           "(max |logit diff| %.3g, %d with other tokens)\n", c->name, nsel,
           (unsigned long long)st.steps, (unsigned long long)st.preemptions, bad, maxd, flips);
    fflush(stdout);
    if (c->preempts) {
        assert_true(st.preemptions > 0);
    }
    kvf_engine_destroy(eng);
    return bad;
}

/* Whether comma list @a pick names composition @a i. */
static bool kvf_inv_picked(const char *pick, int i)
{
    for (const char *p = pick; *p != '\0';) {
        char *e;
        long v = strtol(p, &e, 10);
        if (e == p) {
            return false;
        }
        if (v == i) {
            return true;
        }
        p = (*e == ',') ? e + 1 : e;
    }
    return false;
}

static void test_batch_compositions(void **state)
{
    static const kvf_comp_t comps[] = {
        {"all at once, budget 512", 512, 64, 256, 0, false, 0, 0, 0, false, 0},
        {"reversed, budget 128, 8 per step", 128, 8, 256, 0, true, 0, 0, 0, false, 0},
        {"staggered 3 per step, budget 97", 97, 64, 256, 3, false, 0, 0, 0, false, 0},
        {"a third, budget 40", 40, 64, 256, 1, false, 0, 3, 1, false, 0},
        {"small pool (preemption), 61", 61, 16, 24, 2, false, 0, 0, 0, true, 0},
        {"two kernel threads, budget 300", 300, 64, 256, 0, true, 2, 2, 0, false, 0},
        {"tp 2, all at once, budget 97", 97, 64, 256, 0, false, 0, 0, 0, false, 2},
        {"tp 2, reversed, a third, budget 40", 40, 64, 256, 1, true, 0, 3, 2, false, 2},
    };
    const char *pick = getenv("KVF_INVARIANCE_PICK");   /* "1,4": only these (0-based) */
    int bad = 0;

    (void)state;
    for (size_t i = 0; i < sizeof(comps) / sizeof(comps[0]); ++i) {
        if ((pick != NULL) && (pick[0] != '\0') && !kvf_inv_picked(pick, (int)i)) {
            continue;
        }
        if (comps[i].tp > kvf_inv_max_tp()) {
            printf("%-34s skipped on %s (one device)\n", comps[i].name,
                   kvf_device_kind_name(g_dev.kind));
            continue;
        }
        bad += kvf_inv_run(&comps[i]);
    }
    assert_int_equal(bad, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batch_compositions),
    };
    return cmocka_run_group_tests(tests, kvf_inv_setup, kvf_inv_teardown);
}
