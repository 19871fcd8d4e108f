/*
 * Internal to the kvf-proxy pool (kvf_proxy_pool.c instance table,
 * kvf_proxy_io.c I/O thread, kvf_proxy_mailbox.c calls, kvf_proxy_pair.c pair
 * checks, kvf_proxy_health.c /health and /metrics, kvf_proxy_route.c choice):
 * the shared structures and the functions one file calls in another.
 *
 * Locking: pool->lock guards every field marked "under pool->lock" and every
 * call's mailbox; the I/O thread alone touches the sockets.
 */
#ifndef KVF_PROXY_POOL_INT_H
#define KVF_PROXY_POOL_INT_H

#include "kvf_proxy_kvidx.h"
#include "kvf_proxy_pool.h"
#include "kvf_time.h"

#include <pthread.h>
#include <stdatomic.h>

#define KVF_PROXY_HEALTH_ID "health"
#define KVF_PROXY_CHECK_PREFIX "check-peer:"   /* + prefill index ":" incarnation (hex) */
#define KVF_PROXY_CHECK_RETRY_MS 1000          /* after a check that neither passed nor refused */

typedef enum {
    KVF_PROXY_PAIR_UNCHECKED = 0,
    KVF_PROXY_PAIR_CHECKING,
    KVF_PROXY_PAIR_COMPATIBLE,
    KVF_PROXY_PAIR_REFUSED,
} kvf_proxy_pair_state_t;

/* One (prefill, decode) pairing, under pool->lock. */
typedef struct kvf_proxy_pair {
    kvf_proxy_pair_state_t state;
    uint64_t               prefill_incarnation;   /* what the verdict is about */
    uint64_t               decode_incarnation;
    int64_t                sent_ms;
    int64_t                retry_ms;              /* no new check before this */
    char                   error[320];
} kvf_proxy_pair_t;

typedef struct kvf_proxy_msg {
    struct kvf_proxy_msg *next;
    kvf_proxy_role_t      role;
    int                   idx;
    char                  request_id[128];   /* "" for fire-and-forget (abort) */
    size_t                len;
    uint8_t               data[];
} kvf_proxy_msg_t;

typedef struct kvf_proxy_reply_node {
    struct kvf_proxy_reply_node *next;
    Kvf__ServeReply             *reply;
} kvf_proxy_reply_node_t;

/* Buckets of the calls' hash by (role, instance, request id): a reply finds its
 * call in O(1) however many are open (kvf_proxy_call_find). A power of two. */
#define KVF_PROXY_CALL_BUCKETS 1024u

struct kvf_proxy_call {
    struct kvf_proxy_call  *next;
    struct kvf_proxy_call  *hnext;          /* in pool->buckets[hash] */
    unsigned                bucket;
    struct kvf_proxy_pool  *pool;
    kvf_proxy_role_t        role;
    int                     idx;
    char                    request_id[128];
    kvf_proxy_reply_node_t *head;
    kvf_proxy_reply_node_t *tail;
    kvf_status_t            failed;
    char                    fail_msg[512];
    int64_t                 sent_epoch;   /* instance's epoch when its request left; -1: not yet */
    pthread_cond_t          cond;
    kvf_proxy_call_notify_t notify;       /* kvf_proxy_call_set_notify(); NULL: none */
    void                   *notify_arg;
    bool                    load_open;    /* counted in its instance's outstanding load */
    uint32_t                load_tokens;  /* prompt tokens counted (PrefillRequest) */
    int64_t                 load_start_ms;      /* registered then */
    double                  load_predicted_ms;  /* wait predicted then; -1: no rate */
};

typedef struct kvf_proxy_instance {
    kvf_proxy_role_t role;
    int              idx;
    char             url[KVF_PROXY_URL_MAX];
    void            *sock;              /* I/O thread only */
    void            *mon;               /* I/O thread only */
    /* under pool->lock */
    kvf_proxy_instance_info_t info;
    int64_t          probe_sent_ms;     /* 0: no probe outstanding */
    int64_t          last_ok_ms;        /* 0: never */
    int64_t          lost_ms;           /* connection lost then; its calls fail after the
                                         * grace below; 0: none pending */
    int64_t          epoch;             /* connections lost so far: a call sent in an older
                                         * epoch went to a connection that is gone */
    uint64_t         rate_tokens;       /* prefill counters at the last rate sample */
    double           rate_seconds;
    int64_t          rate_ms;           /* the proxy's clock then */
    bool             rate_busy;         /* it reported queued prompt work then */
    bool             rate_base;         /* the four above are set */
    /* DNS (kvf_proxy_resolve.c): url's host name, resolved at every health round */
    char             host[KVF_PROXY_URL_MAX]; /* "": url is an address, used as is */
    char             port[8];
    char             addr[KVF_PROXY_URL_MAX]; /* I/O thread: what sock is connected to; "" none */
    char             want[KVF_PROXY_URL_MAX]; /* I/O thread: the resolver's latest answer */
    unsigned         sock_gen;          /* I/O thread: sockets opened (monitor names) */
} kvf_proxy_instance_t;

/*
 * ZeroMQ reports a disconnect (monitor event) before it has handed the
 * socket the last messages that arrived with the close, so calls of a lost
 * connection fail this long after the event, once those replies (a drained
 * daemon's last answers) were delivered.
 */
#define KVF_PROXY_LOST_GRACE_MS 200

struct kvf_proxy_pool {
    pthread_mutex_t      lock;
    kvf_proxy_instance_t inst[KVF_PROXY_ROLE_COUNT][KVF_PROXY_MAX_INSTANCES];
    int                  count[KVF_PROXY_ROLE_COUNT];
    unsigned             rr[KVF_PROXY_ROLE_COUNT];
    struct kvf_proxy_call *calls;
    struct kvf_proxy_call *buckets[KVF_PROXY_CALL_BUCKETS];   /* the same calls, hashed */
    kvf_proxy_msg_t     *sendq_head;
    kvf_proxy_msg_t     *sendq_tail;
    int                  efd;
    void                *zctx;
    pthread_t            thread;
    bool                 thread_started;
    atomic_bool          stop;
    int64_t              interval_ms;
    int64_t              timeout_ms;
    kvf_proxy_pair_t    *pairs;          /* [prefill][decode], count[0] x count[1] */
    int                  max_outstanding;   /* per instance, > 0 */
    /* tokenizer check (kvf_proxy_tokcheck.c) */
    char                 tok_digest[24];     /* "": none yet; KVF_PROXY_TOK_BYTES: byte ids */
    char                 tok_source[320];    /* "--model DIR", "the daemons' DIR", or why none */
    char                 tok_tried[256];     /* last model folder adopt() failed on */
    kvf_status_t       (*adopt)(void *ctx, const char *path, const char *digest, char *why,
                                size_t cap);
    void                *adopt_ctx;
    /* names (kvf_proxy_resolve.c): NULL when every endpoint is an address */
    struct kvf_proxy_resolver *resolver;
    unsigned             dns_gen;           /* I/O thread: the resolver's answers applied */
    /* --routing prefix: each role's instances' cached blocks (kvf_proxy_kvidx.h, one index
     * and thread per role, indexed by the role's instance index); NULL: that role is routed
     * by load alone */
    kvf_proxy_kvidx_h    kvidx[KVF_PROXY_ROLE_COUNT];
    double               prefix_weight;     /* --prefix-routing-weight */
    double               decode_prefix_weight;   /* --decode-prefix-routing-weight */
};

#define KVF_PROXY_TOK_BYTES "bytes"

/*
 * Check an instance's health reply @a h against this proxy's tokenizer, adopting
 * the instance's model folder first when the proxy has none. Pool locked.
 * @return true when it may serve; false with the reason in @a why (the caller
 *         marks the instance unhealthy with it).
 */
bool kvf_proxy_tok_check_locked(struct kvf_proxy_pool *pool, kvf_proxy_instance_t *inst,
                                const Kvf__HealthReply *h, char *why, size_t cap);

/* Pair (prefill @a p, decode @a d); pool->pairs must not be NULL. */
static inline kvf_proxy_pair_t *kvf_proxy_pair(struct kvf_proxy_pool *pool, int p, int d)
{
    return &pool->pairs[(size_t)p * (size_t)pool->count[KVF_PROXY_ROLE_DECODE] + (size_t)d];
}

/* New requests may go to @a info's instance: healthy and not draining. */
static inline bool kvf_proxy_routable(const kvf_proxy_instance_info_t *info)
{
    return info->healthy && !info->draining;
}

/* ---- kvf_proxy_pair.c (I/O thread) ---- */
const char *kvf_proxy_pair_state_str(kvf_proxy_pair_state_t s);
/* A decode instance's answer to a CheckPeerRequest (request id KVF_PROXY_CHECK_PREFIX...). */
void kvf_proxy_io_check_reply(struct kvf_proxy_pool *pool, kvf_proxy_instance_t *inst,
                              const Kvf__ServeReply *r);
/* Start a check for every healthy pair without a current verdict. */
void kvf_proxy_io_check_pairs(struct kvf_proxy_pool *pool, int64_t now);

/* ---- kvf_proxy_mailbox.c (pool->lock held where named _locked) ---- */
struct kvf_proxy_call *kvf_proxy_call_find(struct kvf_proxy_pool *pool, kvf_proxy_role_t role,
                                           int idx, const char *request_id);
void kvf_proxy_call_fail_locked(struct kvf_proxy_call *c, kvf_status_t status, const char *msg);
/* Fail the calls of @a inst sent before its connection was last lost. */
void kvf_proxy_inst_fail_calls_locked(struct kvf_proxy_pool *pool, kvf_proxy_instance_t *inst,
                                      kvf_status_t status, const char *msg);
/* Append reply @a r (ownership taken on true) to the mailbox of its call. */
bool kvf_proxy_call_deliver_locked(struct kvf_proxy_pool *pool, kvf_proxy_instance_t *inst,
                                   Kvf__ServeReply *r);

/* Close @a c's share of its instance's outstanding load, if still open. */
void kvf_proxy_call_unload_locked(struct kvf_proxy_call *c);

/* ---- kvf_proxy_route.c ---- */
/* A health reply's load fields into @a inst: queue, recent prefill rate (EWMA). */
void kvf_proxy_route_on_health_locked(kvf_proxy_instance_t *inst, const Kvf__HealthReply *h);
/* Prefill call @a c is being registered on @a inst: its predicted wait. */
void kvf_proxy_route_on_send_locked(kvf_proxy_instance_t *inst, struct kvf_proxy_call *c);
/* Prefill call @a c was answered with its first token: calibrate the predictions. */
void kvf_proxy_route_on_answer_locked(kvf_proxy_instance_t *inst, const struct kvf_proxy_call *c);

/* ---- kvf_proxy_io.c ---- */
/* Open @a inst's DEALER and its monitor, connected to @a endpoint (NULL: not yet, a name
 * not resolved). KVF_OK; KVF_ERR_ZMQ; KVF_ERR_INVALID_PARAM when ZeroMQ refuses it. */
kvf_status_t kvf_proxy_inst_open(struct kvf_proxy_pool *pool, kvf_proxy_instance_t *inst,
                                 const char *endpoint);
void kvf_proxy_inst_close(kvf_proxy_instance_t *inst);
/* Mark @a inst unhealthy with reason @a why (logged when it was healthy). Pool locked. */
void kvf_proxy_inst_unhealthy_locked(kvf_proxy_instance_t *inst, const char *why);
/* The I/O thread's body; @a arg is the pool; returns when pool->stop is set. */
void *kvf_proxy_io_main(void *arg);

/* ---- kvf_proxy_resolve.c ---- */
/*
 * The host and port of endpoint @a url to resolve: "tcp://NAME:PORT" gives NAME and PORT;
 * an IPv4 address, "tcp://[v6]:PORT", ZeroMQ's "tcp://src;host:port" and non-tcp
 * endpoints give host "" (used as they are). KVF_OK; KVF_ERR_INVALID_PARAM (logged,
 * naming @a url) for a tcp endpoint without a port in [1, 65535] or with a character
 * no host name has.
 */
kvf_status_t kvf_proxy_endpoint_split(const char *url, char *host, size_t host_cap,
                                      char *port, size_t port_cap);
/* Start the resolver thread when an instance has a host name (pool->resolver set);
 * KVF_OK with none to resolve. Call before the I/O thread starts. */
kvf_status_t kvf_proxy_resolver_start(struct kvf_proxy_pool *pool);
/* Stop it (never waits on a getaddrinfo() in progress). NULL resolver: no-op. */
void kvf_proxy_resolver_stop(struct kvf_proxy_pool *pool);
/* I/O thread: take the resolver's new answers; connect the instances whose name has a new
 * address. True when a socket was replaced (the poll set must be rebuilt). */
bool kvf_proxy_io_apply_dns(struct kvf_proxy_pool *pool);

#endif
