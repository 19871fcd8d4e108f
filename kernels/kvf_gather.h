/*
 * One batched copy of many byte ranges: the same-node pull of a whole
 * request (transfer/ucx/kvf_connector_ipc.c) as ONE upload of an op list and
 * ONE kernel, instead of one GET or cudaMemcpyAsync per descriptor.
 *
 * An op copies len bytes from src to dst, or zeroes len bytes at dst when
 * src is 0 (the untransferred tails of a pull). Addresses are absolute
 * (device pointers on CUDA: a source may be another process's pool mapped
 * with kvf_device_ipc_open()). Ranges are split into ops of at most
 * KVF_GATHER_CHUNK bytes by kvf_gather_split(), so one CUDA block moves one
 * op and the kernel's grid is the op count: long and short ranges spread
 * evenly over the GPU. Rejected: cudaMemcpyBatchAsync (CUDA 12.8+; one
 * attribute set per copy and no zeroing: the tails would need a second
 * mechanism) and one cudaMemcpyAsync per range (a launch each: 688 of them
 * for an 8k-token Nemotron-Nano-9B-v2 4p2d pull).
 */
#ifndef KVF_GATHER_H
#define KVF_GATHER_H

#include "kvf_device.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Bytes per op at most: one CUDA block's share (4 passes of 512 threads x 4 x 16 B). */
#define KVF_GATHER_CHUNK (128u * 1024u)

typedef struct kvf_gather_op {
    uint64_t src;   /* source address; 0: zero the destination range */
    uint64_t dst;   /* destination address */
    uint64_t len;   /* bytes, > 0 */
} kvf_gather_op_t;

/** Ops kvf_gather_split() makes of a range of @a len bytes (0 for len 0). */
static inline size_t kvf_gather_ops_for(uint64_t len)
{
    return (size_t)((len + KVF_GATHER_CHUNK - 1) / KVF_GATHER_CHUNK);
}

/**
 * Append the ops of one range [src, src + len) -> [dst, dst + len) (src 0:
 * zero dst) to @a ops, cut at KVF_GATHER_CHUNK bytes.
 * @param [out] ops  Room for kvf_gather_ops_for(len) entries.
 * @return the number of ops written.
 */
size_t kvf_gather_split(uint64_t src, uint64_t dst, uint64_t len, kvf_gather_op_t *ops);

/**
 * Execute @a n ops. CPU: memcpy (or memset 0) of each op in order, done on
 * return. CUDA: the HOST array @a ops is copied to a stream-ordered device
 * buffer (one cudaMemcpyAsync; @a ops may be reused on return) and one
 * kernel moves every op on dev->stream (16-byte loads and stores where
 * source and destination share their alignment mod 16, bytes otherwise);
 * it returns before the copy completes (kvf_device_event_record() or
 * kvf_device_sync() tell when). Ops of one call must not overlap one
 * another's destination (they run in any order); successive calls on one
 * stream run in order.
 * @return KVF_KERN_OK; KVF_KERN_EINVAL (NULL ops with n > 0, an op of len
 *         0 or a NULL destination); KVF_KERN_ENOMEM / KVF_KERN_ECUDA;
 *         KVF_KERN_EUNSUPPORTED (CUDA in a build without CUDA).
 */
int kvf_gather(const kvf_device_t *dev, const kvf_gather_op_t *ops, size_t n);

/**
 * kvf_gather() without an allocation or a staging copy per call, for a
 * caller that gathers again and again (a pull path): @a host_ops in pinned
 * host memory (kvf_device_host_alloc()) and @a dev_ops, device memory of
 * room for @a n ops (kvf_device_alloc()), both the caller's. CUDA: one
 * asynchronous copy host_ops -> dev_ops and one kernel on dev->stream; the
 * caller leaves both buffers untouched until the stream has passed this
 * point (kvf_device_event_record()/_query()). CPU: kvf_gather() of
 * @a host_ops, done on return (@a dev_ops unused, may be NULL).
 * @return as kvf_gather(); KVF_KERN_EINVAL for a NULL dev_ops on CUDA.
 */
int kvf_gather_staged(const kvf_device_t *dev, const kvf_gather_op_t *host_ops,
                      kvf_gather_op_t *dev_ops, size_t n);

#ifdef __cplusplus
}
#endif

#endif
