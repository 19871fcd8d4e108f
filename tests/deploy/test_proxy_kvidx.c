/*
 * kvf-proxy's side of vLLM's KV events: the batch decoder (kvf_proxy_kvev.h)
 * on the daemons' encoder's bytes in both forms, on foreign int hashes and on
 * malformed batches (nothing applied); and the index (kvf_proxy_kvidx.h)
 * against a publisher played by the test: the replay it asks for on
 * subscribing, a sequence gap answered by a replay from the missing number,
 * removals, and a new incarnation that starts the set over; the cached prefix
 * it computes from a prompt with the chain of kvf_block_hash.h.
 */
#include "kvf_kv_events_enc.h"
#include "kvf_proxy_kvev.h"
#include "kvf_proxy_kvidx.h"

#include <msgpack.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>
#include <cmocka.h>

typedef struct seen {
    int              n[3];          /* events by kind */
    kvf_block_hash_t hashes[16];
    int              n_hashes;
} seen_t;

static void collect(void *ctx, kvf_proxy_kvev_kind_t kind, const kvf_block_hash_t *h, size_t n)
{
    seen_t *s = ctx;

    s->n[kind]++;
    for (size_t i = 0; i < n && s->n_hashes < 16; ++i) {
        s->hashes[s->n_hashes++] = h[i];
    }
}

static int32_t toks[3][4] = {{1, 2, 3, 4}, {5, 6, 7, 8}, {9, 10, 11, 12}};

static void test_decode_roundtrip(void **state)
{
    kvf_kv_event_t ev[5];
    uint8_t *buf;
    size_t len;

    (void)state;
    for (int j = 0; j < 3; ++j) {
        ev[j] = (kvf_kv_event_t){KVF_PREFIX_EV_STORED, {10 + (uint64_t)j, 0xffffffff00000000ull},
                                 j > 0, {j > 0 ? 9 + (uint64_t)j : 0, 0xffffffff00000000ull},
                                 toks[j], 4};
    }
    ev[3] = (kvf_kv_event_t){.kind = KVF_PREFIX_EV_REMOVED, .hash = {11, 0xffffffff00000000ull}};
    ev[4] = (kvf_kv_event_t){.kind = KVF_PREFIX_EV_CLEARED};
    for (int fmt = 0; fmt < 2; ++fmt) {
        seen_t s = {0};
        assert_int_equal(kvf_kv_events_encode(ev, 5, 1.0, "CPU", (kvf_kv_events_format_t)fmt,
                                              &buf, &len), KVF_OK);
        assert_int_equal(kvf_proxy_kvev_decode(buf, len, collect, &s, NULL, 0), KVF_OK);
        assert_int_equal(s.n[KVF_PROXY_KVEV_STORED], 1);
        assert_int_equal(s.n[KVF_PROXY_KVEV_REMOVED], 1);
        assert_int_equal(s.n[KVF_PROXY_KVEV_CLEARED], 1);
        assert_int_equal(s.n_hashes, 4);
        for (int j = 0; j < 4; ++j) {
            assert_true(s.hashes[j].lo == ev[j].hash.lo && s.hashes[j].hi == ev[j].hash.hi);
        }
        /* a truncated batch is refused whole */
        memset(&s, 0, sizeof(s));
        assert_int_equal(kvf_proxy_kvev_decode(buf, len - 3, collect, &s, NULL, 0),
                         KVF_ERR_PARSE);
        assert_int_equal(s.n[0] + s.n[1] + s.n[2], 0);
        free(buf);
    }
}

static void pack_str(msgpack_packer *pk, const char *s)
{
    msgpack_pack_str(pk, strlen(s));
    msgpack_pack_str_body(pk, s, strlen(s));
}

/* vLLM's int hashes (an older vLLM, another router's test), an unknown event type skipped,
 * and a batch whose second event is malformed: nothing of it is applied. */
static void test_decode_foreign(void **state)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;
    seen_t s = {0};
    char why[128] = "";

    (void)state;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 2);   /* [ts, events]: no data_parallel_rank (older vLLM) */
    msgpack_pack_double(&pk, 2.0);
    msgpack_pack_array(&pk, 2);
    msgpack_pack_array(&pk, 3);
    pack_str(&pk, "BlockRemoved");
    msgpack_pack_array(&pk, 2);
    msgpack_pack_uint64(&pk, 15760518052499183552ull);
    msgpack_pack_int64(&pk, -5);
    msgpack_pack_nil(&pk);
    msgpack_pack_map(&pk, 1);
    pack_str(&pk, "type");
    pack_str(&pk, "SomethingNew");
    assert_int_equal(kvf_proxy_kvev_decode((uint8_t *)sb.data, sb.size, collect, &s, why,
                                           sizeof(why)), KVF_OK);
    assert_int_equal(s.n[KVF_PROXY_KVEV_REMOVED], 1);
    assert_int_equal(s.n_hashes, 2);
    assert_true(s.hashes[0].lo == 15760518052499183552ull && s.hashes[0].hi == 0);
    assert_true(s.hashes[1].lo == (uint64_t)-5);
    msgpack_sbuffer_clear(&sb);
    msgpack_pack_array(&pk, 3);
    msgpack_pack_double(&pk, 2.0);
    msgpack_pack_array(&pk, 2);
    msgpack_pack_array(&pk, 1);
    pack_str(&pk, "AllBlocksCleared");
    msgpack_pack_array(&pk, 3);
    pack_str(&pk, "BlockStored");
    msgpack_pack_array(&pk, 1);
    pack_str(&pk, "not a hash");
    msgpack_pack_nil(&pk);
    msgpack_pack_int64(&pk, 0);
    memset(&s, 0, sizeof(s));
    assert_int_equal(kvf_proxy_kvev_decode((uint8_t *)sb.data, sb.size, collect, &s, why,
                                           sizeof(why)), KVF_ERR_PARSE);
    assert_non_null(strstr(why, "block hash 0"));
    assert_int_equal(s.n[KVF_PROXY_KVEV_CLEARED], 0);   /* the valid first event neither */
    msgpack_sbuffer_destroy(&sb);
    assert_int_equal(kvf_proxy_kvev_decode((const uint8_t *)"\x93\x01", 2, collect, &s, why,
                                           sizeof(why)), KVF_ERR_PARSE);
}

/* ---- the index against a publisher played here ---- */

typedef struct fake {
    void            *ctx, *pub, *router;
    char             pub_ep[128], rep_ep[128];
    kvf_block_hash_t blocks[3];     /* the prompt's three 4-token blocks' keys */
} fake_t;

static void be64(uint64_t v, uint8_t b[8])
{
    for (int i = 0; i < 8; ++i) {
        b[i] = (uint8_t)(v >> (56 - 8 * i));
    }
}

/* The batch of sequence @a seq: stored blocks [from, to) (a clear when from < 0) or, with
 * @a removed, block @a from removed. Malloc'd. */
static uint8_t *batch(fake_t *f, int from, int to, bool removed, size_t *len)
{
    kvf_kv_event_t ev[3];
    size_t n = 0;
    uint8_t *buf;

    if (from < 0) {
        ev[n++] = (kvf_kv_event_t){.kind = KVF_PREFIX_EV_CLEARED};
    } else if (removed) {
        ev[n++] = (kvf_kv_event_t){.kind = KVF_PREFIX_EV_REMOVED, .hash = f->blocks[from]};
    } else {
        for (int j = from; j < to; ++j) {
            ev[n++] = (kvf_kv_event_t){KVF_PREFIX_EV_STORED, f->blocks[j], j > 0,
                                       j > 0 ? f->blocks[j - 1] : f->blocks[0], toks[j], 4};
        }
    }
    assert_int_equal(kvf_kv_events_encode(ev, n, 1.0, "CPU", KVF_KV_EVENTS_FORMAT_MAP, &buf,
                                          len), KVF_OK);
    return buf;
}

static void send3(void *sock, const void *a, size_t al, const void *b, size_t bl,
                  const void *c, size_t cl)
{
    zmq_send(sock, a, al, ZMQ_SNDMORE);
    zmq_send(sock, b, bl, ZMQ_SNDMORE);
    zmq_send(sock, c, cl, 0);
}

/* Publish batch @a seq live. */
static void live(fake_t *f, uint64_t seq, uint8_t *buf, size_t len)
{
    uint8_t sb[8];

    be64(seq, sb);
    send3(f->pub, "", 0, sb, 8, buf, len);
}

/* Wait (up to 5 s) for a replay request; its sequence number. Live batch @a seq is
 * published again every 100 ms meanwhile (a SUB may not have joined yet). */
static int64_t wait_replay_request(fake_t *f, uint8_t id[64], int *idn, int64_t seq,
                                   uint8_t *buf, size_t len)
{
    for (int i = 0; i < 50; ++i) {
        zmq_pollitem_t it = {f->router, 0, ZMQ_POLLIN, 0};
        if (seq >= 0) {
            live(f, (uint64_t)seq, buf, len);
        }
        if (zmq_poll(&it, 1, 100) > 0) {
            uint8_t d[8], s[16];
            *idn = zmq_recv(f->router, id, 64, 0);
            assert_int_equal(zmq_recv(f->router, d, sizeof(d), 0), 0);
            assert_int_equal(zmq_recv(f->router, s, sizeof(s), 0), 8);
            uint64_t v = 0;
            for (int k = 0; k < 8; ++k) {
                v = (v << 8) | s[k];
            }
            return (int64_t)v;
        }
    }
    fail_msg("no replay request came");
    return -1;
}

static void reply(fake_t *f, const uint8_t *id, int idn, uint64_t seq, uint8_t *buf, size_t len)
{
    uint8_t sb[8];

    be64(seq, sb);
    zmq_send(f->router, id, (size_t)idn, ZMQ_SNDMORE);
    send3(f->router, "", 0, sb, 8, buf, len);
}

static void reply_end(fake_t *f, const uint8_t *id, int idn)
{
    uint8_t sb[8];

    memset(sb, 0xff, sizeof(sb));
    zmq_send(f->router, id, (size_t)idn, ZMQ_SNDMORE);
    send3(f->router, "", 0, sb, 8, "", 0);
}

static int cached(kvf_proxy_kvidx_h kx, const int32_t *prompt, int n)
{
    kvf_proxy_kvidx_query_t q = {.tokens = prompt, .n_tokens = n};
    int c = kvf_proxy_kvidx_cached_tokens(kx, 0, &q);

    kvf_proxy_kvidx_query_done(&q);
    return c;
}

static void wait_cached(kvf_proxy_kvidx_h kx, const int32_t *prompt, int n, int want)
{
    int c = -1;

    for (int i = 0; (i < 500) && (c != want); ++i) {
        struct timespec ts = {0, 10 * 1000000L};
        c = cached(kx, prompt, n);
        if (c != want) {
            nanosleep(&ts, NULL);
        }
    }
    assert_int_equal(c, want);
}

static void test_index(void **state)
{
    static const char digest_hex[] = "000102030405060708090a0b0c0d0e0f";
    int32_t prompt[13];
    uint8_t digest[16], id[64], *b[6];
    size_t bl[6], len = sizeof(((fake_t *)0)->pub_ep);
    kvf_block_hash_t root, units[3];
    kvf_proxy_kvidx_h kx;
    fake_t f;
    int idn;

    (void)state;
    for (int t = 0; t < 12; ++t) {
        prompt[t] = toks[t / 4][t % 4];
    }
    prompt[12] = 99;
    assert_int_equal(kvf_block_hash_digest_from_hex(digest_hex, digest), KVF_OK);
    assert_int_equal(kvf_block_hash_root(digest, NULL, 0, &root), KVF_OK);
    kvf_block_hash_chain(root, prompt, 4, 3, units);   /* unit = block = 4 tokens */
    memcpy(f.blocks, units, sizeof(units));
    f.ctx = zmq_ctx_new();
    f.pub = zmq_socket(f.ctx, ZMQ_PUB);
    f.router = zmq_socket(f.ctx, ZMQ_ROUTER);
    int linger = 0;
    zmq_setsockopt(f.pub, ZMQ_LINGER, &linger, sizeof(linger));
    zmq_setsockopt(f.router, ZMQ_LINGER, &linger, sizeof(linger));
    assert_int_equal(zmq_bind(f.pub, "tcp://127.0.0.1:*"), 0);
    assert_int_equal(zmq_bind(f.router, "tcp://127.0.0.1:*"), 0);
    zmq_getsockopt(f.pub, ZMQ_LAST_ENDPOINT, f.pub_ep, &len);
    len = sizeof(f.rep_ep);
    zmq_getsockopt(f.router, ZMQ_LAST_ENDPOINT, f.rep_ep, &len);
    b[0] = batch(&f, -1, 0, false, &bl[0]);   /* seq 0: cleared */
    b[1] = batch(&f, 0, 2, false, &bl[1]);    /* seq 1: blocks 0, 1 */
    b[2] = batch(&f, 2, 3, false, &bl[2]);    /* seq 2: block 2 */
    b[3] = batch(&f, -1, 0, false, &bl[3]);   /* seq 3: (a clear, then:) */
    b[4] = batch(&f, 0, 3, false, &bl[4]);    /* seq 4: blocks 0..2 again */
    b[5] = batch(&f, 0, 0, true, &bl[5]);     /* seq 5: block 0 removed */

    assert_int_equal(kvf_proxy_kvidx_create(1, &kx), KVF_OK);
    /* advertised as a daemon bound to every interface would: 0.0.0.0, which the index
     * replaces with the host it reaches the instance at */
    char wild[160];
    snprintf(wild, sizeof(wild), "tcp://0.0.0.0%s", strrchr(f.pub_ep, ':'));
    kvf_proxy_kvidx_src_t src = {.instance_addr = "tcp://127.0.0.1:1", .pub = wild,
                                 .replay = f.rep_ep, .incarnation = 7,
                                 .model_digest = digest_hex, .hash_unit = 4, .block_size = 4};
    kvf_proxy_kvidx_update(kx, 0, &src);
    /* subscribing: it asks for everything kept */
    assert_int_equal(wait_replay_request(&f, id, &idn, -1, NULL, 0), 0);
    reply(&f, id, idn, 0, b[0], bl[0]);
    reply(&f, id, idn, 1, b[1], bl[1]);
    reply_end(&f, id, idn);
    wait_cached(kx, prompt, 13, 8);          /* blocks 0 and 1 */
    wait_cached(kx, prompt, 9, 8);
    wait_cached(kx, prompt, 8, 7);           /* the last token is always computed */
    /* live 3 without 2: a gap, a replay from 2 */
    assert_int_equal(wait_replay_request(&f, id, &idn, 3, b[3], bl[3]), 2);
    reply(&f, id, idn, 2, b[2], bl[2]);
    reply(&f, id, idn, 3, b[3], bl[3]);
    reply_end(&f, id, idn);
    wait_cached(kx, prompt, 13, 0);          /* 3 cleared everything */
    for (int i = 0; i < 50 && cached(kx, prompt, 13) != 12; ++i) {
        live(&f, 4, b[4], bl[4]);
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    wait_cached(kx, prompt, 13, 12);
    live(&f, 5, b[5], bl[5]);
    wait_cached(kx, prompt, 13, 0);          /* block 0 gone: no prefix at all */
    cJSON *j = kvf_proxy_kvidx_json(kx, 0);
    assert_non_null(j);
    assert_string_equal(cJSON_GetObjectItem(j, "endpoint")->valuestring, f.pub_ep);
    assert_int_equal(cJSON_GetObjectItem(j, "gaps")->valuedouble, 1);
    assert_int_equal(cJSON_GetObjectItem(j, "last_seq")->valuedouble, 5);
    assert_int_equal(cJSON_GetObjectItem(j, "blocks")->valuedouble, 2);
    cJSON_Delete(j);
    /* a restart (new incarnation): the set starts over, and it asks for a replay again */
    live(&f, 6, b[4], bl[4]);
    src.incarnation = 8;
    kvf_proxy_kvidx_update(kx, 0, &src);
    assert_int_equal(wait_replay_request(&f, id, &idn, -1, NULL, 0), 0);
    wait_cached(kx, prompt, 13, 0);
    reply(&f, id, idn, 0, b[4], bl[4]);
    reply_end(&f, id, idn);
    wait_cached(kx, prompt, 13, 12);
    kvf_proxy_kvidx_destroy(kx);
    for (int i = 0; i < 6; ++i) {
        free(b[i]);
    }
    zmq_close(f.pub);
    zmq_close(f.router);
    zmq_ctx_term(f.ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode_roundtrip),
        cmocka_unit_test(test_decode_foreign),
        cmocka_unit_test(test_index),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
