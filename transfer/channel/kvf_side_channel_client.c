/*
 * ZeroMQ side channel: the client (the server is kvf_side_channel.c).
 *
 * Design: one DEALER socket per remote side channel (host, port), opened on
 * first use and kept, so a lease operation costs one message each way and
 * no connection set-up (it used to open a fresh REQ socket per operation).
 * A request is [ticket (8 bytes)] [payload]; the ROUTER server answers with
 * the same ticket, so requests to one prefill overlap and answers match
 * whatever their order. Every request lives in a table of operations with
 * its deadline; kvf_sc_progress() reads what arrived on every connection
 * and its socket monitor, and ends operations that were answered, timed
 * out, or whose connection failed. Nothing here waits on the network except
 * the synchronous wrappers (fetch, lease), which are the asynchronous calls
 * waited out with zmq_poll.
 * A connection whose monitor reports "refused before ever connected" or
 * "disconnected" fails its operations at once and is closed; the next
 * request reopens it (a restarted prefill listens again). Rejected: one REQ
 * socket per request (a connect per operation, and one in flight at a
 * time); ZMQ_REQ_CORRELATE (still one in flight per socket).
 */
#include "kvf_side_channel.h"

#include "kvf_fault.h"
#include "kvf_log.h"
#include "kvf_array.h"
#include "kvf_time.h"
#include "kvf_zmq.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KVF_SIDE_CHANNEL_MAX_CACHE 64
#define KVF_SC_MAX_CONNS           64     /* remote side channels open at once */
#define KVF_SC_MAX_OPS             4096   /* requests in flight */
#define KVF_SC_CONNECT_TIMEOUT_MS  1500   /* > the first SYN retransmission (1 s) */
/* A connect refused (or failed) is tried again by ZeroMQ after 100, 200, 400 ms;
 * the operation fails at the third failure or 800 ms after the first attempt:
 * a peer just back from a link outage gets a few hundred ms (the first SYN after
 * an outage can fail at once with EHOSTUNREACH: it queued behind an ARP entry
 * whose probes, begun while the link was down, ran out), nothing listening
 * fails well within a second. */
#define KVF_SC_CONNECT_TRIES       3
#define KVF_SC_CONNECT_GIVE_UP_MS  800

typedef struct kvf_side_channel_entry {
    char                  engine_id[KVF_ENGINE_ID_MAX];   /* "" marks a free slot */
    kvf_handshake_reply_t reply;
    uint64_t              seq;                            /* insertion order, for eviction */
} kvf_side_channel_entry_t;

typedef struct kvf_sc_conn {
    bool     in_use;
    bool     connected;       /* the monitor saw CONNECTED since open */
    char     host[64];
    int      port;
    void    *sock;            /* DEALER */
    void    *mon;             /* PAIR reading the socket's monitor */
    uint64_t used_seq;        /* LRU: a full table closes the idlest */
    uint64_t opened_ns;       /* when the connect began: tells a refusal from a timeout */
    int      failed_connects; /* CONNECT_RETRIED events before the first CONNECTED */
} kvf_sc_conn_t;

typedef enum { KVF_SC_OP_FETCH = 1, KVF_SC_OP_LEASE = 2 } kvf_sc_op_kind_t;

typedef struct kvf_sc_op {
    uint64_t         ticket;
    int              conn;
    kvf_sc_op_kind_t kind;
    kvf_status_t     status;        /* KVF_INPROGRESS until answered or failed */
    uint64_t         deadline_ns;
    uint8_t         *reply;         /* the answer's payload (malloc'd) */
    size_t           reply_len;
    char             remote[KVF_ENGINE_ID_MAX];
#if KVF_FAULT_ENABLED
    bool             replay;        /* lease.send=replay: send it again after its answer */
    kvf_handshake_request_t req;
#endif
} kvf_sc_op_t;

struct kvf_side_channel_client {
    void                    *ctx;
    char                     engine_id[KVF_ENGINE_ID_MAX];
    uint32_t                 timeout_ms;
    int                      num_entries;   /* slots in use so far (high-water mark) */
    uint64_t                 next_seq;
    /* Slots never move: a returned reply pointer stays valid until its own
     * engine is forgotten or evicted. */
    kvf_side_channel_entry_t entries[KVF_SIDE_CHANNEL_MAX_CACHE];
    kvf_handshake_reply_t    last_refusal;
    kvf_sc_conn_t            conns[KVF_SC_MAX_CONNS];
    uint64_t                 conn_seq;
    kvf_sc_op_t             *ops;
    int                      num_ops;
    int                      cap_ops;
    uint64_t                 next_ticket;
};

/* ---- one-shot exchange (raw requests, forged fault copies) ------------ */

/*
 * One more failed connect to @a endpoint (ZeroMQ retries by itself); @return
 * true, with the reason logged, when the operation should fail now.
 */
static bool kvf_sc_connect_give_up(const char *endpoint, int *failed_p, uint64_t opened_ns)
{
    uint64_t waited_ms = (kvf_time_now_ns() - opened_ns) / 1000000u;

    ++*failed_p;
    if ((*failed_p < KVF_SC_CONNECT_TRIES) && (waited_ms < KVF_SC_CONNECT_GIVE_UP_MS)) {
        kvf_debug("side channel: %s: connect failed (try %d), ZeroMQ tries again", endpoint,
                  *failed_p);
        return false;
    }
    if (waited_ms + 100u >= KVF_SC_CONNECT_TIMEOUT_MS) {
        kvf_error("side channel: %s did not answer the connection within %d ms", endpoint,
                  KVF_SC_CONNECT_TIMEOUT_MS);
    } else {
        kvf_error("side channel: %s: %d connects failed in %llu ms (refused: nothing "
                  "listens there; or unreachable: no route or no ARP answer)", endpoint,
                  *failed_p, (unsigned long long)waited_ms);
    }
    return true;
}

/*
 * One request and its reply on a fresh REQ socket, within @a timeout_ms in
 * all. A socket monitor ends the wait early when the answer cannot come: the
 * connection was refused before it was ever made (nothing listens: the
 * process is gone) -> KVF_ERR_PEER_UNREACHABLE, or the peer closed it before
 * answering (a REQ never resends) -> KVF_ERR_PEER_RESET.
 */
static kvf_status_t kvf_side_channel_exchange(void *ctx, const char *host, int port,
                                              const void *msg, size_t len, uint32_t timeout_ms,
                                              uint8_t **reply_p, size_t *reply_len_p)
{
    static atomic_uint mon_seq;
    char endpoint[128], mon_url[96];
    const kvf_zmq_opt_t opts[] = {
        {ZMQ_LINGER, 0},
        {ZMQ_SNDTIMEO, (int)timeout_ms},
        {ZMQ_MAXMSGSIZE, KVF_SIDE_CHANNEL_MAX_MSG},
    };
    const kvf_zmq_opt_t mon_opts[] = {
        {ZMQ_LINGER, 0},
    };
    uint64_t deadline = kvf_time_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    kvf_status_t status = KVF_OK;
    bool connected = false;
    int failed_connects = 0;
    uint64_t opened_ns = kvf_time_now_ns();
    void *sock, *mon = NULL;
    zmq_msg_t rep;
    int n = -1;

    status = kvf_zmq_socket_open(ctx, ZMQ_REQ, opts, sizeof(opts) / sizeof(opts[0]), &sock);
    if (status != KVF_OK) {
        return status;
    }
    snprintf(endpoint, sizeof(endpoint), "tcp://%s:%d", host, port);
    snprintf(mon_url, sizeof(mon_url), "inproc://kvf-side-mon-%p-%u", (void *)sock,
             atomic_fetch_add(&mon_seq, 1u));
    KVF_ZMQ_CHECK_GOTO(zmq_socket_monitor(sock, mon_url, ZMQ_EVENT_CONNECTED |
                                          ZMQ_EVENT_CONNECT_RETRIED | ZMQ_EVENT_DISCONNECTED),
                       status, out);
    status = kvf_zmq_socket_open(ctx, ZMQ_PAIR, mon_opts, 1, &mon);
    if (status != KVF_OK) {
        goto out;
    }
    /* the monitor's reader first: events sent before it connects are lost */
    KVF_ZMQ_CHECK_GOTO(zmq_connect(mon, mon_url), status, out);
    if (kvf_zmq_connect(sock, endpoint) != KVF_OK) {
        kvf_error("side channel: connect %s failed: %s", endpoint, zmq_strerror(zmq_errno()));
        status = KVF_ERR_ZMQ;
        goto out;
    }
    if (zmq_send(sock, msg, len, 0) < 0) {
        status = (zmq_errno() == EAGAIN) ? KVF_ERR_PEER_TIMEOUT : KVF_ERR_ZMQ;
        kvf_error("side channel: send to %s failed: %s", endpoint, zmq_strerror(zmq_errno()));
        goto out;
    }
    zmq_msg_init(&rep);
    for (;;) {
        uint64_t now = kvf_time_now_ns();
        long left_ms = (now < deadline) ? (long)((deadline - now + 999999u) / 1000000u) : 0;
        zmq_pollitem_t items[2] = {
            {.socket = sock, .events = ZMQ_POLLIN},
            {.socket = mon, .events = ZMQ_POLLIN},
        };
        int event;

        if (left_ms == 0) {
            status = KVF_ERR_PEER_TIMEOUT;
            kvf_error("side channel: no reply from %s within %u ms", endpoint, timeout_ms);
            break;
        }
        if (zmq_poll(items, 2, left_ms) < 0) {
            if (zmq_errno() == EINTR) {
                continue;
            }
            status = KVF_ERR_ZMQ;
            kvf_error("side channel: poll for %s failed: %s", endpoint,
                      zmq_strerror(zmq_errno()));
            break;
        }
        n = zmq_msg_recv(&rep, sock, ZMQ_DONTWAIT);   /* a reply wins over any event */
        if (n >= 0) {
            break;
        }
        event = (items[1].revents & ZMQ_POLLIN) ? kvf_zmq_monitor_event(mon) : -1;
        if (event == ZMQ_EVENT_CONNECTED) {
            connected = true;
        } else if ((event == ZMQ_EVENT_CONNECT_RETRIED) && !connected &&
                   kvf_sc_connect_give_up(endpoint, &failed_connects, opened_ns)) {
            status = KVF_ERR_PEER_UNREACHABLE;
            break;
        } else if (event == ZMQ_EVENT_DISCONNECTED) {
            status = KVF_ERR_PEER_RESET;
            kvf_error("side channel: %s closed the connection before answering", endpoint);
            break;
        }
    }
    if (n >= 0) {
        *reply_p = malloc((size_t)n + 1);
        if (*reply_p == NULL) {
            status = KVF_ERR_NO_MEMORY;
        } else {
            memcpy(*reply_p, zmq_msg_data(&rep), (size_t)n);
            *reply_len_p = (size_t)n;
        }
    }
    zmq_msg_close(&rep);
out:
    (void)zmq_socket_monitor(sock, NULL, 0);   /* stop the monitor before either closes */
    zmq_close(sock);
    if (mon != NULL) {
        zmq_close(mon);
    }
    return status;
}

kvf_status_t kvf_side_channel_request_raw(const char *host, int port, const void *msg,
                                          size_t len, uint32_t timeout_ms, uint8_t **reply_p,
                                          size_t *reply_len_p)
{
    void *ctx = zmq_ctx_new();
    kvf_status_t status;

    if (ctx == NULL) {
        return KVF_ERR_ZMQ;
    }
    status = kvf_side_channel_exchange(ctx, host, port, msg, len, timeout_ms, reply_p,
                                       reply_len_p);
    zmq_ctx_term(ctx);
    return status;
}

/* ---- create / destroy ------------------------------------------------- */

kvf_status_t kvf_side_channel_client_create(const char *engine_id, uint32_t timeout_ms,
                                            kvf_side_channel_client_h *client_p)
{
    kvf_side_channel_client_h c;

    if ((engine_id == NULL) || (strlen(engine_id) >= KVF_ENGINE_ID_MAX) || (timeout_ms == 0)) {
        return KVF_ERR_INVALID_PARAM;
    }
    c = calloc(1, sizeof(*c));
    if (c == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    c->ctx = zmq_ctx_new();
    if (c->ctx == NULL) {
        free(c);
        return KVF_ERR_ZMQ;
    }
    snprintf(c->engine_id, sizeof(c->engine_id), "%s", engine_id);
    c->timeout_ms = timeout_ms;
    c->next_ticket = 1;
    *client_p = c;
    return KVF_OK;
}

static void kvf_sc_conn_close(kvf_side_channel_client_h c, int i)
{
    kvf_sc_conn_t *k = &c->conns[i];

    if (!k->in_use) {
        return;
    }
    (void)zmq_socket_monitor(k->sock, NULL, 0);   /* stop the monitor before either closes */
    zmq_close(k->sock);
    zmq_close(k->mon);
    memset(k, 0, sizeof(*k));
}

static void kvf_sc_op_remove(kvf_side_channel_client_h c, int i)
{
    free(c->ops[i].reply);
    c->ops[i] = c->ops[--c->num_ops];
}

void kvf_side_channel_client_destroy(kvf_side_channel_client_h client)
{
    if (client == NULL) {
        return;
    }
    for (int i = 0; i < client->num_entries; ++i) {
        kvf_handshake_reply_cleanup(&client->entries[i].reply);
    }
    kvf_handshake_reply_cleanup(&client->last_refusal);
    while (client->num_ops > 0) {
        kvf_sc_op_remove(client, 0);
    }
    free(client->ops);
    for (int i = 0; i < KVF_SC_MAX_CONNS; ++i) {
        kvf_sc_conn_close(client, i);
    }
    zmq_ctx_term(client->ctx);
    free(client);
}

/* ---- connections -------------------------------------------------------- */


/* End every operation in flight on connection @a i with @a status and close it. */
static void kvf_sc_conn_fail(kvf_side_channel_client_h c, int i, kvf_status_t status)
{
    for (int o = 0; o < c->num_ops; ++o) {
        if ((c->ops[o].conn == i) && (c->ops[o].status == KVF_INPROGRESS)) {
            c->ops[o].status = status;
        }
    }
    kvf_sc_conn_close(c, i);
}

static kvf_status_t kvf_sc_conn_open(kvf_side_channel_client_h c, int i, const char *host,
                                     int port)
{
    static atomic_uint mon_seq;
    const kvf_zmq_opt_t opts[] = {
        {ZMQ_LINGER, 0},
        {ZMQ_MAXMSGSIZE, KVF_SIDE_CHANNEL_MAX_MSG},
        /* after a link outage a stalled connection is dropped (heartbeats) and
         * the monitor's disconnect fails its operations. The reopened one may
         * lose its first SYN (a neighbour entry still unresolved just after the
         * link returns): the connect timeout outlasts the kernel's first SYN
         * retransmission (1 s), so one lost SYN costs a second, not the request.
         * A refusal (RST: nothing listens) still fails at once. */
        {ZMQ_HEARTBEAT_IVL, 1000},
        {ZMQ_HEARTBEAT_TIMEOUT, 3000},
        {ZMQ_CONNECT_TIMEOUT, KVF_SC_CONNECT_TIMEOUT_MS},
        {ZMQ_RECONNECT_IVL_MAX, 500},
    };
    const kvf_zmq_opt_t mon_opts[] = {
        {ZMQ_LINGER, 0},
    };
    kvf_sc_conn_t *k = &c->conns[i];
    char endpoint[128], mon_url[96];
    kvf_status_t status;

    memset(k, 0, sizeof(*k));
    status = kvf_zmq_socket_open(c->ctx, ZMQ_DEALER, opts, sizeof(opts) / sizeof(opts[0]),
                                 &k->sock);
    if (status != KVF_OK) {
        return status;
    }
    snprintf(endpoint, sizeof(endpoint), "tcp://%s:%d", host, port);
    snprintf(mon_url, sizeof(mon_url), "inproc://kvf-side-conn-%p-%u", (void *)k->sock,
             atomic_fetch_add(&mon_seq, 1u));
    KVF_ZMQ_CHECK_GOTO(zmq_socket_monitor(k->sock, mon_url, ZMQ_EVENT_CONNECTED |
                                          ZMQ_EVENT_CONNECT_RETRIED | ZMQ_EVENT_DISCONNECTED),
                       status, err_sock);
    status = kvf_zmq_socket_open(c->ctx, ZMQ_PAIR, mon_opts, 1, &k->mon);
    if (status != KVF_OK) {
        goto err_monitor;
    }
    /* the monitor's reader first: events sent before it connects are lost */
    KVF_ZMQ_CHECK_GOTO(zmq_connect(k->mon, mon_url), status, err_mon);
    if (kvf_zmq_connect(k->sock, endpoint) != KVF_OK) {
        kvf_error("side channel: connect %s failed: %s", endpoint, zmq_strerror(zmq_errno()));
        status = KVF_ERR_ZMQ;
        goto err_mon;
    }
    snprintf(k->host, sizeof(k->host), "%s", host);
    k->port = port;
    k->opened_ns = kvf_time_now_ns();
    k->in_use = true;
    return KVF_OK;

err_mon:
    zmq_close(k->mon);
err_monitor:
    (void)zmq_socket_monitor(k->sock, NULL, 0);
err_sock:
    zmq_close(k->sock);
    memset(k, 0, sizeof(*k));
    return status;
}

/* The connection to @a host:@a port, opened when missing. -1 when none can be had. */
static bool kvf_sc_conn_events(kvf_side_channel_client_h c, int i);

static int kvf_sc_conn_get(kvf_side_channel_client_h c, const char *host, int port,
                           kvf_status_t *status_p)
{
    int free_slot = -1, idle = -1;

    *status_p = KVF_OK;
    if ((host == NULL) || (strlen(host) >= sizeof(c->conns[0].host)) || (port < 1) ||
        (port > 65535)) {
        *status_p = KVF_ERR_INVALID_PARAM;
        return -1;
    }
    for (int i = 0; i < KVF_SC_MAX_CONNS; ++i) {
        kvf_sc_conn_t *k = &c->conns[i];
        if (!k->in_use) {
            free_slot = (free_slot < 0) ? i : free_slot;
            continue;
        }
        if ((k->port == port) && (strcmp(k->host, host) == 0)) {
            /* a disconnect seen while idle (heartbeats across a link outage) is read
             * now, so this request goes out on a fresh connection, not the dead one */
            if (kvf_sc_conn_events(c, i)) {
                k->used_seq = ++c->conn_seq;
                return i;
            }
            free_slot = i;   /* failed and closed: reopened in its slot */
            break;
        }
        if ((idle < 0) || (k->used_seq < c->conns[idle].used_seq)) {
            idle = i;
        }
    }
    if (free_slot < 0) {
        for (int o = 0; o < c->num_ops; ++o) {
            if ((c->ops[o].conn == idle) && (c->ops[o].status == KVF_INPROGRESS)) {
                *status_p = KVF_ERR_NO_RESOURCE;   /* every connection is busy */
                return -1;
            }
        }
        kvf_sc_conn_close(c, idle);
        free_slot = idle;
    }
    *status_p = kvf_sc_conn_open(c, free_slot, host, port);
    if (*status_p != KVF_OK) {
        return -1;
    }
    c->conns[free_slot].used_seq = ++c->conn_seq;
    return free_slot;
}

/* Read connection @a i's monitor events; @return false when it failed (closed now). */
static bool kvf_sc_conn_events(kvf_side_channel_client_h c, int i)
{
    kvf_sc_conn_t *k = &c->conns[i];

    for (;;) {
        zmq_pollitem_t item = {.socket = k->mon, .events = ZMQ_POLLIN};
        int event;

        if ((zmq_poll(&item, 1, 0) <= 0) || !(item.revents & ZMQ_POLLIN)) {
            return true;
        }
        event = kvf_zmq_monitor_event(k->mon);
        if (event == ZMQ_EVENT_CONNECTED) {
            k->connected = true;
        } else if ((event == ZMQ_EVENT_CONNECT_RETRIED) && !k->connected) {
            char endpoint[96];
            snprintf(endpoint, sizeof(endpoint), "tcp://%s:%d", k->host, k->port);
            if (kvf_sc_connect_give_up(endpoint, &k->failed_connects, k->opened_ns)) {
                kvf_sc_conn_fail(c, i, KVF_ERR_PEER_UNREACHABLE);
                return false;
            }
        } else if (event == ZMQ_EVENT_DISCONNECTED) {
            kvf_error("side channel: tcp://%s:%d closed the connection", k->host, k->port);
            kvf_sc_conn_fail(c, i, KVF_ERR_PEER_RESET);
            return false;
        }
    }
}

static kvf_sc_op_t *kvf_sc_op_find(kvf_side_channel_client_h c, uint64_t ticket, int *index_p)
{
    for (int i = 0; i < c->num_ops; ++i) {
        if (c->ops[i].ticket == ticket) {
            if (index_p != NULL) {
                *index_p = i;
            }
            return &c->ops[i];
        }
    }
    return NULL;
}

/* Take every answer waiting on connection @a i (never blocks). */
static void kvf_sc_conn_read(kvf_side_channel_client_h c, int i)
{
    kvf_sc_conn_t *k = &c->conns[i];

    for (int n = 0; n < 256; ++n) {
        zmq_msg_t f[2];
        int more = 0, nf = 0;
        size_t more_len = sizeof(more);
        uint64_t ticket;
        kvf_sc_op_t *op;

        zmq_msg_init(&f[0]);
        if (zmq_msg_recv(&f[0], k->sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&f[0]);
            return;
        }
        nf = 1;
        zmq_getsockopt(k->sock, ZMQ_RCVMORE, &more, &more_len);
        while (more) {   /* [ticket][payload]; anything longer is not ours: dropped */
            zmq_msg_t *g = &f[(nf < 2) ? nf : 1];
            if (nf >= 2) {
                zmq_msg_close(g);
            }
            zmq_msg_init(g);
            if (zmq_msg_recv(g, k->sock, 0) < 0) {
                zmq_msg_close(g);
                break;
            }
            nf = (nf < 2) ? nf + 1 : 3;
            zmq_getsockopt(k->sock, ZMQ_RCVMORE, &more, &more_len);
        }
        op = NULL;
        if ((nf == 2) && (zmq_msg_size(&f[0]) == sizeof(ticket))) {
            memcpy(&ticket, zmq_msg_data(&f[0]), sizeof(ticket));
            op = kvf_sc_op_find(c, ticket, NULL);
        }
        if ((op != NULL) && (op->conn == i) && (op->status == KVF_INPROGRESS)) {
            size_t len = zmq_msg_size(&f[1]);
            op->reply = malloc(len + 1);
            op->status = (op->reply != NULL) ? KVF_OK : KVF_ERR_NO_MEMORY;
            if (op->reply != NULL) {
                memcpy(op->reply, zmq_msg_data(&f[1]), len);
                op->reply_len = len;
            }
        }
        for (int x = 0; x < ((nf < 2) ? nf : 2); ++x) {
            zmq_msg_close(&f[x]);
        }
    }
}

/* Everything that arrived, and every deadline passed; never blocks. */
static void kvf_sc_progress(kvf_side_channel_client_h c)
{
    uint64_t now = kvf_time_now_ns();

    for (int i = 0; i < KVF_SC_MAX_CONNS; ++i) {
        if (c->conns[i].in_use) {
            kvf_sc_conn_read(c, i);   /* an answer wins over an event */
            if (c->conns[i].in_use) {
                (void)kvf_sc_conn_events(c, i);
            }
        }
    }
    for (int o = 0; o < c->num_ops; ++o) {
        kvf_sc_op_t *op = &c->ops[o];
        if ((op->status == KVF_INPROGRESS) && (now >= op->deadline_ns)) {
            op->status = KVF_ERR_PEER_TIMEOUT;
            kvf_error("side channel: no answer from %s at tcp://%s:%d within %u ms",
                      op->remote, (op->conn >= 0) ? c->conns[op->conn].host : "?",
                      (op->conn >= 0) ? c->conns[op->conn].port : 0, c->timeout_ms);
        }
    }
}

bool kvf_side_channel_wait(kvf_side_channel_client_h client, int timeout_ms)
{
    zmq_pollitem_t items[2 * KVF_SC_MAX_CONNS];
    int n = 0;

    for (int i = 0; i < KVF_SC_MAX_CONNS; ++i) {
        if (client->conns[i].in_use) {
            items[n++] = (zmq_pollitem_t){.socket = client->conns[i].sock, .events = ZMQ_POLLIN};
            items[n++] = (zmq_pollitem_t){.socket = client->conns[i].mon, .events = ZMQ_POLLIN};
        }
    }
    if (n == 0) {
        return false;
    }
    return zmq_poll(items, n, (timeout_ms < 0) ? 0 : timeout_ms) > 0;
}

int kvf_side_channel_inflight(kvf_side_channel_client_h client)
{
    return client->num_ops;
}

/* ---- operations --------------------------------------------------------- */

static void kvf_sc_request_init(kvf_side_channel_client_h c, const char *remote,
                                kvf_handshake_request_t *req)
{
    memset(req, 0, sizeof(*req));
    snprintf(req->engine_id, sizeof(req->engine_id), "%s", c->engine_id);
    snprintf(req->want_engine_id, sizeof(req->want_engine_id), "%s", remote);
    req->protocol_version = KVF_XFER_PROTOCOL_VERSION;
    req->xfer_timeout_ms = c->timeout_ms;
}

/*
 * Send @a req to @a host:@a port as a new operation (*op_p); with @a drop
 * (fault builds: lease.send=drop) the operation is made but nothing is sent,
 * and it ends unanswered.
 */
static kvf_status_t kvf_sc_send(kvf_side_channel_client_h c, kvf_sc_op_kind_t kind,
                                const char *remote, const char *host, int port,
                                const kvf_handshake_request_t *req, bool drop,
                                kvf_sc_op_t **op_p)
{
    kvf_sc_op_t *op;
    uint8_t *buf = NULL;
    size_t len;
    kvf_status_t status;
    int conn;

    if ((remote == NULL) || (strlen(remote) >= KVF_ENGINE_ID_MAX)) {
        return KVF_ERR_INVALID_PARAM;
    }
    if (c->num_ops >= KVF_SC_MAX_OPS) {
        kvf_error("side channel: %d requests in flight already", c->num_ops);
        return KVF_ERR_NO_RESOURCE;
    }
    if (KVF_ARRAY_GROW(c->ops, c->cap_ops, c->num_ops + 1, 64) != KVF_OK) {
        return KVF_ERR_NO_MEMORY;
    }
    conn = kvf_sc_conn_get(c, host, port, &status);
    if (conn < 0) {
        return status;
    }
    status = kvf_handshake_request_pack(req, &buf, &len);
    if (status != KVF_OK) {
        return status;
    }
    op = &c->ops[c->num_ops];
    memset(op, 0, sizeof(*op));
    op->ticket = c->next_ticket++;
    op->conn = conn;
    op->kind = kind;
    op->status = KVF_INPROGRESS;
    op->deadline_ns = kvf_time_now_ns() + (uint64_t)c->timeout_ms * 1000000ull;
    snprintf(op->remote, sizeof(op->remote), "%s", remote);
    if (drop) {
        op->status = KVF_ERR_PEER_TIMEOUT;
    } else if ((zmq_send(c->conns[conn].sock, &op->ticket, sizeof(op->ticket),
                         ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) ||
        (zmq_send(c->conns[conn].sock, buf, len, ZMQ_DONTWAIT) < 0)) {
        /* the queue to that peer is full (it stopped reading): as unanswered */
        kvf_error("side channel: cannot queue a request to tcp://%s:%d: %s", host, port,
                  zmq_strerror(zmq_errno()));
        op->status = KVF_ERR_PEER_TIMEOUT;
    }
    free(buf);
    c->num_ops++;
    *op_p = op;
    return KVF_OK;
}

kvf_status_t kvf_side_channel_fetch_start(kvf_side_channel_client_h client,
                                          const char *remote_engine_id, const char *host,
                                          int port, uint64_t *ticket_p)
{
    kvf_handshake_request_t req;
    kvf_sc_op_t *op;
    kvf_status_t status;

    kvf_sc_request_init(client, (remote_engine_id != NULL) ? remote_engine_id : "", &req);
    status = kvf_sc_send(client, KVF_SC_OP_FETCH, remote_engine_id, host, port, &req, false,
                         &op);
    if (status == KVF_OK) {
        *ticket_p = op->ticket;
    }
    return status;
}

/* The ended operation @a ticket of @a kind: KVF_INPROGRESS, or its status with its payload. */
static kvf_status_t kvf_sc_take(kvf_side_channel_client_h c, uint64_t ticket,
                                kvf_sc_op_kind_t kind, kvf_sc_op_t *done_p)
{
    kvf_sc_op_t *op;
    int i;

    kvf_sc_progress(c);
    op = kvf_sc_op_find(c, ticket, &i);
    if ((op == NULL) || (op->kind != kind)) {
        return KVF_ERR_NOT_FOUND;
    }
    if (op->status == KVF_INPROGRESS) {
        return KVF_INPROGRESS;
    }
    *done_p = *op;
    op->reply = NULL;   /* moved */
    kvf_sc_op_remove(c, i);
    return done_p->status;
}

kvf_status_t kvf_side_channel_fetch_poll(kvf_side_channel_client_h client, uint64_t ticket,
                                         kvf_handshake_reply_t *reply_p)
{
    kvf_sc_op_t done;
    kvf_status_t status;

    memset(reply_p, 0, sizeof(*reply_p));
    status = kvf_sc_take(client, ticket, KVF_SC_OP_FETCH, &done);
    if (status != KVF_OK) {
        return status;
    }
    status = kvf_handshake_reply_unpack(done.reply, done.reply_len, reply_p);
    free(done.reply);
    if (status != KVF_OK) {
        kvf_error("side channel: malformed handshake reply from %s", done.remote);
        return status;
    }
    if (!reply_p->accepted) {
        return KVF_ERR_REFUSED;
    }
    if (strcmp(reply_p->engine_id, done.remote) != 0) {
        kvf_error("side channel: the side channel of %s answered as engine '%s'", done.remote,
                  reply_p->engine_id);
        kvf_handshake_reply_cleanup(reply_p);
        return KVF_ERR_PARSE;
    }
    return KVF_OK;
}

void kvf_side_channel_cancel(kvf_side_channel_client_h client, uint64_t ticket)
{
    int i;

    if (kvf_sc_op_find(client, ticket, &i) != NULL) {
        kvf_sc_op_remove(client, i);
    }
}

/* Wait out operation @a ticket (the synchronous calls). */
static void kvf_sc_wait_for(kvf_side_channel_client_h c, uint64_t ticket)
{
    for (;;) {
        kvf_sc_op_t *op;
        uint64_t now;

        kvf_sc_progress(c);
        op = kvf_sc_op_find(c, ticket, NULL);
        if ((op == NULL) || (op->status != KVF_INPROGRESS)) {
            return;
        }
        now = kvf_time_now_ns();
        (void)kvf_side_channel_wait(c, (op->deadline_ns > now) ?
                                    (int)((op->deadline_ns - now) / 1000000ull) + 1 : 0);
    }
}

/* Keep @a reply (accepted, from @a remote_engine_id) in the cache; @return its slot. */
static const kvf_handshake_reply_t *kvf_sc_cache_put(kvf_side_channel_client_h client,
                                                     const char *remote_engine_id,
                                                     kvf_handshake_reply_t *reply)
{
    kvf_side_channel_entry_t *e = NULL;

    for (int i = 0; i < client->num_entries; ++i) {      /* a forgotten slot */
        if (client->entries[i].engine_id[0] == '\0') {
            e = &client->entries[i];
            break;
        }
    }
    if ((e == NULL) && (client->num_entries < KVF_SIDE_CHANNEL_MAX_CACHE)) {
        e = &client->entries[client->num_entries++];
    }
    if (e == NULL) {
        /* full: evict the oldest; only callers holding ITS pointer must re-fetch */
        e = &client->entries[0];
        for (int i = 1; i < client->num_entries; ++i) {
            if (client->entries[i].seq < e->seq) {
                e = &client->entries[i];
            }
        }
        kvf_handshake_reply_cleanup(&e->reply);
    }
    e->seq = client->next_seq++;
    snprintf(e->engine_id, sizeof(e->engine_id), "%s", remote_engine_id);
    e->reply = *reply;
    memset(reply, 0, sizeof(*reply));   /* moved */
    return &e->reply;
}

kvf_status_t kvf_side_channel_fetch(kvf_side_channel_client_h client,
                                    const char *remote_engine_id, const char *host, int port,
                                    const kvf_handshake_reply_t **reply_p)
{
    kvf_handshake_reply_t reply;
    kvf_status_t status;
    uint64_t ticket;

    for (int i = 0; i < client->num_entries; ++i) {
        if ((client->entries[i].engine_id[0] != '\0') &&
            (strcmp(client->entries[i].engine_id, remote_engine_id) == 0)) {
            *reply_p = &client->entries[i].reply;
            return KVF_OK;
        }
    }
    status = kvf_side_channel_fetch_start(client, remote_engine_id, host, port, &ticket);
    if (status != KVF_OK) {
        return status;
    }
    kvf_sc_wait_for(client, ticket);
    status = kvf_side_channel_fetch_poll(client, ticket, &reply);
    if (status == KVF_ERR_REFUSED) {
        kvf_handshake_reply_cleanup(&client->last_refusal);
        client->last_refusal = reply;
        *reply_p = &client->last_refusal;
        return KVF_ERR_REFUSED;
    }
    if (status != KVF_OK) {
        return status;
    }
    *reply_p = kvf_sc_cache_put(client, remote_engine_id, &reply);
    return KVF_OK;
}

#if KVF_FAULT_ENABLED
typedef enum { KVF_SC_FORGE_NONCE, KVF_SC_FORGE_ENGINE, KVF_SC_FORGE_REPLAY } kvf_sc_forge_t;

/*
 * Fault point lease.send: send a copy of release @a real with a wrong
 * nonce, naming another decode engine, or unchanged (a replay after the real
 * one was answered), and log the answer prefill gave it. Test builds only:
 * it waits for that answer (a fresh one-shot exchange).
 */
static void kvf_side_channel_forge(kvf_side_channel_client_h client,
                                   const kvf_handshake_request_t *real, const char *host,
                                   int port, kvf_sc_forge_t how)
{
    static const char *const what[] = {"with a wrong nonce", "naming another engine",
                                       "replayed"};
    kvf_handshake_request_t req = *real;
    kvf_lease_answer_t answer;
    char from[KVF_ENGINE_ID_MAX];
    uint8_t *buf = NULL, *rep = NULL;
    size_t len, rep_len = 0;

    if (how == KVF_SC_FORGE_NONCE) {
        req.lease.nonce ^= 0x5a5a5a5a5a5a5a5aull;
    } else if (how == KVF_SC_FORGE_ENGINE) {
        snprintf(req.engine_id, sizeof(req.engine_id), "forged-%.*s",
                 (int)sizeof(req.engine_id) - 8, real->engine_id);
    }
    if (kvf_handshake_request_pack(&req, &buf, &len) != KVF_OK) {
        return;
    }
    if ((kvf_side_channel_exchange(client->ctx, host, port, buf, len, client->timeout_ms,
                                   &rep, &rep_len) == KVF_OK) &&
        (kvf_lease_reply_unpack(rep, rep_len, from, &answer) == KVF_OK)) {
        kvf_warn("side channel: fault lease.send: release of %s %s answered %s: %s",
                 req.lease.request_id, what[how], (answer.verdict == KVF_LEASE_VALID) ? "valid" :
                 (answer.verdict == KVF_LEASE_EXPIRED) ? "expired" : "refused", answer.why);
    } else {
        kvf_warn("side channel: fault lease.send: release of %s %s got no answer",
                 req.lease.request_id, what[how]);
    }
    free(rep);
    free(buf);
}
#endif

kvf_status_t kvf_side_channel_lease_start(kvf_side_channel_client_h client,
                                          const char *remote_engine_id, const char *host,
                                          int port, const kvf_lease_msg_t *msg,
                                          uint64_t *ticket_p)
{
    kvf_handshake_request_t req;
    kvf_sc_op_t *op;
    kvf_status_t status;
#if KVF_FAULT_ENABLED
    kvf_fault_action_t fault = KVF_FAULT_NONE;
#endif

    kvf_sc_request_init(client, (remote_engine_id != NULL) ? remote_engine_id : "", &req);
    req.has_lease = true;
    req.lease = *msg;
#if KVF_FAULT_ENABLED
    if (msg->op == KVF_LEASE_OP_RELEASE) {
        fault = KVF_FAULT(LEASE_SEND);
        if (fault == KVF_FAULT_CORRUPT) {
            kvf_side_channel_forge(client, &req, host, port, KVF_SC_FORGE_NONCE);
            kvf_side_channel_forge(client, &req, host, port, KVF_SC_FORGE_ENGINE);
        }
    }
#endif
#if KVF_FAULT_ENABLED
    if (fault == KVF_FAULT_DROP) {
        kvf_warn("side channel: fault lease.send: release of %s not sent", msg->request_id);
    }
    status = kvf_sc_send(client, KVF_SC_OP_LEASE, remote_engine_id, host, port, &req,
                         fault == KVF_FAULT_DROP, &op);
#else
    status = kvf_sc_send(client, KVF_SC_OP_LEASE, remote_engine_id, host, port, &req, false,
                         &op);
#endif
    if (status != KVF_OK) {
        return status;
    }
#if KVF_FAULT_ENABLED
    op->replay = (fault == KVF_FAULT_REPLAY);
    op->req = req;
    op->req.lease.num_digests = 0;   /* the caller's memory: not kept */
    op->req.lease.digests = NULL;
#endif
    *ticket_p = op->ticket;
    return KVF_OK;
}

kvf_status_t kvf_side_channel_lease_poll(kvf_side_channel_client_h client, uint64_t ticket,
                                         kvf_lease_answer_t *answer_p)
{
    char from[KVF_ENGINE_ID_MAX];
    kvf_sc_op_t done;
    kvf_status_t status;

    memset(answer_p, 0, sizeof(*answer_p));
    status = kvf_sc_take(client, ticket, KVF_SC_OP_LEASE, &done);
    if (status != KVF_OK) {
        return status;
    }
    status = kvf_lease_reply_unpack(done.reply, done.reply_len, from, answer_p);
    free(done.reply);
    if (status != KVF_OK) {
        kvf_error("side channel: malformed lease answer from %s", done.remote);
        return status;
    }
    if (strcmp(from, done.remote) != 0) {
        kvf_error("side channel: the side channel of %s answered the lease as engine '%s'",
                  done.remote, from);
        return KVF_ERR_PARSE;
    }
#if KVF_FAULT_ENABLED
    if (done.replay && (done.conn >= 0)) {
        kvf_side_channel_forge(client, &done.req, client->conns[done.conn].host,
                               client->conns[done.conn].port, KVF_SC_FORGE_REPLAY);
    }
#endif
    return KVF_OK;
}

kvf_status_t kvf_side_channel_lease(kvf_side_channel_client_h client,
                                    const char *remote_engine_id, const char *host, int port,
                                    const kvf_lease_msg_t *msg, kvf_lease_answer_t *answer_p)
{
    uint64_t ticket;
    kvf_status_t status;

    status = kvf_side_channel_lease_start(client, remote_engine_id, host, port, msg, &ticket);
    if (status != KVF_OK) {
        return status;
    }
    kvf_sc_wait_for(client, ticket);
    return kvf_side_channel_lease_poll(client, ticket, answer_p);
}

void kvf_side_channel_forget(kvf_side_channel_client_h client, const char *remote_engine_id)
{
    for (int i = 0; i < client->num_entries; ++i) {
        if ((client->entries[i].engine_id[0] != '\0') &&
            (strcmp(client->entries[i].engine_id, remote_engine_id) == 0)) {
            kvf_handshake_reply_cleanup(&client->entries[i].reply);
            client->entries[i].engine_id[0] = '\0';   /* free; other slots stay put */
            return;
        }
    }
}
