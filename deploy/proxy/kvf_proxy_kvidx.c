/*
 * Per-instance cached-block index from KV events (kvf_proxy_kvidx.h).
 *
 * Design: one thread for every instance's SUB and replay DEALER sockets
 * (a few sockets, one poll), apart from the pool's I/O thread so a burst of
 * events never delays a request's replies. Each set is open addressing on
 * the 128-bit keys (they are uniform hashes already), with tombstones
 * rehashed away when they pile up. A live batch arriving while a replay is
 * under way is dropped: the replay brings it, or the next live batch shows
 * a gap and asks again. Rejected: holding live batches until the replay
 * ends (a buffer to bound, for a case the re-ask covers).
 */
#include "kvf_proxy_kvidx.h"
#include "kvf_proxy_kvev.h"
#include "kvf_log.h"
#include "kvf_time.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#define KVF_KX_POLL_MS 50
#define KVF_KX_REPLAY_TIMEOUT_MS 2000
#define KVF_KX_EP_MAX 256
/* Blocks kept per instance (24 MB of set at most): a pool holds far fewer; past it, a
 * publisher is wrong or hostile and its further blocks are not indexed (counted). */
#define KVF_KX_MAX_BLOCKS (1u << 20)

typedef struct kvf_kx_set {
    kvf_block_hash_t *key;
    uint8_t          *st;      /* 0 empty, 1 used, 2 removed */
    size_t            cap, used, tomb;
} kvf_kx_set_t;

typedef struct kvf_kx_inst {
    /* under kx->lock */
    char          pub[KVF_KX_EP_MAX], replay[KVF_KX_EP_MAX];
    uint64_t      incarnation;
    uint8_t       digest[16];
    char          digest_hex[40];   /* as the instance reported it */
    bool          has_chain;
    uint32_t      unit, block_size;
    unsigned      gen;              /* bumped when pub, replay or incarnation changed */
    kvf_kx_set_t  set;
    bool          subscribed;
    int64_t       last_seq;         /* -1: none applied since (re)subscribing */
    uint64_t      batches, replays, gaps, lost, bad, over;
    /* the thread's */
    unsigned      open_gen;
    void         *sub, *rep;
    bool          replaying;
    int64_t       replay_ms;
} kvf_kx_inst_t;

struct kvf_proxy_kvidx {
    pthread_mutex_t lock;
    int             n;
    kvf_kx_inst_t  *inst;
    void           *zctx;
    pthread_t       thread;
    bool            started;
    atomic_bool     stop;
};

/* ---- the sets ---- */

static size_t kvf_kx_slot(const kvf_kx_set_t *s, kvf_block_hash_t h)
{
    return (size_t)((h.lo ^ (h.hi * 0x9e3779b97f4a7c15ull)) & (uint64_t)(s->cap - 1));
}

static bool kvf_kx_eq(kvf_block_hash_t a, kvf_block_hash_t b)
{
    return (a.lo == b.lo) && (a.hi == b.hi);
}

static bool kvf_kx_has(const kvf_kx_set_t *s, kvf_block_hash_t h)
{
    for (size_t i = (s->cap > 0) ? kvf_kx_slot(s, h) : 0, k = 0; k < s->cap;
         ++k, i = (i + 1) & (s->cap - 1)) {
        if (s->st[i] == 0) {
            return false;
        }
        if ((s->st[i] == 1) && kvf_kx_eq(s->key[i], h)) {
            return true;
        }
    }
    return false;
}

static void kvf_kx_clear(kvf_kx_set_t *s)
{
    free(s->key);
    free(s->st);
    memset(s, 0, sizeof(*s));
}

static bool kvf_kx_add(kvf_kx_set_t *s, kvf_block_hash_t h);

/* Grow (or only rehash away tombstones) so one more key fits under 3/4 full. */
static bool kvf_kx_room(kvf_kx_set_t *s)
{
    kvf_kx_set_t old = *s, grown;
    size_t cap;

    if ((s->cap > 0) && (4 * (s->used + s->tomb + 1) <= 3 * s->cap)) {
        return true;
    }
    cap = (s->cap == 0) ? 1024 : (4 * (s->used + 1) > s->cap) ? 2 * s->cap : s->cap;
    grown.key = malloc(cap * sizeof(*grown.key));
    grown.st = calloc(cap, 1);
    if ((grown.key == NULL) || (grown.st == NULL)) {
        free(grown.key);
        free(grown.st);
        return false;
    }
    grown.cap = cap;
    grown.used = grown.tomb = 0;
    *s = grown;
    for (size_t i = 0; i < old.cap; ++i) {
        if (old.st[i] == 1) {
            (void)kvf_kx_add(s, old.key[i]);
        }
    }
    free(old.key);
    free(old.st);
    return true;
}

static bool kvf_kx_add(kvf_kx_set_t *s, kvf_block_hash_t h)
{
    size_t i;

    if (kvf_kx_has(s, h)) {
        return true;
    }
    if (!kvf_kx_room(s)) {
        return false;
    }
    for (i = kvf_kx_slot(s, h); s->st[i] == 1; i = (i + 1) & (s->cap - 1)) {
    }
    s->tomb -= (s->st[i] == 2) ? 1 : 0;
    s->st[i] = 1;
    s->key[i] = h;
    s->used++;
    return true;
}

static void kvf_kx_del(kvf_kx_set_t *s, kvf_block_hash_t h)
{
    for (size_t i = (s->cap > 0) ? kvf_kx_slot(s, h) : 0, k = 0; k < s->cap;
         ++k, i = (i + 1) & (s->cap - 1)) {
        if (s->st[i] == 0) {
            return;
        }
        if ((s->st[i] == 1) && kvf_kx_eq(s->key[i], h)) {
            s->st[i] = 2;
            s->used--;
            s->tomb++;
            return;
        }
    }
}

/* ---- updates from health ---- */

/* @a ep with a wildcard host (0.0.0.0, *, [::]) given @a addr's host instead. */
static void kvf_kx_reachable(const char *ep, const char *addr, char *out, size_t cap)
{
    const char *h = (strncmp(ep, "tcp://", 6) == 0) ? ep + 6 : NULL;
    const char *port = (h != NULL) ? strrchr(h, ':') : NULL;
    const char *ah = (strncmp(addr, "tcp://", 6) == 0) ? addr + 6 : NULL;
    const char *acolon = (ah != NULL) ? strrchr(ah, ':') : NULL;
    size_t hl = (port != NULL) ? (size_t)(port - h) : 0;

    if ((port != NULL) && (acolon != NULL) &&
        (((hl == 7) && (strncmp(h, "0.0.0.0", 7) == 0)) || ((hl == 1) && (h[0] == '*')) ||
         ((hl == 4) && (strncmp(h, "[::]", 4) == 0)))) {
        snprintf(out, cap, "tcp://%.*s%s", (int)(acolon - ah), ah, port);
    } else {
        snprintf(out, cap, "%s", ep);
    }
}

void kvf_proxy_kvidx_update(kvf_proxy_kvidx_h kx, int idx, const kvf_proxy_kvidx_src_t *src)
{
    char pub[KVF_KX_EP_MAX] = "", rep[KVF_KX_EP_MAX] = "";
    kvf_kx_inst_t *in;

    if ((kx == NULL) || (idx < 0) || (idx >= kx->n)) {
        return;
    }
    if ((src->pub != NULL) && (src->pub[0] != '\0')) {
        kvf_kx_reachable(src->pub, src->instance_addr, pub, sizeof(pub));
    }
    if ((src->replay != NULL) && (src->replay[0] != '\0')) {
        kvf_kx_reachable(src->replay, src->instance_addr, rep, sizeof(rep));
    }
    pthread_mutex_lock(&kx->lock);
    in = &kx->inst[idx];
    if ((strcmp(in->pub, pub) != 0) || (strcmp(in->replay, rep) != 0) ||
        (in->incarnation != src->incarnation)) {
        snprintf(in->pub, sizeof(in->pub), "%s", pub);
        snprintf(in->replay, sizeof(in->replay), "%s", rep);
        in->incarnation = src->incarnation;
        in->gen++;
    }
    in->has_chain = (src->model_digest != NULL) && (src->hash_unit > 0) &&
                    (src->block_size >= src->hash_unit) &&
                    (src->block_size % src->hash_unit == 0) &&
                    (kvf_block_hash_digest_from_hex(src->model_digest, in->digest) == KVF_OK);
    in->unit = src->hash_unit;
    in->block_size = src->block_size;
    snprintf(in->digest_hex, sizeof(in->digest_hex), "%s",
             (src->model_digest != NULL) ? src->model_digest : "");
    pthread_mutex_unlock(&kx->lock);
}

/* ---- lookups ---- */

void kvf_proxy_kvidx_query_done(kvf_proxy_kvidx_query_t *q)
{
    free(q->blocks);
    q->blocks = NULL;
    q->have = false;
}

/* @a q's block keys under (@a digest, @a unit, @a bs), computed unless they are already. */
static bool kvf_kx_chain(kvf_proxy_kvidx_query_t *q, const uint8_t digest[16], uint32_t unit,
                         uint32_t bs)
{
    kvf_block_hash_t root, *units;
    int per = (int)(bs / unit), nb = q->n_tokens / (int)bs;

    if (q->have && (q->unit == unit) && (q->block_size == bs) &&
        (memcmp(q->digest, digest, 16) == 0)) {
        return true;
    }
    kvf_proxy_kvidx_query_done(q);
    if (kvf_block_hash_root(digest, q->salt, q->salt_len, &root) != KVF_OK) {
        return false;
    }
    units = malloc((size_t)(nb * per + 1) * sizeof(*units));
    q->blocks = malloc((size_t)(nb + 1) * sizeof(*q->blocks));
    if ((units == NULL) || (q->blocks == NULL)) {
        free(units);
        kvf_proxy_kvidx_query_done(q);
        return false;
    }
    kvf_block_hash_chain(root, q->tokens, (int)unit, nb * per, units);
    for (int j = 0; j < nb; ++j) {
        q->blocks[j] = units[(j + 1) * per - 1];   /* block j ends unit (j+1) per */
    }
    free(units);
    memcpy(q->digest, digest, 16);
    q->unit = unit;
    q->block_size = bs;
    q->n_blocks = nb;
    q->have = true;
    return true;
}

int kvf_proxy_kvidx_cached_tokens(kvf_proxy_kvidx_h kx, int idx, kvf_proxy_kvidx_query_t *q)
{
    kvf_kx_inst_t *in;
    int m = 0, tokens;

    if ((kx == NULL) || (idx < 0) || (idx >= kx->n) || (q->n_tokens < 2)) {
        return 0;
    }
    pthread_mutex_lock(&kx->lock);
    in = &kx->inst[idx];
    if (in->has_chain && (in->set.used > 0) &&
        kvf_kx_chain(q, in->digest, in->unit, in->block_size)) {
        while ((m < q->n_blocks) && kvf_kx_has(&in->set, q->blocks[m])) {
            ++m;
        }
    }
    tokens = m * (int)in->block_size;
    pthread_mutex_unlock(&kx->lock);
    return (tokens < q->n_tokens - 1) ? tokens : q->n_tokens - 1;
}

cJSON *kvf_proxy_kvidx_json(kvf_proxy_kvidx_h kx, int idx)
{
    cJSON *o;
    kvf_kx_inst_t *in;

    if ((kx == NULL) || (idx < 0) || (idx >= kx->n)) {
        return NULL;
    }
    pthread_mutex_lock(&kx->lock);
    in = &kx->inst[idx];
    if (in->pub[0] == '\0') {
        pthread_mutex_unlock(&kx->lock);
        return NULL;
    }
    o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "endpoint", in->pub);
    cJSON_AddStringToObject(o, "replay_endpoint", in->replay);
    cJSON_AddBoolToObject(o, "subscribed", in->subscribed);
    cJSON_AddNumberToObject(o, "blocks", (double)in->set.used);
    cJSON_AddNumberToObject(o, "last_seq", (double)in->last_seq);
    cJSON_AddNumberToObject(o, "batches", (double)in->batches);
    cJSON_AddNumberToObject(o, "replays", (double)in->replays);
    cJSON_AddNumberToObject(o, "gaps", (double)in->gaps);
    cJSON_AddNumberToObject(o, "lost", (double)in->lost);
    cJSON_AddNumberToObject(o, "bad_batches", (double)in->bad);
    cJSON_AddNumberToObject(o, "blocks_not_indexed", (double)in->over);
    /* the chain the proxy computes a request's blocks with (docs/PREFIX_CACHE.md §2) */
    cJSON_AddStringToObject(o, "model_digest", in->digest_hex);
    cJSON_AddNumberToObject(o, "hash_unit", in->unit);
    cJSON_AddNumberToObject(o, "block_size", in->block_size);
    pthread_mutex_unlock(&kx->lock);
    return o;
}

/* ---- the subscriber thread ---- */

/* A batch's events, decoded outside the lock (routing reads the sets under it), applied
 * under it in one go. */
typedef struct kvf_kx_op {
    kvf_proxy_kvev_kind_t kind;
    size_t                start, n;   /* in the hashes below */
} kvf_kx_op_t;

typedef struct kvf_kx_ops {
    kvf_kx_op_t      *op;
    size_t            n_op, cap_op;
    kvf_block_hash_t *h;
    size_t            n_h, cap_h;
    bool              nomem;
} kvf_kx_ops_t;

static bool kvf_kx_grow(void **p, size_t *cap, size_t need, size_t elem)
{
    size_t c = (*cap > 0) ? *cap : 64;
    void *q;

    while (c < need) {
        c *= 2;
    }
    if (c == *cap) {
        return true;
    }
    q = realloc(*p, c * elem);
    if (q == NULL) {
        return false;
    }
    *p = q;
    *cap = c;
    return true;
}

static void kvf_kx_collect(void *ctx, kvf_proxy_kvev_kind_t kind, const kvf_block_hash_t *h,
                           size_t n)
{
    kvf_kx_ops_t *o = ctx;

    if (o->nomem || !kvf_kx_grow((void **)&o->op, &o->cap_op, o->n_op + 1, sizeof(*o->op)) ||
        !kvf_kx_grow((void **)&o->h, &o->cap_h, o->n_h + n, sizeof(*o->h))) {
        o->nomem = true;
        return;
    }
    o->op[o->n_op++] = (kvf_kx_op_t){kind, o->n_h, n};
    if (n > 0) {
        memcpy(o->h + o->n_h, h, n * sizeof(*h));
    }
    o->n_h += n;
}

/* Apply @a o to @a in's set (kx->lock held). */
static void kvf_kx_apply(kvf_kx_inst_t *in, const kvf_kx_ops_t *o)
{
    for (size_t k = 0; k < o->n_op; ++k) {
        const kvf_kx_op_t *op = &o->op[k];
        if (op->kind == KVF_PROXY_KVEV_CLEARED) {
            kvf_kx_clear(&in->set);
        }
        for (size_t i = op->start; i < op->start + op->n; ++i) {
            if ((op->kind == KVF_PROXY_KVEV_STORED) && (in->set.used >= KVF_KX_MAX_BLOCKS)) {
                in->over++;
            } else if (op->kind == KVF_PROXY_KVEV_STORED) {
                (void)kvf_kx_add(&in->set, o->h[i]);   /* no memory: a block unknown, a miss */
            } else {
                kvf_kx_del(&in->set, o->h[i]);
            }
        }
    }
}

static void kvf_kx_ask_replay(kvf_kx_inst_t *in, int64_t from)
{
    uint8_t b[8];

    for (int i = 0; i < 8; ++i) {
        b[i] = (uint8_t)((uint64_t)from >> (56 - 8 * i));
    }
    /* DEALER: the empty delimiter a REQ socket would add, then the sequence number */
    if ((zmq_send(in->rep, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) >= 0) &&
        (zmq_send(in->rep, b, 8, ZMQ_DONTWAIT) >= 0)) {
        in->replaying = true;
        in->replay_ms = (int64_t)kvf_time_now_ms();
    }
}

/* One batch @a seq of instance @a i, live (@a replayed false) or from a replay. */
static void kvf_kx_batch(struct kvf_proxy_kvidx *kx, kvf_kx_inst_t *in, int64_t seq,
                         const uint8_t *buf, size_t len, bool replayed)
{
    kvf_kx_ops_t ops = {0};
    kvf_status_t st;
    char why[160] = "";

    pthread_mutex_lock(&kx->lock);
    if (((in->last_seq >= 0) && (seq <= in->last_seq)) || (!replayed && in->replaying)) {
        pthread_mutex_unlock(&kx->lock);
        return;   /* had it; or the replay under way brings it */
    }
    if ((in->last_seq >= 0) && (seq > in->last_seq + 1)) {
        if (!replayed && (in->rep != NULL)) {
            in->gaps++;
            in->replays++;
            kvf_kx_ask_replay(in, in->last_seq + 1);
            pthread_mutex_unlock(&kx->lock);
            return;
        }
        in->lost += (uint64_t)(seq - in->last_seq - 1);   /* gone from the replay buffer */
    }
    pthread_mutex_unlock(&kx->lock);
    /* this thread alone changes the set and last_seq: decoding unlocked is safe */
    st = kvf_proxy_kvev_decode(buf, len, kvf_kx_collect, &ops, why, sizeof(why));
    if ((st == KVF_OK) && ops.nomem) {
        st = KVF_ERR_NO_MEMORY;
        snprintf(why, sizeof(why), "no memory");
    }
    pthread_mutex_lock(&kx->lock);
    if (st == KVF_OK) {
        kvf_kx_apply(in, &ops);
    } else if (in->bad++ == 0) {
        kvf_warn("KV events from %s: batch %lld not used: %s", in->pub, (long long)seq, why);
    }
    in->batches++;
    in->last_seq = seq;
    pthread_mutex_unlock(&kx->lock);
    free(ops.op);
    free(ops.h);
}

/* Up to @a max frames of one message into @a f (the rest read and dropped); the count. */
static int kvf_kx_recv(void *sock, zmq_msg_t *f, int max)
{
    int n = 0, more = 1;
    size_t ml = sizeof(more);

    while (more) {
        zmq_msg_t scratch, *m = (n < max) ? &f[n] : &scratch;
        zmq_msg_init(m);
        if (zmq_msg_recv(m, sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(m);
            break;
        }
        (void)zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &ml);
        if (n < max) {
            ++n;
        } else {
            zmq_msg_close(m);
            n = max + 1;   /* too many frames: not ours */
        }
    }
    return n;
}

static int64_t kvf_kx_seq(zmq_msg_t *m)
{
    const uint8_t *b = zmq_msg_data(m);
    uint64_t v = 0;

    for (int i = 0; i < 8; ++i) {
        v = (v << 8) | b[i];
    }
    return (int64_t)v;
}

/* Read what @a sock has: live [topic, seq, payload] or replayed [empty, seq, payload]. */
static void kvf_kx_drain(struct kvf_proxy_kvidx *kx, kvf_kx_inst_t *in, void *sock, bool replay)
{
    for (int budget = 0; budget < 256; ++budget) {
        zmq_msg_t f[3];
        int n = kvf_kx_recv(sock, f, 3);

        if (n == 0) {
            return;
        }
        if ((n == 3) && (zmq_msg_size(&f[1]) == 8)) {
            int64_t seq = kvf_kx_seq(&f[1]);
            if (replay && (seq == -1)) {
                pthread_mutex_lock(&kx->lock);
                in->replaying = false;   /* the end of the replay */
                pthread_mutex_unlock(&kx->lock);
            } else if (seq >= 0) {
                kvf_kx_batch(kx, in, seq, zmq_msg_data(&f[2]), zmq_msg_size(&f[2]), replay);
            }
        }
        for (int i = 0; i < n && i < 3; ++i) {
            zmq_msg_close(&f[i]);
        }
    }
}

static void kvf_kx_close(kvf_kx_inst_t *in)
{
    if (in->sub != NULL) {
        zmq_close(in->sub);
    }
    if (in->rep != NULL) {
        zmq_close(in->rep);
    }
    in->sub = in->rep = NULL;
}

static void *kvf_kx_socket(struct kvf_proxy_kvidx *kx, int type, const char *ep)
{
    void *s = zmq_socket(kx->zctx, type);
    int linger = 0;

    if (s == NULL) {
        return NULL;
    }
    (void)zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof(linger));
    if (type == ZMQ_SUB) {
        (void)zmq_setsockopt(s, ZMQ_SUBSCRIBE, "", 0);   /* every topic */
    }
    if (zmq_connect(s, ep) != 0) {
        kvf_warn("KV events: cannot connect to %s: %s", ep, zmq_strerror(zmq_errno()));
        zmq_close(s);
        return NULL;
    }
    return s;
}

/* (Re)subscribe instance @a in when health changed its endpoints or incarnation. */
static void kvf_kx_reopen(struct kvf_proxy_kvidx *kx, kvf_kx_inst_t *in)
{
    char pub[KVF_KX_EP_MAX], rep[KVF_KX_EP_MAX];

    pthread_mutex_lock(&kx->lock);
    if (in->open_gen == in->gen) {
        pthread_mutex_unlock(&kx->lock);
        return;
    }
    in->open_gen = in->gen;
    snprintf(pub, sizeof(pub), "%s", in->pub);
    snprintf(rep, sizeof(rep), "%s", in->replay);
    kvf_kx_clear(&in->set);   /* a new process or stream: nothing known of it yet */
    in->last_seq = -1;
    in->replaying = false;
    in->subscribed = false;
    pthread_mutex_unlock(&kx->lock);
    kvf_kx_close(in);
    if (pub[0] == '\0') {
        return;
    }
    in->sub = kvf_kx_socket(kx, ZMQ_SUB, pub);
    in->rep = (rep[0] != '\0') ? kvf_kx_socket(kx, ZMQ_DEALER, rep) : NULL;
    pthread_mutex_lock(&kx->lock);
    in->subscribed = (in->sub != NULL);
    if (in->rep != NULL) {
        in->replays++;
        kvf_kx_ask_replay(in, 0);   /* everything the publisher still keeps */
    }
    pthread_mutex_unlock(&kx->lock);
    kvf_info("KV events: subscribed to %s%s%s", pub, rep[0] ? ", replay " : "", rep);
}

static void *kvf_kx_main(void *arg)
{
    struct kvf_proxy_kvidx *kx = arg;
    zmq_pollitem_t *items = calloc((size_t)(2 * kx->n), sizeof(*items));
    int *owner = calloc((size_t)(2 * kx->n), sizeof(int));

    while ((items != NULL) && (owner != NULL) && !atomic_load(&kx->stop)) {
        int n = 0;
        int64_t now = (int64_t)kvf_time_now_ms();

        for (int i = 0; i < kx->n; ++i) {
            kvf_kx_inst_t *in = &kx->inst[i];
            kvf_kx_reopen(kx, in);
            pthread_mutex_lock(&kx->lock);
            if (in->replaying && (now - in->replay_ms > KVF_KX_REPLAY_TIMEOUT_MS)) {
                in->replaying = false;   /* unanswered: live batches go on, a gap asks again */
            }
            pthread_mutex_unlock(&kx->lock);
            if (in->sub != NULL) {
                items[n] = (zmq_pollitem_t){in->sub, 0, ZMQ_POLLIN, 0};
                owner[n++] = i;
            }
            if (in->rep != NULL) {
                items[n] = (zmq_pollitem_t){in->rep, 0, ZMQ_POLLIN, 0};
                owner[n++] = -1 - i;
            }
        }
        if (n == 0) {
            struct timespec ts = {0, KVF_KX_POLL_MS * 1000000L};
            nanosleep(&ts, NULL);
            continue;
        }
        if (zmq_poll(items, n, KVF_KX_POLL_MS) <= 0) {
            continue;
        }
        for (int k = 0; k < n; ++k) {
            if (items[k].revents & ZMQ_POLLIN) {
                int i = (owner[k] >= 0) ? owner[k] : -1 - owner[k];
                kvf_kx_drain(kx, &kx->inst[i], items[k].socket, owner[k] < 0);
            }
        }
    }
    free(items);
    free(owner);
    return NULL;
}

kvf_status_t kvf_proxy_kvidx_create(int n_instances, kvf_proxy_kvidx_h *kx_p)
{
    struct kvf_proxy_kvidx *kx = calloc(1, sizeof(*kx));

    *kx_p = NULL;
    if (kx == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    pthread_mutex_init(&kx->lock, NULL);
    kx->n = n_instances;
    kx->inst = calloc((size_t)(n_instances > 0 ? n_instances : 1), sizeof(*kx->inst));
    kx->zctx = zmq_ctx_new();
    if ((kx->inst == NULL) || (kx->zctx == NULL)) {
        kvf_proxy_kvidx_destroy(kx);
        return KVF_ERR_NO_MEMORY;
    }
    for (int i = 0; i < n_instances; ++i) {
        kx->inst[i].last_seq = -1;
    }
    if (pthread_create(&kx->thread, NULL, kvf_kx_main, kx) != 0) {
        kvf_proxy_kvidx_destroy(kx);
        return KVF_ERR_NO_MEMORY;
    }
    kx->started = true;
    *kx_p = kx;
    return KVF_OK;
}

void kvf_proxy_kvidx_destroy(kvf_proxy_kvidx_h kx)
{
    if (kx == NULL) {
        return;
    }
    if (kx->started) {
        atomic_store(&kx->stop, true);
        pthread_join(kx->thread, NULL);
    }
    for (int i = 0; (kx->inst != NULL) && (i < kx->n); ++i) {
        kvf_kx_close(&kx->inst[i]);
        kvf_kx_clear(&kx->inst[i].set);
    }
    if (kx->zctx != NULL) {
        zmq_ctx_term(kx->zctx);
    }
    free(kx->inst);
    pthread_mutex_destroy(&kx->lock);
    free(kx);
}
