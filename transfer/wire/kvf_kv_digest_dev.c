/*
 * KV digest over device memory: copy to the host once, hash there.
 *
 * Design: ranges are copied one by one into a bounded host staging buffer
 * and XXH3 streams over it as it fills; XXH3's streaming result does not
 * depend on how the input is cut, so the value equals the host digest of the
 * same bytes. Rejected: hashing on the GPU (the value must equal a CPU
 * peer's, and the sequential XXH3 stream does not split across threads
 * without changing the function); one staging buffer of the whole pull
 * (hundreds of MB for long prompts; 64 MiB bounds it).
 */
#include "kvf_kv_digest_dev.h"
#include "kvf_handshake.h"
#include "kvf_kern_status.h"
#include "kvf_log.h"

#include <stdlib.h>

#define XXH_STATIC_LINKING_ONLY   /* XXH3_state_t on the stack */
#include <xxhash.h>

kvf_status_t kvf_kv_digest_ranges_dev(const kvf_device_t *dev, const uint8_t *base,
                                      const uint64_t *ranges, size_t num_ranges,
                                      uint64_t *digest_p)
{
    size_t total = 0, cap, fill = 0;
    XXH3_state_t st;
    uint8_t *stage;
    int err = KVF_KERN_OK;

    if ((dev == NULL) || (dev->kind == KVF_DEVICE_CPU)) {
        *digest_p = kvf_kv_digest_ranges(base, ranges, num_ranges);
        return KVF_OK;
    }
    for (size_t i = 0; i < num_ranges; ++i) {
        total += (size_t)ranges[2 * i + 1];
    }
    cap = (total < KVF_KV_DIGEST_STAGING_MAX) ? total : KVF_KV_DIGEST_STAGING_MAX;
    /* the pool's own device: a thread that never used CUDA (prefill's side channel) would
     * otherwise make and use device 0's context for a pool on another GPU */
    err = kvf_device_bind(dev);
    if (err != KVF_KERN_OK) {
        kvf_error("KV digest: %s:%d cannot be made current: %s", kvf_device_kind_name(dev->kind),
                  dev->ordinal, kvf_kern_strerror(err));
        return kvf_status_from_kern(err);
    }
    stage = malloc(cap + 1);
    if (stage == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    XXH3_64bits_reset(&st);
    for (size_t i = 0; (i < num_ranges) && (err == KVF_KERN_OK); ++i) {
        size_t off = (size_t)ranges[2 * i], left = (size_t)ranges[2 * i + 1];
        while ((left > 0) && (err == KVF_KERN_OK)) {
            size_t n = (left < cap - fill) ? left : cap - fill;
            err = kvf_device_memcpy(dev, stage + fill, base + off, n, KVF_COPY_D2H);
            if (err != KVF_KERN_OK) {
                kvf_error("KV digest: copying %zu bytes at offset %zu from %s:%d to the host "
                          "failed: %s", n, off, kvf_device_kind_name(dev->kind), dev->ordinal,
                          kvf_kern_strerror(err));
                break;
            }
            fill += n;
            off += n;
            left -= n;
            if (fill == cap) {
                XXH3_64bits_update(&st, stage, fill);
                fill = 0;
            }
        }
    }
    if (err == KVF_KERN_OK) {
        XXH3_64bits_update(&st, stage, fill);
        *digest_p = XXH3_64bits_digest(&st);
    }
    free(stage);
    return kvf_status_from_kern(err);
}
