/*
 * kvf-proxy HTTP front end on libmicrohttpd.
 *
 * Threading: MHD_USE_THREAD_PER_CONNECTION, so a completion request may
 * block its connection's thread while it waits for prefill and decode.
 * Streams use a content-reader callback that also runs on that thread and
 * blocks until the next tokens arrive; MHD writes each returned piece out
 * at once (chunked encoding). Rejected: suspend/resume with an external
 * wakeup per token (more moving parts, no gain at the connection counts
 * a proxy in front of a handful of instances sees).
 *
 * Client departure: while a request waits on an instance, the flow polls
 * the client's socket for POLLRDHUP every wait slice; a stream also learns
 * it when a write fails, and MHD then calls the reader's free callback
 * before the end of the stream. Either way the flow aborts the request on
 * both instances (kvf_proxy_flow_finish()).
 *
 * The library's own error pages: requests it refuses before our handler
 * runs (headers over its per-connection memory, a malformed header line,
 * a bad Content-Length or chunk, an unsupported HTTP version) would get its
 * built-in HTML. It logs each one ("Error processing request (HTTP response
 * code is N ...") on the connection's own thread just before it queues the
 * page, so the logger writes the JSON answer on that socket first and shuts
 * its write side: the page then fails to go out and the library closes the
 * connection. The thread knows its socket from the URI callback (each
 * thread serves one connection); before any request line was parsed it is
 * the one connection not yet named, when there is exactly one (else the
 * library's page goes out, a rare race). A request line that is not HTTP at
 * all is closed without an answer by the library (no page either).
 * Rejected: the library has no option to replace these pages, and a
 * parser of our own in front of it would duplicate its HTTP handling.
 */
#define _GNU_SOURCE
#include "kvf_proxy_http.h"
#include "kvf_proxy_conns.h"
#include "kvf_log.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* The library's own hard limits sit this far above our caps, so connections
 * over a cap can still be answered (JSON 503) rather than dropped. */
#define KVF_PROXY_CONN_OVERFLOW 32

/* Per-connection memory of the HTTP library: the request line and headers
 * must fit in it (less its bookkeeping); larger ones get a JSON 431 (or 414). */
#define KVF_PROXY_HEADER_MEMORY (32u * 1024u)

/* The socket of the connection this thread serves (thread per connection),
 * once a request line was parsed on it; -1 before. */
static __thread int kvf_proxy_thread_fd = -1;

struct kvf_proxy_http {
    struct MHD_Daemon             *daemon;
    kvf_proxy_http_params_t        params;
    kvf_proxy_conns_h              conns;
    atomic_bool                    stopping;
    atomic_bool                    draining;  /* SIGTERM: no new requests */
    atomic_int                     inflight;  /* completions being handled or streamed */
    int64_t                        started;   /* unix seconds, /v1/models "created" */
};

/* Per request: the request body as it arrives. */
typedef struct {
    char  *body;
    size_t len;
    size_t cap;
    bool   too_large;
    kvf_proxy_conn_slot_t *slot;   /* the connection's guard slot; NULL: none */
} kvf_proxy_conn_t;

typedef enum {
    KVF_PROXY_SSE_FIRST = 0,   /* the first token(s), from prefill */
    KVF_PROXY_SSE_RUN,         /* relaying decode replies */
    KVF_PROXY_SSE_DONE_MARK,   /* the final chunk went out; [DONE] next */
    KVF_PROXY_SSE_END,         /* everything went out */
} kvf_proxy_sse_phase_t;

/* A streaming completion: owned by the MHD response (freed by its free callback). */
typedef struct {
    struct kvf_proxy_http     *http;
    struct MHD_Connection     *conn;
    kvf_proxy_completion_req_t req;
    kvf_proxy_flow_t           flow;
    kvf_tokenizer_stream_t     text;      /* holds a character split across tokens */
    kvf_proxy_sse_phase_t      phase;
    int                        code;      /* for the request counter */
    char                      *out;       /* pending SSE bytes */
    size_t                     out_len;
    size_t                     out_off;
} kvf_proxy_stream_t;

/* ---- small helpers ---------------------------------------------------------- */

static enum MHD_Result kvf_proxy_respond_ex(struct MHD_Connection *conn, unsigned code,
                                            const char *type, char *body, bool close);

static enum MHD_Result kvf_proxy_respond(struct MHD_Connection *conn, unsigned code,
                                         const char *type, char *body)
{
    return kvf_proxy_respond_ex(conn, code, type, body, false);
}

static enum MHD_Result kvf_proxy_respond_ex(struct MHD_Connection *conn, unsigned code,
                                            const char *type, char *body, bool close)
{
    struct MHD_Response *resp;
    enum MHD_Result ret;

    if (body == NULL) {
        body = strdup("{\"error\": {\"message\": \"out of memory\", \"type\": \"server_error\"}}");
        code = MHD_HTTP_INTERNAL_SERVER_ERROR;
        if (body == NULL) {
            return MHD_NO;
        }
    }
    resp = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (resp == NULL) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (close) {
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
    }
    ret = MHD_queue_response(conn, code, resp);
    MHD_destroy_response(resp);
    return ret;
}

static enum MHD_Result kvf_proxy_respond_error_param(struct MHD_Connection *conn, int code,
                                                     const char *type, const char *param,
                                                     const char *msg)
{
    return kvf_proxy_respond(conn, (unsigned)code, "application/json",
                             kvf_proxy_openai_error_json(msg, type, param, code));
}

static enum MHD_Result kvf_proxy_respond_error(struct MHD_Connection *conn, int code,
                                               const char *type, const char *msg)
{
    return kvf_proxy_respond_error_param(conn, code, type, NULL, msg);
}

static bool kvf_proxy_client_gone(void *arg)
{
    kvf_proxy_stream_t *s = arg;
    const union MHD_ConnectionInfo *ci;
    struct pollfd pfd;

    if (atomic_load(&s->http->stopping)) {
        return true;
    }
    ci = MHD_get_connection_info(s->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (ci == NULL) {
        return false;
    }
    pfd.fd = ci->connect_fd;
    pfd.events = POLLRDHUP;
    pfd.revents = 0;
    return (poll(&pfd, 1, 0) > 0) && (pfd.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

/*
 * A decoded NUL (byte token 0) would cut the JSON string short, since the
 * JSON builder takes C strings: it is sent as U+FFFD instead. Takes @a text
 * (w bytes), returns it or a replacement (the input is freed then).
 */
static char *kvf_proxy_text_nul(char *text, size_t w)
{
    size_t nul = 0, j = 0;
    char *out;

    for (size_t i = 0; i < w; ++i) {
        nul += (text[i] == '\0');
    }
    if (nul == 0) {
        return text;
    }
    out = malloc(w + 2 * nul + 1);
    if (out != NULL) {
        for (size_t i = 0; i < w; ++i) {
            if (text[i] == '\0') {
                memcpy(out + j, "\xef\xbf\xbd", 3);
                j += 3;
            } else {
                out[j++] = text[i];
            }
        }
        out[j] = '\0';
    }
    free(text);
    return out;
}

/* Completion text of tokens [from, to) through the stream's decoder state; malloc'd. */
static char *kvf_proxy_text(const kvf_tokenizer_t *tok, const kvf_proxy_flow_t *flow,
                            kvf_tokenizer_stream_t *st, int from, int to, bool flush)
{
    /* room for the feed plus what the flush may release */
    size_t cap = kvf_tokenizer_stream_cap(tok, to - from) + 3 * KVF_TOKENIZER_STREAM_PEND + 1;
    char *text = malloc(cap);
    size_t w;

    if (text == NULL) {
        return NULL;
    }
    w = kvf_tokenizer_stream_feed(tok, st, flow->out.tokens + from, to - from, text, cap);
    if (flush) {
        w += kvf_tokenizer_stream_flush(st, text + w, cap - w);
    }
    return kvf_proxy_text_nul(text, w);
}

/* ---- streaming ---------------------------------------------------------------- */

static void kvf_proxy_sse_set(kvf_proxy_stream_t *s, char *json)
{
    size_t n;

    free(s->out);
    s->out = NULL;
    s->out_len = s->out_off = 0;
    if (json == NULL) {
        return;
    }
    n = strlen(json);
    s->out = malloc(n + 9);
    if (s->out != NULL) {
        memcpy(s->out, "data: ", 6);
        memcpy(s->out + 6, json, n);
        memcpy(s->out + 6 + n, "\n\n", 3);
        s->out_len = n + 8;
    }
    free(json);
}

static char *kvf_proxy_sse_chunk(kvf_proxy_stream_t *s, int from, bool final)
{
    const kvf_proxy_openai_ctx_t *api = s->http->params.api;
    int to = s->flow.out.num_tokens;
    char *text = kvf_proxy_text(api->tok, &s->flow, &s->text, from, to, final);
    char *json;

    if (text == NULL) {
        return NULL;
    }
    json = kvf_proxy_openai_chunk_json(api, &s->req, &s->flow.out, text,
                                       s->flow.out.tokens + from, to - from, final);
    free(text);
    return json;
}

/* Produce the next SSE event into s->out; false when the stream is over. */
static bool kvf_proxy_sse_produce(kvf_proxy_stream_t *s)
{
    int from;

    switch (s->phase) {
    case KVF_PROXY_SSE_FIRST:
        /* The first token is out as soon as prefill returned it. */
        s->phase = KVF_PROXY_SSE_RUN;
        kvf_proxy_sse_set(s, kvf_proxy_sse_chunk(s, 0, false));
        return true;
    case KVF_PROXY_SSE_RUN:
        for (;;) {
            if (s->flow.done) {
                s->phase = KVF_PROXY_SSE_DONE_MARK;
                kvf_proxy_sse_set(s, kvf_proxy_sse_chunk(s, s->flow.out.num_tokens, true));
                return true;
            }
            if (kvf_proxy_flow_next(&s->flow, &from) != KVF_OK) {
                if (s->flow.client_gone) {
                    s->code = 499;
                    return false;
                }
                s->code = s->flow.http_code;
                s->phase = KVF_PROXY_SSE_DONE_MARK;
                kvf_proxy_sse_set(s, kvf_proxy_openai_error_json(s->flow.error,
                                                                 s->flow.error_type, NULL,
                                                                 s->flow.http_code));
                return true;
            }
            if (s->flow.out.num_tokens > from) {
                if (s->flow.done) {
                    /* Last tokens and the summary in one final chunk. */
                    s->phase = KVF_PROXY_SSE_DONE_MARK;
                    kvf_proxy_sse_set(s, kvf_proxy_sse_chunk(s, from, true));
                } else {
                    kvf_proxy_sse_set(s, kvf_proxy_sse_chunk(s, from, false));
                }
                return true;
            }
        }
    case KVF_PROXY_SSE_DONE_MARK:
        s->phase = KVF_PROXY_SSE_END;
        free(s->out);
        s->out = strdup("data: [DONE]\n\n");
        s->out_len = (s->out != NULL) ? strlen(s->out) : 0;
        s->out_off = 0;
        return true;
    case KVF_PROXY_SSE_END:
    default:
        return false;
    }
}

static ssize_t kvf_proxy_sse_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    kvf_proxy_stream_t *s = cls;
    size_t n;

    (void)pos;
    while (s->out_off >= s->out_len) {
        if (!kvf_proxy_sse_produce(s)) {
            return (s->code == 499) ? MHD_CONTENT_READER_END_WITH_ERROR :
                                      MHD_CONTENT_READER_END_OF_STREAM;
        }
        if (s->out == NULL) {
            kvf_error("request %s: out of memory building a stream chunk", s->flow.out.id);
            s->code = 500;
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
    n = s->out_len - s->out_off;
    if (n > max) {
        n = max;
    }
    memcpy(buf, s->out + s->out_off, n);
    s->out_off += n;
    return (ssize_t)n;
}

static void kvf_proxy_sse_free(void *cls)
{
    kvf_proxy_stream_t *s = cls;

    if ((s->phase != KVF_PROXY_SSE_END) || (s->out_off < s->out_len)) {
        /* MHD gave up on the connection before the end: the client left. */
        if (!s->flow.client_gone && !s->flow.done) {
            kvf_proxy_metrics_add(s->http->params.flow->metrics, KVF_PROXY_CTR_CLIENT_ABORTS, 1);
        }
        if (s->code == 200) {
            s->code = 499;
        }
        kvf_info("request %s: client went away mid-stream", s->flow.out.id);
    }
    kvf_proxy_flow_finish(&s->flow);
    kvf_proxy_metrics_request(s->http->params.flow->metrics, s->code);
    kvf_proxy_openai_req_cleanup(&s->req);
    free(s->out);
    atomic_fetch_sub(&s->http->inflight, 1);
    free(s);
}

/* ---- /v1/completions ---------------------------------------------------------- */

static enum MHD_Result kvf_proxy_completions(struct kvf_proxy_http *http,
                                             struct MHD_Connection *conn,
                                             const kvf_proxy_conn_t *cc)
{
    const kvf_proxy_flow_ctx_t *fctx = http->params.flow;
    kvf_proxy_stream_t *s;
    struct MHD_Response *resp;
    enum MHD_Result ret;
    char err[512];
    const char *param = NULL;
    int code = 400, from;

    if (cc->too_large) {
        snprintf(err, sizeof(err), "request body is larger than %zu bytes", http->params.max_body);
        kvf_proxy_metrics_request(fctx->metrics, 413);
        return kvf_proxy_respond_error(conn, 413, "invalid_request_error", err);
    }
    s = calloc(1, sizeof(*s));
    if (s == NULL) {
        return kvf_proxy_respond_error(conn, 500, "server_error", "out of memory");
    }
    atomic_fetch_add(&http->inflight, 1);   /* until s is freed */
    s->http = http;
    s->conn = conn;
    s->code = 200;
    if (kvf_proxy_openai_parse(http->params.api, (cc->body != NULL) ? cc->body : "", cc->len,
                               &s->req, &code, &param, err, sizeof(err)) != KVF_OK) {
        free(s);
        atomic_fetch_sub(&http->inflight, 1);
        kvf_proxy_metrics_request(fctx->metrics, code);
        return kvf_proxy_respond_error_param(conn, code, "invalid_request_error", param, err);
    }

    if (kvf_proxy_flow_start(&s->flow, fctx, &s->req, kvf_proxy_client_gone, s) != KVF_OK) {
        goto err_flow;
    }
    if (s->req.stream) {
        resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, kvf_proxy_sse_reader, s,
                                                 kvf_proxy_sse_free);
        if (resp == NULL) {
            s->flow.http_code = 500;
            s->flow.error_type = "server_error";
            snprintf(s->flow.error, sizeof(s->flow.error), "out of memory");
            goto err_flow;
        }
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
        ret = MHD_queue_response(conn, MHD_HTTP_OK, resp);
        MHD_destroy_response(resp);   /* s is freed by kvf_proxy_sse_free */
        return ret;
    }

    while (!s->flow.done) {
        if (kvf_proxy_flow_next(&s->flow, &from) != KVF_OK) {
            goto err_flow;
        }
    }
    {
        char *text = kvf_proxy_text(http->params.api->tok, &s->flow, &s->text, 0,
                                    s->flow.out.num_tokens, true);
        char *json = (text != NULL) ?
                     kvf_proxy_openai_completion_json(http->params.api, &s->req, &s->flow.out,
                                                      text) : NULL;
        free(text);
        kvf_proxy_flow_finish(&s->flow);
        kvf_proxy_metrics_request(fctx->metrics, (json != NULL) ? 200 : 500);
        kvf_proxy_openai_req_cleanup(&s->req);
        free(s);
        ret = kvf_proxy_respond(conn, MHD_HTTP_OK, "application/json", json);
        atomic_fetch_sub(&http->inflight, 1);
        return ret;
    }

err_flow:
    code = s->flow.http_code;
    kvf_proxy_flow_finish(&s->flow);
    kvf_proxy_metrics_request(fctx->metrics, code);
    kvf_proxy_openai_req_cleanup(&s->req);
    if (code == 499) {
        free(s);
        atomic_fetch_sub(&http->inflight, 1);
        return MHD_NO;   /* nobody to answer; close the connection */
    }
    ret = kvf_proxy_respond_error(conn, code, s->flow.error_type, s->flow.error);
    free(s);
    atomic_fetch_sub(&http->inflight, 1);
    return ret;
}

/* ---- routing -------------------------------------------------------------------- */

static enum MHD_Result kvf_proxy_metrics_page(struct kvf_proxy_http *http,
                                              struct MHD_Connection *conn)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);

    if (f == NULL) {
        return kvf_proxy_respond_error(conn, 500, "server_error", "out of memory");
    }
    kvf_proxy_metrics_render(http->params.flow->metrics, f);
    fprintf(f, "# HELP kvf_proxy_connections Open HTTP connections (this one included).\n"
            "# TYPE kvf_proxy_connections gauge\nkvf_proxy_connections %u\n"
            "# HELP kvf_proxy_connection_timeouts_total Connections closed for missing their "
            "header, body or idle deadline.\n"
            "# TYPE kvf_proxy_connection_timeouts_total counter\n"
            "kvf_proxy_connection_timeouts_total %llu\n", kvf_proxy_conns_count(http->conns),
            (unsigned long long)kvf_proxy_conns_timeouts(http->conns));
    kvf_proxy_pool_render_metrics(http->params.flow->pool, f);
    fclose(f);
    return kvf_proxy_respond(conn, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", buf);
}

static enum MHD_Result kvf_proxy_route(struct kvf_proxy_http *http, struct MHD_Connection *conn,
                                       const char *url, const char *method,
                                       const kvf_proxy_conn_t *cc)
{
    bool get = (strcmp(method, "GET") == 0) || (strcmp(method, "HEAD") == 0);
    bool post = (strcmp(method, "POST") == 0);

    if (strcmp(url, "/v1/completions") == 0) {
        if (!post) {
            return kvf_proxy_respond_error(conn, 405, "invalid_request_error",
                                           "use POST for /v1/completions");
        }
        return kvf_proxy_completions(http, conn, cc);
    }
    if ((strcmp(url, "/health") == 0) || (strcmp(url, "/v1/models") == 0) ||
        (strcmp(url, "/metrics") == 0)) {
        if (!get) {
            return kvf_proxy_respond_error(conn, 405, "invalid_request_error",
                                           "use GET for this endpoint");
        }
    }
    if (strcmp(url, "/health") == 0) {
        cJSON *h = kvf_proxy_pool_health_json(http->params.flow->pool);
        char *body = (h != NULL) ? cJSON_PrintUnformatted(h) : NULL;
        unsigned code = kvf_proxy_pool_ready(http->params.flow->pool) ?
                        MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE;

        cJSON_Delete(h);
        return kvf_proxy_respond(conn, code, "application/json", body);
    }
    if (strcmp(url, "/v1/models") == 0) {
        return kvf_proxy_respond(conn, MHD_HTTP_OK, "application/json",
                                 kvf_proxy_openai_models_json(http->params.api, http->started));
    }
    if (strcmp(url, "/metrics") == 0) {
        return kvf_proxy_metrics_page(http, conn);
    }
    return kvf_proxy_respond_error(conn, 404, "invalid_request_error", "no such endpoint");
}

static enum MHD_Result kvf_proxy_access(void *cls, struct MHD_Connection *conn, const char *url,
                                        const char *method, const char *version,
                                        const char *upload_data, size_t *upload_data_size,
                                        void **con_cls)
{
    struct kvf_proxy_http *http = cls;
    kvf_proxy_conn_t *cc = *con_cls;

    (void)version;
    if (cc == NULL) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
        const char *clen;
        char err[256];

        cc = calloc(1, sizeof(*cc));
        if (cc == NULL) {
            return MHD_NO;
        }
        *con_cls = cc;
        cc->slot = (ci != NULL) ? ci->socket_context : NULL;
        if (atomic_load(&http->draining)) {
            if (cc->slot != NULL) {
                kvf_proxy_conns_phase(http->conns, cc->slot, KVF_PROXY_PHASE_BUSY);
            }
            kvf_proxy_metrics_request(http->params.flow->metrics, 503);
            return kvf_proxy_respond_ex(conn, 503, "application/json",
                                        kvf_proxy_openai_error_json(
                                            "the proxy is shutting down; retry on another one",
                                            "server_error", NULL, 503), true);
        }
        /* headers are in: refuse at once what would be refused after the body */
        if ((cc->slot != NULL) &&
            (kvf_proxy_conns_admission(cc->slot) != KVF_PROXY_ADMIT_OK)) {
            bool total = (kvf_proxy_conns_admission(cc->slot) == KVF_PROXY_ADMIT_OVER_TOTAL);
            snprintf(err, sizeof(err), total ?
                     "too many connections: the proxy serves at most %u at once "
                     "(--max-connections); retry later" :
                     "too many connections from this client: at most %u at once "
                     "(--max-connections-per-client); retry later",
                     total ? http->params.max_connections : http->params.max_per_client);
            kvf_proxy_conns_phase(http->conns, cc->slot, KVF_PROXY_PHASE_BUSY);
            kvf_proxy_metrics_request(http->params.flow->metrics, 503);
            return kvf_proxy_respond_ex(conn, 503, "application/json",
                                        kvf_proxy_openai_error_json(err, "server_error", NULL,
                                                                    503), true);
        }
        clen = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                           MHD_HTTP_HEADER_CONTENT_LENGTH);
        if ((clen != NULL) && (strtoull(clen, NULL, 10) > http->params.max_body)) {
            snprintf(err, sizeof(err), "request body of %s bytes is larger than %zu bytes "
                     "(--max-body)", clen, http->params.max_body);
            if (cc->slot != NULL) {
                kvf_proxy_conns_phase(http->conns, cc->slot, KVF_PROXY_PHASE_BUSY);
            }
            kvf_proxy_metrics_request(http->params.flow->metrics, 413);
            return kvf_proxy_respond_ex(conn, 413, "application/json",
                                        kvf_proxy_openai_error_json(err,
                                                                    "invalid_request_error",
                                                                    NULL, 413), true);
        }
        if (cc->slot != NULL) {
            kvf_proxy_conns_phase(http->conns, cc->slot, KVF_PROXY_PHASE_BODY);
        }
        return MHD_YES;
    }
    if (*upload_data_size > 0) {
        size_t n = *upload_data_size;

        if (!cc->too_large && (cc->len + n > http->params.max_body)) {
            cc->too_large = true;
            free(cc->body);
            cc->body = NULL;
            cc->len = cc->cap = 0;
        }
        if (!cc->too_large) {
            if (cc->len + n + 1 > cc->cap) {
                size_t cap = (cc->len + n + 1) * 2;
                char *b = realloc(cc->body, cap);
                if (b == NULL) {
                    return MHD_NO;
                }
                cc->body = b;
                cc->cap = cap;
            }
            memcpy(cc->body + cc->len, upload_data, n);
            cc->len += n;
            cc->body[cc->len] = '\0';
        }
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (cc->slot != NULL) {
        kvf_proxy_conns_phase(http->conns, cc->slot, KVF_PROXY_PHASE_BUSY);
    }
    return kvf_proxy_route(http, conn, url, method, cc);
}

static void kvf_proxy_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                                enum MHD_RequestTerminationCode toe)
{
    struct kvf_proxy_http *http = cls;
    kvf_proxy_conn_t *cc = *con_cls;

    (void)conn;
    (void)toe;
    if (cc != NULL) {
        if (cc->slot != NULL) {   /* keep-alive: the next request's headers are due */
            kvf_proxy_conns_phase(http->conns, cc->slot, KVF_PROXY_PHASE_HEADERS);
        }
        free(cc->body);
        free(cc);
        *con_cls = NULL;
    }
}

static void kvf_proxy_notify_conn(void *cls, struct MHD_Connection *conn, void **socket_context,
                                  enum MHD_ConnectionNotificationCode toe)
{
    struct kvf_proxy_http *http = cls;

    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *fd =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        const union MHD_ConnectionInfo *addr =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);

        *socket_context = (fd != NULL) ?
                          kvf_proxy_conns_open(http->conns, fd->connect_fd,
                                               (addr != NULL) ? addr->client_addr : NULL) :
                          NULL;
    } else if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
        kvf_proxy_conns_close(http->conns, *socket_context);
        *socket_context = NULL;
    }
}

/* URI callback (connection thread): remember this thread's socket. */
static void *kvf_proxy_uri_log(void *cls, const char *uri, struct MHD_Connection *conn)
{
    struct kvf_proxy_http *http = cls;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);

    (void)uri;
    if ((ci != NULL) && (ci->socket_context != NULL)) {
        kvf_proxy_thread_fd = kvf_proxy_conns_claim(http->conns, ci->socket_context);
    }
    return NULL;   /* the access handler sets up the request's own state */
}

/* The readable text of one of the library's pages: its <body>, tags dropped. */
static void kvf_proxy_page_text(const char *html, size_t len, char *out, size_t cap)
{
    const char *b = strstr(html, "<body>");
    const char *end = html + len;
    size_t n = 0;
    bool tag = false;

    html = (b != NULL) ? b + 6 : html;
    for (; (html < end) && (n + 1 < cap); ++html) {
        if (strncmp(html, "</body>", 7) == 0) {
            break;
        }
        if (*html == '<') {
            tag = true;
        } else if (*html == '>') {
            tag = false;
        } else if (!tag) {
            out[n++] = *html;
        }
    }
    out[n] = '\0';
}

/* Send all of @a buf on @a fd, waiting up to 1 s for room. */
static void kvf_proxy_send_all(int fd, const char *buf, size_t len)
{
    while (len > 0) {
        ssize_t n = send(fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            buf += n;
            len -= (size_t)n;
            continue;
        }
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        if ((n < 0) && ((errno == EAGAIN) || (errno == EINTR)) && (poll(&p, 1, 1000) > 0)) {
            continue;
        }
        return;
    }
}

/*
 * Logger, connection thread: the library is about to send its own error
 * page for status @a code (@a page: its HTML). Answer in JSON first.
 * @return true when the JSON answer went out instead.
 */
static bool kvf_proxy_replace_page(struct kvf_proxy_http *http, unsigned code, const char *page,
                                   size_t page_len)
{
    int fd = (kvf_proxy_thread_fd >= 0) ? kvf_proxy_thread_fd :
             kvf_proxy_conns_sole_unclaimed_fd(http->conns);
    char text[256], msg[384], head[256];
    const char *reason = MHD_get_reason_phrase_for(code);
    char *json;
    int hl;

    if (fd < 0) {
        return false;
    }
    kvf_proxy_page_text(page, page_len, text, sizeof(text));
    switch (code) {
    case 431:
    case 414:
        snprintf(msg, sizeof(msg), "%s: the request line and headers must fit in %u KiB",
                 (code == 414) ? "request line (URL) too long" : "request headers too large",
                 KVF_PROXY_HEADER_MEMORY / 1024u);
        break;
    case 505:
        snprintf(msg, sizeof(msg), "HTTP version not supported: use HTTP/1.1 or HTTP/1.0");
        break;
    default:
        snprintf(msg, sizeof(msg), "malformed HTTP request: %s",
                 (text[0] != '\0') ? text : ((reason != NULL) ? reason : "refused"));
        break;
    }
    json = kvf_proxy_openai_error_json(msg, (code >= 500) ? "server_error" :
                                       "invalid_request_error", NULL, (int)code);
    if (json == NULL) {
        return false;
    }
    hl = snprintf(head, sizeof(head), "HTTP/1.1 %u %s\r\nContent-Type: application/json\r\n"
                  "Content-Length: %zu\r\nConnection: close\r\n\r\n", code,
                  (reason != NULL) ? reason : "Error", strlen(json));
    kvf_proxy_send_all(fd, head, (size_t)hl);
    kvf_proxy_send_all(fd, json, strlen(json));
    free(json);
    shutdown(fd, SHUT_WR);   /* the library's page fails to go out; it closes */
    kvf_proxy_metrics_request(http->params.flow->metrics, (int)code);
    kvf_info("http: refused a request with %u: %s", code, msg);
    return true;
}

static void kvf_proxy_mhd_log(void *cls, const char *fmt, va_list ap)
{
    static const char prefix[] = "Error processing request (HTTP response code is ";
    struct kvf_proxy_http *http = cls;
    char line[512];

    vsnprintf(line, sizeof(line), fmt, ap);
    line[strcspn(line, "\n")] = '\0';
    if (strncmp(line, prefix, sizeof(prefix) - 1) == 0) {
        unsigned code = 0;
        const char *page = strstr(line, " ('");
        const char *page_end = strstr(line, "')).");

        if ((sscanf(line + sizeof(prefix) - 1, "%u", &code) == 1) && (page != NULL) &&
            (page_end != NULL) && (page_end > page) &&
            kvf_proxy_replace_page(http, code, page + 3, (size_t)(page_end - page - 3))) {
            return;
        }
    }
    /* clients closing early, timeouts and caps are ordinary events for a
     * server; the library's failures to start or run are not */
    if ((strstr(line, "closed by remote") != NULL) || (strstr(line, "timed out") != NULL) ||
        (strstr(line, "connection limit") != NULL) || (strstr(line, "Too many") != NULL) ||
        (strstr(line, "application error generating response") != NULL) ||
        (strstr(line, "no longer available for sending") != NULL) ||
        (strncmp(line, "Failed to parse", 15) == 0)) {
        /* a stream whose client left (the request logs its own outcome), a page
         * that could not follow our JSON answer, a client's malformed header */
        kvf_info("http: %s", line);
    } else {
        kvf_warn("http: %s", line);
    }
}

kvf_status_t kvf_proxy_http_start(const kvf_proxy_http_params_t *params,
                                  kvf_proxy_http_h *http_p)
{
    struct addrinfo hints = {0}, *ai = NULL;
    struct kvf_proxy_http *http;
    char port[16];
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                     MHD_USE_ERROR_LOG | MHD_USE_ITC;   /* ITC: MHD_quiesce_daemon() */
    int rc;

    if ((params->port < 0) || (params->port > 65535)) {
        kvf_error("bad port %d", params->port);
        return KVF_ERR_INVALID_PARAM;
    }
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    snprintf(port, sizeof(port), "%d", params->port);
    rc = getaddrinfo(params->host, port, &hints, &ai);
    if ((rc != 0) || (ai == NULL)) {
        kvf_error("bad --host '%s': %s", params->host, gai_strerror(rc));
        return KVF_ERR_INVALID_PARAM;
    }
    http = calloc(1, sizeof(*http));
    if (http == NULL) {
        freeaddrinfo(ai);
        return KVF_ERR_NO_MEMORY;
    }
    http->params = *params;
    http->started = (int64_t)time(NULL);
    atomic_init(&http->stopping, false);
    atomic_init(&http->draining, false);
    atomic_init(&http->inflight, 0);
    {
        kvf_proxy_conns_params_t cp = {
            .max_total = params->max_connections,
            .max_per_client = params->max_per_client,
            .header_timeout_ms = params->header_timeout_ms,
            .body_timeout_ms = params->body_timeout_ms,
            .idle_timeout_ms = params->idle_timeout_ms,
        };
        kvf_status_t st = kvf_proxy_conns_create(&cp, &http->conns);
        if (st != KVF_OK) {
            freeaddrinfo(ai);
            free(http);
            return st;
        }
    }
    if (ai->ai_family == AF_INET6) {
        flags |= MHD_USE_IPv6;
    }
    http->daemon = MHD_start_daemon(flags, (uint16_t)params->port, NULL, NULL, kvf_proxy_access,
                                    http,
                                    MHD_OPTION_EXTERNAL_LOGGER, kvf_proxy_mhd_log, http,
                                    MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                                    MHD_OPTION_CONNECTION_LIMIT,
                                    params->max_connections + KVF_PROXY_CONN_OVERFLOW,
                                    MHD_OPTION_PER_IP_CONNECTION_LIMIT,
                                    params->max_per_client + KVF_PROXY_CONN_OVERFLOW,
                                    MHD_OPTION_CONNECTION_TIMEOUT,
                                    (unsigned)((params->idle_timeout_ms + 999) / 1000),
                                    MHD_OPTION_NOTIFY_COMPLETED, kvf_proxy_completed, http,
                                    MHD_OPTION_NOTIFY_CONNECTION, kvf_proxy_notify_conn, http,
                                    MHD_OPTION_URI_LOG_CALLBACK, kvf_proxy_uri_log, http,
                                    MHD_OPTION_CONNECTION_MEMORY_LIMIT,
                                    (size_t)KVF_PROXY_HEADER_MEMORY,
                                    MHD_OPTION_END);
    freeaddrinfo(ai);
    if (http->daemon == NULL) {
        kvf_error("cannot listen on %s:%d (port in use, or address not local?)", params->host,
                  params->port);
        kvf_proxy_conns_destroy(http->conns);
        free(http);
        return KVF_ERR_IO;
    }
    *http_p = http;
    return KVF_OK;
}

int kvf_proxy_http_port(kvf_proxy_http_h http)
{
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(http->daemon, MHD_DAEMON_INFO_BIND_PORT);

    return (di != NULL) ? (int)di->port : -1;
}

/* Wait up to @a ms for the requests in flight to end; true when none is left. */
static bool kvf_proxy_http_wait_idle(struct kvf_proxy_http *http, int64_t ms)
{
    int64_t end = kvf_proxy_now_us() + ms * 1000;

    while (atomic_load(&http->inflight) > 0) {
        struct timespec nap = {0, 20 * 1000000L};
        if (kvf_proxy_now_us() >= end) {
            return false;
        }
        nanosleep(&nap, NULL);
    }
    return true;
}

void kvf_proxy_http_drain(kvf_proxy_http_h http, int64_t grace_ms)
{
    MHD_socket lsock;
    kvf_proxy_flow_ctx_t *fctx = http->params.flow;

    atomic_store(&http->draining, true);
    lsock = MHD_quiesce_daemon(http->daemon);   /* no new connections from here */
    if (lsock != MHD_INVALID_SOCKET) {
        close(lsock);
    }
    kvf_info("draining: not accepting; %d request(s) in flight get up to %lld ms to finish",
             atomic_load(&http->inflight), (long long)grace_ms);
    if (kvf_proxy_http_wait_idle(http, grace_ms)) {
        return;
    }
    /* End the rest: a stream gets an error event and [DONE], others a 503. */
    kvf_info("draining: ending %d request(s) still in flight", atomic_load(&http->inflight));
    atomic_store(&fctx->cancel, true);
    if (!kvf_proxy_http_wait_idle(http, 2000)) {
        kvf_warn("draining: %d request(s) did not end; stopping anyway",
                 atomic_load(&http->inflight));
    }
}

void kvf_proxy_http_stop(kvf_proxy_http_h http)
{
    if (http == NULL) {
        return;
    }
    atomic_store(&http->stopping, true);
    MHD_stop_daemon(http->daemon);
    kvf_proxy_conns_destroy(http->conns);
    free(http);
}
