/*
 * vLLM KV event batches in msgpack (kvf_kv_events_enc.h), with msgpack-c's packer.
 */
#include "kvf_kv_events_enc.h"

#include <msgpack.h>
#include <stdlib.h>
#include <string.h>

/* msgpack-c's sbuffer, with a failed write remembered (the packer's calls go on). */
typedef struct kvf_kve_buf {
    msgpack_sbuffer sb;
    bool            failed;
} kvf_kve_buf_t;

static int kvf_kve_write(void *data, const char *buf, size_t len)
{
    kvf_kve_buf_t *b = data;

    if (!b->failed && (msgpack_sbuffer_write(&b->sb, buf, len) != 0)) {
        b->failed = true;
    }
    return b->failed ? -1 : 0;
}

void kvf_kv_events_hash_bytes(kvf_block_hash_t h, uint8_t out[16])
{
    for (int i = 0; i < 8; ++i) {
        out[i] = (uint8_t)(h.lo >> (8 * i));
        out[8 + i] = (uint8_t)(h.hi >> (8 * i));
    }
}

static void kvf_kve_str(msgpack_packer *pk, const char *s)
{
    size_t n = strlen(s);

    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

static void kvf_kve_hash(msgpack_packer *pk, kvf_block_hash_t h)
{
    uint8_t b[16];

    kvf_kv_events_hash_bytes(h, b);
    msgpack_pack_bin(pk, sizeof(b));
    msgpack_pack_bin_body(pk, b, sizeof(b));
}

/* Events [i, end) that go in one vLLM event: a chain of stored blocks, a run of removals. */
static size_t kvf_kve_run_end(const kvf_kv_event_t *ev, size_t n, size_t i)
{
    size_t j = i + 1;

    if (ev[i].kind == KVF_PREFIX_EV_CLEARED) {
        return j;
    }
    while ((j < n) && (ev[j].kind == ev[i].kind)) {
        if ((ev[j].kind == KVF_PREFIX_EV_STORED) &&
            (!ev[j].has_parent || (ev[j].parent.lo != ev[j - 1].hash.lo) ||
             (ev[j].parent.hi != ev[j - 1].hash.hi) || (ev[j].block_size != ev[i].block_size))) {
            break;
        }
        ++j;
    }
    return j;
}

/* The key of a field in the map form; nothing in the array form. */
static void kvf_kve_key(msgpack_packer *pk, kvf_kv_events_format_t format, const char *key)
{
    if (format == KVF_KV_EVENTS_FORMAT_MAP) {
        kvf_kve_str(pk, key);
    }
}

static void kvf_kve_stored(msgpack_packer *pk, const kvf_kv_event_t *ev, size_t n,
                           const char *medium, kvf_kv_events_format_t format)
{
    const int bs = ev[0].block_size;

    if (format == KVF_KV_EVENTS_FORMAT_MAP) {
        msgpack_pack_map(pk, 8);
        kvf_kve_str(pk, "type");
    } else {
        msgpack_pack_array(pk, 8);
    }
    kvf_kve_str(pk, "BlockStored");
    kvf_kve_key(pk, format, "block_hashes");
    msgpack_pack_array(pk, (uint32_t)n);
    for (size_t k = 0; k < n; ++k) {
        kvf_kve_hash(pk, ev[k].hash);
    }
    kvf_kve_key(pk, format, "parent_block_hash");
    if (ev[0].has_parent) {
        kvf_kve_hash(pk, ev[0].parent);
    } else {
        msgpack_pack_nil(pk);
    }
    kvf_kve_key(pk, format, "token_ids");
    msgpack_pack_array(pk, (uint32_t)(n * (size_t)bs));
    for (size_t k = 0; k < n; ++k) {
        for (int t = 0; t < bs; ++t) {
            msgpack_pack_int64(pk, ev[k].tokens[t]);
        }
    }
    kvf_kve_key(pk, format, "block_size");
    msgpack_pack_int64(pk, bs);
    kvf_kve_key(pk, format, "lora_id");
    msgpack_pack_nil(pk);
    kvf_kve_key(pk, format, "medium");
    kvf_kve_str(pk, medium);
    kvf_kve_key(pk, format, "lora_name");
    msgpack_pack_nil(pk);
}

static void kvf_kve_removed(msgpack_packer *pk, const kvf_kv_event_t *ev, size_t n,
                            const char *medium, kvf_kv_events_format_t format)
{
    if (format == KVF_KV_EVENTS_FORMAT_MAP) {
        msgpack_pack_map(pk, 3);
        kvf_kve_str(pk, "type");
    } else {
        msgpack_pack_array(pk, 3);
    }
    kvf_kve_str(pk, "BlockRemoved");
    kvf_kve_key(pk, format, "block_hashes");
    msgpack_pack_array(pk, (uint32_t)n);
    for (size_t k = 0; k < n; ++k) {
        kvf_kve_hash(pk, ev[k].hash);
    }
    kvf_kve_key(pk, format, "medium");
    kvf_kve_str(pk, medium);
}

kvf_status_t kvf_kv_events_encode(const kvf_kv_event_t *ev, size_t n, double ts,
                                  const char *medium, kvf_kv_events_format_t format,
                                  uint8_t **buf_p, size_t *len_p)
{
    kvf_kve_buf_t b = {.failed = false};
    msgpack_packer pk;
    size_t runs = 0;

    for (size_t i = 0; i < n; ++i) {
        if ((ev[i].kind == KVF_PREFIX_EV_STORED) &&
            ((ev[i].tokens == NULL) || (ev[i].block_size < 1))) {
            return KVF_ERR_INVALID_PARAM;
        }
    }
    for (size_t i = 0; i < n; i = kvf_kve_run_end(ev, n, i)) {
        ++runs;
    }
    msgpack_sbuffer_init(&b.sb);
    msgpack_packer_init(&pk, &b, kvf_kve_write);
    msgpack_pack_array(&pk, 3);
    msgpack_pack_double(&pk, ts);
    msgpack_pack_array(&pk, (uint32_t)runs);
    for (size_t i = 0, end; i < n; i = end) {
        end = kvf_kve_run_end(ev, n, i);
        if (ev[i].kind == KVF_PREFIX_EV_STORED) {
            kvf_kve_stored(&pk, ev + i, end - i, medium, format);
        } else if (ev[i].kind == KVF_PREFIX_EV_REMOVED) {
            kvf_kve_removed(&pk, ev + i, end - i, medium, format);
        } else if (format == KVF_KV_EVENTS_FORMAT_MAP) {
            msgpack_pack_map(&pk, 1);
            kvf_kve_str(&pk, "type");
            kvf_kve_str(&pk, "AllBlocksCleared");
        } else {
            msgpack_pack_array(&pk, 1);
            kvf_kve_str(&pk, "AllBlocksCleared");
        }
    }
    msgpack_pack_int64(&pk, 0);   /* data_parallel_rank: one engine per daemon */
    if (b.failed || (b.sb.data == NULL)) {
        msgpack_sbuffer_destroy(&b.sb);
        return KVF_ERR_NO_MEMORY;
    }
    *buf_p = (uint8_t *)b.sb.data;   /* the sbuffer's malloc'd bytes become the caller's */
    *len_p = b.sb.size;
    return KVF_OK;
}
