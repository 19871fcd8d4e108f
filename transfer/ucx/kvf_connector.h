/*
 * KV connector: how the engine core reaches the transfer layer (docs/ARCHITECTURE.md §4)
 * without including transfer/. A versioned ops table (docs/CODE_RULES.md
 * practice 6); the UCX implementation is kvf_connector_ucx_ops() in
 * transfer/ucx/kvf_connector_ucx.h, and a daemon passes that pointer down.
 *
 * Objects: one connector per instance (process); ranks are addressed by
 * tp_rank. A request handle belongs to the rank that started it.
 *
 * Threading (checked in Debug and sanitizer builds, see kvf_contract.h: a
 * call from the wrong thread logs the rule and aborts):
 * - The leader is the thread that called create. kvf-prefill and kvf-decode
 *   call every op, for every rank, from their leader thread.
 * - Each rank has a single-threaded UCX worker, so a rank's ops
 *   (register_pool or alloc_pool, get_metadata, start_pull, poll, notify_release,
 *   poll_release, req_stats) run on one thread: the first thread that
 *   calls one of them for that rank owns the rank from then on. That is the
 *   leader in the daemons; a test or tool may give each rank its own thread.
 * - destroy, serve, handshake, lease and remote_incarnation run on the
 *   leader; destroy only after every rank thread has stopped calling.
 * - No op holds the connector's internal lock across a network call: a
 *   handshake stalled on a peer that never answers (bounded by timeout_ms)
 *   does not delay another thread's start_pull, poll or finish_pull.
 * - forget_engine and wait_fds touch every rank's worker: they run on a
 *   leader that also owns every registered rank (the daemons' case).
 * - incarnation reads a value fixed at create: any thread.
 *
 * Flow, decode side (the serving daemons, decode/kvf_decode_pull.c):
 *   create -> alloc_pool (each rank; the engine computes in that memory; or
 *   register_pool of the engine's own pools with --pool-alloc heap) ->
 *   handshake_start/poll(peer) -> lease_start/poll(claim) -> start_pull
 *   (each rank) -> poll until != KVF_INPROGRESS -> finish_pull (each rank)
 *   -> lease_start/poll(one release for every rank): valid or expired.
 *   None of it waits on the network; many requests advance at once.
 *   handshake() and lease() are the synchronous forms (tools, tests).
 * Flow, prefill side:
 *   create -> alloc_pool or register_pool (each rank) -> set_lease_handler -> serve
 * notify_release / poll_release are the UCX-notification variant of the
 * release (tools and tests); it cannot tell decode whether the lease held.
 *
 * Every op is non-NULL in a table returned by a backend: unsupported ones
 * point at stubs returning KVF_ERR_UNSUPPORTED (kvf_connector_ops_fill_stubs()).
 *
 * NOTE: append new ops at the end and bump KVF_CONNECTOR_ABI; a caller
 * checks abi_version before using the table.
 */
#ifndef KVF_CONNECTOR_H
#define KVF_CONNECTOR_H

#include "kvf_device.h"
#include "kvf_geometry.h"
#include "kvf_handshake.h"
#include "kvf_status.h"

#include <stddef.h>
#include <stdint.h>

/*
 * Progress policy of a target that serves GETs (the prefill progress thread,
 * config progress_thread): spin this long after the last work, then sleep
 * until woken. Tools that progress a prefill connector by hand follow it too.
 */
#define KVF_CONNECTOR_SPIN_NS 5000000ull

#define KVF_CONNECTOR_ABI 14  /* 2: req_stats; 3: forget_engine; 4: incarnations; 5: wait_fds;
                                 6: stats carry posted/landed/done times;
                                 7: batch_descs, plan_flags in the config;
                                 8: leases (set_lease_handler, lease, finish_pull),
                                    progress_thread in the config;
                                 9: alloc_pool;
                                 10: asynchronous side channel (handshake_start/poll,
                                     lease_start/poll, cancel, side_wait), the pull's
                                     peer key;
                                 11: req_digests (KV integrity);
                                 12: path in the config, path/path_why/gather_ops in the
                                     stats (the same-node path);
                                 13: the pull's skip_tokens (decode's prefix cache);
                                 14: the pull's plan_flags (the sliding-window pull) */

typedef struct kvf_connector *kvf_connector_h;
typedef struct kvf_connector_req *kvf_connector_req_h;

typedef enum {
    KVF_CONNECTOR_ROLE_PREFILL = 0,   /* serves metadata, is read from, receives releases */
    KVF_CONNECTOR_ROLE_DECODE  = 1,   /* handshakes, pulls, sends releases */
} kvf_connector_role_t;

enum kvf_connector_config_field {     /* append only, never renumber */
    KVF_CONNECTOR_CONFIG_FIELD_LISTEN     = KVF_BIT(0),  /* listen_host/listen_port */
    KVF_CONNECTOR_CONFIG_FIELD_TIMEOUT_MS = KVF_BIT(1),
    KVF_CONNECTOR_CONFIG_FIELD_BATCH_DESCS = KVF_BIT(2),
    KVF_CONNECTOR_CONFIG_FIELD_PLAN_FLAGS = KVF_BIT(3),
    KVF_CONNECTOR_CONFIG_FIELD_PROGRESS   = KVF_BIT(4),  /* progress_thread */
    KVF_CONNECTOR_CONFIG_FIELD_MODEL_DIGEST = KVF_BIT(5),  /* model_digest */
    KVF_CONNECTOR_CONFIG_FIELD_PATH       = KVF_BIT(6),  /* path */
};
#define KVF_CONNECTOR_CONFIG_FIELDS_KNOWN (KVF_BIT(7) - 1)

/**
 * How a decode rank's pull moves bytes (transfer/ucx/kvf_connector_ipc.c).
 * AUTO: CUDA IPC when both pools are CUDA memory on the same node and the
 * prefill's allocation maps here, UCX otherwise (the reason logged once per
 * engine and rank). UCX: always UCX (prefill then shares no IPC handle).
 * IPC: CUDA IPC, and a pull that cannot take it is refused
 * (KVF_ERR_UNSUPPORTED, the reason logged).
 */
typedef enum {
    KVF_CONNECTOR_PATH_AUTO = 0,
    KVF_CONNECTOR_PATH_UCX  = 1,
    KVF_CONNECTOR_PATH_IPC  = 2,
} kvf_connector_path_t;

/** "auto", "ucx", "cuda-ipc"; "unknown" outside kvf_connector_path_t. */
const char *kvf_connector_path_name(kvf_connector_path_t path);

typedef struct kvf_connector_config {
    uint64_t                  field_mask;   /* first */
    const char               *engine_id;    /* this instance; copied; < 64 bytes */
    kvf_connector_role_t      role;
    int                       tp_size;
    const kvf_model_config_t *cfg;          /* copied */
    const char               *listen_host;  /* prefill side channel; default "127.0.0.1" */
    int                       listen_port;  /* default 0: ephemeral (see serve) */
    uint32_t                  timeout_ms;   /* every wait; default 5000 */
    uint32_t                  batch_descs;  /* decode: GETs in flight per prefill rank read;
                                             * poll() posts the next batch when one lands;
                                             * default 0: all of them at once */
    uint32_t                  plan_flags;   /* kvf_xfer_plan_flags (planner debugging);
                                             * default 0 */
    /* Prefill: from serve on, one thread per rank owns that rank's UCX
     * worker and progresses it whatever the caller is doing (a long engine
     * step never stalls a decode's GET). poll_release and wait_fds then
     * return KVF_ERR_UNSUPPORTED (releases go through the lease handler).
     * Default false. */
    bool                      progress_thread;
    /* kvf_model_digest() of the model folder served (copied): advertised in
     * every rank's metadata; a pair whose digests differ, or where only one
     * side has one, is refused at handshake (kvf_compat.h). Default: none. */
    const kvf_model_digest_t *model_digest;
    kvf_connector_path_t      path;         /* default KVF_CONNECTOR_PATH_AUTO */
} kvf_connector_config_t;

/**
 * One rank's page pool: num_blocks * slots * page_size bytes at base. The
 * UCX registration needs memory UCX can map: host memory (device cpu), or
 * CUDA memory from kvf_device_alloc() (device cuda: mapped as
 * UCS_MEMORY_TYPE_CUDA, published with that memory type; a UCX without CUDA
 * refuses it with KVF_ERR_UNSUPPORTED, naming the type and the UCX). The
 * zeroing after a pull goes through the device layer: kvf_zero_ranges() on
 * the CPU; on CUDA kvf_blocks_zero() and kvf_zero_ranges() on a stream of
 * the pool's own (kvf_device_stream_create()), synced before poll reports
 * KVF_OK. A device kind outside kvf_device_kind_t is KVF_ERR_INVALID_PARAM.
 */
typedef struct kvf_connector_pool {
    int                tp_rank;
    void              *base;
    size_t             len;           /* must equal num_blocks * slots * page_size */
    int64_t            num_blocks;
    kvf_cache_params_t params;        /* dtypes, block sizes: what the geometry derives from */
    kvf_device_t       device;        /* where base lives; zero-initialised = the CPU */
} kvf_connector_pool_t;

/**
 * A remote prefill engine as transfer params name it, and the key of the
 * handshake cache: the same engine id at another side-channel address, or
 * of another process (incarnation), is another entry, so a handshake with
 * one never stands in for the other.
 */
typedef struct kvf_connector_peer {
    const char *engine_id;
    const char *host;          /* side channel */
    int         port;
    uint64_t    incarnation;   /* TransferParams.incarnation; non-zero */
} kvf_connector_peer_t;

/** One request's pull (decode side): remote ids from the transfer params, local ids allocated here. */
typedef struct kvf_connector_pull {
    const char     *engine_id;        /* remote (prefill) engine, already handshaken */
    const char     *request_id;       /* echoed in the release */
    int64_t         num_tokens;
    int             num_groups;       /* == the model's KV cache group count */
    const int32_t  *remote_ids[KVF_MAX_KV_GROUPS];
    int             num_remote_ids[KVF_MAX_KV_GROUPS];
    const int32_t  *local_ids[KVF_MAX_KV_GROUPS];
    int             num_local_ids[KVF_MAX_KV_GROUPS];
    /* ABI 10: the handshake this pull reads through (handshake_start's key);
     * NULL: the engine id alone picks it (handshake()). */
    const kvf_connector_peer_t *peer;
    /* ABI 13: tokens [0, skip_tokens) are in the local blocks already (decode's prefix
     * cache, docs/PREFIX_CACHE.md §6): neither read nor zeroed; a multiple of the local
     * block size, <= num_tokens (kvf_xfer_plan_params_t.skip_tokens); 0: read them all */
    int64_t         skip_tokens;
    /* ABI 14: kvf_xfer_plan_flags OR'd into the config's for this pull's plan; only
     * KVF_XFER_PLAN_FLAG_WINDOW (read a group whose every layer slides only within its
     * window, zero the blocks before: kvf_xfer_window_first_block()); another bit is
     * refused (KVF_ERR_INVALID_PARAM); 0: none */
    uint32_t        plan_flags;
} kvf_connector_pull_t;

/** What one rank's pull of one request moved (decode side). */
typedef struct kvf_connector_stats {
    uint64_t bytes;          /* payload bytes read (zeroed tails not counted) */
    uint64_t descriptors;    /* GET descriptors after coalescing */
    int      remote_ranks;   /* prefill ranks this rank read from */
    uint64_t zero_bytes;     /* bytes zeroed after the pull */
    /* CLOCK_MONOTONIC ns (kvf_time_now_ns()); 0 when not reached */
    uint64_t posted_ns;      /* start_pull returned: planned, every GET posted */
    uint64_t landed_ns;      /* poll saw the last GET complete */
    uint64_t done_ns;        /* post-ops (tail zeroing) finished */
    /* which path moved the bytes: KVF_CONNECTOR_PATH_UCX or _IPC; for UCX, why
     * not IPC (borrowed: valid until this rank's next start_pull or destroy) */
    kvf_connector_path_t path;
    const char          *path_why;
    uint64_t             gather_ops;   /* IPC: ops of the one gather (chunks + zero ranges) */
    /* CLOCK_MONOTONIC ns: start_pull entered, and planning done (plan built, endpoints
     * ready; the first GET or the gather is next). posted_ns - planned_ns is posting. */
    uint64_t             started_ns;
    uint64_t             planned_ns;
} kvf_connector_stats_t;

/**
 * Prefill's lease table answering one lease operation; see
 * kvf_side_channel_lease_func_t (@a requester is the authenticated peer,
 * @a peer_timeout_ms the transfer timeout this request announced).
 */
typedef void (*kvf_connector_lease_func_t)(void *arg, const char *requester,
                                           const kvf_lease_msg_t *msg, uint32_t peer_timeout_ms,
                                           kvf_lease_answer_t *answer);

typedef struct kvf_connector_ops {
    unsigned    abi_version;          /* == KVF_CONNECTOR_ABI */
    const char *name;                 /* "ucx"; logs only */

    /** Create the instance object. Setup path. */
    kvf_status_t (*create)(const kvf_connector_config_t *config, kvf_connector_h *conn_p);

    /** Stop serving, close every peer, deregister pools, free. NULL ok. */
    void         (*destroy)(kvf_connector_h conn);

    /** Register a rank's pool once (rank thread: claims the rank). May block (pins pages). */
    kvf_status_t (*register_pool)(kvf_connector_h conn, const kvf_connector_pool_t *pool);

    /** This rank's published metadata, opaque packed bytes (for logs/tests). */
    kvf_status_t (*get_metadata)(kvf_connector_h conn, int tp_rank, void *buf, size_t cap,
                                 size_t *len_p);

    /** Prefill: start the side channel once every rank registered; *port_p = bound port. */
    kvf_status_t (*serve)(kvf_connector_h conn, int *port_p);

    /**
     * Decode (leader thread): fetch a remote engine's metadata (cached per
     * engine id) and check compatibility; bounded by timeout_ms (ms). The
     * cache holds 16 engines: a new engine when it is full evicts the least
     * recently used one (handshake or start_pull) that has no pull in flight
     * (started, not yet finished or released); a later pull from the evicted
     * engine gets KVF_ERR_NOT_FOUND until it is handshaken again.
     * @return KVF_OK; KVF_ERR_REFUSED with @a why = "handshake refused:
     *         <field> prefill=<v> decode=<v>: <why>" (the compatibility
     *         check, or a region memory type decode's UCX cannot reach:
     *         "regions[0].memory_type prefill=cuda (rank 0) decode=host pool
     *         (UCX ...): ..."); KVF_ERR_NO_RESOURCE when
     *         all 16 cached engines have pulls in flight (@a why says so);
     *         KVF_ERR_BUSY before every rank registered; peer errors
     *         (KVF_ERR_PEER_TIMEOUT for a side channel that never answers)
     *         with @a why naming the engine, host and port.
     */
    kvf_status_t (*handshake)(kvf_connector_h conn, const char *engine_id, const char *host,
                              int port, char *why, size_t why_len);

    /**
     * Decode (rank thread): plan this rank's share and post the GETs; never
     * blocks on the network. KVF_OK with *req_p; KVF_ERR_NOT_FOUND when the
     * engine was not handshaken; KVF_ERR_OUT_OF_RANGE for bad block ids
     * (nothing posted).
     */
    kvf_status_t (*start_pull)(kvf_connector_h conn, int tp_rank,
                               const kvf_connector_pull_t *pull, kvf_connector_req_h *req_p);

    /**
     * Progress (rank thread); KVF_INPROGRESS, or the final status: KVF_OK
     * once every byte landed and the tails were zeroed (kvf_zero_ranges()
     * on the pool's device), KVF_ERR_PEER_* on peer failure or after
     * timeout_ms, the device error (e.g. KVF_ERR_UNSUPPORTED, KVF_ERR_CUDA)
     * when zeroing failed.
     */
    kvf_status_t (*poll)(kvf_connector_h conn, int tp_rank, kvf_connector_req_h req);

    /**
     * Decode: tell every prefill rank read that the request's blocks may be
     * freed, and free @a req. Waits for an unfinished request to drain
     * (bounded by timeout_ms) first. When the pull failed or timed out, the
     * endpoints to those ranks are force-closed instead (no GET can land
     * after this returns, so the local blocks may be reused) and no release
     * is sent: prefill's lease frees its blocks. Returns the pull's status.
     */
    kvf_status_t (*notify_release)(kvf_connector_h conn, int tp_rank, kvf_connector_req_h req);

    /**
     * Prefill (rank thread): next release received, waiting up to
     * @a timeout_ms. KVF_OK with request id, sender decode rank and its
     * status; when none arrived, KVF_INPROGRESS if the rank's worker served
     * transfer work meanwhile (keep progressing) or KVF_ERR_PEER_TIMEOUT if
     * it was idle (a caller may sleep, as the progress thread does).
     */
    kvf_status_t (*poll_release)(kvf_connector_h conn, int tp_rank, uint32_t timeout_ms,
                                 char *request_id, size_t id_len, int *decode_rank_p,
                                 kvf_status_t *status_p);

    /**
     * Decode: what @a req (from start_pull, not yet released) moves: bytes,
     * descriptors, prefill ranks read. Valid as soon as start_pull returned.
     */
    kvf_status_t (*req_stats)(kvf_connector_h conn, int tp_rank, kvf_connector_req_h req,
                              kvf_connector_stats_t *stats_p);

    /**
     * Decode: drop everything cached about a remote engine (metadata, remote
     * keys, endpoints on every rank) so the next handshake fetches it anew.
     * Call after a peer error: a restarted prefill keeps its engine id but
     * has new memory, keys and worker addresses. Leader thread, with no pull
     * of that engine in flight; the leader must own every rank.
     * KVF_ERR_NOT_FOUND when nothing was cached.
     */
    kvf_status_t (*forget_engine)(kvf_connector_h conn, const char *engine_id);

    /**
     * This process's incarnation: a random non-zero number drawn from
     * getrandom(2) at create (create fails with KVF_ERR_IO, logged, when
     * the kernel cannot supply one) and published in every rank's metadata. Prefill puts it into the
     * transfer params, so decode can tell a restarted engine (same id, new
     * keys) from the one it handshook with, before it posts any GET.
     */
    uint64_t     (*incarnation)(kvf_connector_h conn);

    /**
     * Decode: the incarnation of handshaken engine @a engine_id (0 when it
     * advertised none). KVF_ERR_NOT_FOUND when not handshaken.
     */
    kvf_status_t (*remote_incarnation)(kvf_connector_h conn, const char *engine_id,
                                       uint64_t *incarnation_p);

    /**
     * Prepare to sleep: progress every rank's worker until idle, arm it,
     * and return the file descriptors that become readable when transfer
     * work arrives (for poll() beside the control socket). Leader thread,
     * owning every rank.
     * @return KVF_OK with *n_p fds; KVF_ERR_BUSY when work is pending (do not
     *         sleep: poll releases / progress first); KVF_ERR_UNSUPPORTED when
     *         the backend cannot wake a sleeper (spin instead).
     */
    kvf_status_t (*wait_fds)(kvf_connector_h conn, int *fds, int cap, int *n_p);

    /**
     * Prefill, before serve: who answers lease operations (claims,
     * heartbeats, releases) arriving on the side channel. @a func runs on the
     * side-channel thread (see kvf_connector_lease_func_t). Without one,
     * every lease operation is refused. KVF_ERR_BUSY after serve.
     */
    kvf_status_t (*set_lease_handler)(kvf_connector_h conn, kvf_connector_lease_func_t func,
                                      void *arg);

    /**
     * Decode (leader thread): one lease operation with engine @a engine_id at
     * its side channel @a host:@a port, bounded by timeout_ms. Never called
     * under the connector's lock. @return KVF_OK with *answer_p (read its
     * verdict); KVF_ERR_PEER_TIMEOUT; KVF_ERR_PARSE; KVF_ERR_ZMQ.
     */
    kvf_status_t (*lease)(kvf_connector_h conn, const char *engine_id, const char *host,
                          int port, const kvf_lease_msg_t *msg, kvf_lease_answer_t *answer_p);

    /**
     * Decode (rank thread): as notify_release, but send nothing (the release
     * goes through lease()). Drains an unfinished request (bounded), force-
     * closes the endpoints of a failed one, frees @a req. Returns the pull's
     * status.
     */
    kvf_status_t (*finish_pull)(kvf_connector_h conn, int tp_rank, kvf_connector_req_h req);

    /**
     * As register_pool, but the connector allocates the pool (@a pool->base
     * must be NULL; len, num_blocks, params as for register_pool) from
     * memory its transport reads fastest: for UCX, shared memory mapped by
     * UCX, which a peer on the same host reads by a plain copy with no work
     * on this side. *base_p receives the base (page aligned, contents
     * undefined); the memory belongs to the connector and stays valid until
     * destroy (never free() it). Rank thread, setup path.
     * Host memory only: a pool whose device is not the CPU is refused.
     * @return as register_pool; KVF_ERR_UNSUPPORTED for a device pool;
     *         KVF_ERR_NO_MEMORY when it cannot allocate.
     */
    kvf_status_t (*alloc_pool)(kvf_connector_h conn, const kvf_connector_pool_t *pool,
                               void **base_p);

    /*
     * The asynchronous side channel (decode, leader thread). None of these
     * waits on the network: a request is sent on the persistent connection
     * to the prefill's side channel and answered later; the leader polls
     * its ticket between engine steps. Each ticket is polled until it stops
     * answering KVF_INPROGRESS (then it is gone), or cancelled.
     */

    /**
     * Handshake with @a peer unless the cache holds it (engine id, address
     * and incarnation all equal). @return KVF_OK when cached (no ticket);
     * KVF_INPROGRESS with *ticket_p: sent, poll it with handshake_poll;
     * KVF_INPROGRESS with *ticket_p == 0: a handshake with the same key is
     * in flight for someone else, call handshake_start again later;
     * KVF_ERR_INVALID_PARAM (no incarnation, bad address); KVF_ERR_BUSY
     * before every rank registered; KVF_ERR_NO_RESOURCE (too many in flight).
     */
    kvf_status_t (*handshake_start)(kvf_connector_h conn, const kvf_connector_peer_t *peer,
                                    uint64_t *ticket_p);

    /**
     * KVF_INPROGRESS, or the end of handshake @a ticket: KVF_OK (checked and
     * cached), or the errors of handshake() with @a why; KVF_ERR_PEER_RESET
     * when another process (incarnation) answered than the key names.
     */
    kvf_status_t (*handshake_poll)(kvf_connector_h conn, uint64_t ticket, char *why,
                                   size_t why_len);

    /** Send lease operation @a msg to @a peer. @return KVF_OK with *ticket_p; errors. */
    kvf_status_t (*lease_start)(kvf_connector_h conn, const kvf_connector_peer_t *peer,
                                const kvf_lease_msg_t *msg, uint64_t *ticket_p);

    /**
     * KVF_INPROGRESS, or the end of lease operation @a ticket: KVF_OK with
     * *answer_p; KVF_ERR_PEER_TIMEOUT (no answer within timeout_ms),
     * KVF_ERR_PEER_UNREACHABLE, KVF_ERR_PEER_RESET, KVF_ERR_PARSE.
     */
    kvf_status_t (*lease_poll)(kvf_connector_h conn, uint64_t ticket,
                               kvf_lease_answer_t *answer_p);

    /** Forget a handshake or lease ticket; a late answer is dropped. Unknown: ignored. */
    void         (*cancel)(kvf_connector_h conn, uint64_t ticket);

    /**
     * Sleep until an answer or a connection event arrives on the side
     * channel, at most @a timeout_ms. @return true when something arrived.
     */
    bool         (*side_wait)(kvf_connector_h conn, int timeout_ms);

    /**
     * Decode (rank thread), after poll returned KVF_OK: the KV digest of
     * what this rank received from each prefill rank it read
     * (kvf_kv_digest_ranges() over the landed bytes in descriptor order;
     * ranges are the prefill region's), computed on the first call; a GPU
     * pool's bytes are copied to the host once for it, on either side
     * (kvf_kv_digest_ranges_dev()). *digests_p stays valid until
     * finish_pull. A release carrying them makes prefill hash its own bytes
     * of the same ranges while the lease holds and answer KVF_LEASE_CORRUPT
     * on a difference.
     * @return KVF_OK; KVF_ERR_INVALID_PARAM (not landed); KVF_ERR_NO_MEMORY;
     *         KVF_ERR_CUDA when a device copy fails.
     */
    kvf_status_t (*req_digests)(kvf_connector_h conn, int tp_rank, kvf_connector_req_h req,
                                const kvf_kv_digest_t **digests_p, int *n_p);
} kvf_connector_ops_t;

/** Point every NULL op of @a ops at a stub returning KVF_ERR_UNSUPPORTED. */
void kvf_connector_ops_fill_stubs(kvf_connector_ops_t *ops);

/** KVF_OK when @a ops has this ABI version and no NULL op; else KVF_ERR_UNSUPPORTED (logged). */
kvf_status_t kvf_connector_ops_check(const kvf_connector_ops_t *ops);

#endif
