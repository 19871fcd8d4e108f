/*
 * kvf_outsider: one message to one daemon port, as an outsider or as a pool
 * member, for tests/security/test_outsider.py.
 *
 *   kvf_outsider --endpoint tcp://127.0.0.1:20002 --key none|self|member
 *                [--keys DIR --key-id ID] [--server-keys DIR]
 *                --msg health|check_peer|decode|abort|prefill|handshake|lease
 *                [--claim ENGINE_ID] [--wait-ms 1500]
 *
 * --key none: plain ZeroMQ (no CURVE); self: a CURVE key pair made here (not
 * in pool.pub), pinned to the pool's server key from --server-keys DIR
 * (default --keys DIR) so the server handshake itself is genuine; member:
 * DIR/ID.key, a real member's key. Control-channel messages (health,
 * check_peer, decode, abort, prefill) go as a ServeRequest over a DEALER;
 * side-channel ones (handshake, lease claim) as a HandshakeRequest over a
 * REQ. --claim is the engine id the message claims (default decode-0).
 *
 * Prints one line: "reply" followed by fields of the answer (status, error,
 * for a health reply role, engine_id, auth_refusals_serve and
 * auth_refusals_side), or "no-reply" when nothing came within --wait-ms.
 * Exit 0 either way; 2 on bad usage or a local failure.
 */
#include "kvf_serve.pb-c.h"
#include "kvf_xfer.pb-c.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

typedef struct {
    const char *endpoint, *key, *keys, *key_id, *server_keys, *msg, *claim;
    int wait_ms;
} outsider_opts_t;

static int read_key(const char *dir, const char *id, char *pub, char *sec)
{
    char path[4096], line[256];
    FILE *f;

    snprintf(path, sizeof(path), "%s/%s.key", dir, id);
    f = fopen(path, "r");
    if (f == NULL) {
        fprintf(stderr, "kvf_outsider: cannot read %s\n", path);
        return -1;
    }
    while (fgets(line, sizeof(line), f) != NULL) {
        if ((strncmp(line, "public ", 7) == 0) && (pub != NULL)) {
            memcpy(pub, line + 7, 40);
            pub[40] = '\0';
        } else if ((strncmp(line, "secret ", 7) == 0) && (sec != NULL)) {
            memcpy(sec, line + 7, 40);
            sec[40] = '\0';
        }
    }
    fclose(f);
    return 0;
}

static int set_keys(void *sock, const outsider_opts_t *o)
{
    char server_pub[41], pub[41], sec[41];
    const char *sdir = (o->server_keys != NULL) ? o->server_keys : o->keys;

    if (strcmp(o->key, "none") == 0) {
        return 0;
    }
    if ((sdir == NULL) || (read_key(sdir, "server", server_pub, NULL) != 0)) {
        fprintf(stderr, "kvf_outsider: --key %s needs --keys or --server-keys\n", o->key);
        return -1;
    }
    if (strcmp(o->key, "self") == 0) {
        if (zmq_curve_keypair(pub, sec) != 0) {
            return -1;
        }
    } else if ((strcmp(o->key, "member") != 0) || (o->keys == NULL) || (o->key_id == NULL) ||
               (read_key(o->keys, o->key_id, pub, sec) != 0)) {
        fprintf(stderr, "kvf_outsider: --key member needs --keys DIR --key-id ID\n");
        return -1;
    }
    return ((zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY, server_pub, 40) == 0) &&
            (zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, pub, 40) == 0) &&
            (zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, sec, 40) == 0)) ? 0 : -1;
}

/* a ServeRequest for the control channel; *len_p bytes in a malloc'd buffer */
static uint8_t *pack_serve(const outsider_opts_t *o, size_t *len_p)
{
    Kvf__ServeRequest req = KVF__SERVE_REQUEST__INIT;
    Kvf__HealthRequest health = KVF__HEALTH_REQUEST__INIT;
    Kvf__CheckPeerRequest check = KVF__CHECK_PEER_REQUEST__INIT;
    Kvf__PrefillRequest pre = KVF__PREFILL_REQUEST__INIT;
    Kvf__DecodeRequest dec = KVF__DECODE_REQUEST__INIT;
    Kvf__AbortRequest abort_req = KVF__ABORT_REQUEST__INIT;
    Kvf__SamplingParams sp = KVF__SAMPLING_PARAMS__INIT;
    Kvf__TransferParams tp = KVF__TRANSFER_PARAMS__INIT;
    static int32_t prompt[] = {1, 72, 101, 108, 108, 111};
    uint8_t *buf;

    sp.has_max_tokens = 1;
    sp.max_tokens = 4;
    if (strcmp(o->msg, "health") == 0) {
        req.body_case = KVF__SERVE_REQUEST__BODY_HEALTH;
        req.health = &health;
    } else if (strcmp(o->msg, "check_peer") == 0) {   /* the cache-poisoning probe */
        check.request_id = (char *)"outsider-check";
        check.engine_id = (char *)"prefill-0";
        check.host = (char *)"127.0.0.1";
        check.has_port = 1;
        check.port = 9;   /* discard: nobody answers there */
        req.body_case = KVF__SERVE_REQUEST__BODY_CHECK_PEER;
        req.check_peer = &check;
    } else if (strcmp(o->msg, "prefill") == 0) {      /* unclaimed prefill: pins pages */
        pre.request_id = (char *)"outsider-prefill";
        pre.n_prompt_tokens = sizeof(prompt) / sizeof(prompt[0]);
        pre.prompt_tokens = prompt;
        pre.sampling = &sp;
        req.body_case = KVF__SERVE_REQUEST__BODY_PREFILL;
        req.prefill = &pre;
    } else if (strcmp(o->msg, "decode") == 0) {       /* side channel that never answers */
        tp.engine_id = (char *)"prefill-0";
        tp.host = (char *)"127.0.0.1";
        tp.has_port = 1;
        tp.port = 9;
        tp.request_id = (char *)"outsider-decode";
        dec.request_id = (char *)"outsider-decode";
        dec.n_prompt_tokens = sizeof(prompt) / sizeof(prompt[0]);
        dec.prompt_tokens = prompt;
        dec.sampling = &sp;
        dec.params = &tp;
        req.body_case = KVF__SERVE_REQUEST__BODY_DECODE;
        req.decode = &dec;
    } else if (strcmp(o->msg, "abort") == 0) {
        abort_req.request_id = (char *)"outsider-abort";
        req.body_case = KVF__SERVE_REQUEST__BODY_ABORT;
        req.abort = &abort_req;
    } else {
        return NULL;
    }
    *len_p = kvf__serve_request__get_packed_size(&req);
    buf = malloc(*len_p + 1);
    if (buf != NULL) {
        kvf__serve_request__pack(&req, buf);
    }
    return buf;
}

/* a HandshakeRequest for the side channel (with a lease claim for "lease") */
static uint8_t *pack_side(const outsider_opts_t *o, size_t *len_p)
{
    Kvf__HandshakeRequest req = KVF__HANDSHAKE_REQUEST__INIT;
    Kvf__LeaseRequest lease = KVF__LEASE_REQUEST__INIT;
    uint8_t *buf;

    req.engine_id = (char *)o->claim;
    req.has_protocol_version = 1;
    req.protocol_version = 2;
    if (strcmp(o->msg, "lease") == 0) {
        lease.has_op = 1;
        lease.op = 1;   /* claim */
        lease.request_id = (char *)"outsider-lease";
        lease.has_nonce = 1;
        lease.nonce = 0x5eed;
        req.lease = &lease;
    } else if (strcmp(o->msg, "handshake") != 0) {
        return NULL;
    }
    *len_p = kvf__handshake_request__get_packed_size(&req);
    buf = malloc(*len_p + 1);
    if (buf != NULL) {
        kvf__handshake_request__pack(&req, buf);
    }
    return buf;
}

static void print_reply(bool side, const uint8_t *data, size_t len)
{
    if (side) {
        Kvf__HandshakeReply *r = kvf__handshake_reply__unpack(NULL, len, data);
        printf("reply side accepted=%d ranks=%zu error=%s\n", (r != NULL) && r->accepted,
               (r != NULL) ? r->n_ranks : 0, ((r != NULL) && r->error) ? r->error : "");
        kvf__handshake_reply__free_unpacked(r, NULL);
        return;
    }
    Kvf__ServeReply *r = kvf__serve_reply__unpack(NULL, len, data);
    if (r == NULL) {
        printf("reply undecodable bytes=%zu\n", len);
        return;
    }
    printf("reply serve status=%d error=%s", r->status, (r->error != NULL) ? r->error : "");
    if (r->health != NULL) {
        printf(" role=%s engine_id=%s auth_refusals_serve=%llu auth_refusals_side=%llu",
               r->health->role ? r->health->role : "", r->health->engine_id ?
               r->health->engine_id : "", (unsigned long long)r->health->auth_refusals_serve,
               (unsigned long long)r->health->auth_refusals_side);
    }
    printf("\n");
    kvf__serve_reply__free_unpacked(r, NULL);
}

static int parse(int argc, char **argv, outsider_opts_t *o)
{
    memset(o, 0, sizeof(*o));
    o->key = "none";
    o->claim = "decode-0";
    o->wait_ms = 1500;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *f = argv[i], *v = argv[i + 1];
        if (strcmp(f, "--endpoint") == 0) { o->endpoint = v; }
        else if (strcmp(f, "--key") == 0) { o->key = v; }
        else if (strcmp(f, "--keys") == 0) { o->keys = v; }
        else if (strcmp(f, "--key-id") == 0) { o->key_id = v; }
        else if (strcmp(f, "--server-keys") == 0) { o->server_keys = v; }
        else if (strcmp(f, "--msg") == 0) { o->msg = v; }
        else if (strcmp(f, "--claim") == 0) { o->claim = v; }
        else if (strcmp(f, "--wait-ms") == 0) { o->wait_ms = atoi(v); }
        else { fprintf(stderr, "kvf_outsider: unknown flag %s\n", f); return -1; }
    }
    if ((o->endpoint == NULL) || (o->msg == NULL) || (o->wait_ms < 1) || (o->wait_ms > 60000)) {
        fprintf(stderr, "kvf_outsider: give --endpoint and --msg (and --wait-ms 1..60000)\n");
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    outsider_opts_t o;
    bool side;
    uint8_t *msg;
    size_t len = 0;
    void *ctx, *sock;
    int zero = 0, rc = 2;
    zmq_pollitem_t it;

    if (parse(argc, argv, &o) != 0) {
        return 2;
    }
    side = (strcmp(o.msg, "handshake") == 0) || (strcmp(o.msg, "lease") == 0);
    msg = side ? pack_side(&o, &len) : pack_serve(&o, &len);
    if (msg == NULL) {
        fprintf(stderr, "kvf_outsider: unknown --msg %s\n", o.msg);
        return 2;
    }
    ctx = zmq_ctx_new();
    sock = zmq_socket(ctx, side ? ZMQ_REQ : ZMQ_DEALER);
    zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof(zero));
    if ((set_keys(sock, &o) == 0) && (zmq_connect(sock, o.endpoint) == 0)) {
        it.socket = sock;
        it.fd = 0;
        it.events = ZMQ_POLLIN;
        it.revents = 0;
        /* the send only queues: the connection may be refused underneath */
        if (zmq_send(sock, msg, len, ZMQ_DONTWAIT) < 0) {
            printf("no-reply (not sent: %s)\n", zmq_strerror(zmq_errno()));
            rc = 0;
        } else if (zmq_poll(&it, 1, o.wait_ms) == 1) {
            zmq_msg_t m;
            zmq_msg_init(&m);
            if (zmq_msg_recv(&m, sock, 0) >= 0) {
                print_reply(side, zmq_msg_data(&m), zmq_msg_size(&m));
                rc = 0;
            }
            zmq_msg_close(&m);
        } else {
            printf("no-reply\n");
            rc = 0;
        }
    }
    fflush(stdout);
    zmq_close(sock);
    zmq_ctx_term(ctx);
    free(msg);
    return rc;
}
