/*
 * Inside the UCX connector (transfer/ucx/kvf_connector_ucx.c: instance,
 * pools, pulls; kvf_connector_ucx_peer.c: remote engines, handshakes and
 * lease operations): the state both files share. Not for other users.
 */
#ifndef KVF_CONNECTOR_UCX_INT_H
#define KVF_CONNECTOR_UCX_INT_H

#include "kvf_connector_ucx.h"

#include "kvf_contract.h"
#include "kvf_side_channel.h"
#include "kvf_ucx_agent.h"
#include "kvf_xfer_plan.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#define KVF_CONN_MAX_ENGINES 16

/*
 * Endpoints to an engine that carried no pull for this long are closed and
 * connected afresh before the next pull (docs/FAILURES.md, link outages): an
 * endpoint that sent anything (UCX keepalives) while a link was down waits
 * out TCP's retransmission back-off, as long as the outage, when the link
 * returns. One that carried a pull within this bound saw the link up then,
 * so any outage since was shorter and so is its stall.
 */
#define KVF_CONN_EP_IDLE_MS 2000

typedef struct kvf_conn_engine {
    char                         engine_id[KVF_ENGINE_ID_MAX];
    kvf_rank_meta_t             *ranks;        /* [tp], our own copy: the side-channel
                                                * client's cache moves entries on forget */
    int                          tp;
    kvf_rank_geometry_t         *geoms;        /* [tp], recomputed by the compat check */
    int64_t                     *num_blocks;   /* [tp] */
    /* [conn->tp]: each decode rank's page pieces from this engine (kvf_xfer_pieces_t),
     * built by the rank's thread at its first pull and reused by every later plan */
    kvf_xfer_pieces_t          **pieces;
    bool                         forgotten;    /* slot free for the next handshake */
    uint64_t                     gen;          /* which engine holds the slot (per fill) */
    int                          inflight;     /* pulls started, not yet finished */
    uint64_t                     last_used;    /* LRU stamp: handshake hit or start_pull */
    /* the cache key beside engine_id (kvf_connector_peer_t): where its side
     * channel was reached and which process answered */
    char                         host[64];
    int                          port;
    uint64_t                     incarnation;
} kvf_conn_engine_t;

/* A handshake sent and not yet polled to its end (leader only). */
typedef struct kvf_conn_hs {
    uint64_t ticket;
    char     engine_id[KVF_ENGINE_ID_MAX];
    char     host[64];
    int      port;
    uint64_t incarnation;
} kvf_conn_hs_t;

#define KVF_CONN_MAX_HS 64   /* handshakes in flight */

typedef struct kvf_conn_rank {
    kvf_thread_owner_t  owner;          /* the thread that drives this rank (first op) */
    bool                registered;
    kvf_ucx_agent_h     agent;
    int                 region;
    uint8_t            *base;
    size_t              len;
    int64_t             num_blocks;
    kvf_rank_geometry_t geom;
    kvf_rank_meta_t    *meta;
    kvf_ucx_peer_h     *peers[KVF_CONN_MAX_ENGINES];   /* [engine][remote tp], lazily */
    int                 peers_tp[KVF_CONN_MAX_ENGINES];  /* length of peers[e] */
    uint64_t            peers_gen[KVF_CONN_MAX_ENGINES]; /* engine gen peers[e] belong to */
    /* pulls of this rank from engine e in flight, and when one last started or
     * ended: endpoints idle past KVF_CONN_EP_IDLE_MS are reconnected first */
    int                 peers_busy[KVF_CONN_MAX_ENGINES];
    uint64_t            peers_used_ns[KVF_CONN_MAX_ENGINES];
    uint64_t            reconnects;     /* idle endpoint sets replaced (stats, tests) */
    kvf_device_t        device;         /* where the pool lives; CUDA: with a stream of
                                         * its own for the zeroing (kvf_conn_pool_stream) */
    struct kvf_conn_ipc_rank *ipc;      /* the same-node path's state (kvf_connector_ipc.c) */
} kvf_conn_rank_t;

struct kvf_connector {
    kvf_thread_owner_t    leader;              /* the thread that called create */
    char                  engine_id[KVF_ENGINE_ID_MAX];
    kvf_connector_role_t  role;
    int                   tp;
    uint32_t              timeout_ms;
    uint32_t              batch_descs;         /* 0: a whole rank's list per batch */
    uint32_t              plan_flags;
    char                  host[64];
    int                   port;
    kvf_model_config_t    cfg;
    kvf_cache_layout_t   *layout;
    uint64_t              incarnation;         /* random, non-zero, per create */
    kvf_model_digest_t    model_digest;        /* advertised; hex "" = none */
    kvf_conn_rank_t      *ranks;               /* [tp] */

    pthread_mutex_t       lock;                /* engines, registered flags; never held
                                                * across a network call */
    kvf_side_channel_client_h client;          /* leader only (handshake, lease, forget) */
    kvf_conn_hs_t         hs[KVF_CONN_MAX_HS];  /* leader only: handshakes in flight */
    int                   num_hs;
    kvf_side_channel_server_h server;
    int                   num_engines;
    kvf_conn_engine_t     engines[KVF_CONN_MAX_ENGINES];
    uint64_t              engine_gen;          /* last gen handed to a slot */
    uint64_t              use_seq;             /* LRU clock */
    kvf_connector_lease_func_t lease_func;     /* prefill: set before serve */
    void                 *lease_arg;
    bool                  progress_thread;     /* config: one per rank from serve on */
    atomic_bool           progress_stop;
    pthread_t            *progress;            /* [tp] while running */
    kvf_connector_path_t  path;                /* config path (kvf_connector_ipc.c) */
};

struct kvf_connector_req {
    int              rank;
    int              engine;
    kvf_xfer_plan_t *plan;
    kvf_ucx_batch_h *batches;       /* [plan->num_ranks] */
    size_t          *posted;        /* [plan->num_ranks]: descriptors posted so far */
    int              nsrc;
    int             *src;           /* prefill ranks read (each gets a release) */
    kvf_status_t     status;        /* KVF_INPROGRESS until final */
    uint64_t         deadline_ns;
    uint64_t         posted_ns, landed_ns, done_ns;   /* kvf_connector_stats_t */
    uint64_t         started_ns, planned_ns;          /* likewise */
    size_t          *zero_off, *zero_len;            /* [plan->num_zero], for the device */
    bool             holds_engine;  /* counted in its engine's inflight */
    bool             holds_peers;   /* counted in its rank's peers_busy[engine] */
    char             request_id[KVF_ENGINE_ID_MAX];
    kvf_kv_digest_t *digests;       /* [plan->num_ranks] once req_digests ran */
    bool             ipc;           /* moved by one gather (kvf_connector_ipc.c), not GETs */
    void            *ipc_event;     /* its completion event on the pool's stream */
    uint64_t         ipc_ops;       /* ops of that gather */
    int              ipc_slot;      /* its staging buffers: slot + 1; 0 none */
    size_t           ipc_jobs;      /* > 0: the template path's jobs (in its slot), no plan */
    struct kvf_connector_pull *pull_copy;   /* that path: the pull's ids, for a plan built
                                             * only when asked for (kvf_conn_req_plan) */
};

/* The thread rules of kvf_connector.h, checked in debug builds: a rank's ops
 * run on the thread that first drove the rank; instance ops on the leader;
 * ops that touch every rank's worker on a leader that drives every rank. */
#define KVF_CONN_CHECK_LEADER(_conn, _op) \
    KVF_OWNER_CHECK(&(_conn)->leader, "connector " _op " (leader thread only)")
#define KVF_CONN_CHECK_RANK(_conn, _r, _op) \
    KVF_OWNER_CHECK(&(_conn)->ranks[_r].owner, "connector " _op " (the rank's own thread only)")


/* Debug builds: every registered rank is driven by the calling thread. */
void kvf_conn_check_every_rank(kvf_connector_h conn, const char *op);

/* Every rank registered its pool (takes the lock). */
bool kvf_conn_all_registered(kvf_connector_h conn);

/*
 * Slot of a handshaken engine, -1 when none (caller holds the lock). With
 * @a host NULL the engine id alone matches (the synchronous handshake);
 * otherwise host, port and (when non-zero) incarnation must match too.
 */
int kvf_conn_find_engine_locked(kvf_connector_h conn, const char *engine_id, const char *host,
                                int port, uint64_t incarnation);

/* The ops of kvf_connector_ucx_peer.c, for the table in kvf_connector_ucx.c. */
kvf_status_t kvf_conn_handshake(kvf_connector_h conn, const char *engine_id, const char *host,
                                int port, char *why, size_t why_len);
kvf_status_t kvf_conn_handshake_start(kvf_connector_h conn, const kvf_connector_peer_t *peer,
                                      uint64_t *ticket_p);
kvf_status_t kvf_conn_handshake_poll(kvf_connector_h conn, uint64_t ticket, char *why,
                                     size_t why_len);
kvf_status_t kvf_conn_set_lease_handler(kvf_connector_h conn, kvf_connector_lease_func_t func,
                                        void *arg);
kvf_status_t kvf_conn_lease(kvf_connector_h conn, const char *engine_id, const char *host,
                            int port, const kvf_lease_msg_t *msg, kvf_lease_answer_t *answer_p);
kvf_status_t kvf_conn_lease_start(kvf_connector_h conn, const kvf_connector_peer_t *peer,
                                  const kvf_lease_msg_t *msg, uint64_t *ticket_p);
kvf_status_t kvf_conn_lease_poll(kvf_connector_h conn, uint64_t ticket,
                                 kvf_lease_answer_t *answer_p);
void         kvf_conn_cancel(kvf_connector_h conn, uint64_t ticket);
bool         kvf_conn_side_wait(kvf_connector_h conn, int timeout_ms);
kvf_status_t kvf_conn_forget_engine(kvf_connector_h conn, const char *engine_id);
/* Free engine @a eng's pieces (every rank's); its pulls are over (or never started). */
void         kvf_conn_engine_pieces_free(kvf_connector_h conn, kvf_conn_engine_t *eng);
/* On rank @a tp_rank's thread, its pull from engine @a e held: give @a pp the pair's pieces,
 * built at the rank's first pull from it (rebuilt when its geometry changed; without them
 * when they cannot be built: the plan derives them and says why it cannot). */
void         kvf_conn_use_pieces(const kvf_conn_engine_t *e, int tp_rank,
                                 kvf_xfer_plan_params_t *pp);
/* Rank @a tp_rank's plan params of @a pull from engine @a e (@a groups: their storage,
 * KVF_MAX_KV_GROUPS), with the pair's pieces (kvf_conn_use_pieces). */
void         kvf_conn_plan_params(kvf_connector_h conn, int tp_rank, const kvf_conn_engine_t *e,
                                  const struct kvf_connector_pull *pull,
                                  kvf_xfer_plan_params_t *pp, kvf_xfer_group_blocks_t *groups);
/* req->plan, built now from the kept ids of a request that took the template path (digests,
 * stats); KVF_OK at once when it has one. */
kvf_status_t kvf_conn_req_plan(kvf_connector_h conn, kvf_connector_req_h req);
kvf_status_t kvf_conn_remote_incarnation(kvf_connector_h conn, const char *engine_id,
                                         uint64_t *incarnation_p);

/* ---- kvf_connector_ucx_land.c: the pool's device, zeroing, digests ---- */

/* The memory type of @a pool's device (cpu: host, cuda: cuda); KVF_ERR_INVALID_PARAM
 * (logged) for another kind. */
kvf_status_t kvf_conn_pool_device(kvf_connector_h conn, const kvf_connector_pool_t *pool,
                                  kvf_xfer_mem_type_t *type_p);

/* rk->device from @a pool's: a copy for the CPU, with a stream of its own for CUDA
 * (kvf_device_stream_create()). Rank thread, setup. */
kvf_status_t kvf_conn_pool_stream(kvf_connector_h conn, kvf_conn_rank_t *rk,
                                  const kvf_connector_pool_t *pool);

/* Destroy the stream kvf_conn_pool_stream() made (none: nothing). */
void         kvf_conn_pool_stream_destroy(kvf_conn_rank_t *rk);

/*
 * The zero post-ops of @a req once its last GET landed: CPU pools by one
 * kvf_zero_ranges(); CUDA pools by one kvf_zero_ranges_batch() launch for
 * every range (whole pages and tails alike) on the pool's stream, then a
 * sync of it.
 * @return KVF_OK, or the device error (logged).
 */
kvf_status_t kvf_conn_zero_tails(kvf_connector_h conn, kvf_connector_req_h req);

/* The req_digests op (kvf_connector.h). */
kvf_status_t kvf_conn_req_digests(kvf_connector_h conn, int tp_rank, kvf_connector_req_h req,
                                  const kvf_kv_digest_t **digests_p, int *n_p);

/* Prefill: the side channel's lease handler: KV digests of a release checked, then the
 * daemon's handler (conn->lease_func). */
void         kvf_conn_lease_verify(void *arg, const char *requester, const kvf_lease_msg_t *msg,
                                   uint32_t peer_timeout_ms, kvf_lease_answer_t *answer);

#include "kvf_connector_ipc.h"

#endif
