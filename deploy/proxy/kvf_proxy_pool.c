/*
 * kvf-proxy instance table: the endpoint lists parsed into instances, the
 * pool's life (create starts the I/O thread of kvf_proxy_io.c, destroy stops
 * it), and the choice of instances for a request. The rest of the pool is
 * split by concern: kvf_proxy_io.c (sockets, probes), kvf_proxy_mailbox.c
 * (calls), kvf_proxy_pair.c (pair checks), kvf_proxy_health.c (/health JSON
 * and /metrics gauges).
 */
#define _GNU_SOURCE
#include "kvf_proxy_pool_int.h"
#include "kvf_log.h"
#include "kvf_zmq.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

const char *kvf_proxy_role_name(kvf_proxy_role_t role)
{
    return (role == KVF_PROXY_ROLE_PREFILL) ? "prefill" : "decode";
}

/* ---- parsing ----------------------------------------------------------------- */

static kvf_status_t kvf_proxy_pool_add_list(struct kvf_proxy_pool *pool, kvf_proxy_role_t role,
                                            const char *list)
{
    const char *p = (list != NULL) ? list : "";

    while (*p != '\0') {
        const char *end = strchr(p, ',');
        size_t n = (end != NULL) ? (size_t)(end - p) : strlen(p);
        kvf_proxy_instance_t *inst;

        while ((n > 0) && (*p == ' ')) {
            p++;
            n--;
        }
        while ((n > 0) && (p[n - 1] == ' ')) {
            n--;
        }
        if ((n == 0) || (n >= KVF_PROXY_URL_MAX)) {
            kvf_error("bad %s endpoint list '%s': empty or over-long item",
                      kvf_proxy_role_name(role), list);
            return KVF_ERR_INVALID_PARAM;
        }
        if (pool->count[role] == KVF_PROXY_MAX_INSTANCES) {
            kvf_error("too many %s instances (at most %d)", kvf_proxy_role_name(role),
                      KVF_PROXY_MAX_INSTANCES);
            return KVF_ERR_INVALID_PARAM;
        }
        inst = &pool->inst[role][pool->count[role]];
        inst->role = role;
        inst->idx = pool->count[role]++;
        memcpy(inst->url, p, n);
        inst->url[n] = '\0';
        memcpy(inst->info.url, inst->url, n + 1);
        if (kvf_proxy_endpoint_split(inst->url, inst->host, sizeof(inst->host), inst->port,
                                     sizeof(inst->port)) != KVF_OK) {
            kvf_error("bad %s endpoint list: item '%s'", kvf_proxy_role_name(role), inst->url);
            return KVF_ERR_INVALID_PARAM;
        }
        if (inst->host[0] == '\0') {   /* an address: connected to as it is */
            memcpy(inst->addr, inst->url, n + 1);
            memcpy(inst->info.address, inst->url, n + 1);
        }
        snprintf(inst->info.last_error, sizeof(inst->info.last_error), "no health reply yet");
        p += n;
        while ((*p == ' ') || (*p == ',')) {
            p++;
        }
    }
    return KVF_OK;
}
/* ---- public API ------------------------------------------------------------ */

kvf_status_t kvf_proxy_pool_create(const kvf_proxy_pool_params_t *params,
                                   kvf_proxy_pool_h *pool_p)
{
    struct kvf_proxy_pool *pool;
    kvf_status_t status;

    if ((params->health_interval_ms <= 0) || (params->health_timeout_ms <= 0)) {
        kvf_error("health interval and timeout must be positive");
        return KVF_ERR_INVALID_PARAM;
    }
    pool = calloc(1, sizeof(*pool));
    if (pool == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    pthread_mutex_init(&pool->lock, NULL);
    pool->efd = -1;
    pool->interval_ms = params->health_interval_ms;
    pool->timeout_ms = params->health_timeout_ms;
    pool->max_outstanding = (params->max_outstanding > 0) ? params->max_outstanding :
                            KVF_PROXY_MAX_OUTSTANDING_DEFAULT;
    snprintf(pool->tok_digest, sizeof(pool->tok_digest), "%s",
             params->tokenizer_digest ? params->tokenizer_digest : "");
    snprintf(pool->tok_source, sizeof(pool->tok_source), "%s",
             params->tokenizer_source ? params->tokenizer_source : "");
    pool->adopt = params->adopt;
    pool->adopt_ctx = params->adopt_ctx;
    pool->prefix_weight = params->prefix_weight;
    pool->decode_prefix_weight = params->decode_prefix_weight;
    atomic_init(&pool->stop, false);

    status = kvf_proxy_pool_add_list(pool, KVF_PROXY_ROLE_PREFILL, params->prefill_urls);
    if (status == KVF_OK) {
        status = kvf_proxy_pool_add_list(pool, KVF_PROXY_ROLE_DECODE, params->decode_urls);
    }
    if (status != KVF_OK) {
        goto err_free;
    }
    if ((pool->count[KVF_PROXY_ROLE_PREFILL] > 0) && (pool->count[KVF_PROXY_ROLE_DECODE] > 0)) {
        pool->pairs = calloc((size_t)pool->count[KVF_PROXY_ROLE_PREFILL] *
                             (size_t)pool->count[KVF_PROXY_ROLE_DECODE], sizeof(*pool->pairs));
        if (pool->pairs == NULL) {
            status = KVF_ERR_NO_MEMORY;
            goto err_free;
        }
    }
    pool->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (pool->efd < 0) {
        kvf_error("eventfd failed: %m");
        status = KVF_ERR_IO;
        goto err_free;
    }
    pool->zctx = zmq_ctx_new();
    if (pool->zctx == NULL) {
        kvf_error("zmq_ctx_new failed: %s", zmq_strerror(zmq_errno()));
        status = KVF_ERR_ZMQ;
        goto err_close_efd;
    }
    for (int role = 0; role < KVF_PROXY_ROLE_COUNT; ++role) {
        for (int i = 0; i < pool->count[role]; ++i) {
            kvf_proxy_instance_t *inst = &pool->inst[role][i];

            /* a name: connected once the resolver answers (kvf_proxy_resolve.c) */
            status = kvf_proxy_inst_open(pool, inst, (inst->addr[0] != '\0') ? inst->addr :
                                                     NULL);
            if (status != KVF_OK) {
                goto err_close_socks;
            }
        }
    }
    /* the indexes before the I/O thread, which reads pool->kvidx on every health reply */
    for (int role = 0; params->prefix_routing && (role < KVF_PROXY_ROLE_COUNT); ++role) {
        if ((pool->count[role] > 0) &&
            (kvf_proxy_kvidx_create(pool->count[role], &pool->kvidx[role]) != KVF_OK)) {
            kvf_warn("KV events: no index thread for the %s instances (no memory): routing"
                     " them by load alone", kvf_proxy_role_name((kvf_proxy_role_t)role));
        }
    }
    status = kvf_proxy_resolver_start(pool);
    if (status != KVF_OK) {
        goto err_close_socks;
    }
    if (pthread_create(&pool->thread, NULL, kvf_proxy_io_main, pool) != 0) {
        kvf_error("failed to start the proxy i/o thread");
        status = KVF_ERR_NO_RESOURCE;
        goto err_stop_resolver;
    }
    pool->thread_started = true;
    *pool_p = pool;
    return KVF_OK;

err_stop_resolver:
    kvf_proxy_resolver_stop(pool);
err_close_socks:
    for (int role = 0; role < KVF_PROXY_ROLE_COUNT; ++role) {
        kvf_proxy_kvidx_destroy(pool->kvidx[role]);   /* NULL: no-op */
        for (int i = 0; i < pool->count[role]; ++i) {
            kvf_proxy_inst_close(&pool->inst[role][i]);
        }
    }
    zmq_ctx_term(pool->zctx);
err_close_efd:
    close(pool->efd);
err_free:
    pthread_mutex_destroy(&pool->lock);
    free(pool->pairs);
    free(pool);
    return status;
}

void kvf_proxy_pool_destroy(kvf_proxy_pool_h pool)
{
    uint64_t one = 1;

    if (pool == NULL) {
        return;
    }
    atomic_store(&pool->stop, true);
    if (write(pool->efd, &one, sizeof(one)) < 0) {
        kvf_debug("eventfd write failed: %m");
    }
    if (pool->thread_started) {
        pthread_join(pool->thread, NULL);
    }
    kvf_proxy_resolver_stop(pool);   /* after the I/O thread, its only reader */
    for (int role = 0; role < KVF_PROXY_ROLE_COUNT; ++role) {
        kvf_proxy_kvidx_destroy(pool->kvidx[role]);   /* after the I/O thread, which updates it */
        pool->kvidx[role] = NULL;
    }
    pthread_mutex_lock(&pool->lock);
    for (struct kvf_proxy_call *c = pool->calls; c != NULL; c = c->next) {
        kvf_proxy_call_fail_locked(c, KVF_ERR_CANCELED, "proxy is shutting down");
    }
    while (pool->sendq_head != NULL) {
        kvf_proxy_msg_t *m = pool->sendq_head;
        pool->sendq_head = m->next;
        free(m);
    }
    pthread_mutex_unlock(&pool->lock);
    for (int role = 0; role < KVF_PROXY_ROLE_COUNT; ++role) {
        for (int i = 0; i < pool->count[role]; ++i) {
            kvf_proxy_inst_close(&pool->inst[role][i]);
        }
    }
    zmq_ctx_term(pool->zctx);
    close(pool->efd);
    /* Calls still registered belong to threads that will end them; the MHD
     * daemon is stopped before the pool, so there are none in practice. */
    if (pool->calls == NULL) {
        pthread_mutex_destroy(&pool->lock);
        free(pool->pairs);
        free(pool);
    }
}

int kvf_proxy_pool_count(kvf_proxy_pool_h pool, kvf_proxy_role_t role)
{
    return pool->count[role];
}

const char *kvf_proxy_pool_url(kvf_proxy_pool_h pool, kvf_proxy_role_t role, int idx)
{
    return pool->inst[role][idx].url;
}

void kvf_proxy_pool_info(kvf_proxy_pool_h pool, kvf_proxy_role_t role, int idx,
                         kvf_proxy_instance_info_t *info_p)
{
    kvf_proxy_instance_t *inst = &pool->inst[role][idx];

    pthread_mutex_lock(&pool->lock);
    *info_p = inst->info;
    info_p->last_ok_age_ms = (inst->last_ok_ms != 0) ? (int64_t)kvf_time_now_ms() - inst->last_ok_ms : -1;
    pthread_mutex_unlock(&pool->lock);
}

bool kvf_proxy_pool_ready(kvf_proxy_pool_h pool)
{
    bool ok = false;

    pthread_mutex_lock(&pool->lock);
    for (int p = 0; (p < pool->count[KVF_PROXY_ROLE_PREFILL]) && !ok; ++p) {
        for (int d = 0; (d < pool->count[KVF_PROXY_ROLE_DECODE]) && !ok; ++d) {
            ok = kvf_proxy_routable(&pool->inst[KVF_PROXY_ROLE_PREFILL][p].info) &&
                 kvf_proxy_routable(&pool->inst[KVF_PROXY_ROLE_DECODE][d].info) &&
                 (kvf_proxy_pair(pool, p, d)->state != KVF_PROXY_PAIR_REFUSED);
        }
    }
    pthread_mutex_unlock(&pool->lock);
    return ok;
}
