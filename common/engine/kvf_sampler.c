/* Token sampling with vLLM's parameters (kvf_sampler.h); the arithmetic is kvf_sample_math.h. */
#include "kvf_sampler.h"
#include "kvf_sample_math.h"
#include "kvf_argmax_math.h"
#include "kvf_array.h"

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
    int32_t *rank;     /* a candidate's position in order */
    kvf_sample_pen_t *pen;   /* the CPU path's entries (kvf_sampler_entries) */
    int     cap_pen;
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
    free(ws->rank);
    free(ws->pen);
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
    free(ws->rank);
    ws->logits = malloc((size_t)vocab * sizeof(float));
    ws->w = malloc((size_t)vocab * sizeof(double));
    ws->count = calloc((size_t)vocab, sizeof(int));
    ws->seen = calloc((size_t)vocab, 1);
    ws->order = malloc((size_t)vocab * sizeof(int32_t));
    ws->rank = malloc((size_t)vocab * sizeof(int32_t));
    if ((ws->logits == NULL) || (ws->w == NULL) || (ws->count == NULL) || (ws->seen == NULL) ||
        (ws->order == NULL) || (ws->rank == NULL)) {
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

/* logit_bias, allowed_token_ids, bad_words: counts within the caps, ids in the vocabulary. */
static kvf_status_t kvf_sampling_check_lists(const kvf_sampling_t *s, int vocab, char *err,
                                             size_t cap)
{
    int prev = 0;

    if ((s->num_logit_bias < 0) || (s->num_logit_bias > KVF_SAMPLING_MAX_BIAS)) {
        return kvf_bad(err, cap, "logit_bias has %d entries, more than %d", s->num_logit_bias,
                       KVF_SAMPLING_MAX_BIAS);
    }
    for (int i = 0; i < s->num_logit_bias; ++i) {
        if ((s->bias_ids[i] < 0) || (s->bias_ids[i] >= vocab)) {
            return kvf_bad(err, cap, "logit_bias token %d is outside the vocabulary [0, %d)",
                           s->bias_ids[i], vocab);
        }
        if (!isfinite(s->bias_values[i]) || (fabsf(s->bias_values[i]) > 100.0f)) {
            return kvf_bad(err, cap, "logit_bias of token %d = %g must be in [-100, 100]",
                           s->bias_ids[i], (double)s->bias_values[i]);
        }
        for (int j = 0; j < i; ++j) {
            if (s->bias_ids[j] == s->bias_ids[i]) {
                return kvf_bad(err, cap, "logit_bias lists token %d twice", s->bias_ids[i]);
            }
        }
    }
    if ((s->num_allowed < 0) || (s->num_allowed > KVF_SAMPLING_MAX_ALLOWED)) {
        return kvf_bad(err, cap, "allowed_token_ids has %d entries, more than %d",
                       s->num_allowed, KVF_SAMPLING_MAX_ALLOWED);
    }
    for (int i = 0; i < s->num_allowed; ++i) {
        if ((s->allowed_ids[i] < 0) || (s->allowed_ids[i] >= vocab)) {
            return kvf_bad(err, cap, "allowed_token_ids[%d] = %d is outside the vocabulary "
                           "[0, %d)", i, s->allowed_ids[i], vocab);
        }
    }
    if ((s->num_bad_words < 0) || (s->num_bad_words > KVF_SAMPLING_MAX_BAD_WORDS)) {
        return kvf_bad(err, cap, "bad_words has %d token sequences, more than %d",
                       s->num_bad_words, KVF_SAMPLING_MAX_BAD_WORDS);
    }
    for (int w = 0; w < s->num_bad_words; ++w) {
        if ((s->bad_ends[w] <= prev) || (s->bad_ends[w] > KVF_SAMPLING_MAX_BAD_TOKENS)) {
            return kvf_bad(err, cap, "bad_words sequence %d ends at %d: sequences must be "
                           "non-empty, %d tokens at most in all", w, s->bad_ends[w],
                           KVF_SAMPLING_MAX_BAD_TOKENS);
        }
        for (int i = prev; i < s->bad_ends[w]; ++i) {
            if ((s->bad_tokens[i] < 0) || (s->bad_tokens[i] >= vocab)) {
                return kvf_bad(err, cap, "bad_words token %d is outside the vocabulary [0, %d)",
                               s->bad_tokens[i], vocab);
            }
        }
        prev = s->bad_ends[w];
    }
    return KVF_OK;
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
    if ((s->prompt_logprobs < 0) || (s->prompt_logprobs > KVF_SAMPLING_MAX_LOGPROBS)) {
        return kvf_bad(err, cap, "prompt_logprobs %d must be in [0, %d]", s->prompt_logprobs,
                       KVF_SAMPLING_MAX_LOGPROBS);
    }
    if ((s->logprobs < 0) || (s->logprobs > KVF_SAMPLING_MAX_LOGPROBS)) {
        return kvf_bad(err, cap, "logprobs %d must be in [0, %d]", s->logprobs,
                       KVF_SAMPLING_MAX_LOGPROBS);
    }
    return kvf_sampling_check_lists(s, vocab, err, cap);
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

/*
 * Sums over the vocabulary in the one order of kernels/kvf_sample_math.h (lanes of ids t,
 * t + LANES, ..., then the fixed tree), so the device sampler (kernels/kvf_sample.h) gets
 * the same bits: the weights w (0 for tokens not kept), counting only candidates ranked
 * before position @a before of the sorted order when @a rank is not NULL. @a node: [2 LANES],
 * the tree, left for the descent.
 */
static double kvf_fixed_sum(const double *w, const int32_t *rank, int before, int vocab,
                            double *node)
{
    for (int t = 0; t < KVF_SAMPLE_LANES; ++t) {
        double acc = 0.0;
        for (int i = t; i < vocab; i += KVF_SAMPLE_LANES) {
            if ((w[i] > 0.0) && ((rank == NULL) || (rank[i] < before))) {
                acc = kvf_sample_dadd(acc, w[i]);
            }
        }
        node[KVF_SAMPLE_LANES + t] = acc;
    }
    return kvf_sample_tree_hd(node);
}

/* Logprobs of the raw logits: the sampled token's and the top n (largest non-NaN first,
 * lowest id on ties: kernels/kvf_argmax_math.h's order). */
static void kvf_sampler_logprobs(const kvf_sampling_t *s, const float *raw, int vocab,
                                 kvf_sample_out_t *out)
{
    double node[2 * KVF_SAMPLE_LANES];
    kvf_argmax_cand_t c = {0.0f, -1};
    kvf_sample_keep_t k = {0.0f, 1.0, 0.0f, 0, 0};
    float max;
    double sum;
    int n = s->logprobs;

    for (int i = 0; i < vocab; ++i) {
        c = kvf_argmax_take(c, raw[i], i);
    }
    max = raw[kvf_argmax_result(c, raw[0])];
    k.max = max;
    for (int t = 0; t < KVF_SAMPLE_LANES; ++t) {
        node[KVF_SAMPLE_LANES + t] = kvf_sample_lane_sum_hd(raw, vocab, t, &k, 0, 0);
    }
    sum = kvf_sample_tree_hd(node);
    out->logprob = kvf_sample_logprob_hd(raw[out->token], max, sum);
    n = (n > vocab) ? vocab : n;
    out->num_top = 0;
    /* selection of the n largest (n <= 20): a pass per entry, each after the last pick */
    for (int j = 0; j < n; ++j) {
        kvf_argmax_cand_t b = {0.0f, -1};
        float pv = (j > 0) ? raw[out->top_ids[j - 1]] : 0.0f;
        int32_t pid = (j > 0) ? out->top_ids[j - 1] : -1;
        for (int i = 0; i < vocab; ++i) {
            if ((pid < 0) || (raw[i] < pv) || ((raw[i] == pv) && (i > pid))) {
                b = kvf_argmax_take(b, raw[i], i);
            }
        }
        if (b.idx < 0) {
            break;
        }
        out->top_ids[j] = b.idx;
        out->top_logprobs[j] = kvf_sample_logprob_hd(raw[b.idx], max, sum);
        out->num_top = j + 1;
    }
}

static void kvf_sampler_entries(kvf_sampler_ws_t *ws, const kvf_sampling_t *s,
                                const int32_t *tokens, int prompt_len, int num_tokens,
                                int vocab, const int *eos, int num_eos, kvf_sample_row_t *row,
                                kvf_sample_pen_t *pen, int *num_pen);

/* Whether @a s changes any logit before the temperature (kvf_sampler.h's steps 1-2). */
static bool kvf_sampler_edits(const kvf_sampling_t *s, int prompt_len, int num_tokens)
{
    bool penalties = ((s->repetition_penalty != 0.0f) && (s->repetition_penalty != 1.0f)) ||
                     (s->frequency_penalty != 0.0f) || (s->presence_penalty != 0.0f);

    return penalties || ((num_tokens - prompt_len) < s->min_tokens) ||
           (s->num_logit_bias > 0) || (s->num_allowed > 0) || (s->num_bad_words > 0);
}

/*
 * Steps 1-2 of kvf_sampler.h into ws->logits: the device row's entries (one definition of
 * what each token gets), applied as kernels/kvf_sample.c's twin applies them.
 * @return KVF_OK or KVF_ERR_NO_MEMORY.
 */
static kvf_status_t kvf_sampler_apply_edits(kvf_sampler_ws_t *ws, const kvf_sampling_t *s,
                                            const int32_t *tokens, int prompt_len,
                                            int num_tokens, const float *logits, int vocab,
                                            const int *eos, int num_eos)
{
    kvf_sample_row_t row;
    int n = 0, need = kvf_sampler_device_pen_max(s, num_tokens, num_eos);

    if ((need > ws->cap_pen) &&
        (KVF_ARRAY_GROW(ws->pen, ws->cap_pen, need, 256) != KVF_OK)) {
        return KVF_ERR_NO_MEMORY;
    }
    kvf_sampler_entries(ws, s, tokens, prompt_len, num_tokens, vocab, eos, num_eos, &row,
                        ws->pen, &n);
    for (int i = 0; i < vocab; ++i) {
        ws->logits[i] = row.allow_only ? -INFINITY : logits[i];
    }
    for (int e = 0; e < n; ++e) {
        const kvf_sample_pen_t *x = &ws->pen[e];
        if (!row.allow_only || (x->flags & KVF_SAMPLE_PEN_ALLOW)) {
            ws->logits[x->id] = kvf_sample_pen_apply_hd(logits[x->id], x->count, x->flags,
                                                        x->bias, row.rep, row.freq,
                                                        row.pres);
        }
    }
    return KVF_OK;
}

/*
 * top-k, then top-p, on the weights ws->w of the logits @a l: the candidates not kept get
 * weight 0. Sorted by logit (ties by id), the top-k set keeps ties with the k-th.
 * @a node: [2 LANES] scratch for kvf_fixed_sum().
 */
static void kvf_sampler_top_k_p(kvf_sampler_ws_t *ws, const kvf_sampling_t *s, const float *l,
                                int vocab, double *node)
{
    int kept = 0;
    int k_end, lo, hi;

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
    for (int j = k_end; j < kept; ++j) {
        ws->w[ws->order[j]] = 0.0;
    }
    if ((s->top_p > 0.0f) && (s->top_p < 1.0f)) {
        /* keep position j when the mass of positions before it (summed in the fixed
         * order) over the top-k set's mass is below top_p; that mass grows with j, so
         * the kept positions are a prefix [0, lo]: bisection */
        double total = kvf_fixed_sum(ws->w, NULL, 0, vocab, node);
        for (int j = 0; j < k_end; ++j) {
            ws->rank[ws->order[j]] = j;
        }
        lo = 0;
        hi = k_end - 1;
        while (lo < hi) {
            int mid = lo + (hi - lo + 1) / 2;
            if (kvf_sample_top_p_keep_hd(kvf_fixed_sum(ws->w, ws->rank, mid, vocab, node),
                                         total, s->top_p)) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        for (int j = lo + 1; j < k_end; ++j) {
            ws->w[ws->order[j]] = 0.0;
        }
    }
}

kvf_status_t kvf_sampler_sample(const kvf_sampling_t *s, uint64_t *rng, const int32_t *tokens,
                                int prompt_len, int num_tokens, const float *logits, int vocab,
                                const int *eos, int num_eos, kvf_sample_out_t *out)
{
    kvf_sampler_ws_t *ws = &kvf_ws;
    const float *l = logits;
    int32_t best = 0;
    double inv_t, sum, u, acc = 0.0;
    double node[2 * KVF_SAMPLE_LANES];

    out->num_top = 0;
    out->logprob = 0.0f;
    if (kvf_sampler_ws_grow(vocab) != KVF_OK) {
        return KVF_ERR_NO_MEMORY;
    }
    if (kvf_sampler_edits(s, prompt_len, num_tokens)) {
        kvf_status_t st = kvf_sampler_apply_edits(ws, s, tokens, prompt_len, num_tokens, logits,
                                                  vocab, eos, num_eos);
        if (st != KVF_OK) {
            return st;
        }
        l = ws->logits;
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
        if (!(ws->w[i] > 0.0) ||
            ((s->min_p > 0.0f) && !kvf_sample_min_p_keep_hd(ws->w[i], s->min_p))) {
            ws->w[i] = 0.0;   /* NaN included: no mass */
        }
    }
    if ((s->top_k > 0) || ((s->top_p > 0.0f) && (s->top_p < 1.0f))) {
        kvf_sampler_top_k_p(ws, s, l, vocab, node);
    }
    sum = kvf_fixed_sum(ws->w, NULL, 0, vocab, node);
    u = kvf_sample_target_hd(kvf_sample_rng_next_hd(rng), sum);
    out->token = best;
    {
        /* inverse CDF in the fixed order: the tree's descent to a lane, then the lane's
         * scan; a lane that picks nothing (rounding) gives its last kept token */
        int lane = kvf_sample_descend_hd(node, &u);
        int32_t last = -1;
        for (int i = lane; i < vocab; i += KVF_SAMPLE_LANES) {
            last = (ws->w[i] > 0.0) ? i : last;
            if (kvf_sample_cdf_step_hd(&acc, ws->w[i], u)) {
                last = -1;
                out->token = i;
                break;
            }
        }
        if (last >= 0) {
            out->token = last;
        }
    }
done:
    if (s->want_logprobs) {
        kvf_sampler_logprobs(s, logits, vocab, out);
    }
    return KVF_OK;
}

void kvf_sampler_score(const float *logits, int vocab, int32_t token, int n,
                       kvf_sample_out_t *out, int32_t *rank_p)
{
    kvf_sampling_t s;
    int32_t rank = 1;

    memset(&s, 0, sizeof(s));
    s.logprobs = n;
    out->token = token;
    kvf_sampler_logprobs(&s, logits, vocab, out);
    for (int i = 0; i < vocab; ++i) {
        rank += (logits[i] > logits[token]);
    }
    *rank_p = rank;
}

int kvf_sampler_device_pen_max(const kvf_sampling_t *s, int num_tokens, int num_eos)
{
    return num_tokens + num_eos + s->num_stop_token_ids + s->num_logit_bias + s->num_allowed +
           s->num_bad_words;
}

/* Token @a id's entry: a new one (no flags) or the one it has (ws->seen[id] == 2 marks an
 * id with an entry, ws->rank[id] its index). */
static kvf_sample_pen_t *kvf_pen_at(kvf_sampler_ws_t *ws, int32_t id, kvf_sample_pen_t *pen,
                                    int *n)
{
    if (ws->seen[id] == 2) {
        return &pen[ws->rank[id]];
    }
    ws->seen[id] = 2;
    ws->rank[id] = *n;
    pen[*n] = (kvf_sample_pen_t){.id = id, .count = 0, .flags = 0, .bias = 0.0f};
    return &pen[(*n)++];
}

/* Bad word @a w's last token when the outputs end with the rest of it (vLLM's bad_words:
 * only the token that would complete the sequence is masked), else -1. */
static int32_t kvf_bad_word_next(const kvf_sampling_t *s, int w, const int32_t *tokens,
                                 int prompt_len, int num_tokens)
{
    int start = (w > 0) ? s->bad_ends[w - 1] : 0, len = s->bad_ends[w] - start;
    int outputs = num_tokens - prompt_len;

    if (len - 1 > outputs) {
        return -1;
    }
    for (int i = 0; i < len - 1; ++i) {
        if (tokens[num_tokens - (len - 1) + i] != s->bad_tokens[start + i]) {
            return -1;
        }
    }
    return s->bad_tokens[start + len - 1];
}

/*
 * The row's parameters but the draw, and its entries appended at pen[*num_pen]: the
 * history's tokens while penalties are on, EOS and stop ids masked while below min_tokens,
 * logit_bias, allowed_token_ids, and the bad words the outputs are one token from
 * completing. Distinct ids; ws->seen is all-zero before and after.
 */
static void kvf_sampler_entries(kvf_sampler_ws_t *ws, const kvf_sampling_t *s,
                                const int32_t *tokens, int prompt_len, int num_tokens,
                                int vocab, const int *eos, int num_eos, kvf_sample_row_t *row,
                                kvf_sample_pen_t *pen, int *num_pen)
{
    bool penalties = ((s->repetition_penalty != 0.0f) && (s->repetition_penalty != 1.0f)) ||
                     (s->frequency_penalty != 0.0f) || (s->presence_penalty != 0.0f);
    bool mask = (num_tokens - prompt_len) < s->min_tokens;
    int start = *num_pen, n = *num_pen;

    *row = (kvf_sample_row_t){
        .temperature = s->temperature,
        .top_p = s->top_p,
        .top_k = (s->top_k > 0) ? s->top_k : 0,
        .min_p = s->min_p,
        .rep = (s->repetition_penalty != 0.0f) ? s->repetition_penalty : 1.0f,
        .freq = s->frequency_penalty,
        .pres = s->presence_penalty,
        .want_logprobs = s->want_logprobs,
        .num_top = s->want_logprobs ? s->logprobs : 0,
        .pen_start = start,
        .allow_only = (s->num_allowed > 0),
    };
    if (penalties) {   /* every history token seen, outputs counted */
        for (int i = 0; i < num_tokens; ++i) {
            ws->seen[tokens[i]] = 1;
            ws->count[tokens[i]] += (i >= prompt_len);
        }
        for (int i = 0; i < num_tokens; ++i) {
            int32_t t = tokens[i];
            if (ws->seen[t] == 1) {
                ws->seen[t] = 2;
                ws->rank[t] = n;
                pen[n++] = (kvf_sample_pen_t){.id = t, .count = ws->count[t],
                                              .flags = KVF_SAMPLE_PEN_SEEN, .bias = 0.0f};
                ws->count[t] = 0;
            }
        }
    }
    if (mask) {
        for (int i = 0; !s->ignore_eos && (i < num_eos); ++i) {
            if ((eos[i] >= 0) && (eos[i] < vocab)) {
                kvf_pen_at(ws, eos[i], pen, &n)->flags |= KVF_SAMPLE_PEN_MASK;
            }
        }
        for (int i = 0; i < s->num_stop_token_ids; ++i) {
            kvf_pen_at(ws, s->stop_token_ids[i], pen, &n)->flags |= KVF_SAMPLE_PEN_MASK;
        }
    }
    for (int i = 0; i < s->num_logit_bias; ++i) {
        kvf_sample_pen_t *x = kvf_pen_at(ws, s->bias_ids[i], pen, &n);
        x->flags |= KVF_SAMPLE_PEN_BIAS;
        x->bias = s->bias_values[i];
    }
    for (int i = 0; i < s->num_allowed; ++i) {
        kvf_pen_at(ws, s->allowed_ids[i], pen, &n)->flags |= KVF_SAMPLE_PEN_ALLOW;
    }
    for (int w = 0; w < s->num_bad_words; ++w) {
        int32_t id = kvf_bad_word_next(s, w, tokens, prompt_len, num_tokens);
        if (id >= 0) {
            kvf_pen_at(ws, id, pen, &n)->flags |= KVF_SAMPLE_PEN_MASK;
        }
    }
    for (int e = start; e < n; ++e) {
        ws->seen[pen[e].id] = 0;   /* the scratch back to all-zero */
    }
    row->pen_count = n - start;
    *num_pen = n;
}

kvf_status_t kvf_sampler_device_row(const kvf_sampling_t *s, uint64_t *rng,
                                    const int32_t *tokens, int prompt_len, int num_tokens,
                                    int vocab, const int *eos, int num_eos,
                                    kvf_sample_row_t *row, kvf_sample_pen_t *pen, int *num_pen)
{
    if (kvf_sampler_ws_grow(vocab) != KVF_OK) {
        return KVF_ERR_NO_MEMORY;
    }
    kvf_sampler_entries(&kvf_ws, s, tokens, prompt_len, num_tokens, vocab, eos, num_eos, row,
                        pen, num_pen);
    row->draw = kvf_sampler_greedy(s) ? 0 : kvf_sample_rng_next_hd(rng);
    return KVF_OK;
}

void kvf_sampler_device_out(const kvf_sampling_t *s, const kvf_sample_res_t *res,
                            kvf_sample_out_t *out)
{
    out->token = res->token;
    out->logprob = 0.0f;
    out->num_top = 0;
    if (!s->want_logprobs) {
        return;
    }
    out->logprob = kvf_sample_res_logprob(res, res->token_logit);
    out->num_top = res->num_top;
    for (int j = 0; j < res->num_top; ++j) {
        out->top_ids[j] = res->top_ids[j];
        out->top_logprobs[j] = kvf_sample_res_logprob(res, res->top_logits[j]);
    }
}
