/*
 * kvf-proxy: decode one vLLM KV event batch (msgpack, docs/PREFIX_CACHE.md
 * §7) into the block hashes stored and removed, as a cache-aware router
 * reads vLLM's stream. Both encodings are read: events as maps (a "type"
 * key; vLLM now) and as positional arrays (earlier vLLM). A hash is read as
 * vLLM sends it: bytes (kvferry's 16-byte keys: low64 then high64, each
 * little-endian; other lengths are folded into the key by XXH3-128) or an
 * int (low 64 bits, high 0). Unknown event types are skipped; anything
 * malformed fails the batch and nothing of it is applied.
 *
 * Thread safety: pure function.
 */
#ifndef KVF_PROXY_KVEV_H
#define KVF_PROXY_KVEV_H

#include "kvf_block_hash.h"
#include "kvf_status.h"

#include <stddef.h>
#include <stdint.h>

typedef enum {
    KVF_PROXY_KVEV_STORED = 0,
    KVF_PROXY_KVEV_REMOVED,
    KVF_PROXY_KVEV_CLEARED,
} kvf_proxy_kvev_kind_t;

/** One event of a batch: @a hashes[n] (none for CLEARED), valid during the call. */
typedef void (*kvf_proxy_kvev_fn)(void *ctx, kvf_proxy_kvev_kind_t kind,
                                  const kvf_block_hash_t *hashes, size_t n);

/* A larger payload is refused (a step's batch is KiBs: 100 blocks of 80 tokens ~ 30 KiB);
 * msgpack-c takes up to 32 bytes per element, so this also bounds its allocations. */
#define KVF_PROXY_KVEV_MAX_BYTES ((size_t)8 << 20)

/**
 * Decode the batch in @a buf[@a len] and call @a fn for each of its events,
 * in order, once the whole batch decoded.
 * @return KVF_OK; KVF_ERR_PARSE (not a batch: @a why, capacity @a why_cap,
 *         says what); KVF_ERR_NO_MEMORY.
 */
kvf_status_t kvf_proxy_kvev_decode(const uint8_t *buf, size_t len, kvf_proxy_kvev_fn fn,
                                   void *ctx, char *why, size_t why_cap);

#endif
