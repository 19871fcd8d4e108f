/*
 * One completion request: prefill, then decode, then relay (see the header
 * for the sequence). Nothing here waits: each step reads the replies the
 * pool's I/O thread has put in the calls' mailboxes (kvf_proxy_call_next()
 * with a zero timeout) and checks the current wait's deadline; the HTTP
 * edge steps a flow when a call's notify fires or its deadline passes, and
 * holds no thread for it in between.
 *
 * Each step also asks whether the client is still there, so a client that
 * hangs up is noticed at the next reply or deadline check (the edge checks
 * the sockets of waiting requests every 100 ms) even while prefill is still
 * running, and both instances are told to abort. Rejected: letting requests
 * of departed clients run to the end (they hold prefill leases and decode
 * pages for nothing).
 */
#include "kvf_proxy_flow.h"
#include "kvf_proxy_sampling.h"
#include "kvf_proxy_route.h"
#include "kvf_time.h"
#include "kvf_log.h"
#include "kvf_array.h"
#include "kvf_proxy_export.h"
#include "kvf_proxy_vllm.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

/* In the first health round, a request without a healthy instance looks again this often. */
#define KVF_PROXY_WARMUP_POLL_MS 20
#define KVF_PROXY_QUEUE_POLL_MS 100

int64_t kvf_proxy_now_us(void)
{
    return (int64_t)(kvf_time_now_ns() / 1000u);
}

static void kvf_proxy_flow_new_id(char *id, size_t cap)
{
    static atomic_uint_fast64_t counter;
    uint64_t r[2] = {0, 0};

    if (getrandom(r, sizeof(r), GRND_NONBLOCK) != (ssize_t)sizeof(r)) {
        r[0] = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
        r[1] = (uint64_t)kvf_proxy_now_us();
    }
    r[1] ^= atomic_fetch_add(&counter, 1);
    snprintf(id, cap, "cmpl-%016llx%08llx", (unsigned long long)r[0],
             (unsigned long long)(r[1] & 0xffffffffull));
}

static kvf_status_t kvf_proxy_flow_fail(kvf_proxy_flow_t *flow, kvf_status_t status, int http,
                                        const char *type, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static kvf_status_t kvf_proxy_flow_fail(kvf_proxy_flow_t *flow, kvf_status_t status, int http,
                                        const char *type, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(flow->error, sizeof(flow->error), fmt, ap);
    va_end(ap);
    flow->http_code = http;
    flow->error_type = type;
    kvf_log((http >= 500) ? KVF_LOG_WARN : KVF_LOG_INFO, KVF_SUB_ALL, "request %s: %s",
            flow->out.id, flow->error);
    return status;
}

static kvf_status_t kvf_proxy_flow_append(kvf_proxy_flow_t *flow, const int32_t *ids, size_t n)
{
    if (KVF_ARRAY_GROW(flow->out.tokens, flow->cap_tokens, (size_t)flow->out.num_tokens + n, 64) !=
        KVF_OK) {
        return KVF_ERR_NO_MEMORY;
    }
    memcpy(flow->out.tokens + flow->out.num_tokens, ids, n * sizeof(*ids));
    flow->out.num_tokens += (int)n;
    return KVF_OK;
}

static kvf_status_t kvf_proxy_flow_client_gone(kvf_proxy_flow_t *flow, const char *what)
{
    flow->client_gone = true;
    kvf_proxy_metrics_add(flow->ctx->metrics, KVF_PROXY_CTR_CLIENT_ABORTS, 1);
    return kvf_proxy_flow_fail(flow, KVF_ERR_CANCELED, 499, "client_closed_request",
                               "client disconnected while waiting for %s", what);
}

/* End of the current wait: min(start + stage timeout, request deadline); *flag_p names it. */
static int64_t kvf_proxy_flow_wait_end(const kvf_proxy_flow_t *flow, const char **flag_p,
                                       int64_t *flag_ms_p)
{
    const kvf_proxy_flow_ctx_t *ctx = flow->ctx;
    bool prefill = (flow->stage == KVF_PROXY_FLOW_PREFILL);
    int64_t ms = prefill ? ctx->prefill_timeout_ms : ctx->token_timeout_ms;
    int64_t end = flow->wait_start_us + ms * 1000;

    if (flow->stage == KVF_PROXY_FLOW_WAIT_POOL) {
        end = flow->admit.queued ? flow->deadline_us : ctx->warmup_until_us;
        ms = 0;
    }
    if (flag_p != NULL) {
        *flag_p = prefill ? "--prefill-timeout" : "--token-timeout";
        *flag_ms_p = ms;
    }
    if (end > flow->deadline_us) {
        end = flow->deadline_us;
        if (flag_p != NULL) {
            *flag_p = "--request-timeout";
            *flag_ms_p = ctx->request_timeout_ms;
        }
    }
    return end;
}

/*
 * The next reply of @a call if one came (KVF_OK), KVF_PROXY_FLOW_PENDING when none
 * did and the wait's deadline is ahead; else the failure (timeout, lost
 * instance, client gone, shutdown).
 */
static kvf_status_t kvf_proxy_flow_poll(kvf_proxy_flow_t *flow, kvf_proxy_call_h call,
                                        const char *what, Kvf__ServeReply **reply_p)
{
    const kvf_proxy_flow_ctx_t *ctx = flow->ctx;
    const char *flag;
    int64_t flag_ms, end = kvf_proxy_flow_wait_end(flow, &flag, &flag_ms);
    kvf_status_t status;
    char msg[384];

    /* Also asked while replies keep coming: a poll() per reply is cheap and a
     * departed client should not keep a decode instance busy until the end. */
    if ((flow->gone != NULL) && flow->gone(flow->gone_arg)) {
        return kvf_proxy_flow_client_gone(flow, what);
    }
    if (atomic_load(&ctx->cancel)) {
        return kvf_proxy_flow_fail(flow, KVF_ERR_CANCELED, 503, "server_error",
                                   "the proxy is shutting down: the request did not finish"
                                   " within --drain-timeout %lld ms",
                                   (long long)ctx->drain_timeout_ms);
    }
    status = kvf_proxy_call_next(call, 0, reply_p, msg, sizeof(msg));
    if (status == KVF_OK) {
        return KVF_OK;
    }
    if (status != KVF_ERR_PEER_TIMEOUT) {
        kvf_proxy_metrics_add(ctx->metrics, KVF_PROXY_CTR_PEER_ERRORS, 1);
        return kvf_proxy_flow_fail(flow, status, 502, "upstream_error", "%s", msg);
    }
    if (kvf_proxy_now_us() >= end) {
        kvf_proxy_metrics_add(ctx->metrics, KVF_PROXY_CTR_TIMEOUTS, 1);
        return kvf_proxy_flow_fail(flow, KVF_ERR_PEER_TIMEOUT, 504, "timeout_error",
                                   "%s did not answer within %lld ms (%s %lld ms)", what,
                                   (long long)((end - flow->wait_start_us) / 1000), flag,
                                   (long long)flag_ms);
    }
    return KVF_PROXY_FLOW_PENDING;
}

/* A reply with a non-zero status: the daemon's own message, mapped to HTTP. */
static kvf_status_t kvf_proxy_flow_daemon_error(kvf_proxy_flow_t *flow, kvf_proxy_role_t role,
                                                int idx, const Kvf__ServeReply *r)
{
    kvf_status_t status = (kvf_status_t)r->status;
    const char *url = kvf_proxy_pool_url(flow->ctx->pool, role, idx);
    const char *msg = ((r->error != NULL) && (r->error[0] != '\0')) ? r->error :
                      kvf_status_str(status);
    int http = 502;
    const char *type = "upstream_error";

    switch (status) {
    case KVF_ERR_INVALID_PARAM:
    case KVF_ERR_OUT_OF_RANGE:
        http = 400;
        type = "invalid_request_error";
        break;
    case KVF_ERR_NO_RESOURCE:
    case KVF_ERR_BUSY:
        http = 503;
        type = "server_error";
        flow->retry_after_s = 1;   /* its queue is full or it is draining */
        kvf_proxy_metrics_reject(flow->ctx->metrics, KVF_PROXY_REJECT_INSTANCE_BUSY);
        break;
    default:
        break;
    }
    if (status == KVF_ERR_REFUSED) {
        kvf_proxy_metrics_add(flow->ctx->metrics, KVF_PROXY_CTR_HANDSHAKE_REFUSALS, 1);
    } else if (KVF_IS_PEER_ERROR(status)) {
        kvf_proxy_metrics_add(flow->ctx->metrics, KVF_PROXY_CTR_PEER_ERRORS, 1);
    }
    return kvf_proxy_flow_fail(flow, (status < 0) ? status : KVF_ERR_IO, http, type,
                               "%s instance %s failed: %s (status %d, %s)",
                               kvf_proxy_role_name(role), url, msg, (int)status,
                               kvf_status_str(status));
}

/* A fresh random seed for a request that names none (as OpenAI samples). */
static uint64_t kvf_proxy_flow_random_seed(void)
{
    static atomic_uint_fast64_t counter;
    uint64_t seed;

    if (getrandom(&seed, sizeof(seed), GRND_NONBLOCK) != (ssize_t)sizeof(seed)) {
        seed = (uint64_t)kvf_proxy_now_us() * 0x9e3779b97f4a7c15ull;
    }
    return seed ^ atomic_fetch_add(&counter, 1);
}

/* Prefill and decode get the same seed: decode continues prefill's draws. */
static void kvf_proxy_flow_sampling(const kvf_proxy_completion_req_t *req, Kvf__SamplingParams *sp)
{
    sp->has_max_tokens = true;
    sp->max_tokens = req->max_tokens;
    sp->has_temperature = true;
    sp->temperature = req->temperature;
    sp->has_seed = true;
    sp->seed = req->has_seed ? req->seed : kvf_proxy_flow_random_seed();
    sp->has_ignore_eos = true;
    sp->ignore_eos = req->ignore_eos;
    /* vLLM's fields (checked by the parser; the daemons check them again) */
    sp->has_top_p = (req->top_p < 1.0f);
    sp->top_p = req->top_p;
    sp->has_top_k = (req->top_k > 0);
    sp->top_k = req->top_k;
    sp->has_min_p = (req->min_p > 0.0f);
    sp->min_p = req->min_p;
    sp->has_presence_penalty = (req->presence_penalty != 0.0f);
    sp->presence_penalty = req->presence_penalty;
    sp->has_frequency_penalty = (req->frequency_penalty != 0.0f);
    sp->frequency_penalty = req->frequency_penalty;
    sp->has_repetition_penalty = (req->repetition_penalty != 1.0f);
    sp->repetition_penalty = req->repetition_penalty;
    sp->has_min_tokens = (req->min_tokens > 0);
    sp->min_tokens = req->min_tokens;
    sp->n_stop_token_ids = (size_t)req->num_stop_ids;
    sp->stop_token_ids = (int32_t *)req->stop_token_ids;
    sp->has_logprobs = req->want_logprobs;
    sp->logprobs = (uint32_t)req->logprobs;
    kvf_proxy_lists_to_msg(req, sp);
}

/* A reply's logprobs (SamplingParams.logprobs) appended to the completion's. */
static kvf_status_t kvf_proxy_flow_logprobs(kvf_proxy_flow_t *flow, const Kvf__ServeReply *r)
{
    kvf_proxy_completion_t *o = &flow->out;
    size_t n = r->n_token_logprobs, per = r->top_per_token;
    int need = o->num_logprobs + (int)n;

    if (!flow->req->want_logprobs || (n == 0)) {
        return KVF_OK;
    }
    if ((per != (size_t)flow->req->logprobs) || (r->n_top_ids != n * per) ||
        (r->n_top_logprobs != n * per)) {
        return KVF_ERR_PARSE;   /* not what was asked: never shown */
    }
    if (need > o->cap_logprobs) {
        int cap = (need > 2 * o->cap_logprobs) ? need : 2 * o->cap_logprobs;
        float *a = realloc(o->token_logprobs, (size_t)cap * sizeof(float));
        int32_t *b = (a != NULL) ? realloc(o->top_ids, (size_t)cap * (per + 1) *
                                                         sizeof(int32_t)) : NULL;
        float *c = (b != NULL) ? realloc(o->top_logprobs, (size_t)cap * (per + 1) *
                                                          sizeof(float)) : NULL;
        if (a != NULL) {
            o->token_logprobs = a;
        }
        if (b != NULL) {
            o->top_ids = b;
        }
        if (c == NULL) {
            return KVF_ERR_NO_MEMORY;
        }
        o->top_logprobs = c;
        o->cap_logprobs = cap;
    }
    memcpy(o->token_logprobs + o->num_logprobs, r->token_logprobs, n * sizeof(float));
    memcpy(o->top_ids + (size_t)o->num_logprobs * per, r->top_ids, n * per * sizeof(int32_t));
    memcpy(o->top_logprobs + (size_t)o->num_logprobs * per, r->top_logprobs,
           n * per * sizeof(float));
    o->num_logprobs = need;
    return KVF_OK;
}

/* Every instance was heard from, or found down: the first health round is over. */
static bool kvf_proxy_flow_pool_settled(const kvf_proxy_flow_ctx_t *ctx)
{
    int64_t down_ms = 2 * ctx->health_interval_ms;
    bool late;

    down_ms = (down_ms < 250) ? 250 : down_ms;   /* a local connect takes milliseconds */
    late = (kvf_proxy_now_us() - ctx->started_us) / 1000 >= down_ms;
    for (int role = 0; role < KVF_PROXY_ROLE_COUNT; ++role) {
        for (int i = 0; i < kvf_proxy_pool_count(ctx->pool, (kvf_proxy_role_t)role); ++i) {
            kvf_proxy_instance_info_t info;

            kvf_proxy_pool_info(ctx->pool, (kvf_proxy_role_t)role, i, &info);
            if (!info.answered && (info.probes_failed == 0) && (info.connected || !late)) {
                return false;
            }
        }
    }
    return true;
}

/* The decode slot picked with the request, given back when its decode call will not be sent. */
static void kvf_proxy_flow_unreserve(kvf_proxy_flow_t *flow)
{
    if (flow->decode_reserved) {
        kvf_proxy_pool_unreserve(flow->ctx->pool, flow->decode_idx);
        flow->decode_reserved = false;
    }
}

/* Out of the admission queue (admitted, failed, or its client left). */
static void kvf_proxy_flow_unqueue(kvf_proxy_flow_t *flow)
{
    if (flow->admit.queued) {
        kvf_proxy_admit_remove(flow->ctx->admit, &flow->admit);   /* wakes the next */
        kvf_proxy_vllm_waiting(-1);
    }
}

/*
 * Every instance is at its bound: queue (KVF_PROXY_FLOW_PENDING) while the
 * predicted wait behind the queue is inside the budget's headroom and the
 * queue's bytes bound allows; else turn @a rt into the fast 503 it should be.
 */
static kvf_status_t kvf_proxy_flow_queue(kvf_proxy_flow_t *flow,
                                         const kvf_proxy_route_req_t *rq, kvf_proxy_route_t *rt)
{
    const kvf_proxy_flow_ctx_t *ctx = flow->ctx;
    double budget = (double)rq->budget_ms * KVF_PROXY_ADMIT_HEADROOM, wait;
    kvf_proxy_admit_stats_t st;

    if (flow->admit.queued) {
        return KVF_PROXY_FLOW_PENDING;   /* the head, still full: the next freed slot wakes it */
    }
    st = kvf_proxy_admit_stats(ctx->admit);
    wait = kvf_proxy_route_queue_wait_ms(ctx->pool, rq->num_tokens, st.tokens);
    if (wait > budget) {
        rt->reason = KVF_PROXY_REJECT_PREDICTED_WAIT;
        rt->retry_after_s = kvf_proxy_route_retry_after_s(wait, budget);
        snprintf(rt->why, sizeof(rt->why), "overloaded: every instance is at its "
                 "--max-outstanding bound and %u requests (%llu prompt tokens) wait in the "
                 "proxy; this request's first token would take about %.1f s, over the %.1f s "
                 "it may wait; retry after %d s", st.count,
                 (unsigned long long)st.tokens, wait / 1000.0,
                 budget / 1000.0, rt->retry_after_s);
        return KVF_ERR_NO_RESOURCE;
    }
    if (!kvf_proxy_admit_enqueue(ctx->admit, &flow->admit, (uint64_t)rq->num_tokens,
                                 flow->req->priority, flow->notify, flow->notify_arg)) {
        rt->retry_after_s = 1;
        snprintf(rt->why, sizeof(rt->why), "overloaded: every instance is at its "
                 "--max-outstanding bound and the proxy's queue holds %llu prompt tokens, "
                 "the most --admission-queue-bytes %llu allows; retry later",
                 (unsigned long long)kvf_proxy_admit_stats(ctx->admit).tokens,
                 (unsigned long long)kvf_proxy_admit_max_bytes(ctx->admit));
        return KVF_ERR_NO_RESOURCE;
    }
    flow->queued_us = kvf_proxy_now_us();
    kvf_proxy_vllm_waiting(+1);
    return KVF_PROXY_FLOW_PENDING;
}

/*
 * Pick the prefill and decode instances by load and decide admission
 * (kvf_proxy_route.h). KVF_PROXY_FLOW_PENDING: none is healthy yet in the proxy's
 * first health round (wait); else KVF_OK or the failure (a refusal is a 503
 * with Retry-After, counted by reason).
 */
static kvf_status_t kvf_proxy_flow_pick(kvf_proxy_flow_t *flow)
{
    const kvf_proxy_flow_ctx_t *ctx = flow->ctx;
    kvf_proxy_route_req_t rq;
    kvf_proxy_route_t rt;
    int64_t left_ms = (flow->deadline_us - kvf_proxy_now_us()) / 1000;
    kvf_status_t status;

    rq.num_tokens = flow->req->num_prompt;
    rq.tokens = flow->req->prompt_ids;   /* --routing prefix: its block chain */
    rq.salt = (flow->req->cache_salt_len > 0) ? (const uint8_t *)flow->req->cache_salt : NULL;
    rq.salt_len = (size_t)flow->req->cache_salt_len;
    rq.prefill_timeout_ms = ctx->prefill_timeout_ms;
    rq.budget_ms = (left_ms < ctx->prefill_timeout_ms) ? left_ms : ctx->prefill_timeout_ms;
    rq.queued_ms = flow->admit.queued ? (kvf_proxy_now_us() - flow->queued_us) / 1000 + 1 : 0;
    if (flow->admit.queued && !kvf_proxy_admit_is_head(ctx->admit, &flow->admit)) {
        return KVF_PROXY_FLOW_PENDING;   /* first come first served (by priority): the head */
    }
    if (!flow->admit.queued && (ctx->admit != NULL) && (kvf_proxy_admit_stats(ctx->admit).count > 0)) {
        /* others wait already: behind them, not ahead (first come first served) */
        memset(&rt, 0, sizeof(rt));
        rt.prefill_idx = rt.decode_idx = -1;
        rt.http = 503;
        rt.type = "server_error";
        rt.reason = KVF_PROXY_REJECT_QUEUE_FULL;
        status = kvf_proxy_flow_queue(flow, &rq, &rt);
        if (status == KVF_PROXY_FLOW_PENDING) {
            kvf_proxy_admit_kick(ctx->admit);   /* a slot may be free with the head asleep */
            return status;
        }
        flow->retry_after_s = rt.retry_after_s;
        kvf_proxy_metrics_reject(ctx->metrics, rt.reason);
        return kvf_proxy_flow_fail(flow, status, rt.http, rt.type, "%s", rt.why);
    }
    status = kvf_proxy_route_pick(ctx->pool, &rq, &rt);
    flow->prefill_idx = rt.prefill_idx;
    flow->decode_idx = rt.decode_idx;
    flow->decode_reserved = (status == KVF_OK) && (rt.decode_idx >= 0);
    if ((status == KVF_OK) || (rt.reason != KVF_PROXY_REJECT_QUEUE_FULL) ||
        (rt.http != 503)) {
        kvf_proxy_flow_unqueue(flow);   /* admitted, or failed another way: the next tries */
    }
    if (status == KVF_OK) {
        return KVF_OK;
    }
    if ((rt.http == 503) && (rt.reason == KVF_PROXY_REJECT_QUEUE_FULL) && (ctx->admit != NULL)) {
        status = kvf_proxy_flow_queue(flow, &rq, &rt);
        if (status == KVF_PROXY_FLOW_PENDING) {
            return status;
        }
    }
    if ((rt.reason == KVF_PROXY_REJECT_NO_INSTANCE) && (kvf_proxy_now_us() < ctx->warmup_until_us) &&
        !kvf_proxy_flow_pool_settled(ctx)) {
        return KVF_PROXY_FLOW_PENDING;
    }
    if (rt.http == 503) {
        flow->retry_after_s = rt.retry_after_s;
        kvf_proxy_metrics_reject(ctx->metrics, rt.reason);
    }
    return kvf_proxy_flow_fail(flow, status, rt.http, rt.type, "%s", rt.why);
}

/* Instances picked: send the PrefillRequest (prompt in, first token and transfer params out). */
static kvf_status_t kvf_proxy_flow_send_prefill(kvf_proxy_flow_t *flow)
{
    const kvf_proxy_flow_ctx_t *ctx = flow->ctx;
    Kvf__PrefillRequest preq = KVF__PREFILL_REQUEST__INIT;
    Kvf__ServeRequest sreq = KVF__SERVE_REQUEST__INIT;
    kvf_status_t status;

    flow->out.prefill_instance = kvf_proxy_pool_url(ctx->pool, KVF_PROXY_ROLE_PREFILL,
                                                    flow->prefill_idx);
    flow->out.decode_instance = kvf_proxy_pool_url(ctx->pool, KVF_PROXY_ROLE_DECODE,
                                                   flow->decode_idx);
    preq.request_id = flow->out.id;
    preq.n_prompt_tokens = (size_t)flow->req->num_prompt;
    preq.prompt_tokens = flow->req->prompt_ids;
    preq.sampling = &flow->sampling;
    if (flow->req->cache_salt_len > 0) {
        preq.has_cache_salt = 1;
        preq.cache_salt.data = (uint8_t *)flow->req->cache_salt;
        preq.cache_salt.len = (size_t)flow->req->cache_salt_len;
    }
    sreq.body_case = KVF__SERVE_REQUEST__BODY_PREFILL;
    sreq.prefill = &preq;
    status = kvf_proxy_call_start(ctx->pool, KVF_PROXY_ROLE_PREFILL, flow->prefill_idx,
                                  flow->out.id, &sreq, &flow->prefill_call);
    flow->prefill_sent_us = kvf_proxy_now_us();
    if (status != KVF_OK) {
        return kvf_proxy_flow_fail(flow, status, 500, "server_error",
                                   "failed to queue the prefill request: %s",
                                   kvf_status_str(status));
    }
    kvf_proxy_metrics_add(ctx->metrics, KVF_PROXY_CTR_PROMPT_TOKENS,
                          (uint64_t)flow->req->num_prompt);
    flow->stage = KVF_PROXY_FLOW_PREFILL;
    flow->wait_start_us = flow->prefill_sent_us;
    kvf_proxy_call_set_notify(flow->prefill_call, flow->notify, flow->notify_arg);
    return KVF_OK;
}

kvf_status_t kvf_proxy_flow_begin(kvf_proxy_flow_t *flow, const kvf_proxy_flow_ctx_t *ctx,
                                  const kvf_proxy_completion_req_t *req,
                                  kvf_proxy_gone_func_t gone, void *gone_arg,
                                  kvf_proxy_call_notify_t notify, void *notify_arg)
{
    kvf_status_t status;

    memset(flow, 0, sizeof(*flow));
    flow->ctx = ctx;
    flow->req = req;
    flow->prefill_idx = -1;
    flow->decode_idx = -1;
    flow->gone = gone;
    flow->gone_arg = gone_arg;
    flow->notify = notify;
    flow->notify_arg = notify_arg;
    flow->t0_us = kvf_proxy_now_us();
    flow->deadline_us = flow->t0_us + ctx->request_timeout_ms * 1000;
    flow->wait_start_us = flow->t0_us;
    flow->out.created = (int64_t)time(NULL);
    kvf_proxy_flow_new_id(flow->out.id, sizeof(flow->out.id));
    {
        Kvf__SamplingParams sp = KVF__SAMPLING_PARAMS__INIT;
        flow->sampling = sp;
    }
    kvf_proxy_flow_sampling(req, &flow->sampling);
    kvf_proxy_metrics_in_flight(ctx->metrics, +1);
    flow->stage = KVF_PROXY_FLOW_WAIT_POOL;
    status = kvf_proxy_flow_pick(flow);
    if ((status == KVF_PROXY_FLOW_PENDING) && flow->admit.queued) {
        kvf_debug("request %s: every instance at its bound, queued in the proxy (%u waiting)",
                  flow->out.id, kvf_proxy_admit_stats(ctx->admit).count);
        return KVF_OK;
    }
    if (status == KVF_PROXY_FLOW_PENDING) {
        kvf_info("request %s: no healthy instance yet, waiting for the first health round",
                 flow->out.id);
        return KVF_OK;
    }
    if (status != KVF_OK) {
        flow->stage = KVF_PROXY_FLOW_OVER;
        return status;
    }
    status = kvf_proxy_flow_send_prefill(flow);
    if (status != KVF_OK) {
        flow->stage = KVF_PROXY_FLOW_OVER;
    }
    return status;
}

/* Prefill answered: keep the first token, send the DecodeRequest (pull the state, continue). */
static kvf_status_t kvf_proxy_flow_on_prefill(kvf_proxy_flow_t *flow, const Kvf__ServeReply *r)
{
    const kvf_proxy_flow_ctx_t *ctx = flow->ctx;
    Kvf__DecodeRequest dreq = KVF__DECODE_REQUEST__INIT;
    Kvf__ServeRequest sreq = KVF__SERVE_REQUEST__INIT;
    kvf_status_t status;

    if (r->has_status && (r->status != 0)) {
        return kvf_proxy_flow_daemon_error(flow, KVF_PROXY_ROLE_PREFILL, flow->prefill_idx, r);
    }
    if ((r->params == NULL) || !r->params->has_first_token) {
        return kvf_proxy_flow_fail(flow, KVF_ERR_PARSE, 502, "upstream_error",
                                   "prefill instance %s answered without transfer params",
                                   flow->out.prefill_instance);
    }
    status = kvf_proxy_flow_append(flow, &r->params->first_token, 1);
    if (status == KVF_OK) {
        status = kvf_proxy_flow_logprobs(flow, r);
    }
    if ((status == KVF_OK) && flow->req->want_prompt_logprobs) {
        status = kvf_proxy_prompt_lp_take(&flow->out, flow->req->num_prompt,
                                          flow->req->prompt_logprobs, r);
        if (status == KVF_ERR_PARSE) {
            return kvf_proxy_flow_fail(flow, status, 502, "upstream_error", "prefill instance "
                                       "%s sent malformed prompt logprobs",
                                       flow->out.prefill_instance);
        }
    }
    if (status != KVF_OK) {
        return kvf_proxy_flow_fail(flow, status, 500, "server_error", "out of memory");
    }
    flow->last_token_us = kvf_proxy_now_us();
    flow->out.ttft_ms = (double)(flow->last_token_us - flow->t0_us) / 1000.0;
    flow->out.prefill_ms = r->has_prefill_ms ? r->prefill_ms : 0.0;
    if ((r->timing != NULL) && r->timing->has_total_ms) {
        flow->has_prefill_timing = true;
        flow->prefill_total_ms = r->timing->total_ms;
        flow->prefill_queue_ms = r->timing->queue_ms;
        flow->prefill_compute_ms = r->timing->compute_ms;
        flow->cached_tokens = r->timing->has_cached_tokens ? r->timing->cached_tokens : 0;
    }
    kvf_proxy_metrics_observe(ctx->metrics, KVF_PROXY_HIST_TTFT, flow->out.ttft_ms / 1000.0, 1);
    if (r->has_prefill_ms) {
        kvf_proxy_metrics_observe(ctx->metrics, KVF_PROXY_HIST_PREFILL, r->prefill_ms / 1000.0, 1);
    }
    if (!kvf_proxy_route_usable(ctx->pool, KVF_PROXY_ROLE_DECODE, flow->decode_idx)) {
        /* the decode picked died or began draining during prefill: another one */
        char why[320] = "";
        int was = flow->decode_idx;

        kvf_proxy_flow_unreserve(flow);
        if (kvf_proxy_pool_pick_decode(ctx->pool, flow->prefill_idx, flow->req->num_prompt,
                                       &flow->decode_idx, why, sizeof(why)) != KVF_OK) {
            flow->retry_after_s = 1;
            kvf_proxy_metrics_reject(ctx->metrics, KVF_PROXY_REJECT_NO_INSTANCE);
            return kvf_proxy_flow_fail(flow, KVF_ERR_NO_RESOURCE, 503, "server_error",
                                       "decode instance %s went away during prefill and no"
                                       " other can take the request%s%s",
                                       flow->out.decode_instance, why[0] ? ": " : "", why);
        }
        flow->decode_reserved = true;
        flow->out.decode_instance = kvf_proxy_pool_url(ctx->pool, KVF_PROXY_ROLE_DECODE,
                                                       flow->decode_idx);
        kvf_proxy_metrics_add(ctx->metrics, KVF_PROXY_CTR_DECODE_REROUTES, 1);
        kvf_info("request %s: decode %s is no longer routable; sent to %s instead",
                 flow->out.id, kvf_proxy_pool_url(ctx->pool, KVF_PROXY_ROLE_DECODE, was),
                 flow->out.decode_instance);
    }
    dreq.request_id = flow->out.id;
    dreq.n_prompt_tokens = (size_t)flow->req->num_prompt;
    dreq.prompt_tokens = flow->req->prompt_ids;
    dreq.sampling = &flow->sampling;
    dreq.params = r->params;
    dreq.has_stream = true;
    dreq.stream = true;     /* the proxy relays per step; it also times tokens */
    if (flow->req->cache_salt_len > 0) {   /* decode keeps its own prefix cache */
        dreq.has_cache_salt = 1;
        dreq.cache_salt.data = (uint8_t *)flow->req->cache_salt;
        dreq.cache_salt.len = (size_t)flow->req->cache_salt_len;
    }
    sreq.body_case = KVF__SERVE_REQUEST__BODY_DECODE;
    sreq.decode = &dreq;
    status = kvf_proxy_call_start(ctx->pool, KVF_PROXY_ROLE_DECODE, flow->decode_idx,
                                  flow->out.id, &sreq, &flow->decode_call);
    if (flow->decode_call != NULL) {
        flow->decode_reserved = false;   /* the call's load took the reservation over */
    }
    flow->decode_sent_us = kvf_proxy_now_us();
    if (status != KVF_OK) {
        return kvf_proxy_flow_fail(flow, status, 500, "server_error",
                                   "failed to queue the decode request: %s",
                                   kvf_status_str(status));
    }
    flow->stage = KVF_PROXY_FLOW_DECODE;
    flow->wait_start_us = flow->decode_sent_us;
    kvf_proxy_call_set_notify(flow->decode_call, flow->notify, flow->notify_arg);
    return KVF_OK;
}

/*
 * The first decode reply carries decode's ServeTiming: split the time to it
 * into phases (kvf_proxy_ttft_phase_t). The proxy's own legs minus each daemon's
 * total are the relays (sockets, the pool's I/O thread); what no clock
 * covered is "unaccounted", so the phases add up to the measured time.
 */
static void kvf_proxy_flow_breakdown(kvf_proxy_flow_t *flow, const Kvf__ServeTiming *dt,
                                     int64_t now_us)
{
    kvf_proxy_ttft_breakdown_t *bd = &flow->out.ttft_breakdown;
    double *ph = bd->phase_ms, sum = 0;

    if (!flow->has_prefill_timing || (dt == NULL) || !dt->has_total_ms || bd->valid) {
        return;
    }
    bd->valid = true;
    bd->ttft_ms = flow->out.ttft_ms;
    bd->first_decode_ms = (double)(now_us - flow->t0_us) / 1000.0;
    ph[KVF_PROXY_TTFT_PHASE_PROXY_QUEUE] = (double)(flow->prefill_sent_us - flow->t0_us) / 1000.0;
    ph[KVF_PROXY_TTFT_PHASE_PREFILL_QUEUE] = flow->prefill_queue_ms;
    ph[KVF_PROXY_TTFT_PHASE_PREFILL_COMPUTE] = flow->prefill_compute_ms;
    ph[KVF_PROXY_TTFT_PHASE_PREFILL_RELAY] =
        (double)(flow->prefill_recv_us - flow->prefill_sent_us) / 1000.0 - flow->prefill_total_ms;
    ph[KVF_PROXY_TTFT_PHASE_PROXY_DISPATCH] =
        (double)(flow->decode_sent_us - flow->prefill_recv_us) / 1000.0;
    ph[KVF_PROXY_TTFT_PHASE_DECODE_QUEUE] = dt->queue_ms;
    ph[KVF_PROXY_TTFT_PHASE_BLOCK_ALLOC] = dt->alloc_ms;
    ph[KVF_PROXY_TTFT_PHASE_HANDSHAKE] = dt->handshake_ms;
    ph[KVF_PROXY_TTFT_PHASE_POSTING] = dt->posting_ms;
    ph[KVF_PROXY_TTFT_PHASE_WIRE] = dt->wire_ms;
    ph[KVF_PROXY_TTFT_PHASE_POST_OPS] = dt->post_ops_ms;
    ph[KVF_PROXY_TTFT_PHASE_FIRST_STEP] = dt->first_step_ms;
    ph[KVF_PROXY_TTFT_PHASE_DECODE_RELAY] =
        (double)(now_us - flow->decode_sent_us) / 1000.0 - dt->total_ms;
    for (int i = 0; i < KVF_PROXY_TTFT_PHASE_UNACCOUNTED; ++i) {
        sum += ph[i];
    }
    ph[KVF_PROXY_TTFT_PHASE_UNACCOUNTED] = bd->first_decode_ms - sum;
    kvf_proxy_metrics_observe(flow->ctx->metrics, KVF_PROXY_HIST_FIRST_DECODE,
                              bd->first_decode_ms / 1000.0, 1);
    for (int i = 0; i < KVF_PROXY_TTFT_PHASE_COUNT; ++i) {
        kvf_proxy_metrics_observe_phase(flow->ctx->metrics, (kvf_proxy_ttft_phase_t)i,
                                        ph[i] / 1000.0);
    }
}

/* A decode reply: its tokens, stats and end. */
static kvf_status_t kvf_proxy_flow_on_decode(kvf_proxy_flow_t *flow, const Kvf__ServeReply *r)
{
    const kvf_proxy_flow_ctx_t *ctx = flow->ctx;
    kvf_status_t status;
    int64_t now;

    if (r->has_status && (r->status != 0)) {
        return kvf_proxy_flow_daemon_error(flow, KVF_PROXY_ROLE_DECODE, flow->decode_idx, r);
    }
    kvf_proxy_flow_breakdown(flow, r->timing, kvf_proxy_now_us());
    if (r->n_tokens > 0) {
        status = kvf_proxy_flow_append(flow, r->tokens, r->n_tokens);
        if (status == KVF_OK) {
            status = kvf_proxy_flow_logprobs(flow, r);
        }
        if (status != KVF_OK) {
            return kvf_proxy_flow_fail(flow, status, 500, "server_error", "out of memory");
        }
        now = kvf_proxy_now_us();
        kvf_proxy_metrics_observe(ctx->metrics, KVF_PROXY_HIST_ITL,
                                  (double)(now - flow->last_token_us) / 1e6 / (double)r->n_tokens,
                                  r->n_tokens);
        kvf_proxy_vllm_token_gap((double)(now - flow->last_token_us) / 1e6 /
                                 (double)r->n_tokens, r->n_tokens);
        flow->last_token_us = now;
    }
    if (r->stats != NULL) {
        kvf_proxy_kv_stats_t *kv = &flow->out.kv;
        kv->valid = true;
        kv->bytes = r->stats->bytes;
        kv->descriptors = r->stats->descriptors;
        kv->reads = r->stats->reads;
        kv->handshake_ms = r->stats->handshake_ms;
        kv->transfer_ms = r->stats->transfer_ms;
        kv->recomputed = r->stats->recomputed;
        kv->has_tokens = r->stats->has_decode_cached_tokens && r->stats->has_pulled_tokens;
        kv->decode_cached_tokens = r->stats->decode_cached_tokens;
        kv->pulled_tokens = r->stats->pulled_tokens;
    }
    if (r->has_done && r->done) {
        flow->done = true;
        flow->stage = KVF_PROXY_FLOW_OVER;
        snprintf(flow->out.finish_reason, sizeof(flow->out.finish_reason), "%s",
                 ((r->finish_reason != NULL) && (r->finish_reason[0] != '\0')) ?
                 r->finish_reason : "length");
    }
    return KVF_OK;
}

/* Waiting for the first health round: pick again. */
static kvf_status_t kvf_proxy_flow_step_pool(kvf_proxy_flow_t *flow)
{
    kvf_status_t status;

    if ((flow->gone != NULL) && flow->gone(flow->gone_arg)) {
        return kvf_proxy_flow_client_gone(flow, "a healthy instance");
    }
    if (atomic_load(&flow->ctx->cancel)) {
        return kvf_proxy_flow_fail(flow, KVF_ERR_CANCELED, 503, "server_error",
                                   "the proxy is shutting down");
    }
    status = kvf_proxy_flow_pick(flow);
    if ((status == KVF_PROXY_FLOW_PENDING) && flow->admit.queued &&
        (kvf_proxy_now_us() >= flow->deadline_us)) {
        kvf_proxy_flow_unqueue(flow);
        flow->retry_after_s = 1;
        kvf_proxy_metrics_reject(flow->ctx->metrics, KVF_PROXY_REJECT_QUEUE_FULL);
        return kvf_proxy_flow_fail(flow, KVF_ERR_NO_RESOURCE, 503, "server_error",
                                   "overloaded: queued %lld ms in the proxy and no instance "
                                   "freed a slot within --request-timeout %lld ms",
                                   (long long)((kvf_proxy_now_us() - flow->queued_us) / 1000),
                                   (long long)flow->ctx->request_timeout_ms);
    }
    if (status == KVF_PROXY_FLOW_PENDING) {
        return (kvf_proxy_now_us() < flow->deadline_us) ? KVF_PROXY_FLOW_PENDING :
               kvf_proxy_flow_fail(flow, KVF_ERR_PEER_TIMEOUT, 504, "timeout_error",
                                   "no healthy instance within --request-timeout %lld ms",
                                   (long long)flow->ctx->request_timeout_ms);
    }
    return (status == KVF_OK) ? kvf_proxy_flow_send_prefill(flow) : status;
}

kvf_status_t kvf_proxy_flow_step(kvf_proxy_flow_t *flow, int *first_new_p)
{
    Kvf__ServeReply *r = NULL;
    kvf_status_t status;
    char what[KVF_PROXY_URL_MAX + 32];
    bool prefill = (flow->stage == KVF_PROXY_FLOW_PREFILL);

    *first_new_p = flow->out.num_tokens;
    if (flow->stage == KVF_PROXY_FLOW_OVER) {
        return flow->done ? KVF_OK : KVF_ERR_INVALID_PARAM;
    }
    if (flow->stage == KVF_PROXY_FLOW_WAIT_POOL) {
        status = kvf_proxy_flow_step_pool(flow);
        goto out;
    }
    snprintf(what, sizeof(what), "%s instance %s", prefill ? "prefill" : "decode",
             prefill ? flow->out.prefill_instance : flow->out.decode_instance);
    status = kvf_proxy_flow_poll(flow, prefill ? flow->prefill_call : flow->decode_call, what,
                                 &r);
    if (status != KVF_OK) {
        goto out;
    }
    if (prefill) {
        flow->prefill_recv_us = kvf_proxy_now_us();
        kvf_proxy_call_end(flow->prefill_call);   /* prefill answers once */
        flow->prefill_call = NULL;
        kvf_proxy_admit_kick(flow->ctx->admit);    /* a prefill slot freed */
        status = kvf_proxy_flow_on_prefill(flow, r);
    } else {
        flow->wait_start_us = kvf_proxy_now_us();   /* the token timeout is per reply */
        status = kvf_proxy_flow_on_decode(flow, r);
    }
    kvf__serve_reply__free_unpacked(r, NULL);
out:
    if ((status != KVF_OK) && (status != KVF_PROXY_FLOW_PENDING)) {
        flow->stage = KVF_PROXY_FLOW_OVER;
    }
    return status;
}

int64_t kvf_proxy_flow_wake_us(const kvf_proxy_flow_t *flow)
{
    int64_t end = kvf_proxy_flow_wait_end(flow, NULL, NULL);

    if (flow->stage == KVF_PROXY_FLOW_WAIT_POOL) {
        /* queued: woken by kvf_proxy_admit_kick(); the poll only catches a pool that
         * changed without a request ending (an instance back, a drain) */
        int64_t poll = kvf_proxy_now_us() + (flow->admit.queued ? KVF_PROXY_QUEUE_POLL_MS :
                                             KVF_PROXY_WARMUP_POLL_MS) * 1000;
        end = (poll < end) ? poll : end;
    }
    return end;
}

static void kvf_proxy_flow_abort(kvf_proxy_flow_t *flow, kvf_proxy_role_t role, int idx)
{
    Kvf__AbortRequest abort_req = KVF__ABORT_REQUEST__INIT;
    Kvf__ServeRequest sreq = KVF__SERVE_REQUEST__INIT;

    abort_req.request_id = flow->out.id;
    sreq.body_case = KVF__SERVE_REQUEST__BODY_ABORT;
    sreq.abort = &abort_req;
    kvf_debug("request %s: abort on %s instance %s", flow->out.id, kvf_proxy_role_name(role),
              kvf_proxy_pool_url(flow->ctx->pool, role, idx));
    if (kvf_proxy_pool_send(flow->ctx->pool, role, idx, &sreq) != KVF_OK) {
        kvf_warn("request %s: could not queue the abort", flow->out.id);
    }
}

/* The finished request as vLLM's series count it (kvf_proxy_vllm.h). */
static void kvf_proxy_flow_vllm(const kvf_proxy_flow_t *flow)
{
    const kvf_proxy_ttft_breakdown_t *bd = &flow->out.ttft_breakdown;
    const kvf_proxy_kv_stats_t *kv = &flow->out.kv;
    kvf_proxy_vllm_req_t v = {
        .admitted = (flow->prefill_sent_us != 0),
        .first_token = (flow->out.ttft_ms > 0),
        .finished_reason = flow->done ? flow->out.finish_reason : "abort",
        .ttft_s = flow->out.ttft_ms / 1000.0,
        .e2e_s = (double)(kvf_proxy_now_us() - flow->t0_us) / 1e6,
        .queue_s = -1.0,
        .prefill_s = flow->has_prefill_timing ? flow->prefill_compute_ms / 1000.0 :
                     ((flow->out.prefill_ms > 0) ? flow->out.prefill_ms / 1000.0 : -1.0),
        .prompt_tokens = (uint32_t)flow->req->num_prompt,
        .cached_tokens = flow->has_prefill_timing ? flow->cached_tokens : 0,
        .generation_tokens = (uint32_t)flow->out.num_tokens,
        .max_tokens = flow->req->max_tokens,
        .transfer = kv->valid,
        .transfer_failed = kv->recomputed,
        .transfer_s = kv->transfer_ms / 1000.0,
        .post_s = bd->valid ? bd->phase_ms[KVF_PROXY_TTFT_PHASE_POSTING] / 1000.0 : -1.0,
        .transfer_bytes = kv->bytes,
        .transfer_descriptors = kv->descriptors,
    };

    if (bd->valid) {
        v.queue_s = (bd->phase_ms[KVF_PROXY_TTFT_PHASE_PROXY_QUEUE] +
                     bd->phase_ms[KVF_PROXY_TTFT_PHASE_PREFILL_QUEUE] +
                     bd->phase_ms[KVF_PROXY_TTFT_PHASE_DECODE_QUEUE]) / 1000.0;
    } else if (v.admitted) {
        v.queue_s = ((double)(flow->prefill_sent_us - flow->t0_us) / 1000.0 +
                     (flow->has_prefill_timing ? flow->prefill_queue_ms : 0.0)) / 1000.0;
    }
    kvf_proxy_vllm_request(&v);
}

void kvf_proxy_flow_finish(kvf_proxy_flow_t *flow)
{
    const kvf_proxy_flow_ctx_t *ctx = flow->ctx;
    const kvf_proxy_kv_stats_t *kv = &flow->out.kv;
    bool decode_sent = (flow->decode_call != NULL);

    kvf_proxy_call_end(flow->prefill_call);   /* no notify runs once the calls are ended */
    flow->prefill_call = NULL;
    kvf_proxy_call_end(flow->decode_call);
    flow->decode_call = NULL;
    kvf_proxy_flow_unreserve(flow);
    kvf_proxy_flow_unqueue(flow);
    kvf_proxy_admit_kick(ctx->admit);   /* its slots freed: the queue's head tries */
    if (!flow->done) {
        /* Release the blocks on both sides: the decode may be mid-transfer,
         * and the prefill lease may not have been released yet. */
        if (decode_sent) {
            kvf_proxy_flow_abort(flow, KVF_PROXY_ROLE_DECODE, flow->decode_idx);
        }
        if (flow->prefill_idx >= 0) {
            kvf_proxy_flow_abort(flow, KVF_PROXY_ROLE_PREFILL, flow->prefill_idx);
        }
    } else {
        kvf_proxy_metrics_observe(ctx->metrics, KVF_PROXY_HIST_E2E,
                                  (double)(kvf_proxy_now_us() - flow->t0_us) / 1e6, 1);
    }
    flow->stage = KVF_PROXY_FLOW_OVER;
    kvf_proxy_metrics_add(ctx->metrics, KVF_PROXY_CTR_GENERATION_TOKENS,
                          (uint64_t)flow->out.num_tokens);
    if (kv->valid) {
        kvf_proxy_metrics_add(ctx->metrics, KVF_PROXY_CTR_KV_BYTES, kv->bytes);
        kvf_proxy_metrics_add(ctx->metrics, KVF_PROXY_CTR_KV_DESCRIPTORS, kv->descriptors);
        kvf_proxy_metrics_add(ctx->metrics, KVF_PROXY_CTR_KV_READS, kv->reads);
        kvf_proxy_metrics_add(ctx->metrics, KVF_PROXY_CTR_KV_RECOMPUTED, kv->recomputed ? 1 : 0);
        kvf_proxy_export_transfer(kv->bytes, kv->recomputed);
        kvf_proxy_metrics_observe(ctx->metrics, KVF_PROXY_HIST_TRANSFER, kv->transfer_ms / 1000.0,
                                  1);
        if (kv->handshake_ms > 0) {
            kvf_proxy_metrics_observe(ctx->metrics, KVF_PROXY_HIST_HANDSHAKE,
                                      kv->handshake_ms / 1000.0, 1);
        }
    }
    kvf_proxy_flow_vllm(flow);
    kvf_proxy_metrics_in_flight(ctx->metrics, -1);
    free(flow->out.tokens);
    flow->out.tokens = NULL;
    flow->out.num_tokens = 0;
    kvf_proxy_prompt_lp_free(&flow->out);
    free(flow->out.token_logprobs);
    free(flow->out.top_ids);
    free(flow->out.top_logprobs);
    flow->out.token_logprobs = flow->out.top_logprobs = NULL;
    flow->out.top_ids = NULL;
    flow->out.num_logprobs = flow->out.cap_logprobs = 0;
}

void kvf_proxy_flow_stop(kvf_proxy_flow_t *flow, const char *reason)
{
    if (flow->stage == KVF_PROXY_FLOW_OVER) {
        return;
    }
    /* the instances stop at once: decode (and prefill's lease) are released */
    if (flow->decode_call != NULL) {
        kvf_proxy_call_end(flow->decode_call);
        flow->decode_call = NULL;
        kvf_proxy_flow_abort(flow, KVF_PROXY_ROLE_DECODE, flow->decode_idx);
    }
    if (flow->prefill_idx >= 0) {
        kvf_proxy_flow_abort(flow, KVF_PROXY_ROLE_PREFILL, flow->prefill_idx);
    }
    kvf_proxy_flow_unreserve(flow);
    flow->done = true;
    flow->stage = KVF_PROXY_FLOW_OVER;
    snprintf(flow->out.finish_reason, sizeof(flow->out.finish_reason), "%s", reason);
}
