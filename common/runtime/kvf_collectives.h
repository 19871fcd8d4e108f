/*
 * TP collectives behind an ops table (docs/ARCHITECTURE.md §5). Two backends:
 * CPU ranks of one process, over shared buffers and a barrier
 * (kvf_collectives.c); GPU ranks (one thread and one CUDA device per rank)
 * over NCCL (kvf_collectives_nccl.c, through kernels/kvf_nccl.h).
 * kvf_comm_world_create() picks one by the ranks' device kind.
 *
 * A communicator world of `size` ranks is created once per instance; each
 * rank thread then uses its own kvf_comm_t handle. Every collective must be
 * called by all ranks of the world in the same order (the usual MPI/NCCL
 * rule), even ranks with nothing to contribute.
 *
 * Determinism: the CPU backend sums rank buffers in rank order, so every
 * rank of a span gets bit-identical results.
 *
 * Threads: each rank's handle is used by one thread at a time; the world
 * is shared. Every collective meets the other ranks at a barrier bounded
 * by the world's barrier timeout (default KVF_COMM_BARRIER_TIMEOUT_MS). A
 * barrier that times out breaks the world: that collective and every later
 * one, on every rank, return KVF_ERR_TIMED_OUT (logged once, with the
 * barrier's name and timeout; kvf_comm_world_error() returns the text).
 *
 * NCCL world: every rank thread calls kvf_comm_rank_start() once, all at
 * the same time, before its first collective (it makes the rank's
 * communicators: one over the world, one per span group); a rank that did
 * not starts in its first collective instead (init failures then surface
 * there, not at start-up). Buffers may be
 * device memory of the rank's device (used in place) or host memory
 * (staged through a device buffer of the rank); the result is in @a buf
 * when the call returns. Each collective waits at most the world's timeout
 * (kvf_comm_world_set_barrier(), default KVF_COMM_BARRIER_TIMEOUT_MS). A
 * collective that times out or that NCCL fails aborts that communicator
 * (ncclCommAbort) and breaks the world, as a CPU barrier timeout does: the
 * peers' waits are cancelled, every later collective of every rank fails at
 * once (KVF_ERR_TIMED_OUT for a timeout, else KVF_ERR_NCCL) without
 * entering NCCL, and kvf_comm_world_error() names the collective, the rank
 * and NCCL's error string, which the daemons publish as
 * HealthReply.cannot_serve (daemon/kvf_role.h) before they exit to be
 * restarted. Compiled, not yet run on a GPU.
 */
#ifndef KVF_COLLECTIVES_H
#define KVF_COLLECTIVES_H

#include "kvf_device.h"
#include "kvf_nccl.h"
#include "kvf_status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVF_COMM_ABI      1
#define KVF_COMM_MAX_RANKS 64
#define KVF_COMM_BARRIER_TIMEOUT_MS 60000u   /* default; kvf_comm_world_set_barrier() */

typedef struct kvf_comm_world *kvf_comm_world_h;

typedef struct kvf_comm_ops {
    unsigned    abi_version;   /* KVF_COMM_ABI */
    const char *name;          /* "cpu", "nccl"; logs only */

    /* In-place sum of n floats over the `span` consecutive ranks
     * [rank / span * span, +span). span must divide the world size.
     * Blocks until every rank of the world has entered the call. */
    kvf_status_t (*all_reduce_sum_f32)(void *ctx, int rank, float *buf, size_t n, int span);

    /* Copy n bytes from root's buf into every other rank's buf. */
    kvf_status_t (*broadcast)(void *ctx, int rank, void *buf, size_t n, int root);

    /* Return once every rank has entered. KVF_ERR_TIMED_OUT when the world
     * broke (a barrier timed out), from then on for every collective. */
    kvf_status_t (*barrier)(void *ctx, int rank);

    /* Return once every collective this rank began has completed (NULL: every call
     * completes before it returns, as the CPU world's). The NCCL world's all-reduces of
     * device buffers only enqueue (the kernels after them on the rank's stream read the
     * sums); this waits for them with the world's deadline. */
    kvf_status_t (*settle)(void *ctx, int rank);
} kvf_comm_ops_t;

/** One rank's view of a world; a value, owned by the world. */
typedef struct kvf_comm {
    const kvf_comm_ops_t *ops;
    void                 *ctx;
    int                   rank;
    int                   size;
} kvf_comm_t;

/**
 * Create the CPU world of @a size ranks (threads of one process).
 * @return KVF_OK; KVF_ERR_INVALID_PARAM for size outside [1, KVF_COMM_MAX_RANKS];
 *         KVF_ERR_NO_MEMORY.
 */
kvf_status_t kvf_comm_world_create_cpu(int size, kvf_comm_world_h *world_p);

/**
 * The world of @a size ranks on devices of @a kind: KVF_DEVICE_CPU is
 * kvf_comm_world_create_cpu() (@a devs ignored, may be NULL);
 * KVF_DEVICE_CUDA is the NCCL world, rank r on @a devs[r] (each a CUDA
 * device from kvf_device_init(), a distinct ordinal per rank: NCCL takes
 * one GPU per rank; the device values are copied, collectives go on their
 * streams).
 * @return KVF_OK; KVF_ERR_INVALID_PARAM for a size outside [1,
 *         KVF_COMM_MAX_RANKS], an unknown kind, NULL @a devs for CUDA, a rank
 *         whose device is not CUDA or two ranks on one GPU (logged, naming
 *         the ranks); KVF_ERR_UNSUPPORTED for CUDA in a build without NCCL,
 *         or with no CUDA device visible (logged, saying which);
 *         KVF_ERR_NCCL when no NCCL id could be made; KVF_ERR_NO_MEMORY.
 */
kvf_status_t kvf_comm_world_create(kvf_device_kind_t kind, int size, const kvf_device_t *devs,
                                   kvf_comm_world_h *world_p);

/**
 * Make rank @a comm's part of its world; each rank's own thread, all ranks
 * at the same time, once, before the rank's first collective. CPU world:
 * nothing to do. NCCL world: binds the rank's device to the calling thread
 * and makes its communicators (each init bounded by the world's timeout).
 * @return KVF_OK; KVF_ERR_INVALID_PARAM (started twice); KVF_ERR_NCCL,
 *         KVF_ERR_TIMED_OUT, KVF_ERR_CUDA, KVF_ERR_NO_MEMORY (logged); a
 *         failed start breaks the world.
 */
kvf_status_t kvf_comm_rank_start(kvf_comm_t *comm);

/** The backend of @a world: "cpu" or "nccl". */
const char *kvf_comm_world_kind(kvf_comm_world_h world);

/**
 * Name the world's barrier (for the timeout error, e.g. "prefill-0 tp") and
 * set its timeout in ms (0: wait forever). Before any rank enters a
 * collective (NCCL world: before kvf_comm_rank_start(); every NCCL wait has
 * a deadline, so 0 is refused there). @return KVF_OK;
 * KVF_ERR_INVALID_PARAM for a NULL or empty name or one of 64 bytes or
 * more, or (NCCL) a 0 timeout or a rank already started.
 */
kvf_status_t kvf_comm_world_set_barrier(kvf_comm_world_h world, const char *name,
                                        uint32_t timeout_ms);

/**
 * Why the world broke ("<name> barrier of N ranks timed out after T ms:
 * ..."), or NULL while it is healthy. Any thread; the text is stable once set.
 */
const char *kvf_comm_world_error(kvf_comm_world_h world);

/**
 * Free the world. No rank may be inside a collective; any thread. NCCL:
 * every communicator is finalized (all begun, then each waited for, bounded
 * by the timeout) or, in a broken world, aborted. NULL is a no-op.
 */
void kvf_comm_world_destroy(kvf_comm_world_h world);

/** Handle of rank @a rank in [0, size); valid until the world is destroyed. */
kvf_comm_t *kvf_comm_world_rank(kvf_comm_world_h world, int rank);

/**
 * What the NCCL world calls: kernels/kvf_nccl.h's functions, or (TEST ONLY,
 * fault-injection builds: kvf_comm_world_create_nccl_test()) a fake NCCL on
 * the CPU, so that a test runs the NCCL world's own code (rank start, span
 * communicators, staging, failure and fail-fast). Same contracts as the
 * kvf_nccl_* functions.
 */
typedef struct kvf_comm_nccl_backend {
    int  (*id_make)(kvf_nccl_id_t *id_p);
    int  (*comm_init)(const kvf_device_t *dev, const kvf_nccl_id_t *id, int nranks, int rank,
                      int64_t timeout_ms, kvf_nccl_comm_h *comm_p);
    void (*comm_watch)(kvf_nccl_comm_h comm, const int *cancel);
    int  (*all_reduce_sum)(kvf_nccl_comm_h comm, const float *send, float *recv, size_t n);
    int  (*broadcast)(kvf_nccl_comm_h comm, const void *send, void *recv, size_t bytes,
                      int root);
    const char *(*comm_error)(kvf_nccl_comm_h comm);
    void (*comm_abort)(kvf_nccl_comm_h comm);
    int  (*comm_finalize)(kvf_nccl_comm_h comm);
    void (*comm_destroy)(kvf_nccl_comm_h comm);
    int  (*all_gather)(kvf_nccl_comm_h comm, const float *send, float *recv, size_t n);
    /* kvf_nccl_all_gather_async() and kvf_nccl_comm_settle(); a backend without them
     * (NULL) runs every all-gather to completion */
    int  (*all_gather_async)(kvf_nccl_comm_h comm, const float *send, float *recv, size_t n);
    int  (*comm_settle)(kvf_nccl_comm_h comm, const char *what);
} kvf_comm_nccl_backend_t;

#ifdef KVF_FAULT_INJECTION
/**
 * TEST ONLY: the NCCL world of @a size ranks on @a devs (any kind: a fake
 * backend on CPU devices stages through host memory) over @a backend
 * (copied). @return as kvf_comm_world_create() for CUDA, without the
 * device checks.
 */
kvf_status_t kvf_comm_world_create_nccl_test(int size, const kvf_device_t *devs,
                                             const kvf_comm_nccl_backend_t *backend,
                                             kvf_comm_world_h *world_p);
#endif

/** Sum @a n floats at @a buf over all ranks, in place. */
static inline kvf_status_t kvf_comm_all_reduce(kvf_comm_t *comm, float *buf, size_t n)
{
    return (comm->size == 1) ? KVF_OK :
           comm->ops->all_reduce_sum_f32(comm->ctx, comm->rank, buf, n, comm->size);
}

/**
 * Sum over the @a span consecutive ranks that contain this rank (e.g. the
 * ranks sharing one replicated Mamba group). span 1 is a no-op but the call
 * still synchronises with the world.
 */
static inline kvf_status_t kvf_comm_all_reduce_span(kvf_comm_t *comm, float *buf, size_t n,
                                                    int span)
{
    return (comm->size == 1) ? KVF_OK :
           comm->ops->all_reduce_sum_f32(comm->ctx, comm->rank, buf, n, span);
}

/**
 * Wait until every collective this rank began has completed: a no-op for a world of one
 * rank or the CPU world (their collectives complete before they return); the NCCL world
 * waits for its enqueued all-reduces of device buffers, with the world's deadline (a
 * hung one breaks the world, naming it). Call before the host reads what kernels after
 * such an all-reduce wrote (a forward's end, before the sampled ids come back).
 */
static inline kvf_status_t kvf_comm_settle(kvf_comm_t *comm)
{
    return ((comm->size == 1) || (comm->ops->settle == NULL)) ? KVF_OK :
           comm->ops->settle(comm->ctx, comm->rank);
}

static inline kvf_status_t kvf_comm_broadcast(kvf_comm_t *comm, void *buf, size_t n, int root)
{
    return (comm->size == 1) ? KVF_OK : comm->ops->broadcast(comm->ctx, comm->rank, buf, n, root);
}

static inline kvf_status_t kvf_comm_barrier(kvf_comm_t *comm)
{
    return (comm->size == 1) ? KVF_OK : comm->ops->barrier(comm->ctx, comm->rank);
}

#endif
