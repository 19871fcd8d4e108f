/*
 * Work of a step recorded once as a CUDA graph per shape, then replayed:
 * one launch in place of the step's tens of kernel launches and their host
 * work (CUDA Programming Guide, "CUDA Graphs": stream capture, instantiate,
 * launch; vLLM captures its decode steps per batch-size bucket the same way).
 *
 * The contract that makes a replay right: everything the recorded work reads
 * from the host must be in one block of step inputs whose device copy sits at
 * a fixed address, rewritten before every launch (the caller uploads it with
 * kvf_device_memcpy()). A captured kernel keeps its arguments (pointers,
 * sizes, grid) by value, and a captured copy keeps its source address, so a
 * host array packed per call would replay stale. While a body is captured,
 * the stream's scratch (kvf_cuda_scratch()) hands out the device copy for any
 * host input that lies inside the published block (no copy at all) and
 * refuses any other host input by name: such a capture fails and the caller
 * runs the step eagerly. Scratch taken during capture comes from an arena of
 * the graph cache's own (its addresses live on in the graph), not from the
 * rank's, whose pieces other threads may hold at replay time.
 *
 * Design: the caller passes a body (a function of the device to launch on),
 * not a begin/end pair, so the capture stream, the published inputs and the
 * fallback stay inside this file; the cache is keyed by the caller's 64-bit
 * shape key (kvferry's model: the number of requests of a decode step).
 * Rejected: updating one executable graph per step (cudaGraphExecUpdate: the
 * host work of a capture every step, what a replay exists to skip); padding
 * batches to buckets (a graph per exact size costs about a capture each, at
 * most max_graphs of them, and needs no dummy requests).
 *
 * CPU devices have no graphs: kvf_device_graphs_create() refuses them
 * (KVF_KERN_EUNSUPPORTED), so callers keep the eager path there.
 */
#ifndef KVF_DEVICE_GRAPH_H
#define KVF_DEVICE_GRAPH_H

#include "kvf_device.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvf_device_graphs kvf_device_graphs_t;

/** Work recorded into a graph: launches on @a dev only (the capture stream's device);
 *  returns a KVF_KERN_* code. Called once per captured shape, never on replay. */
typedef int (*kvf_graph_body_fn)(const kvf_device_t *dev, void *arg);

/** How kvf_device_graph_run() ran the step. */
typedef enum {
    KVF_GRAPH_EAGER = 0,   /* nothing launched: run the work eagerly (no graph for it) */
    KVF_GRAPH_CAPTURED,    /* recorded now, then launched */
    KVF_GRAPH_REPLAYED     /* an earlier recording launched */
} kvf_graph_how_t;

/** What a cache did (kvf_device_graphs_stats()). */
typedef struct kvf_graphs_stats {
    int      graphs;       /* recordings held now */
    uint64_t captures;     /* recordings made */
    uint64_t replays;      /* launches of an earlier recording */
    uint64_t failures;     /* captures that failed (the cache then turns itself off) */
    bool     disabled;     /* after a failed capture: every later run answers EAGER */
} kvf_device_graphs_stats_t;

/**
 * A graph cache for work launched on @a dev's stream (the rank's; the
 * legacy default stream is fine: graphs launch there, capture happens on a
 * stream of the cache's own).
 * @param [in]  dev          A CUDA device.
 * @param [in]  arena_bytes  Device scratch the captured work may take at
 *                           once (as kvf_device_workspace_reserve()'s
 *                           device_bytes, for the largest captured shape).
 * @param [in]  max_graphs   Recordings kept, >= 1; a new shape beyond them
 *                           runs eagerly (KVF_GRAPH_EAGER).
 * @param [out] graphs_p     Owned by the caller: kvf_device_graphs_destroy().
 * @return KVF_KERN_OK; KVF_KERN_EINVAL (NULL, max_graphs < 1);
 *         KVF_KERN_EUNSUPPORTED (a CPU device, or a build without CUDA);
 *         KVF_KERN_ENOMEM; KVF_KERN_ECUDA.
 */
int kvf_device_graphs_create(const kvf_device_t *dev, size_t arena_bytes, int max_graphs,
                             kvf_device_graphs_t **graphs_p);

/** Wait for the device, free every recording, the capture stream and its arena. NULL: no-op. */
void kvf_device_graphs_destroy(kvf_device_graphs_t *graphs);

/** Forget every recording (the buffers they point into moved); counters kept. NULL: no-op. */
void kvf_device_graphs_clear(kvf_device_graphs_t *graphs);

/**
 * Run the work of shape @a key: launch its recording on the cache's device
 * stream; the first time a shape is seen, answer KVF_GRAPH_EAGER (the caller
 * runs it eagerly: one-time setup such as a cuBLAS handle or lazily loaded
 * kernels then happens outside a capture); the second time, record @a body
 * (which runs nothing: it only records launches) and launch that. @a in_host [@a in_bytes] is the step's
 * published inputs and @a in_dev its device copy (uploaded on the stream
 * before this call, at an address that never moves while recordings use it).
 * A capture that fails (the body's error, a host input outside the block, an
 * operation CUDA cannot record) is logged once with CUDA's reason, turns the
 * cache off and answers KVF_GRAPH_EAGER with KVF_KERN_OK: nothing ran, the
 * caller runs the work eagerly.
 * @param [out] how_p  How it ran (always written on KVF_KERN_OK).
 * @return KVF_KERN_OK; KVF_KERN_EINVAL (NULL graphs, body, how_p, or in_bytes
 *         > 0 with a NULL block); KVF_KERN_ECUDA (a launch failed: the stream
 *         is broken, as after any failed kernel).
 */
int kvf_device_graph_run(kvf_device_graphs_t *graphs, uint64_t key, kvf_graph_body_fn body,
                         void *arg, const void *in_host, const void *in_dev, size_t in_bytes,
                         kvf_graph_how_t *how_p);

/** The counters of @a graphs (all zero for NULL). */
void kvf_device_graphs_stats(const kvf_device_graphs_t *graphs,
                             kvf_device_graphs_stats_t *stats_p);

#ifdef __cplusplus
}
#endif

#endif
