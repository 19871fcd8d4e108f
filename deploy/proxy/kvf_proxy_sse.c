/*
 * kvf-proxy completions (and chat completions) on the HTTP edge: a request's
 * flows (one per choice: prompts x n, kvf_proxy_choice.h) are stepped on the
 * HTTP library's thread whenever they may have progressed, and the connection
 * is suspended in between (kvf_proxy_edge.h), so no thread waits for an
 * instance.
 *
 *   body complete -> flow begin -> step ... (suspended while it waits)
 *     non-stream: until done, then one JSON answer
 *     stream:     until every choice has its first token, then a server-sent-events
 *                 response (a chunk per choice's piece of text, the choice's final
 *                 chunk, a usage chunk without choices with include_usage, [DONE])
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

/* ---- the choices' flows ----------------------------------------------------------- */

typedef enum {
    KVF_PROXY_PUMP_MOVED = 0,   /* something happened */
    KVF_PROXY_PUMP_WAIT,        /* nothing: suspend until a notification or the wake time */
    KVF_PROXY_PUMP_FAILED,      /* a flow failed: c->failed names it */
} kvf_proxy_pump_t;

/* Step every choice's flow that is not over, and update its text. */
static kvf_proxy_pump_t kvf_proxy_pump(kvf_proxy_cmpl_t *c)
{
    const kvf_proxy_openai_ctx_t *api = c->http->params.api;
    bool moved = false;

    for (int i = 0; i < c->num_choices; ++i) {
        kvf_proxy_choice_t *ch = &c->choices[i];
        int from;
        kvf_status_t st;

        if (ch->flow.stage == KVF_PROXY_FLOW_OVER) {
            if (!kvf_proxy_choice_over(ch) && ch->flow.done) {
                moved = true;   /* flush its text */
                if (kvf_proxy_choice_update(ch, api) != KVF_OK) {
                    goto oom;
                }
            }
            continue;
        }
        st = kvf_proxy_flow_step(&ch->flow, &from);
        if (st == KVF_PROXY_FLOW_PENDING) {
            continue;
        }
        if (st != KVF_OK) {
            c->failed = i;
            return KVF_PROXY_PUMP_FAILED;
        }
        moved = true;
        if (kvf_proxy_choice_update(ch, api) != KVF_OK) {
            goto oom;
        }
    }
    return moved ? KVF_PROXY_PUMP_MOVED : KVF_PROXY_PUMP_WAIT;
oom:
    c->failed = 0;
    c->choices[0].flow.http_code = 500;
    c->choices[0].flow.error_type = "server_error";
    snprintf(c->choices[0].flow.error, sizeof(c->choices[0].flow.error), "out of memory");
    return KVF_PROXY_PUMP_FAILED;
}

/* The earliest deadline among the flows still running. */
static int64_t kvf_proxy_wake(const kvf_proxy_cmpl_t *c)
{
    int64_t wake = INT64_MAX;

    for (int i = 0; i < c->num_choices; ++i) {
        if (c->choices[i].flow.stage != KVF_PROXY_FLOW_OVER) {
            int64_t w = kvf_proxy_flow_wake_us(&c->choices[i].flow);
            wake = (w < wake) ? w : wake;
        }
    }
    return (wake == INT64_MAX) ? kvf_proxy_now_us() : wake;
}

static bool kvf_proxy_all_over(const kvf_proxy_cmpl_t *c)
{
    for (int i = 0; i < c->num_choices; ++i) {
        if (!kvf_proxy_choice_over(&c->choices[i])) {
            return false;
        }
    }
    return true;
}

/* Every choice has its first token (or is over): a stream may start. */
static bool kvf_proxy_all_started(const kvf_proxy_cmpl_t *c)
{
    for (int i = 0; i < c->num_choices; ++i) {
        const kvf_proxy_flow_t *f = &c->choices[i].flow;
        if ((f->stage != KVF_PROXY_FLOW_DECODE) && (f->stage != KVF_PROXY_FLOW_OVER)) {
            return false;
        }
    }
    return true;
}

static kvf_proxy_usage_t kvf_proxy_usage(const kvf_proxy_cmpl_t *c)
{
    kvf_proxy_usage_t u = {0, 0};

    for (int p = 0; p < c->req.num_prompts; ++p) {
        u.prompt_tokens += c->req.prompt_lens[p];
    }
    for (int i = 0; i < c->num_choices; ++i) {
        u.completion_tokens += kvf_proxy_choice_tokens(&c->choices[i]);
    }
    return u;
}

/* A choice's piece [ids_sent, to) of tokens with text [sent, text_end) into @a out. */
static void kvf_proxy_piece(const kvf_proxy_choice_t *ch, int to, const char *text,
                            bool final, kvf_proxy_choice_out_t *out)
{
    const kvf_proxy_completion_t *o = &ch->flow.out;
    int from = ch->ids_sent;

    memset(out, 0, sizeof(*out));
    out->index = ch->index;
    out->flow_out = o;
    out->prompt_ids = ch->sub.prompt_ids;
    out->num_prompt = ch->sub.num_prompt;
    out->text = text;
    out->ids = o->tokens + from;
    out->num_ids = to - from;
    if (ch->show_logprobs && (o->num_logprobs >= to)) {
        out->token_logprobs = o->token_logprobs + from;
        out->top_ids = o->top_ids + (size_t)from * (size_t)ch->sub.logprobs;
        out->top_logprobs = o->top_logprobs + (size_t)from * (size_t)ch->sub.logprobs;
        out->per = ch->sub.logprobs;
    }
    out->text_offset = (int)ch->sent + ((ch->echo != NULL) ? (int)strlen(ch->echo) : 0);
    out->stop_token = -1;
    if (final) {
        out->finish_reason = kvf_proxy_choice_finish(ch);
        out->tool_calls = ch->tool_calls;
        out->stop_reason = ch->stop_reason;
        out->stop_token = (ch->stop_reason == NULL) ? ch->stop_token : -1;
    }
    out->first = !ch->first_sent;
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

typedef enum {
    KVF_PROXY_SSE_PRODUCED = 0,   /* s->out holds the next event */
    KVF_PROXY_SSE_WAIT,           /* nothing ready: suspend */
    KVF_PROXY_SSE_OVER,           /* the stream is over */
} kvf_proxy_sse_next_t;

/* A chunk of @a ch carrying tool-call deltas @a deltas (freed) and no text nor token. */
static void kvf_proxy_sse_tools_chunk(kvf_proxy_cmpl_t *s, kvf_proxy_choice_t *ch,
                                      cJSON *deltas)
{
    kvf_proxy_choice_out_t out;
    kvf_proxy_usage_t u = {.prompt_tokens = ch->sub.num_prompt,
                           .completion_tokens = ch->ids_sent};

    kvf_proxy_piece(ch, ch->ids_sent, "", false, &out);
    out.tool_calls = deltas;
    kvf_proxy_sse_set(s, kvf_proxy_openai_chunk(s->http->params.api, &s->req, &ch->flow.out,
                                                &out, s->req.continuous_usage ? &u : NULL));
    cJSON_Delete(deltas);
}

/*
 * The next chunk of some choice (round robin from s->rr): its ready text, a tool call's
 * delta once the text before it is out (kvf_proxy_tools_stream.h), or its final chunk once
 * over. false: no choice has anything to send now.
 * With logprobs or token ids asked, every token has its own chunk (vLLM's), its text what
 * was ready up to it ("" while held back: a special token, a possible stop string), so a
 * client timing tokens sees each when it is decoded.
 */
static bool kvf_proxy_sse_choice_chunk(kvf_proxy_cmpl_t *s)
{
    const kvf_proxy_openai_ctx_t *api = s->http->params.api;

    for (int k = 0; k < s->num_choices; ++k) {
        int i = (s->rr + k) % s->num_choices;
        kvf_proxy_choice_t *ch = &s->choices[i];
        bool over = kvf_proxy_choice_over(ch);
        size_t ready = kvf_proxy_choice_ready(ch);
        size_t echo = (!ch->first_sent && (ch->echo != NULL)) ? strlen(ch->echo) : 0;
        int to = over ? kvf_proxy_choice_tokens(ch) : ch->decoded;
        bool per_token = s->req.want_logprobs || s->req.return_token_ids;
        bool last = over;
        kvf_proxy_choice_out_t out;
        kvf_proxy_reasoning_span_t sp;
        kvf_proxy_usage_t u;
        size_t c0, r0, r1;
        char *text, *reasoning;
        cJSON *rest = NULL;

        if (per_token && (ch->ids_sent + 1 < to)) {   /* one token: its own chunk */
            to = ch->ids_sent + 1;
            last = false;
            ready = (ch->tok_end[to - 1] < ready) ? ch->tok_end[to - 1] : ready;
        } else if (per_token && !over && (to > ch->ids_sent) &&
                   kvf_proxy_choice_ends_at(ch, api, to)) {
            continue;   /* the last token: it goes with the finish_reason, as vLLM's */
        }
        if (!last && ch->first_sent && !ch->final_sent && (per_token || (ready <= ch->sent))) {
            /* the text before is out: a call's delta (one chunk per token: as far as the
             * tokens sent, so a backlog of tokens streams its call piece by piece too) */
            size_t upto = !per_token ? SIZE_MAX :
                          (ch->ids_sent > 0) ? ch->tok_end[ch->ids_sent - 1] : 0;
            cJSON *delta = NULL;
            if (kvf_proxy_choice_tool_delta(ch, upto, false, &delta) != KVF_OK) {
                kvf_proxy_sse_set(s, NULL);
                return true;
            }
            if (delta != NULL) {
                kvf_proxy_sse_tools_chunk(s, ch, delta);
                s->rr = (i + 1) % s->num_choices;
                return true;
            }
        }
        /* the first chunk of each choice goes out at once, text or not (its first token;
         * chat's role) */
        if (ch->final_sent ||
            (!last && (ready <= ch->sent) && ch->first_sent &&
             (!per_token || (to <= ch->ids_sent)))) {
            continue;
        }
        if (ready < ch->sent) {
            ready = ch->sent;
        }
        kvf_proxy_choice_span(ch, &sp);
        c0 = (ch->sent > sp.c_start) ? ch->sent : sp.c_start;   /* content [c0, ready) */
        r0 = (ch->sent > sp.r_start) ? ch->sent : sp.r_start;   /* reasoning [r0, r1) */
        r1 = (ready < sp.r_end) ? ready : sp.r_end;
        c0 = (c0 < ready) ? c0 : ready;
        text = malloc(echo + (ready - c0) + 1);
        reasoning = (r1 > r0) ? strndup(ch->text + r0, r1 - r0) : NULL;
        if ((text == NULL) || ((r1 > r0) && (reasoning == NULL))) {
            free(text);
            kvf_proxy_sse_set(s, NULL);
            return true;
        }
        memcpy(text, (echo > 0) ? ch->echo : "", echo);
        if (ready > c0) {   /* ch->text is NULL until the first piece of text */
            memcpy(text + echo, ch->text + c0, ready - c0);
        }
        text[echo + (ready - c0)] = '\0';
        kvf_proxy_piece(ch, to, text, last, &out);
        if (last && (kvf_proxy_choice_tool_delta(ch, SIZE_MAX, true, &rest) != KVF_OK)) {
            free(text);
            free(reasoning);
            kvf_proxy_sse_set(s, NULL);
            return true;
        }
        out.tool_calls = rest;   /* what the calls' deltas lack (a response has them whole) */
        out.reasoning = reasoning;
        out.text_offset -= (int)echo;
        u.prompt_tokens = ch->sub.num_prompt;
        u.completion_tokens = to;
        kvf_proxy_sse_set(s, kvf_proxy_openai_chunk(api, &s->req, &ch->flow.out, &out,
                                                    s->req.continuous_usage ? &u : NULL));
        cJSON_Delete(rest);
        free(text);
        free(reasoning);
        ch->sent = ready;
        ch->ids_sent = to;
        ch->first_sent = true;
        ch->final_sent = last;
        s->rr = (i + 1) % s->num_choices;
        return true;
    }
    return false;
}

/* Decode replies: the next event, or wait. */
static kvf_proxy_sse_next_t kvf_proxy_sse_run(kvf_proxy_cmpl_t *s)
{
    const kvf_proxy_openai_ctx_t *api = s->http->params.api;

    for (;;) {
        kvf_proxy_pump_t p;

        if (kvf_proxy_sse_choice_chunk(s)) {
            return KVF_PROXY_SSE_PRODUCED;
        }
        if (kvf_proxy_all_over(s)) {
            s->phase = KVF_PROXY_SSE_DONE_MARK;
            if (s->req.include_usage) {
                kvf_proxy_usage_t u = kvf_proxy_usage(s);
                kvf_proxy_sse_set(s, kvf_proxy_openai_chunk(api, &s->req,
                                                            &s->choices[0].flow.out, NULL, &u));
                return KVF_PROXY_SSE_PRODUCED;
            }
            s->phase = KVF_PROXY_SSE_END;
            free(s->out);
            s->out = strdup("data: [DONE]\n\n");
            s->out_len = (s->out != NULL) ? strlen(s->out) : 0;
            s->out_off = 0;
            return KVF_PROXY_SSE_PRODUCED;
        }
        p = kvf_proxy_pump(s);
        if (p == KVF_PROXY_PUMP_WAIT) {
            return KVF_PROXY_SSE_WAIT;
        }
        if (p == KVF_PROXY_PUMP_FAILED) {
            kvf_proxy_flow_t *f = &s->choices[s->failed].flow;
            if (f->client_gone) {
                s->code = 499;
                return KVF_PROXY_SSE_OVER;
            }
            s->code = f->http_code;
            s->phase = KVF_PROXY_SSE_DONE_MARK;
            kvf_proxy_sse_set(s, kvf_proxy_openai_error_json(f->error, f->error_type, NULL,
                                                             f->http_code));
            return KVF_PROXY_SSE_PRODUCED;
        }
    }
}

/* The next SSE event into s->out. */
static kvf_proxy_sse_next_t kvf_proxy_sse_produce(kvf_proxy_cmpl_t *s)
{
    switch (s->phase) {
    case KVF_PROXY_SSE_FIRST:
    case KVF_PROXY_SSE_RUN:
        s->phase = KVF_PROXY_SSE_RUN;
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
            if (kvf_proxy_edge_suspend(s->http->edge, &s->wait, kvf_proxy_wake(s))) {
                return 0;
            }
            continue;   /* news came meanwhile */
        }
        if (next == KVF_PROXY_SSE_OVER) {
            return (s->code == 499) ? MHD_CONTENT_READER_END_WITH_ERROR :
                                      MHD_CONTENT_READER_END_OF_STREAM;
        }
        if (s->out == NULL) {
            kvf_error("request %s: out of memory building a stream chunk",
                      s->choices[0].flow.out.id);
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
    for (int i = 0; i < c->num_choices; ++i) {
        kvf_proxy_choice_cleanup(&c->choices[i]);   /* no notification from here */
    }
    free(c->choices);
    kvf_proxy_metrics_request(c->http->params.flow->metrics, c->code);
    kvf_proxy_openai_req_cleanup(&c->req);
    free(c->out);
    atomic_fetch_sub(&c->http->inflight, 1);
    free(c);
}

static bool kvf_proxy_cmpl_done_normally(const kvf_proxy_cmpl_t *c)
{
    for (int i = 0; i < c->num_choices; ++i) {
        if (!c->choices[i].flow.done) {
            return false;
        }
    }
    return true;
}

static bool kvf_proxy_cmpl_client_gone_flag(const kvf_proxy_cmpl_t *c)
{
    for (int i = 0; i < c->num_choices; ++i) {
        if (c->choices[i].flow.client_gone) {
            return true;
        }
    }
    return false;
}

static void kvf_proxy_sse_free(void *cls)
{
    kvf_proxy_cmpl_t *s = cls;

    if ((s->phase != KVF_PROXY_SSE_END) || (s->out_off < s->out_len)) {
        /* MHD gave up on the connection before the end: the client left. */
        if (!kvf_proxy_cmpl_client_gone_flag(s) && !kvf_proxy_cmpl_done_normally(s)) {
            kvf_proxy_metrics_add(s->http->params.flow->metrics, KVF_PROXY_CTR_CLIENT_ABORTS, 1);
        }
        if (s->code == 200) {
            s->code = 499;
        }
        kvf_info("request %s: client went away mid-stream", s->choices[0].flow.out.id);
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

/* A response with the client's x-request-id echoed. @a body is taken. */
static enum MHD_Result kvf_proxy_cmpl_respond(struct MHD_Connection *conn, const char *xrid,
                                              char *body)
{
    struct MHD_Response *resp;
    enum MHD_Result ret;

    if (body == NULL) {
        return kvf_proxy_respond_error(conn, 500, "server_error", NULL, "out of memory");
    }
    resp = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (resp == NULL) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    if (xrid[0] != '\0') {
        MHD_add_response_header(resp, "X-Request-Id", xrid);
    }
    ret = MHD_queue_response(conn, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp);
    return ret;
}

/* A flow failed: answer its error (499: nobody to answer, close). Frees @a c. */
static enum MHD_Result kvf_proxy_cmpl_fail(struct MHD_Connection *conn, kvf_proxy_conn_t *cc)
{
    kvf_proxy_cmpl_t *c = cc->cmpl;
    kvf_proxy_flow_t *f = &c->choices[(c->failed >= 0) ? c->failed : 0].flow;
    enum MHD_Result ret = MHD_NO;

    cc->cmpl = NULL;
    c->code = f->http_code;
    if (c->code != 499) {
        ret = kvf_proxy_respond_error_retry(conn, c->code, f->error_type, NULL, f->error,
                                            f->retry_after_s);
    }
    kvf_proxy_cmpl_free(c);
    return ret;
}

/* best_of > n: each prompt's n best candidates moved to the front of @a outs, renumbered
 * prompt x n + rank, and the usage counting only them (vLLM's). @return the outputs kept. */
static int kvf_proxy_best_of(const kvf_proxy_cmpl_t *c, kvf_proxy_choice_out_t *outs,
                             kvf_proxy_usage_t *u)
{
    int per = kvf_proxy_req_per_prompt(&c->req), n = c->req.n, k = 0;
    kvf_proxy_choice_out_t kept[KVF_PROXY_MAX_CHOICES];

    if (per == n) {
        return c->num_choices;
    }
    u->completion_tokens = 0;
    for (int p = 0; p < c->req.num_prompts; ++p) {
        int pick[KVF_PROXY_MAX_CHOICES];
        kvf_proxy_choice_best(&c->choices[p * per], per, n, pick);
        for (int r = 0; r < n; ++r) {
            kept[k] = outs[p * per + pick[r]];
            kept[k].index = k;
            u->completion_tokens += kvf_proxy_choice_tokens(&c->choices[p * per + pick[r]]);
            ++k;
        }
    }
    memcpy(outs, kept, (size_t)k * sizeof(*outs));
    return k;
}

/* Done without streaming: one JSON answer. Frees the completion. */
static enum MHD_Result kvf_proxy_cmpl_answer(struct MHD_Connection *conn, kvf_proxy_conn_t *cc)
{
    kvf_proxy_cmpl_t *c = cc->cmpl;
    const kvf_proxy_openai_ctx_t *api = c->http->params.api;
    kvf_proxy_choice_out_t *outs = calloc((size_t)c->num_choices, sizeof(*outs));
    char **texts = calloc((size_t)c->num_choices, sizeof(*texts));
    char **thoughts = calloc((size_t)c->num_choices, sizeof(*thoughts));
    kvf_proxy_usage_t u = kvf_proxy_usage(c);
    char *json = NULL;
    bool ok = (outs != NULL) && (texts != NULL) && (thoughts != NULL);

    for (int i = 0; ok && (i < c->num_choices); ++i) {
        kvf_proxy_choice_t *ch = &c->choices[i];
        size_t echo = (ch->echo != NULL) ? strlen(ch->echo) : 0;
        kvf_proxy_reasoning_span_t sp;
        size_t c0;

        kvf_proxy_choice_span(ch, &sp);   /* content from c0; reasoning apart */
        c0 = (sp.c_start < ch->end) ? sp.c_start : ch->end;
        texts[i] = malloc(echo + (ch->end - c0) + 1);
        thoughts[i] = (sp.r_end > sp.r_start) ? strndup(ch->text + sp.r_start,
                                                        sp.r_end - sp.r_start) : NULL;
        ok = (texts[i] != NULL) && ((sp.r_end <= sp.r_start) || (thoughts[i] != NULL));
        if (ok) {
            memcpy(texts[i], (echo > 0) ? ch->echo : "", echo);
            memcpy(texts[i] + echo, ch->text != NULL ? ch->text + c0 : "", ch->end - c0);
            texts[i][echo + (ch->end - c0)] = '\0';
            kvf_proxy_piece(ch, kvf_proxy_choice_tokens(ch), texts[i], true, &outs[i]);
            outs[i].reasoning = thoughts[i];
            outs[i].text_offset = (int)echo;
        }
    }
    if (ok) {
        int num = kvf_proxy_best_of(c, outs, &u);
        json = kvf_proxy_openai_response(api, &c->req, &c->choices[0].flow.out, outs, num, &u);
    }
    for (int i = 0; (texts != NULL) && (i < c->num_choices); ++i) {
        free(texts[i]);
        free((thoughts != NULL) ? thoughts[i] : NULL);
    }
    free(texts);
    free(thoughts);
    free(outs);
    cc->cmpl = NULL;
    c->code = (json != NULL) ? 200 : 500;
    {
        char xrid[sizeof(c->xrid)];
        snprintf(xrid, sizeof(xrid), "%s", c->xrid);
        kvf_proxy_cmpl_free(c);
        return kvf_proxy_cmpl_respond(conn, xrid, json);
    }
}

/* Every choice's first token is in: hand the completion to an SSE response. */
static enum MHD_Result kvf_proxy_cmpl_stream(struct MHD_Connection *conn, kvf_proxy_conn_t *cc)
{
    kvf_proxy_cmpl_t *c = cc->cmpl;
    struct MHD_Response *resp;
    enum MHD_Result ret;

    resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, kvf_proxy_sse_reader, c,
                                             kvf_proxy_sse_free);
    if (resp == NULL) {
        kvf_proxy_flow_t *f = &c->choices[0].flow;
        c->failed = 0;
        f->http_code = 500;
        f->error_type = "server_error";
        snprintf(f->error, sizeof(f->error), "out of memory");
        return kvf_proxy_cmpl_fail(conn, cc);
    }
    cc->cmpl = NULL;   /* the response owns it now */
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    if (c->xrid[0] != '\0') {
        MHD_add_response_header(resp, "X-Request-Id", c->xrid);
    }
    ret = MHD_queue_response(conn, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp);   /* c is freed by kvf_proxy_sse_free */
    return ret;
}

/* x-request-id: 1..64 printable ASCII bytes without spaces or quotes, else ignored. */
static void kvf_proxy_x_request_id(struct MHD_Connection *conn, kvf_proxy_cmpl_t *c)
{
    const char *x = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-Request-Id");
    size_t n = (x != NULL) ? strlen(x) : 0;

    if ((n == 0) || (n > 64)) {
        return;
    }
    for (size_t i = 0; i < n; ++i) {
        if ((x[i] <= ' ') || (x[i] > '~') || (x[i] == '"') || (x[i] == '\\')) {
            return;
        }
    }
    snprintf(c->xrid, sizeof(c->xrid), "%s", x);
}

/* Parse the body and begin the flows; NULL after answering (the answer in *ret_p). */
static kvf_proxy_cmpl_t *kvf_proxy_cmpl_new(struct kvf_proxy_http *http,
                                            struct MHD_Connection *conn, kvf_proxy_conn_t *cc,
                                            bool chat, enum MHD_Result *ret_p)
{
    const kvf_proxy_flow_ctx_t *fctx = http->params.flow;
    const kvf_proxy_openai_ctx_t *api = http->params.api;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    kvf_proxy_cmpl_t *c;
    const char *param = NULL;
    char err[512];
    int code = 400;
    kvf_status_t st;

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
    c->failed = -1;
    c->wait.edge = http->edge;
    c->wait.conn = conn;
    c->wait.fd = (ci != NULL) ? ci->connect_fd : -1;
    kvf_proxy_x_request_id(conn, c);
    st = chat ? kvf_proxy_openai_parse_chat(api, (cc->body != NULL) ? cc->body : "", cc->len,
                                            &c->req, &code, &param, err, sizeof(err)) :
                kvf_proxy_openai_parse(api, (cc->body != NULL) ? cc->body : "", cc->len,
                                       &c->req, &code, &param, err, sizeof(err));
    if (st != KVF_OK) {
        free(c);
        atomic_fetch_sub(&http->inflight, 1);
        kvf_proxy_metrics_request(fctx->metrics, code);
        *ret_p = kvf_proxy_respond_error(conn, code, "invalid_request_error", param, err);
        return NULL;
    }
    if ((c->xrid[0] != '\0') && (c->req.response_id[0] == '\0')) {
        snprintf(c->req.response_id, sizeof(c->req.response_id), "%s-%s",
                 chat ? "chatcmpl" : "cmpl", c->xrid);
    }
    c->num_choices = c->req.num_prompts * kvf_proxy_req_per_prompt(&c->req);
    c->choices = calloc((size_t)c->num_choices, sizeof(*c->choices));
    cc->cmpl = c;
    if (c->choices == NULL) {
        c->num_choices = 0;
        cc->cmpl = NULL;
        c->code = 500;
        kvf_proxy_cmpl_free(c);
        *ret_p = kvf_proxy_respond_error(conn, 500, "server_error", NULL, "out of memory");
        return NULL;
    }
    for (int i = 0; i < c->num_choices; ++i) {
        kvf_proxy_choice_t *ch = &c->choices[i];

        if (kvf_proxy_choice_init(ch, api, &c->req, i) != KVF_OK) {
            ch->flow.http_code = 500;
            ch->flow.error_type = "server_error";
            snprintf(ch->flow.error, sizeof(ch->flow.error), "out of memory");
            c->failed = i;
            *ret_p = kvf_proxy_cmpl_fail(conn, cc);
            return NULL;
        }
        ch->begun = true;
        if (kvf_proxy_flow_begin(&ch->flow, fctx, &ch->sub, kvf_proxy_client_gone, c,
                                 kvf_proxy_edge_notify, &c->wait) != KVF_OK) {
            c->failed = i;
            *ret_p = kvf_proxy_cmpl_fail(conn, cc);
            return NULL;
        }
    }
    return c;
}

static enum MHD_Result kvf_proxy_cmpl_handle(struct kvf_proxy_http *http,
                                             struct MHD_Connection *conn, kvf_proxy_conn_t *cc,
                                             bool chat)
{
    kvf_proxy_cmpl_t *c = cc->cmpl;
    enum MHD_Result ret = MHD_NO;

    if ((c == NULL) && ((c = kvf_proxy_cmpl_new(http, conn, cc, chat, &ret)) == NULL)) {
        return ret;
    }
    for (;;) {
        kvf_proxy_pump_t p;

        if (kvf_proxy_all_over(c)) {
            if (c->req.stream) {
                return kvf_proxy_cmpl_stream(conn, cc);
            }
            return kvf_proxy_cmpl_answer(conn, cc);
        }
        if (c->req.stream && kvf_proxy_all_started(c)) {
            return kvf_proxy_cmpl_stream(conn, cc);
        }
        p = kvf_proxy_pump(c);
        if (p == KVF_PROXY_PUMP_WAIT) {
            if (kvf_proxy_edge_suspend(http->edge, &c->wait, kvf_proxy_wake(c))) {
                return MHD_YES;   /* resumed: the library calls the handler again */
            }
            continue;
        }
        if (p == KVF_PROXY_PUMP_FAILED) {
            return kvf_proxy_cmpl_fail(conn, cc);
        }
    }
}

enum MHD_Result kvf_proxy_completions(struct kvf_proxy_http *http, struct MHD_Connection *conn,
                                      kvf_proxy_conn_t *cc)
{
    return kvf_proxy_cmpl_handle(http, conn, cc, false);
}

enum MHD_Result kvf_proxy_chat_completions(struct kvf_proxy_http *http,
                                           struct MHD_Connection *conn, kvf_proxy_conn_t *cc)
{
    return kvf_proxy_cmpl_handle(http, conn, cc, true);
}
