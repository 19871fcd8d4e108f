/*
 * Device workspaces (kvf_device_workspace_reserve() in kvf_device.h): per
 * stream, a device arena the kernel launchers take their scratch from
 * (kvf_cuda_scratch()) and a pinned staging area their host inputs are
 * copied through, reserved once when a rank's workspace is set up.
 *
 * Design: a small registry keyed by the stream (the legacy default stream,
 * NULL, by the calling thread's current device as well, since every GPU has
 * one), looked up on each scratch call, so kvf_cuda_scratch() keeps its
 * signature and no launcher changed. The allocators' rules are plain C in
 * kvf_ws_alloc.{h,c}; here they get their memory (cudaMalloc,
 * cudaHostAlloc), their fences (one event per staging half) and a lock (a
 * stream may be fed from more than one thread: a rank's forward and the
 * zeroing of its fresh blocks). A stream synchronised through the device
 * layer (kvf_device_sync(), a device-to-host kvf_device_memcpy(): the step's
 * sampled ids) empties its staging area. A scratch request that does not
 * fit falls back to cudaMallocAsync (counted, one warning per workspace
 * naming the sizes); an upload that does not fit half the staging area is
 * copied from the caller's pageable memory (likewise). Work on a stream
 * without a workspace (tests, a transfer pool's own stream) runs as before
 * the workspace existed: cudaMallocAsync and pageable copies, counted in
 * kvf_device_ws_stats_t.unreserved. Rejected: a field in kvf_device_t
 * pointing at the workspace (a device is a value copied freely, and a field
 * would change every launcher's signature through kvf_cuda_stream_of());
 * thread-local workspaces (the page pool's zeroing runs on the rank's
 * stream from whichever thread imports a request).
 */
#include "kvf_cuda_util.h"
#include "kvf_device_cuda.h"
#include "kvf_ws_alloc.h"
extern "C" {
#include "kvf_log.h"
}

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#define KVF_CUDA_WS_MAX 64   /* workspaces per process: one per rank stream */

typedef struct kvf_cuda_ws {
    int             ordinal;
    cudaStream_t    stream;
    int             refs;
    pthread_mutex_t lock;
    void           *dmem, *hmem;
    size_t          dbytes, hbytes;
    cudaEvent_t     ev[2];
    kvf_arena_t     arena;
    kvf_staging_t   staging;
    bool            warned_arena, warned_staging;
    /* while a graph is captured on this stream (kvf_device_graph.h): the published step
     * inputs, host block and its device copy; host inputs come from there or are refused */
    bool            capturing;
    kvf_ws_inputs_t in;
} kvf_cuda_ws_t;

static pthread_mutex_t kvf_cuda_ws_reg_lock = PTHREAD_MUTEX_INITIALIZER;
static kvf_cuda_ws_t *kvf_cuda_ws_reg[KVF_CUDA_WS_MAX];
static int kvf_cuda_ws_n;                      /* read without the lock: a hint */
static unsigned long long kvf_cuda_ws_unreserved;

/* The workspace of @a stream (NULL: of the current device's default stream), or NULL. */
static kvf_cuda_ws_t *kvf_cuda_ws_find(cudaStream_t stream, int ordinal)
{
    kvf_cuda_ws_t *ws = NULL;

    if (__atomic_load_n(&kvf_cuda_ws_n, __ATOMIC_ACQUIRE) == 0) {
        return NULL;
    }
    if ((stream == NULL) && (ordinal < 0) && (cudaGetDevice(&ordinal) != cudaSuccess)) {
        (void)cudaGetLastError();
        return NULL;
    }
    pthread_mutex_lock(&kvf_cuda_ws_reg_lock);
    for (int i = 0; i < KVF_CUDA_WS_MAX; ++i) {
        kvf_cuda_ws_t *w = kvf_cuda_ws_reg[i];
        if ((w != NULL) && (w->stream == stream) && ((stream != NULL) || (w->ordinal == ordinal))) {
            ws = w;
            break;
        }
    }
    pthread_mutex_unlock(&kvf_cuda_ws_reg_lock);
    return ws;
}

static int kvf_cuda_ws_fence(void *ctx, int half)
{
    kvf_cuda_ws_t *ws = (kvf_cuda_ws_t *)ctx;
    KVF_CUDA_CHECK(cudaEventRecord(ws->ev[half], ws->stream));
    return KVF_KERN_OK;
}

static int kvf_cuda_ws_wait(void *ctx, int half, bool *waited_p)
{
    kvf_cuda_ws_t *ws = (kvf_cuda_ws_t *)ctx;
    cudaError_t q = cudaEventQuery(ws->ev[half]);

    *waited_p = false;
    if (q == cudaSuccess) {
        return KVF_KERN_OK;
    }
    if (q != cudaErrorNotReady) {
        return kvf_cuda_error(q, "cudaEventQuery(staging fence)");
    }
    *waited_p = true;   /* the copies of that half are still queued: a host wait */
    KVF_CUDA_CHECK(cudaEventSynchronize(ws->ev[half]));
    return KVF_KERN_OK;
}

static const kvf_staging_ops_t kvf_cuda_ws_ops = {kvf_cuda_ws_fence, kvf_cuda_ws_wait};

/* host -> dst (device memory) on @a stream: through the staging area of @a ws when it fits,
 * else from the caller's memory (pageable: the driver stages it). Caller holds ws->lock. */
static int kvf_cuda_ws_copy_in_locked(kvf_cuda_ws_t *ws, cudaStream_t stream, void *dst,
                                      const void *host, size_t bytes)
{
    void *stage = NULL;

    if (ws != NULL) {
        int rc = kvf_staging_take(&ws->staging, bytes, &stage);
        if (rc < 0) {
            return rc;   /* a fence failed (reported) */
        }
        if (rc == KVF_STAGING_TOO_BIG) {
            stage = NULL;
            if (!ws->warned_staging) {
                ws->warned_staging = true;
                kvf_warn("cuda:%d workspace: an upload of %zu bytes does not fit half the "
                         "staging area (%zu of %zu bytes): copied from pageable memory, "
                         "which may block the host (counted in kvf_device_workspace_stats; "
                         "warned once)", ws->ordinal, bytes, ws->staging.half_cap, ws->hbytes);
            }
        }
    }
    if (stage != NULL) {
        memcpy(stage, host, bytes);
        host = stage;
    }
    KVF_CUDA_CHECK(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, stream));
    return KVF_KERN_OK;
}

/* During a capture: the device copy of host input [host, host + bytes) when it lies in the
 * published step inputs, else NULL (reported: a recording would replay it stale). */
static char *kvf_cuda_ws_captured_input(kvf_cuda_ws_t *ws, const void *host, size_t bytes)
{
    char *d = (char *)kvf_ws_inputs_find(&ws->in, host, bytes);

    if (d == NULL) {
        char msg[160];
        snprintf(msg, sizeof(msg), "a host input of %zu bytes outside the step's published "
                 "inputs (a graph would replay it stale): the step runs eagerly", bytes);
        kvf_kern_report("CUDA graph capture", msg);
    }
    return d;
}

extern "C" int kvf_cuda_ws_capture_inputs(cudaStream_t stream, const void *host,
                                          const void *dev, size_t bytes, bool on)
{
    kvf_cuda_ws_t *ws = kvf_cuda_ws_find(stream, -1);

    if (ws == NULL) {
        return KVF_KERN_EINVAL;   /* a capture stream always has its workspace */
    }
    pthread_mutex_lock(&ws->lock);
    ws->capturing = on;
    ws->in.host = on ? (const unsigned char *)host : NULL;
    ws->in.dev = on ? (unsigned char *)dev : NULL;
    ws->in.bytes = on ? bytes : 0;
    pthread_mutex_unlock(&ws->lock);
    return KVF_KERN_OK;
}

extern "C" int kvf_cuda_ws_scratch(cudaStream_t stream, size_t bytes, const void *host,
                                   void **ptr_p)
{
    kvf_cuda_ws_t *ws = kvf_cuda_ws_find(stream, -1);
    void *p = NULL;
    int rc = KVF_KERN_OK;

    if ((ws != NULL) && ws->capturing && (host != NULL)) {
        /* a recorded step reads its inputs where each replay's upload puts them */
        p = kvf_cuda_ws_captured_input(ws, host, bytes);
        if (p == NULL) {
            return KVF_KERN_EUNSUPPORTED;
        }
        *ptr_p = p;
        return KVF_KERN_OK;
    }
    bytes = (bytes > 0) ? bytes : 1;
    if (ws == NULL) {
        __atomic_fetch_add(&kvf_cuda_ws_unreserved, 1ull, __ATOMIC_RELAXED);
    } else {
        pthread_mutex_lock(&ws->lock);
        p = kvf_arena_alloc(&ws->arena, bytes);
        if ((p == NULL) && !ws->warned_arena) {
            ws->warned_arena = true;
            kvf_warn("cuda:%d workspace: scratch of %zu bytes does not fit the arena (%zu of "
                     "%zu bytes in use, %zu pieces): cudaMallocAsync instead (counted in "
                     "kvf_device_workspace_stats; warned once)", ws->ordinal, bytes,
                     kvf_arena_in_use(&ws->arena), ws->dbytes, ws->arena.nlive);
        }
        if ((p != NULL) && (host != NULL)) {
            rc = kvf_cuda_ws_copy_in_locked(ws, stream, p, host, bytes);
            if (rc != KVF_KERN_OK) {
                (void)kvf_arena_free(&ws->arena, p);
            }
        }
        pthread_mutex_unlock(&ws->lock);
        if (rc != KVF_KERN_OK) {
            return rc;
        }
        if (p != NULL) {
            *ptr_p = p;
            return KVF_KERN_OK;
        }
    }
    KVF_CUDA_CHECK(cudaMallocAsync(&p, bytes, stream));
    if (host != NULL) {
        if (ws != NULL) {
            pthread_mutex_lock(&ws->lock);
        }
        rc = kvf_cuda_ws_copy_in_locked(ws, stream, p, host, bytes);
        if (ws != NULL) {
            pthread_mutex_unlock(&ws->lock);
        }
        if (rc != KVF_KERN_OK) {
            (void)cudaFreeAsync(p, stream);
            return rc;
        }
    }
    *ptr_p = p;
    return KVF_KERN_OK;
}

extern "C" void kvf_cuda_ws_scratch_free(cudaStream_t stream, void *p)
{
    kvf_cuda_ws_t *ws;
    bool mine = false;

    if (p == NULL) {
        return;
    }
    ws = kvf_cuda_ws_find(stream, -1);
    if (ws != NULL) {
        pthread_mutex_lock(&ws->lock);
        if (kvf_ws_inputs_owns(&ws->in, p)) {
            pthread_mutex_unlock(&ws->lock);
            return;   /* the inputs' device copy, handed out during a capture */
        }
        mine = kvf_arena_free(&ws->arena, p);
        pthread_mutex_unlock(&ws->lock);
    }
    if (!mine) {
        KVF_CUDA_CHECK_IGNORE(cudaFreeAsync(p, stream));
    }
}

extern "C" int kvf_cuda_ws_upload(cudaStream_t stream, void *dst, const void *host, size_t bytes)
{
    kvf_cuda_ws_t *ws = kvf_cuda_ws_find(stream, -1);
    int rc;

    if (bytes == 0) {
        return KVF_KERN_OK;
    }
    if (ws == NULL) {
        return kvf_cuda_ws_copy_in_locked(NULL, stream, dst, host, bytes);
    }
    pthread_mutex_lock(&ws->lock);
    if (ws->capturing) {
        /* recorded as a device->device copy from the inputs' device copy */
        const char *src = kvf_cuda_ws_captured_input(ws, host, bytes);
        pthread_mutex_unlock(&ws->lock);
        if (src == NULL) {
            return KVF_KERN_EUNSUPPORTED;
        }
        KVF_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
        return KVF_KERN_OK;
    }
    rc = kvf_cuda_ws_copy_in_locked(ws, stream, dst, host, bytes);
    pthread_mutex_unlock(&ws->lock);
    return rc;
}

extern "C" int kvf_cuda_ws_sync(cudaStream_t stream, int ordinal)
{
    kvf_cuda_ws_t *ws = kvf_cuda_ws_find(stream, ordinal);
    uint64_t mark = 0;

    if (ws != NULL) {
        pthread_mutex_lock(&ws->lock);
        mark = kvf_staging_mark(&ws->staging);
        pthread_mutex_unlock(&ws->lock);
    }
    KVF_CUDA_CHECK(cudaStreamSynchronize(stream));
    if (ws != NULL) {
        /* every copy issued before the mark has run: the staging area may be rewritten */
        pthread_mutex_lock(&ws->lock);
        (void)kvf_staging_synced(&ws->staging, mark);
        pthread_mutex_unlock(&ws->lock);
    }
    return KVF_KERN_OK;
}

static void kvf_cuda_ws_free_mem(kvf_cuda_ws_t *ws)
{
    for (int i = 0; i < 2; ++i) {
        if (ws->ev[i] != NULL) {
            KVF_CUDA_CHECK_IGNORE(cudaEventDestroy(ws->ev[i]));
        }
    }
    if (ws->dmem != NULL) {
        KVF_CUDA_CHECK_IGNORE(cudaFree(ws->dmem));
    }
    if (ws->hmem != NULL) {
        KVF_CUDA_CHECK_IGNORE(cudaFreeHost(ws->hmem));
    }
    pthread_mutex_destroy(&ws->lock);
    free(ws);
}

extern "C" int kvf_cuda_ws_reserve(const kvf_device_t *dev, size_t device_bytes,
                                   size_t staging_bytes)
{
    cudaStream_t stream = kvf_cuda_stream_of(dev);
    kvf_cuda_ws_t *ws;
    int prev = -1, rc = KVF_KERN_OK, slot = -1;

    pthread_mutex_lock(&kvf_cuda_ws_reg_lock);
    for (int i = 0; i < KVF_CUDA_WS_MAX; ++i) {
        ws = kvf_cuda_ws_reg[i];
        if ((ws != NULL) && (ws->stream == stream) &&
            ((stream != NULL) || (ws->ordinal == dev->ordinal))) {
            ws->refs++;   /* a second user of the stream shares the first reservation */
            pthread_mutex_unlock(&kvf_cuda_ws_reg_lock);
            if ((device_bytes > ws->dbytes) || (staging_bytes > ws->hbytes)) {
                kvf_info("cuda:%d workspace: already reserved (%zu device, %zu staging "
                         "bytes); a request for %zu and %zu shares it", dev->ordinal,
                         ws->dbytes, ws->hbytes, device_bytes, staging_bytes);
            }
            return KVF_KERN_OK;
        }
        slot = ((ws == NULL) && (slot < 0)) ? i : slot;
    }
    pthread_mutex_unlock(&kvf_cuda_ws_reg_lock);
    if (slot < 0) {
        return KVF_KERN_ENOMEM;   /* KVF_CUDA_WS_MAX streams with workspaces */
    }
    ws = (kvf_cuda_ws_t *)calloc(1, sizeof(*ws));
    if (ws == NULL) {
        return KVF_KERN_ENOMEM;
    }
    pthread_mutex_init(&ws->lock, NULL);
    ws->ordinal = dev->ordinal;
    ws->stream = stream;
    ws->refs = 1;
    ws->dbytes = device_bytes;
    ws->hbytes = staging_bytes;
    KVF_CUDA_CHECK_GOTO(cudaGetDevice(&prev), rc, err_free);
    KVF_CUDA_CHECK_GOTO(cudaSetDevice(dev->ordinal), rc, err_free);
    if (device_bytes > 0) {
        KVF_CUDA_CHECK_GOTO(cudaMalloc(&ws->dmem, device_bytes), rc, err_device);
    }
    if (staging_bytes > 0) {
        KVF_CUDA_CHECK_GOTO(cudaHostAlloc(&ws->hmem, staging_bytes, cudaHostAllocDefault), rc,
                            err_device);
    }
    for (int i = 0; i < 2; ++i) {
        KVF_CUDA_CHECK_GOTO(cudaEventCreateWithFlags(&ws->ev[i], cudaEventDisableTiming), rc,
                            err_device);
    }
    (void)cudaSetDevice(prev);
    kvf_arena_init(&ws->arena, ws->dmem, device_bytes);
    kvf_staging_init(&ws->staging, ws->hmem, staging_bytes, &kvf_cuda_ws_ops, ws);
    pthread_mutex_lock(&kvf_cuda_ws_reg_lock);
    for (int i = 0; i < KVF_CUDA_WS_MAX; ++i) {
        kvf_cuda_ws_t *w = kvf_cuda_ws_reg[i];
        if ((w != NULL) && (w->stream == stream) &&
            ((stream != NULL) || (w->ordinal == dev->ordinal))) {
            w->refs++;   /* another thread reserved the same stream meanwhile: share it */
            pthread_mutex_unlock(&kvf_cuda_ws_reg_lock);
            kvf_cuda_ws_free_mem(ws);
            return KVF_KERN_OK;
        }
    }
    if (kvf_cuda_ws_reg[slot] != NULL) {
        for (slot = 0; (slot < KVF_CUDA_WS_MAX) && (kvf_cuda_ws_reg[slot] != NULL); ++slot) {
        }
    }
    if (slot < KVF_CUDA_WS_MAX) {
        kvf_cuda_ws_reg[slot] = ws;
        __atomic_fetch_add(&kvf_cuda_ws_n, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&kvf_cuda_ws_reg_lock);
    if (slot == KVF_CUDA_WS_MAX) {
        kvf_cuda_ws_free_mem(ws);
        return KVF_KERN_ENOMEM;
    }
    kvf_info("cuda:%d workspace: %zu bytes of device scratch, %zu bytes of pinned staging",
             dev->ordinal, device_bytes, staging_bytes);
    return KVF_KERN_OK;

err_device:
    (void)cudaSetDevice(prev);
err_free:
    kvf_cuda_ws_free_mem(ws);
    return rc;
}

extern "C" void kvf_cuda_ws_release(const kvf_device_t *dev)
{
    cudaStream_t stream = kvf_cuda_stream_of(dev);
    kvf_cuda_ws_t *ws = NULL;
    int prev = -1;

    pthread_mutex_lock(&kvf_cuda_ws_reg_lock);
    for (int i = 0; i < KVF_CUDA_WS_MAX; ++i) {
        kvf_cuda_ws_t *w = kvf_cuda_ws_reg[i];
        if ((w != NULL) && (w->stream == stream) &&
            ((stream != NULL) || (w->ordinal == dev->ordinal))) {
            if (--w->refs == 0) {
                kvf_cuda_ws_reg[i] = NULL;
                __atomic_fetch_sub(&kvf_cuda_ws_n, 1, __ATOMIC_RELEASE);
                ws = w;
            }
            break;
        }
    }
    pthread_mutex_unlock(&kvf_cuda_ws_reg_lock);
    if (ws == NULL) {
        return;
    }
    if ((ws->arena.overflows > 0) || (ws->staging.overflows > 0) || (ws->staging.waits > 0)) {
        kvf_warn("cuda:%d workspace: %llu scratch request(s) did not fit the arena (largest "
                 "%zu of %zu bytes), %llu upload(s) did not fit the staging area (largest %zu), "
                 "%llu staging wait(s)", ws->ordinal, (unsigned long long)ws->arena.overflows,
                 ws->arena.overflow_max, ws->dbytes,
                 (unsigned long long)ws->staging.overflows, ws->staging.overflow_max,
                 (unsigned long long)ws->staging.waits);
    }
    kvf_info("cuda:%d workspace: used at most %zu of %zu device bytes and %zu of %zu staging "
             "bytes per half; %llu fallback(s), %llu staging wait(s), %llu reset(s)",
             ws->ordinal, ws->arena.peak, ws->dbytes, ws->staging.peak, ws->staging.half_cap,
             (unsigned long long)(ws->arena.overflows + ws->staging.overflows),
             (unsigned long long)ws->staging.waits, (unsigned long long)ws->staging.resets);
    if (cudaGetDevice(&prev) == cudaSuccess) {
        KVF_CUDA_CHECK_IGNORE(cudaSetDevice(ws->ordinal));
        /* nothing queued may still read the arena or the staging area */
        KVF_CUDA_CHECK_IGNORE(cudaStreamSynchronize(ws->stream));
    }
    kvf_cuda_ws_free_mem(ws);
    if (prev >= 0) {
        (void)cudaSetDevice(prev);
    }
}

extern "C" int kvf_cuda_ws_stats(const kvf_device_t *dev, kvf_device_ws_stats_t *st)
{
    kvf_cuda_ws_t *ws = kvf_cuda_ws_find(kvf_cuda_stream_of(dev), dev->ordinal);

    memset(st, 0, sizeof(*st));
    st->unreserved = __atomic_load_n(&kvf_cuda_ws_unreserved, __ATOMIC_RELAXED);
    if (ws == NULL) {
        return KVF_KERN_OK;
    }
    pthread_mutex_lock(&ws->lock);
    st->reserved = true;
    st->device_bytes = ws->dbytes;
    st->staging_bytes = ws->hbytes;
    st->device_in_use = kvf_arena_in_use(&ws->arena);
    st->device_peak = ws->arena.peak;
    st->device_fallbacks = ws->arena.overflows;
    st->device_fallback_max = ws->arena.overflow_max;
    st->staging_peak = ws->staging.peak;
    st->staging_fallbacks = ws->staging.overflows;
    st->staging_fallback_max = ws->staging.overflow_max;
    st->staging_waits = ws->staging.waits;
    st->staging_resets = ws->staging.resets;
    pthread_mutex_unlock(&ws->lock);
    return KVF_KERN_OK;
}
