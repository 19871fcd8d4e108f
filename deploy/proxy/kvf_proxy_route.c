/*
 * kvf-proxy routing and admission (see kvf_proxy_route.h for the model).
 *
 * Design: the load the choice uses is kept by the pool itself, under its
 * lock: each prefill/decode call counts in its instance's outstanding load
 * from registration until its answer (kvf_proxy_mailbox.c), so a burst of
 * requests between two health probes sees the queue it builds, and the
 * daemon's reports add only what this proxy did not send (other proxies,
 * requests whose client left). Rejected: routing from the health replies
 * alone (up to a probe interval stale: a burst all goes to the instance
 * that looked idle) and round robin (blind to a stalled or slower instance).
 */
#include "kvf_proxy_route.h"
#include "kvf_proxy_pool_int.h"
#include "kvf_log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

double kvf_proxy_route_wait_ms(uint64_t queued_tokens, int num_tokens, double rate_tps)
{
    if (!(rate_tps > 0)) {
        return -1;
    }
    return ((double)queued_tokens + (double)(num_tokens > 0 ? num_tokens : 0)) / rate_tps * 1000.0;
}

double kvf_proxy_route_ewma(double prev, double sample, double alpha)
{
    if (!(prev > 0)) {
        return sample;
    }
    return prev + alpha * (sample - prev);
}

int kvf_proxy_route_retry_after_s(double wait_ms, double budget_ms)
{
    double over_s = (wait_ms - budget_ms) / 1000.0;
    int s;

    if (!(over_s > 1)) {
        return 1;                            /* also NaN */
    }
    if (over_s >= KVF_PROXY_RETRY_AFTER_MAX_S) {
        return KVF_PROXY_RETRY_AFTER_MAX_S;
    }
    s = (int)over_s;
    return ((double)s < over_s) ? s + 1 : s;   /* rounded up */
}

double kvf_proxy_route_rate(const kvf_proxy_instance_info_t *info)
{
    return (info->prefill_rate_recent > 0) ? info->prefill_rate_recent :
           info->prefill_tokens_per_s;
}

uint64_t kvf_proxy_route_queued(const kvf_proxy_instance_info_t *info)
{
    return info->outstanding_tokens + info->foreign_tokens;
}

/* Take the counters of @a h (at the proxy's @a now_ms) as the next sample's base. */
static void kvf_proxy_route_rate_base(kvf_proxy_instance_t *inst, const Kvf__HealthReply *h,
                                      int64_t now_ms)
{
    inst->rate_base = true;
    inst->rate_tokens = h->prefill_tokens_total;
    inst->rate_seconds = h->prefill_seconds_total;
    inst->rate_ms = now_ms;
    inst->rate_busy = (h->queued_prompt_tokens > 0);
}

/*
 * One rate sample: tokens per second of engine time; when the instance had
 * queued work at both ends of the interval, at most tokens per second of
 * wall time (what a queued prompt really waits: the engine's step time
 * leaves out the loop around it and a CPU shared with other processes).
 */
static double kvf_proxy_route_rate_sample(const kvf_proxy_instance_t *inst,
                                          const Kvf__HealthReply *h, int64_t now_ms)
{
    double dn = (double)(h->prefill_tokens_total - inst->rate_tokens);
    double busy = dn / (h->prefill_seconds_total - inst->rate_seconds);
    double wall_s = (double)(now_ms - inst->rate_ms) / 1000.0;

    if (inst->rate_busy && (h->queued_prompt_tokens > 0) && (wall_s > 0) && (dn / wall_s < busy)) {
        return dn / wall_s;
    }
    return busy;
}

void kvf_proxy_route_on_health_locked(kvf_proxy_instance_t *inst, const Kvf__HealthReply *h)
{
    kvf_proxy_instance_info_t *info = &inst->info;
    int64_t now_ms = (int64_t)kvf_time_now_ms();

    info->queued_prompt_tokens = h->queued_prompt_tokens;
    info->max_queue = h->max_queue;
    info->foreign_tokens = (h->queued_prompt_tokens > info->outstanding_tokens) ?
                           h->queued_prompt_tokens - info->outstanding_tokens : 0;
    if (!h->has_prefill_tokens_total || !h->has_prefill_seconds_total) {
        return;
    }
    if (!inst->rate_base || (h->prefill_tokens_total < inst->rate_tokens) ||
        (h->prefill_seconds_total < inst->rate_seconds)) {
        kvf_proxy_route_rate_base(inst, h, now_ms);   /* first reply, or counters went back */
        return;
    }
    if ((h->prefill_tokens_total - inst->rate_tokens < KVF_PROXY_RATE_MIN_TOKENS) ||
        !(h->prefill_seconds_total > inst->rate_seconds)) {
        inst->rate_busy = inst->rate_busy && (h->queued_prompt_tokens > 0);
        return;                                  /* too little work since: keep accumulating */
    }
    info->prefill_rate_recent = kvf_proxy_route_ewma(info->prefill_rate_recent,
                                                     kvf_proxy_route_rate_sample(inst, h, now_ms),
                                                     KVF_PROXY_RATE_ALPHA);
    kvf_proxy_route_rate_base(inst, h, now_ms);
}

void kvf_proxy_route_on_send_locked(kvf_proxy_instance_t *inst, struct kvf_proxy_call *c)
{
    c->load_start_ms = (int64_t)kvf_time_now_ms();
    c->load_predicted_ms = kvf_proxy_route_wait_ms(kvf_proxy_route_queued(&inst->info),
                                                   (int)c->load_tokens,
                                                   kvf_proxy_route_rate(&inst->info));
}

void kvf_proxy_route_on_answer_locked(kvf_proxy_instance_t *inst, const struct kvf_proxy_call *c)
{
    double actual = (double)((int64_t)kvf_time_now_ms() - c->load_start_ms), ratio;

    /* short waits are mostly relay and step granularity: they say little */
    if (c->load_predicted_ms < KVF_PROXY_CALIBRATE_MIN_MS) {
        return;
    }
    ratio = actual / c->load_predicted_ms;
    ratio = (ratio < KVF_PROXY_CALIBRATION_MIN) ? KVF_PROXY_CALIBRATION_MIN :
            (ratio > KVF_PROXY_CALIBRATION_MAX) ? KVF_PROXY_CALIBRATION_MAX : ratio;
    /* up fast, down slowly: it follows the longer waits, which are the 504s */
    inst->info.wait_calibration = kvf_proxy_route_ewma(
        inst->info.wait_calibration, ratio,
        (ratio > inst->info.wait_calibration) ? KVF_PROXY_CALIBRATION_UP : KVF_PROXY_CALIBRATION_DOWN);
}

double kvf_proxy_route_calibrated(const kvf_proxy_instance_info_t *info, double wait_ms)
{
    double k = (info->wait_calibration > 1.0) ? info->wait_calibration : 1.0;

    return (wait_ms < 0) ? wait_ms : wait_ms * k;
}

bool kvf_proxy_route_usable(kvf_proxy_pool_h pool, kvf_proxy_role_t role, int idx)
{
    bool ok;

    if ((idx < 0) || (idx >= pool->count[role])) {
        return false;
    }
    pthread_mutex_lock(&pool->lock);
    ok = kvf_proxy_routable(&pool->inst[role][idx].info);
    pthread_mutex_unlock(&pool->lock);
    return ok;
}

/* Prefill @a p has no routable decode partner that did not refuse it (pool->lock held). */
static bool kvf_proxy_prefill_refused_locked(struct kvf_proxy_pool *pool, int p)
{
    bool any_healthy = false;

    if (pool->pairs == NULL) {
        return false;
    }
    for (int d = 0; d < pool->count[KVF_PROXY_ROLE_DECODE]; ++d) {
        if (!kvf_proxy_routable(&pool->inst[KVF_PROXY_ROLE_DECODE][d].info)) {
            continue;
        }
        any_healthy = true;
        if (kvf_proxy_pair(pool, p, d)->state != KVF_PROXY_PAIR_REFUSED) {
            return false;
        }
    }
    return any_healthy;
}

/* At its bound: the proxy's own, and for prefill the daemon's queue bound. */
static bool kvf_proxy_route_full_locked(struct kvf_proxy_pool *pool,
                                        const kvf_proxy_instance_info_t *info,
                                        kvf_proxy_role_t role)
{
    if ((uint64_t)info->outstanding + info->reserved >= (uint64_t)pool->max_outstanding) {
        return true;
    }
    return (role == KVF_PROXY_ROLE_PREFILL) && (info->max_queue != 0) &&
           (info->outstanding >= info->max_queue);
}

/* Ordering key of prefill @a info for a prompt of @a n tokens, @a cached of them cached
 * there, each cached token worth @a weight tokens of work (--prefix-routing-weight): lower
 * is better; below 0 when the cache outweighs the queue. @a pool the measured instances'
 * mean rate and wait calibration. */
static double kvf_proxy_route_prefill_key(const kvf_proxy_instance_info_t *info, int n,
                                          int cached, double weight,
                                          const double pool[2])
{
    double work = (double)kvf_proxy_route_queued(info) + (double)n - weight * (double)cached;
    double rate = kvf_proxy_route_rate(info);

    if (rate > 0) {
        return kvf_proxy_route_calibrated(info, work / rate * 1000.0);
    }
    /* no rate yet: as fast as the measured ones on average, and as far off their
     * predictions (so a slow or loaded pool's idle new instance, never calibrated, does
     * not look faster than a measured one holding the prompt's prefix); none measured:
     * tokens as if one per millisecond (an idle one, or the one with the longer cached
     * prefix, wins) */
    return (pool[0] > 0) ? work / pool[0] * 1000.0 * pool[1] : work;
}

/* The mean rate (tokens/s; 0: none has one) and wait calibration (>= 1) of the routable
 * prefill instances that have a rate, into @a out. */
static void kvf_proxy_route_pool_rate_locked(struct kvf_proxy_pool *pool, double out[2])
{
    double sum = 0, cal = 0;
    int known = 0;

    for (int i = 0; i < pool->count[KVF_PROXY_ROLE_PREFILL]; ++i) {
        const kvf_proxy_instance_info_t *info = &pool->inst[KVF_PROXY_ROLE_PREFILL][i].info;
        double r = kvf_proxy_route_rate(info);
        if (kvf_proxy_routable(info) && (r > 0)) {
            sum += r;
            cal += (info->wait_calibration > 1.0) ? info->wait_calibration : 1.0;
            known++;
        }
    }
    out[0] = (known > 0) ? sum / known : 0;
    out[1] = (known > 0) ? cal / known : 1.0;
}

/*
 * Least-loaded routable prefill instance for @a n tokens (pool->lock held),
 * the load less what each caches of @a q's prompt (NULL: load alone; *cached_p
 * the pick's cached tokens).
 * @return its index, or -1 with *status_p: KVF_ERR_NO_RESOURCE (none
 * routable), KVF_ERR_BUSY (all at their bound), KVF_ERR_OUT_OF_RANGE (none
 * holds the prompt; *largest_p the largest that one holds).
 */
static int kvf_proxy_route_prefill_locked(struct kvf_proxy_pool *pool, int n,
                                          kvf_proxy_kvidx_query_t *q, int *cached_p,
                                          kvf_status_t *status_p, uint32_t *largest_p)
{
    kvf_proxy_role_t role = KVF_PROXY_ROLE_PREFILL;
    int count = pool->count[role], best = -1, best_cached = 0;
    bool routable = false, fits = false;
    double best_key = 0, pool_rate[2];

    kvf_proxy_route_pool_rate_locked(pool, pool_rate);
    *largest_p = 0;
    for (int k = 0; k < count; ++k) {
        int i = (int)((pool->rr[role] + (unsigned)k) % (unsigned)count);
        const kvf_proxy_instance_info_t *info = &pool->inst[role][i].info;
        double key;
        int cached;

        if (!kvf_proxy_routable(info) || kvf_proxy_prefill_refused_locked(pool, i)) {
            continue;
        }
        routable = true;
        if ((info->max_prompt_tokens != 0) && ((uint32_t)n > info->max_prompt_tokens)) {
            *largest_p = (info->max_prompt_tokens > *largest_p) ? info->max_prompt_tokens :
                         *largest_p;
            continue;
        }
        fits = true;
        if (kvf_proxy_route_full_locked(pool, info, role)) {
            continue;
        }
        cached = ((q != NULL) && (pool->kvidx[role] != NULL)) ?
                 kvf_proxy_kvidx_cached_tokens(pool->kvidx[role], i, q) : 0;
        key = kvf_proxy_route_prefill_key(info, n, cached, pool->prefix_weight, pool_rate);
        if ((best < 0) || (key < best_key)) {
            best = i;
            best_key = key;
            best_cached = cached;
        }
    }
    if (best >= 0) {
        pool->rr[role] = (unsigned)best + 1;
        if (best_cached > 0) {
            pool->inst[role][best].info.prefix_routed++;
            pool->inst[role][best].info.prefix_routed_tokens += (uint64_t)best_cached;
        }
    }
    if (cached_p != NULL) {
        *cached_p = best_cached;
    }
    *status_p = (best >= 0) ? KVF_OK : !routable ? KVF_ERR_NO_RESOURCE :
                !fits ? KVF_ERR_OUT_OF_RANGE : KVF_ERR_BUSY;
    return best;
}

kvf_status_t kvf_proxy_pool_pick(kvf_proxy_pool_h pool, kvf_proxy_role_t role, int *idx_p)
{
    kvf_status_t status;
    uint32_t largest;
    int i;

    if (role == KVF_PROXY_ROLE_DECODE) {
        status = kvf_proxy_pool_pick_decode(pool, -1, 1, idx_p, NULL, 0);
        if (status == KVF_OK) {
            kvf_proxy_pool_unreserve(pool, *idx_p);   /* a look, not a request */
        }
        return status;
    }
    pthread_mutex_lock(&pool->lock);
    i = kvf_proxy_route_prefill_locked(pool, 1, NULL, NULL, &status, &largest);
    pthread_mutex_unlock(&pool->lock);
    if (i >= 0) {
        *idx_p = i;
    }
    return (status == KVF_ERR_OUT_OF_RANGE) ? KVF_ERR_NO_RESOURCE : status;
}

/*
 * Decode's ordering key for a prompt of @a n tokens, @a cached of them in its prefix cache
 * by its KV events (0 under --routing load), in requests (lower is better): requests
 * outstanding from here (sent, or still in prefill with this decode picked) plus its
 * reported waiting line, plus the share of the prompt it would pull, @a weight
 * (--decode-prefix-routing-weight) for a whole prompt, plus one when its reported free
 * pages do not hold the blocks it would allocate (it waits for blocks as behind one
 * request). Design: one unit, a request of load, and a bounded prefix term: a held prefix
 * picks among decode instances within weight x cached/n requests of each other's load,
 * never against a longer queue (a popular system prompt must not pile every request on
 * the one decode holding it). Its own weight, not prefill's: the units differ, and a
 * decode step batches its requests, so a request of load costs less there than the pull
 * it saves (the default 4 measured: docs/PREFIX_CACHE.md §7). With nothing cached
 * anywhere this is the load order of before.
 */
static double kvf_proxy_route_decode_key(const kvf_proxy_instance_info_t *info, int n,
                                         int cached, double weight)
{
    double key = (double)info->outstanding + (double)info->reserved +
                 (double)info->queue_depth;
    uint64_t bs = (info->block_size > 0) ? info->block_size : 1;
    uint64_t need = ((uint64_t)(n - cached) + bs - 1) / bs * ((info->tp_size > 0) ?
                                                               info->tp_size : 1);

    key += (n > 0) ? weight * (double)(n - cached) / (double)n : 0;
    return key + (((info->total_pages > 0) && (info->free_pages < need)) ? 1.0 : 0.0);
}

void kvf_proxy_pool_unreserve(kvf_proxy_pool_h pool, int idx)
{
    if ((idx < 0) || (idx >= pool->count[KVF_PROXY_ROLE_DECODE])) {
        return;
    }
    pthread_mutex_lock(&pool->lock);
    kvf_proxy_instance_info_t *info = &pool->inst[KVF_PROXY_ROLE_DECODE][idx].info;
    info->reserved -= (info->reserved > 0) ? 1 : 0;
    pthread_mutex_unlock(&pool->lock);
}

/*
 * kvf_proxy_pool_pick_decode() weighing what each decode instance caches of @a q's prompt
 * (NULL: load alone); *cached_p the pick's cached tokens (counted in its prefix_routed).
 */
static kvf_status_t kvf_proxy_route_decode_pick(kvf_proxy_pool_h pool, int prefill_idx,
                                                int num_tokens, kvf_proxy_kvidx_query_t *q,
                                                int *cached_p, int *idx_p, char *why,
                                                size_t why_cap)
{
    kvf_proxy_role_t role = KVF_PROXY_ROLE_DECODE;
    int n = pool->count[role], pick = -1, pick_cached = 0;
    bool healthy = false, accepted = false, fits = false;
    uint32_t largest = 0;
    double best_key = 0;

    pthread_mutex_lock(&pool->lock);
    /* pass 0: pairs checked compatible; pass 1: pairs without a verdict yet */
    for (int pass = 0; (pass < 2) && (pick < 0); ++pass) {
        for (int k = 0; k < n; ++k) {
            int i = (int)((pool->rr[role] + (unsigned)k) % (unsigned)n);
            const kvf_proxy_instance_info_t *info = &pool->inst[role][i].info;
            kvf_proxy_pair_state_t st;

            if (!kvf_proxy_routable(info)) {
                continue;
            }
            healthy = true;
            st = ((pool->pairs != NULL) && (prefill_idx >= 0)) ?
                 kvf_proxy_pair(pool, prefill_idx, i)->state : KVF_PROXY_PAIR_COMPATIBLE;
            if (st == KVF_PROXY_PAIR_REFUSED) {
                if (why != NULL) {
                    snprintf(why, why_cap, "%s", kvf_proxy_pair(pool, prefill_idx, i)->error);
                }
                continue;
            }
            accepted = true;
            if ((info->max_prompt_tokens != 0) && ((uint32_t)num_tokens > info->max_prompt_tokens)) {
                largest = (info->max_prompt_tokens > largest) ? info->max_prompt_tokens : largest;
                continue;   /* its pool can never hold this prompt */
            }
            fits = true;
            if (((pass == 0) && (st != KVF_PROXY_PAIR_COMPATIBLE)) ||
                kvf_proxy_route_full_locked(pool, info, role)) {
                continue;
            }
            int cached = ((q != NULL) && (pool->kvidx[role] != NULL)) ?
                         kvf_proxy_kvidx_cached_tokens(pool->kvidx[role], i, q) : 0;
            double key = kvf_proxy_route_decode_key(info, num_tokens, cached,
                                                    (q != NULL) ? pool->decode_prefix_weight : 0);
            if ((pick < 0) || (key < best_key)) {
                pick = i;
                best_key = key;
                pick_cached = cached;
            }
        }
    }
    if (pick >= 0) {
        kvf_proxy_instance_info_t *pi = &pool->inst[role][pick].info;

        pool->rr[role] = (unsigned)pick + 1;
        pi->reserved++;   /* under the lock of the bound check */
        pi->prefix_routed += (pick_cached > 0);
        pi->prefix_routed_tokens += (uint64_t)pick_cached;
        *idx_p = pick;
    }
    if (cached_p != NULL) {
        *cached_p = pick_cached;
    }
    pthread_mutex_unlock(&pool->lock);
    if (pick >= 0) {
        return KVF_OK;
    }
    if (fits) {
        if (why != NULL) {
            snprintf(why, why_cap, "every decode instance that would do has %d requests"
                     " outstanding (--max-outstanding)", pool->max_outstanding);
        }
        return KVF_ERR_BUSY;
    }
    if (accepted) {
        if (why != NULL) {
            snprintf(why, why_cap, "the largest prompt a decode instance's KV cache holds is %u"
                     " tokens (raise --num-blocks on decode)", largest);
        }
        return KVF_ERR_OUT_OF_RANGE;
    }
    return healthy ? KVF_ERR_REFUSED : KVF_ERR_NO_RESOURCE;
}

kvf_status_t kvf_proxy_pool_pick_decode(kvf_proxy_pool_h pool, int prefill_idx, int num_tokens,
                                        int *idx_p, char *why, size_t why_cap)
{
    return kvf_proxy_route_decode_pick(pool, prefill_idx, num_tokens, NULL, NULL, idx_p, why,
                                       why_cap);
}

static kvf_status_t kvf_proxy_route_fail(kvf_proxy_route_t *rt, kvf_status_t status, int http,
                                         kvf_proxy_reject_t reason, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static kvf_status_t kvf_proxy_route_fail(kvf_proxy_route_t *rt, kvf_status_t status, int http,
                                         kvf_proxy_reject_t reason, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(rt->why, sizeof(rt->why), fmt, ap);
    va_end(ap);
    rt->http = http;
    rt->type = (http == 400) ? "invalid_request_error" : "server_error";
    rt->reason = reason;
    if (rt->retry_after_s < 1) {
        rt->retry_after_s = 1;
    }
    rt->prefill_idx = -1;
    rt->decode_idx = -1;
    return status;
}

/* The chosen prefill's predicted wait against the request's budget. */
static kvf_status_t kvf_proxy_route_admit(kvf_proxy_pool_h pool, const kvf_proxy_route_req_t *rq,
                                          kvf_proxy_route_t *rt)
{
    kvf_proxy_instance_info_t pi;
    double rate, alone_ms;
    double budget = (double)rq->budget_ms * ((rq->queued_ms > 0) ? 1.0 : KVF_PROXY_ADMIT_HEADROOM);
    int work = rq->num_tokens - rt->cached_tokens;   /* what it computes there */

    kvf_proxy_pool_info(pool, KVF_PROXY_ROLE_PREFILL, rt->prefill_idx, &pi);
    rate = kvf_proxy_route_rate(&pi);
    rt->predicted_wait_ms = kvf_proxy_route_calibrated(
        &pi, kvf_proxy_route_wait_ms(kvf_proxy_route_queued(&pi), work, rate));
    if (rt->predicted_wait_ms < 0) {
        return KVF_OK;                       /* nothing measured yet: admit */
    }
    /* "can never be served" is about the whole prompt, not what a cache holds now */
    alone_ms = kvf_proxy_route_wait_ms(0, rq->num_tokens, rate);
    if (alone_ms > (double)rq->prefill_timeout_ms) {
        return kvf_proxy_route_fail(rt, KVF_ERR_OUT_OF_RANGE, 400, KVF_PROXY_REJECT_COUNT,
                                    "prompt of %d tokens would take about %.1f s to prefill at"
                                    " prefill instance %s's measured %.0f tokens/s, longer than"
                                    " --prefill-timeout %lld ms", rq->num_tokens,
                                    alone_ms / 1000.0, pi.url, rate,
                                    (long long)rq->prefill_timeout_ms);
    }
    if (rt->predicted_wait_ms > budget) {
        rt->retry_after_s = kvf_proxy_route_retry_after_s(rt->predicted_wait_ms, budget);
        return kvf_proxy_route_fail(rt, KVF_ERR_NO_RESOURCE, 503, KVF_PROXY_REJECT_PREDICTED_WAIT,
                                    "overloaded: the least busy prefill instance (%s) has %llu"
                                    " prompt tokens queued; at its recent %.0f tokens/s this"
                                    " request's first token would take about %.1f s, over the"
                                    " %.1f s it may wait%s; retry after %d s", pi.url,
                                    (unsigned long long)kvf_proxy_route_queued(&pi), rate,
                                    rt->predicted_wait_ms / 1000.0, budget / 1000.0,
                                    (rq->queued_ms > 0) ? " after its wait in the proxy's queue"
                                                        : "",
                                    rt->retry_after_s);
    }
    return KVF_OK;
}

/* kvf_proxy_route_pick() with the request's block chain @a q (NULL: load alone). */
static kvf_status_t kvf_proxy_route_pick_q(kvf_proxy_pool_h pool,
                                           const kvf_proxy_route_req_t *rq,
                                           kvf_proxy_route_t *rt, kvf_proxy_kvidx_query_t *q)
{
    kvf_status_t status;
    uint32_t largest = 0;
    const char *purl;
    char why[320] = "";

    pthread_mutex_lock(&pool->lock);
    rt->prefill_idx = kvf_proxy_route_prefill_locked(pool, rq->num_tokens, q,
                                                     &rt->cached_tokens, &status, &largest);
    pthread_mutex_unlock(&pool->lock);
    if (status == KVF_ERR_NO_RESOURCE) {
        return kvf_proxy_route_fail(rt, status, 503, KVF_PROXY_REJECT_NO_INSTANCE,
                                    "no healthy prefill instance (or every one is draining,"
                                    " or none a decode instance accepts: see /health)");
    }
    if (status == KVF_ERR_OUT_OF_RANGE) {
        return kvf_proxy_route_fail(rt, status, 400, KVF_PROXY_REJECT_COUNT,
                                    "prompt of %d tokens does not fit any prefill instance's KV"
                                    " cache (at most %u tokens; raise --num-blocks on prefill)",
                                    rq->num_tokens, largest);
    }
    if (status == KVF_ERR_BUSY) {
        return kvf_proxy_route_fail(rt, KVF_ERR_NO_RESOURCE, 503, KVF_PROXY_REJECT_QUEUE_FULL,
                                    "overloaded: every prefill instance has %d requests"
                                    " outstanding (--max-outstanding) or its queue is full;"
                                    " retry later", pool->max_outstanding);
    }
    status = kvf_proxy_route_admit(pool, rq, rt);
    if (status != KVF_OK) {
        return status;
    }
    purl = kvf_proxy_pool_url(pool, KVF_PROXY_ROLE_PREFILL, rt->prefill_idx);
    /* among the decode instances that accept this prefill (pairs), by load and cached prefix */
    status = kvf_proxy_route_decode_pick(pool, rt->prefill_idx, rq->num_tokens, q,
                                         &rt->decode_cached_tokens, &rt->decode_idx, why,
                                         sizeof(why));
    switch (status) {
    case KVF_OK:
        return KVF_OK;
    case KVF_ERR_OUT_OF_RANGE:
        return kvf_proxy_route_fail(rt, status, 400, KVF_PROXY_REJECT_COUNT,
                                    "prompt of %d tokens does not fit any decode instance: %s",
                                    rq->num_tokens, why);
    case KVF_ERR_REFUSED:
        return kvf_proxy_route_fail(rt, status, 503, KVF_PROXY_REJECT_NO_INSTANCE,
                                    "no decode instance accepts prefill instance %s: %s", purl,
                                    why);
    case KVF_ERR_BUSY:
        return kvf_proxy_route_fail(rt, KVF_ERR_NO_RESOURCE, 503, KVF_PROXY_REJECT_QUEUE_FULL,
                                    "overloaded: %s; retry later", why);
    default:
        return kvf_proxy_route_fail(rt, KVF_ERR_NO_RESOURCE, 503, KVF_PROXY_REJECT_NO_INSTANCE,
                                    "no healthy decode instance (or every one is draining: see"
                                    " /health)");
    }
}

kvf_status_t kvf_proxy_route_pick(kvf_proxy_pool_h pool, const kvf_proxy_route_req_t *rq,
                                  kvf_proxy_route_t *rt)
{
    kvf_status_t status;
    kvf_proxy_kvidx_query_t q;

    memset(rt, 0, sizeof(*rt));
    memset(&q, 0, sizeof(q));
    q.tokens = rq->tokens;
    q.n_tokens = rq->num_tokens;
    q.salt = rq->salt;
    q.salt_len = rq->salt_len;
    rt->decode_idx = -1;
    rt->predicted_wait_ms = -1;
    /* one query for both roles: the chain is computed once per distinct (digest, unit,
     * block size), so a pool whose prefill and decode agree hashes the prompt once */
    status = kvf_proxy_route_pick_q(pool, rq, rt, (rq->tokens != NULL) ? &q : NULL);
    kvf_proxy_kvidx_query_done(&q);
    return status;
}

double kvf_proxy_route_queue_wait_ms(kvf_proxy_pool_h pool, int num_tokens, uint64_t ahead)
{
    kvf_proxy_role_t role = KVF_PROXY_ROLE_PREFILL;
    double best = -1;
    uint64_t share;
    int known = 0;

    pthread_mutex_lock(&pool->lock);
    for (int i = 0; i < pool->count[role]; ++i) {
        known += (kvf_proxy_routable(&pool->inst[role][i].info) &&
                  (kvf_proxy_route_rate(&pool->inst[role][i].info) > 0));
    }
    /* the proxy's queue drains over every instance with a rate: each takes its share */
    share = (known > 0) ? (ahead + (uint64_t)known - 1) / (uint64_t)known : 0;
    for (int i = 0; i < pool->count[role]; ++i) {
        const kvf_proxy_instance_info_t *info = &pool->inst[role][i].info;
        double rate = kvf_proxy_route_rate(info), w;

        if (!kvf_proxy_routable(info) || (rate <= 0)) {
            continue;
        }
        w = kvf_proxy_route_calibrated(info, kvf_proxy_route_wait_ms(
            kvf_proxy_route_queued(info) + share, num_tokens, rate));
        best = ((best < 0) || (w < best)) ? w : best;
    }
    pthread_mutex_unlock(&pool->lock);
    return best;
}
