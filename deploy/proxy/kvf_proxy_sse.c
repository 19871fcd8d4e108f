/*
 * kvf-proxy completions on the HTTP edge: a request's flow is stepped on
 * the HTTP library's thread whenever it may have progressed, and the
 * connection is suspended in between (kvf_proxy_edge.h), so no thread waits
 * for an instance.
 *
 *   body complete -> flow begin -> step ... (suspended while it waits)
 *     non-stream: until done, then one JSON answer
 *     stream:     until the first token, then a server-sent-events response
 *                 whose content reader steps the flow and suspends the
 *                 connection when nothing is ready (it returns 0 bytes then,
 *                 never blocks); MHD writes each piece out at once (chunked).
 *
 * A failure before the first token is an HTTP error answer; after it, an
 * error event followed by "data: [DONE]". A stream is never cut for being
 * quiet: a suspended connection has no inactivity timeout, and the flow's
 * own --token-timeout ends it with the error event and [DONE].
 *
 * Client departure: each step asks (POLLRDHUP on the socket), the edge
 * checks suspended ones every 100 ms, and a stream also learns it when a
 * write fails (MHD then calls the response's free callback before the end
 * of the stream). Either way the flow aborts the request on both instances.
 */
#define _GNU_SOURCE
#include "kvf_proxy_http_int.h"
#include "kvf_log.h"

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool kvf_proxy_client_gone(void *arg)
{
    kvf_proxy_cmpl_t *c = arg;
    struct pollfd pfd;

    if (atomic_load(&c->http->stopping)) {
        return true;
    }
    if (c->wait.fd < 0) {
        return false;
    }
    pfd.fd = c->wait.fd;
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

static void kvf_proxy_sse_set(kvf_proxy_cmpl_t *s, char *json)
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

static char *kvf_proxy_sse_chunk(kvf_proxy_cmpl_t *s, int from, bool final)
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

typedef enum {
    KVF_PROXY_SSE_PRODUCED = 0,   /* s->out holds the next event */
    KVF_PROXY_SSE_WAIT,           /* nothing ready: suspend */
    KVF_PROXY_SSE_OVER,           /* the stream is over */
} kvf_proxy_sse_next_t;

/* Decode replies: the next event, or wait. */
static kvf_proxy_sse_next_t kvf_proxy_sse_run(kvf_proxy_cmpl_t *s)
{
    int from;

    for (;;) {
        kvf_status_t st;

        if (s->flow.done) {
            s->phase = KVF_PROXY_SSE_DONE_MARK;
            kvf_proxy_sse_set(s, kvf_proxy_sse_chunk(s, s->flow.out.num_tokens, true));
            return KVF_PROXY_SSE_PRODUCED;
        }
        st = kvf_proxy_flow_step(&s->flow, &from);
        if (st == KVF_PROXY_FLOW_PENDING) {
            return KVF_PROXY_SSE_WAIT;
        }
        if (st != KVF_OK) {
            if (s->flow.client_gone) {
                s->code = 499;
                return KVF_PROXY_SSE_OVER;
            }
            s->code = s->flow.http_code;
            s->phase = KVF_PROXY_SSE_DONE_MARK;
            kvf_proxy_sse_set(s, kvf_proxy_openai_error_json(s->flow.error, s->flow.error_type,
                                                             NULL, s->flow.http_code));
            return KVF_PROXY_SSE_PRODUCED;
        }
        if (s->flow.out.num_tokens > from) {
            /* with done: the last tokens and the summary in one final chunk */
            s->phase = s->flow.done ? KVF_PROXY_SSE_DONE_MARK : KVF_PROXY_SSE_RUN;
            kvf_proxy_sse_set(s, kvf_proxy_sse_chunk(s, from, s->flow.done));
            return KVF_PROXY_SSE_PRODUCED;
        }
    }
}

/* The next SSE event into s->out. */
static kvf_proxy_sse_next_t kvf_proxy_sse_produce(kvf_proxy_cmpl_t *s)
{
    switch (s->phase) {
    case KVF_PROXY_SSE_FIRST:
        /* The first token is out as soon as prefill returned it. */
        s->phase = KVF_PROXY_SSE_RUN;
        kvf_proxy_sse_set(s, kvf_proxy_sse_chunk(s, 0, false));
        return KVF_PROXY_SSE_PRODUCED;
    case KVF_PROXY_SSE_RUN:
        return kvf_proxy_sse_run(s);
    case KVF_PROXY_SSE_DONE_MARK:
        s->phase = KVF_PROXY_SSE_END;
        free(s->out);
        s->out = strdup("data: [DONE]\n\n");
        s->out_len = (s->out != NULL) ? strlen(s->out) : 0;
        s->out_off = 0;
        return KVF_PROXY_SSE_PRODUCED;
    case KVF_PROXY_SSE_END:
    default:
        return KVF_PROXY_SSE_OVER;
    }
}

/* Content reader (HTTP library thread): never blocks; 0 bytes with the connection suspended. */
static ssize_t kvf_proxy_sse_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    kvf_proxy_cmpl_t *s = cls;
    size_t n;

    (void)pos;
    while (s->out_off >= s->out_len) {
        kvf_proxy_sse_next_t next = kvf_proxy_sse_produce(s);

        if (next == KVF_PROXY_SSE_WAIT) {
            if (kvf_proxy_edge_suspend(s->http->edge, &s->wait,
                                       kvf_proxy_flow_wake_us(&s->flow))) {
                return 0;
            }
            continue;   /* news came meanwhile */
        }
        if (next == KVF_PROXY_SSE_OVER) {
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

static void kvf_proxy_cmpl_free(kvf_proxy_cmpl_t *c)
{
    kvf_proxy_flow_finish(&c->flow);   /* no notification for it from here */
    kvf_proxy_metrics_request(c->http->params.flow->metrics, c->code);
    kvf_proxy_openai_req_cleanup(&c->req);
    free(c->out);
    atomic_fetch_sub(&c->http->inflight, 1);
    free(c);
}

static void kvf_proxy_sse_free(void *cls)
{
    kvf_proxy_cmpl_t *s = cls;

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
    kvf_proxy_cmpl_free(s);
}

void kvf_proxy_cmpl_abandon(kvf_proxy_cmpl_t *c)
{
    if (c->code == 200) {
        c->code = 499;
    }
    kvf_proxy_cmpl_free(c);
}

/* ---- /v1/completions ---------------------------------------------------------- */

/* The flow failed: answer its error (499: nobody to answer, close). Frees @a c. */
static enum MHD_Result kvf_proxy_cmpl_fail(struct MHD_Connection *conn, kvf_proxy_conn_t *cc)
{
    kvf_proxy_cmpl_t *c = cc->cmpl;
    enum MHD_Result ret = MHD_NO;

    cc->cmpl = NULL;
    c->code = c->flow.http_code;
    if (c->code != 499) {
        ret = kvf_proxy_respond_error_retry(conn, c->code, c->flow.error_type, NULL,
                                            c->flow.error, c->flow.retry_after_s);
    }
    kvf_proxy_cmpl_free(c);
    return ret;
}

/* Done without streaming: one JSON answer. Frees the completion. */
static enum MHD_Result kvf_proxy_cmpl_answer(struct MHD_Connection *conn, kvf_proxy_conn_t *cc)
{
    kvf_proxy_cmpl_t *c = cc->cmpl;
    const kvf_proxy_openai_ctx_t *api = c->http->params.api;
    char *text = kvf_proxy_text(api->tok, &c->flow, &c->text, 0, c->flow.out.num_tokens, true);
    char *json = (text != NULL) ?
                 kvf_proxy_openai_completion_json(api, &c->req, &c->flow.out, text) : NULL;

    free(text);
    cc->cmpl = NULL;
    c->code = (json != NULL) ? 200 : 500;
    kvf_proxy_cmpl_free(c);
    return kvf_proxy_respond_ex(conn, MHD_HTTP_OK, "application/json", json, false);
}

/* The first token is in: hand the completion to an SSE response. */
static enum MHD_Result kvf_proxy_cmpl_stream(struct MHD_Connection *conn, kvf_proxy_conn_t *cc)
{
    kvf_proxy_cmpl_t *c = cc->cmpl;
    struct MHD_Response *resp;
    enum MHD_Result ret;

    resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, kvf_proxy_sse_reader, c,
                                             kvf_proxy_sse_free);
    if (resp == NULL) {
        c->flow.http_code = 500;
        c->flow.error_type = "server_error";
        snprintf(c->flow.error, sizeof(c->flow.error), "out of memory");
        return kvf_proxy_cmpl_fail(conn, cc);
    }
    cc->cmpl = NULL;   /* the response owns it now */
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    ret = MHD_queue_response(conn, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp);   /* c is freed by kvf_proxy_sse_free */
    return ret;
}

/* Parse the body and begin the flow; NULL after answering (the answer in *ret_p). */
static kvf_proxy_cmpl_t *kvf_proxy_cmpl_new(struct kvf_proxy_http *http,
                                            struct MHD_Connection *conn, kvf_proxy_conn_t *cc,
                                            enum MHD_Result *ret_p)
{
    const kvf_proxy_flow_ctx_t *fctx = http->params.flow;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    kvf_proxy_cmpl_t *c;
    const char *param = NULL;
    char err[512];
    int code = 400;

    if (cc->too_large) {
        snprintf(err, sizeof(err), "request body is larger than %zu bytes", http->params.max_body);
        kvf_proxy_metrics_request(fctx->metrics, 413);
        *ret_p = kvf_proxy_respond_error(conn, 413, "invalid_request_error", NULL, err);
        return NULL;
    }
    c = calloc(1, sizeof(*c));
    if (c == NULL) {
        *ret_p = kvf_proxy_respond_error(conn, 500, "server_error", NULL, "out of memory");
        return NULL;
    }
    atomic_fetch_add(&http->inflight, 1);   /* until c is freed */
    c->http = http;
    c->conn = conn;
    c->code = 200;
    c->wait.edge = http->edge;
    c->wait.conn = conn;
    c->wait.fd = (ci != NULL) ? ci->connect_fd : -1;
    if (kvf_proxy_openai_parse(http->params.api, (cc->body != NULL) ? cc->body : "", cc->len,
                               &c->req, &code, &param, err, sizeof(err)) != KVF_OK) {
        free(c);
        atomic_fetch_sub(&http->inflight, 1);
        kvf_proxy_metrics_request(fctx->metrics, code);
        *ret_p = kvf_proxy_respond_error(conn, code, "invalid_request_error", param, err);
        return NULL;
    }
    cc->cmpl = c;
    if (kvf_proxy_flow_begin(&c->flow, fctx, &c->req, kvf_proxy_client_gone, c,
                             kvf_proxy_edge_notify, &c->wait) != KVF_OK) {
        *ret_p = kvf_proxy_cmpl_fail(conn, cc);
        return NULL;
    }
    return c;
}

enum MHD_Result kvf_proxy_completions(struct kvf_proxy_http *http, struct MHD_Connection *conn,
                                      kvf_proxy_conn_t *cc)
{
    kvf_proxy_cmpl_t *c = cc->cmpl;
    enum MHD_Result ret = MHD_NO;
    int from;

    if ((c == NULL) && ((c = kvf_proxy_cmpl_new(http, conn, cc, &ret)) == NULL)) {
        return ret;
    }
    for (;;) {
        kvf_status_t st;

        if (c->flow.done) {
            return kvf_proxy_cmpl_answer(conn, cc);
        }
        if (c->req.stream && (c->flow.stage == KVF_PROXY_FLOW_DECODE)) {
            return kvf_proxy_cmpl_stream(conn, cc);
        }
        st = kvf_proxy_flow_step(&c->flow, &from);
        if (st == KVF_PROXY_FLOW_PENDING) {
            if (kvf_proxy_edge_suspend(http->edge, &c->wait, kvf_proxy_flow_wake_us(&c->flow))) {
                return MHD_YES;   /* resumed: the library calls the handler again */
            }
            continue;
        }
        if (st != KVF_OK) {
            return kvf_proxy_cmpl_fail(conn, cc);
        }
    }
}
