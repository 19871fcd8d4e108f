/*
 * The sampler (common/engine/kvf_sampler.h) against a reference written here from
 * vLLM's documented formulas, on the same logits: the penalised logits exactly,
 * the set each filter keeps exactly (top-k with ties, top-p, min-p, min_tokens'
 * masks), and sampled frequencies within 5 sigma of the reference distribution
 * (printed with figures); greedy ties; seeds; logprobs of the raw logits; the
 * range checks, each naming its field.
 */
#include "kvf_sampler.h"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define V 12

static const float base[V] = {2.0f, 1.5f, 1.5f, 0.5f, -0.25f, 3.0f, -1.0f, 0.0f, 1.0f, 2.5f,
                              -2.0f, 0.75f};

static kvf_sampling_t params(float t)
{
    kvf_sampling_t s;

    memset(&s, 0, sizeof(s));
    s.temperature = t;
    s.max_tokens = 16;
    return s;
}

/* allowed_token_ids leaves @a i out, or a bad word ends with i and the outputs end with the
 * rest of it. */
static bool list_masked(const kvf_sampling_t *s, const int32_t *toks, int prompt_len, int n,
                        int i)
{
    bool allowed = (s->num_allowed == 0);

    for (int e = 0; e < s->num_allowed; ++e) {
        allowed |= (s->allowed_ids[e] == i);
    }
    for (int w = 0, start = 0; w < s->num_bad_words; start = s->bad_ends[w++]) {
        int len = s->bad_ends[w] - start, k = 0;
        if ((s->bad_tokens[s->bad_ends[w] - 1] != i) || (len - 1 > n - prompt_len)) {
            continue;
        }
        while ((k < len - 1) && (toks[n - (len - 1) + k] == s->bad_tokens[start + k])) {
            ++k;
        }
        if (k == len - 1) {
            return true;
        }
    }
    return !allowed;
}

/* Reference: the distribution over V after penalties, temperature and the filters. */
static void reference(const kvf_sampling_t *s, const int32_t *toks, int prompt_len, int n,
                      const int *eos, int num_eos, double *p)
{
    double l[V], w[V], sum = 0.0, mx = -INFINITY;
    int order[V];
    float rep = (s->repetition_penalty != 0.0f) ? s->repetition_penalty : 1.0f;

    for (int i = 0; i < V; ++i) {
        int count = 0, seen = 0;
        for (int k = 0; k < n; ++k) {
            seen |= (toks[k] == i);
            count += (k >= prompt_len) && (toks[k] == i);
        }
        l[i] = base[i];
        for (int e = 0; e < s->num_logit_bias; ++e) {   /* vLLM: bias before penalties */
            l[i] += (s->bias_ids[e] == i) ? s->bias_values[e] : 0.0f;
        }
        if (seen) {   /* vLLM: divide a positive logit, multiply a negative one */
            l[i] = (l[i] > 0) ? l[i] / rep : l[i] * rep;
        }
        l[i] -= s->frequency_penalty * count + ((count > 0) ? s->presence_penalty : 0.0f);
        if (n - prompt_len < s->min_tokens) {
            for (int e = 0; e < num_eos; ++e) {
                if (eos[e] == i) {
                    l[i] = -INFINITY;
                }
            }
            for (int e = 0; e < s->num_stop_token_ids; ++e) {
                if (s->stop_token_ids[e] == i) {
                    l[i] = -INFINITY;
                }
            }
        }
        l[i] = list_masked(s, toks, prompt_len, n, i) ? -INFINITY : l[i];
        mx = (l[i] > mx) ? l[i] : mx;
    }
    for (int i = 0; i < V; ++i) {
        w[i] = exp((l[i] - mx) / s->temperature);
        if (w[i] < s->min_p) {   /* min-p: relative to the top probability */
            w[i] = 0;
        }
        order[i] = i;
    }
    for (int a = 0; a < V; ++a) {   /* by logit, largest first, lower id first */
        for (int b = a + 1; b < V; ++b) {
            if ((l[order[b]] > l[order[a]]) ||
                ((l[order[b]] == l[order[a]]) && (order[b] < order[a]))) {
                int t = order[a];
                order[a] = order[b];
                order[b] = t;
            }
        }
    }
    if (s->top_k > 0) {
        double kth = l[order[s->top_k - 1]];
        for (int i = 0; i < V; ++i) {
            if (l[i] < kth) {
                w[i] = 0;
            }
        }
    }
    if ((s->top_p > 0) && (s->top_p < 1)) {
        double tot = 0, before = 0;
        for (int i = 0; i < V; ++i) {
            tot += w[i];
        }
        for (int j = 0; j < V; ++j) {   /* keep while the mass before it is below p */
            double wj = w[order[j]];
            if ((j > 0) && (before / tot >= s->top_p)) {
                w[order[j]] = 0;
            }
            before += wj;
        }
    }
    for (int i = 0; i < V; ++i) {
        sum += w[i];
    }
    for (int i = 0; i < V; ++i) {
        p[i] = w[i] / sum;
    }
}

/* Draws from the sampler against the reference: exact support, 5 sigma per token. */
static void check_dist(const char *what, const kvf_sampling_t *s, const int32_t *toks,
                       int prompt_len, int n, const int *eos, int num_eos)
{
    const int draws = 20000;
    int counts[V] = {0};
    double p[V], worst = 0;
    uint64_t rng = 12345;

    reference(s, toks, prompt_len, n, eos, num_eos, p);
    for (int d = 0; d < draws; ++d) {
        kvf_sample_out_t o;
        assert_int_equal(kvf_sampler_sample(s, &rng, toks, prompt_len, n, base, V, eos, num_eos,
                                            &o), KVF_OK);
        counts[o.token]++;
    }
    for (int i = 0; i < V; ++i) {
        double sd = sqrt(draws * p[i] * (1 - p[i])), z;
        if (p[i] == 0) {
            if (counts[i] != 0) {
                fail_msg("%s: token %d drawn %d times outside the reference's set", what, i,
                         counts[i]);
            }
            continue;
        }
        z = fabs(counts[i] - draws * p[i]) / ((sd > 0) ? sd : 1);
        worst = (z > worst) ? z : worst;
        if (z > 5.0) {
            fail_msg("%s: token %d drawn %d times, reference %.1f (%.1f sigma)", what, i,
                     counts[i], draws * p[i], z);
        }
    }
    printf("%-44s support and %d draws within %.2f sigma of the reference (bound 5)\n",
           what, draws, worst);
}

static void test_distributions(void **state)
{
    const int32_t toks[] = {5, 9, 0, 5, 5, 9, 1};   /* prompt 5 9 0, outputs 5 5 9 1 */
    const int eos[] = {5};
    kvf_sampling_t s;

    (void)state;
    s = params(1.0f);
    check_dist("temperature 1", &s, toks, 3, 7, NULL, 0);
    s = params(0.5f);
    check_dist("temperature 0.5", &s, toks, 3, 7, NULL, 0);
    s = params(1.0f);
    s.top_k = 3;
    check_dist("top_k 3", &s, toks, 3, 7, NULL, 0);
    s.top_k = 2;   /* 3.0, 2.5: then a tie 1.5 / 1.5 excluded */
    check_dist("top_k 2", &s, toks, 3, 7, NULL, 0);
    s = params(1.0f);
    s.top_k = 4;   /* the 4th and 5th logits tie (1.5): both kept */
    check_dist("top_k 4 (tie at the 4th kept)", &s, toks, 3, 7, NULL, 0);
    s = params(1.3f);
    s.top_p = 0.6f;
    check_dist("top_p 0.6 at temperature 1.3", &s, toks, 3, 7, NULL, 0);
    s = params(1.0f);
    s.min_p = 0.2f;
    check_dist("min_p 0.2", &s, toks, 3, 7, NULL, 0);
    s = params(1.0f);
    s.top_k = 5;
    s.top_p = 0.8f;
    s.min_p = 0.05f;
    check_dist("top_k 5 + top_p 0.8 + min_p 0.05", &s, toks, 3, 7, NULL, 0);
    s = params(1.0f);
    s.repetition_penalty = 1.8f;
    check_dist("repetition_penalty 1.8", &s, toks, 3, 7, NULL, 0);
    s = params(1.0f);
    s.frequency_penalty = 0.7f;
    s.presence_penalty = -0.4f;
    check_dist("frequency 0.7 + presence -0.4", &s, toks, 3, 7, NULL, 0);
    s = params(1.0f);
    s.min_tokens = 6;
    s.num_stop_token_ids = 1;
    s.stop_token_ids[0] = 9;
    check_dist("min_tokens 6 masks EOS 5 and stop id 9", &s, toks, 3, 7, eos, 1);
    s = params(1.0f);
    s.num_logit_bias = 2;   /* +1.5 lifts 3 (0.5) to 2.0; -3 drops 5 (3.0) to 0.0 */
    s.bias_ids[0] = 3;
    s.bias_values[0] = 1.5f;
    s.bias_ids[1] = 5;
    s.bias_values[1] = -3.0f;
    s.repetition_penalty = 1.8f;   /* on the biased logits */
    check_dist("logit_bias 3:+1.5 5:-3 + repetition 1.8", &s, toks, 3, 7, NULL, 0);
    s = params(1.0f);
    s.num_allowed = 3;
    s.allowed_ids[0] = 4;
    s.allowed_ids[1] = 7;
    s.allowed_ids[2] = 11;
    check_dist("allowed_token_ids 4 7 11", &s, toks, 3, 7, NULL, 0);
    s = params(1.0f);
    s.num_bad_words = 3;   /* [9 1 5]: outputs end 9 1, so 5 masked; [8] always; [0 2]: not */
    s.bad_tokens[0] = 9;
    s.bad_tokens[1] = 1;
    s.bad_tokens[2] = 5;
    s.bad_ends[0] = 3;
    s.bad_tokens[3] = 8;
    s.bad_ends[1] = 4;
    s.bad_tokens[4] = 0;
    s.bad_tokens[5] = 2;
    s.bad_ends[2] = 6;
    check_dist("bad_words [9 1 5] [8] [0 2]", &s, toks, 3, 7, NULL, 0);
    s = params(1.0f);
    s.min_tokens = 6;
    s.num_stop_token_ids = 1;
    s.stop_token_ids[0] = 9;
    s.ignore_eos = true;
    {   /* with ignore_eos, EOS is not masked (the reference masks it: compare by hand) */
        kvf_sample_out_t o;
        uint64_t rng = 1;
        int five = 0;
        for (int d = 0; d < 2000; ++d) {
            kvf_sampler_sample(&s, &rng, toks, 3, 7, base, V, eos, 1, &o);
            five += (o.token == 5);
            assert_int_not_equal(o.token, 9);
        }
        assert_true(five > 0);
    }
}

static void test_exact(void **state)
{
    const int32_t toks[] = {5, 9, 0, 5, 5, 9, 1};
    const int eos[] = {5};
    kvf_sampling_t s = params(0.0f);
    kvf_sample_out_t o;
    uint64_t rng = 7, before = rng;
    double sum = 0;
    float mx = base[5];

    (void)state;
    /* greedy: argmax, rng untouched; a tie takes the lowest id */
    assert_int_equal(kvf_sampler_sample(&s, &rng, toks, 3, 7, base, V, NULL, 0, &o), KVF_OK);
    assert_int_equal(o.token, 5);
    assert_true(rng == before);
    {
        float tie[V];
        memcpy(tie, base, sizeof(tie));
        tie[5] = 1.5f;
        tie[9] = 1.5f;
        tie[0] = 1.5f;
        kvf_sampler_sample(&s, &rng, toks, 3, 7, tie, V, NULL, 0, &o);
        assert_int_equal(o.token, 0);
    }
    /* greedy with penalties: the seen 5, 9, 0, 1 halved (3.0 -> 1.5, 2.5 -> 1.25, ...);
     * the unseen 2 (1.5) ties with 5 and wins on its lower id */
    s.repetition_penalty = 2.0f;
    kvf_sampler_sample(&s, &rng, toks, 3, 7, base, V, NULL, 0, &o);
    assert_int_equal(o.token, 2);
    s = params(0.0f);
    s.frequency_penalty = 1.0f;     /* 5: 3 - 2 = 1; 9: 2.5 - 1 = 1.5; 0: 2.0 (prompt only) */
    kvf_sampler_sample(&s, &rng, toks, 3, 7, base, V, NULL, 0, &o);
    assert_int_equal(o.token, 0);
    s = params(0.0f);
    s.min_tokens = 5;               /* 4 outputs so far: EOS 5 masked; then 9 */
    kvf_sampler_sample(&s, &rng, toks, 3, 7, base, V, eos, 1, &o);
    assert_int_equal(o.token, 9);
    s.min_tokens = 4;               /* reached: 5 again */
    kvf_sampler_sample(&s, &rng, toks, 3, 7, base, V, eos, 1, &o);
    assert_int_equal(o.token, 5);
    /* logprobs: of the raw logits, most likely first */
    s = params(0.0f);
    s.want_logprobs = true;
    s.logprobs = 3;
    s.repetition_penalty = 2.0f;    /* changes the pick, not the reported logprobs */
    kvf_sampler_sample(&s, &rng, toks, 3, 7, base, V, NULL, 0, &o);
    for (int i = 0; i < V; ++i) {
        sum += exp((double)base[i] - mx);
    }
    assert_int_equal(o.num_top, 3);
    assert_int_equal(o.top_ids[0], 5);
    assert_int_equal(o.top_ids[1], 9);
    assert_int_equal(o.top_ids[2], 0);
    assert_true(fabs(o.top_logprobs[0] - (-log(sum))) < 1e-5);
    assert_true(fabs(o.logprob - (base[o.token] - mx - log(sum))) < 1e-5);
    /* one draw per token when sampling: the skip matches */
    {
        kvf_sampling_t t = params(1.0f);
        uint64_t a = 99, b = 99;
        t.top_k = 3;
        kvf_sampler_sample(&t, &a, toks, 3, 7, base, V, NULL, 0, &o);
        kvf_sampler_skip(&t, &b);
        assert_true(a == b);
    }
}

static void test_checks(void **state)
{
    static const char *const bad[] = {"temperature", "top_p", "top_k", "min_p",
                                      "presence_penalty", "frequency_penalty",
                                      "repetition_penalty", "min_tokens", "stop_token_ids",
                                      "logprobs"};
    char err[160];

    (void)state;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); ++i) {
        kvf_sampling_t s = params(1.0f);
        switch (i) {
        case 0: s.temperature = -1.0f; break;
        case 1: s.top_p = 1.5f; break;
        case 2: s.top_k = -2; break;
        case 3: s.min_p = 2.0f; break;
        case 4: s.presence_penalty = 2.5f; break;
        case 5: s.frequency_penalty = NAN; break;
        case 6: s.repetition_penalty = -1.0f; break;
        case 7: s.min_tokens = 17; break;
        case 8: s.num_stop_token_ids = 1; s.stop_token_ids[0] = V; break;
        default: s.logprobs = 21; break;
        }
        assert_int_equal(kvf_sampling_check(&s, V, err, sizeof(err)), KVF_ERR_INVALID_PARAM);
        if (strstr(err, bad[i]) == NULL) {
            fail_msg("case %zu: '%s' does not name %s", i, err, bad[i]);
        }
    }
    {
        kvf_sampling_t s = params(1.0f);
        s.top_p = 0.5f;
        s.top_k = 3;
        assert_int_equal(kvf_sampling_check(&s, V, err, sizeof(err)), KVF_OK);
    }
    for (int i = 0; i < 7; ++i) {   /* the lists: each bad value names its field */
        static const char *const list[] = {"logit_bias", "logit_bias", "logit_bias",
                                           "allowed_token_ids", "allowed_token_ids",
                                           "bad_words", "bad_words"};
        kvf_sampling_t s = params(1.0f);
        s.num_logit_bias = 2;
        s.bias_ids[0] = 1;
        s.bias_ids[1] = 2;
        switch (i) {
        case 0: s.bias_values[1] = 100.5f; break;
        case 1: s.bias_ids[1] = V; break;
        case 2: s.bias_ids[1] = 1; break;   /* twice */
        case 3: s.num_allowed = 1; s.allowed_ids[0] = -1; break;
        case 4: s.num_allowed = KVF_SAMPLING_MAX_ALLOWED + 1; break;
        case 5: s.num_bad_words = 2; s.bad_ends[0] = 1; s.bad_ends[1] = 1; break;   /* empty */
        default: s.num_bad_words = 1; s.bad_ends[0] = 1; s.bad_tokens[0] = V; break;
        }
        assert_int_equal(kvf_sampling_check(&s, V, err, sizeof(err)), KVF_ERR_INVALID_PARAM);
        if (strstr(err, list[i]) == NULL) {
            fail_msg("list case %d: '%s' does not name %s", i, err, list[i]);
        }
    }
}

/* Greedy: logit_bias +100 forces its token; allowed_token_ids and bad_words hold at
 * temperature 0 too (the engine then may not take the forward's argmax). */
static void test_lists_greedy(void **state)
{
    const int32_t toks[] = {5, 9, 0, 5, 5, 9, 1};
    kvf_sampling_t s = params(0.0f);
    kvf_sample_out_t o;
    uint64_t rng = 3;

    (void)state;
    s.num_logit_bias = 1;
    s.bias_ids[0] = 10;   /* the smallest logit, -2 */
    s.bias_values[0] = 100.0f;
    assert_int_equal(kvf_sampler_sample(&s, &rng, toks, 3, 7, base, V, NULL, 0, &o), KVF_OK);
    assert_int_equal(o.token, 10);
    s.num_bad_words = 1;   /* [1 10]: the outputs end with 1, so 10 is masked after all */
    s.bad_tokens[0] = 1;
    s.bad_tokens[1] = 10;
    s.bad_ends[0] = 2;
    assert_int_equal(kvf_sampler_sample(&s, &rng, toks, 3, 7, base, V, NULL, 0, &o), KVF_OK);
    assert_int_equal(o.token, 5);   /* the argmax of the rest */
    assert_int_equal(kvf_sampler_sample(&s, &rng, toks, 3, 6, base, V, NULL, 0, &o), KVF_OK);
    assert_int_equal(o.token, 10);  /* outputs end with 9: the word is not due */
    s = params(0.0f);
    s.num_allowed = 2;
    s.allowed_ids[0] = 6;
    s.allowed_ids[1] = 3;
    assert_int_equal(kvf_sampler_sample(&s, &rng, toks, 3, 7, base, V, NULL, 0, &o), KVF_OK);
    assert_int_equal(o.token, 3);   /* 0.5 > -1 */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_distributions),
        cmocka_unit_test(test_exact),
        cmocka_unit_test(test_checks),
        cmocka_unit_test(test_lists_greedy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
