/*
 * Device layer: where cache memory lives and the few byte operations the
 * engine needs on it (allocate, free, memset, copy, and block zeroing).
 *
 * A kvf_device_t is a small value (kind + ordinal + stream), copied freely.
 * CPU is the default and needs no initialisation: a zeroed kvf_device_t, or a
 * NULL device pointer, is the CPU. The CUDA path is taken only when
 * dev->kind == KVF_DEVICE_CUDA, so CPU-only runs never call into CUDA, even
 * in a build that has CUDA compiled in.
 *
 * CUDA ordering: memset, zero, kernel calls and host->device or
 * device->device copies on a CUDA device are enqueued on dev->stream (NULL
 * = the legacy default stream) and return before they complete;
 * device->host copies wait for the stream (kvf_device_memcpy()). Work
 * enqueued on one stream runs in order, so zeroing fresh blocks and then
 * launching a kernel on the same stream is safe without a sync; anything
 * that reads device memory outside that stream (UCX, another stream,
 * another process) needs kvf_device_sync() first. CPU operations complete
 * before return.
 *
 * Workspaces: a stream that runs a step's kernels gets one at start
 * (kvf_device_workspace_reserve()): the launchers' scratch and the host
 * inputs they upload come from it, so a step allocates nothing and the
 * host never blocks on a copy except for the results it reads back.
 *
 * Every kernel of kernels/ has a CUDA version (kvf_device_cuda.h lists the
 * launchers); its arithmetic is the CPU's, shared in kvf_*_math.h. A build
 * without CUDA returns KVF_KERN_EUNSUPPORTED for a CUDA device.
 *
 * Thread safety: all functions are reentrant; one device value may be used
 * by several threads as long as their memory ranges do not overlap.
 */
#ifndef KVF_DEVICE_H
#define KVF_DEVICE_H

#include "kvf_kern.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    KVF_DEVICE_CPU  = 0,
    KVF_DEVICE_CUDA = 1,
} kvf_device_kind_t;

typedef struct kvf_device {
    kvf_device_kind_t kind;
    int               ordinal;   /* CUDA device index; 0 for the CPU */
    void             *stream;    /* cudaStream_t; NULL = default stream */
} kvf_device_t;

typedef enum {
    KVF_COPY_H2H = 0,   /* both pointers host memory */
    KVF_COPY_H2D = 1,   /* host -> device */
    KVF_COPY_D2H = 2,   /* device -> host */
    KVF_COPY_D2D = 3,   /* device -> device (same device) */
} kvf_copy_kind_t;

/** The CPU device value: {KVF_DEVICE_CPU, 0, NULL}. */
kvf_device_t kvf_device_cpu(void);

/** Canonical name of a kind: "cpu" or "cuda". */
const char *kvf_device_kind_name(kvf_device_kind_t kind);

/**
 * True when this build has CUDA compiled in AND at least one CUDA device is
 * visible. Never fails; on a CPU-only build it does not touch CUDA at all.
 */
bool kvf_device_cuda_available(void);

/**
 * Fill @a dev_p for @a kind and @a ordinal. CPU: ordinal must be 0. CUDA:
 * checks the device exists and makes it current on the calling thread
 * (cudaSetDevice); the stream is the default stream (NULL).
 *
 * @return KVF_KERN_OK; KVF_KERN_EINVAL for a bad kind/ordinal;
 *         KVF_KERN_EUNSUPPORTED for CUDA in a build without CUDA;
 *         KVF_KERN_ECUDA when no such CUDA device exists.
 *         *dev_p is written only on success.
 */
int kvf_device_init(kvf_device_kind_t kind, int ordinal, kvf_device_t *dev_p);

/**
 * Make @a dev current on the calling thread (cudaSetDevice for CUDA; no-op
 * for the CPU). Each TP rank thread calls this once before using its device.
 */
int kvf_device_bind(const kvf_device_t *dev);

/**
 * Allocate @a bytes of device memory, 256-byte aligned. Contents are
 * undefined (NOT zeroed: stale bytes are real, see kvf_blocks_zero).
 *
 * @param [in]  dev    Device (NULL = CPU).
 * @param [in]  bytes  Size in bytes; 0 is KVF_KERN_EINVAL.
 * @param [out] ptr_p  Set only on success; free with kvf_device_free().
 * @return KVF_KERN_OK, KVF_KERN_EINVAL, KVF_KERN_ENOMEM, KVF_KERN_ECUDA,
 *         KVF_KERN_EUNSUPPORTED (CUDA without CUDA build).
 */
int kvf_device_alloc(const kvf_device_t *dev, size_t bytes, void **ptr_p);

/** Free memory from kvf_device_alloc() on the same device; NULL is a no-op. */
void kvf_device_free(const kvf_device_t *dev, void *ptr);

/**
 * Set @a bytes bytes at device pointer @a ptr to (unsigned char)@a value.
 * CUDA: enqueued on dev->stream. @return KVF_KERN_OK, KVF_KERN_EINVAL
 * (NULL ptr with bytes > 0), KVF_KERN_ECUDA.
 */
int kvf_device_memset(const kvf_device_t *dev, void *ptr, int value, size_t bytes);

/**
 * Copy @a bytes bytes. @a kind says which side is device memory of @a dev;
 * on the CPU device every kind is a plain memcpy, done on return. Ranges
 * must not overlap.
 *
 * CUDA: KVF_COPY_D2H and KVF_COPY_H2H are synchronous: they wait for
 * dev->stream, so on return @a dst holds the data (and every earlier piece
 * of work on the stream is done). KVF_COPY_H2D and KVF_COPY_D2D are only
 * enqueued on dev->stream: later work on that stream sees @a dst; a reader
 * outside the stream (UCX, another stream, the host through another
 * pointer) calls kvf_device_sync() first. An H2D @a src may be reused on
 * return (copied into the stream's pinned staging area, or staged by the
 * driver from pageable memory) unless it is itself pinned memory
 * (kvf_device_host_alloc()) larger than half the staging area: then the
 * copy reads it later and the caller syncs before touching it.
 * Callers (all rely on stream order only, or sync): the weights' upload
 * (kvf_model_load_device() syncs once at the end), the TP collectives'
 * staging copies (NCCL runs on the same stream), the engine's logits and
 * sampled ids (D2H), the KV digest (D2H), the fault point ucx.data's
 * one-byte flip (the digest's D2H on the same stream follows), the tools'
 * pool push and device copy limit (both sync).
 * @return KVF_KERN_OK, KVF_KERN_EINVAL, KVF_KERN_ECUDA.
 */
int kvf_device_memcpy(const kvf_device_t *dev, void *dst, const void *src, size_t bytes,
                      kvf_copy_kind_t kind);

/** Wait until all work enqueued on dev->stream has completed (CPU: no-op). */
int kvf_device_sync(const kvf_device_t *dev);

/**
 * A copy of @a dev with a stream of its own (CUDA: cudaStreamCreateWithFlags,
 * non-blocking with respect to the legacy default stream), e.g. for a page
 * pool whose zeroing and transfers must order among themselves and not
 * behind every default-stream kernel. CPU: a plain copy (no stream).
 * Destroy with kvf_device_stream_destroy().
 * @return KVF_KERN_OK, KVF_KERN_EINVAL, KVF_KERN_ECUDA, KVF_KERN_EUNSUPPORTED.
 */
int kvf_device_stream_create(const kvf_device_t *dev, kvf_device_t *dev_p);

/** Destroy a stream made by kvf_device_stream_create() and reset dev->stream to NULL. */
void kvf_device_stream_destroy(kvf_device_t *dev);

/**
 * True when @a ptr is CUDA device (or managed) memory, as UCX must be told
 * to register it (UCS_MEMORY_TYPE_CUDA); false for host memory, NULL, or a
 * build without CUDA. Never fails.
 */
bool kvf_device_ptr_is_cuda(const void *ptr);

/**
 * Zero whole pages of a page pool in one call (vLLM's KVBlockZeroer): for
 * each i in [0, n), bytes [base + page_ids[i] * page_size,
 * base + (page_ids[i] + 1) * page_size) are set to 0.
 *
 * This is what makes a recycled page safe for an attention kernel that reads
 * whole kernel blocks and masks by multiplying with 0: stale fp32 Mamba
 * state bytes may decode as NaN/Inf in bf16/fp16/fp32, and 0 * NaN = NaN.
 *
 * @param [in] dev        Device owning @a base (NULL = CPU).
 * @param [in] base       Pool base (device pointer for CUDA).
 * @param [in] page_size  Bytes per page, > 0.
 * @param [in] page_ids   HOST array of n page indices (block * slots + slot),
 *                        each >= 0; duplicates allowed. Not retained (CUDA
 *                        uploads it into the stream's scratch, one kernel
 *                        launch zeroes every page).
 * @param [in] n          Number of ids; 0 is a no-op returning KVF_KERN_OK.
 * @return KVF_KERN_OK (CUDA: enqueued on dev->stream); KVF_KERN_EINVAL for
 *         NULL base/page_ids with n > 0, page_size 0 or a negative id;
 *         KVF_KERN_ENOMEM / KVF_KERN_ECUDA on CUDA failures (then some pages
 *         may not be zeroed). The caller bounds-checks ids against the pool.
 */
int kvf_blocks_zero(const kvf_device_t *dev, void *base, size_t page_size,
                    const int64_t *page_ids, size_t n);

/**
 * Zero @a n byte ranges [base + offsets[i], base + offsets[i] + lens[i]):
 * used to clear the untransferred tail of a received block. Host arrays,
 * not retained; zero-length ranges are skipped; ranges may have any
 * alignment. CUDA: the two arrays uploaded through the stream's staging
 * area and ONE kernel launch on dev->stream for all ranges (16-byte stores
 * where aligned, bytes otherwise: kvf_zero_math.h), asynchronous.
 * @return KVF_KERN_OK, KVF_KERN_EINVAL (NULL arrays with n > 0),
 *         KVF_KERN_ENOMEM, KVF_KERN_ECUDA.
 */
int kvf_zero_ranges(const kvf_device_t *dev, void *base, const size_t *offsets,
                    const size_t *lens, size_t n);

/** What a stream's workspace did (kvf_device_workspace_stats()). */
typedef struct kvf_device_ws_stats {
    bool     reserved;             /* the stream has a workspace */
    size_t   device_bytes;         /* the scratch arena, reserved */
    size_t   staging_bytes;        /* the pinned staging area, reserved (two halves) */
    size_t   device_in_use;        /* arena bytes held now */
    size_t   device_peak;          /* most arena bytes held at once */
    size_t   staging_peak;         /* most bytes of one staging half used between resets */
    uint64_t device_fallbacks;     /* scratch requests that did not fit: cudaMallocAsync */
    size_t   device_fallback_max;  /* the largest of them, bytes */
    uint64_t staging_fallbacks;    /* uploads larger than a half: copied from pageable memory */
    size_t   staging_fallback_max; /* the largest of them, bytes */
    uint64_t staging_waits;        /* host waits for a staging half's copies to run */
    uint64_t staging_resets;       /* synchronisations that emptied the staging area */
    uint64_t unreserved;           /* process-wide: scratch taken on streams without one */
} kvf_device_ws_stats_t;

/**
 * Reserve the workspace of @a dev's stream: @a device_bytes of device
 * memory the kernel launchers take their scratch from (a stack, freed in
 * stream order: nothing is allocated per kernel call) and @a staging_bytes
 * of pinned host memory their host inputs are copied through (two halves,
 * reused after the stream's next host synchronisation or once a fence shows
 * their copies ran: see kernels/kvf_ws_alloc.h). Sizes come from the
 * caller's step limits (common/runtime: kvf_model_ws_device_bytes()). A
 * request beyond the reservation still works (cudaMallocAsync, a pageable
 * copy) and is counted and warned about once. A second reservation of the
 * same stream (same ordinal for the default stream) shares the first one
 * (reference counted). Call on any thread; slow (milliseconds): at start.
 * CPU: nothing to reserve, KVF_KERN_OK.
 * @return KVF_KERN_OK; KVF_KERN_ENOMEM (device or pinned memory, or 64
 *         streams with workspaces already); KVF_KERN_ECUDA;
 *         KVF_KERN_EUNSUPPORTED (CUDA in a build without CUDA).
 */
int kvf_device_workspace_reserve(const kvf_device_t *dev, size_t device_bytes,
                                 size_t staging_bytes);

/**
 * Drop one reservation of @a dev's stream; the last one waits for the
 * stream and frees the memory (and logs the fallbacks, if any). No kernel
 * may be running on the stream from another thread. CPU, or nothing
 * reserved: no-op.
 */
void kvf_device_workspace_release(const kvf_device_t *dev);

/**
 * What the workspace of @a dev's stream did so far (all zero with
 * reserved false when it has none; CPU: all zero).
 * @param [out] stats_p  Always written on KVF_KERN_OK.
 * @return KVF_KERN_OK; KVF_KERN_EINVAL (NULL stats_p);
 *         KVF_KERN_EUNSUPPORTED (CUDA in a build without CUDA).
 */
int kvf_device_workspace_stats(const kvf_device_t *dev, kvf_device_ws_stats_t *stats_p);

#ifdef __cplusplus
}
#endif

#endif
