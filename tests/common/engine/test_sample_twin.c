/*
 * The device sampler's CPU twin (kernels/kvf_sample.h: threshold searches, as the CUDA
 * kernel runs them) against the host sampler (common/engine/kvf_sampler.h: a sort), on the
 * same logits and generator state: the token, the logprob and every top logprob equal BIT
 * FOR BIT (memcmp), and the generator advanced alike, over thousands of random cases:
 * vocabularies from 1 to 2500 ids (below, at and above the lane count), logits with ties,
 * -inf, -0/+0 and wide ranges, every parameter in vLLM's ranges (temperature incl. greedy,
 * top_k -1/0/1/k/>vocab, top_p off/on, min_p, the three penalties, min_tokens with EOS and
 * stop ids, ignore_eos, logprobs 0..20). Prints how many cases exercised each filter, so
 * a generator that stopped reaching a branch shows. Also: kvf_sample_exp_hd() within 2 ulp
 * of libm's exp, and the staged call (kvf_sample_batch) equal to the direct one and to each
 * row sampled alone.
 */
#include "kvf_sampler.h"
#include "kvf_sample_batch.h"
#include "kvf_sample_math.h"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CASES  6000
#define MAXV   2500
#define MAXTOK 48

static uint64_t g_rng = 0x2545f4914f6cdd1dull;

static uint64_t rnd64(void)
{
    return kvf_sample_rng_next_hd(&g_rng);
}

static double rndu(void)
{
    return kvf_sample_uniform_hd(rnd64());
}

static int rndi(int lo, int hi)   /* [lo, hi] */
{
    return lo + (int)(rnd64() % (uint64_t)(hi - lo + 1));
}

static void fill_logits(float *l, int v)
{
    int kind = rndi(0, 5);
    double scale = 0.05 + 20.0 * rndu();

    for (int i = 0; i < v; ++i) {
        double g = (rndu() + rndu() + rndu() - 1.5) * 2.0 * scale;
        switch (kind) {
        case 0: l[i] = (float)g; break;
        case 1: l[i] = (float)(round(g * 2.0) / 2.0); break;      /* many ties */
        case 2: l[i] = (float)(round(g)); break;                  /* -0 and +0 too */
        case 3: l[i] = (rndu() < 0.3) ? -INFINITY : (float)g; break;
        case 4: l[i] = (float)(g * 50.0); break;                  /* peaked */
        default: l[i] = (rndu() < 0.9) ? -INFINITY : (float)(round(g * 4.0) / 4.0); break;
        }
        if ((kind == 2) && (l[i] == 0.0f) && (rndu() < 0.5)) {
            l[i] = -0.0f;
        }
    }
    if (rndu() < 0.05) {   /* all -inf but one */
        for (int i = 0; i < v; ++i) {
            l[i] = -INFINITY;
        }
        l[rndi(0, v - 1)] = 1.0f;
    }
}

/* logit_bias (distinct ids), allowed_token_ids, bad_words over a few small ids, so the
 * random histories complete them often. */
static void rnd_lists(kvf_sampling_t *s, int v)
{
    int hi = (v < 4) ? v - 1 : 3;

    if (rndu() < 0.3) {
        int n = rndi(1, (v < 5) ? v : 5);
        for (int i = 0; i < n; ++i) {   /* distinct ids: i * 7 + [0, 6] modulo a vocab >= n */
            float big = (rndu() < 0.5) ? -100.0f : 100.0f;
            s->bias_ids[i] = (int32_t)((i * 7 + ((v >= 7 * n) ? rndi(0, 6) : 0)) % v);
            s->bias_values[i] = (rndu() < 0.3) ? big : (float)(20.0 * rndu() - 10.0);
        }
        s->num_logit_bias = n;
    }
    if (rndu() < 0.2) {
        s->num_allowed = rndi(1, 10);
        for (int i = 0; i < s->num_allowed; ++i) {
            s->allowed_ids[i] = rndi(0, v - 1);
        }
    }
    if (rndu() < 0.3) {
        int end = 0;
        s->num_bad_words = rndi(1, 4);
        for (int w = 0; w < s->num_bad_words; ++w) {
            int len = rndi(1, 3);
            for (int i = 0; i < len; ++i) {
                s->bad_tokens[end++] = rndi(0, hi);
            }
            s->bad_ends[w] = end;
        }
    }
}

static kvf_sampling_t rnd_params(int v)
{
    static const float temps[] = {0.0f, 1e-6f, 0.05f, 0.3f, 0.7f, 1.0f, 1.0f, 1.5f, 2.0f};
    kvf_sampling_t s;

    memset(&s, 0, sizeof(s));
    s.temperature = temps[rndi(0, 8)];
    s.max_tokens = 64;
    switch (rndi(0, 3)) {
    case 0: s.top_p = 0.0f; break;
    case 1: s.top_p = 1.0f; break;
    default: s.top_p = (float)(0.01 + 0.98 * rndu()); break;
    }
    switch (rndi(0, 5)) {
    case 0: s.top_k = -1; break;
    case 1: s.top_k = 0; break;
    case 2: s.top_k = 1; break;
    case 3: s.top_k = v + rndi(0, 2); break;
    default: s.top_k = rndi(1, (v < 40) ? v : 40); break;
    }
    s.min_p = (rndu() < 0.6) ? 0.0f : (float)rndu();
    if (rndu() < 0.5) {
        s.presence_penalty = (float)(4.0 * rndu() - 2.0);
        s.frequency_penalty = (float)(4.0 * rndu() - 2.0);
        s.repetition_penalty = (rndu() < 0.3) ? 0.0f : (float)(0.1 + 1.9 * rndu());
    }
    s.ignore_eos = rndu() < 0.2;
    if (rndu() < 0.4) {
        s.min_tokens = rndi(0, 30);
        s.num_stop_token_ids = rndi(0, 3);
        for (int i = 0; i < s.num_stop_token_ids; ++i) {
            s.stop_token_ids[i] = rndi(0, v - 1);
        }
    }
    s.want_logprobs = rndu() < 0.7;
    s.logprobs = s.want_logprobs ? rndi(0, KVF_SAMPLING_MAX_LOGPROBS) : 0;
    rnd_lists(&s, v);
    return s;
}

static int same_f(float a, float b)
{
    return memcmp(&a, &b, sizeof(a)) == 0;
}

static void test_twin_equals_sampler(void **state)
{
    float *l = malloc(MAXV * sizeof(float)), *scratch = malloc(MAXV * sizeof(float));
    kvf_sample_pen_t *pen = malloc((MAXTOK + 4 + KVF_SAMPLING_MAX_STOP_IDS + 32) * sizeof(*pen));
    int n_sampled = 0, n_topk = 0, n_topp = 0, n_minp = 0, n_pen = 0, n_mask = 0, n_lp = 0;
    int n_big = 0, n_notmax = 0, n_lists = 0;
    char err[160];

    (void)state;
    assert_non_null(l);
    assert_non_null(scratch);
    assert_non_null(pen);
    for (int c = 0; c < CASES; ++c) {
        static const int vs[] = {1, 2, 3, 12, 100, 511, 512, 513, 1025, 2500};
        int v = vs[rndi(0, 9)], prompt_len = rndi(0, 16), n = prompt_len + rndi(0, 32);
        int32_t toks[MAXTOK];
        int hi = (v < 4) ? v - 1 : 3;
        int eos[2] = {rndi(0, v - 1), rndi(0, v - 1)}, num_eos = rndi(0, 2), npen = 0;
        kvf_sampling_t s = rnd_params(v);
        uint64_t seed = rnd64(), ra = seed, rb = seed;
        kvf_sample_out_t a, b;
        kvf_sample_row_t row;
        kvf_sample_res_t res;

        fill_logits(l, v);
        for (int i = 0; i < n; ++i) {   /* outputs often of bad_words' small ids */
            toks[i] = ((i >= prompt_len) && (rndu() < 0.5)) ? rndi(0, hi) : rndi(0, v - 1);
        }
        n_lists += (s.num_logit_bias > 0) || (s.num_allowed > 0) || (s.num_bad_words > 0);
        s.min_tokens = (s.min_tokens > s.max_tokens) ? s.max_tokens : s.min_tokens;
        if (kvf_sampling_check(&s, v, err, sizeof(err)) != KVF_OK) {
            fail_msg("case %d: the generator made bad parameters: %s", c, err);
        }
        assert_int_equal(kvf_sampler_sample(&s, &ra, toks, prompt_len, n, l, v, eos, num_eos,
                                            &a), KVF_OK);
        assert_int_equal(kvf_sampler_device_row(&s, &rb, toks, prompt_len, n, v, eos, num_eos,
                                                &row, pen, &npen), KVF_OK);
        assert_int_equal(kvf_sample_rows(NULL, l, 1, v, v, &row, pen, npen, scratch, &res),
                         KVF_KERN_OK);
        kvf_sampler_device_out(&s, &res, &b);
        if ((a.token != b.token) || (ra != rb)) {
            fail_msg("case %d (vocab %d, T %g, top_k %d, top_p %g, min_p %g, pen %d): token "
                     "%d vs the twin's %d, rng %s", c, v, (double)s.temperature, s.top_k,
                     (double)s.top_p, (double)s.min_p, row.pen_count, a.token, b.token,
                     (ra == rb) ? "same" : "differs");
        }
        if (s.want_logprobs) {
            if (!same_f(a.logprob, b.logprob) || (a.num_top != b.num_top)) {
                fail_msg("case %d: logprob %.9g vs %.9g, num_top %d vs %d", c,
                         (double)a.logprob, (double)b.logprob, a.num_top, b.num_top);
            }
            for (int k = 0; k < a.num_top; ++k) {
                if ((a.top_ids[k] != b.top_ids[k]) ||
                    !same_f(a.top_logprobs[k], b.top_logprobs[k])) {
                    fail_msg("case %d: top %d: %d:%.9g vs %d:%.9g", c, k, a.top_ids[k],
                             (double)a.top_logprobs[k], b.top_ids[k],
                             (double)b.top_logprobs[k]);
                }
            }
            n_lp += (a.num_top > 0);
        }
        if (s.temperature >= KVF_SAMPLE_GREEDY_EPS) {
            n_sampled++;
            n_topk += (s.top_k > 0) && (s.top_k < v);
            n_topp += (s.top_p > 0.0f) && (s.top_p < 1.0f);
            n_minp += (s.min_p > 0.0f);
            n_big += (v > KVF_SAMPLE_LANES);
            {   /* the twin left the penalised logits in scratch: was it a real draw? */
                int best = 0;
                for (int i = 1; i < v; ++i) {
                    best = (scratch[i] > scratch[best]) ? i : best;
                }
                n_notmax += (a.token != best);
            }
        }
        n_pen += (row.pen_count > 0);
        n_mask += (n - prompt_len < s.min_tokens);
    }
    printf("%d cases equal bit for bit: %d sampled (%d with top_k cutting, %d top_p, %d min_p, "
           "%d vocab > %d lanes), %d with penalty/mask entries, %d below min_tokens, %d with "
           "top logprobs, %d draws other than the argmax, %d with logit_bias / allowed_token_ids / "
           "bad_words\n", CASES, n_sampled, n_topk, n_topp, n_minp, n_big, KVF_SAMPLE_LANES,
           n_pen, n_mask, n_lp, n_notmax, n_lists);
    assert_true(n_lists > CASES / 3);
    assert_true(n_sampled > CASES / 2);
    assert_true((n_topk > 500) && (n_topp > 500) && (n_minp > 500) && (n_big > 300));
    assert_true((n_pen > 1000) && (n_lp > 1000) && (n_notmax > 100));
    free(l);
    free(scratch);
    free(pen);
}

/* The sampler's exponential: libm's within 2 ulp on its range, exact at 0, 0 at -inf. */
static void test_exp(void **state)
{
    double worst = 0.0;

    (void)state;
    assert_true(kvf_sample_exp_hd(0.0) == 1.0);
    assert_true(kvf_sample_exp_hd(-INFINITY) == 0.0);
    assert_true(kvf_sample_exp_hd(-800.0) == 0.0);
    assert_true(isnan(kvf_sample_exp_hd(NAN)));
    for (int i = 0; i < 2000000; ++i) {
        double x = (i < 1000000) ? -707.0 * rndu() : -2.0 * rndu();
        double a = kvf_sample_exp_hd(x), b = exp(x);
        double ulp = fabs(a - b) / (nextafter(b, INFINITY) - b);
        worst = (ulp > worst) ? ulp : worst;
    }
    printf("kvf_sample_exp_hd: at most %.2f ulp from libm's exp over 2e6 points in [-707, 0]\n",
           worst);
    assert_true(worst <= 2.0);
}

/* kvf_sample_batch() (the engine's call: staged parameters) gives kvf_sample_rows()'s rows. */
static void test_batch(void **state)
{
    enum { R = 5, V = 700 };
    float *l = malloc((size_t)R * V * sizeof(float)), *scratch = malloc((size_t)R * V * 4);
    kvf_sample_row_t rows[R];
    kvf_sample_pen_t pen[3] = {{3, 2, KVF_SAMPLE_PEN_SEEN | KVF_SAMPLE_PEN_BIAS |
                                       KVF_SAMPLE_PEN_ALLOW, 3.5f},
                               {9, 0, KVF_SAMPLE_PEN_MASK | KVF_SAMPLE_PEN_ALLOW, 0.0f},
                               {11, 1, KVF_SAMPLE_PEN_SEEN | KVF_SAMPLE_PEN_MASK, 0.0f}};
    kvf_sample_res_t a[R], b[R];
    kvf_sample_ws_t *ws = NULL;

    (void)state;
    for (int r = 0; r < R; ++r) {
        fill_logits(l + (size_t)r * V, V);
        rows[r] = (kvf_sample_row_t){.temperature = 0.8f, .top_p = 0.9f, .top_k = 50,
                                     .rep = 1.3f, .freq = 0.5f, .want_logprobs = 1,
                                     .num_top = 5, .pen_start = 0, .pen_count = 3,
                                     .allow_only = (r == 2), .draw = rnd64()};
    }
    assert_int_equal(kvf_sample_rows(NULL, l, R, V, V, rows, pen, 3, scratch, a), KVF_KERN_OK);
    assert_int_equal(kvf_sample_batch(NULL, &ws, l, R, V, V, rows, pen, 3, b), KVF_KERN_OK);
    assert_memory_equal(a, b, sizeof(a));
    for (int r = 0; r < R; ++r) {
        kvf_sample_res_t alone;
        assert_true((a[r].token != 9) && (a[r].token != 11));   /* masked */
        assert_true((r != 2) || (a[r].token == 3));   /* allow-only: 3 (9 is masked) */
        /* a row's result does not depend on its neighbours (batch invariance) */
        assert_int_equal(kvf_sample_rows(NULL, l + (size_t)r * V, 1, V, V, &rows[r], pen, 3,
                                         scratch, &alone), KVF_KERN_OK);
        assert_memory_equal(&alone, &a[r], sizeof(alone));
    }
    rows[1].pen_count = 4;   /* past the entries given: refused */
    assert_int_equal(kvf_sample_batch(NULL, &ws, l, R, V, V, rows, pen, 3, b), KVF_KERN_EINVAL);
    rows[1].pen_count = 3;
    rows[2].num_top = KVF_SAMPLE_MAX_TOP + 1;
    assert_int_equal(kvf_sample_rows(NULL, l, R, V, V, rows, pen, 3, scratch, a), KVF_KERN_EINVAL);
    rows[2].num_top = 3;
    rows[3].pen_start = 2;   /* 2 + 3 entries of 3 */
    assert_int_equal(kvf_sample_rows(NULL, l, R, V, V, rows, pen, 3, scratch, a), KVF_KERN_EINVAL);
    kvf_sample_ws_destroy(ws);
    free(l);
    free(scratch);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_twin_equals_sampler),
        cmocka_unit_test(test_exp),
        cmocka_unit_test(test_batch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
