/*
 * Strings for the kernels/ return codes, and the reporter for failed foreign
 * calls (kvf_kern_report()).
 */
#include "kvf_kern.h"
#include "kvf_log.h"

#include <stdatomic.h>
#include <stddef.h>

/* zero-initialized (NULL); clang refuses a (void *)0 initializer for an atomic function pointer */
static _Atomic(kvf_kern_report_func_t) kvf_kern_report_func;

void kvf_kern_set_report_func(kvf_kern_report_func_t func)
{
    atomic_store(&kvf_kern_report_func, func);
}

void kvf_kern_report(const char *call, const char *error)
{
    kvf_kern_report_func_t func = atomic_load(&kvf_kern_report_func);

    if (func != NULL) {
        func(call, error);
    } else {
        kvf_error("%s failed: %s", call, error);    /* the default reporter: the log */
    }
}

const char *kvf_kern_strerror(int err)
{
    switch (err) {
    case KVF_KERN_OK:           return "success";
    case KVF_KERN_EINVAL:       return "invalid argument";
    case KVF_KERN_ENOMEM:       return "out of memory";
    case KVF_KERN_ECUDA:        return "cuda call failed";
    case KVF_KERN_EUNSUPPORTED: return "not supported on this device";
    case KVF_KERN_ENCCL:        return "nccl call failed";
    case KVF_KERN_ETIMEDOUT:    return "device wait timed out";
    default:                    return "unknown kernel error";
    }
}
