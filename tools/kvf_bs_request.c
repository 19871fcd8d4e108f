/*
 * kvf bench-serve: one request: HTTP/1.1 over its own socket (Connection:
 * close), chunked decoding, and the SSE stream's events into the result.
 */
#define _GNU_SOURCE
#include "kvf_bs_int.h"

#include "kvf_array.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define KVF_BS_RECV_CHUNK 16384

typedef struct {
    kvf_bs_result_t *res;
    uint64_t start_ns, last_ns;
    int      itl_cap;
    bool     final;
    bool     done_mark;
    bool     keep_text;   /* append each chunk's text to res->text */
} kvf_bs_stream_t;

void kvf_bs_fail(kvf_bs_result_t *res, const char *kind, const char *fmt, ...)
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

    if (KVF_ARRAY_GROW(res->itl_ms, st->itl_cap, res->num_itl + 1, 32) != KVF_OK) {
        return -1;
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
    const cJSON *choices, *choice, *ids, *err, *fr, *text;
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
    if (cJSON_IsArray(choices) && (cJSON_GetArraySize(choices) == 0)) {
        /* the usage chunk (stream_options.include_usage): the proxy's prompt count */
        const cJSON *u = cJSON_GetObjectItemCaseSensitive(root, "usage");
        if (cJSON_IsObject(u)) {
            res->prompt_tokens = (int)kvf_bs_num(u, "prompt_tokens", res->prompt_tokens);
        }
        cJSON_Delete(root);
        return;
    }
    choice = cJSON_GetArrayItem(choices, 0);
    ids = cJSON_GetObjectItemCaseSensitive(choice, "token_ids");
    text = cJSON_GetObjectItemCaseSensitive(choice, "text");
    if (text == NULL) {   /* a chat chunk: the text is the delta's content */
        text = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(choice, "delta"),
                                                "content");
    }
    if (st->keep_text) {
        const cJSON *t = text;
        size_t tl = cJSON_IsString(t) ? strlen(t->valuestring) : 0;
        char *grown = (tl > 0) ? realloc(res->text, res->text_len + tl + 1) : NULL;

        if (grown != NULL) {
            memcpy(grown + res->text_len, t->valuestring, tl + 1);
            res->text = grown;
            res->text_len += tl;
        }
    }
    if (cJSON_IsArray(ids)) {
        k = cJSON_GetArraySize(ids);
    } else {
        k = (cJSON_IsString(text) && (text->valuestring[0] != '\0')) ? 1 : 0;
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
    if ((n > SIZE_MAX / 2) ||
        (KVF_ARRAY_GROW(b->data, b->cap, b->len + n + 1, KVF_BS_RECV_CHUNK) != KVF_OK)) {
        return -1;
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

/* The request's headers and body on @fd; -1 (res failed) when they could not be sent. */
static int kvf_bs_send_request(const kvf_bs_job_t *job, int fd, uint64_t deadline)
{
    const kvf_bs_params_t *p = job->p;
    kvf_bs_result_t *res = job->res;
    char head[4096 + 2 * KVF_CONFIG_STR_MAX], rid[128] = "";
    int hl;

    if (p->request_id_prefix[0] != '\0') {
        snprintf(rid, sizeof(rid), "x-request-id: %s%d\r\n", p->request_id_prefix,
                 res->index);
    }
    hl = snprintf(head, sizeof(head), "POST %s HTTP/1.1\r\nHost: %s:%d\r\n"
                  "Content-Type: application/json\r\nAccept: text/event-stream\r\n"
                  "%s%s%s%s%sContent-Length: %zu\r\nConnection: close\r\n\r\n", p->endpoint,
                  p->host, p->port, (p->api_key[0] != '\0') ? "Authorization: Bearer " : "",
                  p->api_key, (p->api_key[0] != '\0') ? "\r\n" : "", p->headers, rid,
                  strlen(job->body));
    if (hl >= (int)sizeof(head)) {
        kvf_bs_fail(res, "protocol", "request headers longer than %zu bytes", sizeof(head));
        return -1;
    }
    if ((kvf_bs_send_all(fd, head, (size_t)hl, deadline, res) != 0) ||
        (kvf_bs_send_all(fd, job->body, strlen(job->body), deadline, res) != 0)) {
        return -1;
    }
    return 0;
}

/* The request's outcome once the stream ended: a non-200 status with the server's error
 * message, or a stream cut before its final chunk. */
static void kvf_bs_finish(kvf_bs_result_t *res, bool headers, bool final,
                          const kvf_bs_buf_t *body)
{
    if (headers && (res->http_code != 200)) {
        cJSON *root = cJSON_ParseWithLength(body->data ? body->data : "", body->len);
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(
            cJSON_GetObjectItemCaseSensitive(root, "error"), "message");
        char kind[24];

        snprintf(kind, sizeof(kind), "http_%d", res->http_code);
        res->error_kind[0] = '\0';     /* the status says more than a read error after it */
        kvf_bs_fail(res, kind, "%s", cJSON_IsString(m) ? m->valuestring : "(no error message)");
        cJSON_Delete(root);
    } else if (!final) {
        kvf_bs_fail(res, headers ? "protocol" : "connect",
                    headers ? "stream ended before the final chunk (%d tokens)" :
                              "connection closed before an answer (%d tokens)",
                    res->output_tokens);
    }
}

static void kvf_bs_request(kvf_bs_job_t *job)
{
    const kvf_bs_params_t *p = job->p;
    kvf_bs_result_t *res = job->res;
    kvf_bs_stream_t st = {.res = res, .keep_text = p->keep_text};
    kvf_bs_buf_t raw = {0}, body = {0};
    kvf_bs_dechunk_t dc = {0};
    bool headers = false;
    uint64_t deadline;
    int fd;

    st.start_ns = kvf_time_now_ns();
    res->start_ms = kvf_bs_ms(job->t0_ns, st.start_ns);
    deadline = st.start_ns + (uint64_t)(p->timeout_s * 1e9);
    fd = kvf_bs_connect(job->addr, deadline, res);
    if (fd < 0) {
        goto out;
    }
    if (kvf_bs_send_request(job, fd, deadline) != 0) {
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
    kvf_bs_finish(res, headers, st.final, &body);
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

void *kvf_bs_thread(void *arg)
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

int kvf_bs_http(const kvf_bs_params_t *p, const struct addrinfo *ai, const char *method,
                const char *path, const char *req_body, char **body_p, kvf_bs_result_t *res)
{
    uint64_t deadline = kvf_time_now_ns() + 10000000000ull;
    kvf_bs_buf_t raw = {0}, body = {0};
    kvf_bs_dechunk_t dc = {0};
    char head[1024 + 2 * KVF_CONFIG_STR_MAX + sizeof(p->headers)], *eoh;
    size_t blen = (req_body != NULL) ? strlen(req_body) : 0;
    int fd, hl, code = -1;

    *body_p = NULL;
    fd = kvf_bs_connect(ai, deadline, res);
    if (fd < 0) {
        return -1;
    }
    hl = snprintf(head, sizeof(head), "%s %s HTTP/1.1\r\nHost: %s:%d\r\n%s%s%s%s",
                  method, path, p->host, p->port,
                  (p->api_key[0] != '\0') ? "Authorization: Bearer " : "", p->api_key,
                  (p->api_key[0] != '\0') ? "\r\n" : "", p->headers);
    if (req_body != NULL) {
        hl += snprintf(head + hl, sizeof(head) - (size_t)hl, "Content-Type: application/json"
                       "\r\nContent-Length: %zu\r\n", blen);
    }
    hl += snprintf(head + hl, sizeof(head) - (size_t)hl, "Connection: close\r\n\r\n");
    if ((kvf_bs_send_all(fd, head, (size_t)hl, deadline, res) != 0) ||
        ((blen > 0) && (kvf_bs_send_all(fd, req_body, blen, deadline, res) != 0))) {
        goto out_close;
    }
    for (;;) {
        char tmp[4096];
        ssize_t n = recv(fd, tmp, sizeof(tmp), 0);

        if ((n < 0) && ((errno == EAGAIN) || (errno == EINTR))) {
            if (kvf_bs_wait(fd, POLLIN, deadline) <= 0) {
                kvf_bs_fail(res, "timeout", "no answer to %s %s within 10 s", method, path);
                goto out_close;
            }
            continue;
        }
        if ((n <= 0) || (raw.len > (1u << 20)) || (kvf_bs_buf_add(&raw, tmp, (size_t)n) != 0)) {
            break;
        }
    }
    eoh = (raw.data != NULL) ? strstr(raw.data, "\r\n\r\n") : NULL;
    if ((eoh == NULL) || (sscanf(raw.data, "HTTP/1.%*d %d", &code) != 1)) {
        kvf_bs_fail(res, "protocol", "%s %s: not an HTTP response", method, path);
        code = -1;
        goto out_close;
    }
    *eoh = '\0';
    dc.chunked = (strcasestr(raw.data, "\r\ntransfer-encoding: chunked") != NULL);
    memmove(raw.data, eoh + 4, raw.len - (size_t)(eoh + 4 - raw.data) + 1);
    raw.len = strlen(raw.data);
    if ((kvf_bs_dechunk(&dc, &raw, &body) != 0) || (body.data == NULL)) {
        kvf_bs_fail(res, "protocol", "%s %s: bad body", method, path);
        code = -1;
        goto out_close;
    }
    *body_p = body.data;
    body.data = NULL;
out_close:
    close(fd);
    free(raw.data);
    free(body.data);
    return code;
}

/* GET @a path into a malloc'd body (until the server closes); the HTTP status or -1. */
static int kvf_bs_get(const kvf_bs_params_t *p, const struct addrinfo *ai, const char *path,
                      char **body_p, kvf_bs_result_t *res)
{
    return kvf_bs_http(p, ai, "GET", path, NULL, body_p, res);
}

/* GET /v1/models of the server in @a p (its host resolved here): the HTTP status, -1 when
 * the request failed (res says why), -2 when the host does not resolve (logged). */
static int kvf_bs_get_models(const kvf_bs_params_t *p, char **body_p, kvf_bs_result_t *res)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    char port[16];
    int code, rc;

    snprintf(port, sizeof(port), "%d", p->port);
    rc = getaddrinfo(p->host, port, &hints, &ai);
    if (rc != 0) {
        kvf_error("cannot resolve %s: %s", p->host, gai_strerror(rc));
        return -2;
    }
    code = kvf_bs_get(p, ai, "/v1/models", body_p, res);
    freeaddrinfo(ai);
    return code;
}

int kvf_bs_fetch_model(kvf_bs_params_t *p)
{
    kvf_bs_result_t res = {0};
    const cJSON *id;
    cJSON *root;
    char *body = NULL;
    int code = kvf_bs_get_models(p, &body, &res);

    if (code == -2) {
        return -1;
    }
    if (code != 200) {
        if (code > 0) {
            kvf_error("GET http://%s:%d/v1/models answered HTTP %d (give --model NAME)",
                      p->host, p->port, code);
        } else {
            kvf_error("GET http://%s:%d/v1/models failed (%s): %s (give --model NAME)",
                      p->host, p->port, res.error_kind, res.error);
        }
        free(body);
        return -1;
    }
    root = cJSON_Parse(body);
    free(body);
    id = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(root, "data"), 0), "id");
    if (!cJSON_IsString(id) || (id->valuestring[0] == '\0') ||
        (strlen(id->valuestring) >= sizeof(p->model))) {
        kvf_error("GET http://%s:%d/v1/models lists no model id (give --model NAME)", p->host,
                  p->port);
        cJSON_Delete(root);
        return -1;
    }
    snprintf(p->model, sizeof(p->model), "%s", id->valuestring);
    cJSON_Delete(root);
    return 0;
}

int kvf_bs_check_model(const kvf_bs_params_t *p)
{
    kvf_bs_result_t res = {0};
    const cJSON *item;
    cJSON *root;
    char served[512] = "", *body = NULL;
    size_t used = 0;
    int code = kvf_bs_get_models(p, &body, &res);
    bool found = false;

    if (code == -2) {
        return -1;
    }
    root = (body != NULL) ? cJSON_Parse(body) : NULL;
    if (code != 200) {
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(
            cJSON_GetObjectItemCaseSensitive(root, "error"), "message");
        if (code > 0) {
            kvf_error("ready check: GET http://%s:%d/v1/models answered HTTP %d: %s", p->host,
                      p->port, code, cJSON_IsString(m) ? m->valuestring : "(no error message)");
        } else {
            kvf_error("ready check: GET http://%s:%d/v1/models failed (%s): %s", p->host,
                      p->port, res.error_kind, res.error);
        }
        cJSON_Delete(root);
        free(body);
        return -1;
    }
    cJSON_ArrayForEach(item, cJSON_GetObjectItemCaseSensitive(root, "data")) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(item, "id");
        if (cJSON_IsString(id)) {
            found |= (strcmp(id->valuestring, p->model) == 0);
            if (used < sizeof(served)) {
                used += (size_t)snprintf(served + used, sizeof(served) - used, "%s'%s'",
                                         used ? ", " : "", id->valuestring);
            }
        }
    }
    cJSON_Delete(root);
    free(body);
    if (!found) {
        kvf_error("ready check: model '%s' is not served at http://%s:%d (GET /v1/models "
                  "lists %s): give --served-model-name (or --model) one of those", p->model,
                  p->host, p->port, served[0] ? served : "none");
        return -1;
    }
    return 0;
}
