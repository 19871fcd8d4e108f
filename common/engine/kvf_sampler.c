/* Token sampling with vLLM's parameters (kvf_sampler.h); the arithmetic is kvf_sample_math.h. */
#include "kvf_sampler.h"
#include "kvf_sample_math.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* Per-thread scratch, grown to the vocabulary: penalised logits, weights, counts, order. */
typedef struct kvf_sampler_ws {
    int     cap;
    float  *logits;
    double *w;
    int    *count;     /* output occurrences */
    char   *seen;      /* in the prompt or the output */
    int32_t *order;    /* candidate ids */
} kvf_sampler_ws_t;

static _Thread_local kvf_sampler_ws_t kvf_ws;

/* A thread's scratch is freed when the thread ends (a rank or request thread that exits
 * would otherwise leave it: LeakSanitizer saw it in test_model_disagg's decode threads). The
 * key's value is the thread's own kvf_ws; pthread calls the destructor at its exit. */
static pthread_key_t kvf_ws_key;
static pthread_once_t kvf_ws_once = PTHREAD_ONCE_INIT;

static void kvf_sampler_ws_free(void *arg)
{
    kvf_sampler_ws_t *ws = arg;

    free(ws->logits);
    free(ws->w);
    free(ws->count);
    free(ws->seen);
    free(ws->order);
    memset(ws, 0, sizeof(*ws));
}

static void kvf_sampler_ws_key_make(void)
{
    (void)pthread_key_create(&kvf_ws_key, kvf_sampler_ws_free);
}

static kvf_status_t kvf_sampler_ws_grow(int vocab)
{
    kvf_sampler_ws_t *ws = &kvf_ws;

    if (ws->cap >= vocab) {
        return KVF_OK;
    }
    if (ws->cap == 0) {   /* first use on this thread: free it at the thread's exit */
        (void)pthread_once(&kvf_ws_once, kvf_sampler_ws_key_make);
        (void)pthread_setspecific(kvf_ws_key, ws);
    }
    free(ws->logits);
    free(ws->w);
    free(ws->count);
    free(ws->seen);
    free(ws->order);
    ws->logits = malloc((size_t)vocab * sizeof(float));
    ws->w = malloc((size_t)vocab * sizeof(double));
    ws->count = calloc((size_t)vocab, sizeof(int));
    ws->seen = calloc((size_t)vocab, 1);
    ws->order = malloc((size_t)vocab * sizeof(int32_t));
    if ((ws->logits == NULL) || (ws->w == NULL) || (ws->count == NULL) || (ws->seen == NULL) ||
        (ws->order == NULL)) {
        ws->cap = 0;
        return KVF_ERR_NO_MEMORY;
    }
    ws->cap = vocab;
    return KVF_OK;
}

static kvf_status_t kvf_bad(char *err, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static kvf_status_t kvf_bad(char *err, size_t cap, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(err, cap, fmt, ap);
    va_end(ap);
    return KVF_ERR_INVALID_PARAM;
}

kvf_status_t kvf_sampling_check(const kvf_sampling_t *s, int vocab, char *err, size_t cap)
{
    if (!isfinite(s->temperature) || (s->temperature < 0.0f)) {
        return kvf_bad(err, cap, "temperature %g must be a finite number >= 0",
                       (double)s->temperature);
    }
    if (!isfinite(s->top_p) || (s->top_p < 0.0f) || (s->top_p > 1.0f)) {
        return kvf_bad(err, cap, "top_p %g must be in (0, 1]", (double)s->top_p);
    }
    if (s->top_k < -1) {
        return kvf_bad(err, cap, "top_k %d must be -1 or 0 (off) or at least 1", s->top_k);
    }
    if (!isfinite(s->min_p) || (s->min_p < 0.0f) || (s->min_p > 1.0f)) {
        return kvf_bad(err, cap, "min_p %g must be in [0, 1]", (double)s->min_p);
    }
    if (!isfinite(s->presence_penalty) || (fabsf(s->presence_penalty) > 2.0f)) {
        return kvf_bad(err, cap, "presence_penalty %g must be in [-2, 2]",
                       (double)s->presence_penalty);
    }
    if (!isfinite(s->frequency_penalty) || (fabsf(s->frequency_penalty) > 2.0f)) {
        return kvf_bad(err, cap, "frequency_penalty %g must be in [-2, 2]",
                       (double)s->frequency_penalty);
    }
    if (!isfinite(s->repetition_penalty) || (s->repetition_penalty < 0.0f)) {
        return kvf_bad(err, cap, "repetition_penalty %g must be > 0",
                       (double)s->repetition_penalty);
    }
    if ((s->min_tokens < 0) || (s->min_tokens > s->max_tokens)) {
        return kvf_bad(err, cap, "min_tokens %d must be in [0, max_tokens = %d]", s->min_tokens,
                       s->max_tokens);
    }
    if ((s->num_stop_token_ids < 0) || (s->num_stop_token_ids > KVF_SAMPLING_MAX_STOP_IDS)) {
        return kvf_bad(err, cap, "stop_token_ids has %d entries, more than %d",
                       s->num_stop_token_ids, KVF_SAMPLING_MAX_STOP_IDS);
    }
    for (int i = 0; i < s->num_stop_token_ids; ++i) {
        if ((s->stop_token_ids[i] < 0) || (s->stop_token_ids[i] >= vocab)) {
            return kvf_bad(err, cap, "stop_token_ids[%d] = %d is outside the vocabulary [0, %d)",
                           i, s->stop_token_ids[i], vocab);
        }
    }
    if ((s->logprobs < 0) || (s->logprobs > KVF_SAMPLING_MAX_LOGPROBS)) {
        return kvf_bad(err, cap, "logprobs %d must be in [0, %d]", s->logprobs,
                       KVF_SAMPLING_MAX_LOGPROBS);
    }
    return KVF_OK;
}

bool kvf_sampling_is_stop_id(const kvf_sampling_t *s, int32_t tok)
{
    for (int i = 0; i < s->num_stop_token_ids; ++i) {
        if (s->stop_token_ids[i] == tok) {
            return true;
        }
    }
    return false;
}

static bool kvf_sampler_greedy(const kvf_sampling_t *s)
{
    return s->temperature < KVF_SAMPLE_GREEDY_EPS;
}

void kvf_sampler_skip(const kvf_sampling_t *s, uint64_t *rng)
{
    if (!kvf_sampler_greedy(s)) {
        (void)kvf_sample_rng_next_hd(rng);
    }
}

/* Candidates by logit, largest first; lowest id first on ties. */
static const float *kvf_sort_logits;

static int kvf_cmp_desc(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    float lx = kvf_sort_logits[x], ly = kvf_sort_logits[y];

    if (lx != ly) {
        return (lx > ly) ? -1 : 1;
    }
    return (x < y) ? -1 : (x > y);
}

/* Logprobs of the raw logits: the sampled token's and the top n. */
static void kvf_sampler_logprobs(const kvf_sampling_t *s, const float *raw, int vocab,
                                 kvf_sample_out_t *out)
{
    float max = raw[0];
    double sum = 0.0;
    int n = s->logprobs;

    for (int i = 1; i < vocab; ++i) {
        max = (raw[i] > max) ? raw[i] : max;
    }
    for (int i = 0; i < vocab; ++i) {
        sum += kvf_sample_weight_hd(raw[i], max, 1.0);
    }
    out->logprob = kvf_sample_logprob_hd(raw[out->token], max, sum);
    n = (n > vocab) ? vocab : n;
    out->num_top = 0;
    /* selection of the n largest (n <= 20): a pass per entry */
    for (int k = 0; k < n; ++k) {
        int32_t best = -1;
        for (int i = 0; i < vocab; ++i) {
            bool taken = false;
            for (int j = 0; j < k; ++j) {
                taken = taken || (out->top_ids[j] == i);
            }
            if (!taken && ((best < 0) || (raw[i] > raw[best]))) {
                best = i;
            }
        }
        out->top_ids[k] = best;
        out->top_logprobs[k] = kvf_sample_logprob_hd(raw[best], max, sum);
        out->num_top = k + 1;
    }
}

kvf_status_t kvf_sampler_sample(const kvf_sampling_t *s, uint64_t *rng, const int32_t *tokens,
                                int prompt_len, int num_tokens, const float *logits, int vocab,
                                const int *eos, int num_eos, kvf_sample_out_t *out)
{
    kvf_sampler_ws_t *ws = &kvf_ws;
    bool penalties = ((s->repetition_penalty != 0.0f) && (s->repetition_penalty != 1.0f)) ||
                     (s->frequency_penalty != 0.0f) || (s->presence_penalty != 0.0f);
    bool mask = (num_tokens - prompt_len) < s->min_tokens;
    float rep = (s->repetition_penalty != 0.0f) ? s->repetition_penalty : 1.0f;
    const float *l = logits;
    int32_t best = 0;
    int kept = 0;
    double inv_t, sum = 0.0, u, acc = 0.0;

    out->num_top = 0;
    out->logprob = 0.0f;
    if (kvf_sampler_ws_grow(vocab) != KVF_OK) {
        return KVF_ERR_NO_MEMORY;
    }
    if (penalties || mask) {
        float *pl = ws->logits;

        memcpy(pl, logits, (size_t)vocab * sizeof(float));
        if (penalties) {
            for (int i = 0; i < num_tokens; ++i) {
                ws->seen[tokens[i]] = 1;
                ws->count[tokens[i]] += (i >= prompt_len);
            }
            for (int i = 0; i < num_tokens; ++i) {
                int32_t t = tokens[i];
                if (ws->seen[t]) {   /* once per distinct token */
                    pl[t] = kvf_sample_penalize_hd(logits[t], 1, ws->count[t], rep,
                                                   s->frequency_penalty, s->presence_penalty);
                    ws->seen[t] = 0;
                    ws->count[t] = 0;
                }
            }
        }
        if (mask) {
            for (int i = 0; !s->ignore_eos && (i < num_eos); ++i) {
                if ((eos[i] >= 0) && (eos[i] < vocab)) {
                    pl[eos[i]] = -INFINITY;
                }
            }
            for (int i = 0; i < s->num_stop_token_ids; ++i) {
                pl[s->stop_token_ids[i]] = -INFINITY;
            }
        }
        l = pl;
    }
    for (int i = 1; i < vocab; ++i) {
        if (l[i] > l[best]) {
            best = i;
        }
    }
    if (kvf_sampler_greedy(s)) {
        out->token = best;
        goto done;
    }
    inv_t = 1.0 / (double)s->temperature;
    for (int i = 0; i < vocab; ++i) {
        ws->w[i] = kvf_sample_weight_hd(l[i], l[best], inv_t);
        if ((s->min_p > 0.0f) && !kvf_sample_min_p_keep_hd(ws->w[i], s->min_p)) {
            ws->w[i] = 0.0;
        }
    }
    if ((s->top_k > 0) || ((s->top_p > 0.0f) && (s->top_p < 1.0f))) {
        double total = 0.0, before = 0.0;
        int k_end;

        for (int i = 0; i < vocab; ++i) {
            if (ws->w[i] > 0.0) {
                ws->order[kept++] = i;
            }
        }
        kvf_sort_logits = l;
        qsort(ws->order, (size_t)kept, sizeof(int32_t), kvf_cmp_desc);
        k_end = kept;
        if ((s->top_k > 0) && (s->top_k < kept)) {
            float kth = l[ws->order[s->top_k - 1]];
            k_end = s->top_k;
            while ((k_end < kept) && (l[ws->order[k_end]] == kth)) {
                ++k_end;   /* ties with the k-th are kept */
            }
        }
        for (int j = 0; j < k_end; ++j) {
            total += ws->w[ws->order[j]];
        }
        for (int j = 0; j < kept; ++j) {
            int32_t t = ws->order[j];
            bool keep = (j < k_end);
            if (keep && (s->top_p > 0.0f) && (s->top_p < 1.0f) && (j > 0)) {
                keep = (before / total) < (double)s->top_p;
            }
            before += ws->w[t];
            if (!keep) {
                ws->w[t] = 0.0;
            }
        }
    }
    for (int i = 0; i < vocab; ++i) {
        sum += ws->w[i];
    }
    u = kvf_sample_uniform_hd(kvf_sample_rng_next_hd(rng)) * sum;
    out->token = best;
    for (int i = 0; i < vocab; ++i) {
        acc += ws->w[i];
        if ((ws->w[i] > 0.0) && (u < acc)) {
            out->token = i;
            break;
        }
    }
done:
    if (s->want_logprobs) {
        kvf_sampler_logprobs(s, logits, vocab, out);
    }
    return KVF_OK;
}
