/*
 * Device layer, CUDA IPC: share a pool's device memory with another process
 * on the same node (the same-node pull path, transfer/ucx/kvf_connector_ipc.c),
 * and the events that tell a stream's work is done without blocking.
 *
 * The owner exports one handle per allocation (kvf_device_ipc_export():
 * cudaIpcGetMemHandle, 64 opaque bytes, plus where the pool starts inside
 * the allocation and the GPU's UUID); a reader on the same node opens it
 * once (kvf_device_ipc_open(): cudaIpcOpenMemHandle with
 * cudaIpcMemLazyEnablePeerAccess) and reads it with plain device loads
 * until kvf_device_ipc_close(). A handle is only as secret as the channel
 * that carried it: a process of the same node that holds it and can reach
 * the GPU can read (and write) the allocation (docs/SECURITY.md).
 *
 * Host memory (the CPU device) has no handle: export and open answer
 * KVF_KERN_EUNSUPPORTED, and so does a build without CUDA. Events on the
 * CPU are nothing: record gives NULL, query says done.
 *
 * Thread safety: reentrant; a mapping may be used from any thread of the
 * process that opened it.
 */
#ifndef KVF_DEVICE_IPC_H
#define KVF_DEVICE_IPC_H

#include "kvf_device.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVF_IPC_HANDLE_BYTES 64   /* sizeof(cudaIpcMemHandle_t), CUDA_IPC_HANDLE_SIZE */
#define KVF_DEVICE_UUID_BYTES 16  /* cudaDeviceProp.uuid */

/** What the owner of a device range publishes. */
typedef struct kvf_ipc_export {
    uint8_t  handle[KVF_IPC_HANDLE_BYTES];   /* of the whole allocation holding the range */
    uint64_t offset;                         /* range start - allocation start, bytes */
    uint8_t  uuid[KVF_DEVICE_UUID_BYTES];    /* the GPU holding it */
} kvf_ipc_export_t;

/**
 * Export [ptr, ptr + len) of device memory of @a dev.
 * @param [out] exp_p  Set only on success.
 * @return KVF_KERN_OK; KVF_KERN_EINVAL (NULL ptr, len 0, the range leaves
 *         its allocation); KVF_KERN_EUNSUPPORTED (CPU device, no CUDA);
 *         KVF_KERN_ECUDA (not device memory, or IPC unsupported: reported).
 */
int kvf_device_ipc_export(const kvf_device_t *dev, const void *ptr, size_t len,
                          kvf_ipc_export_t *exp_p);

/**
 * Map another process's allocation into this one, on @a dev's GPU (peer
 * access enabled lazily when it lives on another GPU).
 * @param [out] base_p  The allocation's first byte here; set only on success.
 * @param [out] len_p   The allocation's size in bytes (what may be read).
 * @return KVF_KERN_OK; KVF_KERN_EINVAL (NULL arguments);
 *         KVF_KERN_EUNSUPPORTED (CPU device, no CUDA); KVF_KERN_ECUDA (the
 *         handle is of this process, of a freed allocation, of another node,
 *         or garbage: reported with CUDA's message; nothing mapped).
 */
int kvf_device_ipc_open(const kvf_device_t *dev, const uint8_t *handle, void **base_p,
                        size_t *len_p);

/** Unmap what kvf_device_ipc_open() mapped (reported, not returned, on failure). NULL ok. */
void kvf_device_ipc_close(const kvf_device_t *dev, void *base);

/**
 * Whether a GPU of UUID @a uuid is visible to this process (any ordinal).
 * CPU-only build or no GPU: false.
 */
bool kvf_device_uuid_visible(const uint8_t *uuid);

/**
 * Record an event after the work enqueued so far on dev->stream.
 * @param [out] event_p  cudaEvent_t (timing disabled); NULL on the CPU. Destroy
 *                       with kvf_device_event_destroy().
 * @return KVF_KERN_OK; KVF_KERN_ECUDA; KVF_KERN_EUNSUPPORTED.
 */
int kvf_device_event_record(const kvf_device_t *dev, void **event_p);

/**
 * Whether the work before @a event is done; never blocks.
 * @param [out] done_p  true when done (always, on the CPU or for a NULL event).
 * @return KVF_KERN_OK; KVF_KERN_ECUDA when that work failed (reported).
 */
int kvf_device_event_query(const kvf_device_t *dev, void *event, bool *done_p);

/** Destroy an event of kvf_device_event_record(); NULL ok. */
void kvf_device_event_destroy(const kvf_device_t *dev, void *event);

/**
 * Host memory a copy engine reads without a staging copy (cudaHostAlloc,
 * pinned), for buffers handed to a device again and again (the ops of
 * kvf_gather_staged()). CPU device: plain malloc. Slow (milliseconds on
 * CUDA): allocate once, reuse.
 * @param [out] ptr_p  Set only on success; free with kvf_device_host_free().
 * @return KVF_KERN_OK; KVF_KERN_EINVAL (bytes 0); KVF_KERN_ENOMEM;
 *         KVF_KERN_ECUDA; KVF_KERN_EUNSUPPORTED (CUDA in a build without CUDA).
 */
int kvf_device_host_alloc(const kvf_device_t *dev, size_t bytes, void **ptr_p);

/** Free what kvf_device_host_alloc() gave for the same device kind; NULL ok. */
void kvf_device_host_free(const kvf_device_t *dev, void *ptr);

#ifdef __cplusplus
}
#endif

#endif
