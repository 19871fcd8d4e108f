/*
 * kvf_nccl.h in a build without NCCL: every call is refused
 * (KVF_KERN_EUNSUPPORTED). With NCCL the functions are in kvf_nccl_cuda.cu.
 */
#include "kvf_nccl.h"

#ifndef KVF_HAVE_NCCL
bool kvf_nccl_available(void)
{
    return false;
}

int kvf_nccl_id_make(kvf_nccl_id_t *id_p)
{
    (void)id_p;
    return KVF_KERN_EUNSUPPORTED;
}

int kvf_nccl_comm_init(const kvf_device_t *dev, const kvf_nccl_id_t *id, int nranks, int rank,
                       int64_t timeout_ms, kvf_nccl_comm_h *comm_p)
{
    (void)dev, (void)id, (void)nranks, (void)rank, (void)timeout_ms, (void)comm_p;
    return KVF_KERN_EUNSUPPORTED;
}

int kvf_nccl_all_reduce_sum(kvf_nccl_comm_h comm, const float *send, float *recv, size_t n)
{
    (void)comm, (void)send, (void)recv, (void)n;
    return KVF_KERN_EUNSUPPORTED;
}

int kvf_nccl_all_gather(kvf_nccl_comm_h comm, const float *send, float *recv, size_t n)
{
    (void)comm, (void)send, (void)recv, (void)n;
    return KVF_KERN_EUNSUPPORTED;
}

int kvf_nccl_all_gather_async(kvf_nccl_comm_h comm, const float *send, float *recv, size_t n)
{
    (void)comm, (void)send, (void)recv, (void)n;
    return KVF_KERN_EUNSUPPORTED;
}

int kvf_nccl_comm_settle(kvf_nccl_comm_h comm, const char *what)
{
    (void)comm, (void)what;
    return KVF_KERN_EUNSUPPORTED;
}

int kvf_nccl_broadcast(kvf_nccl_comm_h comm, const void *send, void *recv, size_t bytes,
                       int root)
{
    (void)comm, (void)send, (void)recv, (void)bytes, (void)root;
    return KVF_KERN_EUNSUPPORTED;
}

void kvf_nccl_comm_watch(kvf_nccl_comm_h comm, const int *cancel)
{
    (void)comm, (void)cancel;
}

const char *kvf_nccl_comm_error(kvf_nccl_comm_h comm)
{
    (void)comm;
    return "NCCL is not built in";
}

void kvf_nccl_comm_abort(kvf_nccl_comm_h comm)
{
    (void)comm;
}

int kvf_nccl_comm_finalize(kvf_nccl_comm_h comm)
{
    (void)comm;
    return KVF_KERN_EUNSUPPORTED;
}

bool kvf_nccl_comm_broken(kvf_nccl_comm_h comm)
{
    (void)comm;
    return true;
}

void kvf_nccl_comm_destroy(kvf_nccl_comm_h comm)
{
    (void)comm;
}
#else
typedef int kvf_nccl_c_empty_t;   /* the NCCL build defines everything in kvf_nccl_cuda.cu */
#endif
