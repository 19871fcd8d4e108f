/*
 * vLLM's KV event batches as msgpack bytes (docs/PREFIX_CACHE.md §7): what a
 * daemon publishes so a cache-aware router written for vLLM can read it.
 *
 * A batch is the msgpack array [ts, events, data_parallel_rank]: ts a float64
 * (seconds since the epoch), data_parallel_rank an int (always 0 here). Each
 * event is vLLM's BlockStored, BlockRemoved or AllBlocksCleared, encoded in
 * one of two forms:
 *   map    (vLLM since its events dropped msgspec's array_like): a map whose
 *          "type" key holds the event's name, then its fields by name:
 *          BlockStored: block_hashes, parent_block_hash, token_ids,
 *          block_size, lora_id (nil), medium, lora_name (nil);
 *          BlockRemoved: block_hashes, medium;
 *   array  (earlier vLLM, and the consumers written for it): the same fields
 *          by position after the name: ["BlockStored", block_hashes,
 *          parent_block_hash, token_ids, block_size, lora_id, medium,
 *          lora_name], ["BlockRemoved", block_hashes, medium],
 *          ["AllBlocksCleared"].
 * Fields vLLM gives a default (extra_keys, group_idx, kv_cache_spec_*) are
 * left out, as vLLM's encoder leaves out a field at its default.
 * A block hash is a 16-byte bin: the 128-bit key of kvf_block_hash.h, its low
 * 64 bits then its high 64 bits, each little-endian (vLLM's ExternalBlockHash
 * is bytes or int; bytes here, since 128 bits do not fit msgpack's ints).
 * Consecutive stored blocks of one chain (each the parent of the next) go in
 * one BlockStored, as vLLM sends a request's new blocks; consecutive removals
 * in one BlockRemoved.
 *
 * Thread safety: pure functions over the caller's buffers.
 */
#ifndef KVF_KV_EVENTS_ENC_H
#define KVF_KV_EVENTS_ENC_H

#include "kvf_block_hash.h"
#include "kvf_prefix_cache.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    KVF_KV_EVENTS_FORMAT_MAP = 0,    /* vLLM's current form (the default) */
    KVF_KV_EVENTS_FORMAT_ARRAY,      /* positional, as vLLM encoded before */
} kvf_kv_events_format_t;

/** One event as the encoder takes it (an owned copy of a kvf_prefix_event_t). */
typedef struct kvf_kv_event {
    kvf_prefix_event_kind_t kind;
    kvf_block_hash_t        hash;         /* STORED, REMOVED */
    bool                    has_parent;   /* STORED */
    kvf_block_hash_t        parent;
    int32_t                *tokens;       /* STORED: [block_size], owned by the caller */
    int                     block_size;
} kvf_kv_event_t;

/**
 * Encode @a n events as one batch at time @a ts.
 *
 * @param [in]  medium  "GPU" or "CPU": where the blocks live (vLLM's medium).
 * @param [out] buf_p   malloc'd bytes (caller frees), *len_p of them.
 * @return KVF_OK; KVF_ERR_INVALID_PARAM (a STORED event without tokens or a
 *         block size below 1); KVF_ERR_NO_MEMORY.
 */
kvf_status_t kvf_kv_events_encode(const kvf_kv_event_t *ev, size_t n, double ts,
                                  const char *medium, kvf_kv_events_format_t format,
                                  uint8_t **buf_p, size_t *len_p);

/** A block hash as the 16 bytes sent (low64 LE, high64 LE). */
void kvf_kv_events_hash_bytes(kvf_block_hash_t h, uint8_t out[16]);

#endif
