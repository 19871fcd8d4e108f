/*
 * UCX transfer agent, one per rank (NIXL-style; docs/ARCHITECTURE.md §4, §10).
 *
 * An agent owns a ucp context and one worker (UCS_THREAD_MODE_SINGLE: only
 * the owning rank thread may call into it), the registered page-pool
 * region(s), and peers. A peer is an endpoint to a remote rank's worker plus
 * that rank's regions with their remote keys, unpacked once at connect.
 *
 * Data path: kvf_ucx_xfer_post() posts one non-blocking GET (or PUT) per
 * descriptor and a flush, so a whole descriptor list completes as ONE batch;
 * kvf_ucx_batch_test()/kvf_ucx_batch_wait() drive it. Every wait has a
 * timeout. Endpoints use UCX peer error handling; a dead peer turns into a
 * KVF_ERR_PEER_* status on the peer and on every batch to it.
 *
 * Notifications: small messages (packed TransferNotification) sent as UCX
 * active messages; received ones are queued inside the agent until
 * kvf_ucx_notify_recv() takes them.
 *
 * Environment: with peer error handling the agent sets
 * UCX_POSIX_ERROR_HANDLING=y and UCX_SYSV_ERROR_HANDLING=y before reading
 * the UCX config unless the user set them (otherwise shared-memory
 * transports drop out and TCP carries everything, ~90x slower), and logs
 * the transports each endpoint selected.
 */
#ifndef KVF_UCX_AGENT_H
#define KVF_UCX_AGENT_H

#include "kvf_handshake.h"
#include "kvf_time.h"   /* kvf_time_now_ns: the clock of every timeout here */
#include "kvf_ucx_check.h"
#include "kvf_xfer_plan.h"


typedef struct kvf_ucx_agent *kvf_ucx_agent_h;
typedef struct kvf_ucx_peer  *kvf_ucx_peer_h;
typedef struct kvf_ucx_batch *kvf_ucx_batch_h;

enum kvf_ucx_agent_params_field {          /* append only, never renumber */
    KVF_UCX_AGENT_PARAM_FIELD_NAME       = KVF_BIT(0),
    KVF_UCX_AGENT_PARAM_FIELD_TIMEOUT_MS = KVF_BIT(1),
    KVF_UCX_AGENT_PARAM_FIELD_ERR_MODE   = KVF_BIT(2),
    KVF_UCX_AGENT_PARAM_FIELD_ACCESS     = KVF_BIT(3),
    KVF_UCX_AGENT_PARAM_FIELD_MEM_TYPE   = KVF_BIT(4),
};
#define KVF_UCX_AGENT_PARAM_FIELDS_KNOWN (KVF_BIT(5) - 1)

/**
 * What peers may do to the regions an agent maps (ucp_mem_map's prot).
 * LOCAL regions never have a remote key packed (kvf_ucx_agent_region_meta()
 * publishes them with rkey_len 0), so no peer is ever handed one; that is
 * enforced here. Whether a peer that *holds* a key of a REMOTE_READ region
 * can still write it is UCX's business, and UCX 1.13.1 (Debian 12) does not
 * enforce it on any transport: ucp_mem_map ignores the prot field and
 * registers every region for remote read and write
 * (ucp_mem_map_params2uct_flags: UCT_MD_MEM_ACCESS_ALL), shared-memory
 * peers map the segment read-write, CMA writes with process_vm_writev, and
 * TCP's emulated PUT (ucp_put_handler) writes any address it is sent.
 * tests/transfer/ucx/test_ucx_mem_prot.c measures this per transport;
 * docs/SECURITY.md "KV memory" says what it means for a pool.
 */
typedef enum {
    KVF_UCX_ACCESS_LOCAL       = 0,   /* this process only (decode pools) */
    KVF_UCX_ACCESS_REMOTE_READ = 1,   /* peers may GET (prefill pools); the default */
    KVF_UCX_ACCESS_REMOTE_RW   = 2,   /* peers may GET and PUT (tests, tools) */
} kvf_ucx_access_t;

typedef struct kvf_ucx_agent_params {
    uint64_t    field_mask;     /* bits of kvf_ucx_agent_params_field; first */
    const char *name;           /* for logs, e.g. "decode rank 1"; copied */
    uint32_t    timeout_ms;     /* default for waits inside the agent (connect,
                                 * notify send, close); default 2000 */
    bool        peer_err_mode;  /* UCP_ERR_HANDLING_MODE_PEER; default true */
    kvf_ucx_access_t access;    /* of every region this agent maps; default
                                 * KVF_UCX_ACCESS_REMOTE_READ */
    kvf_xfer_mem_type_t mem_type; /* memory its regions will be in; default HOST.
                                 * CUDA: the agent sets on its own UCX config what
                                 * device memory needs (kvf_ucx_agent_create()) */
} kvf_ucx_agent_params_t;

typedef enum {
    KVF_UCX_OP_GET = 0,         /* remote -> local */
    KVF_UCX_OP_PUT = 1,         /* local -> remote */
} kvf_ucx_op_t;

/**
 * Create an agent: ucp context (RMA + AM features) and one worker.
 * For an agent whose regions are CUDA memory (params->mem_type) it sets, on
 * its own ucp config (ucp_config_modify, nothing process-wide), what UCX
 * needs to read device memory at full speed, so the operator need not know
 * UCX's variables: CUDA_IPC_ENABLE_GET_ZCOPY=y, cuda_ipc GET zero-copy,
 * which UCX 1.22 turns off on GPUs without NVLink ("cuda-ipc get zcopy
 * disabled as no nvlinks detected": 0.5-0.7 GB/s GETs instead of tens to
 * hundreds). An operator's UCX_CUDA_IPC_ENABLE_GET_ZCOPY stands as set; a
 * UCX that does not know the variable (one without its CUDA modules) is
 * left as it is. The info line that describes the agent names the outcome
 * (kvf_ucx_agent_device_config()).
 * @return KVF_OK; KVF_ERR_INVALID_PARAM for unknown field_mask bits, an
 *         access outside kvf_ucx_access_t or a mem_type outside
 *         kvf_xfer_mem_type_t (logged by name); KVF_ERR_UCX (or a mapped
 *         status) when UCX init fails (logged).
 */
kvf_status_t kvf_ucx_agent_create(const kvf_ucx_agent_params_t *params,
                                  kvf_ucx_agent_h *agent_p);

/** Destroy peers still connected, deregister regions, free the worker/context. NULL ok. */
void kvf_ucx_agent_destroy(kvf_ucx_agent_h agent);

/**
 * Register [addr, addr + len) once (ucp_mem_map); setup path only. CUDA
 * device memory (kvf_device_ptr_is_cuda(addr): this call starts the CUDA
 * runtime in a CUDA build) is mapped with
 * UCS_MEMORY_TYPE_CUDA, so a CUDA-built UCX picks cuda_copy/cuda_ipc on one
 * host and GPUDirect RDMA across hosts; the region's metadata then says
 * KVF_XFER_MEM_CUDA and GETs into it carry that memory type.
 * @param [out] region_p  Index of the new region (0, 1, ...).
 * @return KVF_OK; KVF_ERR_NO_RESOURCE past KVF_XFER_MAX_REGIONS;
 *         KVF_ERR_UNSUPPORTED for device memory this UCX cannot reach
 *         (kvf_ucx_agent_mem_reach(); logged naming the memory type, the
 *         UCX version, its memory types and UCX_TLS); UCX errors.
 */
kvf_status_t kvf_ucx_agent_mem_register(kvf_ucx_agent_h agent, void *addr, size_t len,
                                        int *region_p);

/**
 * As kvf_ucx_agent_mem_register(), with the memory type said by the caller
 * (the pool's device): KVF_XFER_MEM_HOST touches no CUDA at all (the CPU
 * path: kvf_device_ptr_is_cuda() would start the CUDA runtime, a context on
 * a GPU machine); KVF_XFER_MEM_CUDA is checked against the pointer.
 * @return as kvf_ucx_agent_mem_register(); KVF_ERR_INVALID_PARAM for CUDA
 *         memory that CUDA does not know as device memory, or a @a type
 *         outside kvf_xfer_mem_type_t.
 */
kvf_status_t kvf_ucx_agent_mem_register_type(kvf_ucx_agent_h agent, void *addr, size_t len,
                                             kvf_xfer_mem_type_t type, int *region_p);

/**
 * Allocate @a len bytes of host memory through UCX and register them as a
 * new region (ucp_mem_map with UCP_MEM_MAP_ALLOCATE; UCX's allocator order,
 * UCX_MEM_ALLOC_METHODS, starts with System V and POSIX shared memory). A
 * peer on the same host then reads the region by a plain copy from its own
 * mapping of the segment (sysv/posix get_bcopy), with no work by this side,
 * instead of a CMA or emulated GET. The memory is owned by the agent: it is
 * released by kvf_ucx_agent_destroy(), not by free(). Setup path only.
 * @param [out] addr_p    Base of the memory (page aligned; contents undefined).
 * @param [out] region_p  Index of the new region.
 * @return KVF_OK; KVF_ERR_INVALID_PARAM for len 0; KVF_ERR_NO_RESOURCE past
 *         KVF_XFER_MAX_REGIONS; UCX errors (e.g. out of memory).
 */
kvf_status_t kvf_ucx_agent_mem_alloc(kvf_ucx_agent_h agent, size_t len, void **addr_p,
                                     int *region_p);

/**
 * Publishable description of region @a region: address, length and packed
 * rkey; for a KVF_UCX_ACCESS_LOCAL region no key is packed (rkey_len 0), so
 * kvf_ucx_peer_connect() and kvf_handshake_reply_unpack() refuse it.
 */
kvf_status_t kvf_ucx_agent_region_meta(kvf_ucx_agent_h agent, int region,
                                       kvf_xfer_region_meta_t *meta_p);

/**
 * Whether this agent's UCX context reaches memory of @a type: host always;
 * CUDA when ucp_context_query() lists UCS_MEMORY_TYPE_CUDA (a UCX built with
 * CUDA; Debian 12's 1.13.1 is not). @a what always receives what this UCX is,
 * e.g. "UCX 1.13.1 reaching host memory, UCX_TLS=all", for messages.
 * @return KVF_OK; KVF_ERR_UNSUPPORTED; KVF_ERR_INVALID_PARAM for a @a type
 *         outside kvf_xfer_mem_type_t. Any thread (reads what create stored).
 */
kvf_status_t kvf_ucx_agent_mem_reach(kvf_ucx_agent_h agent, kvf_xfer_mem_type_t type,
                                     char *what, size_t what_len);

/**
 * What the agent set on its UCX config for device memory, e.g.
 * "UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y (cuda_ipc GET zero-copy, set by kvferry)",
 * "UCX_CUDA_IPC_ENABLE_GET_ZCOPY=n (the operator's)", or "" for a host-memory
 * agent. Owned by the agent. Any thread.
 */
const char *kvf_ucx_agent_device_config(kvf_ucx_agent_h agent);

/** What kvf_ucx_agent_mem_reach() writes to @a what: UCX version, memory types, UCX_TLS. */
void kvf_ucx_agent_describe(kvf_ucx_agent_h agent, char *buf, size_t len);

/** Copy this worker's address into @a buf (cap bytes). KVF_ERR_NO_RESOURCE if too small. */
kvf_status_t kvf_ucx_agent_worker_address(kvf_ucx_agent_h agent, uint8_t *buf, size_t cap,
                                          size_t *len_p);

/**
 * Transports in use, e.g. "UCX_TLS=all; ep lanes: cma/memory,sysv/memory,tcp/lo".
 * Lanes are those of the most recently connected peer ("none" before). Owned by agent.
 */
const char *kvf_ucx_agent_transports(kvf_ucx_agent_h agent);

/**
 * Drive the worker once and free parked peers whose close has completed;
 * returns the number of UCX events processed. Owning thread only.
 */
unsigned kvf_ucx_agent_progress(kvf_ucx_agent_h agent);

/**
 * Peers whose endpoint close timed out and that are kept (parked) until the
 * close completes, so their error callback never runs on freed memory.
 * kvf_ucx_agent_progress() frees those that are done; agent destroy frees
 * the rest after the worker. Owning thread only.
 */
int kvf_ucx_agent_num_parked(kvf_ucx_agent_h agent);

/**
 * The worker's event file descriptor: readable when the worker has work.
 * Owned by the worker; valid until the agent is destroyed.
 */
kvf_status_t kvf_ucx_agent_event_fd(kvf_ucx_agent_h agent, int *fd_p);

/**
 * Progress until idle (at most 1024 rounds), then arm the event fd
 * (ucp_worker_arm) so a poll() on it wakes when work arrives.
 * @return KVF_OK when armed (the caller may sleep in poll on the fd);
 *         KVF_ERR_BUSY when events or notifications are pending or the
 *         worker stayed busy (progress or read them, do not sleep); a UCX
 *         error mapped to kvf_status_t.
 */
kvf_status_t kvf_ucx_agent_arm(kvf_ucx_agent_h agent);

/** Number of GET/PUT operations posted so far (0 proves no RDMA was issued). */
uint64_t kvf_ucx_agent_ops_posted(kvf_ucx_agent_h agent);

/**
 * Bound a peer's packed remote key before it is handed to
 * ucp_ep_rkey_unpack(): 1..KVF_RKEY_MAX bytes. Nothing else: the key is
 * UCX's private format (its layout changes between UCX versions; a newer
 * UCX may append bytes), so it is never parsed here. What vouches for a key
 * is who sent it: handshake replies come only from authenticated pool
 * members (CURVE on the side channel; docs/SECURITY.md "Remote keys"), and
 * every descriptor posted with it is range-checked against the region the
 * peer advertised (kvf_ucx_xfer_post()).
 *
 * @param [out] why  What is wrong, naming rkey_len and its value
 *                   (NUL-terminated), when not KVF_OK.
 * @return KVF_OK; KVF_ERR_PARSE for a NULL, empty or oversized key.
 * Any thread.
 */
kvf_status_t kvf_ucx_rkey_check(const uint8_t *rkey, size_t len, char *why, size_t why_len);

/**
 * Connect to a remote rank: create the endpoint from meta->worker_addr and
 * unpack every region's rkey (once; cached in the peer) after
 * kvf_ucx_rkey_check() passed for it and its memory type is one this UCX
 * reaches (kvf_ucx_agent_mem_reach()).
 * @return KVF_OK; KVF_ERR_PARSE for an rkey outside 1..KVF_RKEY_MAX
 *         (nothing connected then); KVF_ERR_REFUSED when
 *         ucp_ep_rkey_unpack() refuses a key (logged naming the region, the
 *         rank, its engine and UCX's status; nothing connected then);
 *         KVF_ERR_UNSUPPORTED for a region in memory this UCX cannot reach
 *         (logged naming both); mapped UCX errors.
 */
kvf_status_t kvf_ucx_peer_connect(kvf_ucx_agent_h agent, const kvf_rank_meta_t *meta,
                                  kvf_ucx_peer_h *peer_p);

/**
 * Close the endpoint (forced when the peer failed), progressing the worker
 * for at most the agent timeout, and release @a peer: the handle is invalid
 * afterwards. When the close does not finish in time the peer is parked
 * (kvf_ucx_agent_num_parked()), not freed: its callbacks may still fire.
 * Owning thread only. NULL ok.
 */
void kvf_ucx_peer_destroy(kvf_ucx_peer_h peer);

/**
 * Force-close the endpoint whatever its state: every operation still posted
 * on it completes (with an error) before this returns, so none can land in
 * local memory afterwards. For transfers that failed or timed out while
 * GETs were in flight. Should even the forced close not finish within the
 * agent timeout, the peer is parked (logged as a warning; see
 * kvf_ucx_peer_destroy()) and that guarantee does not hold for it. Owning
 * thread only. NULL ok.
 */
void kvf_ucx_peer_abort(kvf_ucx_peer_h peer);

/** KVF_OK while healthy; the first KVF_ERR_PEER_* seen on this peer otherwise. */
kvf_status_t kvf_ucx_peer_status(kvf_ucx_peer_h peer);

/**
 * Post one batch: for each descriptor, @a op of descs[i].len bytes between
 * local region @a local_region + local_off and the peer's region
 * @a remote_region + remote_off. Never blocks. A local region in device
 * memory is named to UCX on every operation (UCP_OP_ATTR_FIELD_MEMORY_TYPE),
 * so UCX does not detect the pointer's type per GET. Every descriptor is checked
 * against both region lengths first; on any error nothing was posted.
 *
 * @param [out] batch_p  New batch (release with kvf_ucx_batch_release()).
 * @return KVF_OK (posted; completion via kvf_ucx_batch_test/wait);
 *         KVF_ERR_OUT_OF_RANGE for a descriptor leaving a region;
 *         KVF_ERR_PEER_* when the peer already failed; UCX errors.
 */
kvf_status_t kvf_ucx_xfer_post(kvf_ucx_agent_h agent, kvf_ucx_peer_h peer, kvf_ucx_op_t op,
                               int local_region, int remote_region,
                               const kvf_xfer_desc_t *descs, size_t num_descs,
                               kvf_ucx_batch_h *batch_p);

/** KVF_INPROGRESS, KVF_OK, or the batch's error (peer errors included). Does not progress. */
kvf_status_t kvf_ucx_batch_test(kvf_ucx_batch_h batch);

/**
 * Progress until the batch completes or @a timeout_ms (ms; 0: test once)
 * passes. The deadline is checked on every progress round, however busy the
 * worker is. Owning thread only.
 * @return KVF_OK; the batch's error; KVF_ERR_PEER_TIMEOUT on timeout (the
 *         peer is then marked failed with that status).
 */
kvf_status_t kvf_ucx_batch_wait(kvf_ucx_batch_h batch, uint32_t timeout_ms);

/** Free a batch; an unfinished one is abandoned (its operations finish or fail inside UCX). */
void kvf_ucx_batch_release(kvf_ucx_batch_h batch);

/**
 * Send a notification (<= 4096 bytes) to the peer and wait, bounded by the
 * agent timeout (checked on every progress round), until UCX has sent it.
 * Owning thread only.
 * @return KVF_OK; KVF_ERR_INVALID_PARAM when @a len is too large; the
 *         peer's KVF_ERR_PEER_* status; KVF_ERR_PEER_TIMEOUT when not sent in
 *         time (the peer is then marked failed).
 */
kvf_status_t kvf_ucx_notify_send(kvf_ucx_agent_h agent, kvf_ucx_peer_h peer, const void *msg,
                                 size_t len);

/**
 * Take the oldest received notification, progressing up to @a timeout_ms
 * (0: progress once and check; the deadline is checked on every round).
 * Owning thread only. @return KVF_OK with *len_p set; when none arrived,
 * KVF_INPROGRESS if the worker did other work meanwhile (e.g. served a
 * peer's GET by active messages: the caller should keep progressing) or
 * KVF_ERR_PEER_TIMEOUT if it was idle; KVF_ERR_NO_RESOURCE when @a cap is
 * too small (kept queued).
 */
kvf_status_t kvf_ucx_notify_recv(kvf_ucx_agent_h agent, void *buf, size_t cap, size_t *len_p,
                                 uint32_t timeout_ms);

#endif
