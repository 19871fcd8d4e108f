/*
 * libFuzzer target: the control messages both daemons receive from the
 * proxy (or from anything that reaches their ROUTER port). A real serving
 * control channel (transfer/channel/kvf_serve_channel: ROUTER, I/O thread,
 * inproc hand-off to the leader) receives each frame from a DEALER; the
 * leader side runs the daemon's own checks, exactly the code kvf-decode
 * (decode/kvf_decode_check.c: request id, prompt, sampling, the transfer
 * params through the one decoder, check_peer) and kvf-prefill
 * (prefill/kvf_prefill_check.c) run before touching any state, and answers
 * as they do.
 *
 * Input: one role byte (even: decode, odd: prefill), then a script
 * (fuzz_script.h) of send / send2 frames; other ops are no-ops. Health
 * probes are answered by the I/O thread from a snapshot, as in the daemons.
 * Checked beyond "no crash, leak or UB": every frame gets exactly one
 * well-formed ServeReply in time; an error reply says why; an accepted
 * decode request's params cover its prompt and carry a lease.
 *
 * Seeds: tests/fuzz/corpus/fuzz_serve_control (tests/fuzz/make_seeds.c).
 */
#include "fuzz_script.h"

#include "kvf_decode_check.h"
#include "kvf_log.h"
#include "kvf_prefill_check.h"
#include "kvf_serve_channel.h"
#include "kvf_time.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(cond)                                                                     \
    do {                                                                                     \
        if (!(cond)) {                                                                       \
            fprintf(stderr, "fuzz_serve_control: invariant failed: %s (line %d)\n", #cond,  \
                    __LINE__);                                                               \
            abort();                                                                         \
        }                                                                                    \
    } while (0)

#define FUZZ_REPLY_WAIT_NS (20ull * 1000000000ull)   /* generous: the host may be loaded */

static kvf_serve_server_h g_srv;
static void *g_ctx, *g_dealer;
static char g_path[64];

static void fuzz_cleanup(void)
{
    unlink(g_path);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    char ep[80];
    int linger = 0;

    (void)argc;
    (void)argv;
    kvf_log_set_level(KVF_LOG_ERROR);
    snprintf(g_path, sizeof(g_path), "/tmp/kvf-fuzz-serve-%d", (int)getpid());
    snprintf(ep, sizeof(ep), "ipc://%s", g_path);
    FUZZ_CHECK(kvf_serve_server_create(ep, &g_srv) == KVF_OK);
    atexit(fuzz_cleanup);
    Kvf__HealthReply h = KVF__HEALTH_REPLY__INIT;
    h.role = (char *)"decode";
    FUZZ_CHECK(kvf_serve_server_set_health(g_srv, &h) == KVF_OK);
    g_ctx = zmq_ctx_new();
    g_dealer = zmq_socket(g_ctx, ZMQ_DEALER);
    FUZZ_CHECK(g_dealer != NULL);
    zmq_setsockopt(g_dealer, ZMQ_LINGER, &linger, sizeof(linger));
    zmq_setsockopt(g_dealer, ZMQ_ROUTING_ID, "fuzz-proxy", 10);
    FUZZ_CHECK(zmq_connect(g_dealer, ep) == 0);
    return 0;
}

/* The daemon's leader: check the request as kvf-decode / kvf-prefill do, answer once. */
static void fuzz_leader(bool decode, const kvf_serve_peer_t *peer, Kvf__ServeRequest *req)
{
    kvf_xfer_params_msg_t xp;
    Kvf__ServeReply reply = KVF__SERVE_REPLY__INIT;
    Kvf__HealthReply h = KVF__HEALTH_REPLY__INIT;
    char err[512] = "";
    kvf_status_t st = KVF_OK;
    const char *rid = "";

    switch (req->body_case) {
    case KVF__SERVE_REQUEST__BODY_DECODE:
        rid = req->decode->request_id;
        if (!decode) {
            st = KVF_ERR_UNSUPPORTED;
            snprintf(err, sizeof(err), "a prefill instance does not decode");
            break;
        }
        st = kvf_decode_request_check(req->decode, &xp, err, sizeof(err));
        if (st == KVF_OK) {
            FUZZ_CHECK(xp.num_tokens == (int64_t)req->decode->n_prompt_tokens);
            FUZZ_CHECK(xp.has_lease && (xp.num_groups >= 1));
            FUZZ_CHECK(strlen(rid) >= 1 && strlen(rid) < KVF_DC_ID_MAX);
            kvf_xfer_params_msg_cleanup(&xp);
        }
        break;
    case KVF__SERVE_REQUEST__BODY_PREFILL:
        rid = req->prefill->request_id;
        if (decode) {
            st = KVF_ERR_UNSUPPORTED;
            snprintf(err, sizeof(err), "a decode instance does not prefill");
            break;
        }
        st = kvf_prefill_request_check(req->prefill, err, sizeof(err));
        if (st == KVF_OK) {
            FUZZ_CHECK((req->prefill->n_prompt_tokens >= 1) && (strlen(rid) >= 1));
        }
        break;
    case KVF__SERVE_REQUEST__BODY_CHECK_PEER:
        rid = req->check_peer->request_id;
        if (!decode) {
            st = KVF_ERR_UNSUPPORTED;
            snprintf(err, sizeof(err), "a prefill instance does not pull");
            break;
        }
        st = kvf_decode_check_peer_check(req->check_peer, err, sizeof(err));
        break;
    case KVF__SERVE_REQUEST__BODY_ABORT:
        rid = req->abort->request_id;
        break;
    case KVF__SERVE_REQUEST__BODY_HEALTH:
        h.role = (char *)(decode ? "decode" : "prefill");
        reply.request_id = (char *)"health";
        reply.health = &h;
        reply.has_done = reply.done = 1;
        FUZZ_CHECK(kvf_serve_server_reply(g_srv, peer, &reply) == KVF_OK);
        return;
    default:
        FUZZ_CHECK(!"the I/O thread forwards only requests with a body");
    }
    if (st != KVF_OK) {
        FUZZ_CHECK(err[0] != '\0');   /* every refusal says why */
    }
    FUZZ_CHECK(kvf_serve_server_reply_error(g_srv, peer, (rid != NULL) ? rid : "", st,
                                            (st != KVF_OK) ? err : NULL) == KVF_OK);
}

/* libFuzzer's timer signal interrupts blocking calls: retry on EINTR. */
static void fuzz_zsend(const void *buf, size_t len, int flags)
{
    int rc;
    while (((rc = zmq_send(g_dealer, buf, len, flags)) < 0) && (zmq_errno() == EINTR)) {
    }
    FUZZ_CHECK(rc >= 0);
}

/* One frame (or two) in; exactly one ServeReply back, checked. */
static void fuzz_exchange(bool decode, const uint8_t *msg, size_t len, bool two_frames)
{
    Kvf__ServeRequest *sent = NULL;
    uint64_t deadline = kvf_time_now_ns() + FUZZ_REPLY_WAIT_NS;
    zmq_msg_t rep;
    Kvf__ServeReply *r;
    int spins = 0, rc;

    if (!two_frames) {
        sent = kvf__serve_request__unpack(NULL, len, msg);
    }
    if (two_frames) {
        fuzz_zsend(msg, len / 2, ZMQ_SNDMORE);
        fuzz_zsend(msg + len / 2, len - len / 2, 0);
    } else {
        fuzz_zsend(msg, len, 0);
    }
    for (;;) {
        zmq_pollitem_t it = {.socket = g_dealer, .events = ZMQ_POLLIN};
        kvf_serve_peer_t peer;
        Kvf__ServeRequest *req;
        int wait = (spins++ < 2000) ? 0 : 1;   /* spin first: an answer takes microseconds */

        if (kvf_serve_server_recv(g_srv, 0, &peer, &req) == KVF_OK) {
            FUZZ_CHECK((peer.len == 10) && (memcmp(peer.id, "fuzz-proxy", 10) == 0));
            fuzz_leader(decode, &peer, req);
            kvf__serve_request__free_unpacked(req, NULL);
        }
        if (zmq_poll(&it, 1, wait) == 1) {
            break;
        }
        if (kvf_time_now_ns() > deadline) {
            fprintf(stderr, "fuzz_serve_control: no reply within 20 s\n");
            abort();
        }
    }
    zmq_msg_init(&rep);
    while ((rc = zmq_msg_recv(&rep, g_dealer, 0)) < 0) {
        FUZZ_CHECK(zmq_errno() == EINTR);
    }
    r = kvf__serve_reply__unpack(NULL, zmq_msg_size(&rep), zmq_msg_data(&rep));
    zmq_msg_close(&rep);
    FUZZ_CHECK(r != NULL);
    FUZZ_CHECK(r->has_done && r->done);
    if ((sent == NULL) || (sent->body_case == KVF__SERVE_REQUEST__BODY__NOT_SET)) {
        FUZZ_CHECK(r->has_status && (r->status == KVF_ERR_PARSE) && (r->error != NULL));
    } else if (sent->body_case == KVF__SERVE_REQUEST__BODY_HEALTH) {
        FUZZ_CHECK((r->health != NULL) && (r->request_id != NULL));
        FUZZ_CHECK(strcmp(r->request_id, "health") == 0);
    } else if (r->has_status && (r->status != KVF_OK)) {
        FUZZ_CHECK((r->error != NULL) && (r->error[0] != '\0'));
    }
    kvf__serve_reply__free_unpacked(r, NULL);
    if (sent != NULL) {
        kvf__serve_request__free_unpacked(sent, NULL);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_reader_t rd = {data, size};
    bool decode = (fuzz_u8(&rd) % 2) == 0;

    while (rd.left > 0) {
        uint8_t op = fuzz_u8(&rd) % FUZZ_OP_COUNT;
        if ((op == FUZZ_OP_SEND) || (op == FUZZ_OP_SEND2)) {
            size_t want = fuzz_u16(&rd), got;
            const uint8_t *msg = fuzz_bytes(&rd, want, &got);
            fuzz_exchange(decode, msg, got, op == FUZZ_OP_SEND2);
        }
    }
    return 0;
}
