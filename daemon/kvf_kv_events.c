/*
 * KV event publisher (kvf_kv_events.h).
 *
 * Design: the engine's callback copies each event into a pending list under
 * a mutex (no socket, no encoding on the engine's thread); the publisher's
 * thread wakes every KVF_KVE_TICK_MS, or at once on a replay request, takes
 * the whole list as one batch (one engine step's events, roughly as vLLM
 * batches per scheduler step), encodes, sends and keeps it in a ring of
 * buffer_steps batches for replay. Rejected: encoding on the engine thread
 * (a large prompt's events would lengthen the step).
 */
#include "kvf_kv_events.h"
#include "kvf_json.h"
#include "kvf_log.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <zmq.h>

#define KVF_KVE_TICK_MS 10

typedef struct kvf_kve_kept {
    uint64_t seq;
    uint8_t *buf;
    size_t   len;
} kvf_kve_kept_t;

struct kvf_kv_events {
    kvf_kv_events_config_t cfg;
    char             medium[8];
    void            *zctx;
    void            *pub;
    void            *replay;           /* NULL: no replay endpoint */
    char             pub_ep[KVF_KV_EVENTS_ENDPOINT_MAX];
    char             replay_ep[KVF_KV_EVENTS_ENDPOINT_MAX];
    pthread_t        thread;
    bool             started;
    atomic_bool      stop;
    pthread_mutex_t  lock;             /* pending list and stats */
    kvf_kv_event_t  *pending;
    size_t           n_pending, cap_pending;
    kvf_kv_events_stats_t st;
    kvf_kve_kept_t  *ring;             /* thread only: [buffer_steps] */
    size_t           ring_head, ring_n;
};

void kvf_kv_events_config_default(kvf_kv_events_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    snprintf(cfg->endpoint, sizeof(cfg->endpoint), "tcp://*:5557");
    cfg->buffer_steps = 10000;
    cfg->hwm = 100000;
    cfg->max_queue_size = 100000;
    cfg->format = KVF_KV_EVENTS_FORMAT_MAP;
}

static kvf_status_t kvf_kve_bad(const char *key, const char *what)
{
    kvf_error("--kv-events-config: key '%s': %s", key, what);
    return KVF_ERR_INVALID_PARAM;
}

static kvf_status_t kvf_kve_str_key(const cJSON *it, char *dst, size_t cap, bool null_ok)
{
    if (null_ok && cJSON_IsNull(it)) {
        dst[0] = '\0';
        return KVF_OK;
    }
    if (!cJSON_IsString(it) || (strlen(it->valuestring) >= cap)) {
        return kvf_kve_bad(it->string, null_ok ? "must be a string (shorter than 256 bytes) or "
                           "null" : "must be a string shorter than 256 bytes");
    }
    snprintf(dst, cap, "%s", it->valuestring);
    return KVF_OK;
}

static kvf_status_t kvf_kve_int_key(const cJSON *it, int64_t lo, int64_t hi, int64_t *dst)
{
    char why[96];

    if (!cJSON_IsNumber(it) || (it->valuedouble != (double)(int64_t)it->valuedouble) ||
        (it->valuedouble < (double)lo) || (it->valuedouble > (double)hi)) {
        snprintf(why, sizeof(why), "must be an integer in %lld..%lld", (long long)lo,
                 (long long)hi);
        return kvf_kve_bad(it->string, why);
    }
    *dst = (int64_t)it->valuedouble;
    return KVF_OK;
}

/* One key of vLLM's KVEventsConfig; @a publisher_p gets "publisher". */
static kvf_status_t kvf_kve_key(const cJSON *it, kvf_kv_events_config_t *cfg, char *publisher,
                                size_t pub_cap)
{
    const char *k = it->string;

    if (strcmp(k, "enable_kv_cache_events") == 0) {
        if (!cJSON_IsBool(it)) {
            return kvf_kve_bad(k, "must be true or false");
        }
        cfg->enabled = cJSON_IsTrue(it);
        return KVF_OK;
    }
    if (strcmp(k, "publisher") == 0) {
        kvf_status_t s = kvf_kve_str_key(it, publisher, pub_cap, true);
        if ((s == KVF_OK) && (publisher[0] != '\0') && (strcmp(publisher, "null") != 0) &&
            (strcmp(publisher, "zmq") != 0)) {
            kvf_error("--kv-events-config: key 'publisher': '%s' is not one kvferry has "
                      "(null, zmq)", publisher);
            return KVF_ERR_INVALID_PARAM;
        }
        return s;
    }
    if (strcmp(k, "endpoint") == 0) {
        return kvf_kve_str_key(it, cfg->endpoint, sizeof(cfg->endpoint), false);
    }
    if (strcmp(k, "replay_endpoint") == 0) {
        return kvf_kve_str_key(it, cfg->replay_endpoint, sizeof(cfg->replay_endpoint), true);
    }
    if (strcmp(k, "topic") == 0) {
        return kvf_kve_str_key(it, cfg->topic, sizeof(cfg->topic), false);
    }
    if (strcmp(k, "buffer_steps") == 0) {
        return kvf_kve_int_key(it, 1, 10000000, &cfg->buffer_steps);
    }
    if (strcmp(k, "hwm") == 0) {
        return kvf_kve_int_key(it, 0, 1000000000, &cfg->hwm);
    }
    if (strcmp(k, "max_queue_size") == 0) {
        return kvf_kve_int_key(it, 1, 1000000000, &cfg->max_queue_size);
    }
    kvf_error("--kv-events-config: unknown key '%s' (kvferry takes vLLM's "
              "enable_kv_cache_events, publisher, endpoint, replay_endpoint, buffer_steps, hwm, "
              "max_queue_size, topic)", k);
    return KVF_ERR_INVALID_PARAM;
}

static kvf_status_t kvf_kve_json(const char *json, kvf_kv_events_config_t *cfg)
{
    char publisher[16] = "";
    kvf_status_t s;
    cJSON *root;

    s = kvf_json_parse(json, strlen(json), "--kv-events-config", &root);
    if (s != KVF_OK) {
        return s;
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        kvf_error("--kv-events-config must be a JSON object, as vLLM's KVEventsConfig");
        return KVF_ERR_INVALID_PARAM;
    }
    for (const cJSON *it = root->child; (it != NULL) && (s == KVF_OK); it = it->next) {
        s = kvf_kve_key(it, cfg, publisher, sizeof(publisher));
    }
    cJSON_Delete(root);
    if ((s == KVF_OK) && cfg->enabled && (strcmp(publisher, "null") == 0)) {
        cfg->enabled = false;   /* vLLM: events on, published nowhere */
    }
    if ((s == KVF_OK) && !cfg->enabled && (strcmp(publisher, "zmq") == 0)) {
        kvf_error("--kv-events-config: publisher 'zmq' needs enable_kv_cache_events true");
        return KVF_ERR_INVALID_PARAM;
    }
    return s;
}

kvf_status_t kvf_kv_events_config_parse(const char *json, const char *endpoint,
                                        const char *replay, const char *format,
                                        kvf_kv_events_config_t *cfg)
{
    kvf_status_t s = KVF_OK;

    kvf_kv_events_config_default(cfg);
    if ((json != NULL) && (json[0] != '\0')) {
        s = kvf_kve_json(json, cfg);
    }
    if ((s == KVF_OK) && (endpoint != NULL) && (endpoint[0] != '\0')) {
        snprintf(cfg->endpoint, sizeof(cfg->endpoint), "%s", endpoint);
        cfg->enabled = true;
    }
    if ((s == KVF_OK) && (replay != NULL) && (replay[0] != '\0')) {
        snprintf(cfg->replay_endpoint, sizeof(cfg->replay_endpoint), "%s", replay);
        cfg->enabled = true;
    }
    if ((s == KVF_OK) && (format != NULL) && (strcmp(format, "array") == 0)) {
        cfg->format = KVF_KV_EVENTS_FORMAT_ARRAY;
    } else if ((s == KVF_OK) && (format != NULL) && (format[0] != '\0') &&
               (strcmp(format, "map") != 0)) {
        kvf_error("--kv-events-format '%s': map (vLLM's current encoding) or array (earlier "
                  "vLLM's positional one)", format);
        s = KVF_ERR_INVALID_PARAM;
    }
    return s;
}

/* ---- engine side ---- */

void kvf_kv_events_push(void *ctx, const kvf_prefix_event_t *ev)
{
    struct kvf_kv_events *p = ctx;
    kvf_kv_event_t e = {.kind = ev->kind, .hash = ev->hash, .has_parent = ev->has_parent,
                        .parent = ev->parent, .tokens = NULL, .block_size = ev->block_size};

    if (ev->kind == KVF_PREFIX_EV_STORED) {
        e.tokens = malloc((size_t)ev->block_size * sizeof(int32_t));
        if (e.tokens == NULL) {
            goto drop_unlocked;
        }
        memcpy(e.tokens, ev->tokens, (size_t)ev->block_size * sizeof(int32_t));
    }
    pthread_mutex_lock(&p->lock);
    if (p->n_pending >= (size_t)p->cfg.max_queue_size) {
        pthread_mutex_unlock(&p->lock);
        free(e.tokens);
        goto drop_unlocked;
    }
    if (p->n_pending == p->cap_pending) {
        size_t cap = p->cap_pending ? 2 * p->cap_pending : 256;
        kvf_kv_event_t *n = realloc(p->pending, cap * sizeof(*n));
        if (n == NULL) {
            pthread_mutex_unlock(&p->lock);
            free(e.tokens);
            goto drop_unlocked;
        }
        p->pending = n;
        p->cap_pending = cap;
    }
    p->pending[p->n_pending++] = e;
    pthread_mutex_unlock(&p->lock);
    return;
drop_unlocked:
    pthread_mutex_lock(&p->lock);
    if (p->st.dropped++ == 0) {
        kvf_warn("KV events: queue full (%lld events, max_queue_size) or no memory: events "
                 "dropped; subscribers' view of this instance's cache is now incomplete",
                 (long long)p->cfg.max_queue_size);
    }
    pthread_mutex_unlock(&p->lock);
}

/* ---- publisher thread ---- */

static void kvf_kve_be64(uint64_t v, uint8_t out[8])
{
    for (int i = 0; i < 8; ++i) {
        out[i] = (uint8_t)(v >> (56 - 8 * i));
    }
}

static double kvf_kve_now_s(void)
{
    struct timeval tv;

    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + (double)tv.tv_usec / 1e6;
}

/* Answer one replay request: every kept batch from its sequence number on, then the end. */
static void kvf_kve_serve_replay(struct kvf_kv_events *p)
{
    uint8_t id[256], delim[8], seqb[16], end[8];
    int idn, dn, sn, more;
    size_t more_len = sizeof(more);
    uint64_t start = 0;

    idn = zmq_recv(p->replay, id, sizeof(id), ZMQ_DONTWAIT);
    if (idn < 0) {
        return;
    }
    more = 0;
    (void)zmq_getsockopt(p->replay, ZMQ_RCVMORE, &more, &more_len);
    dn = more ? zmq_recv(p->replay, delim, sizeof(delim), 0) : -1;
    (void)zmq_getsockopt(p->replay, ZMQ_RCVMORE, &more, &more_len);
    sn = (dn == 0) && more ? zmq_recv(p->replay, seqb, sizeof(seqb), 0) : -1;
    for (more = 1; more;) {   /* whatever else the peer sent is not a request */
        (void)zmq_getsockopt(p->replay, ZMQ_RCVMORE, &more, &more_len);
        if (more && (zmq_recv(p->replay, delim, sizeof(delim), 0) >= 0)) {
            sn = -1;
        }
    }
    if ((idn > (int)sizeof(id)) || (sn != 8)) {
        kvf_warn("KV events: malformed replay request ignored (want [empty, 8-byte sequence])");
        return;
    }
    for (int i = 0; i < 8; ++i) {
        start = (start << 8) | seqb[i];
    }
    pthread_mutex_lock(&p->lock);   /* counted before the answer: a reader sees it after */
    p->st.replays++;
    pthread_mutex_unlock(&p->lock);
    for (size_t k = 0; k < p->ring_n; ++k) {
        const kvf_kve_kept_t *b = &p->ring[(p->ring_head + k) % (size_t)p->cfg.buffer_steps];
        uint8_t sb[8];

        if (b->seq < start) {
            continue;
        }
        kvf_kve_be64(b->seq, sb);
        if ((zmq_send(p->replay, id, (size_t)idn, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) ||
            (zmq_send(p->replay, "", 0, ZMQ_SNDMORE) < 0) ||
            (zmq_send(p->replay, sb, 8, ZMQ_SNDMORE) < 0) ||
            (zmq_send(p->replay, b->buf, b->len, 0) < 0)) {
            return;   /* the peer is gone or too slow: it asks again */
        }
    }
    memset(end, 0xff, sizeof(end));   /* -1 as a signed 8-byte big-endian integer */
    if ((zmq_send(p->replay, id, (size_t)idn, ZMQ_SNDMORE | ZMQ_DONTWAIT) >= 0) &&
        (zmq_send(p->replay, "", 0, ZMQ_SNDMORE) >= 0) &&
        (zmq_send(p->replay, end, 8, ZMQ_SNDMORE) >= 0)) {
        (void)zmq_send(p->replay, "", 0, 0);
    }
}

static void kvf_kve_free_events(kvf_kv_event_t *ev, size_t n)
{
    for (size_t i = 0; i < n; ++i) {
        free(ev[i].tokens);
    }
    free(ev);
}

/* Publish what is pending as one batch and keep it for replay. */
static void kvf_kve_flush(struct kvf_kv_events *p)
{
    kvf_kv_event_t *ev;
    size_t n, len;
    uint8_t *buf, seqb[8];
    kvf_kve_kept_t *slot;
    uint64_t seq;

    pthread_mutex_lock(&p->lock);
    ev = p->pending;
    n = p->n_pending;
    p->pending = NULL;
    p->n_pending = p->cap_pending = 0;
    seq = p->st.batches;
    pthread_mutex_unlock(&p->lock);
    if (n == 0) {
        return;
    }
    if (kvf_kv_events_encode(ev, n, kvf_kve_now_s(), p->medium, p->cfg.format, &buf, &len) !=
        KVF_OK) {
        kvf_warn("KV events: a batch of %zu events could not be encoded (no memory): dropped", n);
        kvf_kve_free_events(ev, n);
        return;
    }
    kvf_kve_free_events(ev, n);
    kvf_kve_be64(seq, seqb);
    /* PUB never blocks: past its high-water mark ZeroMQ drops, and replay fills the gap */
    (void)zmq_send(p->pub, p->cfg.topic, strlen(p->cfg.topic), ZMQ_SNDMORE);
    (void)zmq_send(p->pub, seqb, 8, ZMQ_SNDMORE);
    (void)zmq_send(p->pub, buf, len, 0);
    if (p->ring_n == (size_t)p->cfg.buffer_steps) {   /* full: the oldest goes */
        free(p->ring[p->ring_head].buf);
        p->ring_head = (p->ring_head + 1) % (size_t)p->cfg.buffer_steps;
        p->ring_n--;
    }
    slot = &p->ring[(p->ring_head + p->ring_n) % (size_t)p->cfg.buffer_steps];
    *slot = (kvf_kve_kept_t){seq, buf, len};
    p->ring_n++;
    pthread_mutex_lock(&p->lock);
    p->st.batches = seq + 1;
    p->st.events += n;
    pthread_mutex_unlock(&p->lock);
}

static void *kvf_kve_main(void *arg)
{
    struct kvf_kv_events *p = arg;
    zmq_pollitem_t item = {p->replay, 0, ZMQ_POLLIN, 0};

    while (!atomic_load(&p->stop)) {
        int rc = 0;

        if (p->replay != NULL) {
            rc = zmq_poll(&item, 1, KVF_KVE_TICK_MS);
        } else {
            struct timespec ts = {0, KVF_KVE_TICK_MS * 1000000L};
            nanosleep(&ts, NULL);
        }
        kvf_kve_flush(p);   /* before a replay, so it has the newest batch too */
        if ((rc > 0) && (item.revents & ZMQ_POLLIN)) {
            kvf_kve_serve_replay(p);
        }
    }
    kvf_kve_flush(p);
    return NULL;
}

/* vLLM's rule: a wildcard, "::", ipc:// or inproc:// endpoint is bound, another one
 * connected to (a broker's). */
static bool kvf_kve_binds(const char *ep)
{
    return (strchr(ep, '*') != NULL) || (strstr(ep, "::") != NULL) ||
           (strncmp(ep, "ipc://", 6) == 0) || (strncmp(ep, "inproc://", 9) == 0);
}

static kvf_status_t kvf_kve_socket(struct kvf_kv_events *p, int type, const char *ep,
                                   bool always_bind, void **sock_p, char *bound, size_t cap)
{
    /* PUB: its last batch (AllBlocksCleared at shutdown) gets 200 ms to leave */
    int linger = (type == ZMQ_PUB) ? 200 : 0, hwm = (int)p->cfg.hwm;
    bool bind = always_bind || kvf_kve_binds(ep);
    size_t len = cap;

    *sock_p = zmq_socket(p->zctx, type);
    if (*sock_p == NULL) {
        return KVF_ERR_ZMQ;
    }
    (void)zmq_setsockopt(*sock_p, ZMQ_LINGER, &linger, sizeof(linger));
    if (type == ZMQ_PUB) {
        (void)zmq_setsockopt(*sock_p, ZMQ_SNDHWM, &hwm, sizeof(hwm));
    }
    if ((bind ? zmq_bind(*sock_p, ep) : zmq_connect(*sock_p, ep)) != 0) {
        kvf_error("KV events: cannot use %s endpoint '%s': %s",
                  (type == ZMQ_PUB) ? "--kv-events-endpoint" : "--kv-events-replay-endpoint",
                  ep, zmq_strerror(errno));
        return KVF_ERR_INVALID_PARAM;
    }
    bound[0] = '\0';   /* connected to a broker: nothing a subscriber can connect to here */
    if (bind && ((zmq_getsockopt(*sock_p, ZMQ_LAST_ENDPOINT, bound, &len) != 0) ||
                 (bound[0] == '\0'))) {
        snprintf(bound, cap, "%s", ep);
    }
    return KVF_OK;
}

kvf_status_t kvf_kv_events_create(const kvf_kv_events_config_t *cfg, const char *medium,
                                  kvf_kv_events_h *pub_p)
{
    struct kvf_kv_events *p = calloc(1, sizeof(*p));
    kvf_prefix_event_t cleared = {.kind = KVF_PREFIX_EV_CLEARED};
    kvf_status_t s;

    *pub_p = NULL;
    if (p == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    p->cfg = *cfg;
    snprintf(p->medium, sizeof(p->medium), "%s", medium);
    pthread_mutex_init(&p->lock, NULL);
    p->ring = calloc((size_t)cfg->buffer_steps, sizeof(*p->ring));
    p->zctx = zmq_ctx_new();
    s = ((p->ring == NULL) || (p->zctx == NULL)) ? KVF_ERR_NO_MEMORY : KVF_OK;
    if (s == KVF_OK) {
        s = kvf_kve_socket(p, ZMQ_PUB, cfg->endpoint, false, &p->pub, p->pub_ep,
                           sizeof(p->pub_ep));
    }
    if ((s == KVF_OK) && (cfg->replay_endpoint[0] != '\0')) {
        s = kvf_kve_socket(p, ZMQ_ROUTER, cfg->replay_endpoint, true, &p->replay,
                           p->replay_ep, sizeof(p->replay_ep));
    }
    if (s == KVF_OK) {
        kvf_kv_events_push(p, &cleared);   /* sequence 0: forget this instance's past */
        s = (pthread_create(&p->thread, NULL, kvf_kve_main, p) == 0) ? KVF_OK
                                                                       : KVF_ERR_NO_MEMORY;
        p->started = (s == KVF_OK);
    }
    if (s != KVF_OK) {
        kvf_kv_events_destroy(p);
        return s;
    }
    kvf_info("KV events: publishing on %s%s%s (%s encoding, topic '%s', %lld batches kept "
             "for replay)", p->pub_ep[0] ? p->pub_ep : cfg->endpoint,
             p->replay_ep[0] ? ", replay on " : "", p->replay_ep,
             (cfg->format == KVF_KV_EVENTS_FORMAT_MAP) ? "map" : "array", cfg->topic,
             (long long)cfg->buffer_steps);
    *pub_p = p;
    return KVF_OK;
}

void kvf_kv_events_destroy(kvf_kv_events_h p)
{
    if (p == NULL) {
        return;
    }
    if (p->started) {
        atomic_store(&p->stop, true);
        pthread_join(p->thread, NULL);
    }
    if (p->pub != NULL) {
        zmq_close(p->pub);
    }
    if (p->replay != NULL) {
        zmq_close(p->replay);
    }
    if (p->zctx != NULL) {
        zmq_ctx_term(p->zctx);
    }
    for (size_t k = 0; (p->ring != NULL) && (k < p->ring_n); ++k) {
        free(p->ring[(p->ring_head + k) % (size_t)p->cfg.buffer_steps].buf);
    }
    free(p->ring);
    for (size_t i = 0; i < p->n_pending; ++i) {
        free(p->pending[i].tokens);
    }
    free(p->pending);
    pthread_mutex_destroy(&p->lock);
    free(p);
}

const char *kvf_kv_events_endpoint(kvf_kv_events_h p)
{
    return p->pub_ep;
}

const char *kvf_kv_events_replay_endpoint(kvf_kv_events_h p)
{
    return p->replay_ep;
}

void kvf_kv_events_get_stats(kvf_kv_events_h p, kvf_kv_events_stats_t *stats_p)
{
    pthread_mutex_lock(&p->lock);
    *stats_p = p->st;
    pthread_mutex_unlock(&p->lock);
}
