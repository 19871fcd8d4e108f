/*
 * One completion request: prefill, then decode, then relay (see the header
 * for the sequence). The flow runs on the HTTP connection's thread and
 * blocks there; the pool's I/O thread delivers replies into its mailboxes.
 *
 * Waits are cut into 100 ms slices when the caller can tell whether the
 * client is still there, so a client that hangs up is noticed within a
 * slice even while prefill is still running, and both instances are told to
 * abort. Rejected: letting requests of departed clients run to the end
 * (they hold prefill leases and decode pages for nothing).
 */
#include "kvf_proxy_flow.h"
#include "kvf_time.h"
#include "kvf_log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#define KVF_PROXY_SLICE_MS 100

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
    if ((size_t)flow->out.num_tokens + n > (size_t)flow->cap_tokens) {
        size_t cap = (size_t)flow->cap_tokens * 2 + n + 16;
        int32_t *t = realloc(flow->out.tokens, cap * sizeof(*t));
        if (t == NULL) {
            return KVF_ERR_NO_MEMORY;
        }
        flow->out.tokens = t;
        flow->cap_tokens = (int)cap;
    }
    memcpy(flow->out.tokens + flow->out.num_tokens, ids, n * sizeof(*ids));
    flow->out.num_tokens += (int)n;
    return KVF_OK;
}

/* Wait for a reply within min(stage timeout, request deadline), watching the client. */
static kvf_status_t kvf_proxy_flow_wait(kvf_proxy_flow_t *flow, kvf_proxy_call_h call,
                                        int64_t stage_timeout_ms, const char *stage_flag,
                                        const char *what, Kvf__ServeReply **reply_p)
{
    const kvf_proxy_flow_ctx_t *ctx = flow->ctx;
    int64_t start = kvf_proxy_now_us();
    int64_t end = start + stage_timeout_ms * 1000;
    const char *flag = stage_flag;
    int64_t flag_ms = stage_timeout_ms;
    char msg[384];

    if (end > flow->deadline_us) {
        end = flow->deadline_us;
        flag = "--request-timeout";
        flag_ms = ctx->request_timeout_ms;
    }
    /* Also checked while replies keep coming: a poll() per reply is cheap and a
     * departed client should not keep a decode instance busy until the end. */
    if ((flow->gone != NULL) && flow->gone(flow->gone_arg)) {
        flow->client_gone = true;
        kvf_proxy_metrics_add(ctx->metrics, KVF_PROXY_CTR_CLIENT_ABORTS, 1);
        return kvf_proxy_flow_fail(flow, KVF_ERR_CANCELED, 499, "client_closed_request",
                                   "client disconnected while waiting for %s", what);
    }
    for (;;) {
        int64_t left_ms = (end - kvf_proxy_now_us()) / 1000;
        int64_t slice = left_ms;
        kvf_status_t status;

        if (left_ms <= 0) {
            kvf_proxy_metrics_add(ctx->metrics, KVF_PROXY_CTR_TIMEOUTS, 1);
            return kvf_proxy_flow_fail(flow, KVF_ERR_PEER_TIMEOUT, 504, "timeout_error",
                                       "%s did not answer within %lld ms (%s %lld ms)", what,
                                       (long long)((end - start) / 1000), flag,
                                       (long long)flag_ms);
        }
        if ((flow->gone != NULL) && (slice > KVF_PROXY_SLICE_MS)) {
            slice = KVF_PROXY_SLICE_MS;
        }
        if (atomic_load(&ctx->cancel)) {
            return kvf_proxy_flow_fail(flow, KVF_ERR_CANCELED, 503, "server_error",
                                       "the proxy is shutting down: the request did not finish"
                                       " within --drain-timeout %lld ms",
                                       (long long)ctx->drain_timeout_ms);
        }
        status = kvf_proxy_call_next(call, slice, reply_p, msg, sizeof(msg));
        if (status == KVF_OK) {
            return KVF_OK;
        }
        if (status != KVF_ERR_PEER_TIMEOUT) {
            kvf_proxy_metrics_add(ctx->metrics, KVF_PROXY_CTR_PEER_ERRORS, 1);
            return kvf_proxy_flow_fail(flow, status, 502, "upstream_error", "%s", msg);
        }
        if ((flow->gone != NULL) && flow->gone(flow->gone_arg)) {
            flow->client_gone = true;
            kvf_proxy_metrics_add(ctx->metrics, KVF_PROXY_CTR_CLIENT_ABORTS, 1);
            return kvf_proxy_flow_fail(flow, KVF_ERR_CANCELED, 499, "client_closed_request",
                                       "client disconnected while waiting for %s", what);
        }
    }
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
}

kvf_status_t kvf_proxy_flow_start(kvf_proxy_flow_t *flow, const kvf_proxy_flow_ctx_t *ctx,
                                  const kvf_proxy_completion_req_t *req,
                                  kvf_proxy_gone_func_t gone, void *gone_arg)
{
    Kvf__SamplingParams sp = KVF__SAMPLING_PARAMS__INIT;
    Kvf__PrefillRequest preq = KVF__PREFILL_REQUEST__INIT;
    Kvf__DecodeRequest dreq = KVF__DECODE_REQUEST__INIT;
    Kvf__ServeRequest sreq = KVF__SERVE_REQUEST__INIT;
    Kvf__ServeReply *r = NULL;
    kvf_proxy_call_h pcall = NULL;
    kvf_status_t status;
    char what[KVF_PROXY_URL_MAX + 32];

    memset(flow, 0, sizeof(*flow));
    flow->ctx = ctx;
    flow->req = req;
    flow->prefill_idx = -1;
    flow->decode_idx = -1;
    flow->gone = gone;
    flow->gone_arg = gone_arg;
    flow->t0_us = kvf_proxy_now_us();
    flow->deadline_us = flow->t0_us + ctx->request_timeout_ms * 1000;
    flow->out.created = (int64_t)time(NULL);
    kvf_proxy_flow_new_id(flow->out.id, sizeof(flow->out.id));
    kvf_proxy_metrics_in_flight(ctx->metrics, +1);

    if (kvf_proxy_pool_pick(ctx->pool, KVF_PROXY_ROLE_PREFILL, &flow->prefill_idx) != KVF_OK) {
        flow->prefill_idx = -1;   /* nothing was sent to it */
        return kvf_proxy_flow_fail(flow, KVF_ERR_NO_RESOURCE, 503, "server_error",
                                   "no healthy prefill instance (or every one is draining,"
                                   " or none a decode instance accepts: see /health)");
    }
    {
        char why[320] = "";
        kvf_proxy_instance_info_t pi;

        /* what the prefill instance can never do: say so now, not after a timeout */
        kvf_proxy_pool_info(ctx->pool, KVF_PROXY_ROLE_PREFILL, flow->prefill_idx, &pi);
        if ((pi.max_prompt_tokens != 0) && ((uint32_t)req->num_prompt > pi.max_prompt_tokens)) {
            flow->prefill_idx = -1;
            return kvf_proxy_flow_fail(flow, KVF_ERR_OUT_OF_RANGE, 400, "invalid_request_error",
                                       "prompt of %d tokens does not fit prefill instance %s's"
                                       " KV cache (at most %u tokens; raise --num-blocks on"
                                       " prefill)", req->num_prompt, pi.url,
                                       pi.max_prompt_tokens);
        }
        if ((pi.prefill_tokens_per_s > 0) &&
            ((double)req->num_prompt / pi.prefill_tokens_per_s * 1000.0 >
             (double)ctx->prefill_timeout_ms)) {
            flow->prefill_idx = -1;
            return kvf_proxy_flow_fail(flow, KVF_ERR_OUT_OF_RANGE, 400, "invalid_request_error",
                                       "prompt of %d tokens would take about %.0f s to prefill"
                                       " at prefill instance %s's measured %.0f tokens/s, longer"
                                       " than --prefill-timeout %lld ms", req->num_prompt,
                                       (double)req->num_prompt / pi.prefill_tokens_per_s,
                                       pi.url, pi.prefill_tokens_per_s,
                                       (long long)ctx->prefill_timeout_ms);
        }
        status = kvf_proxy_pool_pick_decode(ctx->pool, flow->prefill_idx, req->num_prompt,
                                            &flow->decode_idx, why, sizeof(why));
        if (status != KVF_OK) {
            int p = flow->prefill_idx;
            flow->prefill_idx = -1;
            flow->decode_idx = -1;
            if (status == KVF_ERR_OUT_OF_RANGE) {
                return kvf_proxy_flow_fail(flow, status, 400, "invalid_request_error",
                                           "prompt of %d tokens does not fit any decode"
                                           " instance: %s", req->num_prompt, why);
            }
            if (status == KVF_ERR_REFUSED) {
                return kvf_proxy_flow_fail(flow, status, 503, "server_error",
                                           "no decode instance accepts prefill instance %s: %s",
                                           kvf_proxy_pool_url(ctx->pool, KVF_PROXY_ROLE_PREFILL,
                                                              p), why);
            }
            return kvf_proxy_flow_fail(flow, KVF_ERR_NO_RESOURCE, 503, "server_error",
                                       "no healthy decode instance (or every one is"
                                       " draining: see /health)");
        }
    }
    flow->out.prefill_instance = kvf_proxy_pool_url(ctx->pool, KVF_PROXY_ROLE_PREFILL,
                                                    flow->prefill_idx);
    flow->out.decode_instance = kvf_proxy_pool_url(ctx->pool, KVF_PROXY_ROLE_DECODE,
                                                   flow->decode_idx);

    /* Prefill: prompt in, first token and transfer params out. */
    kvf_proxy_flow_sampling(req, &sp);
    preq.request_id = flow->out.id;
    preq.n_prompt_tokens = (size_t)req->num_prompt;
    preq.prompt_tokens = req->prompt_ids;
    preq.sampling = &sp;
    sreq.body_case = KVF__SERVE_REQUEST__BODY_PREFILL;
    sreq.prefill = &preq;
    status = kvf_proxy_call_start(ctx->pool, KVF_PROXY_ROLE_PREFILL, flow->prefill_idx,
                                  flow->out.id, &sreq, &pcall);
    flow->prefill_sent_us = kvf_proxy_now_us();
    if (status != KVF_OK) {
        return kvf_proxy_flow_fail(flow, status, 500, "server_error",
                                   "failed to queue the prefill request: %s",
                                   kvf_status_str(status));
    }
    kvf_proxy_metrics_add(ctx->metrics, KVF_PROXY_CTR_PROMPT_TOKENS, (uint64_t)req->num_prompt);
    snprintf(what, sizeof(what), "prefill instance %s", flow->out.prefill_instance);
    status = kvf_proxy_flow_wait(flow, pcall, ctx->prefill_timeout_ms, "--prefill-timeout", what,
                                 &r);
    flow->prefill_recv_us = kvf_proxy_now_us();
    kvf_proxy_call_end(pcall);
    if (status != KVF_OK) {
        return status;
    }
    if (r->has_status && (r->status != 0)) {
        status = kvf_proxy_flow_daemon_error(flow, KVF_PROXY_ROLE_PREFILL, flow->prefill_idx, r);
        goto out_free_reply;
    }
    if ((r->params == NULL) || !r->params->has_first_token) {
        status = kvf_proxy_flow_fail(flow, KVF_ERR_PARSE, 502, "upstream_error",
                                     "prefill instance %s answered without transfer params",
                                     flow->out.prefill_instance);
        goto out_free_reply;
    }
    status = kvf_proxy_flow_append(flow, &r->params->first_token, 1);
    if (status != KVF_OK) {
        kvf_proxy_flow_fail(flow, status, 500, "server_error", "out of memory");
        goto out_free_reply;
    }
    flow->last_token_us = kvf_proxy_now_us();
    flow->out.ttft_ms = (double)(flow->last_token_us - flow->t0_us) / 1000.0;
    flow->out.prefill_ms = r->has_prefill_ms ? r->prefill_ms : 0.0;
    if ((r->timing != NULL) && r->timing->has_total_ms) {
        flow->has_prefill_timing = true;
        flow->prefill_total_ms = r->timing->total_ms;
        flow->prefill_queue_ms = r->timing->queue_ms;
        flow->prefill_compute_ms = r->timing->compute_ms;
    }
    kvf_proxy_metrics_observe(ctx->metrics, KVF_PROXY_HIST_TTFT, flow->out.ttft_ms / 1000.0, 1);
    if (r->has_prefill_ms) {
        kvf_proxy_metrics_observe(ctx->metrics, KVF_PROXY_HIST_PREFILL, r->prefill_ms / 1000.0, 1);
    }

    /* Decode: pull the state, continue after the first token. */
    dreq.request_id = flow->out.id;
    dreq.n_prompt_tokens = (size_t)req->num_prompt;
    dreq.prompt_tokens = req->prompt_ids;
    dreq.sampling = &sp;
    dreq.params = r->params;
    dreq.has_stream = true;
    dreq.stream = true;     /* the proxy relays per step; it also times tokens */
    sreq.body_case = KVF__SERVE_REQUEST__BODY_DECODE;
    sreq.decode = &dreq;
    status = kvf_proxy_call_start(ctx->pool, KVF_PROXY_ROLE_DECODE, flow->decode_idx,
                                  flow->out.id, &sreq, &flow->decode_call);
    flow->decode_sent_us = kvf_proxy_now_us();
    if (status != KVF_OK) {
        kvf_proxy_flow_fail(flow, status, 500, "server_error",
                            "failed to queue the decode request: %s", kvf_status_str(status));
    }
out_free_reply:
    kvf__serve_reply__free_unpacked(r, NULL);
    return status;
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

kvf_status_t kvf_proxy_flow_next(kvf_proxy_flow_t *flow, int *first_new_p)
{
    const kvf_proxy_flow_ctx_t *ctx = flow->ctx;
    Kvf__ServeReply *r = NULL;
    kvf_status_t status;
    char what[KVF_PROXY_URL_MAX + 32];
    int64_t now;

    *first_new_p = flow->out.num_tokens;
    if (flow->done) {
        return KVF_OK;
    }
    if (flow->decode_call == NULL) {
        return kvf_proxy_flow_fail(flow, KVF_ERR_INVALID_PARAM, 500, "server_error",
                                   "decode was not started");
    }
    snprintf(what, sizeof(what), "decode instance %s", flow->out.decode_instance);
    status = kvf_proxy_flow_wait(flow, flow->decode_call, ctx->token_timeout_ms, "--token-timeout",
                                 what, &r);
    if (status != KVF_OK) {
        return status;
    }
    if (r->has_status && (r->status != 0)) {
        status = kvf_proxy_flow_daemon_error(flow, KVF_PROXY_ROLE_DECODE, flow->decode_idx, r);
        goto out;
    }
    kvf_proxy_flow_breakdown(flow, r->timing, kvf_proxy_now_us());
    if (r->n_tokens > 0) {
        status = kvf_proxy_flow_append(flow, r->tokens, r->n_tokens);
        if (status != KVF_OK) {
            kvf_proxy_flow_fail(flow, status, 500, "server_error", "out of memory");
            goto out;
        }
        now = kvf_proxy_now_us();
        kvf_proxy_metrics_observe(ctx->metrics, KVF_PROXY_HIST_ITL,
                                  (double)(now - flow->last_token_us) / 1e6 / (double)r->n_tokens,
                                  r->n_tokens);
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
    }
    if (r->has_done && r->done) {
        flow->done = true;
        snprintf(flow->out.finish_reason, sizeof(flow->out.finish_reason), "%s",
                 ((r->finish_reason != NULL) && (r->finish_reason[0] != '\0')) ?
                 r->finish_reason : "length");
    }
out:
    kvf__serve_reply__free_unpacked(r, NULL);
    return status;
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

void kvf_proxy_flow_finish(kvf_proxy_flow_t *flow)
{
    const kvf_proxy_flow_ctx_t *ctx = flow->ctx;
    const kvf_proxy_kv_stats_t *kv = &flow->out.kv;

    if (!flow->done) {
        /* Release the blocks on both sides: the decode may be mid-transfer,
         * and the prefill lease may not have been released yet. */
        if (flow->decode_call != NULL) {
            kvf_proxy_flow_abort(flow, KVF_PROXY_ROLE_DECODE, flow->decode_idx);
        }
        if (flow->prefill_idx >= 0) {
            kvf_proxy_flow_abort(flow, KVF_PROXY_ROLE_PREFILL, flow->prefill_idx);
        }
    } else {
        kvf_proxy_metrics_observe(ctx->metrics, KVF_PROXY_HIST_E2E,
                                  (double)(kvf_proxy_now_us() - flow->t0_us) / 1e6, 1);
    }
    kvf_proxy_call_end(flow->decode_call);
    flow->decode_call = NULL;
    kvf_proxy_metrics_add(ctx->metrics, KVF_PROXY_CTR_GENERATION_TOKENS,
                          (uint64_t)flow->out.num_tokens);
    if (kv->valid) {
        kvf_proxy_metrics_add(ctx->metrics, KVF_PROXY_CTR_KV_BYTES, kv->bytes);
        kvf_proxy_metrics_add(ctx->metrics, KVF_PROXY_CTR_KV_DESCRIPTORS, kv->descriptors);
        kvf_proxy_metrics_add(ctx->metrics, KVF_PROXY_CTR_KV_READS, kv->reads);
        kvf_proxy_metrics_add(ctx->metrics, KVF_PROXY_CTR_KV_RECOMPUTED, kv->recomputed ? 1 : 0);
        kvf_proxy_metrics_observe(ctx->metrics, KVF_PROXY_HIST_TRANSFER, kv->transfer_ms / 1000.0,
                                  1);
        if (kv->handshake_ms > 0) {
            kvf_proxy_metrics_observe(ctx->metrics, KVF_PROXY_HIST_HANDSHAKE,
                                      kv->handshake_ms / 1000.0, 1);
        }
    }
    kvf_proxy_metrics_in_flight(ctx->metrics, -1);
    free(flow->out.tokens);
    flow->out.tokens = NULL;
    flow->out.num_tokens = 0;
}
