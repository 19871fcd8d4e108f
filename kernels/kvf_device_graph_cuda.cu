/*
 * CUDA graphs of a step (kvf_device_graph.h): capture on a stream of the
 * cache's own whose workspace arena is the cache's too, instantiate, launch
 * on the rank's stream. kvf_device_graph.c checks the arguments.
 */
#include "kvf_cuda_util.h"
#include "kvf_device_cuda.h"
#include "kvf_device_graph.h"
extern "C" {
#include "kvf_log.h"
}

#include <stdlib.h>
#include <string.h>

#if CUDART_VERSION < 12000
#error "kvferry's CUDA graphs need CUDA 12 or later (cudaGraphInstantiate with flags)"
#endif

struct kvf_device_graphs {
    kvf_device_t               dev;   /* launches go to dev.stream */
    kvf_device_t               cap;   /* capture stream (and its workspace) */
    int                        max, n, nseen;
    uint64_t                  *keys;
    uint64_t                  *seen;   /* shapes run eagerly once (warm-up), not recorded yet */
    cudaGraphExec_t           *execs;
    kvf_device_graphs_stats_t  st;
};

extern "C" int kvf_cuda_graphs_create(const kvf_device_t *dev, size_t arena_bytes,
                                      int max_graphs, kvf_device_graphs_t **graphs_p)
{
    kvf_device_graphs_t *g = (kvf_device_graphs_t *)calloc(1, sizeof(*g));
    int rc;

    if (g == NULL) {
        return KVF_KERN_ENOMEM;
    }
    g->keys = (uint64_t *)calloc((size_t)max_graphs, sizeof(uint64_t));
    g->seen = (uint64_t *)calloc((size_t)max_graphs, sizeof(uint64_t));
    g->execs = (cudaGraphExec_t *)calloc((size_t)max_graphs, sizeof(cudaGraphExec_t));
    if ((g->keys == NULL) || (g->seen == NULL) || (g->execs == NULL)) {
        free(g->keys);
        free(g->seen);
        free(g->execs);
        free(g);
        return KVF_KERN_ENOMEM;
    }
    g->dev = *dev;
    g->max = max_graphs;
    rc = kvf_cuda_stream_create(dev, &g->cap);
    if (rc == KVF_KERN_OK) {
        /* the staging area is never used while capturing (host inputs are published or
         * refused): the smallest one */
        rc = kvf_cuda_ws_reserve(&g->cap, arena_bytes, 4096);
        if (rc != KVF_KERN_OK) {
            kvf_cuda_stream_destroy(&g->cap);
        }
    }
    if (rc != KVF_KERN_OK) {
        free(g->keys);
        free(g->seen);
        free(g->execs);
        free(g);
        return rc;
    }
    *graphs_p = g;
    return KVF_KERN_OK;
}

extern "C" void kvf_cuda_graphs_clear(kvf_device_graphs_t *g)
{
    int prev = -1;

    g->nseen = 0;   /* the warm-ups were of the buffers that moved too */
    if (g->n == 0) {
        return;
    }
    /* a launched recording may still run: wait on the cache's GPU (the legacy stream is
     * the calling thread's current device's, which may be another one at teardown) */
    KVF_CUDA_CHECK_IGNORE(cudaGetDevice(&prev));
    KVF_CUDA_CHECK_IGNORE(cudaSetDevice(g->dev.ordinal));
    KVF_CUDA_CHECK_IGNORE(cudaStreamSynchronize(kvf_cuda_stream_of(&g->dev)));
    for (int i = 0; i < g->n; ++i) {
        KVF_CUDA_CHECK_IGNORE(cudaGraphExecDestroy(g->execs[i]));
    }
    if (prev >= 0) {
        KVF_CUDA_CHECK_IGNORE(cudaSetDevice(prev));
    }
    g->n = 0;
    g->st.graphs = 0;
}

extern "C" void kvf_cuda_graphs_destroy(kvf_device_graphs_t *g)
{
    kvf_cuda_graphs_clear(g);
    kvf_cuda_ws_release(&g->cap);   /* waits for the capture stream, frees the arena */
    kvf_cuda_stream_destroy(&g->cap);
    free(g->keys);
    free(g->seen);
    free(g->execs);
    free(g);
}

/* A capture that did not give a graph: counted, logged once, the cache off. */
static void kvf_cuda_graphs_fail(kvf_device_graphs_t *g, const char *why)
{
    g->st.failures++;
    if (!g->st.disabled) {
        kvf_warn("cuda:%d: decode steps as CUDA graphs turned off, steps run eagerly: the "
                 "capture failed (%s)", g->dev.ordinal, why);
    }
    g->st.disabled = true;
}

extern "C" int kvf_cuda_graph_run(kvf_device_graphs_t *g, uint64_t key, kvf_graph_body_fn body,
                                  void *arg, const void *in_host, const void *in_dev,
                                  size_t in_bytes, kvf_graph_how_t *how_p)
{
    cudaStream_t cs = kvf_cuda_stream_of(&g->cap);
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    cudaError_t e;
    int rc;

    for (int i = 0; i < g->n; ++i) {
        if (g->keys[i] == key) {
            KVF_CUDA_CHECK(cudaGraphLaunch(g->execs[i], kvf_cuda_stream_of(&g->dev)));
            g->st.replays++;
            *how_p = KVF_GRAPH_REPLAYED;
            return KVF_KERN_OK;
        }
    }
    *how_p = KVF_GRAPH_EAGER;
    if (g->st.disabled || (g->n == g->max)) {
        return KVF_KERN_OK;
    }
    /* a shape's first step runs eagerly: one-time work on this thread (a cuBLAS handle,
     * kernels loaded lazily on first launch) then happens outside any capture */
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
    rc = kvf_cuda_ws_capture_inputs(cs, in_host, in_dev, in_bytes, true);
    if (rc != KVF_KERN_OK) {
        kvf_cuda_graphs_fail(g, "the capture stream has no workspace");
        return KVF_KERN_OK;
    }
    /* thread-local: other threads (a pull's zeroing on the rank's stream) go on meanwhile */
    e = cudaStreamBeginCapture(cs, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) {
        (void)kvf_cuda_ws_capture_inputs(cs, NULL, NULL, 0, false);
        kvf_cuda_graphs_fail(g, cudaGetErrorString(e));
        (void)cudaGetLastError();
        return KVF_KERN_OK;
    }
    rc = body(&g->cap, arg);
    e = cudaStreamEndCapture(cs, &graph);   /* always ends it, whatever the body did */
    (void)kvf_cuda_ws_capture_inputs(cs, NULL, NULL, 0, false);
    if ((rc != KVF_KERN_OK) || (e != cudaSuccess) || (graph == NULL)) {
        if (graph != NULL) {
            KVF_CUDA_CHECK_IGNORE(cudaGraphDestroy(graph));
        }
        kvf_cuda_graphs_fail(g, (e != cudaSuccess) ? cudaGetErrorString(e) :
                                (rc != KVF_KERN_OK) ? kvf_kern_strerror(rc) : "no graph");
        (void)cudaGetLastError();   /* a refused call inside the capture is not sticky */
        return KVF_KERN_OK;
    }
    e = cudaGraphInstantiate(&exec, graph, 0);
    KVF_CUDA_CHECK_IGNORE(cudaGraphDestroy(graph));
    if (e != cudaSuccess) {
        kvf_cuda_graphs_fail(g, cudaGetErrorString(e));
        (void)cudaGetLastError();
        return KVF_KERN_OK;
    }
    g->keys[g->n] = key;
    g->execs[g->n] = exec;
    g->n++;
    g->st.graphs = g->n;
    g->st.captures++;
    KVF_CUDA_CHECK(cudaGraphLaunch(exec, kvf_cuda_stream_of(&g->dev)));
    *how_p = KVF_GRAPH_CAPTURED;
    return KVF_KERN_OK;
}

extern "C" void kvf_cuda_graphs_stats(const kvf_device_graphs_t *g,
                                      kvf_device_graphs_stats_t *st)
{
    *st = g->st;
}
