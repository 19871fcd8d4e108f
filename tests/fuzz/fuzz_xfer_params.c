/*
 * libFuzzer target: THE transfer-parameters decoder, kvf_xfer_params_decode()
 * (transfer/wire), on a packed TransferParams as prefill sends it through
 * the proxy. What it accepts must be in range (every id >= 0, group and id
 * counts bounded, port 1..65535, strings terminated), must honour the
 * caller's prompt length (the same bytes with another expected length are
 * refused, with a message naming the field), and must survive a pack/
 * unpack round trip unchanged. What it refuses gets a "transfer params"
 * message and leaves nothing allocated (LeakSanitizer).
 *
 * Seeds: tests/fuzz/corpus/fuzz_xfer_params (tests/fuzz/make_seeds.c).
 */
#include "kvf_handshake.h"
#include "kvf_xfer.pb-c.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(cond)                                                                 \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "fuzz_xfer_params: invariant failed: %s (line %d)\n", #cond, \
                    __LINE__);                                                           \
            abort();                                                                     \
        }                                                                                \
    } while (0)

static void check_accepted(const kvf_xfer_params_msg_t *p)
{
    FUZZ_CHECK(memchr(p->engine_id, '\0', sizeof(p->engine_id)) != NULL);
    FUZZ_CHECK(p->engine_id[0] != '\0');
    FUZZ_CHECK(memchr(p->host, '\0', sizeof(p->host)) != NULL);
    FUZZ_CHECK(p->host[0] != '\0');
    FUZZ_CHECK(memchr(p->request_id, '\0', sizeof(p->request_id)) != NULL);
    FUZZ_CHECK((p->port >= 1) && (p->port <= 65535));
    FUZZ_CHECK((p->num_groups >= 1) && (p->num_groups <= KVF_MAX_KV_GROUPS));
    FUZZ_CHECK((p->num_tokens >= 1) && (p->num_tokens <= (1ll << 40)));
    for (int g = 0; g < p->num_groups; ++g) {
        FUZZ_CHECK((p->num_ids[g] >= 0) && (p->num_ids[g] <= KVF_XFER_MAX_IDS_PER_GROUP));
        FUZZ_CHECK(p->ids[g] != NULL);
        for (int i = 0; i < p->num_ids[g]; ++i) {
            FUZZ_CHECK(p->ids[g][i] >= 0);
        }
    }
}

static void check_roundtrip(const kvf_xfer_params_msg_t *p)
{
    kvf_xfer_params_msg_t q;
    uint8_t *buf;
    size_t len;

    FUZZ_CHECK(kvf_xfer_params_msg_pack(p, &buf, &len) == KVF_OK);
    FUZZ_CHECK(kvf_xfer_params_msg_unpack(buf, len, &q) == KVF_OK);
    free(buf);
    FUZZ_CHECK(strcmp(p->engine_id, q.engine_id) == 0);
    FUZZ_CHECK(strcmp(p->host, q.host) == 0);
    FUZZ_CHECK(strcmp(p->request_id, q.request_id) == 0);
    FUZZ_CHECK((p->port == q.port) && (p->num_tokens == q.num_tokens));
    FUZZ_CHECK(p->first_token == q.first_token);
    FUZZ_CHECK((p->has_lease == q.has_lease) && (p->lease_ms_left == q.lease_ms_left) &&
               (p->nonce == q.nonce));
    FUZZ_CHECK((p->has_incarnation == q.has_incarnation) && (p->incarnation == q.incarnation));
    FUZZ_CHECK((p->has_lease_expiry == q.has_lease_expiry) &&
               (p->lease_expiry_ms == q.lease_expiry_ms));
    FUZZ_CHECK(p->num_groups == q.num_groups);
    for (int g = 0; g < p->num_groups; ++g) {
        FUZZ_CHECK(p->num_ids[g] == q.num_ids[g]);
        FUZZ_CHECK(memcmp(p->ids[g], q.ids[g], (size_t)p->num_ids[g] * sizeof(int32_t)) == 0);
    }
    kvf_xfer_params_msg_cleanup(&q);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    Kvf__TransferParams *m = kvf__transfer_params__unpack(NULL, size, data);
    kvf_xfer_params_msg_t p, p2;
    char why[256];

    if (m == NULL) {
        FUZZ_CHECK(kvf_xfer_params_msg_unpack(data, size, &p) == KVF_ERR_PARSE);
        return 0;
    }
    why[0] = '\0';
    if (kvf_xfer_params_decode(m, 0, &p, why, sizeof(why)) != KVF_OK) {
        /* refused: says why, naming the transfer params, and the packed path agrees */
        FUZZ_CHECK(strstr(why, "transfer params") != NULL);
        FUZZ_CHECK(kvf_xfer_params_msg_unpack(data, size, &p2) == KVF_ERR_PARSE);
        kvf__transfer_params__free_unpacked(m, NULL);
        return 0;
    }
    check_accepted(&p);
    /* the decode daemon's path: the prompt it holds must match the params */
    FUZZ_CHECK(kvf_xfer_params_decode(m, p.num_tokens, &p2, why, sizeof(why)) == KVF_OK);
    kvf_xfer_params_msg_cleanup(&p2);
    why[0] = '\0';
    FUZZ_CHECK(kvf_xfer_params_decode(m, p.num_tokens + 1, &p2, why, sizeof(why)) ==
               KVF_ERR_PARSE);
    FUZZ_CHECK(strstr(why, "tokens") != NULL);
    FUZZ_CHECK(kvf_xfer_params_decode(m, 0, &p2, NULL, 0) == KVF_OK);
    kvf_xfer_params_msg_cleanup(&p2);
    check_roundtrip(&p);
    kvf_xfer_params_msg_cleanup(&p);
    kvf__transfer_params__free_unpacked(m, NULL);
    return 0;
}
