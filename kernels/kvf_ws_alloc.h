/*
 * The two allocators of a device workspace (kvf_device_workspace_reserve()),
 * as plain C over memory the caller owns, so their rules are tested on the
 * CPU (tests/kernels/test_kern_ws_alloc.c) exactly as the CUDA side runs
 * them (kvf_device_ws_cuda.cu):
 *
 * - the ARENA: device scratch of the kernel launchers (kvf_cuda_scratch()),
 *   a stack. Every piece starts at a KVF_WS_ALIGN boundary; a free marks its
 *   piece and pops every marked piece from the top, so frees in LIFO order
 *   (every launcher's) give the memory back at once and any other order
 *   gives it back when the pieces above are gone. Reusing a popped piece
 *   needs no host wait: the arena belongs to one stream, and the stream
 *   runs the kernel that used it before the kernel that reuses it.
 * - the STAGING area: pinned host memory that host->device inputs (block
 *   tables, positions, ids) are copied into before an asynchronous copy
 *   reads them. The host may only write a byte again once that copy ran,
 *   which stream order does not tell the host: the area is two halves,
 *   each filled front to back; when a take does not fit the current half,
 *   a fence (a CUDA event) is recorded after that half's copies and the
 *   other half is reused once its own fence has passed (asked first, waited
 *   for only if not: counted as a wait). A host synchronisation of the
 *   stream (the sampled ids' device-to-host copy: one per step) proves every
 *   earlier copy ran: kvf_staging_mark() before it and kvf_staging_synced()
 *   after it empty both halves, unless a take happened in between (that
 *   copy may be later than the sync). Design: halves and a reset at the
 *   step's one synchronisation keep the cost of a take at a pointer bump;
 *   the fences only matter for a stream that is never synchronised (a TP
 *   rank other than 0) or a step larger than a half. Rejected: an event per
 *   take (a cudaEventRecord per launcher call, about as costly as the
 *   copy), and a reset only at an explicit step-boundary call (a new
 *   obligation on every caller of the kernels, broken by any that forgets).
 *
 * Neither allocator fails a request it cannot serve: it answers "no" and
 * counts it, and the caller falls back (cudaMallocAsync; a pageable copy)
 * and says so once in the log (kvf_device_ws_cuda.cu).
 *
 * Not thread-safe: the workspace holds a lock around every call.
 */
#ifndef KVF_WS_ALLOC_H
#define KVF_WS_ALLOC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVF_WS_ALIGN       256u  /* arena pieces: kvf_device_alloc()'s alignment */
#define KVF_WS_STAGE_ALIGN 64u   /* staging pieces: a cache line */
#define KVF_WS_MAX_LIVE    64u   /* arena pieces alive at once (a launcher holds 1-3) */
#define KVF_STAGING_TOO_BIG 1    /* kvf_staging_take(): larger than a half, refused */

typedef struct kvf_arena_piece {
    size_t off, end;    /* [off, end) of the arena */
    bool   freed;       /* freed but not yet popped (a piece above is alive) */
} kvf_arena_piece_t;

typedef struct kvf_arena {
    uintptr_t         base;
    size_t            cap;        /* bytes */
    size_t            top;        /* end of the highest live piece */
    size_t            nlive;
    kvf_arena_piece_t live[KVF_WS_MAX_LIVE];
    size_t            peak;       /* highest top so far */
    uint64_t          overflows;  /* requests refused: did not fit, or too many pieces */
    size_t            overflow_max; /* the largest refused request, bytes */
} kvf_arena_t;

/** An empty arena over [base, base + cap); base must be KVF_WS_ALIGN-aligned. */
void kvf_arena_init(kvf_arena_t *a, void *base, size_t cap);

/**
 * A piece of @a bytes (> 0) at a KVF_WS_ALIGN boundary above every live
 * piece. @return its address, or NULL (counted in overflows) when it does
 * not fit or KVF_WS_MAX_LIVE pieces are alive.
 */
void *kvf_arena_alloc(kvf_arena_t *a, size_t bytes);

/**
 * Free a piece: marked, then every marked piece at the top is popped.
 * @return false when @a p is not a live piece of this arena (e.g. a
 *         fallback allocation: the caller frees it its own way).
 */
bool kvf_arena_free(kvf_arena_t *a, const void *p);

/** Bytes from the base to the top of the highest live piece. */
size_t kvf_arena_in_use(const kvf_arena_t *a);

/** The fences of a staging area (CUDA: an event per half on the stream). */
typedef struct kvf_staging_ops {
    /** Record a fence after the copies issued so far (those of half @a half). */
    int (*fence)(void *ctx, int half);
    /** Return once half @a half's fence has passed; *waited_p: whether the host blocked. */
    int (*wait)(void *ctx, int half, bool *waited_p);
} kvf_staging_ops_t;

typedef struct kvf_staging {
    unsigned char           *base;
    size_t                   half_cap;   /* bytes per half (cap / 2, aligned down) */
    int                      cur;        /* the half takes come from */
    size_t                   used[2];
    bool                     fenced[2];  /* a fence was recorded after the half's copies */
    uint64_t                 takes;      /* takes so far (kvf_staging_mark()) */
    const kvf_staging_ops_t *ops;
    void                    *ctx;
    size_t                   peak;       /* most bytes of one half in use */
    uint64_t                 overflows;  /* takes larger than a half: refused */
    size_t                   overflow_max;
    uint64_t                 waits;      /* switches that had to block on a fence */
    uint64_t                 resets;     /* kvf_staging_synced() that emptied the area */
} kvf_staging_t;

/** An empty staging area over [base, base + cap) (two halves of cap / 2). */
void kvf_staging_init(kvf_staging_t *s, void *base, size_t cap, const kvf_staging_ops_t *ops,
                      void *ctx);

/**
 * @a bytes of staging (a KVF_WS_STAGE_ALIGN boundary); the caller writes
 * them and issues the copy that reads them before its next call.
 * @param [out] ptr_p  Set only on success.
 * @return 0; KVF_STAGING_TOO_BIG when @a bytes exceeds a half (counted in
 *         overflows: the caller copies from its own memory instead); a fence
 *         op's error (negative, as the op returned it).
 */
int kvf_staging_take(kvf_staging_t *s, size_t bytes, void **ptr_p);

/** Before a host synchronisation of the stream: the takes so far. */
uint64_t kvf_staging_mark(const kvf_staging_t *s);

/**
 * After that synchronisation completed: every copy issued before @a mark
 * has run; when no take happened since, both halves are empty again.
 * @return whether the area was emptied.
 */
bool kvf_staging_synced(kvf_staging_t *s, uint64_t mark);

/**
 * The published inputs of a step captured as a CUDA graph (kvf_device_graph.h): a host
 * block and its device copy of @a bytes each. While a graph is captured the stream's
 * scratch hands out the device copy of a host input inside the block and refuses any other.
 */
typedef struct kvf_ws_inputs {
    const unsigned char *host;   /* NULL: none published */
    unsigned char       *dev;
    size_t               bytes;
} kvf_ws_inputs_t;

/**
 * The device copy of host input [@a host, @a host + @a bytes), or NULL when that range is
 * not wholly inside the published block (or nothing is published). Never overflows on
 * pointers or sizes near the address space's end.
 */
void *kvf_ws_inputs_find(const kvf_ws_inputs_t *in, const void *host, size_t bytes);

/** Whether @a p points into the device copy (handed out by kvf_ws_inputs_find: never freed). */
bool kvf_ws_inputs_owns(const kvf_ws_inputs_t *in, const void *p);

#ifdef __cplusplus
}
#endif

#endif
