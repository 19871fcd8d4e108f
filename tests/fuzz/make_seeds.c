/*
 * Writes the seed corpus of every fuzz target from the real encoders:
 * small valid messages of each kind a peer or client sends, plus a few edge
 * cases (empty input, fields at and just past their bounds, truncations).
 *
 *   fuzz_make_seeds OUT_DIR     -> OUT_DIR/<target>/<seed name>
 *
 * The committed corpus (tests/fuzz/corpus) is this program's output plus
 * the regression inputs a fuzzing run found (named crash-*: never deleted).
 * Regenerate with tests/fuzz/make_corpus.sh after changing a message.
 */
#include "fuzz_script.h"

#include "kvf_handshake.h"
#include "kvf_serve.pb-c.h"
#include "kvf_xfer.pb-c.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *g_out;

static void die(const char *what)
{
    fprintf(stderr, "fuzz_make_seeds: %s\n", what);
    exit(1);
}

static void write_seed(const char *target, const char *name, const void *buf, size_t len)
{
    char path[4096];
    FILE *f;

    snprintf(path, sizeof(path), "%s/%s", g_out, target);
    if ((mkdir(path, 0755) != 0) && (errno != EEXIST)) {
        die("cannot create the target folder");
    }
    snprintf(path, sizeof(path), "%s/%s/%s", g_out, target, name);
    f = fopen(path, "wb");
    if ((f == NULL) || (fwrite(buf, 1, len, f) != len) || (fclose(f) != 0)) {
        die("cannot write a seed");
    }
}

/* write @a buf (malloc'd by an encoder) and free it */
static void take_seed(const char *target, const char *name, uint8_t *buf, size_t len)
{
    write_seed(target, name, buf, len);
    free(buf);
}

/* ---- handshake -------------------------------------------------------- */

static void rank_fill(kvf_rank_meta_t *m, int tp, int rank, int regions)
{
    memset(m, 0, sizeof(*m));
    snprintf(m->engine_id, sizeof(m->engine_id), "prefill-0");
    m->protocol_version = KVF_XFER_PROTOCOL_VERSION;
    m->model_fingerprint = 0x1234abcd5678ef90ull;
    m->tp_rank = rank;
    m->tp_size = tp;
    m->block_size = 80;
    m->kernel_block_size = 80;
    m->page_size = 10240;
    m->slots = 2;
    m->num_blocks = 8;
    m->kv_dtype = KVF_DTYPE_BF16;
    m->conv_dtype = KVF_DTYPE_BF16;
    m->ssm_dtype = KVF_DTYPE_FP32;
    m->user_block_size = 16;
    m->align = KVF_ALIGN_TP_STABLE;
    snprintf(m->layout_tag, sizeof(m->layout_tag), "HND");
    m->num_regions = regions;
    for (int j = 0; j < regions; ++j) {
        m->regions[j].addr = 0x7f0000000000ull + (uint64_t)rank * 0x10000000ull +
                             (uint64_t)j * 0x100000ull;
        m->regions[j].length = 8 * 2 * 10240;
        m->regions[j].rkey_len = 9;
        memset(m->regions[j].rkey, 0xa0 + rank, 9);
    }
    m->worker_addr_len = 12;
    memset(m->worker_addr, 0x30 + rank, 12);
    m->incarnation = 0x8badf00d12345678ull;
}

#define SEED_DUPLICATE_RANK 1   /* edge: two ranks claim the same tp_rank */
#define SEED_CUDA_REGIONS   2   /* every region in device memory (memory_type cuda) */

static void handshake_reply_seed(const char *target, const char *name, int tp, int regions,
                                 int flags)
{
    kvf_handshake_reply_t reply;
    uint8_t *buf;
    size_t len;

    memset(&reply, 0, sizeof(reply));
    reply.accepted = true;
    snprintf(reply.engine_id, sizeof(reply.engine_id), "prefill-0");
    reply.num_ranks = tp;
    reply.ranks = calloc((size_t)tp, sizeof(*reply.ranks));
    if (reply.ranks == NULL) {
        die("out of memory");
    }
    for (int r = 0; r < tp; ++r) {
        rank_fill(&reply.ranks[r], tp, r, regions);
    }
    for (int r = 0; (flags & SEED_CUDA_REGIONS) && (r < tp); ++r) {
        for (int j = 0; j < regions; ++j) {
            reply.ranks[r].regions[j].mem_type = KVF_XFER_MEM_CUDA;
        }
    }
    if (flags & SEED_DUPLICATE_RANK) {
        reply.ranks[tp - 1].tp_rank = 0;
    }
    if (kvf_handshake_reply_pack(&reply, &buf, &len) != KVF_OK) {
        die("reply pack");
    }
    free(reply.ranks);
    take_seed(target, name, buf, len);
}

static void request_seed(const char *target, const char *name, const kvf_handshake_request_t *r)
{
    uint8_t *buf;
    size_t len;

    if (kvf_handshake_request_pack(r, &buf, &len) != KVF_OK) {
        die("request pack");
    }
    take_seed(target, name, buf, len);
}

static void request_fill(kvf_handshake_request_t *r, int op, const char *request_id,
                         uint64_t nonce, int rank, int tp)
{
    memset(r, 0, sizeof(*r));
    snprintf(r->engine_id, sizeof(r->engine_id), "decode-0");
    r->protocol_version = KVF_XFER_PROTOCOL_VERSION;
    snprintf(r->want_engine_id, sizeof(r->want_engine_id), "prefill-0");
    r->xfer_timeout_ms = 1000;
    if (op != 0) {
        r->has_lease = true;
        r->lease.op = (kvf_lease_op_t)op;
        snprintf(r->lease.request_id, sizeof(r->lease.request_id), "%s", request_id);
        r->lease.nonce = nonce;
        r->lease.decode_rank = rank;
        r->lease.decode_tp = tp;
        r->lease.status = KVF_OK;
    }
}

static void seeds_handshake(void)
{
    const char *t = "fuzz_handshake";
    kvf_handshake_request_t req;
    kvf_handshake_reply_t refusal;
    kvf_lease_answer_t answer;
    kvf_xfer_notification_t n;
    uint8_t *buf;
    size_t len;

    request_fill(&req, 0, "", 0, 0, 0);
    request_seed(t, "request_metadata", &req);
    request_fill(&req, KVF_LEASE_OP_CLAIM, "cmpl-1", 0x1111222233334444ull, 0, 0);
    request_seed(t, "request_claim", &req);
    request_fill(&req, KVF_LEASE_OP_RELEASE, "cmpl-1", 0x1111222233334444ull, 1, 2);
    request_seed(t, "request_release", &req);
    request_fill(&req, KVF_LEASE_OP_RELEASE, "cmpl-1", 1, KVF_XFER_MAX_TP - 1, KVF_XFER_MAX_TP);
    request_seed(t, "request_release_max_tp", &req);
    request_fill(&req, 0, "", 0, 0, 0);
    memset(req.engine_id, 'e', KVF_ENGINE_ID_MAX - 1);   /* longest engine id accepted */
    req.engine_id[KVF_ENGINE_ID_MAX - 1] = '\0';
    request_seed(t, "request_longest_engine_id", &req);

    handshake_reply_seed(t, "reply_tp1", 1, 1, 0);
    handshake_reply_seed(t, "reply_tp2_two_regions", 2, 2, 0);
    handshake_reply_seed(t, "reply_tp4_duplicate_rank", 4, 1, SEED_DUPLICATE_RANK);
    handshake_reply_seed(t, "reply_tp2_cuda_regions", 2, 2, SEED_CUDA_REGIONS);
    memset(&refusal, 0, sizeof(refusal));
    snprintf(refusal.engine_id, sizeof(refusal.engine_id), "prefill-0");
    snprintf(refusal.error, sizeof(refusal.error), "wrong engine id");
    refusal.num_refusals = 1;
    snprintf(refusal.refusals[0].field, sizeof(refusal.refusals[0].field), "engine_id");
    snprintf(refusal.refusals[0].local, sizeof(refusal.refusals[0].local), "prefill-0");
    snprintf(refusal.refusals[0].remote, sizeof(refusal.refusals[0].remote), "prefill-9");
    snprintf(refusal.refusals[0].why, sizeof(refusal.refusals[0].why), "another engine");
    if (kvf_handshake_reply_pack(&refusal, &buf, &len) != KVF_OK) {
        die("refusal pack");
    }
    take_seed(t, "reply_refusal", buf, len);

    for (int v = KVF_LEASE_VALID; v <= KVF_LEASE_REFUSED; ++v) {
        char name[32];
        memset(&answer, 0, sizeof(answer));
        answer.verdict = (kvf_lease_verdict_t)v;
        answer.ms_left = (v == KVF_LEASE_VALID) ? 29000 : 0;
        snprintf(answer.why, sizeof(answer.why), "%s", (v == KVF_LEASE_VALID) ? "" : "expired");
        if (kvf_lease_reply_pack("prefill-0", &answer, &buf, &len) != KVF_OK) {
            die("lease reply pack");
        }
        snprintf(name, sizeof(name), "lease_reply_verdict%d", v);
        take_seed(t, name, buf, len);
    }

    memset(&n, 0, sizeof(n));
    snprintf(n.request_id, sizeof(n.request_id), "cmpl-1");
    snprintf(n.engine_id, sizeof(n.engine_id), "decode-0");
    n.rank = 1;
    n.status = KVF_ERR_PEER_RESET;
    if (kvf_xfer_notification_pack(&n, &buf, &len) != KVF_OK) {
        die("notification pack");
    }
    take_seed(t, "notification", buf, len);
    write_seed(t, "empty", "", 0);
}

/* ---- transfer params -------------------------------------------------- */

static void params_seed(const char *target, const char *name, const kvf_xfer_params_msg_t *p)
{
    uint8_t *buf;
    size_t len;

    if (kvf_xfer_params_msg_pack(p, &buf, &len) != KVF_OK) {
        die("params pack");
    }
    take_seed(target, name, buf, len);
}

static int32_t g_ids0[3] = {5, 1, 7}, g_ids1[2] = {2, 0}, g_neg[1] = {-1};

/* The params prefill sends for a 200-token prompt of a hybrid model (2 groups). */
static void params_fill(kvf_xfer_params_msg_t *p)
{
    memset(p, 0, sizeof(*p));
    snprintf(p->engine_id, sizeof(p->engine_id), "prefill-0");
    snprintf(p->host, sizeof(p->host), "127.0.0.1");
    snprintf(p->request_id, sizeof(p->request_id), "cmpl-1");
    p->port = 5600;
    p->num_groups = 2;
    p->ids[0] = g_ids0;
    p->num_ids[0] = 3;
    p->ids[1] = g_ids1;
    p->num_ids[1] = 2;
    p->num_tokens = 200;
    p->first_token = 42;
    p->has_incarnation = true;
    p->incarnation = 0x8badf00d12345678ull;
    p->has_lease = true;
    p->lease_ms_left = 29000;
    p->nonce = 0x1111222233334444ull;
}

static void seeds_xfer_params(void)
{
    const char *t = "fuzz_xfer_params";
    kvf_xfer_params_msg_t p;

    params_fill(&p);
    params_seed(t, "hybrid_two_groups", &p);
    p.num_groups = 1;
    p.has_incarnation = p.has_lease = false;
    params_seed(t, "dense_one_group_no_lease", &p);
    params_fill(&p);
    p.num_ids[1] = 0;
    params_seed(t, "empty_group", &p);
    p.ids[1] = g_neg;
    p.num_ids[1] = 1;
    params_seed(t, "negative_block_id", &p);
    params_fill(&p);
    p.port = 65536;
    params_seed(t, "port_past_range", &p);
    params_fill(&p);
    p.num_tokens = (1ll << 40) + 1;
    params_seed(t, "num_tokens_past_range", &p);
    params_fill(&p);
    memset(p.host, 'h', sizeof(p.host) - 1);
    p.host[sizeof(p.host) - 1] = '\0';
    params_seed(t, "longest_host", &p);
    params_fill(&p);
    p.num_groups = 0;
    params_seed(t, "no_group", &p);
    write_seed(t, "empty", "", 0);
}

/* ---- side channel scripts -------------------------------------------- */

#define SC_ENGINE "prefill-fz"   /* fuzz_side_channel.c's server */
#define SC_NONCE  0x5eed000000000000ull

static void sc_send(fuzz_writer_t *w, const char *engine, uint32_t version, const char *want,
                    int op, int slot, uint64_t nonce, int rank, int tp)
{
    kvf_handshake_request_t r;
    uint8_t *buf;
    size_t len;

    request_fill(&r, op, "", nonce, rank, tp);
    snprintf(r.engine_id, sizeof(r.engine_id), "%s", engine);
    snprintf(r.want_engine_id, sizeof(r.want_engine_id), "%s", want);
    r.protocol_version = version;
    snprintf(r.lease.request_id, sizeof(r.lease.request_id), "cmpl-%d", slot);
    if (kvf_handshake_request_pack(&r, &buf, &len) != KVF_OK) {
        die("request pack");
    }
    fuzz_wsend(w, FUZZ_OP_SEND, buf, len);
    free(buf);
}

/* decode-0's lease operation on slot @a s with the right nonce */
static void sc_op(fuzz_writer_t *w, int op, int s, int rank, int tp)
{
    sc_send(w, "decode-0", KVF_XFER_PROTOCOL_VERSION, SC_ENGINE, op, s, SC_NONCE + (uint64_t)s,
            rank, tp);
}

static void sc_add(fuzz_writer_t *w, int s, uint16_t ttl)
{
    fuzz_w8(w, FUZZ_OP_ADD);
    fuzz_w8(w, (uint8_t)s);
    fuzz_w16(w, ttl);
}

static void sc_tick(fuzz_writer_t *w, uint16_t ms)
{
    fuzz_w8(w, FUZZ_OP_TICK);
    fuzz_w16(w, ms);
}

static void seeds_side_channel(void)
{
    const char *t = "fuzz_side_channel";
    static fuzz_writer_t w;
    kvf_handshake_request_t r;
    uint8_t *buf;
    size_t len;

    memset(&w, 0, sizeof(w));
    sc_send(&w, "decode-0", KVF_XFER_PROTOCOL_VERSION, SC_ENGINE, 0, 0, 0, 0, 0);
    sc_send(&w, "decode-0", KVF_XFER_PROTOCOL_VERSION, "", 0, 0, 0, 0, 0);
    write_seed(t, "metadata", w.buf, w.len);

    /* the normal life of a lease: claim, every decode rank releases, blocks back */
    memset(&w, 0, sizeof(w));
    sc_add(&w, 0, 1000);
    sc_op(&w, KVF_LEASE_OP_CLAIM, 0, 0, 0);
    sc_tick(&w, 10);
    sc_op(&w, KVF_LEASE_OP_RELEASE, 0, 0, 2);
    sc_op(&w, KVF_LEASE_OP_RELEASE, 0, 1, 2);
    fuzz_w8(&w, FUZZ_OP_COLLECT);
    sc_op(&w, KVF_LEASE_OP_CLAIM, 0, 0, 0);   /* stale params replayed: refused */
    write_seed(t, "claim_release", w.buf, w.len);

    /* heartbeats while queued extend it; then it expires before the release */
    memset(&w, 0, sizeof(w));
    sc_add(&w, 1, 1000);
    sc_op(&w, KVF_LEASE_OP_CLAIM, 1, 0, 0);
    sc_tick(&w, 800);
    sc_op(&w, KVF_LEASE_OP_CLAIM, 1, 0, 0);
    sc_tick(&w, 800);
    sc_op(&w, KVF_LEASE_OP_CLAIM, 1, 0, 0);
    sc_tick(&w, 1200);
    sc_op(&w, KVF_LEASE_OP_RELEASE, 1, 0, 1);
    fuzz_w8(&w, FUZZ_OP_COLLECT);
    sc_tick(&w, 600);
    fuzz_w8(&w, FUZZ_OP_COLLECT);
    sc_add(&w, 1, 1000);                        /* the id comes back for a new prompt */
    sc_op(&w, KVF_LEASE_OP_CLAIM, 1, 0, 0);
    write_seed(t, "heartbeat_expiry", w.buf, w.len);

    /* the client goes away mid-pull: quarantine, then the release says expired */
    memset(&w, 0, sizeof(w));
    sc_add(&w, 2, 1000);
    sc_op(&w, KVF_LEASE_OP_CLAIM, 2, 0, 0);
    fuzz_w8(&w, FUZZ_OP_ABORT);
    fuzz_w8(&w, 2);
    sc_op(&w, KVF_LEASE_OP_RELEASE, 2, 0, 2);
    fuzz_w8(&w, FUZZ_OP_COLLECT);
    sc_tick(&w, 600);
    fuzz_w8(&w, FUZZ_OP_COLLECT);
    sc_op(&w, KVF_LEASE_OP_RELEASE, 2, 1, 2);
    write_seed(t, "abort_mid_pull", w.buf, w.len);

    /* only the decode given the lease ends it: wrong nonce, another engine, a replay */
    memset(&w, 0, sizeof(w));
    sc_add(&w, 3, 1000);
    sc_send(&w, "decode-0", KVF_XFER_PROTOCOL_VERSION, SC_ENGINE, KVF_LEASE_OP_CLAIM, 3,
            SC_NONCE + 2, 0, 0);
    sc_op(&w, KVF_LEASE_OP_CLAIM, 3, 0, 0);
    sc_send(&w, "decode-9", KVF_XFER_PROTOCOL_VERSION, SC_ENGINE, KVF_LEASE_OP_RELEASE, 3,
            SC_NONCE + 3, 0, 1);
    sc_op(&w, KVF_LEASE_OP_RELEASE, 3, 0, 2);
    sc_op(&w, KVF_LEASE_OP_RELEASE, 3, 0, 2);
    sc_op(&w, KVF_LEASE_OP_RELEASE, 3, 1, 4);
    sc_op(&w, KVF_LEASE_OP_RELEASE, 3, 1, 2);
    fuzz_w8(&w, FUZZ_OP_COLLECT);
    write_seed(t, "refused_ops", w.buf, w.len);

    /* malformed frames: garbage, two frames, empty, another version, another engine */
    memset(&w, 0, sizeof(w));
    fuzz_wsend(&w, FUZZ_OP_SEND, "\x0a\xff\xff\x01", 4);
    fuzz_wsend(&w, FUZZ_OP_SEND, "", 0);
    request_fill(&r, KVF_LEASE_OP_CLAIM, "cmpl-0", SC_NONCE, 0, 0);
    if (kvf_handshake_request_pack(&r, &buf, &len) != KVF_OK) {
        die("request pack");
    }
    fuzz_wsend(&w, FUZZ_OP_SEND2, buf, len);
    free(buf);
    sc_send(&w, "decode-0", 1, SC_ENGINE, 0, 0, 0, 0, 0);
    sc_send(&w, "decode-0", KVF_XFER_PROTOCOL_VERSION, "prefill-other", KVF_LEASE_OP_CLAIM, 0,
            SC_NONCE, 0, 0);
    write_seed(t, "malformed", w.buf, w.len);
    write_seed(t, "empty", "", 0);
}

/* ---- serving control messages ----------------------------------------- */

static void sv_send(fuzz_writer_t *w, const Kvf__ServeRequest *req)
{
    size_t len = kvf__serve_request__get_packed_size(req);
    uint8_t *buf = malloc(len ? len : 1);

    if (buf == NULL) {
        die("out of memory");
    }
    kvf__serve_request__pack(req, buf);
    fuzz_wsend(w, FUZZ_OP_SEND, buf, len);
    free(buf);
}

/* fuzz_serve_control's malformed frames: garbage, empty, no body, two frames; and no input. */
static void seeds_serve_malformed(const char *t, fuzz_writer_t *w)
{
    memset(w, 0, sizeof(*w));
    fuzz_w8(w, 0);
    fuzz_wsend(w, FUZZ_OP_SEND, "\x12\xff\xff\xff\x0f", 5);
    fuzz_wsend(w, FUZZ_OP_SEND, "", 0);
    fuzz_wsend(w, FUZZ_OP_SEND, "\x22\x00", 2);
    fuzz_wsend(w, FUZZ_OP_SEND2, "\x22\x00\x22\x00", 4);
    write_seed(t, "malformed", w->buf, w->len);
    write_seed(t, "empty", "", 0);
}

static void seeds_serve_control(void)
{
    const char *t = "fuzz_serve_control";
    static fuzz_writer_t w;
    static int32_t prompt[200];
    kvf_xfer_params_msg_t p;
    Kvf__TransferParams *tp;
    Kvf__ServeRequest req = KVF__SERVE_REQUEST__INIT;
    Kvf__DecodeRequest dr = KVF__DECODE_REQUEST__INIT;
    Kvf__PrefillRequest pr = KVF__PREFILL_REQUEST__INIT;
    Kvf__SamplingParams sp = KVF__SAMPLING_PARAMS__INIT;
    Kvf__AbortRequest ab = KVF__ABORT_REQUEST__INIT;
    Kvf__HealthRequest hr = KVF__HEALTH_REQUEST__INIT;
    Kvf__CheckPeerRequest cp = KVF__CHECK_PEER_REQUEST__INIT;
    uint8_t *buf;
    size_t len;

    for (int i = 0; i < 200; ++i) {
        prompt[i] = (i * 37) % 300;
    }
    params_fill(&p);
    if (kvf_xfer_params_msg_pack(&p, &buf, &len) != KVF_OK) {
        die("params pack");
    }
    tp = kvf__transfer_params__unpack(NULL, len, buf);
    free(buf);
    if (tp == NULL) {
        die("params unpack");
    }
    sp.has_max_tokens = sp.has_temperature = sp.has_seed = 1;
    sp.max_tokens = 16;
    sp.temperature = 0.0f;
    sp.seed = 7;

    /* decode: what the proxy sends, then what a stray client might */
    memset(&w, 0, sizeof(w));
    fuzz_w8(&w, 0);
    dr.request_id = (char *)"cmpl-1";
    dr.n_prompt_tokens = 200;
    dr.prompt_tokens = prompt;
    dr.sampling = &sp;
    dr.params = tp;
    dr.has_stream = dr.stream = 1;
    req.body_case = KVF__SERVE_REQUEST__BODY_DECODE;
    req.decode = &dr;
    sv_send(&w, &req);
    write_seed(t, "decode_request", w.buf, w.len);

    memset(&w, 0, sizeof(w));
    fuzz_w8(&w, 0);
    dr.n_prompt_tokens = 199;                     /* params cover another prompt */
    sv_send(&w, &req);
    dr.n_prompt_tokens = 200;
    sp.max_tokens = 0;
    sv_send(&w, &req);
    sp.max_tokens = 16;
    dr.request_id = NULL;
    sv_send(&w, &req);
    dr.request_id = (char *)"cmpl-1";
    dr.params = NULL;
    sv_send(&w, &req);
    dr.params = tp;
    tp->has_nonce = 0;                            /* an older prefill: no lease */
    sv_send(&w, &req);
    tp->has_nonce = 1;
    write_seed(t, "decode_bad_requests", w.buf, w.len);

    memset(&w, 0, sizeof(w));
    fuzz_w8(&w, 0);
    cp.request_id = (char *)"check-1";
    cp.engine_id = (char *)"prefill-0";
    cp.host = (char *)"127.0.0.1";
    cp.has_port = cp.has_incarnation = 1;
    cp.port = 5600;
    cp.incarnation = 0x8badf00d12345678ull;
    req.body_case = KVF__SERVE_REQUEST__BODY_CHECK_PEER;
    req.check_peer = &cp;
    sv_send(&w, &req);
    cp.port = 70000;
    sv_send(&w, &req);
    ab.request_id = (char *)"cmpl-1";
    req.body_case = KVF__SERVE_REQUEST__BODY_ABORT;
    req.abort = &ab;
    sv_send(&w, &req);
    req.body_case = KVF__SERVE_REQUEST__BODY_HEALTH;
    req.health = &hr;
    sv_send(&w, &req);
    pr.request_id = (char *)"cmpl-2";
    pr.n_prompt_tokens = 3;
    pr.prompt_tokens = prompt;
    req.body_case = KVF__SERVE_REQUEST__BODY_PREFILL;   /* to the wrong role */
    req.prefill = &pr;
    sv_send(&w, &req);
    write_seed(t, "decode_other_requests", w.buf, w.len);

    /* prefill */
    memset(&w, 0, sizeof(w));
    fuzz_w8(&w, 1);
    pr.sampling = &sp;
    sv_send(&w, &req);
    pr.n_prompt_tokens = 0;
    sv_send(&w, &req);
    pr.n_prompt_tokens = 3;
    pr.request_id = (char *)"0123456789012345678901234567890123456789012345678901234567890123";
    sv_send(&w, &req);
    req.body_case = KVF__SERVE_REQUEST__BODY_ABORT;
    sv_send(&w, &req);
    req.body_case = KVF__SERVE_REQUEST__BODY_HEALTH;
    sv_send(&w, &req);
    req.body_case = KVF__SERVE_REQUEST__BODY_DECODE;
    sv_send(&w, &req);
    write_seed(t, "prefill_requests", w.buf, w.len);

    seeds_serve_malformed(t, &w);
    kvf__transfer_params__free_unpacked(tp, NULL);
}

/* ---- proxy request bodies --------------------------------------------- */

/* k completion ids (little-endian int32), then the body */
static void body_seed(const char *name, const int32_t *ids, int k, const char *body)
{
    static fuzz_writer_t w;

    memset(&w, 0, sizeof(w));
    fuzz_w8(&w, (uint8_t)k);
    for (int i = 0; i < k; ++i) {
        uint32_t v = (uint32_t)ids[i];
        for (int j = 0; j < 4; ++j) {
            fuzz_w8(&w, (uint8_t)(v >> (8 * j)));
        }
    }
    for (const char *p = body; *p != '\0'; ++p) {
        fuzz_w8(&w, (uint8_t)*p);
    }
    write_seed("fuzz_proxy_body", name, w.buf, w.len);
}

static void seeds_proxy_body(void)
{
    /* byte-level BPE ids of the tiny hybrid model; 0xc3 0xa9 split across two tokens,
     * one id past the vocabulary and one negative, as a buggy decode might send */
    static const int32_t text_ids[] = {72, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100};
    static const int32_t odd_ids[] = {99, 97, 102, 0xc3, 0xa9, 1 << 20, -5, 0xe2, 0x82};

    body_seed("text_prompt", text_ids, 11,
              "{\"model\": \"tiny\", \"prompt\": \"What is 12+30?\", \"max_tokens\": 16,"
              " \"temperature\": 0}");
    body_seed("token_prompt_stream", odd_ids, 9,
              "{\"prompt\": [1, 2, 3, 300], \"max_tokens\": 4, \"stream\": true,"
              " \"return_token_ids\": true, \"seed\": 7, \"ignore_eos\": true}");
    body_seed("unicode_prompt", text_ids, 3,
              "{\"prompt\": \"caf\\u00e9 \\ud83d\\ude00 \xe2\x82\xac\", \"n\": 1}");
    body_seed("refused_fields", NULL, 0,
              "{\"prompt\": \"x\", \"stop\": [\"\\n\"], \"logprobs\": 2}");
    body_seed("bad_values", NULL, 0,
              "{\"prompt\": \"x\", \"max_tokens\": 0, \"temperature\": -1, \"seed\": -3}");
    body_seed("huge_numbers", NULL, 0,
              "{\"prompt\": [1e999], \"max_tokens\": 1e999, \"temperature\": 1e999}");
    body_seed("unknown_model", NULL, 0, "{\"model\": \"gpt-9\", \"prompt\": \"x\"}");
    body_seed("nul_escape", NULL, 0, "{\"prompt\": \"a\\u0000b\"}");
    body_seed("trailing_bytes", NULL, 0, "{\"prompt\": \"x\"} {\"prompt\": \"y\"}");
    body_seed("not_an_object", NULL, 0, "[\"prompt\"]");
    body_seed("empty_prompt", NULL, 0, "{\"prompt\": \"\", \"max_tokens\": 8}");
    body_seed("empty", NULL, 0, "");
}

/* ---- raw HTTP requests to kvf-proxy ----------------------------------- */

static void http_seed(const char *name, const char *text)
{
    write_seed("fuzz_proxy_http", name, text, strlen(text));
}

static void seeds_proxy_http(void)
{
    http_seed("completion",
              "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              "Content-Length: 44\r\n\r\n"
              "{\"prompt\": \"What is 12+30?\", \"max_tokens\": 4}");
    http_seed("completion_stream_chunked",
              "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
              "1a\r\n{\"prompt\": [1, 2], \"stream\"\r\n8\r\n: true}\n\r\n0\r\n\r\n");
    http_seed("bad_json",
              "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 9\r\n\r\n{\"prompt\":");
    http_seed("get_routes",
              "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
              "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
              "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
              "GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n");
    http_seed("wrong_method", "DELETE /v1/completions HTTP/1.1\r\nHost: x\r\n\r\n");
    http_seed("declared_too_big",
              "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999\r\n\r\n{");
    http_seed("bad_content_length",
              "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n");
    http_seed("http10_no_host", "GET /health HTTP/1.0\r\n\r\n");
    http_seed("http2_version", "GET / HTTP/2.0\r\nHost: x\r\n\r\n");
    http_seed("garbage", "\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03");
    http_seed("truncated_headers", "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le");
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: fuzz_make_seeds OUT_DIR\n");
        return 2;
    }
    g_out = argv[1];
    if ((mkdir(g_out, 0755) != 0) && (errno != EEXIST)) {
        die("cannot create OUT_DIR");
    }
    seeds_handshake();
    seeds_xfer_params();
    seeds_side_channel();
    seeds_serve_control();
    seeds_proxy_body();
    seeds_proxy_http();
    return 0;
}
