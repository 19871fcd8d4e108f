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
#include "kvf_bench_serve.h"
#include "kvf_log.h"
#include "kvf_time.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netdb.h>
#include <poll.h>
#include <stdarg.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define KVF_BS_RECV_CHUNK 16384

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
    p->timeout_s = 60;
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
    KVF_BS_REQUIRE((p->slo_ttft_ms >= 0) && (p->slo_tpot_ms >= 0) && (p->slo_e2e_ms >= 0),
                   "slo-ttft-ms", "%g: SLOs must be >= 0 (0: none)", p->slo_ttft_ms);
#undef KVF_BS_REQUIRE
    return 0;
}

/* ---- workload ----------------------------------------------------------------- */

typedef struct {
    cJSON **prompts;    /* the "prompt" item of each line (owned by lines) */
    int    *max_tokens; /* 0: draw from the output distribution */
    cJSON **lines;
    int     n;
} kvf_bs_dataset_t;

static void kvf_bs_dataset_free(kvf_bs_dataset_t *d)
{
    for (int i = 0; i < d->n; ++i) {
        cJSON_Delete(d->lines[i]);
    }
    free(d->lines);
    free(d->prompts);
    free(d->max_tokens);
    memset(d, 0, sizeof(*d));
}

/* JSONL: {"prompt": "text" | [ids], "max_tokens": n (optional)} per line. */
static int kvf_bs_dataset_load(const char *path, kvf_bs_dataset_t *d)
{
    FILE *f = fopen(path, "r");
    char *line = NULL;
    size_t cap = 0;
    int lineno = 0, cap_n = 0;

    memset(d, 0, sizeof(*d));
    if (f == NULL) {
        kvf_error("cannot open --dataset %s: %m", path);
        return -1;
    }
    while (getline(&line, &cap, f) >= 0) {
        cJSON *root, *prompt, *mt;

        ++lineno;
        if (strspn(line, " \t\r\n") == strlen(line)) {
            continue;
        }
        root = cJSON_Parse(line);
        prompt = cJSON_GetObjectItemCaseSensitive(root, "prompt");
        if ((prompt == NULL) || (!cJSON_IsString(prompt) && !cJSON_IsArray(prompt))) {
            kvf_error("--dataset %s line %d: needs a \"prompt\" (string or array of token ids)",
                      path, lineno);
            goto err;
        }
        mt = cJSON_GetObjectItemCaseSensitive(root, "max_tokens");
        if ((mt != NULL) && (!cJSON_IsNumber(mt) || (mt->valuedouble < 1))) {
            kvf_error("--dataset %s line %d: \"max_tokens\" must be an integer >= 1", path,
                      lineno);
            goto err;
        }
        if (d->n == cap_n) {
            cap_n = cap_n * 2 + 64;
            d->lines = realloc(d->lines, sizeof(*d->lines) * (size_t)cap_n);
            d->prompts = realloc(d->prompts, sizeof(*d->prompts) * (size_t)cap_n);
            d->max_tokens = realloc(d->max_tokens, sizeof(*d->max_tokens) * (size_t)cap_n);
            if ((d->lines == NULL) || (d->prompts == NULL) || (d->max_tokens == NULL)) {
                kvf_error("out of memory reading --dataset %s", path);
                goto err;
            }
        }
        d->lines[d->n] = root;
        d->prompts[d->n] = prompt;
        d->max_tokens[d->n] = (mt != NULL) ? (int)mt->valuedouble : 0;
        d->n++;
        continue;
err:
        cJSON_Delete(root);
        free(line);
        fclose(f);
        kvf_bs_dataset_free(d);
        return -1;
    }
    free(line);
    fclose(f);
    if (d->n == 0) {
        kvf_error("--dataset %s holds no prompt", path);
        return -1;
    }
    return 0;
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
        cJSON_AddItemToObject(root, "prompt", cJSON_Duplicate(d->prompts[li], 1));
        *prompt_len_p = cJSON_IsArray(d->prompts[li]) ? cJSON_GetArraySize(d->prompts[li]) : -1;
        max_tokens = (d->max_tokens[li] > 0) ? d->max_tokens[li] :
                     kvf_bs_draw_len(&rng, p->output_len, p->output_dist, p->output_spread);
    } else {
        int n = kvf_bs_draw_len(&rng, p->input_len, p->input_dist, p->input_spread);
        cJSON *arr = cJSON_AddArrayToObject(root, "prompt");
        for (int i = 0; i < n; ++i) {
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
    cJSON_AddNumberToObject(root, "temperature", p->temperature);
    cJSON_AddNumberToObject(root, "seed", (double)(index & 0xffffffffu));
    cJSON_AddBoolToObject(root, "stream", 1);
    cJSON_AddBoolToObject(root, "ignore_eos", p->ignore_eos);
    cJSON_AddBoolToObject(root, "return_token_ids", 1);
    s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    *max_tokens_p = max_tokens;
    return s;
}

/* ---- one request: HTTP/1.1 over a socket, SSE parsing ---------------------------- */

typedef struct {
    const kvf_bs_params_t *p;
    const struct addrinfo *addr;
    uint64_t               t0_ns;       /* benchmark start */
    char                  *body;
    kvf_bs_result_t       *res;
    sem_t                 *slots;       /* NULL: unlimited */
    atomic_int            *done;
    atomic_int            *failed;
    pthread_t              thread;
} kvf_bs_job_t;

typedef struct {
    kvf_bs_result_t *res;
    uint64_t start_ns, last_ns;
    int      itl_cap;
    bool     final;
    bool     done_mark;
} kvf_bs_stream_t;

static double kvf_bs_ms(uint64_t a, uint64_t b)
{
    return (double)((int64_t)(b - a)) / 1e6;
}

static void kvf_bs_fail(kvf_bs_result_t *res, const char *kind, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void kvf_bs_fail(kvf_bs_result_t *res, const char *kind, const char *fmt, ...)
{
    va_list ap;

    if (res->error_kind[0] != '\0') {
        return;    /* keep the first */
    }
    res->ok = false;
    snprintf(res->error_kind, sizeof(res->error_kind), "%s", kind);
    va_start(ap, fmt);
    vsnprintf(res->error, sizeof(res->error), fmt, ap);
    va_end(ap);
}

static double kvf_bs_num(const cJSON *o, const char *name, double dflt)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, name);

    return cJSON_IsNumber(it) ? it->valuedouble : dflt;
}

static void kvf_bs_str(const cJSON *o, const char *name, char *dst, size_t cap)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, name);

    if (cJSON_IsString(it)) {
        snprintf(dst, cap, "%s", it->valuestring);
    }
}

static int kvf_bs_push_itl(kvf_bs_stream_t *st, double ms)
{
    kvf_bs_result_t *res = st->res;

    if (res->num_itl == st->itl_cap) {
        int cap = st->itl_cap * 2 + 32;
        double *v = realloc(res->itl_ms, sizeof(*v) * (size_t)cap);
        if (v == NULL) {
            return -1;
        }
        res->itl_ms = v;
        st->itl_cap = cap;
    }
    res->itl_ms[res->num_itl++] = ms;
    return 0;
}

/* The final chunk's summary: usage, kv_transfer, ttft_ms, ttft_breakdown. */
static void kvf_bs_final(kvf_bs_result_t *res, const cJSON *root)
{
    const cJSON *kv = cJSON_GetObjectItemCaseSensitive(root, "kv_transfer");
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(root, "usage");
    const cJSON *bd = cJSON_GetObjectItemCaseSensitive(root, "ttft_breakdown");

    if (cJSON_IsObject(u)) {
        res->prompt_tokens = (int)kvf_bs_num(u, "prompt_tokens", res->prompt_tokens);
    }
    res->proxy_ttft_ms = kvf_bs_num(root, "ttft_ms", -1);
    if (cJSON_IsObject(kv)) {
        res->transfer_ms = kvf_bs_num(kv, "transfer_ms", -1);
        res->handshake_ms = kvf_bs_num(kv, "handshake_ms", -1);
        res->kv_bytes = kvf_bs_num(kv, "bytes", -1);
    }
    if (cJSON_IsObject(bd)) {
        static const char *const xfer[] = {"handshake_ms", "descriptor_posting_ms", "wire_ms",
                                           "post_ops_ms"};
        double total = kvf_bs_num(bd, "time_to_first_decode_token_ms", -1);
        double sum = 0;

        for (size_t i = 0; i < sizeof(xfer) / sizeof(xfer[0]); ++i) {
            sum += kvf_bs_num(bd, xfer[i], 0);
        }
        res->first_decode_ms = total;
        res->transfer_share = (total > 0) ? sum / total : -1;
    }
    kvf_bs_str(root, "prefill_instance", res->prefill_instance, sizeof(res->prefill_instance));
    kvf_bs_str(root, "decode_instance", res->decode_instance, sizeof(res->decode_instance));
}

/* One "data: ..." payload. */
static void kvf_bs_event(kvf_bs_stream_t *st, const char *data, size_t len)
{
    kvf_bs_result_t *res = st->res;
    uint64_t now = kvf_time_now_ns();
    const cJSON *choices, *choice, *ids, *err, *fr;
    cJSON *root;
    int k = 0;

    if ((len == 6) && (memcmp(data, "[DONE]", 6) == 0)) {
        st->done_mark = true;
        return;
    }
    root = cJSON_ParseWithLength(data, len);
    if (root == NULL) {
        kvf_bs_fail(res, "protocol", "malformed JSON in the stream");
        return;
    }
    err = cJSON_GetObjectItemCaseSensitive(root, "error");
    if (err != NULL) {
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(err, "message");
        kvf_bs_fail(res, "stream_error", "%s",
                    cJSON_IsString(m) ? m->valuestring : "error event in the stream");
        cJSON_Delete(root);
        return;
    }
    choices = cJSON_GetObjectItemCaseSensitive(root, "choices");
    choice = cJSON_GetArrayItem(choices, 0);
    ids = cJSON_GetObjectItemCaseSensitive(choice, "token_ids");
    if (cJSON_IsArray(ids)) {
        k = cJSON_GetArraySize(ids);
    } else {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(choice, "text");
        k = (cJSON_IsString(t) && (t->valuestring[0] != '\0')) ? 1 : 0;
    }
    if (k > 0) {
        if (res->output_tokens == 0) {
            res->ttft_ms = kvf_bs_ms(st->start_ns, now);
            for (int i = 1; i < k; ++i) {
                kvf_bs_push_itl(st, 0.0);
            }
        } else {
            double gap = kvf_bs_ms(st->last_ns, now) / k;
            for (int i = 0; i < k; ++i) {
                kvf_bs_push_itl(st, gap);
            }
        }
        st->last_ns = now;
        res->output_tokens += k;
    }
    fr = cJSON_GetObjectItemCaseSensitive(choice, "finish_reason");
    if (cJSON_IsString(fr)) {
        st->final = true;
        res->e2e_ms = kvf_bs_ms(st->start_ns, now);
        kvf_bs_final(res, root);
    }
    cJSON_Delete(root);
}

/* Split the SSE text in @a buf into events; keep an unfinished tail. */
static void kvf_bs_sse(kvf_bs_stream_t *st, char *buf, size_t *len)
{
    size_t off = 0;

    if (buf == NULL) {
        return;       /* nothing decoded yet */
    }
    for (;;) {
        char *end = memmem(buf + off, *len - off, "\n\n", 2);
        if (end == NULL) {
            break;
        }
        for (char *line = buf + off; line < end;) {
            char *nl = memchr(line, '\n', (size_t)(end - line));
            char *stop = (nl != NULL) ? nl : end;
            if ((stop - line >= 5) && (memcmp(line, "data:", 5) == 0)) {
                char *d = line + 5;
                size_t n;
                while ((d < stop) && (*d == ' ')) {
                    ++d;
                }
                n = (size_t)(stop - d);
                if ((n > 0) && (d[n - 1] == '\r')) {
                    --n;
                }
                kvf_bs_event(st, d, n);
            }
            line = stop + 1;
        }
        off = (size_t)(end - buf) + 2;
    }
    memmove(buf, buf + off, *len - off);
    *len -= off;
}

typedef struct {
    char  *data;
    size_t len, cap;
} kvf_bs_buf_t;

static int kvf_bs_buf_add(kvf_bs_buf_t *b, const char *src, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = (b->len + n + 1) * 2;
        char *d = realloc(b->data, cap);
        if (d == NULL) {
            return -1;
        }
        b->data = d;
        b->cap = cap;
    }
    memcpy(b->data + b->len, src, n);
    b->len += n;
    b->data[b->len] = '\0';
    return 0;
}

/* Wait for @a events on @a fd until @a deadline_ns; 1 ready, 0 timed out, -1 error. */
static int kvf_bs_wait(int fd, short events, uint64_t deadline_ns)
{
    for (;;) {
        uint64_t now = kvf_time_now_ns();
        struct pollfd pfd = {fd, events, 0};
        int rc;

        if (now >= deadline_ns) {
            return 0;
        }
        rc = poll(&pfd, 1, (int)((deadline_ns - now) / 1000000u) + 1);
        if (rc > 0) {
            return 1;
        }
        if ((rc < 0) && (errno != EINTR)) {
            return -1;
        }
    }
}

static int kvf_bs_connect(const struct addrinfo *ai, uint64_t deadline_ns, kvf_bs_result_t *res)
{
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                    ai->ai_protocol);
    int err = 0;
    socklen_t el = sizeof(err);

    if (fd < 0) {
        kvf_bs_fail(res, "connect", "socket: %s", strerror(errno));
        return -1;
    }
    if ((connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) && (errno != EINPROGRESS)) {
        kvf_bs_fail(res, "connect", "connect: %s", strerror(errno));
        close(fd);
        return -1;
    }
    if (kvf_bs_wait(fd, POLLOUT, deadline_ns) <= 0) {
        kvf_bs_fail(res, "timeout", "connect did not finish in time");
        close(fd);
        return -1;
    }
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
    if (err != 0) {
        kvf_bs_fail(res, "connect", "connect: %s", strerror(err));
        close(fd);
        return -1;
    }
    return fd;
}

static int kvf_bs_send_all(int fd, const char *s, size_t n, uint64_t deadline_ns,
                           kvf_bs_result_t *res)
{
    while (n > 0) {
        ssize_t w = send(fd, s, n, MSG_NOSIGNAL);
        if (w > 0) {
            s += w;
            n -= (size_t)w;
            continue;
        }
        if ((w < 0) && (errno != EAGAIN) && (errno != EINTR)) {
            kvf_bs_fail(res, "connect", "send: %s", strerror(errno));
            return -1;
        }
        if (kvf_bs_wait(fd, POLLOUT, deadline_ns) <= 0) {
            kvf_bs_fail(res, "timeout", "sending the request did not finish in time");
            return -1;
        }
    }
    return 0;
}

/*
 * The response body decoder: HTTP chunked transfer coding or a plain body
 * (Content-Length or until close). Decoded bytes go to @a out.
 */
typedef struct {
    bool   chunked;
    int    state;         /* 0 size line, 1 data, 2 CRLF after data, 3 end */
    size_t left;          /* bytes left in the chunk */
} kvf_bs_dechunk_t;

static int kvf_bs_dechunk(kvf_bs_dechunk_t *dc, kvf_bs_buf_t *in, kvf_bs_buf_t *out)
{
    size_t off = 0;

    if (!dc->chunked) {
        if (kvf_bs_buf_add(out, in->data, in->len) != 0) {
            return -1;
        }
        in->len = 0;
        return 0;
    }
    while ((off < in->len) && (dc->state != 3)) {
        if (dc->state == 0) {
            char *nl = memmem(in->data + off, in->len - off, "\r\n", 2);
            char *end;
            if (nl == NULL) {
                break;
            }
            dc->left = strtoul(in->data + off, &end, 16);
            if (end == in->data + off) {
                return -1;
            }
            off = (size_t)(nl - in->data) + 2;
            dc->state = (dc->left == 0) ? 3 : 1;
        } else if (dc->state == 1) {
            size_t n = in->len - off;
            if (n > dc->left) {
                n = dc->left;
            }
            if (kvf_bs_buf_add(out, in->data + off, n) != 0) {
                return -1;
            }
            off += n;
            dc->left -= n;
            if (dc->left == 0) {
                dc->state = 2;
            }
        } else {
            if (in->len - off < 2) {
                break;
            }
            off += 2;
            dc->state = 0;
        }
    }
    memmove(in->data, in->data + off, in->len - off);
    in->len -= off;
    return 0;
}

static void kvf_bs_request(kvf_bs_job_t *job)
{
    const kvf_bs_params_t *p = job->p;
    kvf_bs_result_t *res = job->res;
    kvf_bs_stream_t st = {.res = res};
    kvf_bs_buf_t raw = {0}, body = {0};
    kvf_bs_dechunk_t dc = {0};
    bool headers = false;
    uint64_t deadline;
    char head[512];
    int fd, hl;

    st.start_ns = kvf_time_now_ns();
    res->start_ms = kvf_bs_ms(job->t0_ns, st.start_ns);
    deadline = st.start_ns + (uint64_t)(p->timeout_s * 1e9);
    fd = kvf_bs_connect(job->addr, deadline, res);
    if (fd < 0) {
        goto out;
    }
    hl = snprintf(head, sizeof(head), "POST /v1/completions HTTP/1.1\r\nHost: %s:%d\r\n"
                  "Content-Type: application/json\r\nAccept: text/event-stream\r\n"
                  "Content-Length: %zu\r\nConnection: close\r\n\r\n", p->host, p->port,
                  strlen(job->body));
    if ((kvf_bs_send_all(fd, head, (size_t)hl, deadline, res) != 0) ||
        (kvf_bs_send_all(fd, job->body, strlen(job->body), deadline, res) != 0)) {
        goto out_close;
    }
    for (;;) {
        char tmp[KVF_BS_RECV_CHUNK];
        ssize_t n = recv(fd, tmp, sizeof(tmp), 0);
        int w;

        if (n < 0) {
            if ((errno == EAGAIN) || (errno == EINTR)) {
                w = kvf_bs_wait(fd, POLLIN, deadline);
                if (w == 0) {
                    kvf_bs_fail(res, "timeout", "no answer within %g s (%d tokens so far)",
                                p->timeout_s, res->output_tokens);
                    break;
                }
                if (w > 0) {
                    continue;
                }
            }
            kvf_bs_fail(res, "protocol", "recv: %s", strerror(errno));
            break;
        }
        if (n == 0) {
            break;     /* closed */
        }
        if (kvf_bs_buf_add(&raw, tmp, (size_t)n) != 0) {
            kvf_bs_fail(res, "protocol", "out of memory");
            break;
        }
        if (!headers) {
            char *eoh = memmem(raw.data, raw.len, "\r\n\r\n", 4);
            size_t hlen;
            if (eoh == NULL) {
                if (raw.len > 65536) {
                    kvf_bs_fail(res, "protocol", "response headers too long");
                    break;
                }
                continue;
            }
            hlen = (size_t)(eoh - raw.data) + 4;
            *eoh = '\0';
            if (sscanf(raw.data, "HTTP/1.%*d %d", &res->http_code) != 1) {
                kvf_bs_fail(res, "protocol", "not an HTTP response");
                break;
            }
            dc.chunked = (strcasestr(raw.data, "\r\ntransfer-encoding: chunked") != NULL);
            memmove(raw.data, raw.data + hlen, raw.len - hlen);
            raw.len -= hlen;
            headers = true;
        }
        if (kvf_bs_dechunk(&dc, &raw, &body) != 0) {
            kvf_bs_fail(res, "protocol", "bad chunked encoding");
            break;
        }
        if (res->http_code == 200) {
            kvf_bs_sse(&st, body.data, &body.len);
            if (st.done_mark || (res->error_kind[0] != '\0')) {
                break;
            }
        }
        if (dc.state == 3) {
            break;
        }
    }
    if (headers && (res->http_code != 200)) {
        cJSON *root = cJSON_ParseWithLength(body.data ? body.data : "", body.len);
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(
            cJSON_GetObjectItemCaseSensitive(root, "error"), "message");
        char kind[24];

        snprintf(kind, sizeof(kind), "http_%d", res->http_code);
        res->error_kind[0] = '\0';     /* the status says more than a read error after it */
        kvf_bs_fail(res, kind, "%s", cJSON_IsString(m) ? m->valuestring : "(no error message)");
        cJSON_Delete(root);
    } else if (!st.final) {
        kvf_bs_fail(res, headers ? "protocol" : "connect",
                    headers ? "stream ended before the final chunk (%d tokens)" :
                              "connection closed before an answer (%d tokens)",
                    res->output_tokens);
    }
out_close:
    close(fd);
out:
    free(raw.data);
    free(body.data);
    if (res->error_kind[0] == '\0') {
        res->ok = true;
        res->tpot_ms = (res->output_tokens > 1) ?
                       (res->e2e_ms - res->ttft_ms) / (res->output_tokens - 1) : -1;
    }
    res->end_ms = kvf_bs_ms(job->t0_ns, kvf_time_now_ns());
}

static void *kvf_bs_thread(void *arg)
{
    kvf_bs_job_t *job = arg;

    kvf_bs_request(job);
    free(job->body);
    job->body = NULL;
    if (!job->res->ok) {
        atomic_fetch_add(job->failed, 1);
    }
    atomic_fetch_add(job->done, 1);
    if (job->slots != NULL) {
        sem_post(job->slots);
    }
    return NULL;
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
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 250000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
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

/* Mean and linearly interpolated percentiles (numpy's default) of @a v (sorted in place). */
static kvf_bs_stat_t kvf_bs_stat(double *v, int n)
{
    kvf_bs_stat_t s = {0, 0, 0, 0, n};
    const double q[3] = {50, 90, 99};
    double *dst[3] = {&s.p50, &s.p90, &s.p99};

    if (n == 0) {
        return s;
    }
    qsort(v, (size_t)n, sizeof(*v), kvf_bs_cmp);
    for (int i = 0; i < n; ++i) {
        s.mean += v[i];
    }
    s.mean /= n;
    for (int k = 0; k < 3; ++k) {
        double pos = q[k] / 100.0 * (n - 1);
        int lo = (int)floor(pos);
        int hi = (lo + 1 < n) ? lo + 1 : lo;
        *dst[k] = v[lo] + (v[hi] - v[lo]) * (pos - lo);
    }
    return s;
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
                s->num_kinds++;
            }
            if (k < 8) {
                s->kind_counts[k]++;
            }
            continue;
        }
        r->good = ((p->slo_ttft_ms <= 0) || (r->ttft_ms <= p->slo_ttft_ms)) &&
                  ((p->slo_tpot_ms <= 0) || (r->tpot_ms < 0) || (r->tpot_ms <= p->slo_tpot_ms)) &&
                  ((p->slo_e2e_ms <= 0) || (r->e2e_ms <= p->slo_e2e_ms));
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
    free(ttft);
    free(e2e);
    free(tpot);
    free(itl);
}

static void kvf_bs_sleep_until(uint64_t t_ns)
{
    struct timespec ts = {(time_t)(t_ns / 1000000000u), (long)(t_ns % 1000000000u)};

    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

int kvf_bs_run(const kvf_bs_params_t *p, kvf_bs_summary_t *summary_p)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    kvf_bs_dataset_t ds = {0};
    kvf_bs_job_t **jobs = NULL;
    int cap = 0, sent = 0, rc;
    atomic_int done = 0, failed = 0, sent_a = 0;
    kvf_bs_progress_t pr = {.p = p, .done = &done, .failed = &failed, .sent = &sent_a};
    pthread_t progress;
    pthread_attr_t attr;
    sem_t slots;
    kvf_bs_rng_t arr_rng = {kvf_bs_mix(p->seed ^ 0xa5a5a5a5ull)};
    double arrival_s = 0;
    char port[16];
    bool have_progress = false;

    memset(summary_p, 0, sizeof(*summary_p));
    snprintf(port, sizeof(port), "%d", p->port);
    rc = getaddrinfo(p->host, port, &hints, &ai);
    if (rc != 0) {
        kvf_error("cannot resolve %s: %s", p->host, gai_strerror(rc));
        return -1;
    }
    if ((p->dataset[0] != '\0') && (kvf_bs_dataset_load(p->dataset, &ds) != 0)) {
        freeaddrinfo(ai);
        return -1;
    }

    /* Warm-up: one at a time, the same kind of request, not counted. */
    for (int w = 0; w < p->warmup; ++w) {
        kvf_bs_result_t res = {0};
        atomic_int d = 0, f = 0;
        kvf_bs_job_t job = {.p = p, .addr = ai, .t0_ns = kvf_time_now_ns(), .res = &res,
                            .done = &d, .failed = &f};
        int plen, mt;

        job.body = kvf_bs_body(p, &ds, UINT64_MAX - (uint64_t)w, &plen, &mt);
        kvf_bs_thread(&job);
        free(res.itl_ms);
        if (!res.ok) {
            kvf_error("warm-up request %d to %s:%d failed (%s): %s", w + 1, p->host, p->port,
                      res.error_kind, res.error);
            kvf_bs_dataset_free(&ds);
            freeaddrinfo(ai);
            return -1;
        }
    }

    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    if (p->max_concurrency > 0) {
        sem_init(&slots, 0, (unsigned)p->max_concurrency);
    }
    pr.t0_ns = kvf_time_now_ns();
    pthread_mutex_init(&pr.lock, NULL);
    pthread_cond_init(&pr.cond, NULL);
    if (p->progress) {
        have_progress = (pthread_create(&progress, NULL, kvf_bs_progress_thread, &pr) == 0);
    }
    for (uint64_t i = 0;; ++i) {
        uint64_t at;
        kvf_bs_job_t *job;
        int plen, mt;

        if ((p->num_requests > 0) && (i >= (uint64_t)p->num_requests)) {
            break;
        }
        if (p->request_rate > 0) {
            if (i > 0) {
                /* Gamma(shape b, scale 1/(rate b)): mean gap 1/rate; b = 1 is exponential. */
                arrival_s += kvf_bs_gamma(&arr_rng, p->burstiness) /
                             (p->request_rate * p->burstiness);
            }
            if ((p->duration_s > 0) && (arrival_s >= p->duration_s)) {
                break;
            }
            at = pr.t0_ns + (uint64_t)(arrival_s * 1e9);
            kvf_bs_sleep_until(at);
        }
        if (p->max_concurrency > 0) {
            while (sem_wait(&slots) != 0) {
            }
        }
        if ((p->duration_s > 0) &&
            (kvf_time_now_ns() - pr.t0_ns >= (uint64_t)(p->duration_s * 1e9))) {
            if (p->max_concurrency > 0) {
                sem_post(&slots);
            }
            break;
        }
        if (sent == cap) {
            cap = cap * 2 + 64;
            jobs = realloc(jobs, sizeof(*jobs) * (size_t)cap);
            if (jobs == NULL) {
                kvf_error("out of memory after %d requests", sent);
                abort();
            }
        }
        job = calloc(1, sizeof(*job));
        job->res = calloc(1, sizeof(*job->res));
        if ((job == NULL) || (job->res == NULL)) {
            kvf_error("out of memory after %d requests", sent);
            abort();
        }
        job->p = p;
        job->addr = ai;
        job->t0_ns = pr.t0_ns;
        job->slots = (p->max_concurrency > 0) ? &slots : NULL;
        job->done = &done;
        job->failed = &failed;
        job->res->index = (int)i;
        job->res->proxy_ttft_ms = job->res->transfer_ms = job->res->handshake_ms = -1;
        job->res->kv_bytes = job->res->first_decode_ms = job->res->transfer_share = -1;
        job->body = kvf_bs_body(p, &ds, i, &plen, &mt);
        job->res->prompt_tokens = plen;
        job->res->max_tokens = mt;
        jobs[sent++] = job;
        atomic_fetch_add(&sent_a, 1);
        if (pthread_create(&job->thread, &attr, kvf_bs_thread, job) != 0) {
            kvf_bs_fail(job->res, "connect", "could not start a client thread");
            job->thread = 0;
            kvf_bs_thread(job);   /* counts it and frees the slot */
        }
    }
    for (int i = 0; i < sent; ++i) {
        if (jobs[i]->thread != 0) {
            pthread_join(jobs[i]->thread, NULL);
        }
    }
    if (have_progress) {
        pthread_mutex_lock(&pr.lock);
        atomic_store(&pr.stop, true);
        pthread_cond_signal(&pr.cond);
        pthread_mutex_unlock(&pr.lock);
        pthread_join(progress, NULL);
    }
    pthread_mutex_destroy(&pr.lock);
    pthread_cond_destroy(&pr.cond);
    pthread_attr_destroy(&attr);
    if (p->max_concurrency > 0) {
        sem_destroy(&slots);
    }

    summary_p->sent = sent;
    summary_p->results = calloc((size_t)sent + 1, sizeof(kvf_bs_result_t));
    for (int i = 0; i < sent; ++i) {
        summary_p->results[i] = *jobs[i]->res;
        free(jobs[i]->res);
        free(jobs[i]);
    }
    free(jobs);
    kvf_bs_summarize(p, summary_p);
    kvf_bs_dataset_free(&ds);
    freeaddrinfo(ai);
    return 0;
}

void kvf_bs_summary_cleanup(kvf_bs_summary_t *s)
{
    for (int i = 0; (s->results != NULL) && (i < s->sent); ++i) {
        free(s->results[i].itl_ms);
    }
    free(s->results);
    memset(s, 0, sizeof(*s));
}

/* ---- output ------------------------------------------------------------------- */

static const char *kvf_bs_dist_name(kvf_bs_dist_t d)
{
    return (d == KVF_BS_DIST_UNIFORM) ? "uniform" : (d == KVF_BS_DIST_NORMAL) ? "normal" : "fixed";
}

static void kvf_bs_slo_text(const kvf_bs_params_t *p, char *buf, size_t cap)
{
    int n = 0;

    buf[0] = '\0';
    if (p->slo_ttft_ms > 0) {
        n += snprintf(buf + n, cap - (size_t)n, " ttft<=%gms", p->slo_ttft_ms);
    }
    if (p->slo_tpot_ms > 0) {
        n += snprintf(buf + n, cap - (size_t)n, " tpot<=%gms", p->slo_tpot_ms);
    }
    if (p->slo_e2e_ms > 0) {
        snprintf(buf + n, cap - (size_t)n, " e2e<=%gms", p->slo_e2e_ms);
    }
}

void kvf_bs_print_table(const kvf_bs_params_t *p, const kvf_bs_summary_t *s, FILE *out)
{
    const struct {
        const char *name;
        const kvf_bs_stat_t *st;
    } rows[] = {{"ttft", &s->ttft}, {"tpot", &s->tpot}, {"itl", &s->itl}, {"e2e", &s->e2e}};
    char slo[128], rate[32];

    kvf_bs_slo_text(p, slo, sizeof(slo));
    if (p->request_rate > 0) {
        snprintf(rate, sizeof(rate), "%g req/s", p->request_rate);
    } else {
        snprintf(rate, sizeof(rate), "inf");
    }
    fprintf(out, "kvf bench-serve: http://%s:%d\n", p->host, p->port);
    if (p->dataset[0] != '\0') {
        fprintf(out, "workload            dataset %s, output %s %d\n", p->dataset,
                kvf_bs_dist_name(p->output_dist), p->output_len);
    } else {
        fprintf(out, "workload            input %s %d (spread %g), output %s %d (spread %g)\n",
                kvf_bs_dist_name(p->input_dist), p->input_len, p->input_spread,
                kvf_bs_dist_name(p->output_dist), p->output_len, p->output_spread);
    }
    fprintf(out, "arrivals            rate %s, burstiness %g, max concurrency %d, warm-up %d\n",
            rate, p->burstiness, p->max_concurrency, p->warmup);
    fprintf(out, "duration_s          %.3f\n", s->duration_s);
    fprintf(out, "requests            %d sent, %d completed, %d failed\n", s->sent, s->completed,
            s->failed);
    for (int k = 0; k < s->num_kinds; ++k) {
        fprintf(out, "  failed %-12s %d\n", s->kinds[k], s->kind_counts[k]);
    }
    fprintf(out, "tokens              %lld input, %lld output\n", s->input_tokens,
            s->output_tokens);
    fprintf(out, "request_throughput  %.3f req/s\n", s->request_throughput);
    fprintf(out, "output_throughput   %.1f tok/s\n", s->output_throughput);
    fprintf(out, "total_throughput    %.1f tok/s\n", s->total_throughput);
    fprintf(out, "goodput             %.3f req/s (%d of %d completed within%s)\n", s->goodput,
            s->good, s->completed, (slo[0] != '\0') ? slo : " no SLO given");
    if (s->transfer_share_mean >= 0) {
        fprintf(out, "transfer_share      %.1f%% of the time to the first decode token\n",
                100.0 * s->transfer_share_mean);
    }
    fprintf(out, "%-8s %10s %10s %10s %10s %8s\n", "ms", "mean", "p50", "p90", "p99", "n");
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); ++i) {
        fprintf(out, "%-8s %10.2f %10.2f %10.2f %10.2f %8d\n", rows[i].name, rows[i].st->mean,
                rows[i].st->p50, rows[i].st->p90, rows[i].st->p99, rows[i].st->n);
    }
}

static void kvf_bs_json_stat(cJSON *root, const char *name, const kvf_bs_stat_t *st)
{
    cJSON *o = cJSON_AddObjectToObject(root, name);

    cJSON_AddNumberToObject(o, "mean", st->mean);
    cJSON_AddNumberToObject(o, "p50", st->p50);
    cJSON_AddNumberToObject(o, "p90", st->p90);
    cJSON_AddNumberToObject(o, "p99", st->p99);
    cJSON_AddNumberToObject(o, "n", st->n);
}

char *kvf_bs_json(const kvf_bs_params_t *p, const kvf_bs_summary_t *s)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *w = cJSON_AddObjectToObject(root, "workload");
    cJSON *slo = cJSON_AddObjectToObject(root, "slo");
    cJSON *fails = cJSON_AddObjectToObject(root, "failures");
    char url[KVF_CONFIG_STR_MAX + 32];
    char *text;

    snprintf(url, sizeof(url), "http://%s:%d", p->host, p->port);
    cJSON_AddStringToObject(root, "url", url);
    cJSON_AddStringToObject(w, "dataset", p->dataset);
    cJSON_AddNumberToObject(w, "input_len", p->input_len);
    cJSON_AddStringToObject(w, "input_dist", kvf_bs_dist_name(p->input_dist));
    cJSON_AddNumberToObject(w, "input_spread", p->input_spread);
    cJSON_AddNumberToObject(w, "output_len", p->output_len);
    cJSON_AddStringToObject(w, "output_dist", kvf_bs_dist_name(p->output_dist));
    cJSON_AddNumberToObject(w, "output_spread", p->output_spread);
    cJSON_AddNumberToObject(w, "request_rate", p->request_rate > 0 ? p->request_rate : 0);
    cJSON_AddNumberToObject(w, "burstiness", p->burstiness);
    cJSON_AddNumberToObject(w, "max_concurrency", p->max_concurrency);
    cJSON_AddNumberToObject(w, "num_requests", p->num_requests);
    cJSON_AddNumberToObject(w, "duration_s", p->duration_s);
    cJSON_AddNumberToObject(w, "warmup", p->warmup);
    cJSON_AddNumberToObject(w, "seed", (double)p->seed);
    cJSON_AddNumberToObject(slo, "ttft_ms", p->slo_ttft_ms);
    cJSON_AddNumberToObject(slo, "tpot_ms", p->slo_tpot_ms);
    cJSON_AddNumberToObject(slo, "e2e_ms", p->slo_e2e_ms);
    cJSON_AddNumberToObject(root, "duration_s", s->duration_s);
    cJSON_AddNumberToObject(root, "sent", s->sent);
    cJSON_AddNumberToObject(root, "completed", s->completed);
    cJSON_AddNumberToObject(root, "failed", s->failed);
    for (int k = 0; k < s->num_kinds; ++k) {
        cJSON_AddNumberToObject(fails, s->kinds[k], s->kind_counts[k]);
    }
    cJSON_AddNumberToObject(root, "good", s->good);
    cJSON_AddNumberToObject(root, "input_tokens", (double)s->input_tokens);
    cJSON_AddNumberToObject(root, "output_tokens", (double)s->output_tokens);
    cJSON_AddNumberToObject(root, "request_throughput", s->request_throughput);
    cJSON_AddNumberToObject(root, "output_throughput", s->output_throughput);
    cJSON_AddNumberToObject(root, "total_throughput", s->total_throughput);
    cJSON_AddNumberToObject(root, "goodput", s->goodput);
    if (s->transfer_share_mean >= 0) {
        cJSON_AddNumberToObject(root, "transfer_share", s->transfer_share_mean);
    } else {
        cJSON_AddNullToObject(root, "transfer_share");
    }
    kvf_bs_json_stat(root, "ttft_ms", &s->ttft);
    kvf_bs_json_stat(root, "tpot_ms", &s->tpot);
    kvf_bs_json_stat(root, "itl_ms", &s->itl);
    kvf_bs_json_stat(root, "e2e_ms", &s->e2e);
    text = cJSON_Print(root);
    cJSON_Delete(root);
    return text;
}

static void kvf_bs_csv_text(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s != '\0'; ++s) {
        if (*s == '"') {
            fputc('"', f);
        }
        fputc((*s == '\n') ? ' ' : *s, f);
    }
    fputc('"', f);
}

int kvf_bs_write_csv(const kvf_bs_summary_t *s, const char *path)
{
    FILE *f = fopen(path, "w");

    if (f == NULL) {
        kvf_error("cannot write --csv %s: %m", path);
        return -1;
    }
    fprintf(f, "index,start_ms,end_ms,prompt_tokens,max_tokens,output_tokens,ok,good,error_kind,"
               "http_code,ttft_ms,tpot_ms,itl_mean_ms,e2e_ms,proxy_ttft_ms,transfer_ms,"
               "handshake_ms,kv_bytes,first_decode_token_ms,transfer_share,prefill_instance,"
               "decode_instance,error\n");
    for (int i = 0; i < s->sent; ++i) {
        const kvf_bs_result_t *r = &s->results[i];
        double itl = 0;

        for (int k = 0; k < r->num_itl; ++k) {
            itl += r->itl_ms[k];
        }
        fprintf(f, "%d,%.3f,%.3f,%d,%d,%d,%d,%d,%s,%d,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.0f,"
                   "%.3f,%.4f,", r->index, r->start_ms, r->end_ms, r->prompt_tokens,
                r->max_tokens, r->output_tokens, r->ok, r->good, r->error_kind, r->http_code,
                r->ttft_ms, r->tpot_ms, (r->num_itl > 0) ? itl / r->num_itl : 0, r->e2e_ms,
                r->proxy_ttft_ms, r->transfer_ms, r->handshake_ms, r->kv_bytes,
                r->first_decode_ms, r->transfer_share);
        kvf_bs_csv_text(f, r->prefill_instance);
        fputc(',', f);
        kvf_bs_csv_text(f, r->decode_instance);
        fputc(',', f);
        kvf_bs_csv_text(f, r->error);
        fputc('\n', f);
    }
    if (fclose(f) != 0) {
        kvf_error("cannot write --csv %s: %m", path);
        return -1;
    }
    return 0;
}
