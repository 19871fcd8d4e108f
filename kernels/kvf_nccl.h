/*
 * NCCL collectives for TP ranks that are GPUs (one process, one thread per
 * rank, one device per rank): one communicator per instance, made at start
 * and destroyed at exit; fp32 sum all-reduce and all-gather on the rank's
 * stream, each waited for with a deadline (or, kvf_nccl_all_gather_async(), enqueued
 * and waited for later by kvf_nccl_comm_settle(), with the same deadline). A collective that misses its
 * deadline, or that NCCL reports failed asynchronously, ABORTS the
 * communicator (ncclCommAbort) and marks it broken: every later call on it
 * fails at once with KVF_KERN_ENCCL, and the owner marks the instance
 * unhealthy (common/runtime decides; this layer only reports).
 *
 * Built when the CUDA build finds NCCL (nccl.h and libnccl); otherwise every
 * function returns KVF_KERN_EUNSUPPORTED and kvf_nccl_available() is false.
 * CPU ranks keep common/runtime's CPU collectives.
 *
 * Used by common/runtime's NCCL world (kvf_collectives_nccl.c: one
 * communicator per rank for the whole instance and one per span group, all
 * made at start). Compiled and linked only, never run on a GPU.
 *
 * Threads: a communicator is used by its rank's thread, except
 * kvf_nccl_comm_finalize()/destroy()/abort(), which one thread may call for
 * every rank's communicator once no collective runs (finalize all first,
 * then destroy all: a finalize completes only when every rank finalized).
 */
#ifndef KVF_NCCL_H
#define KVF_NCCL_H

#include "kvf_device.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVF_NCCL_ID_BYTES 128   /* sizeof(ncclUniqueId) */

/** The instance's rendezvous id: made once (kvf_nccl_id_make), handed to every rank. */
typedef struct kvf_nccl_id {
    unsigned char bytes[KVF_NCCL_ID_BYTES];
} kvf_nccl_id_t;

typedef struct kvf_nccl_comm *kvf_nccl_comm_h;

/** True when this build has NCCL compiled in. */
bool kvf_nccl_available(void);

/** A fresh id (ncclGetUniqueId). @return KVF_KERN_OK, KVF_KERN_EINVAL, KVF_KERN_ENCCL, EUNSUPPORTED. */
int kvf_nccl_id_make(kvf_nccl_id_t *id_p);

/**
 * This rank's communicator: every rank thread calls it at once with the
 * same id (non-blocking init, polled until ready or @a timeout_ms passes,
 * then aborted). Collectives go on dev->stream; @a dev must stay valid.
 *
 * @param [in]  dev         The rank's CUDA device (its stream is used).
 * @param [in]  id          From kvf_nccl_id_make(), the same for all ranks.
 * @param [in]  nranks      Ranks in the instance, >= 1.
 * @param [in]  rank        This rank, [0, nranks).
 * @param [in]  timeout_ms  Deadline of the init and of every collective, > 0.
 * @param [out] comm_p      Set on success; destroy with kvf_nccl_comm_destroy().
 * @return KVF_KERN_OK; KVF_KERN_EINVAL; KVF_KERN_ENOMEM; KVF_KERN_ECUDA;
 *         KVF_KERN_ENCCL; KVF_KERN_ETIMEDOUT (aborted); KVF_KERN_EUNSUPPORTED.
 */
int kvf_nccl_comm_init(const kvf_device_t *dev, const kvf_nccl_id_t *id, int nranks, int rank,
                       int64_t timeout_ms, kvf_nccl_comm_h *comm_p);

/**
 * recv[i] = sum over ranks of send[i], i < n (fp32, device memory; send may
 * equal recv), enqueued on the rank's stream and waited for.
 * @return KVF_KERN_OK; KVF_KERN_EINVAL; KVF_KERN_ENCCL (failed, or the
 *         communicator is broken); KVF_KERN_ETIMEDOUT (deadline: aborted).
 */
int kvf_nccl_all_reduce_sum(kvf_nccl_comm_h comm, const float *send, float *recv, size_t n);

/**
 * recv[r * n + i] = send of rank r [i] (fp32, device memory; recv holds
 * nranks * n, must not overlap send). Errors as kvf_nccl_all_reduce_sum().
 */
int kvf_nccl_all_gather(kvf_nccl_comm_h comm, const float *send, float *recv, size_t n);

/**
 * kvf_nccl_all_gather() without the wait: enqueued on the rank's stream (NCCL's own
 * enqueue completed: a non-blocking communicator's "in progress" is waited out, with the
 * deadline) and the communicator marked pending; kvf_nccl_comm_settle() waits for it.
 * For collectives whose result only later kernels on the same stream read (a forward's
 * all-reduces), so a step does not drain the GPU once per collective. Before the host
 * reads anything those kernels wrote (a device->host copy), settle first: a copy would
 * wait on a hung collective without a deadline. Errors as kvf_nccl_all_gather().
 */
int kvf_nccl_all_gather_async(kvf_nccl_comm_h comm, const float *send, float *recv, size_t n);

/**
 * Wait, with the communicator's deadline and cancel flag, until the stream has run
 * every collective enqueued on it (a pending kvf_nccl_all_gather_async() included, and any
 * work before it); a communicator with nothing pending returns at once.
 * @param [in] what  The collective's name for the error.
 * @return KVF_KERN_OK; KVF_KERN_EINVAL (NULL); KVF_KERN_ENCCL (failed, cancelled or
 *         broken); KVF_KERN_ETIMEDOUT (deadline: aborted); KVF_KERN_ECUDA (the stream
 *         failed: aborted).
 */
int kvf_nccl_comm_settle(kvf_nccl_comm_h comm, const char *what);

/**
 * recv[i] = send of rank @a root [i], i < @a bytes (device memory; send is
 * read on the root only and may equal recv). Errors as
 * kvf_nccl_all_reduce_sum(), plus KVF_KERN_EINVAL for a root outside [0, nranks).
 */
int kvf_nccl_broadcast(kvf_nccl_comm_h comm, const void *send, void *recv, size_t bytes,
                       int root);

/**
 * Let @a cancel end this communicator's waits early: while *cancel is 0 it is
 * ignored; once another thread stores non-zero in it (__atomic_store_n,
 * release), a wait in progress or begun later aborts the communicator and
 * fails with KVF_KERN_ENCCL ("cancelled"). For a world whose other rank
 * already failed, so that the peers do not wait out their deadline. @a cancel
 * must outlive the communicator; NULL removes it.
 */
void kvf_nccl_comm_watch(kvf_nccl_comm_h comm, const int *cancel);

/** True after a failure or a timeout aborted the communicator. */
bool kvf_nccl_comm_broken(kvf_nccl_comm_h comm);

/**
 * Why the communicator broke, or NULL while it is healthy: "<call>: <NCCL's
 * error string> (<ncclGetLastError>); communicator aborted", "<call>: not
 * complete after T ms; communicator aborted", or "<call>: cancelled ...".
 * Stable once set, valid until destroy.
 */
const char *kvf_nccl_comm_error(kvf_nccl_comm_h comm);

/** Abort the communicator now (ncclCommAbort) and mark it broken; idempotent; NULL is a no-op. */
void kvf_nccl_comm_abort(kvf_nccl_comm_h comm);

/**
 * Begin a non-blocking finalize (ncclCommFinalize) without waiting for it;
 * kvf_nccl_comm_destroy() then waits (bounded by the communicator's timeout,
 * past it aborts). Lets one thread finalize every rank's communicator before
 * it waits for any. A broken communicator is left alone. @return KVF_KERN_OK;
 * KVF_KERN_ENCCL (then aborted); KVF_KERN_EUNSUPPORTED.
 */
int kvf_nccl_comm_finalize(kvf_nccl_comm_h comm);

/** Finalize (healthy: bounded wait) or abort (broken), then free; NULL is a no-op. */
void kvf_nccl_comm_destroy(kvf_nccl_comm_h comm);

#ifdef __cplusplus
}
#endif

#endif
