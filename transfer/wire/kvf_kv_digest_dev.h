/*
 * The KV digest (kvf_kv_digest_ranges(), transfer/wire/kvf_handshake.h) of
 * byte ranges that may live in GPU memory: what decode computes over the
 * bytes it received and prefill over the bytes it sent, whichever device
 * each pool is on, so a CPU prefill and a GPU decode (or the reverse) agree.
 */
#ifndef KVF_KV_DIGEST_DEV_H
#define KVF_KV_DIGEST_DEV_H

#include "kvf_device.h"
#include "kvf_status.h"

#include <stddef.h>
#include <stdint.h>

/** Bytes of host staging a device digest uses at most (the ranges pass through it in turn). */
#define KVF_KV_DIGEST_STAGING_MAX ((size_t)64 << 20)

/**
 * XXH3-64 of @a num_ranges byte ranges of @a base ([2i] offset, [2i+1]
 * length, bytes), in order: the value kvf_kv_digest_ranges() gives for the
 * same bytes in host memory.
 *
 * The CPU (@a dev NULL or a CPU device): kvf_kv_digest_ranges() itself.
 * CUDA: each range is copied to host memory once (kvf_device_memcpy(),
 * device to host, synchronous on dev->stream) through a staging buffer of at
 * most KVF_KV_DIGEST_STAGING_MAX bytes, which is hashed as it fills. Why not
 * on the device: the digest must be bit-identical to a CPU peer's, and
 * XXH3's stream is sequential; a device digest would need a second, tree-
 * shaped digest on the wire for GPU peers. The copy costs one pass over the
 * pulled bytes at device-to-host bandwidth, once per pull, and only with
 * --kv-digest on (measured nowhere yet on a GPU).
 *
 * Any thread; CUDA: makes @a dev current on the calling thread (and leaves
 * it so), so the copy runs in the pool's own device context. Ranges are not
 * bounds-checked here (the callers check them against the pool first).
 *
 * @param [out] digest_p  Set only on success.
 * @return KVF_OK; KVF_ERR_NO_MEMORY (staging); KVF_ERR_CUDA or
 *         KVF_ERR_UNSUPPORTED when a copy fails (logged with the range).
 */
kvf_status_t kvf_kv_digest_ranges_dev(const kvf_device_t *dev, const uint8_t *base,
                                      const uint64_t *ranges, size_t num_ranges,
                                      uint64_t *digest_p);

#endif
