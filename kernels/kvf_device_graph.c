/*
 * kvf_device_graph.h: the checks, and the dispatch to kvf_device_graph_cuda.cu
 * (a build without CUDA, or a CPU device, has no graphs).
 */
#include "kvf_device_graph.h"
#ifdef KVF_HAVE_CUDA
#include "kvf_device_cuda.h"
#endif

#include <string.h>

int kvf_device_graphs_create(const kvf_device_t *dev, size_t arena_bytes, int max_graphs,
                             kvf_device_graphs_t **graphs_p)
{
    if ((dev == NULL) || (graphs_p == NULL) || (max_graphs < 1)) {
        return KVF_KERN_EINVAL;
    }
    if (dev->kind != KVF_DEVICE_CUDA) {
        return KVF_KERN_EUNSUPPORTED;
    }
#ifdef KVF_HAVE_CUDA
    return kvf_cuda_graphs_create(dev, arena_bytes, max_graphs, graphs_p);
#else
    (void)arena_bytes;
    return KVF_KERN_EUNSUPPORTED;
#endif
}

void kvf_device_graphs_destroy(kvf_device_graphs_t *graphs)
{
#ifdef KVF_HAVE_CUDA
    if (graphs != NULL) {
        kvf_cuda_graphs_destroy(graphs);
    }
#else
    (void)graphs;   /* never made without CUDA */
#endif
}

void kvf_device_graphs_clear(kvf_device_graphs_t *graphs)
{
#ifdef KVF_HAVE_CUDA
    if (graphs != NULL) {
        kvf_cuda_graphs_clear(graphs);
    }
#else
    (void)graphs;
#endif
}

int kvf_device_graph_run(kvf_device_graphs_t *graphs, uint64_t key, kvf_graph_body_fn body,
                         void *arg, const void *in_host, const void *in_dev, size_t in_bytes,
                         kvf_graph_how_t *how_p)
{
    if ((graphs == NULL) || (body == NULL) || (how_p == NULL) ||
        ((in_bytes > 0) && ((in_host == NULL) || (in_dev == NULL)))) {
        return KVF_KERN_EINVAL;
    }
#ifdef KVF_HAVE_CUDA
    return kvf_cuda_graph_run(graphs, key, body, arg, in_host, in_dev, in_bytes, how_p);
#else
    (void)key;
    (void)arg;
    *how_p = KVF_GRAPH_EAGER;
    return KVF_KERN_EUNSUPPORTED;
#endif
}

void kvf_device_graphs_stats(const kvf_device_graphs_t *graphs,
                             kvf_device_graphs_stats_t *stats_p)
{
    if (stats_p == NULL) {
        return;
    }
    memset(stats_p, 0, sizeof(*stats_p));
#ifdef KVF_HAVE_CUDA
    if (graphs != NULL) {
        kvf_cuda_graphs_stats(graphs, stats_p);
    }
#else
    (void)graphs;
#endif
}
