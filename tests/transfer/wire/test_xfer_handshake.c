/*
 * Handshake messages and the compatibility check: pack/unpack round trips,
 * rejection of out-of-range fields, a deterministic garbage loop (random
 * bytes, every truncation and single-bit flips of valid messages: never a
 * crash, only KVF_OK or KVF_ERR_PARSE; run it under ASan), and the refusal
 * messages of kvf_compat_check() with values derived by hand.
 */
#include "kvf_compat.h"
#include "kvf_handshake.h"
#include "kvf_xfer.pb-c.h"

#include "kvf_log.h"

#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

static kvf_model_config_t tiny;

static void load_tiny(void)
{
    assert_int_equal(kvf_model_config_load(KVF_SOURCE_DIR "/tests/data/models/tiny-hybrid.config.json",
                                           &tiny), KVF_OK);
}

/*
 * Metadata a rank of tiny-hybrid at TP tp would publish, computed by hand:
 * KV heads 2 -> per rank max(1, 2/tp); A1 = 2 * heads * 32 * 2 (bf16);
 * block 80 (TP-stable); page = 80 * A1; slots 2 (2 attention, 4 Mamba layers).
 */
static void meta_fill(kvf_rank_meta_t *m, int tp, int rank, int64_t num_blocks)
{
    int heads = (tp >= 2) ? 1 : 2;
    uint64_t page = 80ull * 2 * (uint64_t)heads * 32 * 2;

    memset(m, 0, sizeof(*m));
    snprintf(m->engine_id, sizeof(m->engine_id), "prefill-a");
    m->protocol_version = KVF_XFER_PROTOCOL_VERSION;
    m->model_fingerprint = kvf_model_config_fingerprint(&tiny);
    m->tp_rank = rank;
    m->tp_size = tp;
    m->block_size = 80;
    m->kernel_block_size = 80;
    m->page_size = page;
    m->slots = 2;
    m->num_blocks = num_blocks;
    m->kv_dtype = KVF_DTYPE_BF16;
    m->conv_dtype = tiny.torch_dtype;
    m->ssm_dtype = KVF_DTYPE_FP32;
    m->user_block_size = 16;
    m->align = KVF_ALIGN_TP_STABLE;
    snprintf(m->layout_tag, sizeof(m->layout_tag), "HND");
    m->num_regions = 1;
    m->regions[0].addr = 0x7f0000000000ull + (uint64_t)rank * 0x10000000ull;
    m->regions[0].length = (uint64_t)num_blocks * 2 * page;
    m->regions[0].rkey_len = 17;
    memset(m->regions[0].rkey, 0xa0 + rank, 17);
    m->worker_addr_len = 33;
    memset(m->worker_addr, 0x30 + rank, 33);
    m->incarnation = 0x8badf00d12345678ull + (uint64_t)(rank & 1);   /* 0 for none */
}

static void pack_reply(int tp, uint8_t **buf_p, size_t *len_p)
{
    kvf_handshake_reply_t reply;
    kvf_rank_meta_t *ranks = calloc((size_t)tp, sizeof(*ranks));

    assert_non_null(ranks);
    for (int r = 0; r < tp; ++r) {
        meta_fill(&ranks[r], tp, r, 8);
    }
    memset(&reply, 0, sizeof(reply));
    reply.accepted = true;
    snprintf(reply.engine_id, sizeof(reply.engine_id), "prefill-a");
    reply.num_ranks = tp;
    reply.ranks = ranks;
    assert_int_equal(kvf_handshake_reply_pack(&reply, buf_p, len_p), KVF_OK);
    free(ranks);
}

static void test_reply_roundtrip(void **state)
{
    kvf_handshake_reply_t out;
    kvf_rank_meta_t expect;
    uint8_t *buf;
    size_t len;

    (void)state;
    pack_reply(4, &buf, &len);
    assert_int_equal(kvf_handshake_reply_unpack(buf, len, &out), KVF_OK);
    assert_true(out.accepted);
    assert_string_equal(out.engine_id, "prefill-a");
    assert_int_equal(out.num_ranks, 4);
    for (int r = 0; r < 4; ++r) {
        meta_fill(&expect, 4, r, 8);
        assert_int_equal(out.ranks[r].tp_rank, r);
        assert_int_equal(out.ranks[r].page_size, 10240);   /* 80 * 2 * 1 * 32 * 2 */
        assert_int_equal(out.ranks[r].regions[0].length, 8 * 2 * 10240);
        assert_memory_equal(out.ranks[r].regions[0].rkey, expect.regions[0].rkey, 17);
        assert_memory_equal(out.ranks[r].worker_addr, expect.worker_addr, 33);
        assert_int_equal(out.ranks[r].model_fingerprint, expect.model_fingerprint);
        assert_true(out.ranks[r].incarnation == 0x8badf00d12345678ull + (uint64_t)(r & 1));
        assert_string_equal(out.ranks[r].layout_tag, "HND");
    }
    kvf_handshake_reply_cleanup(&out);
    free(buf);
}

static void test_other_roundtrips(void **state)
{
    kvf_handshake_request_t req = {0}, req2;
    kvf_xfer_notification_t n = {0}, n2;
    kvf_xfer_params_msg_t p, p2;
    int32_t ids0[3] = {5, 1, 7}, ids1[1] = {2};
    uint8_t *buf;
    size_t len;

    (void)state;
    snprintf(req.engine_id, sizeof(req.engine_id), "decode-b");
    req.protocol_version = 9;
    assert_int_equal(kvf_handshake_request_pack(&req, &buf, &len), KVF_OK);
    assert_int_equal(kvf_handshake_request_unpack(buf, len, &req2), KVF_OK);
    assert_string_equal(req2.engine_id, "decode-b");
    assert_int_equal(req2.protocol_version, 9);
    assert_string_equal(req2.want_engine_id, "");
    free(buf);

    snprintf(n.request_id, sizeof(n.request_id), "req-7");
    n.rank = 3;
    n.status = KVF_ERR_PEER_RESET;
    assert_int_equal(kvf_xfer_notification_pack(&n, &buf, &len), KVF_OK);
    assert_int_equal(kvf_xfer_notification_unpack(buf, len, &n2), KVF_OK);
    assert_string_equal(n2.request_id, "req-7");
    assert_int_equal(n2.rank, 3);
    assert_int_equal(n2.status, KVF_ERR_PEER_RESET);
    free(buf);

    memset(&p, 0, sizeof(p));
    snprintf(p.engine_id, sizeof(p.engine_id), "prefill-a");
    snprintf(p.host, sizeof(p.host), "127.0.0.1");
    p.port = 5600;
    p.num_groups = 2;
    p.ids[0] = ids0;
    p.num_ids[0] = 3;
    p.ids[1] = ids1;
    p.num_ids[1] = 1;
    p.num_tokens = 200;
    p.first_token = 42;
    assert_int_equal(kvf_xfer_params_msg_pack(&p, &buf, &len), KVF_OK);
    assert_int_equal(kvf_xfer_params_msg_unpack(buf, len, &p2), KVF_OK);
    assert_int_equal(p2.num_groups, 2);
    assert_int_equal(p2.num_ids[0], 3);
    assert_memory_equal(p2.ids[0], ids0, sizeof(ids0));
    assert_int_equal(p2.ids[1][0], 2);
    assert_int_equal(p2.num_tokens, 200);
    assert_int_equal(p2.first_token, 42);
    assert_int_equal(p2.port, 5600);
    kvf_xfer_params_msg_cleanup(&p2);
    free(buf);

    /* negative block ids and port 0 are malformed */
    ids1[0] = -1;
    assert_int_equal(kvf_xfer_params_msg_pack(&p, &buf, &len), KVF_OK);
    assert_int_equal(kvf_xfer_params_msg_unpack(buf, len, &p2), KVF_ERR_PARSE);
    free(buf);
    ids1[0] = 2;
    p.port = 0;
    assert_int_equal(kvf_xfer_params_msg_pack(&p, &buf, &len), KVF_OK);
    assert_int_equal(kvf_xfer_params_msg_unpack(buf, len, &p2), KVF_ERR_PARSE);
    free(buf);
    /* no KV cache group at all is malformed too */
    p.port = 5600;
    p.num_groups = 0;
    assert_int_equal(kvf_xfer_params_msg_pack(&p, &buf, &len), KVF_OK);
    assert_int_equal(kvf_xfer_params_msg_unpack(buf, len, &p2), KVF_ERR_PARSE);
    free(buf);
}

/* The one decoder, as kvf-decode calls it: each refusal names its field. */
static void test_params_decoder_names_fields(void **state)
{
    Kvf__TransferParams m = KVF__TRANSFER_PARAMS__INIT;
    Kvf__BlockIdList g = KVF__BLOCK_ID_LIST__INIT, *gp = &g;
    int32_t ids[2] = {3, 4};
    kvf_xfer_params_msg_t p;
    char err[256];

    (void)state;
    assert_int_equal(kvf_xfer_params_decode(NULL, 0, &p, err, sizeof(err)), KVF_ERR_PARSE);
    assert_non_null(strstr(err, "transfer params"));
    m.engine_id = (char *)"prefill-a";
    m.host = (char *)"127.0.0.1";
    m.has_port = 1;
    m.port = 0;
    assert_int_equal(kvf_xfer_params_decode(&m, 0, &p, err, sizeof(err)), KVF_ERR_PARSE);
    assert_non_null(strstr(err, "port 0"));
    m.port = 7000;
    assert_int_equal(kvf_xfer_params_decode(&m, 0, &p, err, sizeof(err)), KVF_ERR_PARSE);
    assert_non_null(strstr(err, "first token"));
    m.has_first_token = 1;
    m.first_token = 9;
    m.has_num_tokens = 1;
    m.num_tokens = 40;
    assert_int_equal(kvf_xfer_params_decode(&m, 39, &p, err, sizeof(err)), KVF_ERR_PARSE);
    assert_non_null(strstr(err, "cover 40 tokens, the prompt has 39"));
    assert_int_equal(kvf_xfer_params_decode(&m, 40, &p, err, sizeof(err)), KVF_ERR_PARSE);
    assert_non_null(strstr(err, "0 KV cache groups"));
    m.n_groups = 1;
    m.groups = &gp;
    g.n_ids = 2;
    g.ids = ids;
    ids[1] = -4;
    assert_int_equal(kvf_xfer_params_decode(&m, 40, &p, err, sizeof(err)), KVF_ERR_PARSE);
    assert_non_null(strstr(err, "block id -4 (index 1) is negative"));
    ids[1] = 4;
    assert_int_equal(kvf_xfer_params_decode(&m, 40, &p, err, sizeof(err)), KVF_OK);
    assert_int_equal(p.num_groups, 1);
    assert_int_equal(p.num_ids[0], 2);
    assert_int_equal(p.ids[0][1], 4);
    assert_int_equal(p.first_token, 9);
    assert_int_equal(p.port, 7000);
    assert_false(p.has_incarnation);
    assert_true(p.ids[0] != ids);   /* a copy: the message may go */
    kvf_xfer_params_msg_cleanup(&p);
}

static void test_reply_rejects_bad_fields(void **state)
{
    kvf_handshake_reply_t reply, out;
    kvf_rank_meta_t ranks[2];
    uint8_t *buf;
    size_t len;

    (void)state;
    for (int bad = 0; bad < 6; ++bad) {
        meta_fill(&ranks[0], 2, 0, 8);
        meta_fill(&ranks[1], 2, 1, 8);
        switch (bad) {
        case 0: ranks[1].tp_rank = 0; break;            /* rank 0 twice, rank 1 missing */
        case 1: ranks[0].kv_dtype = KVF_DTYPE_COUNT; break;
        case 2: ranks[0].tp_size = 3; break;            /* 2 entries for TP 3 */
        case 3: ranks[1].block_size = 0; break;
        case 4: ranks[0].kernel_block_size = 160; break;  /* larger than the block */
        case 5: ranks[1].worker_addr_len = 0; break;
        }
        memset(&reply, 0, sizeof(reply));
        reply.accepted = true;
        reply.num_ranks = 2;
        reply.ranks = ranks;
        assert_int_equal(kvf_handshake_reply_pack(&reply, &buf, &len), KVF_OK);
        assert_int_equal(kvf_handshake_reply_unpack(buf, len, &out), KVF_ERR_PARSE);
        assert_null(out.ranks);
        free(buf);
    }
}

/* A reply of TP 2 whose regions are (rank 0, rank 1) of the memory types given, packed. */
static void pack_mem_types(kvf_xfer_mem_type_t t0, kvf_xfer_mem_type_t t1, uint8_t **buf_p,
                           size_t *len_p)
{
    kvf_handshake_reply_t reply;
    kvf_rank_meta_t ranks[2];

    meta_fill(&ranks[0], 2, 0, 8);
    meta_fill(&ranks[1], 2, 1, 8);
    ranks[0].regions[0].mem_type = t0;
    ranks[1].regions[0].mem_type = t1;
    memset(&reply, 0, sizeof(reply));
    reply.accepted = true;
    reply.num_ranks = 2;
    reply.ranks = ranks;
    assert_int_equal(kvf_handshake_reply_pack(&reply, buf_p, len_p), KVF_OK);
}

/*
 * XferRegion.memory_type: cuda survives the round trip; host is not sent at
 * all (a host pool's metadata is byte for byte what it was before the field,
 * and a peer that never sends it reads as host); a value past cuda is refused.
 */
static void test_reply_memory_type(void **state)
{
    kvf_handshake_reply_t out;
    Kvf__HandshakeReply *m;
    uint8_t *buf;
    size_t len;

    (void)state;
    assert_string_equal(kvf_xfer_mem_type_name(KVF_XFER_MEM_HOST), "host");
    assert_string_equal(kvf_xfer_mem_type_name(KVF_XFER_MEM_CUDA), "cuda");
    assert_string_equal(kvf_xfer_mem_type_name((kvf_xfer_mem_type_t)7), "unknown");

    pack_mem_types(KVF_XFER_MEM_HOST, KVF_XFER_MEM_CUDA, &buf, &len);
    m = kvf__handshake_reply__unpack(NULL, len, buf);
    assert_non_null(m);
    for (size_t i = 0; i < m->n_ranks; ++i) {   /* on the wire: only the cuda region says so */
        const Kvf__XferRegion *x = m->ranks[i]->regions[0];
        assert_int_equal(x->has_memory_type, m->ranks[i]->tp_rank == 1);
        if (x->has_memory_type) {
            assert_int_equal(x->memory_type, 1);
        }
    }
    kvf__handshake_reply__free_unpacked(m, NULL);
    assert_int_equal(kvf_handshake_reply_unpack(buf, len, &out), KVF_OK);
    assert_int_equal(out.ranks[0].regions[0].mem_type, KVF_XFER_MEM_HOST);
    assert_int_equal(out.ranks[1].regions[0].mem_type, KVF_XFER_MEM_CUDA);
    kvf_handshake_reply_cleanup(&out);
    free(buf);

    /* out of range: the first unknown value, and the largest a uint32 can say */
    for (int k = 0; k < 2; ++k) {
        kvf_xfer_mem_type_t bad = (k == 0) ? (kvf_xfer_mem_type_t)KVF_XFER_MEM_TYPES :
                                  (kvf_xfer_mem_type_t)0xffffffffu;
        pack_mem_types(KVF_XFER_MEM_CUDA, bad, &buf, &len);
        assert_int_equal(kvf_handshake_reply_unpack(buf, len, &out), KVF_ERR_PARSE);
        assert_null(out.ranks);
        free(buf);
    }
}

/* A reply of TP 2 whose rank 1 advertises kv_layout @a layout, packed. */
static void pack_kv_layout(uint32_t layout, uint8_t **buf_p, size_t *len_p)
{
    kvf_handshake_reply_t reply;
    kvf_rank_meta_t ranks[2];

    meta_fill(&ranks[0], 2, 0, 8);
    meta_fill(&ranks[1], 2, 1, 8);
    ranks[1].kv_layout = (kvf_kv_layout_t)layout;
    memset(&reply, 0, sizeof(reply));
    reply.accepted = true;
    reply.num_ranks = 2;
    reply.ranks = ranks;
    assert_int_equal(kvf_handshake_reply_pack(&reply, buf_p, len_p), KVF_OK);
}

/*
 * RankMetadata.kv_layout: head-major survives the round trip; layer-major is not sent (a
 * layer-major pool's metadata is byte for byte what it was before the field, and a peer that
 * never sends it reads as layer-major); a value past head-major is refused, and the reason
 * logged names the field and the value.
 */
static void test_reply_kv_layout(void **state)
{
    kvf_handshake_reply_t out;
    Kvf__HandshakeReply *m;
    uint8_t *buf;
    size_t len;

    (void)state;
    pack_kv_layout(KVF_KV_HEAD_MAJOR, &buf, &len);
    m = kvf__handshake_reply__unpack(NULL, len, buf);
    assert_non_null(m);
    for (size_t i = 0; i < m->n_ranks; ++i) {
        assert_int_equal(m->ranks[i]->has_kv_layout, m->ranks[i]->tp_rank == 1);
    }
    kvf__handshake_reply__free_unpacked(m, NULL);
    assert_int_equal(kvf_handshake_reply_unpack(buf, len, &out), KVF_OK);
    assert_int_equal(out.ranks[0].kv_layout, KVF_KV_LAYER_MAJOR);
    assert_int_equal(out.ranks[1].kv_layout, KVF_KV_HEAD_MAJOR);
    kvf_handshake_reply_cleanup(&out);
    free(buf);

    for (int k = 0; k < 2; ++k) {
        uint32_t bad = (k == 0) ? (uint32_t)KVF_KV_LAYOUT_COUNT : 0xffffffffu;
        char want[96], text[4096];
        FILE *log = tmpfile();
        int saved = dup(fileno(stderr));
        size_t n;

        assert_non_null(log);
        pack_kv_layout(bad, &buf, &len);
        fflush(stderr);
        dup2(fileno(log), fileno(stderr));
        int level = kvf_log_level_cur;
        unsigned mask = kvf_log_subsys_mask;
        kvf_log_set_level(KVF_LOG_DEBUG);
        kvf_log_subsys_mask = ~0u;
        assert_int_equal(kvf_handshake_reply_unpack(buf, len, &out), KVF_ERR_PARSE);
        kvf_log_set_level((kvf_log_level_t)level);
        kvf_log_subsys_mask = mask;
        fflush(stderr);
        dup2(saved, fileno(stderr));
        close(saved);
        assert_null(out.ranks);
        rewind(log);
        n = fread(text, 1, sizeof(text) - 1, log);
        text[n] = '\0';
        fclose(log);
        snprintf(want, sizeof(want), "rank 1 kv_layout %u is not a KV cache layout", bad);
        if (strstr(text, want) == NULL) {
            fail_msg("refusal does not name the field: want '%s' in '%s'", want, text);
        }
        free(buf);
    }
}

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void unpack_all(const uint8_t *buf, size_t len)
{
    kvf_handshake_reply_t reply;
    kvf_handshake_request_t req;
    kvf_xfer_notification_t n;
    kvf_xfer_params_msg_t p;
    kvf_status_t s;

    s = kvf_handshake_reply_unpack(buf, len, &reply);
    assert_true((s == KVF_OK) || (s == KVF_ERR_PARSE));
    if (s == KVF_OK) {
        for (int r = 0; r < reply.num_ranks; ++r) {   /* every accepted rank is in range */
            assert_int_equal(reply.ranks[r].tp_rank, r);
            assert_true(reply.ranks[r].regions[0].rkey_len <= KVF_RKEY_MAX);
        }
        kvf_handshake_reply_cleanup(&reply);
    }
    s = kvf_handshake_request_unpack(buf, len, &req);
    assert_true((s == KVF_OK) || (s == KVF_ERR_PARSE));
    s = kvf_xfer_notification_unpack(buf, len, &n);
    assert_true((s == KVF_OK) || (s == KVF_ERR_PARSE));
    s = kvf_xfer_params_msg_unpack(buf, len, &p);
    assert_true((s == KVF_OK) || (s == KVF_ERR_PARSE));
    if (s == KVF_OK) {
        kvf_xfer_params_msg_cleanup(&p);
    }
}

static void test_garbage_never_crashes(void **state)
{
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    uint8_t *valid, *buf;
    size_t vlen;
    int parsed_ok = 0;

    (void)state;
    kvf_log_set_level(KVF_LOG_ERROR);
    buf = malloc(4096);
    assert_non_null(buf);
    /* pure random bytes, lengths 0..1024 */
    for (int i = 0; i < 20000; ++i) {
        size_t len = (size_t)(rng_next(&rng) % 1025);
        for (size_t k = 0; k < len; ++k) {
            buf[k] = (uint8_t)rng_next(&rng);
        }
        unpack_all(buf, len);
    }
    /* every truncation of a valid reply, then single-bit flips */
    pack_reply(2, &valid, &vlen);
    for (size_t len = 0; len < vlen; ++len) {
        kvf_handshake_reply_t reply;
        /* a prefix ending on a field boundary is a valid message; it must
         * still describe both ranks or be rejected */
        if (kvf_handshake_reply_unpack(valid, len, &reply) == KVF_OK) {
            parsed_ok++;
            assert_int_equal(reply.num_ranks, 2);
            kvf_handshake_reply_cleanup(&reply);
        }
        unpack_all(valid, len);
    }
    assert_true(parsed_ok <= 1);   /* at most the prefix without the trailing error field */
    for (int i = 0; i < 20000; ++i) {
        size_t bit = (size_t)(rng_next(&rng) % (vlen * 8));
        memcpy(buf, valid, vlen);
        buf[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        unpack_all(buf, vlen);
    }
    free(valid);
    free(buf);
}

/* ---- compatibility check ---------------------------------------------- */

static kvf_status_t check(const kvf_rank_meta_t *local, kvf_rank_meta_t *remote, int n,
                          char *line, size_t len)
{
    kvf_refusal_t refusals[KVF_MAX_REFUSALS];
    kvf_rank_geometry_t geoms[8];
    int nref = -1;
    kvf_status_t s;

    s = kvf_compat_check(&tiny, local, remote, n, geoms, refusals, KVF_MAX_REFUSALS, &nref);
    line[0] = '\0';
    if (nref > 0) {
        kvf_refusal_format(&refusals[0], false, line, len);   /* decode's check */
    }
    assert_true((s == KVF_OK) == (nref == 0));
    return s;
}

static void test_compat(void **state)
{
    kvf_rank_meta_t local, remote[4];
    char line[512], expect[512];

    (void)state;
    kvf_log_set_level(KVF_LOG_ERROR);
    meta_fill(&local, 2, 0, 12);

    /* 4p2d, same everything: compatible */
    for (int r = 0; r < 4; ++r) {
        meta_fill(&remote[r], 4, r, 8);
    }
    assert_int_equal(check(&local, remote, 4, line, sizeof(line)), KVF_OK);

    /* different (translatable) block and kernel block size: compatible.
     * Block 160, kernel 32 at TP4: page = 160 * 128 = 20480, region = 8*2*20480 */
    for (int r = 0; r < 4; ++r) {
        remote[r].block_size = 160;
        remote[r].kernel_block_size = 32;
        remote[r].page_size = 20480;
        remote[r].regions[0].length = 8 * 2 * 20480;
    }
    assert_int_equal(check(&local, remote, 4, line, sizeof(line)), KVF_OK);

    /* KV dtype */
    for (int r = 0; r < 4; ++r) {
        meta_fill(&remote[r], 4, r, 8);
        remote[r].kv_dtype = KVF_DTYPE_FP16;
    }
    assert_int_equal(check(&local, remote, 4, line, sizeof(line)), KVF_ERR_REFUSED);
    assert_string_equal(line, "handshake refused: kv_dtype prefill=fp16 decode=bf16: KV cache "
                        "dtypes differ; blocks cannot be copied without conversion");

    /* SSM dtype */
    for (int r = 0; r < 4; ++r) {
        meta_fill(&remote[r], 4, r, 8);
        remote[r].ssm_dtype = KVF_DTYPE_BF16;
    }
    assert_int_equal(check(&local, remote, 4, line, sizeof(line)), KVF_ERR_REFUSED);
    assert_non_null(strstr(line, "handshake refused: ssm_dtype prefill=bf16 decode=fp32: "));

    /* protocol version */
    for (int r = 0; r < 4; ++r) {
        meta_fill(&remote[r], 4, r, 8);
        remote[r].protocol_version = KVF_XFER_PROTOCOL_VERSION + 1;
    }
    assert_int_equal(check(&local, remote, 4, line, sizeof(line)), KVF_ERR_REFUSED);
    snprintf(expect, sizeof(expect), "handshake refused: protocol_version prefill=%d decode=%d: "
             "protocol versions differ", KVF_XFER_PROTOCOL_VERSION + 1,
             KVF_XFER_PROTOCOL_VERSION);
    assert_string_equal(line, expect);

    /* fingerprint */
    for (int r = 0; r < 4; ++r) {
        meta_fill(&remote[r], 4, r, 8);
        remote[r].model_fingerprint ^= 1;
    }
    assert_int_equal(check(&local, remote, 4, line, sizeof(line)), KVF_ERR_REFUSED);
    snprintf(expect, sizeof(expect), "handshake refused: model_fingerprint prefill=%016" PRIx64
             " decode=%016" PRIx64 ": ", local.model_fingerprint ^ 1, local.model_fingerprint);
    assert_memory_equal(line, expect, strlen(expect));

    /* region length: rank 2 claims one page more than 8 blocks * 2 slots * 10240 */
    for (int r = 0; r < 4; ++r) {
        meta_fill(&remote[r], 4, r, 8);
    }
    remote[2].regions[0].length += 10240;
    assert_int_equal(check(&local, remote, 4, line, sizeof(line)), KVF_ERR_REFUSED);
    assert_memory_equal(line, "handshake refused: region_length prefill=174080 decode=163840: ",
                        strlen("handshake refused: region_length prefill=174080 decode=163840: "));

    /* page size that does not follow from the advertised block size */
    for (int r = 0; r < 4; ++r) {
        meta_fill(&remote[r], 4, r, 8);
    }
    remote[0].page_size = 8192;
    remote[0].regions[0].length = 8 * 2 * 8192;
    assert_int_equal(check(&local, remote, 4, line, sizeof(line)), KVF_ERR_REFUSED);
    assert_memory_equal(line, "handshake refused: page_size prefill=8192 decode=10240: ",
                        strlen("handshake refused: page_size prefill=8192 decode=10240: "));

    /* layout tag */
    for (int r = 0; r < 4; ++r) {
        meta_fill(&remote[r], 4, r, 8);
        snprintf(remote[r].layout_tag, sizeof(remote[r].layout_tag), "DS");
    }
    assert_int_equal(check(&local, remote, 4, line, sizeof(line)), KVF_ERR_REFUSED);
    assert_string_equal(line, "handshake refused: layout_tag prefill=DS decode=HND: KV cache "
                        "memory layouts differ");

    /* 3 prefill ranks cannot shard 8 heads, nor divide decode TP 2 */
    for (int r = 0; r < 3; ++r) {
        meta_fill(&remote[r], 3, r, 8);
    }
    assert_int_equal(check(&local, remote, 3, line, sizeof(line)), KVF_ERR_REFUSED);
    assert_memory_equal(line, "handshake refused: tp_size prefill=3 decode=2: ",
                        strlen("handshake refused: tp_size prefill=3 decode=2: "));
}

/* Weights and tokenizer: the model digest travels, is range-checked, and a pair differs by it. */
static void test_model_digest(void **state)
{
    static const char *da = "0123456789abcdef0123456789abcdef";
    static const char *db = "fedcba9876543210fedcba9876543210";
    kvf_rank_meta_t local, remote[4];
    kvf_handshake_reply_t reply, out;
    char line[1024], expect[1024];
    uint8_t *buf;
    size_t len;

    (void)state;
    /* round trip: digest and folder arrive as sent */
    meta_fill(&local, 1, 0, 8);
    snprintf(local.model_digest, sizeof(local.model_digest), "%s", da);
    snprintf(local.model_path, sizeof(local.model_path), "/models/seed1");
    memset(&reply, 0, sizeof(reply));
    reply.accepted = true;
    snprintf(reply.engine_id, sizeof(reply.engine_id), "prefill-a");
    reply.num_ranks = 1;
    reply.ranks = &local;
    assert_int_equal(kvf_handshake_reply_pack(&reply, &buf, &len), KVF_OK);
    assert_int_equal(kvf_handshake_reply_unpack(buf, len, &out), KVF_OK);
    assert_string_equal(out.ranks[0].model_digest, da);
    assert_string_equal(out.ranks[0].model_path, "/models/seed1");
    kvf_handshake_reply_cleanup(&out);
    free(buf);
    /* refused on unpack: not 32 lowercase hex digits, a folder with a control byte */
    {
        static const char *bad_digest[] = {"0123", "0123456789ABCDEF0123456789abcdef",
                                           "0123456789abcdef0123456789abcdeg"};
        for (size_t i = 0; i < 3; ++i) {
            snprintf(local.model_digest, sizeof(local.model_digest), "%s", bad_digest[i]);
            assert_int_equal(kvf_handshake_reply_pack(&reply, &buf, &len), KVF_OK);
            assert_int_equal(kvf_handshake_reply_unpack(buf, len, &out), KVF_ERR_PARSE);
            free(buf);
        }
        snprintf(local.model_digest, sizeof(local.model_digest), "%s", da);
        snprintf(local.model_path, sizeof(local.model_path), "/models/x\nforged log line");
        assert_int_equal(kvf_handshake_reply_pack(&reply, &buf, &len), KVF_OK);
        assert_int_equal(kvf_handshake_reply_unpack(buf, len, &out), KVF_ERR_PARSE);
        free(buf);
    }

    /* compat: equal digests pass, as do two sides without one (tools) */
    meta_fill(&local, 2, 0, 8);
    snprintf(local.model_digest, sizeof(local.model_digest), "%s", da);
    snprintf(local.model_path, sizeof(local.model_path), "/models/seed2");
    for (int r = 0; r < 4; ++r) {
        meta_fill(&remote[r], 4, r, 8);
        snprintf(remote[r].model_digest, sizeof(remote[r].model_digest), "%s", da);
        snprintf(remote[r].model_path, sizeof(remote[r].model_path), "/models/seed1");
    }
    assert_int_equal(check(&local, remote, 4, line, sizeof(line)), KVF_OK);
    {
        kvf_rank_meta_t l2, r2[4];
        meta_fill(&l2, 2, 0, 8);
        for (int r = 0; r < 4; ++r) {
            meta_fill(&r2[r], 4, r, 8);
        }
        assert_int_equal(check(&l2, r2, 4, line, sizeof(line)), KVF_OK);
    }
    /* the same config with other weights: refused, both digests and folders named */
    for (int r = 0; r < 4; ++r) {
        snprintf(remote[r].model_digest, sizeof(remote[r].model_digest), "%s", db);
    }
    assert_int_equal(check(&local, remote, 4, line, sizeof(line)), KVF_ERR_REFUSED);
    snprintf(expect, sizeof(expect), "handshake refused: model_digest prefill=%s (/models/seed1) "
             "decode=%s (/models/seed2): weights or tokenizer differ", db, da);
    assert_string_equal(line, expect);
    /* only one side advertises a digest: refused too */
    for (int r = 0; r < 4; ++r) {
        remote[r].model_digest[0] = '\0';
    }
    assert_int_equal(check(&local, remote, 4, line, sizeof(line)), KVF_ERR_REFUSED);
    snprintf(expect, sizeof(expect), "handshake refused: model_digest prefill=none "
             "decode=%s (/models/seed2): one side advertises no model digest", da);
    assert_memory_equal(line, expect, strlen(expect));
    /* ranks of one instance that disagree on it */
    for (int r = 0; r < 4; ++r) {
        snprintf(remote[r].model_digest, sizeof(remote[r].model_digest), "%s", (r == 3) ? db : da);
    }
    assert_int_equal(check(&local, remote, 4, line, sizeof(line)), KVF_ERR_REFUSED);
    assert_non_null(strstr(line, "handshake refused: rank_metadata prefill=rank 0 vs rank 3 decode=-"));
}

/*
 * The sliding window at handshake (docs/ARCHITECTURE.md §7): kvf_rank_meta_set_window() from
 * gpt-oss's layer_types ([sliding, full, sliding], window 40), carried through pack/unpack,
 * unsaid for a model without one; a pair whose windows or sliding layers differ is refused
 * naming the field and both values, before any geometry.
 */
static void test_sliding_window(void **state)
{
    kvf_model_config_t oss;
    kvf_handshake_reply_t reply, out;
    kvf_rank_meta_t local, remote[4];
    char line[512];
    uint8_t *buf;
    size_t len;

    (void)state;
    assert_int_equal(kvf_model_config_load(KVF_SOURCE_DIR "/tests/data/families/gpt-oss/"
                                           "config.json", &oss), KVF_OK);
    meta_fill(&local, 2, 0, 8);
    assert_int_equal(local.sliding_window, 0);
    kvf_rank_meta_set_window(&local, &tiny);   /* no sliding layer */
    assert_int_equal(local.sliding_window, 0);
    assert_int_equal(local.sliding_layers_len, 0);
    kvf_rank_meta_set_window(&local, &oss);
    assert_int_equal(local.sliding_window, 40);
    assert_int_equal(local.sliding_layers_len, 1);
    assert_int_equal(local.sliding_layers[0], 0x5);   /* layers 0 and 2 */

    /* carried by the wire */
    memset(&reply, 0, sizeof(reply));
    reply.accepted = true;
    snprintf(reply.engine_id, sizeof(reply.engine_id), "prefill-a");
    reply.num_ranks = 1;
    meta_fill(&remote[0], 1, 0, 8);
    kvf_rank_meta_set_window(&remote[0], &oss);
    reply.ranks = remote;
    assert_int_equal(kvf_handshake_reply_pack(&reply, &buf, &len), KVF_OK);
    assert_int_equal(kvf_handshake_reply_unpack(buf, len, &out), KVF_OK);
    assert_int_equal(out.ranks[0].sliding_window, 40);
    assert_int_equal(out.ranks[0].sliding_layers_len, 1);
    assert_int_equal(out.ranks[0].sliding_layers[0], 0x5);
    kvf_handshake_reply_cleanup(&out);
    free(buf);

    /* agreeing windows pass; a different window or other sliding layers are refused */
    for (int r = 0; r < 4; ++r) {
        meta_fill(&remote[r], 4, r, 8);
        kvf_rank_meta_set_window(&remote[r], &oss);
    }
    assert_int_equal(check(&local, remote, 4, line, sizeof(line)), KVF_OK);
    for (int r = 0; r < 4; ++r) {
        remote[r].sliding_window = 4096;
    }
    assert_int_equal(check(&local, remote, 4, line, sizeof(line)), KVF_ERR_REFUSED);
    assert_memory_equal(line, "handshake refused: sliding_window prefill=4096 decode=40: ",
                        strlen("handshake refused: sliding_window prefill=4096 decode=40: "));
    for (int r = 0; r < 4; ++r) {
        remote[r].sliding_window = 40;
        remote[r].sliding_layers[0] = 0x6;   /* layers 1 and 2 */
    }
    assert_int_equal(check(&local, remote, 4, line, sizeof(line)), KVF_ERR_REFUSED);
    assert_string_equal(line, "handshake refused: sliding_layers prefill=1,2 decode=0,2: the "
                        "layers that slide differ");
    /* a peer that advertises none (a model without a window, or one that predates it) */
    for (int r = 0; r < 4; ++r) {
        meta_fill(&remote[r], 4, r, 8);
    }
    assert_int_equal(check(&local, remote, 4, line, sizeof(line)), KVF_ERR_REFUSED);
    assert_memory_equal(line, "handshake refused: sliding_window prefill=0 decode=40: ",
                        strlen("handshake refused: sliding_window prefill=0 decode=40: "));
}

/*
 * The cache group layout (sliding layers in groups of their own, docs/ARCHITECTURE.md §7) is
 * the same on both sides: a gpt-oss peer advertising the one-group layout of an older build
 * ([S, F, S] in one group of 3 slots, where this build has 3 groups of 1) is refused on
 * `slots`, naming both values, before any block id is trusted.
 */
static void test_sliding_group_layout(void **state)
{
    kvf_model_config_t oss;
    kvf_cache_params_t cp;
    kvf_cache_layout_t *lay = malloc(sizeof(*lay));
    kvf_rank_geometry_t g, geoms[2];
    kvf_rank_meta_t local, remote;
    kvf_refusal_t refusals[KVF_MAX_REFUSALS];
    char line[512] = "";
    int nref = -1;
    (void)state;

    assert_non_null(lay);
    assert_int_equal(kvf_model_config_load(KVF_SOURCE_DIR "/tests/data/families/gpt-oss/"
                                           "config.json", &oss), KVF_OK);
    assert_int_equal(kvf_cache_layout_build(&oss, lay), KVF_OK);
    assert_int_equal(lay->slots, 1);
    assert_int_equal(lay->num_groups, 3);
    kvf_cache_params_default(&oss, &cp);
    assert_int_equal(kvf_rank_geometry_compute(&oss, &cp, 1, 0, &g), KVF_OK);
    meta_fill(&local, 1, 0, 8);
    local.model_fingerprint = kvf_model_config_fingerprint(&oss);
    local.block_size = g.block_size;
    local.kernel_block_size = g.kernel_block_size;
    local.page_size = g.page_size;
    local.kv_dtype = cp.kv_dtype;
    local.conv_dtype = cp.conv_dtype;
    local.ssm_dtype = cp.ssm_dtype;
    local.slots = lay->slots;
    local.regions[0].length = 8ull * (uint64_t)lay->slots * g.page_size;
    kvf_rank_meta_set_window(&local, &oss);
    remote = local;
    assert_int_equal(kvf_compat_check(&oss, &local, &remote, 1, geoms, refusals,
                                      KVF_MAX_REFUSALS, &nref), KVF_OK);
    remote.slots = 3;   /* the one-group layout */
    remote.regions[0].length = 8ull * 3u * g.page_size;
    assert_int_equal(kvf_compat_check(&oss, &local, &remote, 1, geoms, refusals,
                                      KVF_MAX_REFUSALS, &nref), KVF_ERR_REFUSED);
    assert_int_equal(nref, 1);
    kvf_refusal_format(&refusals[0], false, line, sizeof(line));
    assert_memory_equal(line, "handshake refused: slots prefill=3 decode=1: ",
                        strlen("handshake refused: slots prefill=3 decode=1: "));
    free(lay);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reply_roundtrip),
        cmocka_unit_test(test_other_roundtrips),
        cmocka_unit_test(test_params_decoder_names_fields),
        cmocka_unit_test(test_reply_rejects_bad_fields),
        cmocka_unit_test(test_reply_memory_type),
        cmocka_unit_test(test_reply_kv_layout),
        cmocka_unit_test(test_garbage_never_crashes),
        cmocka_unit_test(test_compat),
        cmocka_unit_test(test_model_digest),
        cmocka_unit_test(test_sliding_window),
        cmocka_unit_test(test_sliding_group_layout),
    };
    kvf_log_init("test");
    load_tiny();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
