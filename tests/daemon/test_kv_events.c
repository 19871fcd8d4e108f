/*
 * vLLM's KV events as the daemons publish them (daemon/kvf_kv_events*.h):
 * the encoder's bytes read back with msgpack-c's unpacker (vLLM's field names,
 * order and types, both encodings, chains coalesced), the publisher's PUB
 * frames and its replay socket (from a sequence number, the end marker, a
 * bounded buffer, a malformed request ignored), and --kv-events-config.
 */
#include "kvf_kv_events.h"

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

static int32_t toks[3][4] = {{1, 2, 3, 4}, {5, 6, 7, 8}, {9, 10, 11, -12}};

/* Three chained blocks, a removal, a clear. */
static size_t make_events(kvf_kv_event_t *ev)
{
    for (int j = 0; j < 3; ++j) {
        ev[j] = (kvf_kv_event_t){.kind = KVF_PREFIX_EV_STORED,
                                 .hash = {0x1111000000000000ull + (uint64_t)j, 0xa0 + (uint64_t)j},
                                 .has_parent = (j > 0), .tokens = toks[j], .block_size = 4};
        if (j > 0) {
            ev[j].parent = ev[j - 1].hash;
        }
    }
    ev[3] = (kvf_kv_event_t){.kind = KVF_PREFIX_EV_REMOVED, .hash = {7, 8}};
    ev[4] = (kvf_kv_event_t){.kind = KVF_PREFIX_EV_CLEARED};
    return 5;
}

static void assert_str(const msgpack_object *o, const char *s)
{
    assert_int_equal(o->type, MSGPACK_OBJECT_STR);
    assert_int_equal(o->via.str.size, strlen(s));
    assert_memory_equal(o->via.str.ptr, s, strlen(s));
}

static void assert_hash(const msgpack_object *o, kvf_block_hash_t h)
{
    uint8_t want[16];

    for (int i = 0; i < 8; ++i) {   /* low64 then high64, little-endian */
        want[i] = (uint8_t)(h.lo >> (8 * i));
        want[8 + i] = (uint8_t)(h.hi >> (8 * i));
    }
    assert_int_equal(o->type, MSGPACK_OBJECT_BIN);
    assert_int_equal(o->via.bin.size, 16);
    assert_memory_equal(o->via.bin.ptr, want, 16);
}

/* Field @a i of event @a ev: by name in the map form (checking the key), by position. */
static const msgpack_object *field(const msgpack_object *ev, uint32_t i, const char *name)
{
    if (ev->type == MSGPACK_OBJECT_MAP) {
        assert_true(i < ev->via.map.size);
        assert_str(&ev->via.map.ptr[i].key, name);
        return &ev->via.map.ptr[i].val;
    }
    assert_int_equal(ev->type, MSGPACK_OBJECT_ARRAY);
    assert_true(i < ev->via.array.size);
    return &ev->via.array.ptr[i];
}

static void check_batch(const uint8_t *buf, size_t len, kvf_kv_events_format_t fmt,
                        const kvf_kv_event_t *ev)
{
    msgpack_unpacked up;
    size_t off = 0;
    const msgpack_object *root, *evs, *e, *f;
    uint32_t want_fields[3] = {8, 3, 1};

    msgpack_unpacked_init(&up);
    assert_int_equal(msgpack_unpack_next(&up, (const char *)buf, len, &off),
                     MSGPACK_UNPACK_SUCCESS);
    assert_int_equal(off, len);   /* one object, nothing after */
    root = &up.data;
    assert_int_equal(root->type, MSGPACK_OBJECT_ARRAY);   /* [ts, events, dp_rank] */
    assert_int_equal(root->via.array.size, 3);
    assert_int_equal(root->via.array.ptr[0].type, MSGPACK_OBJECT_FLOAT64);
    assert_true(root->via.array.ptr[0].via.f64 == 1234.5);
    assert_int_equal(root->via.array.ptr[2].type, MSGPACK_OBJECT_POSITIVE_INTEGER);
    assert_int_equal(root->via.array.ptr[2].via.u64, 0);
    evs = &root->via.array.ptr[1];
    assert_int_equal(evs->type, MSGPACK_OBJECT_ARRAY);
    assert_int_equal(evs->via.array.size, 3);   /* the chain is one BlockStored */
    for (uint32_t k = 0; k < 3; ++k) {
        e = &evs->via.array.ptr[k];
        assert_int_equal((fmt == KVF_KV_EVENTS_FORMAT_MAP) ? e->via.map.size : e->via.array.size,
                         want_fields[k]);
    }
    e = &evs->via.array.ptr[0];
    assert_str(field(e, 0, "type"), "BlockStored");
    f = field(e, 1, "block_hashes");
    assert_int_equal(f->via.array.size, 3);
    for (int j = 0; j < 3; ++j) {
        assert_hash(&f->via.array.ptr[j], ev[j].hash);
    }
    assert_int_equal(field(e, 2, "parent_block_hash")->type, MSGPACK_OBJECT_NIL);
    f = field(e, 3, "token_ids");
    assert_int_equal(f->via.array.size, 12);
    for (int t = 0; t < 12; ++t) {
        assert_int_equal(f->via.array.ptr[t].via.i64, toks[t / 4][t % 4]);
    }
    assert_int_equal(f->via.array.ptr[11].type, MSGPACK_OBJECT_NEGATIVE_INTEGER);
    assert_int_equal(field(e, 4, "block_size")->via.u64, 4);
    assert_int_equal(field(e, 5, "lora_id")->type, MSGPACK_OBJECT_NIL);
    assert_str(field(e, 6, "medium"), "CPU");
    assert_int_equal(field(e, 7, "lora_name")->type, MSGPACK_OBJECT_NIL);
    e = &evs->via.array.ptr[1];
    assert_str(field(e, 0, "type"), "BlockRemoved");
    assert_int_equal(field(e, 1, "block_hashes")->via.array.size, 1);
    assert_hash(&field(e, 1, "block_hashes")->via.array.ptr[0], ev[3].hash);
    assert_str(field(e, 2, "medium"), "CPU");
    assert_str(field(&evs->via.array.ptr[2], 0, "type"), "AllBlocksCleared");
    msgpack_unpacked_destroy(&up);
}

static void test_encode(void **state)
{
    kvf_kv_event_t ev[5];
    size_t n = make_events(ev), len;
    uint8_t *buf;

    (void)state;
    for (int fmt = 0; fmt < 2; ++fmt) {
        assert_int_equal(kvf_kv_events_encode(ev, n, 1234.5, "CPU", (kvf_kv_events_format_t)fmt,
                                              &buf, &len), KVF_OK);
        check_batch(buf, len, (kvf_kv_events_format_t)fmt, ev);
        free(buf);
    }
}

/* A block whose parent is not the previous one starts a new BlockStored, with its parent. */
static void test_chain_break(void **state)
{
    kvf_kv_event_t ev[5];
    msgpack_unpacked up;
    size_t len, off = 0;
    uint8_t *buf;

    (void)state;
    make_events(ev);
    ev[2].parent = (kvf_block_hash_t){99, 98};
    assert_int_equal(kvf_kv_events_encode(ev, 3, 1.0, "GPU", KVF_KV_EVENTS_FORMAT_ARRAY, &buf,
                                          &len), KVF_OK);
    msgpack_unpacked_init(&up);
    assert_int_equal(msgpack_unpack_next(&up, (const char *)buf, len, &off),
                     MSGPACK_UNPACK_SUCCESS);
    const msgpack_object *evs = &up.data.via.array.ptr[1];
    assert_int_equal(evs->via.array.size, 2);
    assert_int_equal(evs->via.array.ptr[0].via.array.ptr[1].via.array.size, 2);
    assert_hash(&evs->via.array.ptr[1].via.array.ptr[2], ev[2].parent);
    assert_str(&evs->via.array.ptr[1].via.array.ptr[6], "GPU");
    msgpack_unpacked_destroy(&up);
    free(buf);
    ev[0].tokens = NULL;   /* a stored block without tokens is refused */
    assert_int_equal(kvf_kv_events_encode(ev, 1, 1.0, "GPU", KVF_KV_EVENTS_FORMAT_MAP, &buf,
                                          &len), KVF_ERR_INVALID_PARAM);
}

static void test_config(void **state)
{
    kvf_kv_events_config_t c;

    (void)state;
    assert_int_equal(kvf_kv_events_config_parse("", "", "", "map", &c), KVF_OK);
    assert_false(c.enabled);   /* off by default, as vLLM */
    assert_int_equal(kvf_kv_events_config_parse(
        "{\"enable_kv_cache_events\": true, \"publisher\": \"zmq\", \"endpoint\": "
        "\"tcp://*:6557\", \"replay_endpoint\": \"tcp://*:6558\", \"topic\": \"kv-events\", "
        "\"buffer_steps\": 50, \"hwm\": 10, \"max_queue_size\": 7}", "", "", "array", &c),
        KVF_OK);
    assert_true(c.enabled);
    assert_string_equal(c.endpoint, "tcp://*:6557");
    assert_string_equal(c.replay_endpoint, "tcp://*:6558");
    assert_string_equal(c.topic, "kv-events");
    assert_int_equal(c.buffer_steps, 50);
    assert_int_equal(c.max_queue_size, 7);
    assert_int_equal(c.format, KVF_KV_EVENTS_FORMAT_ARRAY);
    /* vLLM's publisher default: zmq when enabled */
    assert_int_equal(kvf_kv_events_config_parse("{\"enable_kv_cache_events\": true}", "", "",
                                                "", &c), KVF_OK);
    assert_true(c.enabled);
    assert_string_equal(c.endpoint, "tcp://*:5557");
    assert_int_equal(kvf_kv_events_config_parse("{\"enable_kv_cache_events\": true, "
                                                "\"publisher\": \"null\"}", "", "", "", &c),
                     KVF_OK);
    assert_false(c.enabled);
    assert_int_equal(kvf_kv_events_config_parse("", "tcp://*:7000", "", "", &c), KVF_OK);
    assert_true(c.enabled);   /* an endpoint flag alone turns them on */
    assert_string_equal(c.endpoint, "tcp://*:7000");
    /* refused by name: unknown key, wrong type, range, publisher, format */
    assert_int_equal(kvf_kv_events_config_parse("{\"enable_kv_cache_events\": true, "
                                                "\"endpont\": \"x\"}", "", "", "", &c),
                     KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_kv_events_config_parse("{\"enable_kv_cache_events\": 1}", "", "", "",
                                                &c), KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_kv_events_config_parse("{\"buffer_steps\": 0}", "", "", "", &c),
                     KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_kv_events_config_parse("{\"publisher\": \"kafka\"}", "", "", "", &c),
                     KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_kv_events_config_parse("{\"publisher\": \"zmq\"}", "", "", "", &c),
                     KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_kv_events_config_parse("[1]", "", "", "", &c), KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_kv_events_config_parse("", "", "", "json", &c), KVF_ERR_INVALID_PARAM);
}

/* ---- the publisher ---- */

static uint64_t be64(const uint8_t *b)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) {
        v = (v << 8) | b[i];
    }
    return v;
}

static void wait_batches(kvf_kv_events_h pub, uint64_t n)
{
    kvf_kv_events_stats_t st;
    for (int i = 0; i < 500; ++i) {
        kvf_kv_events_get_stats(pub, &st);
        if (st.batches >= n) {
            return;
        }
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
    fail_msg("publisher did not reach %llu batches", (unsigned long long)n);
}

/* Send a replay request from @a start on @a d; the sequence numbers answered, in order. */
static int replay(void *d, uint64_t start, uint64_t *seqs, int cap)
{
    uint8_t b[8];
    int n = 0;

    for (int i = 0; i < 8; ++i) {
        b[i] = (uint8_t)(start >> (56 - 8 * i));
    }
    assert_int_equal(zmq_send(d, "", 0, ZMQ_SNDMORE), 0);
    assert_int_equal(zmq_send(d, b, 8, 0), 8);
    for (;;) {
        zmq_msg_t f[3];
        int more = 1;
        size_t ml = sizeof(more);
        for (int k = 0; k < 3; ++k) {
            zmq_msg_init(&f[k]);
            assert_true(more);
            assert_true(zmq_msg_recv(&f[k], d, 0) >= 0);
            zmq_getsockopt(d, ZMQ_RCVMORE, &more, &ml);
        }
        assert_false(more);
        assert_int_equal(zmq_msg_size(&f[0]), 0);
        assert_int_equal(zmq_msg_size(&f[1]), 8);
        uint64_t s = be64(zmq_msg_data(&f[1]));
        bool end = (s == UINT64_MAX);
        if (end) {
            assert_int_equal(zmq_msg_size(&f[2]), 0);   /* (-1, empty) ends it */
        } else {
            assert_true(zmq_msg_size(&f[2]) > 0);
            assert_true(n < cap);
            seqs[n++] = s;
        }
        for (int k = 0; k < 3; ++k) {
            zmq_msg_close(&f[k]);
        }
        if (end) {
            return n;
        }
    }
}

static void test_publish_replay(void **state)
{
    kvf_kv_events_config_t c;
    kvf_kv_events_h pub;
    kvf_kv_event_t ev[5];
    void *ctx = zmq_ctx_new(), *sub, *d;
    uint64_t seqs[16];
    int timeo = 5000, n;

    (void)state;
    make_events(ev);
    assert_int_equal(kvf_kv_events_config_parse("{\"enable_kv_cache_events\": true, "
                                                "\"buffer_steps\": 3, \"topic\": \"kv\"}",
                                                "tcp://127.0.0.1:*", "tcp://127.0.0.1:*",
                                                "map", &c), KVF_OK);
    assert_int_equal(kvf_kv_events_create(&c, "CPU", &pub), KVF_OK);
    assert_non_null(strstr(kvf_kv_events_endpoint(pub), "tcp://127.0.0.1:"));
    sub = zmq_socket(ctx, ZMQ_SUB);
    zmq_setsockopt(sub, ZMQ_SUBSCRIBE, "", 0);
    zmq_setsockopt(sub, ZMQ_RCVTIMEO, &timeo, sizeof(timeo));
    assert_int_equal(zmq_connect(sub, kvf_kv_events_endpoint(pub)), 0);
    d = zmq_socket(ctx, ZMQ_DEALER);
    zmq_setsockopt(d, ZMQ_RCVTIMEO, &timeo, sizeof(timeo));
    assert_int_equal(zmq_connect(d, kvf_kv_events_replay_endpoint(pub)), 0);
    wait_batches(pub, 1);   /* sequence 0: AllBlocksCleared */
    n = replay(d, 0, seqs, 16);
    assert_int_equal(n, 1);
    assert_int_equal(seqs[0], 0);
    struct timespec ts = {0, 200 * 1000000L};   /* the SUB joins (ZeroMQ's slow joiner) */
    nanosleep(&ts, NULL);
    for (uint64_t b = 1; b <= 4; ++b) {   /* four more batches, one stored block each */
        kvf_prefix_event_t pe = {.kind = KVF_PREFIX_EV_STORED, .hash = {b, b},
                                 .tokens = toks[0], .block_size = 4};
        kvf_kv_events_push(pub, &pe);
        wait_batches(pub, b + 1);
        /* live: [topic, seq, payload]; sequence 0 may have reached the SUB too */
        char topic[8];
        uint8_t seqb[16], payload[4096];
        do {
            assert_int_equal(zmq_recv(sub, topic, sizeof(topic), 0), 2);
            assert_memory_equal(topic, "kv", 2);
            assert_int_equal(zmq_recv(sub, seqb, sizeof(seqb), 0), 8);
            assert_true(zmq_recv(sub, payload, sizeof(payload), 0) > 0);
        } while (be64(seqb) == 0);
        assert_int_equal(be64(seqb), b);
    }
    n = replay(d, 2, seqs, 16);   /* batches 2..4, all still kept */
    assert_int_equal(n, 3);
    assert_int_equal(seqs[0], 2);
    assert_int_equal(seqs[2], 4);
    n = replay(d, 0, seqs, 16);   /* a buffer of 3: 0 and 1 are gone */
    assert_int_equal(n, 3);
    assert_int_equal(seqs[0], 2);
    /* a malformed request (no delimiter, 3 bytes) is ignored; the next one is answered */
    assert_int_equal(zmq_send(d, "abc", 3, 0), 3);
    n = replay(d, 4, seqs, 16);
    assert_int_equal(n, 1);
    assert_int_equal(seqs[0], 4);
    kvf_kv_events_stats_t st;
    kvf_kv_events_get_stats(pub, &st);
    assert_int_equal(st.events, 5);
    assert_int_equal(st.replays, 4);
    zmq_close(sub);
    zmq_close(d);
    zmq_ctx_term(ctx);
    kvf_kv_events_destroy(pub);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_encode),
        cmocka_unit_test(test_chain_break),
        cmocka_unit_test(test_config),
        cmocka_unit_test(test_publish_replay),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
