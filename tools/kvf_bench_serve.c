/*
 * kvf bench-serve engine (see kvf_bench_serve.h for what is measured).
 *
 * One dispatcher (the caller's thread) draws the arrival times up front
 * from a seeded generator (exponential gaps for Poisson, gamma gaps for
 * burstiness != 1), waits for each arrival on the monotonic clock, takes a
 * concurrency slot when --max-concurrency is set, and starts one thread per
 * request; each thread opens its own HTTP/1.1 connection (Connection:
 * close), sends one streaming completion and reads the SSE stream until the
 * final chunk. Rejected: one event loop with many non-blocking sockets
 * (less code to get wrong with threads, and the proxy is thread-per-
 * connection anyway, so the generator needs no more than it serves).
 *
 * Prompt lengths are exact: synthetic prompts are arrays of token ids
 * drawn from [--token-lo, --token-hi), so the proxy does not tokenize them.
 * Every request asks for return_token_ids, so the client counts tokens from
 * ids, not from text (a multi-byte character may hold several tokens).
 */
#define _GNU_SOURCE
#include "kvf_bs_int.h"

#include "kvf_array.h"
#include "kvf_tokenizer.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/*
 * Parts: kvf_bs_request.c (one request: HTTP, chunked, SSE), kvf_bs_output.c
 * (table, JSON, CSV); this file: arrivals, params, workload, the run.
 */

/* ---- seeded random numbers -------------------------------------------------- */

static uint64_t kvf_bs_mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

typedef struct {
    uint64_t s;
} kvf_bs_rng_t;

static uint64_t kvf_bs_next(kvf_bs_rng_t *r)
{
    r->s += 0x9e3779b97f4a7c15ull;
    return kvf_bs_mix(r->s);
}

/* Uniform in (0, 1). */
static double kvf_bs_unit(kvf_bs_rng_t *r)
{
    return ((double)(kvf_bs_next(r) >> 11) + 0.5) / 9007199254740992.0;
}

static double kvf_bs_normal(kvf_bs_rng_t *r)
{
    return sqrt(-2.0 * log(kvf_bs_unit(r))) * cos(2.0 * M_PI * kvf_bs_unit(r));
}

/* Gamma(shape k, scale 1) by Marsaglia and Tsang; k < 1 by the boost U^(1/k). */
static double kvf_bs_gamma(kvf_bs_rng_t *r, double k)
{
    double boost = 1.0;

    if (k < 1.0) {
        boost = pow(kvf_bs_unit(r), 1.0 / k);
        k += 1.0;
    }
    for (;;) {
        double d = k - 1.0 / 3.0, c = 1.0 / sqrt(9.0 * d);
        double x = kvf_bs_normal(r), v = 1.0 + c * x;

        if (v <= 0) {
            continue;
        }
        v = v * v * v;
        if (log(kvf_bs_unit(r)) < 0.5 * x * x + d - d * v + d * log(v)) {
            return d * v * boost;
        }
    }
}

static int kvf_bs_draw_len(kvf_bs_rng_t *r, int len, kvf_bs_dist_t dist, double spread)
{
    double v = len;

    if (dist == KVF_BS_DIST_UNIFORM) {
        v = (len - spread) + kvf_bs_unit(r) * (2.0 * spread + 1.0);
        v = floor(v);
    } else if (dist == KVF_BS_DIST_NORMAL) {
        v = round(len + spread * kvf_bs_normal(r));
    }
    return (v < 1) ? 1 : (int)v;
}

/* ---- params ------------------------------------------------------------------- */

void kvf_bs_params_default(kvf_bs_params_t *p)
{
    memset(p, 0, sizeof(*p));
    snprintf(p->host, sizeof(p->host), "127.0.0.1");
    p->port = 8000;
    p->input_len = 128;
    p->output_len = 32;
    p->token_lo = 32;
    p->token_hi = 127;
    p->num_requests = 100;
    p->burstiness = 1.0;
    p->ignore_eos = true;
    p->temperature_set = true;
    p->slo_ttft_ms = p->slo_tpot_ms = p->slo_e2e_ms = -1;
    p->timeout_s = 60;
    snprintf(p->endpoint, sizeof(p->endpoint), "/v1/completions");
    p->pct_metrics = KVF_BS_M_TTFT | KVF_BS_M_TPOT | KVF_BS_M_ITL;   /* vLLM's defaults */
    p->pct[0] = 99;
    p->num_pct = 1;
    p->dataset_kind = KVF_BS_DS_CUSTOM;
    p->sharegpt_output_len = -1;
    p->sonnet_input_len = 550;      /* vLLM's sonnet defaults */
    p->sonnet_output_len = 150;
    p->sonnet_prefix_len = 200;
}

int kvf_bs_parse_url(const char *flag, const char *url, kvf_bs_params_t *p)
{
    const char *h = url, *colon;
    char *end;
    long port = 80;
    size_t hl;

    if (strncmp(h, "http://", 7) == 0) {
        h += 7;
    } else if (strstr(h, "://") != NULL) {
        kvf_error("bad value '%s' for --%s: only http:// URLs are supported", url, flag);
        return -1;
    }
    colon = strchr(h, ':');
    hl = (colon != NULL) ? (size_t)(colon - h) : strcspn(h, "/");
    if ((hl == 0) || (hl >= sizeof(p->host))) {
        kvf_error("bad value '%s' for --%s: no host (e.g. http://127.0.0.1:8000)", url, flag);
        return -1;
    }
    if (colon != NULL) {
        errno = 0;
        port = strtol(colon + 1, &end, 10);
        if ((errno != 0) || (end == colon + 1) || ((*end != '\0') && (strcmp(end, "/") != 0)) ||
            (port < 1) || (port > 65535)) {
            kvf_error("bad value '%s' for --%s: the port must be in [1, 65535]", url, flag);
            return -1;
        }
    } else if ((h[hl] != '\0') && (strcmp(h + hl, "/") != 0)) {
        kvf_error("bad value '%s' for --%s: give the proxy's base URL, without a path", url,
                  flag);
        return -1;
    }
    memcpy(p->host, h, hl);
    p->host[hl] = '\0';
    p->port = (int)port;
    return 0;
}

int kvf_bs_params_check(const kvf_bs_params_t *p)
{
#define KVF_BS_REQUIRE(_cond, _flag, _fmt, ...)                                      \
    do {                                                                             \
        if (!(_cond)) {                                                              \
            kvf_error("bad value " _fmt " for --%s", ##__VA_ARGS__, _flag);          \
            return -1;                                                               \
        }                                                                            \
    } while (0)
    KVF_BS_REQUIRE(p->input_len >= 1, "input-len", "%d: must be >= 1", p->input_len);
    KVF_BS_REQUIRE(p->output_len >= 1, "output-len", "%d: must be >= 1", p->output_len);
    KVF_BS_REQUIRE(p->input_spread >= 0, "input-spread", "%g: must be >= 0", p->input_spread);
    KVF_BS_REQUIRE(p->output_spread >= 0, "output-spread", "%g: must be >= 0",
                   p->output_spread);
    KVF_BS_REQUIRE((p->token_lo >= 0) && (p->token_hi > p->token_lo), "token-hi",
                   "%d: token ids are drawn from [--token-lo %d, --token-hi), which is empty",
                   p->token_hi, p->token_lo);
    KVF_BS_REQUIRE(p->num_requests >= 0, "num-requests", "%d: must be >= 0", p->num_requests);
    KVF_BS_REQUIRE(p->duration_s >= 0, "duration", "%g: must be >= 0", p->duration_s);
    KVF_BS_REQUIRE((p->num_requests > 0) || (p->duration_s > 0), "num-requests",
                   "%d: with no --duration, at least one request must be asked for",
                   p->num_requests);
    KVF_BS_REQUIRE(isfinite(p->request_rate), "request-rate", "%g: must be finite "
                   "(0 or less: all at once)", p->request_rate);
    KVF_BS_REQUIRE(p->burstiness > 0, "burstiness", "%g: must be > 0 (1: Poisson)",
                   p->burstiness);
    KVF_BS_REQUIRE(p->max_concurrency >= 0, "max-concurrency", "%d: must be >= 0",
                   p->max_concurrency);
    KVF_BS_REQUIRE((p->request_rate > 0) || (p->max_concurrency > 0) || (p->duration_s == 0),
                   "duration", "%g: a duration needs --request-rate or --max-concurrency "
                   "(otherwise requests would start without bound)", p->duration_s);
    KVF_BS_REQUIRE(p->warmup >= 0, "warmup", "%d: must be >= 0", p->warmup);
    KVF_BS_REQUIRE(p->timeout_s > 0, "timeout", "%g: must be > 0", p->timeout_s);
    KVF_BS_REQUIRE(p->temperature >= 0, "temperature", "%g: must be >= 0", p->temperature);
    KVF_BS_REQUIRE(!isnan(p->slo_ttft_ms) && !isnan(p->slo_tpot_ms) && !isnan(p->slo_e2e_ms),
                   "goodput", "%g: an SLO must be a number", p->slo_ttft_ms);
    KVF_BS_REQUIRE(p->prefix_len >= 0, "random-prefix-len", "%d: must be >= 0", p->prefix_len);
    KVF_BS_REQUIRE((p->ramp_up == 0) || ((p->ramp_start_rps >= 0) && (p->ramp_end_rps > 0) &&
                                         (p->ramp_start_rps <= p->ramp_end_rps)),
                   "ramp-up-start-rps", "%g (end %g): need 0 <= start <= end, end > 0",
                   p->ramp_start_rps, p->ramp_end_rps);
    KVF_BS_REQUIRE((p->ramp_up != 2) || (p->ramp_start_rps > 0), "ramp-up-start-rps",
                   "%g: must be > 0 for an exponential ramp-up", p->ramp_start_rps);
#undef KVF_BS_REQUIRE
    return 0;
}

/* ---- workload ----------------------------------------------------------------- */

/*
 * openai-chat, as vLLM's benchmark sends it: the prompt becomes one user message (token ids
 * decoded with p->chat_tok) and max_tokens max_completion_tokens. 0, or -1 for ids without a
 * tokenizer (kvf_cmd_bench_serve refuses that before it sends anything).
 */
static int kvf_bs_chatify(const kvf_bs_params_t *p, cJSON *root)
{
    cJSON *prompt = cJSON_DetachItemFromObjectCaseSensitive(root, "prompt");
    cJSON *mt = cJSON_DetachItemFromObjectCaseSensitive(root, "max_tokens");
    cJSON *msgs = cJSON_AddArrayToObject(root, "messages");
    cJSON *m = cJSON_CreateObject();
    char *text = NULL;
    int rc = 0;

    if (cJSON_IsString(prompt)) {
        text = strdup(prompt->valuestring);
    } else if (cJSON_IsArray(prompt) && (p->chat_tok != NULL)) {
        int n = cJSON_GetArraySize(prompt), i = 0;
        int32_t *ids = calloc((size_t)n + 1, sizeof(int32_t));
        size_t cap = (size_t)n * 16 + 1;
        const cJSON *it;

        text = malloc(cap);
        cJSON_ArrayForEach(it, prompt) {
            ids[i++] = (int32_t)it->valuedouble;
        }
        if ((ids != NULL) && (text != NULL)) {
            kvf_tokenizer_decode(p->chat_tok, ids, n, text, cap);
        }
        free(ids);
    }
    rc = (text != NULL) ? 0 : -1;
    cJSON_AddStringToObject(m, "role", "user");
    cJSON_AddStringToObject(m, "content", (text != NULL) ? text : "");
    cJSON_AddItemToArray(msgs, m);
    if (mt != NULL) {
        cJSON_AddItemToObject(root, "max_completion_tokens", mt);
    }
    free(text);
    cJSON_Delete(prompt);
    return rc;
}

/* multi_turn's prompt of request @a index into @a arr (kvf_bench_serve.h); its length. */
static int kvf_bs_multi_turn(const kvf_bs_params_t *p, uint64_t index, cJSON *arr)
{
    const uint64_t conv = index % (uint64_t)p->mt_conversations;
    const int turn = (int)((index / (uint64_t)p->mt_conversations) % (uint64_t)p->mt_turns);
    const uint64_t span = (uint64_t)(p->token_hi - p->token_lo);
    int n = 0;

    for (int k = 0; k <= turn; ++k) {
        for (int part = 0; part < ((k < turn) ? 2 : 1); ++part) {   /* question, answer */
            kvf_bs_rng_t r = {kvf_bs_mix(p->seed * 0x9e3779b97f4a7c15ull + 0x7a11 +
                                         conv * 0x100000001b3ull + (uint64_t)k * 2 +
                                         (uint64_t)part)};
            int len = part ? p->mt_answer_len : (k == 0) ? p->mt_first_len : p->mt_question_len;
            for (int i = 0; (arr != NULL) && (i < len); ++i, ++n) {
                cJSON_AddItemToArray(arr, cJSON_CreateNumber(p->token_lo +
                                                             (int)(kvf_bs_next(&r) % span)));
            }
        }
    }
    return n;
}

/* The JSON body of request @a index (malloc'd), its prompt length (-1: text) and max_tokens. */
static char *kvf_bs_body(const kvf_bs_params_t *p, const kvf_bs_dataset_t *d, uint64_t index,
                         int *prompt_len_p, int *max_tokens_p)
{
    kvf_bs_rng_t rng = {kvf_bs_mix(p->seed * 0x100000001b3ull + index)};
    cJSON *root = cJSON_CreateObject();
    int max_tokens;
    char *s;

    if (d->n > 0) {
        int li = (int)(index % (uint64_t)d->n);
        const kvf_bs_item_t *it = &d->items[li];
        cJSON_AddItemToObject(root, "prompt", cJSON_Duplicate(it->prompt, 1));
        *prompt_len_p = cJSON_IsArray(it->prompt) ? cJSON_GetArraySize(it->prompt) : -1;
        max_tokens = (it->max_tokens > 0) ? it->max_tokens :
                     kvf_bs_draw_len(&rng, p->output_len, p->output_dist, p->output_spread);
    } else if (p->mt_conversations > 0) {   /* multi_turn */
        *prompt_len_p = kvf_bs_multi_turn(p, index, cJSON_AddArrayToObject(root, "prompt"));
        max_tokens = p->mt_answer_len;
    } else if (p->rep_num_prefixes > 0) {   /* prefix_repetition */
        uint64_t which = kvf_bs_next(&rng) % (uint64_t)p->rep_num_prefixes;
        kvf_bs_rng_t prng = {kvf_bs_mix(p->seed * 0x9e3779b97f4a7c15ull + 0x5eed + which)};
        cJSON *arr = cJSON_AddArrayToObject(root, "prompt");
        uint64_t span = (uint64_t)(p->token_hi - p->token_lo);

        for (int i = 0; i < p->rep_prefix_len + p->rep_suffix_len; ++i) {
            kvf_bs_rng_t *r = (i < p->rep_prefix_len) ? &prng : &rng;
            cJSON_AddItemToArray(arr, cJSON_CreateNumber(p->token_lo +
                                                         (int)(kvf_bs_next(r) % span)));
        }
        *prompt_len_p = p->rep_prefix_len + p->rep_suffix_len;
        max_tokens = p->output_len;
    } else {
        int n = kvf_bs_draw_len(&rng, p->input_len, p->input_dist, p->input_spread);
        cJSON *arr = cJSON_AddArrayToObject(root, "prompt");
        kvf_bs_rng_t prng = {kvf_bs_mix(p->seed * 0x9e3779b97f4a7c15ull + 0x5eed)};

        for (int i = 0; i < p->prefix_len; ++i) {   /* the same prefix on every prompt */
            int id = p->token_lo + (int)(kvf_bs_next(&prng) %
                                         (uint64_t)(p->token_hi - p->token_lo));
            cJSON_AddItemToArray(arr, cJSON_CreateNumber(id));
        }
        n += p->prefix_len;
        for (int i = p->prefix_len; i < n; ++i) {
            int id = p->token_lo + (int)(kvf_bs_next(&rng) % (uint64_t)(p->token_hi - p->token_lo));
            cJSON_AddItemToArray(arr, cJSON_CreateNumber(id));
        }
        *prompt_len_p = n;
        max_tokens = kvf_bs_draw_len(&rng, p->output_len, p->output_dist, p->output_spread);
    }
    if (p->model[0] != '\0') {
        cJSON_AddStringToObject(root, "model", p->model);
    }
    cJSON_AddNumberToObject(root, "max_tokens", max_tokens);
    if (p->temperature_set) {
        cJSON_AddNumberToObject(root, "temperature", p->temperature);
    }
    cJSON_AddNumberToObject(root, "seed", (double)(index & 0xffffffffu));
    cJSON_AddBoolToObject(root, "stream", 1);
    /* usage comes in its own last chunk, without choices, as vLLM sends it */
    cJSON_AddBoolToObject(cJSON_AddObjectToObject(root, "stream_options"), "include_usage", 1);
    if (p->ignore_eos) {
        cJSON_AddBoolToObject(root, "ignore_eos", 1);
    }
    cJSON_AddBoolToObject(root, "return_token_ids", 1);
    if (p->extra_body[0] != '\0') {   /* sampling flags and --extra-body: theirs win */
        cJSON *extra = cJSON_Parse(p->extra_body), *it;

        cJSON_ArrayForEach(it, extra) {
            cJSON_DeleteItemFromObjectCaseSensitive(root, it->string);
            cJSON_AddItemToObject(root, it->string, cJSON_Duplicate(it, 1));
        }
        cJSON_Delete(extra);
    }
    if (p->chat) {
        (void)kvf_bs_chatify(p, root);   /* ids without a tokenizer were refused at start */
    }
    s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    *max_tokens_p = max_tokens;
    return s;
}

/* ---- the run ------------------------------------------------------------------ */

typedef struct {
    const kvf_bs_params_t *p;
    atomic_int            *done, *failed, *sent;
    atomic_bool            stop;
    uint64_t               t0_ns;
    pthread_mutex_t        lock;
    pthread_cond_t         cond;
} kvf_bs_progress_t;

static void *kvf_bs_progress_thread(void *arg)
{
    kvf_bs_progress_t *pr = arg;
    const kvf_bs_params_t *p = pr->p;

    pthread_mutex_lock(&pr->lock);
    while (!atomic_load(&pr->stop)) {
        struct timespec ts;
        int done = atomic_load(pr->done), failed = atomic_load(pr->failed);
        int sent = atomic_load(pr->sent);
        double t = kvf_bs_ms(pr->t0_ns, kvf_time_now_ns()) / 1000.0;
        double frac = (p->num_requests > 0) ? (double)done / p->num_requests :
                      (p->duration_s > 0 ? t / p->duration_s : 0);
        char bar[33];
        int fill = (int)(frac * 30 + 0.5);

        fill = fill > 30 ? 30 : fill;
        memset(bar, '#', (size_t)fill);
        memset(bar + fill, '.', (size_t)(30 - fill));
        bar[30] = '\0';
        fprintf(stderr, "\r[%s] %d done, %d failed, %d in flight, %.1f s   ", bar, done,
                failed, sent - done, t);
        fflush(stderr);
        ts = kvf_time_deadline_ts(CLOCK_REALTIME, 250);   /* the cond's default clock */
        pthread_cond_timedwait(&pr->cond, &pr->lock, &ts);
    }
    pthread_mutex_unlock(&pr->lock);
    fprintf(stderr, "\n");
    return NULL;
}

static int kvf_bs_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return (x < y) ? -1 : (x > y);
}

double kvf_bs_percentile(const kvf_bs_stat_t *st, double q)
{
    double pos;
    int lo, hi;

    if ((st->n == 0) || (st->v == NULL)) {
        return 0;
    }
    pos = q / 100.0 * (st->n - 1);
    lo = (int)floor(pos);
    hi = (lo + 1 < st->n) ? lo + 1 : lo;
    return st->v[lo] + (st->v[hi] - st->v[lo]) * (pos - lo);
}

/* Mean, std and percentiles of @a v (sorted in place, owned by the result from here). */
static kvf_bs_stat_t kvf_bs_stat(double *v, int n)
{
    kvf_bs_stat_t s = {0, 0, 0, 0, 0, n, v};
    double var = 0;

    if (n == 0) {
        return s;
    }
    qsort(v, (size_t)n, sizeof(*v), kvf_bs_cmp);
    for (int i = 0; i < n; ++i) {
        s.mean += v[i];
    }
    s.mean /= n;
    for (int i = 0; i < n; ++i) {
        var += (v[i] - s.mean) * (v[i] - s.mean);
    }
    s.std = sqrt(var / n);
    s.p50 = kvf_bs_percentile(&s, 50);
    s.p90 = kvf_bs_percentile(&s, 90);
    s.p99 = kvf_bs_percentile(&s, 99);
    return s;
}

/* Most requests in flight at once, and most output tokens finished within one second. */
static void kvf_bs_peaks(kvf_bs_summary_t *s, double first_ms)
{
    int n = s->sent, maxc = 0, nb;
    double *bucket;

    for (int i = 0; i < n; ++i) {
        int c = 0;
        for (int j = 0; j < n; ++j) {
            c += (s->results[j].start_ms <= s->results[i].start_ms) &&
                 (s->results[j].end_ms > s->results[i].start_ms);
        }
        maxc = (c > maxc) ? c : maxc;
    }
    s->max_concurrent = maxc;
    nb = (int)(s->duration_s + 2);
    bucket = calloc((size_t)nb, sizeof(double));
    if (bucket == NULL) {
        return;
    }
    for (int i = 0; i < n; ++i) {
        const kvf_bs_result_t *r = &s->results[i];
        double t = r->start_ms + r->ttft_ms - first_ms;

        if (!r->ok || (r->output_tokens == 0)) {
            continue;
        }
        for (int k = 0; k <= r->num_itl; ++k) {
            int b = (int)(t / 1000.0);
            if ((b >= 0) && (b < nb)) {
                bucket[b] += 1;
            }
            t += (k < r->num_itl) ? r->itl_ms[k] : 0;
        }
    }
    for (int b = 0; b < nb; ++b) {
        s->max_output_tps = fmax(s->max_output_tps, bucket[b]);
    }
    free(bucket);
}

static void kvf_bs_summarize(const kvf_bs_params_t *p, kvf_bs_summary_t *s)
{
    int n = s->sent, nt = 0, nitl = 0, nshare = 0;
    double *ttft = calloc((size_t)n + 1, sizeof(double));
    double *e2e = calloc((size_t)n + 1, sizeof(double));
    double *tpot = calloc((size_t)n + 1, sizeof(double));
    double *itl, first = INFINITY, last = 0, share = 0;
    int total_itl = 0;

    for (int i = 0; i < n; ++i) {
        total_itl += s->results[i].num_itl;
    }
    itl = calloc((size_t)total_itl + 1, sizeof(double));
    for (int i = 0; i < n; ++i) {
        kvf_bs_result_t *r = &s->results[i];

        first = fmin(first, r->start_ms);
        last = fmax(last, r->end_ms);
        if (!r->ok) {
            int k;
            s->failed++;
            for (k = 0; k < s->num_kinds; ++k) {
                if (strcmp(s->kinds[k], r->error_kind) == 0) {
                    break;
                }
            }
            if ((k == s->num_kinds) && (k < 8)) {
                snprintf(s->kinds[k], sizeof(s->kinds[k]), "%s", r->error_kind);
                snprintf(s->kind_first_error[k], sizeof(s->kind_first_error[k]), "%s",
                         r->error);
                s->num_kinds++;
            }
            if (k < 8) {
                s->kind_counts[k]++;
            }
            continue;
        }
        r->good = ((p->slo_ttft_ms < 0) || (r->ttft_ms <= p->slo_ttft_ms)) &&
                  ((p->slo_tpot_ms < 0) || (r->tpot_ms < 0) || (r->tpot_ms <= p->slo_tpot_ms)) &&
                  ((p->slo_e2e_ms < 0) || (r->e2e_ms <= p->slo_e2e_ms));
        s->good += r->good;
        s->completed++;
        s->input_tokens += (r->prompt_tokens > 0) ? r->prompt_tokens : 0;
        s->output_tokens += r->output_tokens;
        ttft[s->completed - 1] = r->ttft_ms;
        e2e[s->completed - 1] = r->e2e_ms;
        if (r->tpot_ms >= 0) {
            tpot[nt++] = r->tpot_ms;
        }
        memcpy(itl + nitl, r->itl_ms, sizeof(double) * (size_t)r->num_itl);
        nitl += r->num_itl;
        if (r->transfer_share >= 0) {
            share += r->transfer_share;
            nshare++;
        }
    }
    s->duration_s = (n > 0) ? (last - first) / 1000.0 : 0;
    if (s->duration_s > 0) {
        s->request_throughput = s->completed / s->duration_s;
        s->output_throughput = (double)s->output_tokens / s->duration_s;
        s->total_throughput = (double)(s->input_tokens + s->output_tokens) / s->duration_s;
        s->goodput = s->good / s->duration_s;
    }
    s->ttft = kvf_bs_stat(ttft, s->completed);
    s->e2e = kvf_bs_stat(e2e, s->completed);
    s->tpot = kvf_bs_stat(tpot, nt);
    s->itl = kvf_bs_stat(itl, nitl);
    s->transfer_share_mean = (nshare > 0) ? share / nshare : -1;
    kvf_bs_peaks(s, (n > 0) ? first : 0);
}

static void kvf_bs_sleep_until(uint64_t t_ns)
{
    struct timespec ts = {(time_t)(t_ns / 1000000000u), (long)(t_ns % 1000000000u)};

    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

/* Warm-up: one at a time, the same kind of request, not counted. 0, or -1 on a failure. */
static int kvf_bs_warmup(const kvf_bs_params_t *p, const struct addrinfo *ai,
                         const kvf_bs_dataset_t *ds)
{
    for (int w = 0; w < p->warmup; ++w) {
        kvf_bs_result_t res = {0};
        atomic_int d = 0, f = 0;
        kvf_bs_job_t job = {.p = p, .addr = ai, .t0_ns = kvf_time_now_ns(), .res = &res,
                            .done = &d, .failed = &f};
        int plen, mt;

        job.body = kvf_bs_body(p, ds, UINT64_MAX - (uint64_t)w, &plen, &mt);
        kvf_bs_thread(&job);
        free(res.itl_ms);
        if (!res.ok) {
            kvf_error("warm-up request %d to %s:%d failed (%s): %s", w + 1, p->host, p->port,
                      res.error_kind, res.error);
            return -1;
        }
    }
    return 0;
}

int kvf_bs_ready_check(const kvf_bs_params_t *p, double timeout_s)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    kvf_bs_dataset_t ds = {0};
    uint64_t end = kvf_time_now_ns() + (uint64_t)(timeout_s * 1e9);
    char port[16];
    int rc = -1;

    if (kvf_bs_check_model(p) != 0) {
        return -1;
    }
    if (timeout_s <= 0) {   /* vLLM's default: no test request */
        return 0;
    }
    snprintf(port, sizeof(port), "%d", p->port);
    if ((getaddrinfo(p->host, port, &hints, &ai) != 0) ||
        ((p->dataset[0] != '\0') && (kvf_bs_dataset_open(p, ai, &ds) != 0))) {
        kvf_error("ready check: cannot resolve %s or read the dataset", p->host);
        goto out;
    }
    for (;;) {
        kvf_bs_result_t res = {0};
        atomic_int d = 0, f = 0;
        kvf_bs_job_t job = {.p = p, .addr = ai, .t0_ns = kvf_time_now_ns(), .res = &res,
                            .done = &d, .failed = &f};
        int plen, mt;

        job.body = kvf_bs_body(p, &ds, 0, &plen, &mt);
        kvf_bs_thread(&job);
        free(res.itl_ms);
        free(res.text);
        if (res.ok) {
            rc = 0;
            break;
        }
        if (((res.http_code >= 400) && (res.http_code < 500)) || (kvf_time_now_ns() >= end)) {
            kvf_error("ready check: the test request to http://%s:%d%s failed (%s): %s",
                      p->host, p->port, p->endpoint, res.error_kind, res.error);
            break;
        }
        usleep(500000);   /* not up yet: try again, as vLLM's ready check does */
    }
out:
    kvf_bs_dataset_free(&ds);
    if (ai != NULL) {
        freeaddrinfo(ai);
    }
    return rc;
}

/* The dispatcher of one run: the jobs it started and what their threads count. */
typedef struct {
    const kvf_bs_params_t  *p;
    const struct addrinfo  *ai;
    const kvf_bs_dataset_t *ds;
    kvf_bs_job_t          **jobs;
    int                     sent, cap;
    atomic_int              done, failed, sent_a;
    sem_t                   slots;      /* --max-concurrency > 0 */
    pthread_attr_t          attr;
    kvf_bs_progress_t       pr;
} kvf_bs_dispatch_t;

/* Job @a i, counted in d->jobs (out of memory aborts: the run's figures would lie). */
static kvf_bs_job_t *kvf_bs_new_job(kvf_bs_dispatch_t *d, uint64_t i)
{
    const kvf_bs_params_t *p = d->p;
    kvf_bs_job_t *job = calloc(1, sizeof(*job));
    int plen, mt;

    if ((job == NULL) || ((job->res = calloc(1, sizeof(*job->res))) == NULL) ||
        (KVF_ARRAY_GROW(d->jobs, d->cap, d->sent + 1, 64) != KVF_OK)) {
        kvf_error("out of memory after %d requests", d->sent);
        abort();
    }
    job->p = p;
    job->addr = d->ai;
    job->t0_ns = d->pr.t0_ns;
    job->slots = (p->max_concurrency > 0) ? &d->slots : NULL;
    job->done = &d->done;
    job->failed = &d->failed;
    job->res->index = (int)i;
    job->res->proxy_ttft_ms = job->res->transfer_ms = job->res->handshake_ms = -1;
    job->res->kv_bytes = job->res->first_decode_ms = job->res->transfer_share = -1;
    job->body = kvf_bs_body(p, d->ds, i, &plen, &mt);
    job->res->prompt_tokens = plen;
    job->res->max_tokens = mt;
    d->jobs[d->sent++] = job;
    atomic_fetch_add(&d->sent_a, 1);
    return job;
}

/*
 * Start the requests at their arrival times (Gamma gaps, drawn from the
 * seed), each on its own thread, within --max-concurrency slots, until
 * --num-requests or --duration is reached.
 */
static void kvf_bs_dispatch(kvf_bs_dispatch_t *d)
{
    const kvf_bs_params_t *p = d->p;
    kvf_bs_rng_t arr_rng = {kvf_bs_mix(p->seed ^ 0xa5a5a5a5ull)};
    double arrival_s = 0;

    for (uint64_t i = 0;; ++i) {
        kvf_bs_job_t *job;
        double due_ms;

        if ((p->num_requests > 0) && (i >= (uint64_t)p->num_requests)) {
            break;
        }
        if ((p->request_rate > 0) || (p->ramp_up != 0)) {
            double rate = p->request_rate;

            if (p->ramp_up != 0) {
                /* vLLM's ramp-up: the rate moves from start to end over the requests */
                double f = (double)i / (double)((p->num_requests > 1) ? p->num_requests - 1 : 1);
                rate = (p->ramp_up == 1) ?
                       p->ramp_start_rps + (p->ramp_end_rps - p->ramp_start_rps) * f :
                       p->ramp_start_rps * pow(p->ramp_end_rps / p->ramp_start_rps, f);
            }
            if (i > 0) {
                /* Gamma(shape b, scale 1/(rate b)): mean gap 1/rate; b = 1 is exponential. */
                arrival_s += kvf_bs_gamma(&arr_rng, p->burstiness) /
                             (rate * p->burstiness);
            }
            if ((p->duration_s > 0) && (arrival_s >= p->duration_s)) {
                break;
            }
            kvf_bs_sleep_until(d->pr.t0_ns + (uint64_t)(arrival_s * 1e9));
        }
        due_ms = kvf_bs_ms(d->pr.t0_ns, kvf_time_now_ns());
        if (p->max_concurrency > 0) {
            while (sem_wait(&d->slots) != 0) {
            }
        }
        if ((p->duration_s > 0) &&
            (kvf_time_now_ns() - d->pr.t0_ns >= (uint64_t)(p->duration_s * 1e9))) {
            if (p->max_concurrency > 0) {
                sem_post(&d->slots);
            }
            break;
        }
        job = kvf_bs_new_job(d, i);
        job->res->arrival_ms = due_ms;
        if (pthread_create(&job->thread, &d->attr, kvf_bs_thread, job) != 0) {
            kvf_bs_fail(job->res, "connect", "could not start a client thread");
            job->thread = 0;
            kvf_bs_thread(job);   /* counts it and frees the slot */
        }
    }
}

int kvf_bs_run(const kvf_bs_params_t *p, kvf_bs_summary_t *summary_p)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    kvf_bs_dataset_t ds = {0};
    kvf_bs_dispatch_t *d;
    pthread_t progress;
    char port[16];
    bool have_progress = false;
    int rc;

    memset(summary_p, 0, sizeof(*summary_p));
    snprintf(port, sizeof(port), "%d", p->port);
    rc = getaddrinfo(p->host, port, &hints, &ai);
    if (rc != 0) {
        kvf_error("cannot resolve %s: %s", p->host, gai_strerror(rc));
        return -1;
    }
    if ((p->dataset[0] != '\0') && (kvf_bs_dataset_open(p, ai, &ds) != 0)) {
        freeaddrinfo(ai);
        return -1;
    }
    d = calloc(1, sizeof(*d));
    if ((d == NULL) || (kvf_bs_warmup(p, ai, &ds) != 0)) {
        free(d);
        kvf_bs_dataset_free(&ds);
        freeaddrinfo(ai);
        return -1;
    }
    d->p = p;
    d->ai = ai;
    d->ds = &ds;
    d->pr = (kvf_bs_progress_t){.p = p, .done = &d->done, .failed = &d->failed,
                                .sent = &d->sent_a};

    pthread_attr_init(&d->attr);
    pthread_attr_setstacksize(&d->attr, 256 * 1024);
    if (p->max_concurrency > 0) {
        sem_init(&d->slots, 0, (unsigned)p->max_concurrency);
    }
    d->pr.t0_ns = kvf_time_now_ns();
    pthread_mutex_init(&d->pr.lock, NULL);
    pthread_cond_init(&d->pr.cond, NULL);
    if (p->progress) {
        have_progress = (pthread_create(&progress, NULL, kvf_bs_progress_thread, &d->pr) == 0);
    }
    kvf_bs_dispatch(d);
    for (int i = 0; i < d->sent; ++i) {
        if (d->jobs[i]->thread != 0) {
            pthread_join(d->jobs[i]->thread, NULL);
        }
    }
    if (have_progress) {
        pthread_mutex_lock(&d->pr.lock);
        atomic_store(&d->pr.stop, true);
        pthread_cond_signal(&d->pr.cond);
        pthread_mutex_unlock(&d->pr.lock);
        pthread_join(progress, NULL);
    }
    pthread_mutex_destroy(&d->pr.lock);
    pthread_cond_destroy(&d->pr.cond);
    pthread_attr_destroy(&d->attr);
    if (p->max_concurrency > 0) {
        sem_destroy(&d->slots);
    }

    summary_p->sent = d->sent;
    summary_p->results = calloc((size_t)d->sent + 1, sizeof(kvf_bs_result_t));
    for (int i = 0; i < d->sent; ++i) {
        summary_p->results[i] = *d->jobs[i]->res;
        free(d->jobs[i]->res);
        free(d->jobs[i]);
    }
    free(d->jobs);
    free(d);
    kvf_bs_summarize(p, summary_p);
    kvf_bs_dataset_free(&ds);
    freeaddrinfo(ai);
    return 0;
}

void kvf_bs_summary_cleanup(kvf_bs_summary_t *s)
{
    for (int i = 0; (s->results != NULL) && (i < s->sent); ++i) {
        free(s->results[i].itl_ms);
        free(s->results[i].text);
    }
    free(s->results);
    free(s->ttft.v);
    free(s->tpot.v);
    free(s->itl.v);
    free(s->e2e.v);
    memset(s, 0, sizeof(*s));
}
