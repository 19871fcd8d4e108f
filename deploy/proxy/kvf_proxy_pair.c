/*
 * kvf-proxy pair checks (I/O thread): once a prefill and a decode instance
 * are both healthy, decode is asked whether it can handshake with that
 * prefill engine (CheckPeerRequest), again whenever either restarts. The
 * verdict (compatible, refused, or retried after a failed check) is kept per
 * pair under pool->lock; a refused pair is never routed.
 */
#include "kvf_proxy_pool_int.h"
#include "kvf_log.h"
#include "kvf_zmq.h"

#include <stdlib.h>
#include <string.h>

const char *kvf_proxy_pair_state_str(kvf_proxy_pair_state_t s)
{
    switch (s) {
    case KVF_PROXY_PAIR_CHECKING:   return "checking";
    case KVF_PROXY_PAIR_COMPATIBLE: return "compatible";
    case KVF_PROXY_PAIR_REFUSED:    return "refused";
    default:                        return "unchecked";
    }
}

/* A decode instance's verdict on one prefill engine. */
void kvf_proxy_io_check_reply(struct kvf_proxy_pool *pool, kvf_proxy_instance_t *inst,
                                     const Kvf__ServeReply *r)
{
    const char *p_str = r->request_id + strlen(KVF_PROXY_CHECK_PREFIX);
    char *end = NULL;
    long p = strtol(p_str, &end, 10);
    uint64_t inc = (end != NULL && *end == ':') ? strtoull(end + 1, NULL, 16) : 0;
    kvf_status_t status = r->has_status ? (kvf_status_t)r->status : KVF_OK;
    const char *msg = ((r->error != NULL) && (r->error[0] != '\0')) ? r->error :
                      kvf_status_str(status);
    kvf_proxy_pair_t *pair;
    kvf_proxy_instance_t *pf;

    if ((inst->role != KVF_PROXY_ROLE_DECODE) || (p < 0) ||
        (p >= pool->count[KVF_PROXY_ROLE_PREFILL])) {
        return;
    }
    pthread_mutex_lock(&pool->lock);
    pair = kvf_proxy_pair(pool, (int)p, inst->idx);
    pf = &pool->inst[KVF_PROXY_ROLE_PREFILL][p];
    if ((pair->state != KVF_PROXY_PAIR_CHECKING) || (pair->prefill_incarnation != inc)) {
        goto out;   /* a stale answer: the prefill restarted meanwhile */
    }
    if ((status == KVF_OK) || (status == KVF_ERR_UNSUPPORTED)) {
        /* UNSUPPORTED: a decode build without the check; its requests will tell */
        pair->state = KVF_PROXY_PAIR_COMPATIBLE;
        pair->error[0] = '\0';
        kvf_info("prefill %s -> decode %s: %s", pf->url, inst->url,
                 (status == KVF_OK) ? "handshake accepted" : "not checked (decode cannot)");
    } else if ((status == KVF_ERR_REFUSED) || (status == KVF_ERR_VERSION)) {
        pair->state = KVF_PROXY_PAIR_REFUSED;
        snprintf(pair->error, sizeof(pair->error), "%s", msg);
        kvf_error("prefill %s -> decode %s will not be routed: %s", pf->url, inst->url, msg);
    } else {
        pair->state = KVF_PROXY_PAIR_UNCHECKED;
        pair->retry_ms = (int64_t)kvf_time_now_ms() + KVF_PROXY_CHECK_RETRY_MS;
        snprintf(pair->error, sizeof(pair->error), "check failed: %s", msg);
        kvf_warn("prefill %s -> decode %s: compatibility check failed, retrying: %s", pf->url,
                 inst->url, msg);
    }
out:
    pthread_mutex_unlock(&pool->lock);
}

/* Start a check for every healthy pair without a current verdict. */
void kvf_proxy_io_check_pairs(struct kvf_proxy_pool *pool, int64_t now)
{
    int np = pool->count[KVF_PROXY_ROLE_PREFILL], nd = pool->count[KVF_PROXY_ROLE_DECODE];

    for (int p = 0; p < np; ++p) {
        for (int d = 0; d < nd; ++d) {
            kvf_proxy_instance_t *pf = &pool->inst[KVF_PROXY_ROLE_PREFILL][p];
            kvf_proxy_instance_t *dc = &pool->inst[KVF_PROXY_ROLE_DECODE][d];
            Kvf__CheckPeerRequest cr = KVF__CHECK_PEER_REQUEST__INIT;
            Kvf__ServeRequest req = KVF__SERVE_REQUEST__INIT;
            kvf_proxy_pair_t *pair;
            char rid[64], engine[64], host[64];
            uint8_t *buf;
            size_t len;
            uint32_t port;
            uint64_t inc;

            pthread_mutex_lock(&pool->lock);
            pair = kvf_proxy_pair(pool, p, d);
            if (!pf->info.healthy || !dc->info.healthy || (pf->info.side_port == 0)) {
                pthread_mutex_unlock(&pool->lock);
                continue;
            }
            if ((pair->prefill_incarnation != pf->info.incarnation) ||
                (pair->decode_incarnation != dc->info.incarnation)) {
                pair->state = KVF_PROXY_PAIR_UNCHECKED;   /* one side restarted */
                pair->retry_ms = 0;
                pair->error[0] = '\0';
                pair->prefill_incarnation = pf->info.incarnation;
                pair->decode_incarnation = dc->info.incarnation;
            }
            if ((pair->state == KVF_PROXY_PAIR_CHECKING) &&
                (now - pair->sent_ms > 2 * pool->timeout_ms + (int64_t)dc->info.xfer_timeout_ms)) {
                pair->state = KVF_PROXY_PAIR_UNCHECKED;
                snprintf(pair->error, sizeof(pair->error),
                         "no answer to the compatibility check within %lld ms",
                         (long long)(now - pair->sent_ms));
            }
            if ((pair->state != KVF_PROXY_PAIR_UNCHECKED) || (now < pair->retry_ms)) {
                pthread_mutex_unlock(&pool->lock);
                continue;
            }
            pair->state = KVF_PROXY_PAIR_CHECKING;
            pair->sent_ms = now;
            inc = pf->info.incarnation;
            snprintf(engine, sizeof(engine), "%s", pf->info.engine_id);
            snprintf(host, sizeof(host), "%s", pf->info.side_host);
            port = pf->info.side_port;
            pthread_mutex_unlock(&pool->lock);

            snprintf(rid, sizeof(rid), KVF_PROXY_CHECK_PREFIX "%d:%llx", p,
                     (unsigned long long)inc);
            cr.request_id = rid;
            cr.engine_id = engine;
            cr.host = host;
            cr.has_port = cr.has_incarnation = 1;
            cr.port = port;
            cr.incarnation = inc;
            req.body_case = KVF__SERVE_REQUEST__BODY_CHECK_PEER;
            req.check_peer = &cr;
            len = kvf__serve_request__get_packed_size(&req);
            buf = malloc(len ? len : 1);
            if ((buf == NULL) ||
                (kvf__serve_request__pack(&req, buf), zmq_send(dc->sock, buf, len,
                                                               ZMQ_DONTWAIT) < 0)) {
                pthread_mutex_lock(&pool->lock);
                pair->state = KVF_PROXY_PAIR_UNCHECKED;
                pair->retry_ms = now + KVF_PROXY_CHECK_RETRY_MS;
                pthread_mutex_unlock(&pool->lock);
            } else {
                kvf_debug("asking decode %s whether it can pull from %s (%s:%u)", dc->url, engine,
                          host, port);
            }
            free(buf);
        }
    }
}
