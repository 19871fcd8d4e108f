/*
 * vLLM KV event batch decoder (kvf_proxy_kvev.h), with msgpack-c's unpacker.
 * Two passes over the unpacked tree: the first checks every event and counts
 * the hashes, the second calls back; so a malformed batch applies nothing.
 *
 * msgpack-c allocates a container's elements as soon as it reads the count
 * (32 bytes each): 6 bytes declaring 2^32 elements asked it for 128 GiB
 * (found by fuzz_kv_events). So the bytes are walked first: every declared
 * element must still have a byte of its own, every length its bytes, before
 * msgpack-c sees them; its allocations are then bounded by the payload.
 */
#include "kvf_proxy_kvev.h"

#include <msgpack.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

/* Big-endian unsigned of @a n bytes at @a p. */
static uint64_t kvf_kvev_be(const uint8_t *p, int n)
{
    uint64_t v = 0;

    for (int i = 0; i < n; ++i) {
        v = (v << 8) | p[i];
    }
    return v;
}

/*
 * Whether @a buf[@a len] is exactly one msgpack object whose every declared length fits
 * the bytes left: a count of elements never exceeds the bytes after it (each element
 * takes at least one), a string, bin or ext its length.
 */
static bool kvf_kvev_prescan(const uint8_t *buf, size_t len)
{
    static const int fixed[32] = {  /* 0xc0..0xdf: bytes after the type byte; -1 special */
        0, -2, 0, 0, -1, -1, -1, -1, -1, -1, 4, 8, 1, 2, 4, 8,
        1, 2, 4, 8, 2, 3, 5, 9, 17, -1, -1, -1, -1, -1, -1, -1};
    size_t pos = 0;
    uint64_t pending = 1;   /* objects still to read */

    while (pending > 0) {
        uint64_t count = 0, skip = 0;
        uint8_t b;
        int lb = 0;

        if (pos >= len) {
            return false;
        }
        b = buf[pos++];
        pending--;
        if ((b <= 0x7f) || (b >= 0xe0)) {
            continue;                                   /* fixints */
        } else if (b <= 0x8f) {
            count = 2u * (b & 0x0fu);                   /* fixmap */
        } else if (b <= 0x9f) {
            count = b & 0x0fu;                          /* fixarray */
        } else if (b <= 0xbf) {
            skip = b & 0x1fu;                           /* fixstr */
        } else if (fixed[b - 0xc0] >= 0) {
            skip = (uint64_t)fixed[b - 0xc0];           /* nil, bool, numbers, fixext */
        } else if (fixed[b - 0xc0] == -2) {
            return false;                               /* 0xc1: never used */
        } else {
            /* bin8/16/32 c4-c6, ext8/16/32 c7-c9, str8/16/32 d9-db, array16/32 dc-dd,
             * map16/32 de-df: a length of 1, 2 or 4 bytes */
            static const uint8_t lens[] = {0xc4, 1, 0xc5, 2, 0xc6, 4, 0xc7, 1, 0xc8, 2,
                                           0xc9, 4, 0xd9, 1, 0xda, 2, 0xdb, 4, 0xdc, 2,
                                           0xdd, 4, 0xde, 2, 0xdf, 4};
            uint64_t n;
            for (size_t i = 0; i < sizeof(lens); i += 2) {
                lb = (lens[i] == b) ? lens[i + 1] : lb;
            }
            if ((lb == 0) || (len - pos < (size_t)lb)) {
                return false;
            }
            n = kvf_kvev_be(buf + pos, lb);
            pos += (size_t)lb;
            if (b >= 0xdc) {
                count = (b >= 0xde) ? 2 * n : n;
            } else {
                skip = n + ((b >= 0xc7) && (b <= 0xc9) ? 1 : 0);   /* ext: its type byte */
            }
        }
        if (skip > len - pos) {
            return false;
        }
        pos += (size_t)skip;
        if ((count > len - pos) || (pending + count > len - pos)) {
            return false;   /* more elements declared than bytes left for them */
        }
        pending += count;
    }
    return pos == len;
}

static bool kvf_kvev_is(const msgpack_object *o, const char *s)
{
    size_t n = strlen(s);

    return (o->type == MSGPACK_OBJECT_STR) && (o->via.str.size == n) &&
           (memcmp(o->via.str.ptr, s, n) == 0);
}

static bool kvf_kvev_hash(const msgpack_object *o, kvf_block_hash_t *h)
{
    if ((o->type == MSGPACK_OBJECT_BIN) && (o->via.bin.size == 16)) {
        const uint8_t *b = (const uint8_t *)o->via.bin.ptr;
        h->lo = h->hi = 0;
        for (int i = 7; i >= 0; --i) {
            h->lo = (h->lo << 8) | b[i];
            h->hi = (h->hi << 8) | b[8 + i];
        }
        return true;
    }
    if (o->type == MSGPACK_OBJECT_BIN) {   /* another engine's hash: a key of its own */
        XXH128_hash_t x = XXH3_128bits(o->via.bin.ptr, o->via.bin.size);
        h->lo = x.low64;
        h->hi = x.high64;
        return true;
    }
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        h->lo = o->via.u64;
        h->hi = 0;
        return true;
    }
    if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        h->lo = (uint64_t)o->via.i64;
        h->hi = 0;
        return true;
    }
    return false;
}

/* An event's tag and block_hashes, from either form; false when malformed. */
static bool kvf_kvev_fields(const msgpack_object *ev, const msgpack_object **tag,
                            const msgpack_object **hashes)
{
    *tag = *hashes = NULL;
    if ((ev->type == MSGPACK_OBJECT_ARRAY) && (ev->via.array.size >= 1)) {
        *tag = &ev->via.array.ptr[0];
        if (ev->via.array.size >= 2) {
            *hashes = &ev->via.array.ptr[1];
        }
    } else if (ev->type == MSGPACK_OBJECT_MAP) {
        for (uint32_t i = 0; i < ev->via.map.size; ++i) {
            const msgpack_object_kv *kv = &ev->via.map.ptr[i];
            if (kvf_kvev_is(&kv->key, "type")) {
                *tag = &kv->val;
            } else if (kvf_kvev_is(&kv->key, "block_hashes")) {
                *hashes = &kv->val;
            }
        }
    }
    return (*tag != NULL) && ((*tag)->type == MSGPACK_OBJECT_STR);
}

static kvf_status_t kvf_kvev_bad(char *why, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static kvf_status_t kvf_kvev_bad(char *why, size_t cap, const char *fmt, ...)
{
    va_list ap;

    if ((why != NULL) && (cap > 0)) {
        va_start(ap, fmt);
        vsnprintf(why, cap, fmt, ap);
        va_end(ap);
    }
    return KVF_ERR_PARSE;
}

/* Pass one: every event well formed; *total_p the hashes of all. */
static kvf_status_t kvf_kvev_check(const msgpack_object *events, size_t *total_p, char *why,
                                   size_t cap)
{
    *total_p = 0;
    for (uint32_t e = 0; e < events->via.array.size; ++e) {
        const msgpack_object *tag, *hs;
        kvf_block_hash_t h;

        if (!kvf_kvev_fields(&events->via.array.ptr[e], &tag, &hs)) {
            return kvf_kvev_bad(why, cap, "event %u has no type name", e);
        }
        if (!kvf_kvev_is(tag, "BlockStored") && !kvf_kvev_is(tag, "BlockRemoved")) {
            continue;
        }
        if ((hs == NULL) || (hs->type != MSGPACK_OBJECT_ARRAY)) {
            return kvf_kvev_bad(why, cap, "event %u (%.*s) has no block_hashes array", e,
                                (int)tag->via.str.size, tag->via.str.ptr);
        }
        for (uint32_t k = 0; k < hs->via.array.size; ++k) {
            if (!kvf_kvev_hash(&hs->via.array.ptr[k], &h)) {
                return kvf_kvev_bad(why, cap, "event %u: block hash %u is neither bytes nor "
                                    "an int", e, k);
            }
        }
        *total_p += hs->via.array.size;
    }
    return KVF_OK;
}

kvf_status_t kvf_proxy_kvev_decode(const uint8_t *buf, size_t len, kvf_proxy_kvev_fn fn,
                                   void *ctx, char *why, size_t why_cap)
{
    msgpack_unpacked up;
    const msgpack_object *root, *events;
    kvf_block_hash_t *hs = NULL;
    size_t off = 0, total;
    kvf_status_t s;

    if (len > KVF_PROXY_KVEV_MAX_BYTES) {
        return kvf_kvev_bad(why, why_cap, "batch of %zu bytes is over the %zu bytes taken",
                            len, KVF_PROXY_KVEV_MAX_BYTES);
    }
    if (!kvf_kvev_prescan(buf, len)) {
        return kvf_kvev_bad(why, why_cap, "not one well-formed msgpack object");
    }
    msgpack_unpacked_init(&up);
    if (msgpack_unpack_next(&up, (const char *)buf, len, &off) != MSGPACK_UNPACK_SUCCESS) {
        msgpack_unpacked_destroy(&up);
        return kvf_kvev_bad(why, why_cap, "not one msgpack object");
    }
    root = &up.data;
    /* [ts, events, dp_rank] (array_like) or {"ts", "events", ...} (a map) */
    events = NULL;
    if ((root->type == MSGPACK_OBJECT_ARRAY) && (root->via.array.size >= 2)) {
        events = &root->via.array.ptr[1];
    } else if (root->type == MSGPACK_OBJECT_MAP) {
        for (uint32_t i = 0; i < root->via.map.size; ++i) {
            if (kvf_kvev_is(&root->via.map.ptr[i].key, "events")) {
                events = &root->via.map.ptr[i].val;
            }
        }
    }
    if ((events == NULL) || (events->type != MSGPACK_OBJECT_ARRAY)) {
        msgpack_unpacked_destroy(&up);
        return kvf_kvev_bad(why, why_cap, "not an event batch [ts, events, ...]");
    }
    s = kvf_kvev_check(events, &total, why, why_cap);
    if ((s == KVF_OK) && (total > 0)) {
        hs = malloc(total * sizeof(*hs));
        s = (hs == NULL) ? KVF_ERR_NO_MEMORY : KVF_OK;
    }
    for (uint32_t e = 0; (s == KVF_OK) && (e < events->via.array.size); ++e) {
        const msgpack_object *tag, *ho;

        (void)kvf_kvev_fields(&events->via.array.ptr[e], &tag, &ho);
        if (kvf_kvev_is(tag, "AllBlocksCleared")) {
            fn(ctx, KVF_PROXY_KVEV_CLEARED, NULL, 0);
            continue;
        }
        if (!kvf_kvev_is(tag, "BlockStored") && !kvf_kvev_is(tag, "BlockRemoved")) {
            continue;   /* an event this proxy does not use */
        }
        for (uint32_t k = 0; k < ho->via.array.size; ++k) {
            (void)kvf_kvev_hash(&ho->via.array.ptr[k], &hs[k]);
        }
        fn(ctx, kvf_kvev_is(tag, "BlockStored") ? KVF_PROXY_KVEV_STORED : KVF_PROXY_KVEV_REMOVED,
           hs, ho->via.array.size);
    }
    free(hs);
    msgpack_unpacked_destroy(&up);
    return s;
}
