/*
 * TEST ONLY: what the parts of kvf-devsim share (kvf_devsim.c: the simulated memory, the
 * device layer, the graph recordings; kvf_devsim_kernels.c: the kernel entry points).
 */
#ifndef KVF_DEVSIM_INT_H
#define KVF_DEVSIM_INT_H

#include "kvf_device.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* counters printed in the devsim line at exit */
extern atomic_ullong st_kernels, st_graph_host_inputs, st_graph_mismatches;
/* the calling thread's graph body, if any: 1 recording, 2 replaying */
extern _Thread_local int tl_graph;
/* the stream a graph body's work must go to (a real capture records only that stream) */
extern char devsim_capture_stream;

/* FNV-1a of @n bytes at @p, continuing @h. */
uint64_t devsim_mix(uint64_t h, const void *p, size_t n);
/* @dev is a simulated GPU. */
bool devsim_is_cuda(const kvf_device_t *dev);
/* @p (non-NULL) must be simulated device memory; counted when it is not. */
void devsim_want_dev_fn(const void *p, const char *what);
/* @p must lie on @dev's GPU, the thread's current one for a @kernel launch. */
void devsim_want_current(const kvf_device_t *dev, const void *p, const char *what, bool kernel);
/* A host array of @bytes a launcher uploads: inside a graph body it must be published. */
void devsim_want_input(const void *p, size_t bytes, const char *what);
/* Work a graph cannot hold, counted inside a graph body. */
void devsim_not_in_graph(const char *what);
/* One graph-body error on @counter; the first 8 printed. */
void devsim_graph_error(atomic_ullong *counter, const char *what);
/* A kernel call inside a graph body (@h: its arguments' hash): recorded, or compared. */
void devsim_graph_call(const char *name, uint64_t h);

/* ---- DEVSIM_IPC (kvf_devsim_ipc.c): the same-node path between simulated GPUs ---- */
/* DEVSIM_IPC=1 in the environment: allocations are shareable, IPC handles open. */
bool devsim_ipc_on(void);
/* @len bytes of shared memory (a memfd, mapped here), its descriptor in @fd_p; NULL: none. */
void *devsim_ipc_alloc(size_t len, int *fd_p);
/* Free what kvf_device_alloc gave: a memfd mapping (@fd >= 0) or aligned_alloc memory. */
void devsim_ipc_release(void *p, size_t len, int fd);
/* Run every gather enqueued and not run yet (a sync, an event query). */
void devsim_ipc_flush(void);
/* The simulated range holding @p: bounds, GPU, memfd (-1: none or a mapping). */
bool devsim_range_find(const void *p, uintptr_t *lo_p, uintptr_t *hi_p, int *ord_p, int *fd_p);
/* Record (@add) or forget an opened IPC mapping of @len bytes at @p as GPU @ordinal's. */
int devsim_range_map(void *p, size_t len, int ordinal, bool add);

#endif
