/*
 * libFuzzer target: what kvf-proxy does with a KV event batch a prefill
 * instance (or anything that can reach its SUB socket) publishes
 * (deploy/proxy/kvf_proxy_kvev.h). Beyond "no crash, leak or UB": a batch is
 * applied whole or not at all (no event is reported for a refused one), an
 * accepted batch reports no more hashes than it has bytes, and a refused one
 * says why.
 *
 * Seeds: tests/fuzz/corpus/fuzz_kv_events, batches the daemons' encoder
 * writes in both forms (tests/deploy/test_proxy_kvidx.c covers the same
 * shapes) plus vLLM's int hashes, written with Python's msgpack.
 */
#include "kvf_proxy_kvev.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(cond)                                                                   \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            fprintf(stderr, "fuzz_kv_events: invariant failed: %s (line %d)\n", #cond,    \
                    __LINE__);                                                             \
            abort();                                                                       \
        }                                                                                  \
    } while (0)

typedef struct {
    size_t events, hashes;
    uint64_t mix;
} seen_t;

static void on_event(void *ctx, kvf_proxy_kvev_kind_t kind, const kvf_block_hash_t *h, size_t n)
{
    seen_t *s = ctx;

    FUZZ_CHECK(kind <= KVF_PROXY_KVEV_CLEARED);
    FUZZ_CHECK((n == 0) || (h != NULL));
    FUZZ_CHECK((kind != KVF_PROXY_KVEV_CLEARED) || (n == 0));
    for (size_t i = 0; i < n; ++i) {
        s->mix ^= h[i].lo + 3 * h[i].hi;   /* every hash read: ASan sees an overrun */
    }
    s->events++;
    s->hashes += n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    seen_t s = {0, 0, 0};
    char why[160] = "";
    kvf_status_t st = kvf_proxy_kvev_decode(data, size, on_event, &s, why, sizeof(why));

    if (st == KVF_OK) {
        FUZZ_CHECK(s.hashes <= size);
    } else {
        FUZZ_CHECK((s.events == 0) && (s.hashes == 0));
        FUZZ_CHECK((st != KVF_ERR_PARSE) || (why[0] != '\0'));
    }
    return 0;
}
