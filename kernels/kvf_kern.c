/*
 * Strings for the kernels/ return codes.
 */
#include "kvf_kern.h"

const char *kvf_kern_strerror(int err)
{
    switch (err) {
    case KVF_KERN_OK:           return "success";
    case KVF_KERN_EINVAL:       return "invalid argument";
    case KVF_KERN_ENOMEM:       return "out of memory";
    case KVF_KERN_ECUDA:        return "cuda call failed";
    case KVF_KERN_EUNSUPPORTED: return "not supported on this device";
    default:                    return "unknown kernel error";
    }
}
