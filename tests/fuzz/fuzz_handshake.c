/*
 * libFuzzer target: the side-channel handshake decoders, i.e. every
 * HandshakeRequest a decode (or anyone reaching the port) sends prefill,
 * every HandshakeReply / lease answer prefill sends decode, and the
 * TransferNotification of the UCX path. They must return KVF_OK or
 * KVF_ERR_PARSE, never crash, leak or read out of bounds; and what they
 * accept must be in range and survive a pack/unpack round trip unchanged
 * (a decoder that accepts what its own encoder would write differently is
 * a bug too). abort() marks a violated invariant. Decode never parses a
 * packed remote key (UCX's private format, docs/SECURITY.md "Remote keys"):
 * the bounds checked here (key 1..KVF_RKEY_MAX bytes, regions that do not
 * wrap, known memory types) are what stands between a reply and UCX.
 *
 * Seeds: tests/fuzz/corpus/fuzz_handshake (tests/fuzz/make_seeds.c).
 */
#include "kvf_handshake.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(cond)                                                                 \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "fuzz_handshake: invariant failed: %s (line %d)\n", #cond,  \
                    __LINE__);                                                           \
            abort();                                                                     \
        }                                                                                \
    } while (0)

static bool str_ok(const char *s, size_t cap)
{
    return memchr(s, '\0', cap) != NULL;
}

static void check_request(const uint8_t *data, size_t size)
{
    kvf_handshake_request_t req, again;
    uint8_t *buf;
    size_t len;

    if (kvf_handshake_request_unpack(data, size, &req) != KVF_OK) {
        return;
    }
    FUZZ_CHECK(str_ok(req.engine_id, sizeof(req.engine_id)));
    FUZZ_CHECK(str_ok(req.want_engine_id, sizeof(req.want_engine_id)));
    if (req.has_lease) {
        FUZZ_CHECK((req.lease.op == KVF_LEASE_OP_CLAIM) || (req.lease.op == KVF_LEASE_OP_RELEASE));
        FUZZ_CHECK(str_ok(req.lease.request_id, sizeof(req.lease.request_id)));
        FUZZ_CHECK(req.lease.request_id[0] != '\0');
        if (req.lease.op == KVF_LEASE_OP_RELEASE) {
            FUZZ_CHECK((req.lease.decode_tp >= 1) && (req.lease.decode_tp <= KVF_XFER_MAX_TP));
            FUZZ_CHECK((req.lease.decode_rank >= 0) && (req.lease.decode_rank < req.lease.decode_tp));
        }
    }
    FUZZ_CHECK(kvf_handshake_request_pack(&req, &buf, &len) == KVF_OK);
    FUZZ_CHECK(kvf_handshake_request_unpack(buf, len, &again) == KVF_OK);
    free(buf);
    FUZZ_CHECK(strcmp(req.engine_id, again.engine_id) == 0);
    FUZZ_CHECK(strcmp(req.want_engine_id, again.want_engine_id) == 0);
    FUZZ_CHECK(req.protocol_version == again.protocol_version);
    FUZZ_CHECK(req.xfer_timeout_ms == again.xfer_timeout_ms);
    FUZZ_CHECK(req.has_lease == again.has_lease);
    if (req.has_lease) {
        FUZZ_CHECK(req.lease.op == again.lease.op);
        FUZZ_CHECK(strcmp(req.lease.request_id, again.lease.request_id) == 0);
        FUZZ_CHECK(req.lease.nonce == again.lease.nonce);
        if (req.lease.op == KVF_LEASE_OP_RELEASE) {
            FUZZ_CHECK(req.lease.decode_rank == again.lease.decode_rank);
            FUZZ_CHECK(req.lease.decode_tp == again.lease.decode_tp);
        }
        FUZZ_CHECK(req.lease.status == again.lease.status);
    }
}

static void check_rank_equal(const kvf_rank_meta_t *a, const kvf_rank_meta_t *b)
{
    FUZZ_CHECK(strcmp(a->engine_id, b->engine_id) == 0);
    FUZZ_CHECK(strcmp(a->layout_tag, b->layout_tag) == 0);
    FUZZ_CHECK(a->kv_layout == b->kv_layout);
    FUZZ_CHECK(a->protocol_version == b->protocol_version);
    FUZZ_CHECK(a->model_fingerprint == b->model_fingerprint);
    FUZZ_CHECK((a->tp_rank == b->tp_rank) && (a->tp_size == b->tp_size));
    FUZZ_CHECK((a->block_size == b->block_size) && (a->kernel_block_size == b->kernel_block_size));
    FUZZ_CHECK((a->page_size == b->page_size) && (a->slots == b->slots));
    FUZZ_CHECK(a->num_blocks == b->num_blocks);
    FUZZ_CHECK((a->kv_dtype == b->kv_dtype) && (a->conv_dtype == b->conv_dtype) &&
               (a->ssm_dtype == b->ssm_dtype));
    FUZZ_CHECK((a->user_block_size == b->user_block_size) && (a->align == b->align));
    FUZZ_CHECK(a->num_regions == b->num_regions);
    for (int j = 0; j < a->num_regions; ++j) {
        FUZZ_CHECK(a->regions[j].addr == b->regions[j].addr);
        FUZZ_CHECK(a->regions[j].length == b->regions[j].length);
        FUZZ_CHECK(a->regions[j].rkey_len == b->regions[j].rkey_len);
        FUZZ_CHECK(memcmp(a->regions[j].rkey, b->regions[j].rkey, a->regions[j].rkey_len) == 0);
        FUZZ_CHECK(a->regions[j].mem_type == b->regions[j].mem_type);
    }
    FUZZ_CHECK(a->worker_addr_len == b->worker_addr_len);
    FUZZ_CHECK(memcmp(a->worker_addr, b->worker_addr, a->worker_addr_len) == 0);
    FUZZ_CHECK(a->incarnation == b->incarnation);
}

static void check_reply(const uint8_t *data, size_t size)
{
    kvf_handshake_reply_t reply, again;
    uint8_t *buf;
    size_t len;

    if (kvf_handshake_reply_unpack(data, size, &reply) != KVF_OK) {
        return;
    }
    FUZZ_CHECK((reply.num_ranks >= 0) && (reply.num_ranks <= KVF_XFER_MAX_TP));
    FUZZ_CHECK(!reply.accepted || (reply.num_ranks > 0));
    FUZZ_CHECK((reply.num_refusals >= 0) && (reply.num_refusals <= KVF_MAX_REFUSALS));
    FUZZ_CHECK(str_ok(reply.engine_id, sizeof(reply.engine_id)));
    FUZZ_CHECK(str_ok(reply.error, sizeof(reply.error)));
    for (int r = 0; r < reply.num_ranks; ++r) {
        const kvf_rank_meta_t *m = &reply.ranks[r];
        FUZZ_CHECK((m->tp_rank == r) && (m->tp_size == reply.num_ranks));
        FUZZ_CHECK((m->worker_addr_len >= 1) && (m->worker_addr_len <= KVF_WORKER_ADDR_MAX));
        FUZZ_CHECK((m->num_regions >= 0) && (m->num_regions <= KVF_XFER_MAX_REGIONS));
        FUZZ_CHECK((m->block_size >= 1) && (m->kernel_block_size >= 1) &&
                   (m->kernel_block_size <= m->block_size));
        FUZZ_CHECK((m->slots >= 1) && (m->slots <= KVF_MAX_SLOTS));
        FUZZ_CHECK((m->kv_dtype < KVF_DTYPE_COUNT) && (m->conv_dtype < KVF_DTYPE_COUNT) &&
                   (m->ssm_dtype < KVF_DTYPE_COUNT));
        FUZZ_CHECK(str_ok(m->engine_id, sizeof(m->engine_id)));
        FUZZ_CHECK(str_ok(m->layout_tag, sizeof(m->layout_tag)));
        FUZZ_CHECK(((int)m->kv_layout >= 0) && ((int)m->kv_layout < KVF_KV_LAYOUT_COUNT));
        for (int j = 0; j < m->num_regions; ++j) {
            FUZZ_CHECK((m->regions[j].rkey_len >= 1) && (m->regions[j].rkey_len <= KVF_RKEY_MAX));
            FUZZ_CHECK(m->regions[j].addr + m->regions[j].length > m->regions[j].addr);
            FUZZ_CHECK((m->regions[j].mem_type == KVF_XFER_MEM_HOST) ||
                       (m->regions[j].mem_type == KVF_XFER_MEM_CUDA));
        }
    }
    for (int i = 0; i < reply.num_refusals; ++i) {
        char line[1024];
        kvf_refusal_format(&reply.refusals[i], true, line, sizeof(line));
        FUZZ_CHECK(strncmp(line, "handshake refused: ", 19) == 0);
    }
    FUZZ_CHECK(kvf_handshake_reply_pack(&reply, &buf, &len) == KVF_OK);
    FUZZ_CHECK(kvf_handshake_reply_unpack(buf, len, &again) == KVF_OK);
    free(buf);
    FUZZ_CHECK((again.accepted == reply.accepted) && (again.num_ranks == reply.num_ranks));
    FUZZ_CHECK(strcmp(again.engine_id, reply.engine_id) == 0);
    FUZZ_CHECK(strcmp(again.error, reply.error) == 0);
    FUZZ_CHECK(again.num_refusals == reply.num_refusals);
    for (int i = 0; i < reply.num_refusals; ++i) {
        FUZZ_CHECK(strcmp(again.refusals[i].field, reply.refusals[i].field) == 0);
        FUZZ_CHECK(strcmp(again.refusals[i].why, reply.refusals[i].why) == 0);
    }
    for (int r = 0; r < reply.num_ranks; ++r) {
        check_rank_equal(&reply.ranks[r], &again.ranks[r]);
    }
    kvf_handshake_reply_cleanup(&again);
    kvf_handshake_reply_cleanup(&reply);
}

static void check_lease_reply(const uint8_t *data, size_t size)
{
    char engine[KVF_ENGINE_ID_MAX], engine2[KVF_ENGINE_ID_MAX];
    kvf_lease_answer_t a, again;
    uint8_t *buf;
    size_t len;

    if (kvf_lease_reply_unpack(data, size, engine, &a) != KVF_OK) {
        return;
    }
    FUZZ_CHECK(a.verdict <= KVF_LEASE_CORRUPT);   /* the last verdict; unpack refuses others */
    FUZZ_CHECK(str_ok(engine, sizeof(engine)) && str_ok(a.why, sizeof(a.why)));
    FUZZ_CHECK(kvf_lease_reply_pack(engine, &a, &buf, &len) == KVF_OK);
    FUZZ_CHECK(kvf_lease_reply_unpack(buf, len, engine2, &again) == KVF_OK);
    free(buf);
    FUZZ_CHECK(strcmp(engine, engine2) == 0);
    FUZZ_CHECK((a.verdict == again.verdict) && (a.ms_left == again.ms_left));
    FUZZ_CHECK(strcmp(a.why, again.why) == 0);
}

static void check_notification(const uint8_t *data, size_t size)
{
    kvf_xfer_notification_t n, again;
    uint8_t *buf;
    size_t len;

    if (kvf_xfer_notification_unpack(data, size, &n) != KVF_OK) {
        return;
    }
    FUZZ_CHECK((n.rank >= 0) && (n.rank < KVF_XFER_MAX_TP));
    FUZZ_CHECK(str_ok(n.request_id, sizeof(n.request_id)) &&
               str_ok(n.engine_id, sizeof(n.engine_id)));
    FUZZ_CHECK(kvf_xfer_notification_pack(&n, &buf, &len) == KVF_OK);
    FUZZ_CHECK(kvf_xfer_notification_unpack(buf, len, &again) == KVF_OK);
    free(buf);
    FUZZ_CHECK((n.rank == again.rank) && (n.status == again.status));
    FUZZ_CHECK(strcmp(n.request_id, again.request_id) == 0);
    FUZZ_CHECK(strcmp(n.engine_id, again.engine_id) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    check_request(data, size);
    check_reply(data, size);
    check_lease_reply(data, size);
    check_notification(data, size);
    return 0;
}
