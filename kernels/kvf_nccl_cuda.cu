/*
 * kvf_nccl.h over NCCL (built when the CUDA build finds NCCL).
 *
 * Design: the communicator is made non-blocking (config.blocking = 0), so
 * no NCCL call can hang a rank thread: init and every collective are polled
 * (ncclCommGetAsyncError for the communicator, cudaStreamQuery for the
 * collective's completion) until done or the deadline, checked on every
 * turn of the loop; past it the communicator is aborted (ncclCommAbort,
 * which also unblocks the peers' kernels) and marked broken. Rejected
 * alternative: blocking collectives plus a watchdog thread, which needs a
 * second thread per rank and cannot tell a slow peer from a dead one any
 * better.
 */
#include "kvf_cuda_util.h"
#include "kvf_nccl.h"
#include "kvf_time.h"

#include <nccl.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

static_assert(sizeof(ncclUniqueId) == KVF_NCCL_ID_BYTES, "KVF_NCCL_ID_BYTES");

struct kvf_nccl_comm {
    ncclComm_t   comm;
    kvf_device_t dev;
    int          nranks;
    int64_t      timeout_ms;
    bool         broken;
};

static int kvf_nccl_error(ncclResult_t r, const char *call)
{
    kvf_kern_report(call, ncclGetErrorString(r));
    return KVF_KERN_ENCCL;
}

static void kvf_nccl_abort(kvf_nccl_comm *c, const char *why)
{
    if (!c->broken) {
        kvf_kern_report(why, "communicator aborted");
        (void)ncclCommAbort(c->comm);
        c->broken = true;
    }
}

/* poll the communicator (and, with @a stream_done, the stream) until ready or the deadline */
static int kvf_nccl_wait(kvf_nccl_comm *c, bool stream_done, const char *what)
{
    const uint64_t deadline = kvf_time_now_ms() + (uint64_t)c->timeout_ms;
    for (;;) {
        ncclResult_t async = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(c->comm, &async);
        if (r != ncclSuccess || (async != ncclSuccess && async != ncclInProgress)) {
            int rc = kvf_nccl_error((r != ncclSuccess) ? r : async, what);
            kvf_nccl_abort(c, what);
            return rc;
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
                int rc = kvf_cuda_error(q, "cudaStreamQuery(collective stream)");
                kvf_nccl_abort(c, what);
                return rc;
            }
        }
        if (kvf_time_now_ms() >= deadline) {
            kvf_nccl_abort(c, what);
            return KVF_KERN_ETIMEDOUT;
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
        int rc = kvf_nccl_error(r, what);
        kvf_nccl_abort(c, what);
        return rc;
    }
    return kvf_nccl_wait(c, true, what);
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

extern "C" int kvf_nccl_all_gather(kvf_nccl_comm_h c, const float *send, float *recv, size_t n)
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
    return kvf_nccl_enqueued(c, ncclAllGather(send, recv, n, ncclFloat32, c->comm,
                                              kvf_cuda_stream_of(&c->dev)),
                             "ncclAllGather(fp32)");
}

extern "C" bool kvf_nccl_comm_broken(kvf_nccl_comm_h c)
{
    return (c == NULL) || c->broken;
}

extern "C" void kvf_nccl_comm_destroy(kvf_nccl_comm_h c)
{
    if (c == NULL) {
        return;
    }
    if (!c->broken) {
        /* non-blocking finalize: flush, bounded by the same deadline, else abort */
        ncclResult_t r = ncclCommFinalize(c->comm);
        if (((r != ncclSuccess) && (r != ncclInProgress)) ||
            (kvf_nccl_wait(c, false, "ncclCommFinalize (wait)") != KVF_KERN_OK)) {
            kvf_nccl_abort(c, "ncclCommFinalize");
        }
    }
    if (!c->broken) {
        (void)ncclCommDestroy(c->comm);
    }
    free(c);
}
