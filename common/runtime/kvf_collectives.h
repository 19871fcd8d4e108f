/*
 * TP collectives behind an ops table (docs/ARCHITECTURE.md §5). One backend exists: CPU
 * ranks of one process, over shared buffers and a barrier.
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
 */
#ifndef KVF_COLLECTIVES_H
#define KVF_COLLECTIVES_H

#include "kvf_status.h"

#include <stddef.h>
#include <stdint.h>

#define KVF_COMM_ABI      1
#define KVF_COMM_MAX_RANKS 64
#define KVF_COMM_BARRIER_TIMEOUT_MS 60000u   /* default; kvf_comm_world_set_barrier() */

typedef struct kvf_comm_world *kvf_comm_world_h;

typedef struct kvf_comm_ops {
    unsigned    abi_version;   /* KVF_COMM_ABI */
    const char *name;          /* "cpu"; logs only */

    /* In-place sum of n floats over the `span` consecutive ranks
     * [rank / span * span, +span). span must divide the world size.
     * Blocks until every rank of the world has entered the call. */
    kvf_status_t (*all_reduce_sum_f32)(void *ctx, int rank, float *buf, size_t n, int span);

    /* Copy n bytes from root's buf into every other rank's buf. */
    kvf_status_t (*broadcast)(void *ctx, int rank, void *buf, size_t n, int root);

    /* Return once every rank has entered. KVF_ERR_TIMED_OUT when the world
     * broke (a barrier timed out), from then on for every collective. */
    kvf_status_t (*barrier)(void *ctx, int rank);
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
 * Name the world's barrier (for the timeout error, e.g. "prefill-0 tp") and
 * set its timeout in ms (0: wait forever). Before any rank enters a
 * collective. @return KVF_OK; KVF_ERR_INVALID_PARAM for a NULL or empty
 * name or one of 64 bytes or more.
 */
kvf_status_t kvf_comm_world_set_barrier(kvf_comm_world_h world, const char *name,
                                        uint32_t timeout_ms);

/**
 * Why the world broke ("<name> barrier of N ranks timed out after T ms:
 * ..."), or NULL while it is healthy. Any thread; the text is stable once set.
 */
const char *kvf_comm_world_error(kvf_comm_world_h world);

/** Free the world. No rank may be inside a collective. NULL is a no-op. */
void kvf_comm_world_destroy(kvf_comm_world_h world);

/** Handle of rank @a rank in [0, size); valid until the world is destroyed. */
kvf_comm_t *kvf_comm_world_rank(kvf_comm_world_h world, int rank);

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

static inline kvf_status_t kvf_comm_broadcast(kvf_comm_t *comm, void *buf, size_t n, int root)
{
    return (comm->size == 1) ? KVF_OK : comm->ops->broadcast(comm->ctx, comm->rank, buf, n, root);
}

static inline kvf_status_t kvf_comm_barrier(kvf_comm_t *comm)
{
    return (comm->size == 1) ? KVF_OK : comm->ops->barrier(comm->ctx, comm->rank);
}

#endif
