/*
 * Mapping of kernels/ return codes (kernels/kvf_kern.h) to kvf_status_t.
 */
#ifndef KVF_KERN_STATUS_H
#define KVF_KERN_STATUS_H

#include "kvf_status.h"
#include "kvf_kern.h"

/**
 * KVF_KERN_OK -> KVF_OK, KVF_KERN_EINVAL -> KVF_ERR_INVALID_PARAM,
 * KVF_KERN_ENOMEM -> KVF_ERR_NO_MEMORY, KVF_KERN_ECUDA -> KVF_ERR_CUDA,
 * KVF_KERN_EUNSUPPORTED -> KVF_ERR_UNSUPPORTED, KVF_KERN_ENCCL -> KVF_ERR_NCCL,
 * KVF_KERN_ETIMEDOUT -> KVF_ERR_TIMED_OUT; anything else -> KVF_ERR_IO.
 */
static inline kvf_status_t kvf_status_from_kern(int kern_err)
{
    switch (kern_err) {
    case KVF_KERN_OK:           return KVF_OK;
    case KVF_KERN_EINVAL:       return KVF_ERR_INVALID_PARAM;
    case KVF_KERN_ENOMEM:       return KVF_ERR_NO_MEMORY;
    case KVF_KERN_ECUDA:        return KVF_ERR_CUDA;
    case KVF_KERN_EUNSUPPORTED: return KVF_ERR_UNSUPPORTED;
    case KVF_KERN_ENCCL:        return KVF_ERR_NCCL;
    case KVF_KERN_ETIMEDOUT:    return KVF_ERR_TIMED_OUT;
    default:                    return KVF_ERR_IO;
    }
}

#endif
