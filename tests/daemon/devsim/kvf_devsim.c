/*
 * TEST ONLY: a simulated CUDA device for whole daemon processes on a machine
 * without a GPU. Linked (with -Wl,--wrap for every symbol below) into
 * test-only copies of kvf-prefill and kvf-decode (tests/bin/kvf-*-devsim), never
 * into the shipped binaries.
 *
 * What it does: `--device cuda[:N]` opens a "GPU" when N is below
 * DEVSIM_GPUS (default 1; not a KVF_ variable: only these binaries read it,
 * in any build); kvf_device_alloc() on it gives host
 * memory, 256-byte aligned, recorded as device memory (kvf_device_ptr_is_cuda
 * says yes for it, and only for it); every device-layer call and every
 * kernel entry point given a CUDA device runs its CPU version; the NCCL
 * world of a TP > 1 instance is the CPU world; UCX is told the memory is
 * host memory (so any UCX build maps it) while kvferry publishes and checks
 * it as cuda (ucp_context_query claims CUDA support). So the daemons take
 * exactly their --device cuda paths: model upload, pools from
 * kvf_device_alloc registered as CUDA memory, zeroing through
 * kvf_blocks_zero / kvf_zero_ranges on the device, the stream sync before a
 * pull, the KV digest's device-to-host copies.
 *
 * What it checks, for a test to read: a host pointer handed to a device
 * kernel or the wrong side of a device copy is counted (a real GPU would
 * fault there); at exit the process prints one line to stderr,
 *   devsim: gpus N opened O allocs A (B bytes) ... host_ptr_errors E
 * which tests/daemon/test_daemon_device.py and tests/daemon/test_devsim_step.py assert
 * on. Steps (kvf_tp_runner_step) are watched too: for every decode step (each request one
 * token on a cache), what the calling thread (rank 0) did inside it is counted:
 *   decode_steps N decode_allocs A decode_d2h D decode_syncs S decode_d2h_max M
 * (device allocations, device-to-host copies, stream syncs), so a test can assert that a
 * step allocates nothing and reads back only the sampled ids. Workspaces reserved at start
 * (kvf_device_workspace_reserve) are recorded, not allocated. CUDA graphs
 * (kvf_device_graph.h) are emulated as what makes a replay right: a shape's first step runs
 * eagerly (as the CUDA cache does), its second runs the body and records every kernel call
 * (name and arguments: scalars, pointers, the fields of the parameter structs a launcher
 * reads); a replay runs the body again and
 * counts any call that differs from the recording (a real replay would have launched the
 * recorded one); inside a body, a host array a launcher uploads must lie in the published
 * step inputs, whose device copy must hold the same bytes, the packed tables and state
 * pointers must say what the requests' arrays say, every launch must go to the capture
 * stream, and host copies, syncs, allocations and per-request attention are errors:
 *   graph_captures C graph_replays R graph_mismatches M graph_host_inputs H
 * The tensor-core GEMM's algorithm keys (kvf_devsim_gemm.c: a weight matrix always gets
 * the same key, whatever the batch):
 *   gemm_lt_calls C gemm_lt_weights W gemm_lt_key_errors E
 * The Mamba2 prompt scans (kvf_devsim_ssd.c: chunked calls, their grid, scratch beyond the
 * arena reserved at start; token-by-token calls):
 *   ssd_calls C ssd_grid G ssd_ws_errors E token_scan_calls S
 * What it cannot check:
 * CUDA kernels themselves, stream concurrency, UCX moving real device
 * memory (tests/gpu, on a GPU).
 */
#include "kvf_act.h"
#include "kvf_argmax.h"
#include "kvf_attention.h"
#include "kvf_attention_seqs.h"
#include "kvf_collectives.h"
#include "kvf_conv1d.h"
#include "kvf_device.h"
#include "kvf_device_graph.h"
#include "kvf_gemm.h"
#include "kvf_gemm_narrow.h"
#include "kvf_mamba2.h"
#include "kvf_ssd.h"
#include "kvf_model.h"
#include "kvf_moe.h"
#include "kvf_norm.h"
#include "kvf_ops.h"
#include "kvf_sample.h"
#include "kvf_ssm_seqs.h"
#include "kvf_tp_runner.h"
#include "kvf_log.h"
#include "kvf_devsim_gemm.h"
#include "kvf_devsim_ssd.h"
#include "kvf_devsim_int.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucp/api/ucp.h>

/* ---- the simulated memory ---------------------------------------------------- */

typedef struct {
    uintptr_t lo, hi;
    int       ordinal;
    int       fd;        /* DEVSIM_IPC: the memfd behind an allocation, -1 for a mapping */
    bool      mapped;    /* an opened IPC mapping (kvf_devsim_ipc.c), never free()d */
} devsim_range_t;

static pthread_mutex_t devsim_lock = PTHREAD_MUTEX_INITIALIZER;
static devsim_range_t *devsim_ranges;
static size_t devsim_n, devsim_cap;
static int devsim_gpus = -1;
atomic_ullong st_opened, st_allocs, st_alloc_bytes, st_kernels, st_blocks_zero_calls,
    st_blocks_zero_pages, st_zero_range_calls, st_zero_range_bytes, st_d2h_calls, st_d2h_bytes,
    st_h2d_bytes, st_syncs, st_streams, st_binds, st_host_ptr_errors, st_ucx_maps,
    st_wrong_device, st_ws_reserves, st_ws_device_bytes, st_ws_staging_bytes,
    st_decode_steps, st_decode_allocs, st_decode_d2h, st_decode_syncs, st_decode_d2h_max,
    st_graph_captures, st_graph_replays, st_graph_mismatches, st_graph_host_inputs;
/* the calling thread's current GPU, as CUDA keeps it: 0 until a call sets it */
static _Thread_local int devsim_current;
/* what this thread did: a step's share is the difference across kvf_tp_runner_step */
static _Thread_local unsigned long long tl_allocs, tl_d2h, tl_syncs;

static int devsim_count(void)
{
    if (devsim_gpus < 0) {
        const char *e = getenv("DEVSIM_GPUS");
        long n = (e != NULL) ? strtol(e, NULL, 10) : 1;
        devsim_gpus = ((n >= 0) && (n <= 64)) ? (int)n : 1;
    }
    return devsim_gpus;
}

/* The ordinal owning @a p, or -1 for host memory. */
static int devsim_owner(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    int ord = -1;

    if (p == NULL) {
        return -1;
    }
    pthread_mutex_lock(&devsim_lock);
    for (size_t i = 0; i < devsim_n; ++i) {
        if ((a >= devsim_ranges[i].lo) && (a < devsim_ranges[i].hi)) {
            ord = devsim_ranges[i].ordinal;
            break;
        }
    }
    pthread_mutex_unlock(&devsim_lock);
    return ord;
}

bool devsim_range_find(const void *p, uintptr_t *lo_p, uintptr_t *hi_p, int *ord_p, int *fd_p)
{
    bool found = false;

    pthread_mutex_lock(&devsim_lock);
    for (size_t i = 0; i < devsim_n; ++i) {
        if (((uintptr_t)p >= devsim_ranges[i].lo) && ((uintptr_t)p < devsim_ranges[i].hi)) {
            *lo_p = devsim_ranges[i].lo;
            *hi_p = devsim_ranges[i].hi;
            *ord_p = devsim_ranges[i].ordinal;
            *fd_p = devsim_ranges[i].mapped ? -1 : devsim_ranges[i].fd;
            found = true;
            break;
        }
    }
    pthread_mutex_unlock(&devsim_lock);
    return found;
}

int devsim_range_map(void *p, size_t len, int ordinal, bool add)
{
    int rc = KVF_KERN_OK;

    pthread_mutex_lock(&devsim_lock);
    if (!add) {
        for (size_t i = 0; i < devsim_n; ++i) {
            if ((devsim_ranges[i].lo == (uintptr_t)p) && devsim_ranges[i].mapped) {
                devsim_ranges[i] = devsim_ranges[--devsim_n];
                break;
            }
        }
    } else if (devsim_n == devsim_cap) {
        size_t cap = devsim_cap ? 2 * devsim_cap : 256;
        devsim_range_t *r = realloc(devsim_ranges, cap * sizeof(*r));
        if (r == NULL) {
            rc = KVF_KERN_ENOMEM;
        } else {
            devsim_ranges = r;
            devsim_cap = cap;
        }
    }
    if (add && (rc == KVF_KERN_OK)) {
        devsim_ranges[devsim_n++] = (devsim_range_t){(uintptr_t)p, (uintptr_t)p + len, ordinal,
                                                     -1, true};
    }
    pthread_mutex_unlock(&devsim_lock);
    return rc;
}

/* A pointer a device kernel or copy reads or writes on the device: it must be device memory. */
void devsim_want_dev_fn(const void *p, const char *what)
{
    if ((p != NULL) && (devsim_owner(p) < 0)) {
        if (atomic_fetch_add(&st_host_ptr_errors, 1) < 8) {
            fprintf(stderr, "devsim: %s: host pointer %p where the device's memory belongs\n",
                    what, p);
        }
    }
}

bool devsim_is_device_ptr(const void *p)
{
    return devsim_owner(p) >= 0;
}

static void devsim_want_host(const void *p, const char *what)
{
    if ((p != NULL) && (devsim_owner(p) >= 0)) {
        if (atomic_fetch_add(&st_host_ptr_errors, 1) < 8) {
            fprintf(stderr, "devsim: %s: device pointer %p where host memory belongs\n", what, p);
        }
    }
}

/*
 * Where work runs, as CUDA has it: on the legacy default stream (dev->stream NULL), the
 * calling thread's current GPU; on a stream of its own, the stream's GPU, and a kernel is
 * launched into such a stream only from a thread whose current GPU it is (a copy or memset
 * may be issued from anywhere). Memory of another GPU than the one the work runs on is an
 * illegal access without peer access. Each breach is counted.
 */
void devsim_want_current(const kvf_device_t *dev, const void *p, const char *what,
                         bool kernel)
{
    int owner = devsim_owner(p), on = (dev->stream == NULL) ? devsim_current : dev->ordinal;
    const char *why = NULL;

    if (kernel && (dev->stream != NULL) && (dev->ordinal != devsim_current)) {
        why = "a kernel launched into a stream of another GPU than the current one";
    } else if ((owner >= 0) && (owner != on)) {
        why = "memory of another GPU than the one the work runs on";
    }
    if ((why != NULL) && (atomic_fetch_add(&st_wrong_device, 1) < 8)) {
        fprintf(stderr, "devsim: %s: %s (memory on cuda:%d, stream of cuda:%d, current "
                "cuda:%d)\n", what, why, owner, dev->ordinal, devsim_current);
    }
}

bool devsim_is_cuda(const kvf_device_t *dev)
{
    return (dev != NULL) && (dev->kind == KVF_DEVICE_CUDA);
}

/* ---- CUDA graphs: recordings of kernel calls, replays compared with them ------------- */

/* the calling thread's graph body, if any: 1 recording, 2 replaying */
_Thread_local int tl_graph;
static _Thread_local const char *tl_in_lo, *tl_in_hi;   /* the published step inputs */
static _Thread_local struct devsim_rec *tl_rec;
static _Thread_local size_t tl_rec_pos;

typedef struct devsim_rec {
    uint64_t  key;
    uint64_t *calls;   /* a hash per kernel call, in order */
    size_t    n, cap;
} devsim_rec_t;

typedef struct {
    kvf_device_t              dev;
    devsim_rec_t             *recs;
    uint64_t                 *seen;   /* shapes run eagerly once (the warm-up) */
    int                       n, max, nseen;
    kvf_device_graphs_stats_t st;
} devsim_graphs_t;

/* the stream a graph body's work must go to (a real capture records only that stream) */
char devsim_capture_stream;

void devsim_graph_error(atomic_ullong *counter, const char *what)
{
    if (atomic_fetch_add(counter, 1) < 8) {
        fprintf(stderr, "devsim: in a CUDA graph body: %s\n", what);
    }
}

/* A host array of @a bytes a launcher uploads: inside a graph body it must be published. */
void devsim_want_input(const void *p, size_t bytes, const char *what)
{
    const char *c = p;

    if ((tl_graph != 0) && (bytes > 0) &&
        ((c == NULL) || (c < tl_in_lo) || (c > tl_in_hi) || ((size_t)(tl_in_hi - c) < bytes))) {
        char msg[160];
        snprintf(msg, sizeof(msg), "%s: %zu bytes at %p outside the published inputs", what,
                 bytes, p);
        devsim_graph_error(&st_graph_host_inputs, msg);
    }
}

/* Work a graph cannot hold (a host copy, a sync, an allocation, per-call host tables). */
void devsim_not_in_graph(const char *what)
{
    if (tl_graph != 0) {
        devsim_graph_error(&st_graph_host_inputs, what);
    }
}

uint64_t devsim_mix(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; ++i) {
        h = (h ^ b[i]) * 1099511628211ull;   /* FNV-1a */
    }
    return h;
}

/* A kernel call inside a graph body: recorded, or compared with the recording. */
void devsim_graph_call(const char *name, uint64_t h)
{
    h = devsim_mix(h, name, strlen(name));
    if (tl_graph == 1) {
        devsim_rec_t *r = tl_rec;
        if (r->n == r->cap) {
            size_t cap = r->cap ? 2 * r->cap : 256;
            uint64_t *c = realloc(r->calls, cap * sizeof(*c));
            if (c == NULL) {
                abort();   /* test binary: out of memory */
            }
            r->calls = c;
            r->cap = cap;
        }
        r->calls[r->n++] = h;
    } else if (tl_graph == 2) {
        if ((tl_rec_pos >= tl_rec->n) || (tl_rec->calls[tl_rec_pos] != h)) {
            char msg[160];
            snprintf(msg, sizeof(msg), "call %zu (%s) is not the recorded one: a replay would "
                     "have launched something else", tl_rec_pos, name);
            devsim_graph_error(&st_graph_mismatches, msg);
        }
        tl_rec_pos++;
    }
}

static void devsim_report(void)
{
    fprintf(stderr, "devsim: gpus %d opened %llu allocs %llu (%llu bytes) kernels %llu "
            "blocks_zero %llu calls %llu pages zero_ranges %llu calls %llu bytes d2h %llu "
            "calls %llu bytes h2d %llu bytes syncs %llu streams %llu binds %llu ucx_maps %llu "
            "host_ptr_errors %llu wrong_device %llu ws_reserves %llu ws_device_bytes %llu "
            "ws_staging_bytes %llu decode_steps %llu decode_allocs %llu decode_d2h %llu "
            "decode_syncs %llu decode_d2h_max %llu graph_captures %llu graph_replays %llu "
            "graph_mismatches %llu graph_host_inputs %llu", devsim_count(),
            (unsigned long long)st_opened,
            (unsigned long long)st_allocs, (unsigned long long)st_alloc_bytes,
            (unsigned long long)st_kernels, (unsigned long long)st_blocks_zero_calls,
            (unsigned long long)st_blocks_zero_pages, (unsigned long long)st_zero_range_calls,
            (unsigned long long)st_zero_range_bytes, (unsigned long long)st_d2h_calls,
            (unsigned long long)st_d2h_bytes, (unsigned long long)st_h2d_bytes,
            (unsigned long long)st_syncs, (unsigned long long)st_streams,
            (unsigned long long)st_binds, (unsigned long long)st_ucx_maps,
            (unsigned long long)st_host_ptr_errors, (unsigned long long)st_wrong_device,
            (unsigned long long)st_ws_reserves, (unsigned long long)st_ws_device_bytes,
            (unsigned long long)st_ws_staging_bytes, (unsigned long long)st_decode_steps,
            (unsigned long long)st_decode_allocs, (unsigned long long)st_decode_d2h,
            (unsigned long long)st_decode_syncs, (unsigned long long)st_decode_d2h_max,
            (unsigned long long)st_graph_captures, (unsigned long long)st_graph_replays,
            (unsigned long long)st_graph_mismatches, (unsigned long long)st_graph_host_inputs);
    devsim_gemm_lt_report(stderr);
    devsim_ssd_report(stderr);
    devsim_fi_report(stderr);
    devsim_ssm_report(stderr);
    fputc('\n', stderr);
}

__attribute__((constructor)) static void devsim_init(void)
{
    atexit(devsim_report);
}

/* ---- --device and the device layer ------------------------------------------- */

kvf_status_t __real_kvf_model_device_open(const char *what, const char *value,
                                          kvf_device_t *dev_p);
kvf_status_t __wrap_kvf_model_device_open(const char *what, const char *value,
                                          kvf_device_t *dev_p);
int __real_kvf_device_init(kvf_device_kind_t kind, int ordinal, kvf_device_t *dev_p);
int __wrap_kvf_device_init(kvf_device_kind_t kind, int ordinal, kvf_device_t *dev_p);

kvf_status_t __wrap_kvf_model_device_open(const char *what, const char *value,
                                          kvf_device_t *dev_p)
{
    long n = 0;
    char *end = NULL;

    if ((value == NULL) || (strncmp(value, "cuda", 4) != 0)) {
        return __real_kvf_model_device_open(what, value, dev_p);   /* cpu, or bad: as shipped */
    }
    if (value[4] == ':') {
        errno = 0;
        n = strtol(value + 5, &end, 10);
        if ((end == value + 5) || (*end != '\0') || (errno != 0) || (n < 0) || (n > INT_MAX)) {
            return __real_kvf_model_device_open(what, value, dev_p);
        }
    } else if (value[4] != '\0') {
        return __real_kvf_model_device_open(what, value, dev_p);
    }
    if (__wrap_kvf_device_init(KVF_DEVICE_CUDA, (int)n, dev_p) != KVF_KERN_OK) {
        kvf_error("%s cuda:%ld: no CUDA device (devsim: %d simulated GPU%s)", what, n,
                  devsim_count(), (devsim_count() == 1) ? "" : "s");
        return KVF_ERR_CUDA;
    }
    return KVF_OK;
}

int __wrap_kvf_device_init(kvf_device_kind_t kind, int ordinal, kvf_device_t *dev_p)
{
    if (kind != KVF_DEVICE_CUDA) {
        return __real_kvf_device_init(kind, ordinal, dev_p);
    }
    if ((ordinal < 0) || (ordinal >= devsim_count())) {
        return KVF_KERN_ECUDA;
    }
    dev_p->kind = KVF_DEVICE_CUDA;
    dev_p->ordinal = ordinal;
    dev_p->stream = NULL;
    devsim_current = ordinal;   /* cudaSetDevice */
    st_opened++;
    return KVF_KERN_OK;
}

int __real_kvf_device_bind(const kvf_device_t *dev);
int __wrap_kvf_device_bind(const kvf_device_t *dev);
int __wrap_kvf_device_bind(const kvf_device_t *dev)
{
    if (!devsim_is_cuda(dev)) {
        return __real_kvf_device_bind(dev);
    }
    st_binds++;
    if ((dev->ordinal < 0) || (dev->ordinal >= devsim_count())) {
        return KVF_KERN_ECUDA;
    }
    devsim_current = dev->ordinal;
    return KVF_KERN_OK;
}

int __real_kvf_device_alloc(const kvf_device_t *dev, size_t bytes, void **ptr_p);
int __wrap_kvf_device_alloc(const kvf_device_t *dev, size_t bytes, void **ptr_p);
int __wrap_kvf_device_alloc(const kvf_device_t *dev, size_t bytes, void **ptr_p)
{
    size_t len = (bytes + 255) & ~(size_t)255;
    void *p;
    int fd = -1;

    if (!devsim_is_cuda(dev)) {
        return __real_kvf_device_alloc(dev, bytes, ptr_p);
    }
    devsim_not_in_graph("kvf_device_alloc (cudaMalloc cannot be recorded)");
    if (bytes == 0) {
        return KVF_KERN_EINVAL;
    }
    devsim_current = dev->ordinal;   /* kvf_cuda_alloc sets the device */
    p = devsim_ipc_on() ? devsim_ipc_alloc(len, &fd) : aligned_alloc(256, len);
    if (p == NULL) {
        return KVF_KERN_ENOMEM;
    }
    memset(p, 0xff, len);   /* stale bytes, as cudaMalloc leaves them: NaN in every dtype */
    pthread_mutex_lock(&devsim_lock);
    if (devsim_n == devsim_cap) {
        size_t cap = devsim_cap ? 2 * devsim_cap : 256;
        devsim_range_t *r = realloc(devsim_ranges, cap * sizeof(*r));
        if (r == NULL) {
            pthread_mutex_unlock(&devsim_lock);
            devsim_ipc_release(p, len, fd);
            return KVF_KERN_ENOMEM;
        }
        devsim_ranges = r;
        devsim_cap = cap;
    }
    devsim_ranges[devsim_n++] = (devsim_range_t){(uintptr_t)p, (uintptr_t)p + len, dev->ordinal,
                                                 fd, false};
    pthread_mutex_unlock(&devsim_lock);
    st_allocs++;
    tl_allocs++;
    st_alloc_bytes += bytes;
    *ptr_p = p;
    return KVF_KERN_OK;
}

void __real_kvf_device_free(const kvf_device_t *dev, void *ptr);
void __wrap_kvf_device_free(const kvf_device_t *dev, void *ptr);
void __wrap_kvf_device_free(const kvf_device_t *dev, void *ptr)
{
    devsim_range_t r = {0};
    bool found = false;

    if (!devsim_is_cuda(dev)) {
        __real_kvf_device_free(dev, ptr);
        return;
    }
    pthread_mutex_lock(&devsim_lock);
    for (size_t i = 0; i < devsim_n; ++i) {
        if ((devsim_ranges[i].lo == (uintptr_t)ptr) && !devsim_ranges[i].mapped) {
            r = devsim_ranges[i];
            devsim_ranges[i] = devsim_ranges[--devsim_n];
            found = true;
            break;
        }
    }
    pthread_mutex_unlock(&devsim_lock);
    if (found) {
        devsim_gemm_lt_forget(r.lo, r.hi);   /* its addresses may hold another matrix next */
        devsim_ipc_release(ptr, r.hi - r.lo, r.fd);
    } else if (ptr != NULL) {
        devsim_want_dev_fn(ptr, "kvf_device_free");   /* counted; never free()d as host memory */
    }
}

bool __real_kvf_device_ptr_is_cuda(const void *ptr);
bool __wrap_kvf_device_ptr_is_cuda(const void *ptr);
bool __wrap_kvf_device_ptr_is_cuda(const void *ptr)
{
    return devsim_owner(ptr) >= 0;
}

int __real_kvf_device_memset(const kvf_device_t *dev, void *ptr, int value, size_t bytes);
int __wrap_kvf_device_memset(const kvf_device_t *dev, void *ptr, int value, size_t bytes);
int __wrap_kvf_device_memset(const kvf_device_t *dev, void *ptr, int value, size_t bytes)
{
    kvf_device_t cpu = kvf_device_cpu();

    if (devsim_is_cuda(dev)) {
        devsim_want_dev_fn(ptr, "kvf_device_memset");
        devsim_want_current(dev, ptr, "kvf_device_memset", false);
        dev = &cpu;
    }
    return __real_kvf_device_memset(dev, ptr, value, bytes);
}

int __real_kvf_device_memcpy(const kvf_device_t *dev, void *dst, const void *src, size_t bytes,
                             kvf_copy_kind_t kind);
int __wrap_kvf_device_memcpy(const kvf_device_t *dev, void *dst, const void *src, size_t bytes,
                             kvf_copy_kind_t kind);
int __wrap_kvf_device_memcpy(const kvf_device_t *dev, void *dst, const void *src, size_t bytes,
                             kvf_copy_kind_t kind)
{
    kvf_device_t cpu = kvf_device_cpu();

    if (devsim_is_cuda(dev)) {
        switch (kind) {
        case KVF_COPY_H2D:
            devsim_want_dev_fn(dst, "kvf_device_memcpy H2D dst");
            devsim_want_host(src, "kvf_device_memcpy H2D src");
            devsim_want_input(src, bytes, "kvf_device_memcpy H2D src");
            st_h2d_bytes += bytes;
            break;
        case KVF_COPY_D2H:
            devsim_want_host(dst, "kvf_device_memcpy D2H dst");
            devsim_want_dev_fn(src, "kvf_device_memcpy D2H src");
            devsim_not_in_graph("kvf_device_memcpy D2H (the host waits for it)");
            st_d2h_calls++;
            tl_d2h++;
            st_d2h_bytes += bytes;
            break;
        case KVF_COPY_D2D:
            devsim_want_dev_fn(dst, "kvf_device_memcpy D2D dst");
            devsim_want_dev_fn(src, "kvf_device_memcpy D2D src");
            break;
        default:
            break;
        }
        if (tl_graph != 0) {
            if (dev->stream != (void *)&devsim_capture_stream) {
                devsim_graph_error(&st_graph_host_inputs, "kvf_device_memcpy on another stream "
                                   "than the capture's");
            }
            uint64_t h = devsim_mix(1469598103934665603ull, &dst, sizeof(dst));
            h = devsim_mix(h, &src, sizeof(src));
            h = devsim_mix(h, &bytes, sizeof(bytes));
            devsim_graph_call("kvf_device_memcpy", devsim_mix(h, &kind, sizeof(kind)));
        }
        dev = &cpu;
    }
    return __real_kvf_device_memcpy(dev, dst, src, bytes, kind);
}

int __real_kvf_device_sync(const kvf_device_t *dev);
int __wrap_kvf_device_sync(const kvf_device_t *dev);
int __wrap_kvf_device_sync(const kvf_device_t *dev)
{
    if (!devsim_is_cuda(dev)) {
        return __real_kvf_device_sync(dev);
    }
    devsim_not_in_graph("kvf_device_sync");
    devsim_ipc_flush();   /* gathers enqueued on a stream run before a sync returns */
    st_syncs++;
    tl_syncs++;
    return KVF_KERN_OK;
}

int __real_kvf_device_workspace_reserve(const kvf_device_t *dev, size_t device_bytes,
                                        size_t staging_bytes);
int __wrap_kvf_device_workspace_reserve(const kvf_device_t *dev, size_t device_bytes,
                                        size_t staging_bytes);
int __wrap_kvf_device_workspace_reserve(const kvf_device_t *dev, size_t device_bytes,
                                        size_t staging_bytes)
{
    if (!devsim_is_cuda(dev)) {
        return __real_kvf_device_workspace_reserve(dev, device_bytes, staging_bytes);
    }
    /* the simulated kernels take no scratch: the reservation is recorded, not made */
    st_ws_reserves++;
    st_ws_device_bytes += device_bytes;
    devsim_ssd_reserved(device_bytes);
    st_ws_staging_bytes += staging_bytes;
    return KVF_KERN_OK;
}

void __real_kvf_device_workspace_release(const kvf_device_t *dev);
void __wrap_kvf_device_workspace_release(const kvf_device_t *dev);
void __wrap_kvf_device_workspace_release(const kvf_device_t *dev)
{
    if (!devsim_is_cuda(dev)) {
        __real_kvf_device_workspace_release(dev);
    }
}

/* ---- steps: what rank 0 (the calling thread) does inside a decode step ---------- */

kvf_status_t __real_kvf_tp_runner_step(kvf_tp_runner_h runner, const kvf_fwd_batch_t *batch,
                                       const int32_t *fresh, int n_fresh);
kvf_status_t __wrap_kvf_tp_runner_step(kvf_tp_runner_h runner, const kvf_fwd_batch_t *batch,
                                       const int32_t *fresh, int n_fresh);
kvf_status_t __wrap_kvf_tp_runner_step(kvf_tp_runner_h runner, const kvf_fwd_batch_t *batch,
                                       const int32_t *fresh, int n_fresh)
{
    unsigned long long a0 = tl_allocs, d0 = tl_d2h, s0 = tl_syncs, d;
    bool decode = (batch->num_seqs > 0);
    kvf_status_t status;

    for (int i = 0; i < batch->num_seqs; ++i) {
        decode &= (batch->seqs[i].num_tokens == 1) && (batch->seqs[i].start > 0);
    }
    status = __real_kvf_tp_runner_step(runner, batch, fresh, n_fresh);
    if (decode && (status == KVF_OK)) {
        d = tl_d2h - d0;
        st_decode_steps++;
        st_decode_allocs += tl_allocs - a0;
        st_decode_d2h += d;
        st_decode_syncs += tl_syncs - s0;
        if (d > st_decode_d2h_max) {
            st_decode_d2h_max = d;   /* steps are sequential: no race on the maximum */
        }
    }
    return status;
}

int __real_kvf_device_stream_create(const kvf_device_t *dev, kvf_device_t *dev_p);
int __wrap_kvf_device_stream_create(const kvf_device_t *dev, kvf_device_t *dev_p);
int __wrap_kvf_device_stream_create(const kvf_device_t *dev, kvf_device_t *dev_p)
{
    static char streams[64];   /* distinct non-NULL "stream" values */

    if (!devsim_is_cuda(dev)) {
        return __real_kvf_device_stream_create(dev, dev_p);
    }
    devsim_current = dev->ordinal;   /* kvf_cuda_stream_create sets the device */
    *dev_p = *dev;
    dev_p->stream = &streams[(atomic_fetch_add(&st_streams, 1)) % sizeof(streams)];
    return KVF_KERN_OK;
}

void __real_kvf_device_stream_destroy(kvf_device_t *dev);
void __wrap_kvf_device_stream_destroy(kvf_device_t *dev);
void __wrap_kvf_device_stream_destroy(kvf_device_t *dev)
{
    if (!devsim_is_cuda(dev)) {
        __real_kvf_device_stream_destroy(dev);
        return;
    }
    dev->stream = NULL;
}

int __real_kvf_blocks_zero(const kvf_device_t *dev, void *base, size_t page_size,
                           const int64_t *page_ids, size_t n);
int __wrap_kvf_blocks_zero(const kvf_device_t *dev, void *base, size_t page_size,
                           const int64_t *page_ids, size_t n);
int __wrap_kvf_blocks_zero(const kvf_device_t *dev, void *base, size_t page_size,
                           const int64_t *page_ids, size_t n)
{
    kvf_device_t cpu = kvf_device_cpu();

    if (devsim_is_cuda(dev)) {
        devsim_want_dev_fn(base, "kvf_blocks_zero base");
        devsim_want_current(dev, base, "kvf_blocks_zero", true);
        devsim_want_host(page_ids, "kvf_blocks_zero page_ids (a host array)");
        st_blocks_zero_calls++;
        st_blocks_zero_pages += n;
        dev = &cpu;
    }
    return __real_kvf_blocks_zero(dev, base, page_size, page_ids, n);
}

int __real_kvf_zero_ranges(const kvf_device_t *dev, void *base, const size_t *offsets,
                           const size_t *lens, size_t n);
int __wrap_kvf_zero_ranges(const kvf_device_t *dev, void *base, const size_t *offsets,
                           const size_t *lens, size_t n);
int __wrap_kvf_zero_ranges(const kvf_device_t *dev, void *base, const size_t *offsets,
                           const size_t *lens, size_t n)
{
    kvf_device_t cpu = kvf_device_cpu();

    if (devsim_is_cuda(dev)) {
        devsim_want_dev_fn(base, "kvf_zero_ranges base");
        devsim_want_current(dev, base, "kvf_zero_ranges", false);
        st_zero_range_calls++;
        for (size_t i = 0; i < n; ++i) {
            st_zero_range_bytes += lens[i];
        }
        dev = &cpu;
    }
    return __real_kvf_zero_ranges(dev, base, offsets, lens, n);
}

/* ---- the ranks' world: the CPU's ---------------------------------------------- */

kvf_status_t __real_kvf_comm_world_create(kvf_device_kind_t kind, int size,
                                          const kvf_device_t *devs, kvf_comm_world_h *world_p);
kvf_status_t __wrap_kvf_comm_world_create(kvf_device_kind_t kind, int size,
                                          const kvf_device_t *devs, kvf_comm_world_h *world_p);
kvf_status_t __wrap_kvf_comm_world_create(kvf_device_kind_t kind, int size,
                                          const kvf_device_t *devs, kvf_comm_world_h *world_p)
{
    (void)kind;   /* NCCL over simulated GPUs: the CPU world on their (host) buffers */
    return __real_kvf_comm_world_create(KVF_DEVICE_CPU, size, devs, world_p);
}

/* ---- UCX: kvferry sees a CUDA-capable UCX, UCX sees host memory --------------- */

ucs_status_t __real_ucp_context_query(ucp_context_h context, ucp_context_attr_t *attr);
ucs_status_t __wrap_ucp_context_query(ucp_context_h context, ucp_context_attr_t *attr);
ucs_status_t __wrap_ucp_context_query(ucp_context_h context, ucp_context_attr_t *attr)
{
    ucs_status_t s = __real_ucp_context_query(context, attr);

    if ((s == UCS_OK) && (attr->field_mask & UCP_ATTR_FIELD_MEMORY_TYPES)) {
        attr->memory_types |= UCS_BIT(UCS_MEMORY_TYPE_CUDA);
    }
    return s;
}

ucs_status_t __real_ucp_mem_map(ucp_context_h context, const ucp_mem_map_params_t *params,
                                ucp_mem_h *memh_p);
ucs_status_t __wrap_ucp_mem_map(ucp_context_h context, const ucp_mem_map_params_t *params,
                                ucp_mem_h *memh_p);
ucs_status_t __wrap_ucp_mem_map(ucp_context_h context, const ucp_mem_map_params_t *params,
                                ucp_mem_h *memh_p)
{
    ucp_mem_map_params_t p = *params;

    if ((p.field_mask & UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE) &&
        (p.memory_type == UCS_MEMORY_TYPE_CUDA)) {
        devsim_want_dev_fn(p.address, "ucp_mem_map of cuda memory");
        st_ucx_maps++;
        p.memory_type = UCS_MEMORY_TYPE_HOST;   /* what the simulated GPU memory really is */
    }
    return __real_ucp_mem_map(context, &p, memh_p);
}

/* A GET or PUT whose local buffer kvferry names as CUDA memory: UCX is told host (what it is). */
static const ucp_request_param_t *devsim_host_param(const void *buffer,
                                                    const ucp_request_param_t *param,
                                                    ucp_request_param_t *copy)
{
    if ((param->op_attr_mask & UCP_OP_ATTR_FIELD_MEMORY_TYPE) &&
        (param->memory_type == UCS_MEMORY_TYPE_CUDA)) {
        devsim_want_dev_fn(buffer, "a GET/PUT naming cuda memory");
        *copy = *param;
        copy->memory_type = UCS_MEMORY_TYPE_HOST;
        return copy;
    }
    return param;
}

ucs_status_ptr_t __real_ucp_get_nbx(ucp_ep_h ep, void *buffer, size_t count,
                                    uint64_t remote_addr, ucp_rkey_h rkey,
                                    const ucp_request_param_t *param);
ucs_status_ptr_t __wrap_ucp_get_nbx(ucp_ep_h ep, void *buffer, size_t count,
                                    uint64_t remote_addr, ucp_rkey_h rkey,
                                    const ucp_request_param_t *param);
ucs_status_ptr_t __wrap_ucp_get_nbx(ucp_ep_h ep, void *buffer, size_t count,
                                    uint64_t remote_addr, ucp_rkey_h rkey,
                                    const ucp_request_param_t *param)
{
    ucp_request_param_t copy;

    return __real_ucp_get_nbx(ep, buffer, count, remote_addr, rkey,
                              devsim_host_param(buffer, param, &copy));
}

ucs_status_ptr_t __real_ucp_put_nbx(ucp_ep_h ep, const void *buffer, size_t count,
                                    uint64_t remote_addr, ucp_rkey_h rkey,
                                    const ucp_request_param_t *param);
ucs_status_ptr_t __wrap_ucp_put_nbx(ucp_ep_h ep, const void *buffer, size_t count,
                                    uint64_t remote_addr, ucp_rkey_h rkey,
                                    const ucp_request_param_t *param);
ucs_status_ptr_t __wrap_ucp_put_nbx(ucp_ep_h ep, const void *buffer, size_t count,
                                    uint64_t remote_addr, ucp_rkey_h rkey,
                                    const ucp_request_param_t *param)
{
    ucp_request_param_t copy;

    return __real_ucp_put_nbx(ep, buffer, count, remote_addr, rkey,
                              devsim_host_param(buffer, param, &copy));
}

/*
 * kvf_zero_ranges_batch() (kernels/kvf_zero_batch.h, where the tree has it: one launch
 * zeroing a pull's ranges). Done here with memsets, as its CPU path does, and never through
 * __real_: this file must link whether or not the tree defines it (a weak reference would
 * not pull the definition out of the kernels archive).
 */
int __wrap_kvf_zero_ranges_batch(const kvf_device_t *dev, void *base, const size_t *offsets,
                                 const size_t *lens, size_t n);
int __wrap_kvf_zero_ranges_batch(const kvf_device_t *dev, void *base, const size_t *offsets,
                                 const size_t *lens, size_t n)
{
    if ((n > 0) && ((base == NULL) || (offsets == NULL) || (lens == NULL))) {
        return KVF_KERN_EINVAL;
    }
    if (devsim_is_cuda(dev)) {
        devsim_want_dev_fn(base, "kvf_zero_ranges_batch base");
        devsim_want_current(dev, base, "kvf_zero_ranges_batch", true);
        st_zero_range_calls++;
    }
    for (size_t i = 0; i < n; ++i) {
        if (devsim_is_cuda(dev)) {
            st_zero_range_bytes += lens[i];
        }
        memset((uint8_t *)base + offsets[i], 0, lens[i]);
    }
    return KVF_KERN_OK;
}

/* ---- CUDA graphs (kvf_device_graph.h), emulated: see the opening comment ------------- */

kvf_device_graphs_t *devsim_graphs_of(devsim_graphs_t *g);
kvf_device_graphs_t *devsim_graphs_of(devsim_graphs_t *g)
{
    return (kvf_device_graphs_t *)(void *)g;
}

int __wrap_kvf_device_graphs_create(const kvf_device_t *dev, size_t arena_bytes, int max_graphs,
                                    kvf_device_graphs_t **graphs_p);
int __wrap_kvf_device_graphs_create(const kvf_device_t *dev, size_t arena_bytes, int max_graphs,
                                    kvf_device_graphs_t **graphs_p)
{
    devsim_graphs_t *g;

    (void)arena_bytes;   /* the simulated kernels take no scratch */
    if ((dev == NULL) || (graphs_p == NULL) || (max_graphs < 1)) {
        return KVF_KERN_EINVAL;
    }
    if (!devsim_is_cuda(dev)) {
        return KVF_KERN_EUNSUPPORTED;
    }
    g = calloc(1, sizeof(*g));
    if ((g == NULL) || ((g->recs = calloc((size_t)max_graphs, sizeof(*g->recs))) == NULL) ||
        ((g->seen = calloc((size_t)max_graphs, sizeof(*g->seen))) == NULL)) {
        if (g != NULL) {
            free(g->recs);
        }
        free(g);
        return KVF_KERN_ENOMEM;
    }
    g->dev = *dev;
    g->max = max_graphs;
    *graphs_p = devsim_graphs_of(g);
    return KVF_KERN_OK;
}

void __wrap_kvf_device_graphs_clear(kvf_device_graphs_t *graphs);
void __wrap_kvf_device_graphs_clear(kvf_device_graphs_t *graphs)
{
    devsim_graphs_t *g = (devsim_graphs_t *)(void *)graphs;

    if (g == NULL) {
        return;
    }
    for (int i = 0; i < g->n; ++i) {
        free(g->recs[i].calls);
        memset(&g->recs[i], 0, sizeof(g->recs[i]));
    }
    g->n = 0;
    g->nseen = 0;
    g->st.graphs = 0;
}

void __wrap_kvf_device_graphs_destroy(kvf_device_graphs_t *graphs);
void __wrap_kvf_device_graphs_destroy(kvf_device_graphs_t *graphs)
{
    devsim_graphs_t *g = (devsim_graphs_t *)(void *)graphs;

    if (g == NULL) {
        return;
    }
    __wrap_kvf_device_graphs_clear(graphs);
    free(g->recs);
    free(g->seen);
    free(g);
}

void __wrap_kvf_device_graphs_stats(const kvf_device_graphs_t *graphs,
                                    kvf_device_graphs_stats_t *stats_p);
void __wrap_kvf_device_graphs_stats(const kvf_device_graphs_t *graphs,
                                    kvf_device_graphs_stats_t *stats_p)
{
    const devsim_graphs_t *g = (const devsim_graphs_t *)(const void *)graphs;

    if (stats_p != NULL) {
        memset(stats_p, 0, sizeof(*stats_p));
        if (g != NULL) {
            *stats_p = g->st;
        }
    }
}

int __wrap_kvf_device_graph_run(kvf_device_graphs_t *graphs, uint64_t key,
                                kvf_graph_body_fn body, void *arg, const void *in_host,
                                const void *in_dev, size_t in_bytes, kvf_graph_how_t *how_p);
int __wrap_kvf_device_graph_run(kvf_device_graphs_t *graphs, uint64_t key,
                                kvf_graph_body_fn body, void *arg, const void *in_host,
                                const void *in_dev, size_t in_bytes, kvf_graph_how_t *how_p)
{
    devsim_graphs_t *g = (devsim_graphs_t *)(void *)graphs;
    devsim_rec_t *rec = NULL;
    int rc;

    if ((g == NULL) || (body == NULL) || (how_p == NULL) ||
        ((in_bytes > 0) && ((in_host == NULL) || (in_dev == NULL)))) {
        return KVF_KERN_EINVAL;
    }
    *how_p = KVF_GRAPH_EAGER;
    devsim_want_dev_fn(in_dev, "the published inputs' device copy");
    if ((in_bytes > 0) && (memcmp(in_host, in_dev, in_bytes) != 0)) {
        devsim_graph_error(&st_graph_host_inputs, "the published inputs' device copy is not "
                           "the host block (not uploaded before the launch)");
    }
    for (int i = 0; i < g->n; ++i) {
        if (g->recs[i].key == key) {
            rec = &g->recs[i];
        }
    }
    if ((rec == NULL) && (g->st.disabled || (g->n == g->max))) {
        return KVF_KERN_OK;
    }
    if (rec == NULL) {
        /* as the CUDA cache: a shape's first step runs eagerly, the second is recorded */
        bool seen = false;
        for (int i = 0; (i < g->nseen) && !seen; ++i) {
            seen = (g->seen[i] == key);
        }
        if (!seen) {
            if (g->nseen < g->max) {
                g->seen[g->nseen++] = key;
            }
            return KVF_KERN_OK;
        }
    }
    tl_graph = (rec != NULL) ? 2 : 1;
    if (rec == NULL) {
        rec = &g->recs[g->n];
        rec->key = key;
        rec->n = 0;
    }
    tl_rec = rec;
    tl_rec_pos = 0;
    tl_in_lo = in_host;
    tl_in_hi = (const char *)in_host + in_bytes;
    {
        kvf_device_t cap = g->dev;   /* the body's work must go to the capture stream */
        cap.stream = &devsim_capture_stream;
        rc = body(&cap, arg);   /* runs here: the capture and its launch in one */
    }
    if ((tl_graph == 2) && (tl_rec_pos != rec->n)) {
        devsim_graph_error(&st_graph_mismatches, "a replay made fewer calls than recorded");
    }
    if (tl_graph == 1) {
        g->n++;
        g->st.graphs = g->n;
        g->st.captures++;
        st_graph_captures++;
        *how_p = KVF_GRAPH_CAPTURED;
    } else {
        g->st.replays++;
        st_graph_replays++;
        *how_p = KVF_GRAPH_REPLAYED;
    }
    tl_graph = 0;
    tl_rec = NULL;
    tl_in_lo = tl_in_hi = NULL;
    return (rc == KVF_KERN_OK) ? KVF_KERN_OK : KVF_KERN_ECUDA;   /* it ran: no eager rerun */
}
