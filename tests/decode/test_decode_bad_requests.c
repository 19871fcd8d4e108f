/*
 * kvf-decode facing malformed control messages: each gets an error reply
 * naming the problem, and the daemon keeps serving (a health probe after
 * them is answered). Includes the sequence a review found fatal: a decode
 * request with no request_id, then an abort.
 */
#include "kvf_serve.pb-c.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>
#include <cmocka.h>

static pid_t decode_pid;
static void *zctx, *sock;
static char endpoint[64];

static void send_req(const Kvf__ServeRequest *req)
{
    size_t len = kvf__serve_request__get_packed_size(req);
    uint8_t *buf = malloc(len + 1);
    kvf__serve_request__pack(req, buf);
    assert_true(zmq_send(sock, buf, len, 0) >= 0);
    free(buf);
}

/* Next reply within 10 s (fails the test otherwise). */
static Kvf__ServeReply *recv_reply(void)
{
    zmq_pollitem_t it = {.socket = sock, .events = ZMQ_POLLIN};
    zmq_msg_t m;
    Kvf__ServeReply *r;

    assert_int_equal(zmq_poll(&it, 1, 10000), 1);
    zmq_msg_init(&m);
    assert_true(zmq_msg_recv(&m, sock, 0) >= 0);
    r = kvf__serve_reply__unpack(NULL, zmq_msg_size(&m), zmq_msg_data(&m));
    zmq_msg_close(&m);
    assert_non_null(r);
    return r;
}

static void expect_error(const Kvf__ServeRequest *req, const char *needle)
{
    Kvf__ServeReply *r;
    send_req(req);
    r = recv_reply();
    assert_true(r->has_status && (r->status < 0));
    assert_non_null(r->error);
    if (strstr(r->error, needle) == NULL) {
        fail_msg("error '%s' does not mention '%s'", r->error, needle);
    }
    kvf__serve_reply__free_unpacked(r, NULL);
}

/* Decode's prefix cache takes the salt prefill got: 1..256 bytes, else refused by name. */
static void expect_salt_refused(const Kvf__ServeRequest *req, Kvf__DecodeRequest *dr)
{
    static uint8_t salt[257];

    dr->has_cache_salt = 1;
    dr->cache_salt.data = salt;
    dr->cache_salt.len = sizeof(salt);
    expect_error(req, "cache_salt of 257 bytes: 1..256");
    dr->cache_salt.len = 0;
    expect_error(req, "cache_salt of 0 bytes: 1..256");
    dr->has_cache_salt = 0;
}

static void test_malformed_decode_requests(void **state)
{
    Kvf__ServeRequest req = KVF__SERVE_REQUEST__INIT;
    Kvf__DecodeRequest dr = KVF__DECODE_REQUEST__INIT;
    Kvf__TransferParams tp = KVF__TRANSFER_PARAMS__INIT;
    Kvf__AbortRequest ar = KVF__ABORT_REQUEST__INIT;
    Kvf__HealthRequest hr = KVF__HEALTH_REQUEST__INIT;
    Kvf__BlockIdList g = KVF__BLOCK_ID_LIST__INIT, *gp = &g;
    int32_t prompt[3] = {256, 104, 105};
    Kvf__ServeReply *r;
    (void)state;

    req.body_case = KVF__SERVE_REQUEST__BODY_DECODE;
    req.decode = &dr;
    dr.n_prompt_tokens = 3;
    dr.prompt_tokens = prompt;
    expect_error(&req, "request_id");                 /* no request id at all */
    dr.request_id = (char *)"r1";
    expect_salt_refused(&req, &dr);
    expect_error(&req, "transfer params");            /* no params */
    dr.params = &tp;
    tp.engine_id = (char *)"prefill-x";
    tp.host = (char *)"127.0.0.1";
    tp.has_port = 1;
    tp.port = 70000;
    expect_error(&req, "port");
    tp.port = 1;
    expect_error(&req, "first token");
    tp.has_first_token = 1;
    tp.first_token = 5;
    tp.has_num_tokens = 1;
    tp.num_tokens = 7;
    expect_error(&req, "cover 7 tokens");
    tp.num_tokens = 3;
    expect_error(&req, "KV cache groups");
    tp.n_groups = 1;
    tp.groups = &gp;
    g.n_ids = (1u << 20) + 1;                         /* claimed, not sent: caught by count */
    g.ids = calloc(g.n_ids, sizeof(int32_t));
    expect_error(&req, "block ids");
    free(g.ids);
    g.ids = NULL;
    g.n_ids = 0;
    expect_error(&req, "lease nonce");                /* well formed, but no lease */
    tp.has_nonce = tp.has_lease_ms_left = 1;
    tp.nonce = 42;
    tp.lease_ms_left = 0xffffffffffffull;             /* ~8900 years: refused, never wraps */
    expect_error(&req, "lease_ms_left");
    tp.lease_ms_left = 20000;
    expect_error(&req, "incarnation");                /* required: it keys the handshake cache */
    tp.has_incarnation = 1;
    tp.incarnation = 0;
    expect_error(&req, "incarnation");
    {
        Kvf__SamplingParams sp = KVF__SAMPLING_PARAMS__INIT;
        tp.incarnation = 7;
        sp.has_max_tokens = 1;
        sp.max_tokens = (uint32_t)INT32_MAX - 1;      /* + 3 prompt tokens overflows an int */
        dr.sampling = &sp;
        expect_error(&req, "max_tokens + prompt length");
        /* vLLM's sampling fields are checked again here, each named with its value */
        sp.max_tokens = 8;
        sp.has_top_p = 1;
        sp.top_p = 2.0f;
        expect_error(&req, "top_p 2 must be in (0, 1]");
        sp.top_p = 0.5f;
        sp.has_repetition_penalty = 1;
        sp.repetition_penalty = 0.0f;
        expect_error(&req, "repetition_penalty 0 must be > 0");
        sp.repetition_penalty = 1.0f;
        sp.has_min_tokens = 1;
        sp.min_tokens = 9;
        expect_error(&req, "min_tokens 9 must be in [0, max_tokens = 8]");
        sp.min_tokens = 0;
        {
            int32_t stop = 1 << 20;
            sp.n_stop_token_ids = 1;
            sp.stop_token_ids = &stop;
            expect_error(&req, "stop_token_ids[0] = 1048576 is outside the vocabulary");
            sp.n_stop_token_ids = 0;
        }
        sp.has_logprobs = 1;
        sp.logprobs = 21;
        expect_error(&req, "logprobs 21 must be in [0, 20]");
        dr.sampling = NULL;
    }
    tp.has_nonce = tp.has_lease_ms_left = tp.has_incarnation = 0;

    /* a decode with no id followed by an abort: must not take the daemon down */
    dr.request_id = NULL;
    expect_error(&req, "request_id");
    req.body_case = KVF__SERVE_REQUEST__BODY_ABORT;
    req.abort = &ar;
    send_req(&req);                                   /* abort of nothing: no reply */
    ar.request_id = (char *)"never-seen";
    send_req(&req);

    req.body_case = KVF__SERVE_REQUEST__BODY_HEALTH;
    req.health = &hr;
    send_req(&req);
    r = recv_reply();
    assert_string_equal(r->request_id, "health");
    assert_non_null(r->health);
    assert_string_equal(r->health->role, "decode");
    assert_true(r->health->free_pages == r->health->total_pages);
    kvf__serve_reply__free_unpacked(r, NULL);

    /* garbage bytes: an error reply, daemon alive */
    assert_true(zmq_send(sock, "\xff\xfe\x01garbage", 10, 0) >= 0);
    r = recv_reply();
    assert_true(r->status < 0);
    kvf__serve_reply__free_unpacked(r, NULL);
    assert_int_equal(waitpid(decode_pid, NULL, WNOHANG), 0);
}

static void fill_decode(Kvf__DecodeRequest *dr, Kvf__TransferParams *tp, Kvf__BlockIdList **gp,
                        Kvf__SamplingParams *sp, const char *id, int32_t *prompt, int n)
{
    dr->request_id = (char *)id;
    dr->n_prompt_tokens = (size_t)n;
    dr->prompt_tokens = prompt;
    dr->params = tp;
    dr->sampling = sp;
    sp->has_max_tokens = sp->has_ignore_eos = 1;
    sp->max_tokens = 4;
    sp->ignore_eos = 1;
    tp->engine_id = (char *)"prefill-gone";      /* nobody answers there: recompute */
    tp->host = (char *)"127.0.0.1";
    tp->has_port = tp->has_first_token = tp->has_num_tokens = tp->has_lease_ms_left = 1;
    tp->has_nonce = tp->has_incarnation = 1;
    tp->nonce = 42;
    tp->incarnation = 0x1234;
    tp->port = 9;
    tp->first_token = 104;
    tp->num_tokens = (uint64_t)n;
    tp->lease_ms_left = 20000;
    tp->n_groups = 3;
    tp->groups = gp;
}

/* A request with no id must never be kept in the wait queue (an abort would read its id). */
static void test_waiting_queue_and_bad_requests(void **state)
{
    Kvf__ServeRequest req = KVF__SERVE_REQUEST__INIT;
    Kvf__DecodeRequest d1 = KVF__DECODE_REQUEST__INIT, d2 = KVF__DECODE_REQUEST__INIT;
    Kvf__TransferParams t1 = KVF__TRANSFER_PARAMS__INIT, t2 = KVF__TRANSFER_PARAMS__INIT;
    Kvf__SamplingParams s1 = KVF__SAMPLING_PARAMS__INIT, s2 = KVF__SAMPLING_PARAMS__INIT;
    Kvf__BlockIdList g = KVF__BLOCK_ID_LIST__INIT;
    Kvf__BlockIdList *gp[3] = {&g, &g, &g};
    Kvf__AbortRequest ar = KVF__ABORT_REQUEST__INIT;
    Kvf__HealthRequest hr = KVF__HEALTH_REQUEST__INIT;
    static int32_t prompt[700];
    Kvf__ServeReply *r;
    (void)state;

    for (int i = 0; i < 700; ++i) {
        prompt[i] = 97 + (i % 26);
    }
    /* r1: 700 tokens = 9 attention + 2 Mamba blocks of 16, recomputed here (pull fails) */
    fill_decode(&d1, &t1, gp, &s1, "r1", prompt, 700);
    s1.max_tokens = 2000;
    req.body_case = KVF__SERVE_REQUEST__BODY_DECODE;
    req.decode = &d1;
    send_req(&req);
    /* until r1 holds its blocks; health is answered at once by the channel's
     * own thread, so poll against a deadline, not a count */
    struct timespec t0, t1n;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        Kvf__ServeRequest h = KVF__SERVE_REQUEST__INIT;
        h.body_case = KVF__SERVE_REQUEST__BODY_HEALTH;
        h.health = &hr;
        send_req(&h);
        r = recv_reply();
        assert_non_null(r->health);
        if (r->health->free_pages < r->health->total_pages) {
            kvf__serve_reply__free_unpacked(r, NULL);
            break;
        }
        kvf__serve_reply__free_unpacked(r, NULL);
        clock_gettime(CLOCK_MONOTONIC, &t1n);
        assert_true(t1n.tv_sec - t0.tv_sec < 20);
        struct timespec nap = {0, 2000000};
        nanosleep(&nap, NULL);   /* poll interval, not a wait for an outcome */
    }
    /* r2: needs 11 blocks, 5 are free: it waits in line */
    fill_decode(&d2, &t2, gp, &s2, "r2", prompt, 700);
    req.decode = &d2;
    send_req(&req);
    /* a request with no id while r2 waits: refused, not queued */
    d2.request_id = NULL;
    expect_error(&req, "request_id");
    req.body_case = KVF__SERVE_REQUEST__BODY_ABORT;
    req.abort = &ar;
    ar.request_id = (char *)"x";
    send_req(&req);                                    /* walks the wait queue */
    ar.request_id = (char *)"r2";
    send_req(&req);
    for (;;) {                                         /* r1 streams nothing (not stream), r2 aborted */
        r = recv_reply();
        if ((r->request_id != NULL) && (strcmp(r->request_id, "r2") == 0)) {
            assert_true(r->status < 0);
            assert_non_null(strstr(r->error, "aborted"));
            kvf__serve_reply__free_unpacked(r, NULL);
            break;
        }
        kvf__serve_reply__free_unpacked(r, NULL);
    }
    ar.request_id = (char *)"r1";
    send_req(&req);
    req.body_case = KVF__SERVE_REQUEST__BODY_HEALTH;
    req.health = &hr;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {                                          /* r1's abort reply, then health */
        send_req(&req);
        do {
            r = recv_reply();
            if (r->health == NULL) {
                kvf__serve_reply__free_unpacked(r, NULL);
            }
        } while (r->health == NULL);
        clock_gettime(CLOCK_MONOTONIC, &t1n);
        if ((r->health->free_pages == r->health->total_pages) || (t1n.tv_sec - t0.tv_sec >= 20)) {
            break;
        }
        kvf__serve_reply__free_unpacked(r, NULL);
        struct timespec nap = {0, 2000000};
        nanosleep(&nap, NULL);   /* poll interval */
    }
    assert_true(r->health->free_pages == r->health->total_pages);
    assert_int_equal(r->health->running, 0);
    kvf__serve_reply__free_unpacked(r, NULL);
    assert_int_equal(waitpid(decode_pid, NULL, WNOHANG), 0);
}

/* A loopback port free now (bound to 0, read back, closed); 0 when none could be had. */
static int free_port(void)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM, 0), port = 0;

    if ((fd >= 0) && (bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0) &&
        (getsockname(fd, (struct sockaddr *)&a, &len) == 0)) {
        port = ntohs(a.sin_port);
    }
    if (fd >= 0) {
        close(fd);
    }
    return port;
}

/* Polls until kvf-decode (decode_pid) listens on @a port (1) or has exited (0: e.g. another
 * process took the port between free_port() and its bind), at most about 60 s (-1). */
static int wait_listening(int port)
{
    const struct timespec nap = {0, 20 * 1000 * 1000};

    for (int i = 0; i < 3000; ++i) {
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        int fd = socket(AF_INET, SOCK_STREAM, 0), ok;

        if (waitpid(decode_pid, NULL, WNOHANG) == decode_pid) {
            return 0;
        }
        ok = (fd >= 0) && (connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0);
        if (fd >= 0) {
            close(fd);
        }
        if (ok) {
            return 1;
        }
        nanosleep(&nap, NULL);   /* poll interval */
    }
    return -1;
}

static int setup(void **state)
{
    const char *bin = getenv("KVF_BIN");
    char model[512], cmd[2048], kvf[512], dec[512];
    int up = 0;
    (void)state;

    if (bin == NULL) {
        bin = KVF_BINARY_DIR "/bin";
    }
    snprintf(model, sizeof(model), "%s/../e2e-models/test-decode-bad-%d", bin, (int)getpid());
    snprintf(kvf, sizeof(kvf), "%s/kvf", bin);
    snprintf(dec, sizeof(dec), "%s/kvf-decode", bin);
    snprintf(cmd, sizeof(cmd), "'%s' mkmodel --config '%s/tests/data/models/tiny-hybrid.config.json'"
             " --out '%s' >/dev/null", kvf, KVF_SOURCE_DIR, model);
    if (system(cmd) != 0) {
        return -1;
    }
    /* a free port, and another if a concurrent test took it before kvf-decode bound it */
    for (int attempt = 0; (attempt < 5) && (up == 0); ++attempt) {
        int port = free_port();
        if (port == 0) {
            return -1;
        }
        snprintf(endpoint, sizeof(endpoint), "tcp://127.0.0.1:%d", port);
        decode_pid = fork();
        if (decode_pid == 0) {
            execl(dec, dec, "--model", model, "--listen", endpoint, "--num-blocks", "16",
                  "--block-size", "16", "--load-failure", "recompute", "--xfer-timeout",
                  "300ms", "--insecure", (char *)NULL);
            _exit(127);
        }
        up = wait_listening(port);
    }
    if (up != 1) {
        return -1;
    }
    zctx = zmq_ctx_new();
    sock = zmq_socket(zctx, ZMQ_DEALER);
    int linger = 0;
    if ((sock == NULL) || (zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof(linger)) != 0)) {
        return -1;
    }
    return zmq_connect(sock, endpoint);
}

static int teardown(void **state)
{
    (void)state;
    zmq_close(sock);
    zmq_ctx_term(zctx);
    kill(decode_pid, SIGTERM);
    waitpid(decode_pid, NULL, 0);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_malformed_decode_requests),
        cmocka_unit_test(test_waiting_queue_and_bad_requests),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
