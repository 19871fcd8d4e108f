/*
 * kvf_nccl.h over NCCL (built when the CUDA build finds NCCL).
 *
 * Design: the communicator is made non-blocking (config.blocking = 0), so
 * no NCCL call can hang a rank thread: init and every collective are polled
 * (ncclCommGetAsyncError for the communicator, cudaStreamQuery for the
 * collective's completion) until done or the deadline, checked on every
 * turn of the loop; past it the communicator is aborted (ncclCommAbort)
 * and marked broken, with the reason kept for kvf_nccl_comm_error(). An
 * abort ends this rank's kernels only: a peer's collective ends at its own
 * deadline, or at once when its owner sets the flag it watches
 * (kvf_nccl_comm_watch(): common/runtime sets it when any rank failed).
 * The broadcast is on bytes (ncclUint8) so any buffer can go. Rejected
 * alternative: blocking collectives plus a watchdog thread, which needs a
 * second thread per rank and cannot tell a slow peer from a dead one any
 * better.
 */
#include "kvf_cuda_util.h"
#include "kvf_nccl.h"
#include "kvf_time.h"

#include <nccl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static_assert(sizeof(ncclUniqueId) == KVF_NCCL_ID_BYTES, "KVF_NCCL_ID_BYTES");

/* a failure before there is a communicator to abort */
static int kvf_nccl_error(ncclResult_t r, const char *call)
{
    kvf_kern_report(call, ncclGetErrorString(r));
    return KVF_KERN_ENCCL;
}

struct kvf_nccl_comm {
    ncclComm_t   comm;
    kvf_device_t dev;
    int          nranks;
    int64_t      timeout_ms;
    bool         broken;
    bool         finalizing;   /* ncclCommFinalize issued, destroy waits for it */
    bool         pending;      /* an async collective not yet settled */
    const int   *cancel;       /* kvf_nccl_comm_watch(); NULL: none */
    char         why[320];     /* kvf_nccl_comm_error() once broken */
};

/* Record why (first failure only), report it, abort the communicator; returns @a rc. */
static int kvf_nccl_fail(kvf_nccl_comm *c, int rc, const char *what, const char *detail)
{
    if (!c->broken) {
        snprintf(c->why, sizeof(c->why), "%s: %s; communicator aborted", what, detail);
        kvf_kern_report(what, c->why);
        (void)ncclCommAbort(c->comm);
        c->broken = true;
    }
    return rc;
}

/* an NCCL failure: NCCL's string for the code and its last error text, then abort */
static int kvf_nccl_fail_nccl(kvf_nccl_comm *c, ncclResult_t r, const char *what)
{
    char detail[256];
    const char *last = c->broken ? NULL : ncclGetLastError(c->comm);

    snprintf(detail, sizeof(detail), "%s (%s)", ncclGetErrorString(r),
             ((last != NULL) && (last[0] != '\0')) ? last : "no further detail");
    return kvf_nccl_fail(c, KVF_KERN_ENCCL, what, detail);
}

/* poll the communicator (and, with @a stream_done, the stream) until ready or the deadline */
static int kvf_nccl_wait(kvf_nccl_comm *c, bool stream_done, const char *what)
{
    const uint64_t deadline = kvf_time_now_ms() + (uint64_t)c->timeout_ms;
    for (;;) {
        ncclResult_t async = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(c->comm, &async);
        if (r != ncclSuccess || (async != ncclSuccess && async != ncclInProgress)) {
            return kvf_nccl_fail_nccl(c, (r != ncclSuccess) ? r : async, what);
        }
        if (async == ncclSuccess) {
            if (!stream_done) {
                return KVF_KERN_OK;
            }
            cudaError_t q = cudaStreamQuery(kvf_cuda_stream_of(&c->dev));
            if (q == cudaSuccess) {
                return KVF_KERN_OK;
            }
            if (q != cudaErrorNotReady) {
                char detail[160];
                snprintf(detail, sizeof(detail), "the collective's stream failed: %s",
                         cudaGetErrorString(q));
                return kvf_nccl_fail(c, KVF_KERN_ECUDA, what, detail);
            }
        }
        if ((c->cancel != NULL) && (__atomic_load_n(c->cancel, __ATOMIC_ACQUIRE) != 0)) {
            return kvf_nccl_fail(c, KVF_KERN_ENCCL, what,
                                 "cancelled (another rank of the instance failed first)");
        }
        if (kvf_time_now_ms() >= deadline) {
            char detail[96];
            snprintf(detail, sizeof(detail), "not complete after %lld ms",
                     (long long)c->timeout_ms);
            return kvf_nccl_fail(c, KVF_KERN_ETIMEDOUT, what, detail);
        }
        sched_yield();
    }
}

extern "C" bool kvf_nccl_available(void)
{
    return true;
}

extern "C" int kvf_nccl_id_make(kvf_nccl_id_t *id_p)
{
    ncclUniqueId id;
    if (id_p == NULL) {
        return KVF_KERN_EINVAL;
    }
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) {
        return kvf_nccl_error(r, "ncclGetUniqueId(&id)");
    }
    memcpy(id_p->bytes, &id, sizeof(id));
    return KVF_KERN_OK;
}

extern "C" int kvf_nccl_comm_init(const kvf_device_t *dev, const kvf_nccl_id_t *id, int nranks,
                                  int rank, int64_t timeout_ms, kvf_nccl_comm_h *comm_p)
{
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    ncclUniqueId uid;
    kvf_nccl_comm *c;
    int rc;

    if ((dev == NULL) || (dev->kind != KVF_DEVICE_CUDA) || (id == NULL) || (nranks < 1) ||
        (rank < 0) || (rank >= nranks) || (timeout_ms <= 0) || (comm_p == NULL)) {
        return KVF_KERN_EINVAL;
    }
    c = (kvf_nccl_comm *)calloc(1, sizeof(*c));
    if (c == NULL) {
        return KVF_KERN_ENOMEM;
    }
    c->dev = *dev;
    c->nranks = nranks;
    c->timeout_ms = timeout_ms;
    memcpy(&uid, id->bytes, sizeof(uid));
    config.blocking = 0;
    KVF_CUDA_CHECK_GOTO(cudaSetDevice(dev->ordinal), rc, out_free);
    {
        ncclResult_t r = ncclCommInitRankConfig(&c->comm, nranks, uid, rank, &config);
        if ((r != ncclSuccess) && (r != ncclInProgress)) {
            rc = kvf_nccl_error(r, "ncclCommInitRankConfig(&comm, nranks, id, rank, &config)");
            goto out_free;
        }
    }
    rc = kvf_nccl_wait(c, false, "ncclCommInitRankConfig (wait)");
    if (rc != KVF_KERN_OK) {
        goto out_destroy;
    }
    *comm_p = c;
    return KVF_KERN_OK;
out_destroy:
    if (!c->broken) {
        (void)ncclCommAbort(c->comm);   /* a failed wait already aborted (and freed) it */
    }
out_free:
    free(c);
    return rc;
}

static int kvf_nccl_enqueued(kvf_nccl_comm *c, ncclResult_t r, const char *what)
{
    if ((r != ncclSuccess) && (r != ncclInProgress)) {
        return kvf_nccl_fail_nccl(c, r, what);
    }
    int rc = kvf_nccl_wait(c, true, what);
    if (rc == KVF_KERN_OK) {
        c->pending = false;   /* the stream ran everything before it too */
    }
    return rc;
}

extern "C" int kvf_nccl_all_reduce_sum(kvf_nccl_comm_h c, const float *send, float *recv,
                                       size_t n)
{
    if ((c == NULL) || (send == NULL) || (recv == NULL)) {
        return KVF_KERN_EINVAL;
    }
    if (c->broken) {
        return KVF_KERN_ENCCL;
    }
    if (n == 0) {
        return KVF_KERN_OK;
    }
    return kvf_nccl_enqueued(c, ncclAllReduce(send, recv, n, ncclFloat32, ncclSum, c->comm,
                                              kvf_cuda_stream_of(&c->dev)),
                             "ncclAllReduce(sum, fp32)");
}

/* ncclAllGather enqueued; with @a wait the stream waited for (deadline), else only NCCL's
 * enqueue (async errors checked) and the communicator marked pending */
static int kvf_nccl_gather(kvf_nccl_comm_h c, const float *send, float *recv, size_t n,
                           bool wait)
{
    if ((c == NULL) || (send == NULL) || (recv == NULL)) {
        return KVF_KERN_EINVAL;
    }
    if (c->broken) {
        return KVF_KERN_ENCCL;
    }
    if (n == 0) {
        return KVF_KERN_OK;
    }
    ncclResult_t r = ncclAllGather(send, recv, n, ncclFloat32, c->comm,
                                   kvf_cuda_stream_of(&c->dev));
    if (wait) {
        return kvf_nccl_enqueued(c, r, "ncclAllGather(fp32)");
    }
    if ((r != ncclSuccess) && (r != ncclInProgress)) {
        return kvf_nccl_fail_nccl(c, r, "ncclAllGather(fp32)");
    }
    int rc = kvf_nccl_wait(c, false, "ncclAllGather(fp32)");
    c->pending = c->pending || (rc == KVF_KERN_OK);
    return rc;
}

extern "C" int kvf_nccl_all_gather(kvf_nccl_comm_h c, const float *send, float *recv, size_t n)
{
    return kvf_nccl_gather(c, send, recv, n, true);
}

extern "C" int kvf_nccl_all_gather_async(kvf_nccl_comm_h c, const float *send, float *recv,
                                         size_t n)
{
    return kvf_nccl_gather(c, send, recv, n, false);
}

extern "C" int kvf_nccl_comm_settle(kvf_nccl_comm_h c, const char *what)
{
    if (c == NULL) {
        return KVF_KERN_EINVAL;
    }
    if (c->broken) {
        return KVF_KERN_ENCCL;
    }
    if (!c->pending) {
        return KVF_KERN_OK;
    }
    int rc = kvf_nccl_wait(c, true, (what != NULL) ? what : "collectives (settle)");
    if (rc == KVF_KERN_OK) {
        c->pending = false;
    }
    return rc;
}

extern "C" int kvf_nccl_broadcast(kvf_nccl_comm_h c, const void *send, void *recv,
                                  size_t bytes, int root)
{
    if ((c == NULL) || (send == NULL) || (recv == NULL) || (root < 0) || (root >= c->nranks)) {
        return KVF_KERN_EINVAL;
    }
    if (c->broken) {
        return KVF_KERN_ENCCL;
    }
    if (bytes == 0) {
        return KVF_KERN_OK;
    }
    return kvf_nccl_enqueued(c, ncclBroadcast(send, recv, bytes, ncclUint8, root, c->comm,
                                              kvf_cuda_stream_of(&c->dev)),
                             "ncclBroadcast(bytes)");
}

extern "C" void kvf_nccl_comm_watch(kvf_nccl_comm_h c, const int *cancel)
{
    if (c != NULL) {
        c->cancel = cancel;
    }
}

extern "C" bool kvf_nccl_comm_broken(kvf_nccl_comm_h c)
{
    return (c == NULL) || c->broken;
}

extern "C" const char *kvf_nccl_comm_error(kvf_nccl_comm_h c)
{
    if (c == NULL) {
        return "no communicator";
    }
    return c->broken ? c->why : NULL;
}

extern "C" void kvf_nccl_comm_abort(kvf_nccl_comm_h c)
{
    if (c != NULL) {
        (void)kvf_nccl_fail(c, KVF_KERN_ENCCL, "kvf_nccl_comm_abort", "aborted by its owner");
    }
}

extern "C" int kvf_nccl_comm_finalize(kvf_nccl_comm_h c)
{
    if (c == NULL) {
        return KVF_KERN_EINVAL;
    }
    if (c->broken || c->finalizing) {
        return KVF_KERN_OK;
    }
    ncclResult_t r = ncclCommFinalize(c->comm);
    if ((r != ncclSuccess) && (r != ncclInProgress)) {
        return kvf_nccl_fail_nccl(c, r, "ncclCommFinalize(comm)");
    }
    c->finalizing = true;
    return KVF_KERN_OK;
}

extern "C" void kvf_nccl_comm_destroy(kvf_nccl_comm_h c)
{
    if (c == NULL) {
        return;
    }
    /* non-blocking finalize: flush, bounded by the same deadline, else abort */
    if (!c->broken && (kvf_nccl_comm_finalize(c) == KVF_KERN_OK) && !c->broken) {
        c->cancel = NULL;   /* the owner's cancel flag may be set already: finish the flush */
        (void)kvf_nccl_wait(c, false, "ncclCommFinalize (wait)");
    }
    if (!c->broken) {
        (void)ncclCommDestroy(c->comm);
    }
    free(c);
}
