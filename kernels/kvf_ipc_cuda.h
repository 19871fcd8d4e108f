/*
 * Internal: the CUDA side of kvf_device_ipc.h and kvf_gather.h
 * (kvf_device_ipc_cuda.cu, kvf_gather_cuda.cu). Same contracts as the public
 * functions of the same stem; those check the arguments first.
 */
#ifndef KVF_IPC_CUDA_H
#define KVF_IPC_CUDA_H

#include "kvf_device_ipc.h"
#include "kvf_gather.h"

#ifdef __cplusplus
extern "C" {
#endif

int  kvf_cuda_ipc_export(const kvf_device_t *dev, const void *ptr, size_t len,
                         kvf_ipc_export_t *exp_p);
int  kvf_cuda_ipc_open(const kvf_device_t *dev, const uint8_t *handle, void **base_p,
                       size_t *len_p);
void kvf_cuda_ipc_close(const kvf_device_t *dev, void *base);
bool kvf_cuda_uuid_visible(const uint8_t *uuid);
int  kvf_cuda_event_record(const kvf_device_t *dev, void **event_p);
int  kvf_cuda_event_query(void *event, bool *done_p);
void kvf_cuda_event_destroy(void *event);
int  kvf_cuda_gather(const kvf_device_t *dev, const kvf_gather_op_t *ops, size_t n);
int  kvf_cuda_gather_staged(const kvf_device_t *dev, const kvf_gather_op_t *host_ops,
                            kvf_gather_op_t *dev_ops, size_t n);
int  kvf_cuda_host_alloc(const kvf_device_t *dev, size_t bytes, void **ptr_p);
void kvf_cuda_host_free(void *ptr);

#ifdef __cplusplus
}
#endif

#endif
