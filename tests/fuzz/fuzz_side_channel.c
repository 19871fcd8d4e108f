/*
 * libFuzzer target: prefill's side channel as decode (or anyone who can
 * reach its port) talks to it. A real side-channel server (ZeroMQ REP
 * thread, transfer/channel) answers metadata requests and lease claims,
 * heartbeats and releases from a real lease table (prefill/kvf_lease), as
 * kvf-prefill wires them; the input is a script (fuzz_script.h) that sends
 * raw frames, leases requests, moves the clock, aborts and collects.
 *
 * Checked on every step, beyond "no crash, leak or UB":
 *   - every frame gets exactly one well-formed answer in time: the
 *     metadata, a lease answer, or an error reply naming why;
 *   - no lease operation is ever answered "valid" once that lease's blocks
 *     were handed back for reuse, or after it was aborted (a read that
 *     would return another request's KV);
 *   - blocks come back exactly once, and all of them once every lease has
 *     expired and waited out its quarantine.
 * Lease slot i is request "cmpl-i" with nonce FUZZ_NONCE + i (seeds carry
 * the right ones, mutations the wrong ones).
 *
 * Seeds: tests/fuzz/corpus/fuzz_side_channel (tests/fuzz/make_seeds.c).
 */
#include "fuzz_script.h"

#include "kvf_lease.h"
#include "kvf_log.h"
#include "kvf_side_channel.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_ENGINE   "prefill-fz"
#define FUZZ_SLOTS    4
#define FUZZ_NONCE    0x5eed000000000000ull
#define FUZZ_TTL_MS   1000
#define FUZZ_QUAR_MS  500

#define FUZZ_CHECK(cond)                                                                    \
    do {                                                                                    \
        if (!(cond)) {                                                                      \
            fprintf(stderr, "fuzz_side_channel: invariant failed: %s (line %d)\n", #cond,  \
                    __LINE__);                                                              \
            abort();                                                                        \
        }                                                                                   \
    } while (0)

static kvf_side_channel_server_h g_server;
static void *g_ctx, *g_req;
static _Atomic(kvf_lease_table_h) g_table;
static _Atomic uint64_t g_now;

typedef struct {
    bool     pinned;     /* added, blocks not handed back yet */
    bool     aborted;    /* reads of this lease must not count any more */
    uint32_t gen;        /* adds so far: the owner of add #gen */
} fuzz_slot_t;

static fuzz_slot_t g_slots[FUZZ_SLOTS];

/* What kvf-prefill's side-channel handler does, on the fuzz clock. */
static void fuzz_lease_op(void *arg, const char *requester, const kvf_lease_msg_t *msg,
                          uint32_t peer_timeout_ms, kvf_lease_answer_t *answer)
{
    (void)arg;
    (void)peer_timeout_ms;   /* persists across inputs: not used, to stay reproducible */
    kvf_lease_table_answer(atomic_load(&g_table), requester, msg, atomic_load(&g_now),
                           FUZZ_TTL_MS, answer);
}

static void *fuzz_owner(int slot, uint32_t gen)
{
    return (void *)(uintptr_t)(((uint64_t)(slot + 1) << 32) | gen);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    static kvf_rank_meta_t ranks[2];
    kvf_side_channel_params_t p;
    char ep[64];
    int timeout = 20000, linger = 0;   /* generous: the fuzzing host may be loaded */

    (void)argc;
    (void)argv;
    kvf_log_set_level(KVF_LOG_ERROR);
    for (int r = 0; r < 2; ++r) {
        kvf_rank_meta_t *m = &ranks[r];
        snprintf(m->engine_id, sizeof(m->engine_id), FUZZ_ENGINE);
        m->protocol_version = KVF_XFER_PROTOCOL_VERSION;
        m->tp_rank = r;
        m->tp_size = 2;
        m->block_size = m->kernel_block_size = 80;
        m->page_size = 10240;
        m->slots = 2;
        m->num_blocks = 8;
        m->kv_dtype = KVF_DTYPE_BF16;
        snprintf(m->layout_tag, sizeof(m->layout_tag), "HND");
        m->worker_addr_len = 8;
        memset(m->worker_addr, 0x40 + r, 8);
    }
    memset(&p, 0, sizeof(p));
    p.engine_id = FUZZ_ENGINE;
    p.ranks = ranks;
    p.num_ranks = 2;
    p.lease_func = fuzz_lease_op;
    FUZZ_CHECK(kvf_side_channel_server_start(&p, &g_server) == KVF_OK);
    g_ctx = zmq_ctx_new();
    g_req = zmq_socket(g_ctx, ZMQ_REQ);
    FUZZ_CHECK(g_req != NULL);
    zmq_setsockopt(g_req, ZMQ_RCVTIMEO, &timeout, sizeof(timeout));
    zmq_setsockopt(g_req, ZMQ_SNDTIMEO, &timeout, sizeof(timeout));
    zmq_setsockopt(g_req, ZMQ_LINGER, &linger, sizeof(linger));
    snprintf(ep, sizeof(ep), "tcp://127.0.0.1:%d", kvf_side_channel_server_port(g_server));
    FUZZ_CHECK(zmq_connect(g_req, ep) == 0);
    return 0;
}

static int slot_of(const char *request_id)
{
    for (int i = 0; i < FUZZ_SLOTS; ++i) {
        char id[16];
        snprintf(id, sizeof(id), "cmpl-%d", i);
        if (strcmp(request_id, id) == 0) {
            return i;
        }
    }
    return -1;
}

static void fuzz_zsend(const void *buf, size_t len, int flags)
{
    int rc;
    while (((rc = zmq_send(g_req, buf, len, flags)) < 0) && (zmq_errno() == EINTR)) {
    }
    FUZZ_CHECK(rc >= 0);
}

/* One request out, its one answer back and checked against what the server must say. */
static void fuzz_send(const uint8_t *msg, size_t len, bool two_frames)
{
    kvf_handshake_request_t req;
    kvf_handshake_reply_t reply;
    kvf_lease_answer_t answer;
    char engine[KVF_ENGINE_ID_MAX];
    zmq_msg_t rep;
    bool parsed;
    int n;

    parsed = !two_frames && (kvf_handshake_request_unpack(msg, len, &req) == KVF_OK);
    if (two_frames) {
        fuzz_zsend(msg, len / 2, ZMQ_SNDMORE);
        fuzz_zsend(msg + len / 2, len - len / 2, 0);
    } else {
        fuzz_zsend(msg, len, 0);
    }
    zmq_msg_init(&rep);
    /* libFuzzer's timer signal interrupts blocking calls: retry on EINTR */
    while (((n = zmq_msg_recv(&rep, g_req, 0)) < 0) && (zmq_errno() == EINTR)) {
    }
    if (n < 0) {
        fprintf(stderr, "fuzz_side_channel: no answer within 20 s\n");
        abort();
    }
    const uint8_t *r = zmq_msg_data(&rep);
    size_t rlen = zmq_msg_size(&rep);

    if (!parsed || (req.protocol_version != KVF_XFER_PROTOCOL_VERSION) ||
        ((req.want_engine_id[0] != '\0') && (strcmp(req.want_engine_id, FUZZ_ENGINE) != 0))) {
        /* malformed, another version or another engine: an error reply that says so */
        FUZZ_CHECK(kvf_handshake_reply_unpack(r, rlen, &reply) == KVF_OK);
        FUZZ_CHECK(!reply.accepted && (reply.error[0] != '\0'));
        FUZZ_CHECK(strcmp(reply.engine_id, FUZZ_ENGINE) == 0);
        if (parsed) {
            FUZZ_CHECK(reply.num_refusals == 1);
        }
        kvf_handshake_reply_cleanup(&reply);
    } else if (!req.has_lease) {
        FUZZ_CHECK(kvf_handshake_reply_unpack(r, rlen, &reply) == KVF_OK);
        FUZZ_CHECK(reply.accepted && (reply.num_ranks == 2));
        FUZZ_CHECK(strcmp(reply.ranks[1].engine_id, FUZZ_ENGINE) == 0);
        kvf_handshake_reply_cleanup(&reply);
    } else {
        int s = slot_of(req.lease.request_id);
        FUZZ_CHECK(kvf_lease_reply_unpack(r, rlen, engine, &answer) == KVF_OK);
        FUZZ_CHECK(strcmp(engine, FUZZ_ENGINE) == 0);
        if (answer.verdict == KVF_LEASE_VALID) {
            /* a valid answer: the lease exists, its blocks are still ours, it was not aborted */
            FUZZ_CHECK(s >= 0);
            FUZZ_CHECK(g_slots[s].pinned && !g_slots[s].aborted);
            FUZZ_CHECK(req.lease.nonce == FUZZ_NONCE + (uint64_t)s);
            FUZZ_CHECK((answer.ms_left >= 1) && (answer.ms_left <= 65535));   /* ttl <= u16 */
        } else {
            FUZZ_CHECK(answer.why[0] != '\0');
        }
    }
    zmq_msg_close(&rep);
}

static void fuzz_collect(kvf_lease_table_h t, uint64_t now)
{
    void *owners[FUZZ_SLOTS + 1];
    size_t n;

    do {
        n = kvf_lease_table_collect(t, now, owners, FUZZ_SLOTS + 1, NULL);
        for (size_t i = 0; i < n; ++i) {
            uint64_t o = (uint64_t)(uintptr_t)owners[i];
            int s = (int)(o >> 32) - 1;
            FUZZ_CHECK((s >= 0) && (s < FUZZ_SLOTS));
            FUZZ_CHECK(g_slots[s].pinned);                      /* handed back once */
            FUZZ_CHECK((uint32_t)o == g_slots[s].gen);          /* the current owner */
            g_slots[s].pinned = false;
        }
    } while (n == FUZZ_SLOTS + 1);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_reader_t rd = {data, size};
    kvf_lease_table_h t;

    FUZZ_CHECK(kvf_lease_table_create(&t) == KVF_OK);
    kvf_lease_table_set_quarantine(t, FUZZ_QUAR_MS);
    memset(g_slots, 0, sizeof(g_slots));
    atomic_store(&g_now, 1000000);
    atomic_store(&g_table, t);
    while (rd.left > 0) {
        uint8_t op = fuzz_u8(&rd) % FUZZ_OP_COUNT;
        switch (op) {
        case FUZZ_OP_SEND:
        case FUZZ_OP_SEND2: {
            size_t want = fuzz_u16(&rd), got;
            const uint8_t *msg = fuzz_bytes(&rd, want, &got);
            fuzz_send(msg, got, op == FUZZ_OP_SEND2);
            break;
        }
        case FUZZ_OP_ADD: {
            int s = fuzz_u8(&rd) % FUZZ_SLOTS;
            uint64_t ttl = fuzz_u16(&rd);
            char id[16];
            if (g_slots[s].pinned) {
                break;   /* prefill never leases one request id twice at once */
            }
            snprintf(id, sizeof(id), "cmpl-%d", s);
            g_slots[s].gen++;
            FUZZ_CHECK(kvf_lease_table_add(t, id, FUZZ_NONCE + (uint64_t)s, atomic_load(&g_now),
                                           ttl, 3, fuzz_owner(s, g_slots[s].gen)) == KVF_OK);
            g_slots[s].pinned = true;
            g_slots[s].aborted = false;
            break;
        }
        case FUZZ_OP_TICK:
            atomic_fetch_add(&g_now, fuzz_u16(&rd));
            break;
        case FUZZ_OP_ABORT: {
            int s = fuzz_u8(&rd) % FUZZ_SLOTS;
            char id[16];
            snprintf(id, sizeof(id), "cmpl-%d", s);
            if (kvf_lease_table_abort(t, id, atomic_load(&g_now))) {
                FUZZ_CHECK(g_slots[s].pinned);
                g_slots[s].aborted = true;
            }
            break;
        }
        default:
            fuzz_collect(t, atomic_load(&g_now));
            break;
        }
    }
    /* every lease expired and quarantined: every block comes back */
    fuzz_collect(t, atomic_load(&g_now) + 1000000);   /* held ones expire: quarantine */
    fuzz_collect(t, atomic_load(&g_now) + 1000000 + FUZZ_QUAR_MS);
    for (int s = 0; s < FUZZ_SLOTS; ++s) {
        FUZZ_CHECK(!g_slots[s].pinned);
    }
    FUZZ_CHECK(kvf_lease_table_pinned(t) == 0);
    atomic_store(&g_table, NULL);
    kvf_lease_table_destroy(t);
    return 0;
}
