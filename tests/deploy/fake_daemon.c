/*
 * A stand-in for kvf-prefill and kvf-decode that speaks the serving
 * protocol (proto/kvf_serve.proto) without a model, so the proxy and the
 * deploy scripts can be tested on their own. The role comes from the
 * program name (a link named kvf-prefill or kvf-decode) or --role.
 *
 * Deterministic output, easy to predict in a test: completion token i is
 * prompt[i % n]. Prefill answers the first one (prompt[0]); decode streams
 * the rest one reply per token, --fake-token-delay-ms apart, then a final
 * reply with done=true and TransferStats {bytes = 1000 * n, descriptors =
 * n, reads = tp, handshake_ms = 1.5 on the first request else 0,
 * transfer_ms = 0.25}.
 *
 * Known delays, for load-generator tests: --fake-prefill-delay-ms holds
 * each prefill answer that long (answers are queued, so requests overlap);
 * --fake-first-decode-delay-ms is the gap before decode's first reply
 * (default: the token delay), standing in for the KV pull.
 *
 * ServeTiming (the TTFT breakdown): prefill reports queue 0 and compute =
 * its delay; decode's first reply reports queue/alloc/handshake/posting/
 * post-ops 0, wire = half the first-decode delay, first step = the other
 * half, total = the delay.
 *
 * Faults (--fake-mode): normal, fail-prefill (status -40 with a message),
 * fail-decode (status -30, a handshake refusal), hang-decode (accept the
 * request, never answer), no-health (never answer health probes),
 * refuse-check (decode: refuse the proxy's compatibility check, as a
 * decode with another KV dtype would), cannot-serve (health answers with
 * cannot_serve set, as a daemon whose TP world broke would).
 * Every abort received is logged as "fake: abort <request_id>" on stderr.
 * Unknown flags (the real daemons' --model, --num-blocks, ...) are ignored.
 */
#include "kvf_serve.pb-c.h"
#include "kvf_zmq.h"

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#define FAKE_MAX_STREAMS 4096   /* test_proxy_many holds 2000 streams at once */
#define FAKE_MAX_PENDING 256

/* A prefill answer waiting for its --fake-prefill-delay-ms. */
typedef struct {
    bool      used;
    zmq_msg_t identity;
    uint8_t  *buf;
    size_t    len;
    int64_t   due_ms;
} fake_pending_t;

typedef struct {
    bool     used;
    char     request_id[128];
    zmq_msg_t identity;
    int32_t *prompt;
    int      n_prompt;
    uint32_t max_tokens;
    uint32_t sent;          /* tokens sent so far, counting prefill's first */
    int64_t  next_ms;
    bool     hang;
    bool     timing_sent;
} fake_stream_t;

static volatile sig_atomic_t fake_stop;
static const char *fake_role = "prefill";
static const char *fake_engine = "fake";
static const char *fake_mode = "normal";
static int fake_tp = 1;
static int fake_delay_ms = 5;
static int fake_prefill_delay_ms = 0;
static int fake_first_decode_delay_ms = -1;   /* -1: fake_delay_ms */
static fake_pending_t fake_pending[FAKE_MAX_PENDING];
static int fake_side_port = 0;
static int fake_requests;
static fake_stream_t fake_streams[FAKE_MAX_STREAMS];
static int fake_lost;   /* replies the socket refused (peer gone) */

static void fake_on_signal(int sig)
{
    (void)sig;
    fake_stop = 1;
}

static int64_t fake_now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void fake_send(void *sock, zmq_msg_t *identity, const Kvf__ServeReply *r)
{
    size_t len = kvf__serve_reply__get_packed_size(r);
    uint8_t *buf = malloc(len ? len : 1);
    zmq_msg_t id;

    if (buf == NULL) {
        return;
    }
    kvf__serve_reply__pack(r, buf);
    zmq_msg_init(&id);
    zmq_msg_copy(&id, identity);
    if ((zmq_msg_send(&id, sock, ZMQ_SNDMORE) < 0) || (zmq_send(sock, buf, len, 0) < 0)) {
        fake_lost++;
        fprintf(stderr, "fake: reply for %s lost: %s\n", r->request_id ? r->request_id : "",
                zmq_strerror(zmq_errno()));
        zmq_msg_close(&id);
    }
    free(buf);
}

/* Queue @a r to go out at now + --fake-prefill-delay-ms (at once when 0 or the queue is full). */
static void fake_send_later(void *sock, zmq_msg_t *identity, const Kvf__ServeReply *r)
{
    fake_pending_t *q = NULL;

    for (int i = 0; (fake_prefill_delay_ms > 0) && (i < FAKE_MAX_PENDING); ++i) {
        if (!fake_pending[i].used) {
            q = &fake_pending[i];
            break;
        }
    }
    if (q == NULL) {
        fake_send(sock, identity, r);
        return;
    }
    q->len = kvf__serve_reply__get_packed_size(r);
    q->buf = malloc(q->len ? q->len : 1);
    if (q->buf == NULL) {
        return;
    }
    kvf__serve_reply__pack(r, q->buf);
    zmq_msg_init(&q->identity);
    zmq_msg_copy(&q->identity, identity);
    q->due_ms = fake_now_ms() + fake_prefill_delay_ms;
    q->used = true;
}

static void fake_flush_pending(void *sock)
{
    int64_t now = fake_now_ms();

    for (int i = 0; i < FAKE_MAX_PENDING; ++i) {
        fake_pending_t *q = &fake_pending[i];
        if (!q->used || (now < q->due_ms)) {
            continue;
        }
        zmq_msg_send(&q->identity, sock, ZMQ_SNDMORE);
        zmq_send(sock, q->buf, q->len, 0);
        free(q->buf);
        q->used = false;
    }
}

static int fake_running(void)
{
    int n = 0;

    for (int i = 0; i < FAKE_MAX_STREAMS; ++i) {
        n += fake_streams[i].used;
    }
    return n;
}

static void fake_health(void *sock, zmq_msg_t *identity)
{
    Kvf__ServeReply r = KVF__SERVE_REPLY__INIT;
    Kvf__HealthReply h = KVF__HEALTH_REPLY__INIT;

    if (strcmp(fake_mode, "no-health") == 0) {
        return;
    }
    h.role = (char *)fake_role;
    h.engine_id = (char *)fake_engine;
    h.has_tp_size = h.has_free_pages = h.has_total_pages = h.has_running = true;
    h.tp_size = (uint32_t)fake_tp;
    h.total_pages = 128;
    h.running = (uint32_t)fake_running();
    h.free_pages = 128 - 4 * h.running;
    h.has_block_size = true;
    h.block_size = 16;
    h.has_incarnation = true;
    h.incarnation = (uint64_t)getpid();
    if (strcmp(fake_role, "prefill") == 0) {
        h.side_host = (char *)"127.0.0.1";
        h.has_side_port = true;
        h.side_port = (uint32_t)((fake_side_port > 0) ? fake_side_port : 1);
    }
    if (strcmp(fake_mode, "cannot-serve") == 0) {
        h.cannot_serve = (char *)"TP barrier 'fake step' timed out after 60000 ms";
    }
    r.request_id = (char *)"health";
    r.has_status = true;
    r.health = &h;
    fake_send(sock, identity, &r);
}

/* Decode: the proxy's compatibility check; refused in --fake-mode refuse-check. */
static void fake_check_peer(void *sock, zmq_msg_t *identity, const Kvf__CheckPeerRequest *c)
{
    Kvf__ServeReply r = KVF__SERVE_REPLY__INIT;

    fprintf(stderr, "fake: check-peer %s %s:%u\n", c->engine_id ? c->engine_id : "",
            c->host ? c->host : "", c->port);
    r.request_id = c->request_id;
    r.has_status = r.has_done = r.done = true;
    if (strcmp(fake_mode, "refuse-check") == 0) {
        r.status = -30;
        r.error = (char *)"handshake refused: kv_dtype prefill=fp32 decode=bf16: fake refusal";
    }
    fake_send(sock, identity, &r);
}

static void fake_prefill(void *sock, zmq_msg_t *identity, const Kvf__PrefillRequest *p)
{
    Kvf__ServeReply r = KVF__SERVE_REPLY__INIT;
    Kvf__TransferParams tp = KVF__TRANSFER_PARAMS__INIT;
    Kvf__ServeTiming tm = KVF__SERVE_TIMING__INIT;

    r.request_id = p->request_id;
    r.has_status = true;
    if (strcmp(fake_mode, "fail-prefill") == 0) {
        r.status = -40;
        r.error = (char *)"fake prefill failure";
        fake_send(sock, identity, &r);
        return;
    }
    if (p->n_prompt_tokens == 0) {
        r.status = -2;
        r.error = (char *)"empty prompt";
        fake_send(sock, identity, &r);
        return;
    }
    tp.engine_id = (char *)fake_engine;
    tp.host = (char *)"127.0.0.1";
    tp.has_port = true;
    tp.port = (uint32_t)fake_side_port;
    tp.has_num_tokens = true;
    tp.num_tokens = p->n_prompt_tokens;
    tp.has_first_token = true;
    tp.first_token = p->prompt_tokens[0];
    tp.request_id = p->request_id;
    r.params = &tp;
    r.has_prefill_ms = true;
    r.prefill_ms = 2.0;
    tm.has_total_ms = tm.has_queue_ms = tm.has_compute_ms = true;
    tm.total_ms = tm.compute_ms = fake_prefill_delay_ms;
    r.timing = &tm;
    fake_send_later(sock, identity, &r);
}

static void fake_decode(void *sock, zmq_msg_t *identity, const Kvf__DecodeRequest *d)
{
    Kvf__ServeReply r = KVF__SERVE_REPLY__INIT;
    fake_stream_t *s = NULL;

    r.request_id = d->request_id;
    r.has_status = true;
    if (strcmp(fake_mode, "fail-decode") == 0) {
        r.status = -30;
        r.error = (char *)"handshake refused: block_size prefill=32 decode=16: fake";
        fake_send(sock, identity, &r);
        return;
    }
    if ((d->params == NULL) || (d->n_prompt_tokens == 0) ||
        (d->params->first_token != d->prompt_tokens[0])) {
        r.status = -2;
        r.error = (char *)"bad transfer params";
        fake_send(sock, identity, &r);
        return;
    }
    for (int i = 0; i < FAKE_MAX_STREAMS; ++i) {
        if (!fake_streams[i].used) {
            s = &fake_streams[i];
            break;
        }
    }
    if (s == NULL) {
        r.status = -9;
        r.error = (char *)"too many streams";
        fake_send(sock, identity, &r);
        return;
    }
    memset(s, 0, sizeof(*s));
    s->used = true;
    snprintf(s->request_id, sizeof(s->request_id), "%s", d->request_id);
    zmq_msg_init(&s->identity);
    zmq_msg_copy(&s->identity, identity);
    s->n_prompt = (int)d->n_prompt_tokens;
    s->prompt = malloc(sizeof(int32_t) * d->n_prompt_tokens);
    memcpy(s->prompt, d->prompt_tokens, sizeof(int32_t) * d->n_prompt_tokens);
    s->max_tokens = (d->sampling != NULL && d->sampling->has_max_tokens) ?
                    d->sampling->max_tokens : 16;
    s->sent = 1;
    s->next_ms = fake_now_ms() +
                 (fake_first_decode_delay_ms >= 0 ? fake_first_decode_delay_ms : fake_delay_ms);
    s->hang = (strcmp(fake_mode, "hang-decode") == 0);
}

static void fake_stream_free(fake_stream_t *s)
{
    free(s->prompt);
    zmq_msg_close(&s->identity);
    s->used = false;
}

static void fake_step(void *sock)
{
    int64_t now = fake_now_ms();

    for (int i = 0; i < FAKE_MAX_STREAMS; ++i) {
        fake_stream_t *s = &fake_streams[i];
        Kvf__ServeReply r = KVF__SERVE_REPLY__INIT;
        Kvf__TransferStats st = KVF__TRANSFER_STATS__INIT;
        Kvf__ServeTiming tm = KVF__SERVE_TIMING__INIT;
        int32_t tok;

        if (!s->used || s->hang || (now < s->next_ms)) {
            continue;
        }
        r.request_id = s->request_id;
        r.has_status = true;
        if (!s->timing_sent) {
            double first = (fake_first_decode_delay_ms >= 0) ? fake_first_decode_delay_ms :
                                                               fake_delay_ms;
            tm.has_total_ms = tm.has_queue_ms = tm.has_alloc_ms = tm.has_handshake_ms = true;
            tm.has_posting_ms = tm.has_wire_ms = tm.has_post_ops_ms = tm.has_first_step_ms = true;
            tm.total_ms = first;
            tm.wire_ms = first / 2;
            tm.first_step_ms = first / 2;
            r.timing = &tm;
            s->timing_sent = true;
        }
        if (s->sent < s->max_tokens) {
            tok = s->prompt[s->sent % (uint32_t)s->n_prompt];
            r.n_tokens = 1;
            r.tokens = &tok;
            s->sent++;
        }
        if (s->sent >= s->max_tokens) {
            r.has_done = true;
            r.done = true;
            r.finish_reason = (char *)"length";
            st.has_bytes = st.has_descriptors = st.has_reads = true;
            st.has_handshake_ms = st.has_transfer_ms = st.has_recomputed = true;
            st.bytes = 1000u * (uint64_t)s->n_prompt;
            st.descriptors = (uint64_t)s->n_prompt;
            st.reads = (uint32_t)fake_tp;
            st.handshake_ms = (fake_requests++ == 0) ? 1.5 : 0.0;
            st.transfer_ms = 0.25;
            r.stats = &st;
        }
        fake_send(sock, &s->identity, &r);
        if (r.done) {
            fake_stream_free(s);
        } else {
            s->next_ms = now + fake_delay_ms;
        }
    }
}

static void fake_abort(const Kvf__AbortRequest *a)
{
    fprintf(stderr, "fake: abort %s\n", a->request_id ? a->request_id : "");
    for (int i = 0; i < FAKE_MAX_STREAMS; ++i) {
        if (fake_streams[i].used && (strcmp(fake_streams[i].request_id, a->request_id) == 0)) {
            fake_stream_free(&fake_streams[i]);
        }
    }
}

/* Every serve request waiting on @sock, answered by its kind; the last frame is the body. */
static void fake_serve_waiting(void *sock)
{
    while (!fake_stop) {
        zmq_msg_t identity, body;
        Kvf__ServeRequest *req;

        zmq_msg_init(&identity);
        if (zmq_msg_recv(&identity, sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&identity);
            break;
        }
        zmq_msg_init(&body);
        zmq_msg_recv(&body, sock, 0);
        while (zmq_msg_more(&body)) {   /* keep the last frame */
            zmq_msg_close(&body);
            zmq_msg_init(&body);
            zmq_msg_recv(&body, sock, 0);
        }
        req = kvf__serve_request__unpack(NULL, zmq_msg_size(&body), zmq_msg_data(&body));
        if (req != NULL) {
            switch (req->body_case) {
            case KVF__SERVE_REQUEST__BODY_HEALTH:
                fake_health(sock, &identity);
                break;
            case KVF__SERVE_REQUEST__BODY_PREFILL:
                fake_prefill(sock, &identity, req->prefill);
                break;
            case KVF__SERVE_REQUEST__BODY_DECODE:
                fake_decode(sock, &identity, req->decode);
                break;
            case KVF__SERVE_REQUEST__BODY_ABORT:
                fake_abort(req->abort);
                break;
            case KVF__SERVE_REQUEST__BODY_CHECK_PEER:
                fake_check_peer(sock, &identity, req->check_peer);
                break;
            default:
                break;
            }
            kvf__serve_request__free_unpacked(req, NULL);
        }
        zmq_msg_close(&body);
        zmq_msg_close(&identity);
    }
}

int main(int argc, char **argv)
{
    const char *listen = NULL;
    kvf_zmq_auth_config_t auth = {.keys_dir = NULL, .key_id = NULL, .insecure = false};
    /* the real daemons' send queue: at the default 1000 a burst of replies to a busy
     * proxy was dropped by the ROUTER, and those streams timed out */
    const kvf_zmq_opt_t opts[] = {{ZMQ_LINGER, 0}, {ZMQ_SNDHWM, KVF_ZMQ_SERVE_HWM},
                                   {ZMQ_ROUTER_MANDATORY, 1}};
    const char *base = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : argv[0];
    void *ctx, *sock;

    if (strstr(base, "decode") != NULL) {
        fake_role = "decode";
    }
    for (int i = 1; i + 1 < argc; ++i) {
        if (strcmp(argv[i], "--listen") == 0) {
            listen = argv[++i];
        } else if (strcmp(argv[i], "--role") == 0) {
            fake_role = argv[++i];
        } else if (strcmp(argv[i], "--engine-id") == 0) {
            fake_engine = argv[++i];
        } else if (strcmp(argv[i], "--tp") == 0) {
            fake_tp = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--side-port") == 0) {
            fake_side_port = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--keys") == 0) {   /* as the real daemons take them */
            auth.keys_dir = argv[++i];
        } else if (strcmp(argv[i], "--key-id") == 0) {
            auth.key_id = argv[++i];
        } else if (strcmp(argv[i], "--fake-mode") == 0) {
            fake_mode = argv[++i];
        } else if (strcmp(argv[i], "--fake-token-delay-ms") == 0) {
            fake_delay_ms = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--fake-prefill-delay-ms") == 0) {
            fake_prefill_delay_ms = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--fake-first-decode-delay-ms") == 0) {
            fake_first_decode_delay_ms = atoi(argv[++i]);
        }
    }
    if (listen == NULL) {
        fprintf(stderr, "usage: %s --listen tcp://127.0.0.1:PORT [--engine-id ID] [--tp N] "
                "[--fake-mode MODE] [--fake-token-delay-ms MS] [--fake-prefill-delay-ms MS] "
                "[--fake-first-decode-delay-ms MS]\n", base);
        return 2;
    }
    signal(SIGTERM, fake_on_signal);
    signal(SIGINT, fake_on_signal);
    for (int i = 1; i < argc; ++i) {
        auth.insecure |= (strcmp(argv[i], "--insecure") == 0);
    }
    if (auth.key_id == NULL) {
        auth.key_id = fake_engine;
    }
    if (kvf_zmq_auth_init(NULL, &auth) != KVF_OK) {   /* the daemons' rule: keys or --insecure */
        return 2;
    }
    ctx = zmq_ctx_new();
    if (kvf_zmq_socket_open(ctx, ZMQ_ROUTER, opts, sizeof(opts) / sizeof(opts[0]), &sock) !=
        KVF_OK) {
        fprintf(stderr, "fake: ROUTER socket: %s\n", zmq_strerror(zmq_errno()));
        return 1;
    }
    if (kvf_zmq_bind(ctx, sock, listen, "serve") != KVF_OK) {
        fprintf(stderr, "fake: bind %s: %s\n", listen, zmq_strerror(zmq_errno()));
        return 1;
    }
    fprintf(stderr, "fake: %s %s listening on %s (mode %s)\n", fake_role, fake_engine, listen,
            fake_mode);

    while (!fake_stop) {
        zmq_pollitem_t item = {sock, 0, ZMQ_POLLIN, 0};

        if (zmq_poll(&item, 1, 1) < 0) {
            continue;
        }
        fake_serve_waiting(sock);
        fake_step(sock);
        fake_flush_pending(sock);
    }
    for (int i = 0; i < FAKE_MAX_STREAMS; ++i) {
        if (fake_streams[i].used) {
            fake_stream_free(&fake_streams[i]);
        }
    }
    for (int i = 0; i < FAKE_MAX_PENDING; ++i) {
        if (fake_pending[i].used) {
            free(fake_pending[i].buf);
            zmq_msg_close(&fake_pending[i].identity);
        }
    }
    zmq_close(sock);
    zmq_ctx_term(ctx);
    return 0;
}
