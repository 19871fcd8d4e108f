/*
 * kernels/ common definitions: return codes and the conventions every kernel
 * follows.
 *
 * kernels/ is a leaf (like a BLAS): it includes only its own headers, libc,
 * cblas and the CUDA runtime, and reports errors as small negative ints that
 * common/ maps to kvf_status_t (KVF_KERN_EINVAL -> KVF_ERR_INVALID_PARAM,
 * KVF_KERN_ENOMEM -> KVF_ERR_NO_MEMORY, KVF_KERN_ECUDA -> KVF_ERR_CUDA,
 * KVF_KERN_EUNSUPPORTED -> KVF_ERR_UNSUPPORTED, KVF_KERN_ENCCL -> KVF_ERR_NCCL,
 * KVF_KERN_ETIMEDOUT -> KVF_ERR_TIMED_OUT).
 *
 * Conventions shared by every kernel entry point:
 * - The first argument is the device (kernels/kvf_device.h) whose memory the
 *   pointers live in; NULL means the CPU. Every kernel has a CPU version; a
 *   build without CUDA returns KVF_KERN_EUNSUPPORTED for a CUDA device. On
 *   a CUDA device every array argument is device memory unless documented
 *   HOST. The arithmetic is written once for both (kvf_hd.h).
 * - Compute is fp32. Activations and weights are fp32 arrays; caches (KV,
 *   conv state, SSM state) may be stored fp32, bf16 or fp16 and are converted
 *   on load/store (base/kvf_dtype.h).
 * - Shapes are given in elements, row-major, with the last index fastest.
 *   "ld" parameters are row strides in elements (>= the row length).
 * - Kernels never allocate memory the caller must free, never print, and
 *   never keep pointers after returning. On error nothing has been written
 *   unless the docstring says otherwise. A failed CUDA call is reported once,
 *   where it fails, through kvf_kern_report() (kvf_cuda_check.h).
 * - Kernels are reentrant: different threads (TP ranks) may call them at the
 *   same time on disjoint outputs.
 */
#ifndef KVF_KERN_H
#define KVF_KERN_H

#define KVF_KERN_OK             0
#define KVF_KERN_EINVAL        -1  /* bad argument: NULL, bad shape, bad dtype */
#define KVF_KERN_ENOMEM        -2  /* host or device allocation failed */
#define KVF_KERN_ECUDA         -3  /* a CUDA runtime call or launch failed */
#define KVF_KERN_EUNSUPPORTED  -4  /* no implementation for this device/dtype */
#define KVF_KERN_ENCCL         -5  /* an NCCL call failed (kvf_nccl.h) */
#define KVF_KERN_ETIMEDOUT     -6  /* a device wait passed its deadline */

#ifdef __cplusplus
extern "C" {
#endif

/** Short static string for a KVF_KERN_* code ("invalid argument", ...). */
const char *kvf_kern_strerror(int err);

/**
 * Receives each failed foreign call inside kernels/ (today: CUDA runtime
 * calls): @a call is the call's source text, @a error the library's message
 * (cudaGetErrorString()); both static or valid only during the call.
 */
typedef void (*kvf_kern_report_func_t)(const char *call, const char *error);

/**
 * Install @a func as the reporter (NULL: the default, which logs the call
 * with kvf_error() of base/kvf_log.h). Process-wide; may be called from
 * any thread; a report racing with the change goes to the old or new one.
 */
void kvf_kern_set_report_func(kvf_kern_report_func_t func);

/** Hand a failed call to the installed reporter, if any; any thread. */
void kvf_kern_report(const char *call, const char *error);

#ifdef __cplusplus
}
#endif

#endif
