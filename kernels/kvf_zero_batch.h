/*
 * Zeroing many byte ranges of one buffer with one kernel launch: the
 * untransferred parts of the blocks a KV pull wrote (whole pages and partial
 * tails alike, transfer/ucx/kvf_connector_ucx_land.c).
 *
 * Design: the range list travels in the kernel's arguments (up to
 * KVF_ZERO_BATCH_MAX ranges per launch, inside the 4 KiB of arguments every
 * CUDA version takes), so a pull's zeroing is one launch on the pool's stream:
 * no scratch allocation, no host-to-device copy of the list, no launch per
 * range. Each range is split (kvf_zero_batch_split()) into a byte head up to
 * 16-byte alignment, 16-byte words, and a byte tail; the CPU path uses the
 * same split. Rejected: one cudaMemsetAsync per range (what kvf_zero_ranges()
 * did: 16-64 calls per pull at 8k tokens, each a few microseconds of host
 * time), and a page kernel plus per-tail memsets. kvf_zero_ranges() is one
 * launch too now, but uploads its list through the stream's staging area
 * (kvf_device.h): this one needs neither a workspace nor an upload, which
 * suits a transfer pool's own stream.
 */
#ifndef KVF_ZERO_BATCH_H
#define KVF_ZERO_BATCH_H

#include "kvf_device.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Ranges per launch: 240 x 16 bytes of (offset, length) plus a count fit the
 * 4096 bytes of kernel arguments every CUDA version accepts. */
#define KVF_ZERO_BATCH_MAX 240

/**
 * Zero @a n byte ranges [base + offsets[i], base + offsets[i] + lens[i]) of
 * one buffer of @a dev. CUDA: ceil(n / KVF_ZERO_BATCH_MAX) launches of one
 * kernel on dev->stream (one for a pull's 16-64 ranges), asynchronous: the
 * caller syncs the stream (kvf_device_sync()) before reading. CPU: memsets,
 * done on return. Host arrays, not retained (copied into the launch);
 * ranges may have any alignment; zero-length ranges are skipped; ranges
 * must not overlap memory other work on the stream writes meanwhile.
 * @return KVF_KERN_OK; KVF_KERN_EINVAL (NULL base or arrays with n > 0);
 *         KVF_KERN_ECUDA (the launch failed; logged by the check macro);
 *         KVF_KERN_EUNSUPPORTED (a CUDA device in a build without CUDA).
 */
int kvf_zero_ranges_batch(const kvf_device_t *dev, void *base, const size_t *offsets,
                          const size_t *lens, size_t n);

/** CUDA implementation of kvf_zero_ranges_batch() (kvf_zero_batch_cuda.cu); args checked. */
int kvf_cuda_zero_ranges_batch(const kvf_device_t *dev, void *base, const size_t *offsets,
                               const size_t *lens, size_t n);

#ifdef __CUDACC__
#define KVF_ZERO_BATCH_HD __host__ __device__
#else
#define KVF_ZERO_BATCH_HD
#endif

/**
 * The split of a range at @a addr of @a len bytes: @a *head bytes up to the
 * first 16-byte boundary (at most len), then @a *words 16-byte words, then
 * @a *tail bytes (< 16). head + 16 * words + tail == len.
 */
static inline KVF_ZERO_BATCH_HD void kvf_zero_batch_split(uintptr_t addr, size_t len,
                                                          size_t *head, size_t *words,
                                                          size_t *tail)
{
    size_t h = (size_t)((16u - (addr & 15u)) & 15u);

    h = (h > len) ? len : h;
    *head = h;
    *words = (len - h) / 16u;
    *tail = len - h - *words * 16u;
}

#ifdef __cplusplus
}
#endif

#endif
