/*
 * kvf xfer-test and kvf bench: a real prefill -> decode KV pull between two
 * processes, through the KV connector the daemons use (kvf_connector.h:
 * register_pool, serve, handshake, start_pull, poll, notify_release,
 * poll_release), with the whole control path of docs/ARCHITECTURE.md §3 except the
 * proxy (a pipe from the prefill child carries the packed transfer params,
 * which the decode side reads with the same decoder kvf-decode uses).
 *
 * Design. The decode process forks the prefill instance before touching UCX
 * or ZeroMQ (nothing to inherit). Each side creates one connector and runs
 * one thread per TP rank, each registering a host pool of num_blocks *
 * slots * page_size bytes. Prefill poisons its pool with one NaN pattern and
 * writes, into the request's pages only, values that are a pure function of
 * (layer, global KV head or conv channel or SSM head, token, element), so
 * replicated heads hold identical bytes and any misplaced byte shows. Decode
 * poisons its pool with another NaN pattern, handshakes, pulls on every
 * rank (the connector plans, posts, zeroes tails and sends the releases;
 * prefill ranks wait for them with poll_release and exit once all their
 * readers have released), then rebuilds the expected content of EVERY page
 * of its pool (pattern, zeroed tail, untouched Mamba padding, untouched
 * unrelated pages) and compares bytes.
 *
 * Fault flags (hidden) make the prefill advertise a wrong protocol version,
 * fingerprint or region length (it then serves its connector's metadata,
 * altered, on a side channel of its own: a lying peer is not a daemon), send
 * an out-of-range block id, or get killed by decode after the first window
 * of GETs, so refusal and robustness tests drive the same connector code as
 * the happy path.
 *
 * The bench times the pull through the connector and, as a reference, a
 * raw GET of the same bytes as one contiguous range per prefill rank read,
 * on a second, bare UCX agent per rank (the only UCX calls made here, and
 * never on the KV path).
 */
#include "kvf_xfer_tools.h"

#include "kvf_xt_int.h"
#include "kvf_engine_opts.h"

#include <limits.h>

/*
 * Parts: kvf_xt_pattern.c (the content pattern and the verify),
 * kvf_xt_ranks.c (setup of both sides), kvf_xt_prefill.c (the child),
 * kvf_xt_decode.c (the decode rank threads), kvf_xt_bench.c (descriptor
 * export, copy limit); this file: options, the run and its report.
 */

#define XT_FIELD(_n, _d, _h, _f, _t, _fl) {_n, _d, _h, offsetof(xt_opts_t, _f), _t, _fl}
#define XT_COMMON_FIELDS                                                                      \
    XT_FIELD("PREFILL_BLOCK_SIZE", "0", "prefill logical block size (0: derive)",            \
             prefill_block_size, KVF_CONFIG_TYPE_INT, 0),                                     \
    XT_FIELD("DECODE_BLOCK_SIZE", "0", "decode logical block size (0: derive)",              \
             decode_block_size, KVF_CONFIG_TYPE_INT, 0),                                      \
    XT_FIELD("PREFILL_KERNEL_SIZES", "MultipleOf(16)",                                        \
             "kernel block sizes the prefill attention kernel accepts", prefill_kernel_sizes, \
             KVF_CONFIG_TYPE_STRING, 0),                                                      \
    XT_FIELD("DECODE_KERNEL_SIZES", "MultipleOf(16)",                                         \
             "kernel block sizes the decode attention kernel accepts", decode_kernel_sizes,   \
             KVF_CONFIG_TYPE_STRING, 0),                                                      \
    KVF_ENGINE_OPT(BLOCK_SIZE, xt_opts_t, ),                                                  \
    XT_FIELD("KV_DTYPE", "bf16", "decode KV cache dtype", kv_dtype, KVF_CONFIG_TYPE_STRING, 0), \
    XT_FIELD("PREFILL_KV_DTYPE", "same", "prefill KV cache dtype (same: as decode)",         \
             prefill_kv_dtype, KVF_CONFIG_TYPE_STRING, 0),                                    \
    XT_FIELD("KV_LAYOUT", "layer-major", "decode attention KV block layout: layer-major or "  \
             "head-major (docs/ARCHITECTURE.md §7)", kv_layout, KVF_CONFIG_TYPE_STRING, 0),   \
    XT_FIELD("PREFILL_KV_LAYOUT", "same", "prefill attention KV block layout (same: as "      \
             "decode)", prefill_kv_layout, KVF_CONFIG_TYPE_STRING, 0),                        \
    XT_FIELD("SSM_DTYPE", "auto", "decode SSM state dtype (auto: the model's)", ssm_dtype,   \
             KVF_CONFIG_TYPE_STRING, 0),                                                      \
    XT_FIELD("PREFILL_SSM_DTYPE", "same", "prefill SSM state dtype", prefill_ssm_dtype,      \
             KVF_CONFIG_TYPE_STRING, 0),                                                      \
    XT_FIELD("CONV_DTYPE", "auto", "decode conv state dtype (auto: the model's)", conv_dtype, \
             KVF_CONFIG_TYPE_STRING, 0),                                                      \
    XT_FIELD("PREFILL_CONV_DTYPE", "same", "prefill conv state dtype", prefill_conv_dtype,   \
             KVF_CONFIG_TYPE_STRING, 0),                                                      \
    XT_FIELD("SPARE_BLOCKS", "3", "pool blocks beyond the request, per side", spare_blocks,  \
             KVF_CONFIG_TYPE_INT, 0),                                                         \
    XT_FIELD("TIMEOUT", "5s", "bound on every wait (handshake, transfer, release)",          \
             timeout_ms, KVF_CONFIG_TYPE_TIME, 0),                                            \
    XT_FIELD("BATCH_DESCS", "0", "GETs in flight per prefill rank read (0: all at once)",    \
             batch_descs, KVF_CONFIG_TYPE_INT, 0),                                            \
    XT_FIELD("PATH", "auto", "how decode pulls: auto (CUDA IPC when both pools are CUDA "      \
             "memory on one node, else UCX), ucx, ipc (CUDA IPC or refuse)", path,           \
             KVF_CONFIG_TYPE_STRING, 0),                                                      \
    XT_FIELD("POOL_ALLOC", "ucx", "pool memory: ucx (the connector allocates it: shared "   \
             "memory a local peer reads by a copy; the daemons' default) or heap "          \
             "(aligned_alloc)", \
             pool_alloc, KVF_CONFIG_TYPE_STRING, 0),                                         \
    XT_FIELD("DEVICE", "cpu", "where both sides' pools live: cpu, or cuda[:N] (GPU N's "    \
             "memory from kvf_device_alloc, registered with UCX as CUDA memory; the pattern " \
             "is copied in and the verify copies out; --pool-alloc does not apply)", device, \
             KVF_CONFIG_TYPE_STRING, 0),                                                      \
    XT_FIELD("NO_COALESCE", "no", "one descriptor per run (planner debugging)", no_coalesce, \
             KVF_CONFIG_TYPE_BOOL, 0),                                                        \
    XT_FIELD("FAULT_VERSION", "0", "prefill advertises this protocol version", fault_version, \
             KVF_CONFIG_TYPE_INT, KVF_CONFIG_FLAG_HIDDEN),                                    \
    XT_FIELD("FAULT_FINGERPRINT", "no", "prefill advertises a different model fingerprint",  \
             fault_fingerprint, KVF_CONFIG_TYPE_BOOL, KVF_CONFIG_FLAG_HIDDEN),                \
    XT_FIELD("FAULT_REGION_LEN", "no", "prefill advertises a region one page too long",      \
             fault_region_len, KVF_CONFIG_TYPE_BOOL, KVF_CONFIG_FLAG_HIDDEN),                 \
    XT_FIELD("FAULT_BLOCK_ID", "no", "prefill sends an out-of-range block id",               \
             fault_block_id, KVF_CONFIG_TYPE_BOOL, KVF_CONFIG_FLAG_HIDDEN),                   \
    XT_FIELD("FAULT_KILL_PREFILL", "no", "decode kills the prefill after the first batch",   \
             fault_kill_prefill, KVF_CONFIG_TYPE_BOOL, KVF_CONFIG_FLAG_HIDDEN)

static const kvf_config_field_t xt_test_table[] = {
    XT_FIELD("MODEL", "", "model config.json, or a folder holding one", model,
             KVF_CONFIG_TYPE_STRING, 0),
    XT_FIELD("LAYOUT", "1p1d", "P/D layout XpYd: prefill TP X, decode TP Y", layout,
             KVF_CONFIG_TYPE_STRING, 0),
    XT_COMMON_FIELDS,
    XT_FIELD("TOKENS", "200", "prompt tokens of the request", tokens, KVF_CONFIG_TYPE_INT, 0),
    XT_FIELD("VERIFY", "yes", "verify every byte of the decode pool", verify,
             KVF_CONFIG_TYPE_BOOL, 0),
    XT_FIELD("ITERS", "1", "transfers to time", iters, KVF_CONFIG_TYPE_INT,
             KVF_CONFIG_FLAG_HIDDEN),
    {NULL, NULL, NULL, 0, 0, 0},
};

static const kvf_config_field_t xt_bench_table[] = {
    XT_FIELD("MODEL", "", "model config.json (default: nemotron-nano-9b-v2 from "
             "$KVF_SHARED_MODELS or tests/data/models)", model, KVF_CONFIG_TYPE_STRING, 0),
    XT_FIELD("LAYOUT", "4p2d", "P/D layout XpYd: prefill TP X, decode TP Y", layout,
             KVF_CONFIG_TYPE_STRING, 0),
    XT_COMMON_FIELDS,
    XT_FIELD("TOKENS", "8192", "prompt tokens of the request", tokens, KVF_CONFIG_TYPE_INT, 0),
    XT_FIELD("VERIFY", "no", "verify every byte after the first pull", verify,
             KVF_CONFIG_TYPE_BOOL, 0),
    XT_FIELD("ITERS", "5", "timed pulls (the median is reported)", iters, KVF_CONFIG_TYPE_INT,
             0),
    XT_FIELD("DESCS_OUT", "", "write the request's descriptor lists (JSON) to this file",
             descs_out, KVF_CONFIG_TYPE_STRING, 0),
    XT_FIELD("COPY_LIMIT", "yes", "also time memcpy of the same descriptor lists, one thread "
             "per decode rank (this machine's copy limit)", copy_limit, KVF_CONFIG_TYPE_BOOL, 0),
    XT_FIELD("PLAN_REPS", "0", "also time the planner alone: plan decode rank 0's request this "
             "many times in a row (0: not; at most 1000000)", plan_reps, KVF_CONFIG_TYPE_INT, 0),
    {NULL, NULL, NULL, 0, 0, 0},
};

/* ---- options ----------------------------------------------------------- */

/* "same" (the prefill side's default) reads like "auto": the other side's dtype */
static int xt_dtype(const char *flag, const char *text, kvf_dtype_t same, kvf_dtype_t *out)
{
    if (strcmp(text, "same") == 0) {
        text = "auto";
    }
    return (kvf_engine_opts_dtype(flag, text, same, false, out) == KVF_OK) ? 0 : -1;
}

/* --device: "cpu", "cuda" (GPU 0) or "cuda:N". Returns 0, or -1 after naming the value. */
static int xt_device_parse(const char *prog, xt_ctx_t *c)
{
    const char *d = c->o.device;
    char *end = NULL;
    long n = 0;

    c->o.dev_kind = KVF_DEVICE_CPU;
    c->o.dev_ordinal = 0;
    if (strcmp(d, "cpu") == 0) {
        return 0;
    }
    if ((strncmp(d, "cuda", 4) == 0) && ((d[4] == '\0') || (d[4] == ':'))) {
        if (d[4] == ':') {
            n = strtol(d + 5, &end, 10);
        }
        if ((d[4] == '\0') || ((end != d + 5) && (*end == '\0') && (n >= 0) && (n < 1024))) {
            c->o.dev_kind = KVF_DEVICE_CUDA;
            c->o.dev_ordinal = (int)n;
            return 0;
        }
    }
    kvf_error("%s: --device must be cpu, cuda or cuda:N (N in 0..1023), not '%s'", prog, d);
    return -1;
}

/* --path: auto, ucx or ipc (CUDA pools only). Returns 0, or -1 after naming the value. */
static int xt_path_parse(const char *prog, xt_ctx_t *c)
{
    const char *p = c->o.path;

    if (strcmp(p, "auto") == 0) {
        c->o.path_kind = KVF_CONNECTOR_PATH_AUTO;
    } else if (strcmp(p, "ucx") == 0) {
        c->o.path_kind = KVF_CONNECTOR_PATH_UCX;
    } else if (strcmp(p, "ipc") == 0) {
        c->o.path_kind = KVF_CONNECTOR_PATH_IPC;
    } else {
        kvf_error("%s: --path must be auto, ucx or ipc, not '%s'", prog, p);
        return -1;
    }
    if ((c->o.path_kind == KVF_CONNECTOR_PATH_IPC) && (c->o.dev_kind != KVF_DEVICE_CUDA)) {
        kvf_error("%s: --path ipc needs --device cuda[:N], not '%s': CUDA IPC maps device "
                  "memory; host pools are read over UCX (shared memory on one node)", prog,
                  c->o.device);
        return -1;
    }
    return 0;
}

/* Handshake through the connector. Returns 1 when the transfer may go. */
static int xt_decode_handshake(xt_ctx_t *c, double *hs_ms)
{
    char why[512];
    uint64_t t0 = kvf_time_now_ns();
    kvf_status_t status;

    status = c->xops->handshake(c->conn, c->pm.engine_id, c->pm.host, c->pm.port, why,
                                sizeof(why));
    *hs_ms = xt_ms(kvf_time_now_ns() - t0);
    if (status == KVF_ERR_REFUSED) {
        printf("%s\n", (why[0] != '\0') ? why : "handshake refused");
        return 0;
    }
    if (status != KVF_OK) {
        printf("xfer-test: %s\n", (why[0] != '\0') ? why : kvf_status_str(status));
        return 0;
    }
    return 1;
}

/* Why the connector refused the pull: name the block id that lies outside the prefill pool. */
static void xt_explain_refusal(const xt_ctx_t *c, kvf_status_t status)
{
    for (int gi = 0; gi < c->pm.num_groups; ++gi) {
        for (int i = 0; i < c->pm.num_ids[gi]; ++i) {
            if ((int64_t)c->pm.ids[gi][i] >= c->pre.num_blocks) {
                printf("xfer-test: transfer refused: block id %d of group %d is out of range "
                       "[0, %" PRId64 ") of the prefill pool\n", c->pm.ids[gi][i], gi,
                       c->pre.num_blocks);
                return;
            }
        }
    }
    printf("xfer-test: transfer refused by the connector: %s\n", kvf_status_str(status));
}

/* What the decode ranks did, summed over ranks. */
typedef struct xt_totals {
    uint64_t     bytes, zero, pages, elts, ops, raw_bytes;
    size_t       descs;
    int          reads;
    bool         refused;        /* the connector refused start_pull */
    kvf_status_t refusal;
} xt_totals_t;

/* What came through the pipe from the prefill child. */
typedef struct xt_pipe_in {
    uint8_t *buf;
    uint32_t len;
    bool     have_params, have_raw;
} xt_pipe_in_t;

/*
 * The decode side's connector and rank threads, up to the first barrier
 * (pools registered); sets c->go from the ranks' setup. Returns -1 when the
 * connector or the rank table could not be made (no thread started).
 */
static int xt_start_ranks(xt_ctx_t *c)
{
    c->ranks = calloc((size_t)c->dec.tp, sizeof(*c->ranks));
    if ((c->ranks == NULL) || (kvf_xt_conn_create(c, &c->dec) != KVF_OK)) {
        c->go = 0;
        return -1;
    }
    kvf_xt_start_ranks(c, &c->dec, kvf_xt_decode_thread);
    pthread_barrier_wait(&c->barrier);          /* decode pools registered */

    c->go = 1;
    for (int r = 0; r < c->dec.tp; ++r) {
        if (c->ranks[r].status != KVF_OK) {
            printf("xfer-test: decode rank %d setup failed: %s\n", r,
                   kvf_status_str(c->ranks[r].status));
            c->go = 0;
        }
    }
    return 0;
}

/*
 * The proxy's role: carry the transfer params (bench: and the raw agents'
 * metadata) from prefill to decode, then handshake. Clears c->go on failure.
 */
static void xt_receive(xt_ctx_t *c, int fd, xt_pipe_in_t *in, double *hs_ms)
{
    if (c->go && ((in->buf = kvf_xt_read_msg(fd, (int)c->o.timeout_ms * 4, &in->len)) == NULL)) {
        printf("xfer-test: prefill did not come up within %d ms\n", (int)c->o.timeout_ms * 4);
        c->go = 0;
    }
    if (c->go) {
        /* the decoder kvf-decode uses on the params inside a DecodeRequest */
        if (kvf_xfer_params_msg_unpack(in->buf, in->len, &c->pm) != KVF_OK) {
            printf("xfer-test: malformed transfer params from prefill\n");
            c->go = 0;
        } else {
            in->have_params = true;
        }
    }
    if (c->go && c->bench) {
        free(in->buf);
        in->buf = kvf_xt_read_msg(fd, (int)c->o.timeout_ms, &in->len);
        if ((in->buf == NULL) ||
            (kvf_handshake_reply_unpack(in->buf, in->len, &c->raw) != KVF_OK) ||
            (c->raw.num_ranks != c->pre.tp)) {
            printf("xfer-test: malformed raw-reference metadata from prefill\n");
            c->go = 0;
        } else {
            in->have_raw = true;
        }
    }
    if (c->go) {
        c->go = xt_decode_handshake(c, hs_ms);
    }
}

/* Main's side of the barriers kvf_xt_decode_thread passes, then join the ranks. */
static void xt_follow_ranks(xt_ctx_t *c)
{
    pthread_barrier_wait(&c->barrier);          /* verdict published */
    if (c->go) {
        for (int p = 0; p < c->npulls; ++p) {
            if (kvf_xt_raw_before(c, p)) {
                pthread_barrier_wait(&c->barrier);  /* raw */
            }
            pthread_barrier_wait(&c->barrier);      /* pull */
        }
    }
    for (int r = 0; r < c->dec.tp; ++r) {
        pthread_join(c->ranks[r].thread, NULL);
    }
    pthread_barrier_destroy(&c->barrier);
}

/* Sum the ranks' results into @a t and print each rank's failure. Returns 1 if one failed. */
static int xt_collect(const xt_ctx_t *c, xt_totals_t *t)
{
    int rc = 0;

    memset(t, 0, sizeof(*t));
    t->refusal = KVF_OK;
    for (int r = 0; r < c->dec.tp; ++r) {
        const xt_rank_t *x = &c->ranks[r];
        t->ops += x->ops_posted;
        if ((x->start_status == KVF_ERR_OUT_OF_RANGE) ||
            (x->start_status == KVF_ERR_INVALID_PARAM)) {
            t->refused = true;
            t->refusal = x->start_status;
        }
        if (x->status != KVF_OK) {
            printf("xfer-test: FAILED: %s\n", (x->err[0] != '\0') ? x->err :
                   kvf_status_str(x->status));
            if ((c->t_kill != 0) && (x->t_fail != 0)) {
                printf("xfer-test: peer error on decode rank %d %.1f ms after the prefill was "
                       "killed\n", r, xt_ms(x->t_fail - c->t_kill));
            }
            rc = 1;
        }
        t->bytes += x->bytes;
        t->zero += x->zero_bytes;
        t->descs += x->descs;
        t->pages += x->pages_checked;
        t->elts += x->elements_checked;
        t->raw_bytes += x->raw_bytes;
        t->reads += x->reads;
    }
    return rc;
}

/* The path line: which path moved the bytes, and for UCX why not the same-node one. */
static void xt_report_path(const xt_ctx_t *c, const xt_totals_t *t)
{
    uint64_t ops = 0;
    int ipc = 0;

    for (int r = 0; r < c->dec.tp; ++r) {
        ipc += (c->ranks[r].path == KVF_CONNECTOR_PATH_IPC);
        ops += c->ranks[r].gather_ops;
    }
    if (ipc == c->dec.tp) {
        printf("path: cuda-ipc (same node, one gather of %zu ranges)\n", t->descs);
        printf("gather: %d decode rank(s), each one kernel of its ranges and zero ranges: %"
               PRIu64 " ops of at most %u bytes in all\n", c->dec.tp, ops, KVF_GATHER_CHUNK);
        return;
    }
    for (int r = 0; r < c->dec.tp; ++r) {
        if (c->ranks[r].path != KVF_CONNECTOR_PATH_IPC) {
            printf("path: ucx (%s%s%s)\n", (c->ranks[r].transports[0] != '\0') ?
                   c->ranks[r].transports : "", (c->ranks[r].transports[0] != '\0') ? "; " : "",
                   c->ranks[r].path_why);
            break;
        }
    }
    if (ipc > 0) {
        printf("path: %d of %d decode rank(s) took cuda-ipc\n", ipc, c->dec.tp);
    }
}

/* Medians over the timed pulls (the span from the first rank's start to the last one's end). */
static void xt_medians(const xt_ctx_t *c, int n, uint64_t *kv_p, uint64_t *raw_p,
                       uint64_t *post_p)
{
    uint64_t kv[XT_MAX_ITERS], raw[XT_MAX_ITERS], post[XT_MAX_ITERS];

    for (int it = 0; it < n; ++it) {
        uint64_t s = UINT64_MAX, e = 0, rs = UINT64_MAX, re = 0, p = 0;
        int k = kvf_xt_timed_pull(c, it);
        for (int r = 0; r < c->dec.tp; ++r) {
            const xt_rank_t *x = &c->ranks[r];
            s = (x->t_start[k] < s) ? x->t_start[k] : s;
            e = (x->t_end[k] > e) ? x->t_end[k] : e;
            p = (x->t_post[k] - x->t_start[k] > p) ? x->t_post[k] - x->t_start[k] : p;
            rs = (x->t_raw_start[it] < rs) ? x->t_raw_start[it] : rs;
            re = (x->t_raw_end[it] > re) ? x->t_raw_end[it] : re;
        }
        kv[it] = (e > s) ? e - s : 1;
        raw[it] = (re > rs) ? re - rs : 1;
        post[it] = p;
    }
    qsort(kv, (size_t)n, sizeof(kv[0]), xt_cmp_u64);
    qsort(raw, (size_t)n, sizeof(raw[0]), xt_cmp_u64);
    qsort(post, (size_t)n, sizeof(post[0]), xt_cmp_u64);
    *kv_p = kv[n / 2];
    *raw_p = raw[n / 2];
    *post_p = post[n / 2];
}

/*
 * Host time per descriptor of starting a pull: one decode rank's start_pull
 * (plan, then every GET posted) over the descriptors that rank posted; per
 * pull the rank slowest per descriptor, the median over the pulls. On device
 * memory a GET is an asynchronous copy, so this is the host cost that bounds
 * the pull; on host memory over shared memory it includes the copies.
 */
static void xt_post_per_desc(const xt_ctx_t *c, int n, size_t *descs_p, uint64_t *ns_p,
                             uint64_t *plan_p)
{
    uint64_t ns[XT_MAX_ITERS], plan[XT_MAX_ITERS];
    size_t descs[XT_MAX_ITERS];
    double per[XT_MAX_ITERS];
    int order[XT_MAX_ITERS];

    for (int it = 0; it < n; ++it) {
        int k = kvf_xt_timed_pull(c, it);
        per[it] = -1.0;
        ns[it] = 0;
        plan[it] = 0;
        descs[it] = 0;
        for (int r = 0; r < c->dec.tp; ++r) {
            const xt_rank_t *x = &c->ranks[r];
            uint64_t t = x->t_post[k] - x->t_start[k];
            double p = (double)t / (double)(x->descs ? x->descs : 1);
            if (p > per[it]) {
                per[it] = p;
                ns[it] = t;
                plan[it] = (x->t_plan[k] < t) ? x->t_plan[k] : t;
                descs[it] = x->descs;
            }
        }
        order[it] = it;
    }
    for (int i = 1; i < n; ++i) {   /* a handful of pulls: insertion sort by ns/desc */
        for (int j = i; (j > 0) && (per[order[j]] < per[order[j - 1]]); --j) {
            int tmp = order[j];
            order[j] = order[j - 1];
            order[j - 1] = tmp;
        }
    }
    *descs_p = descs[order[n / 2]];
    *ns_p = ns[order[n / 2]];
    *plan_p = plan[order[n / 2]];
}

/*
 * The same start_pull in thread CPU time (plan + post, not the time the thread waited
 * for a core: on a busy host the wall figures above include that): per pull the rank
 * slowest per descriptor, the median over the pulls, in ns per descriptor.
 */
static double xt_cpu_per_desc(const xt_ctx_t *c, int n)
{
    double per[XT_MAX_ITERS];

    for (int it = 0; it < n; ++it) {
        int k = kvf_xt_timed_pull(c, it);
        per[it] = 0;
        for (int r = 0; r < c->dec.tp; ++r) {
            const xt_rank_t *x = &c->ranks[r];
            double p = (double)x->t_cpu[k] / (double)(x->descs ? x->descs : 1);
            per[it] = (p > per[it]) ? p : per[it];
        }
    }
    for (int i = 1; i < n; ++i) {
        for (int j = i; (j > 0) && (per[j] < per[j - 1]); --j) {
            double tmp = per[j];
            per[j] = per[j - 1];
            per[j - 1] = tmp;
        }
    }
    return per[n / 2];
}

/* Planning alone: per pull the slowest decode rank's start_pull before its first post. */
static uint64_t xt_plan_median(const xt_ctx_t *c, int n)
{
    uint64_t plan[XT_MAX_ITERS];

    for (int it = 0; it < n; ++it) {
        int k = kvf_xt_timed_pull(c, it);
        plan[it] = 0;
        for (int r = 0; r < c->dec.tp; ++r) {
            plan[it] = (c->ranks[r].t_plan[k] > plan[it]) ? c->ranks[r].t_plan[k] : plan[it];
        }
    }
    qsort(plan, (size_t)n, sizeof(plan[0]), xt_cmp_u64);
    return plan[n / 2];
}

/*
 * --plan-reps N: decode rank 0's plan of the request N times deriving everything and N times
 * with the pair's pieces (kvf_xfer_plan_create and destroy, what start_pull runs before its
 * first GET; a connector reuses the pieces from a pair's second pull), warm caches: the
 * planner's own cost without the pull around it. Each plan must equal @a ref. Returns 1 on
 * failure.
 */
static int xt_plan_alone(const xt_ctx_t *c, const kvf_xfer_plan_t *ref)
{
    kvf_xfer_pieces_t *pieces = NULL;
    uint64_t ns[2] = {0, 0};

    if (c->o.plan_reps <= 0) {
        return 0;
    }
    if (kvf_xt_pieces_rank(c, 0, &pieces) != KVF_OK) {
        printf("bench: decode rank 0's pieces cannot be built\n");
        return 1;
    }
    /* each plan deriving everything, and each with the pair's pieces (a connector's pulls
     * after the pair's first), in alternating rounds of 100 so that neither gets the
     * warmer caches or the quieter moment */
    for (int i = 0; i < 2 * c->o.plan_reps; ++i) {
        int with = (i / 100) % 2, k = i / 2;
        uint64_t t0 = kvf_time_now_ns();
        kvf_xfer_plan_t *p = NULL;
        if ((kvf_xt_plan_rank_with(c, 0, with ? pieces : NULL, &p) != KVF_OK) ||
            (p->total_descs != ref->total_descs) || (p->total_bytes != ref->total_bytes)) {
            printf("bench: plan %d of --plan-reps differs from the first\n", k);
            kvf_xfer_plan_destroy(p);
            kvf_xfer_pieces_destroy(pieces);
            return 1;
        }
        kvf_xfer_plan_destroy(p);
        ns[with] += kvf_time_now_ns() - t0;
    }
    kvf_xfer_pieces_destroy(pieces);
    printf("plan alone: %.2f us per plan (decode rank 0, %zu descriptors, %d plans each way"
           " in alternating rounds of 100, warm caches); %.2f us with the pair's pieces"
           " reused\n",
           (double)ns[0] / 1e3 / c->o.plan_reps, ref->total_descs, c->o.plan_reps,
           (double)ns[1] / 1e3 / c->o.plan_reps);
    return 0;
}

/* bench: --descs-out and the copy limit, from this side's own plans. Returns 1 on failure. */
static int xt_bench_exports(const xt_ctx_t *c, const xt_totals_t *t, uint64_t kv_ns)
{
    kvf_xfer_plan_t *plans[KVF_XFER_MAX_TP] = {NULL};
    int planned = 1, rc = 0;

    for (int d = 0; d < c->dec.tp; ++d) {
        planned = planned && (kvf_xt_plan_rank(c, d, &plans[d]) == KVF_OK);
    }
    if (!planned) {
        printf("bench: planning the descriptor lists for export failed\n");
        rc = 1;
    } else {
        if ((c->o.descs_out[0] != '\0') && (kvf_xt_write_descs(c, plans) != 0)) {
            rc = 1;
        } else if (c->o.descs_out[0] != '\0') {
            printf("descriptor lists: written to %s\n", c->o.descs_out);
        }
        rc |= xt_plan_alone(c, plans[0]);
        if (c->o.copy_limit && (c->o.dev_kind != KVF_DEVICE_CPU)) {
            uint64_t ns = kvf_xt_device_copy_limit(c, t->bytes);
            double kv_gbs = (double)t->bytes / (double)kv_ns;
            if (ns > 0) {
                printf("copy limit (one device-to-device copy of the same bytes on %s): "
                       "%.3f ms, %.2f GB/s (median); kv/copy %.3f\n", c->o.device, xt_ms(ns),
                       (double)t->bytes / (double)ns, kv_gbs / ((double)t->bytes / (double)ns));
            }
        } else if (c->o.copy_limit) {
            uint64_t ns = kvf_xt_copy_limit(c, plans);
            double kv_gbs = (double)t->bytes / (double)kv_ns;
            if (ns > 0) {
                printf("copy limit (memcpy of the same descriptors, %d threads): "
                       "%.3f ms, %.2f GB/s (median); kv/copy %.3f\n", c->dec.tp,
                       xt_ms(ns), (double)t->bytes / (double)ns,
                       kv_gbs / ((double)t->bytes / (double)ns));
            }
        }
    }
    for (int d = 0; d < c->dec.tp; ++d) {
        kvf_xfer_plan_destroy(plans[d]);
    }
    return rc;
}

/*
 * What the daemons' KV digest (--kv-digest on) costs: decode hashes what
 * landed (the slowest rank's time, median over the pulls) and prefill the
 * same bytes of its pool, so the pull grows by about twice this.
 */
static void xt_report_digest(const xt_ctx_t *c, int n, uint64_t kv)
{
    uint64_t dg[XT_MAX_ITERS];

    for (int it = 0; it < n; ++it) {
        int k = kvf_xt_timed_pull(c, it);
        dg[it] = 0;
        for (int r = 0; r < c->dec.tp; ++r) {
            dg[it] = (c->ranks[r].t_digest[k] > dg[it]) ? c->ranks[r].t_digest[k] : dg[it];
        }
    }
    qsort(dg, (size_t)n, sizeof(dg[0]), xt_cmp_u64);
    if (dg[n / 2] > 0) {
        printf("kv digest: %.3f ms (XXH3-64 of the landed bytes, slowest rank%s) = %.1f %% of"
               " the pull; with prefill hashing the same bytes, %.1f %% (--kv-digest off"
               " saves it)\n", xt_ms(dg[n / 2]), c->bench ? ", median" : "",
               100.0 * (double)dg[n / 2] / (double)kv, 200.0 * (double)dg[n / 2] / (double)kv);
    }
}

/* The figures of a pull that went (transfer, timings; bench: raw GET, ratio). Returns rc. */
static int xt_report(const xt_ctx_t *c, const xt_totals_t *t, double hs_ms, int rc)
{
    int n = c->bench ? c->o.iters : 1;
    uint64_t kv, raw, post;

    xt_medians(c, n, &kv, &raw, &post);
    if (c->ranks[0].transports[0] != '\0') {   /* same UCX config as the connector's */
        printf("transports: %s\n", c->ranks[0].transports);
    }
    printf("handshake: %.2f ms (%d prefill ranks, compatible)\n", hs_ms, c->pre.tp);
    printf("transfer: %" PRIu64 " bytes, %zu descriptors (GET operations), %d reads "
           "(prefill->decode rank pairs), zeroed %" PRIu64 " bytes\n", t->bytes,
           t->descs, t->reads, t->zero);
    xt_report_path(c, t);
    printf("transfer time: %.3f ms, %.2f GB/s%s (connector: start_pull to poll done)\n",
           xt_ms(kv), (double)t->bytes / (double)kv, c->bench ? " (median)" : "");
    printf("plan+post time: %.3f ms (start_pull, slowest rank%s)\n", xt_ms(post),
           c->bench ? ", median" : "");
    {
        size_t pd;
        uint64_t pns, pplan;
        double cpu = xt_cpu_per_desc(c, n);
        xt_post_per_desc(c, n, &pd, &pns, &pplan);
        printf("post: %zu descriptors, %.1f us, %.3f us/desc (one decode rank's start_pull:"
               " plan + every GET posted; the rank slowest per descriptor%s)\n", pd,
               (double)pns / 1e3, (double)pns / 1e3 / (double)(pd ? pd : 1),
               c->bench ? ", median" : "");
        printf("plan: %.1f us per decode rank (start_pull before its first GET or gather: the"
               " plan, endpoints, zero list; slowest rank%s)\n",
               (double)xt_plan_median(c, n) / 1e3, c->bench ? ", median" : "");
        printf("post split: the post line's %.1f us = %.1f us planning + %.1f us posting "
               "(%.3f us/desc; that one rank's pull, so its planning may differ from the plan "
               "line's slowest rank)\n", (double)pns / 1e3, (double)pplan / 1e3,
               (double)(pns - pplan) / 1e3, (double)(pns - pplan) / 1e3 / (double)(pd ? pd : 1));
        printf("post cpu: %.1f us, %.3f us/desc (start_pull in thread CPU time: plan + post,"
               " not the time the thread waited for a core; the rank slowest per descriptor%s)\n",
               cpu * (double)pd / 1e3, cpu / 1e3, c->bench ? ", median" : "");
    }
    xt_report_digest(c, n, kv);
    if (c->bench) {
        double kv_gbs = (double)t->bytes / (double)kv;
        double raw_gbs = (double)t->raw_bytes / (double)raw;
        printf("raw contiguous GET: %" PRIu64 " bytes in %.3f ms, %.2f GB/s (median)\n",
               t->raw_bytes, xt_ms(raw), raw_gbs);
        printf("ratio kv/raw: %.3f\n", kv_gbs / raw_gbs);
        printf("descriptors per request: %zu total, %.1f per read, %.0f bytes average\n",
               t->descs, (double)t->descs / (t->reads ? t->reads : 1),
               (double)t->bytes / (double)(t->descs ? t->descs : 1));
    }
    if (c->bench && (rc == 0) &&
        ((c->o.descs_out[0] != '\0') || c->o.copy_limit || (c->o.plan_reps > 0))) {
        rc |= xt_bench_exports(c, t, kv);
    }
    if (c->o.verify && (rc == 0)) {
        printf("verify: ok (%" PRIu64 " elements in %" PRIu64 " pages; zeroed tails and "
               "untouched pages intact)\n", t->elts, t->pages);
    }
    return rc;
}

/*
 * One run: fork the prefill child, start the decode ranks, carry the params,
 * handshake, drive the pulls, collect, report, reap. Returns the exit code.
 */
static int xt_run(xt_ctx_t *c)
{
    int pfd[2], rc = 1, child_rc;
    double hs_ms = 0;
    xt_pipe_in_t in = {0};
    xt_totals_t t;

    if (pipe(pfd) != 0) {
        kvf_error("pipe failed: %m");
        return 1;
    }
    fflush(NULL);
    c->child = fork();
    if (c->child < 0) {
        kvf_error("fork failed: %m");
        return 1;
    }
    if (c->child == 0) {
        close(pfd[0]);
        _exit(kvf_xt_prefill_main(c, pfd[1]));
    }
    close(pfd[1]);

    if (xt_start_ranks(c) != 0) {
        goto out_reap;
    }
    xt_receive(c, pfd[0], &in, &hs_ms);
    xt_follow_ranks(c);

    rc = c->go ? 0 : 1;
    rc |= xt_collect(c, &t);
    if (t.refused) {
        xt_explain_refusal(c, t.refusal);
    }
    if (c->go && !t.refused) {
        rc = xt_report(c, &t, hs_ms, rc);
    }
    printf("rdma operations posted: %" PRIu64 " (every GET of this run: each pull's "
           "descriptors, warm-up and timed pulls%s; the transfer line counts one pull)\n", t.ops,
           c->bench ? ", and the raw contiguous GETs" : "");

out_reap:
    if (!c->go || (rc != 0)) {
        kill(c->child, SIGTERM);
    }
    child_rc = kvf_xt_reap(c->child, (int)c->o.timeout_ms * 2);
    if (c->go && (rc == 0) && (child_rc != 0)) {
        printf("xfer-test: FAILED: prefill exited with %d\n", child_rc);
        rc = 1;
    }
    if (c->conn != NULL) {
        c->xops->destroy(c->conn);
        c->conn = NULL;
    }
    for (int r = 0; (c->ranks != NULL) && (r < c->dec.tp); ++r) {
        kvf_xt_pool_free(&c->ranks[r]);
    }
    close(pfd[0]);
    free(in.buf);
    if (in.have_params) {
        kvf_xfer_params_msg_cleanup(&c->pm);
    }
    if (in.have_raw) {
        kvf_handshake_reply_cleanup(&c->raw);
    }
    printf("%s: %s\n", c->bench ? "bench" : "xfer-test", (rc == 0) ? "PASS" : "FAIL");
    return rc;
}

/*
 * kvf bench's default model: nemotron-nano-9b-v2.config.json in $KVF_SHARED_MODELS, else in
 * tests/data/models under this directory, else under the source tree this binary was built
 * in (build/bin/kvf -> ../../tests/data/models), so it runs from any directory.
 */
static void xt_default_model(char *out, size_t cap)
{
    static const char name[] = "nemotron-nano-9b-v2.config.json";
    const char *dir = getenv("KVF_SHARED_MODELS");
    char self[PATH_MAX];
    ssize_t n;

    if (dir != NULL) {
        snprintf(out, cap, "%s/%s", dir, name);
        return;
    }
    snprintf(out, cap, "tests/data/models/%s", name);
    if (access(out, R_OK) == 0) {
        return;
    }
    n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n > 0) {
        char *slash;
        self[n] = '\0';
        for (int up = 0; up < 3; ++up) {   /* kvf, bin/, build/ */
            slash = strrchr(self, '/');
            if (slash != NULL) {
                *slash = '\0';
            }
        }
        char path[PATH_MAX + sizeof(name) + 32];
        int len = snprintf(path, sizeof(path), "%s/tests/data/models/%s", self, name);
        if ((len > 0) && ((size_t)len < cap) && (access(path, R_OK) == 0)) {
            memcpy(out, path, (size_t)len + 1);
            return;
        }
    }
    snprintf(out, cap, "tests/data/models/%s", name);   /* the error names this one */
}

static int xt_main(int argc, char **argv, bool bench)
{
    xt_ctx_t *c = calloc(1, sizeof(*c));
    const char *prog = bench ? "kvf bench" : "kvf xfer-test";
    bool exit_now = false;
    kvf_dtype_t d;
    int rc = 2;

    if (c == NULL) {
        return 1;
    }
    c->bench = bench;
    if (kvf_config_parse(bench ? xt_bench_table : xt_test_table, prog, argc, argv, &c->o,
                         &exit_now) != KVF_OK) {
        goto out;
    }
    if (exit_now) {
        rc = 0;
        goto out;
    }
    if ((c->o.model[0] == '\0') && bench) {
        xt_default_model(c->o.model, sizeof(c->o.model));
    }
    if (c->o.model[0] == '\0') {
        kvf_error("%s: --model is required", prog);
        goto out;
    }
    if ((c->o.tokens < 1) || (c->o.iters < 1) || (c->o.iters > XT_MAX_ITERS) ||
        (c->o.spare_blocks < 0) || (c->o.timeout_ms < 1) || (c->o.batch_descs < 0)) {
        kvf_error("%s: --tokens, --iters (<= %d), --timeout must be positive", prog,
                  XT_MAX_ITERS);
        goto out;
    }
    if ((c->o.plan_reps < 0) || (c->o.plan_reps > 1000000)) {
        kvf_error("%s: --plan-reps %d is outside 0..1000000", prog, c->o.plan_reps);
        goto out;
    }
    if ((strcmp(c->o.pool_alloc, "heap") != 0) && (strcmp(c->o.pool_alloc, "ucx") != 0)) {
        kvf_error("%s: --pool-alloc must be heap or ucx, not '%s'", prog, c->o.pool_alloc);
        goto out;
    }
    if ((xt_device_parse(prog, c) != 0) || (xt_path_parse(prog, c) != 0)) {
        goto out;
    }
    c->o.ucx_pools = (strcmp(c->o.pool_alloc, "ucx") == 0) && (c->o.dev_kind == KVF_DEVICE_CPU);
    if (c->o.fault_kill_prefill && (c->o.batch_descs == 0)) {
        c->o.batch_descs = 1;   /* "mid-transfer" needs more than one batch */
    }
    if ((kvf_layout_parse(c->o.layout, &c->lay) != KVF_OK) ||
        (c->lay.prefill_tp > KVF_XFER_MAX_TP) || (c->lay.decode_tp > KVF_XFER_MAX_TP)) {
        goto out;
    }
    rc = 1;
    if (kvf_model_config_load(c->o.model, &c->cfg) != KVF_OK) {
        goto out;
    }
    c->layout = malloc(sizeof(*c->layout));
    if ((c->layout == NULL) || (kvf_cache_layout_build(&c->cfg, c->layout) != KVF_OK)) {
        goto out;
    }
    rc = 2;
    /* decode params first; prefill defaults to the same */
    kvf_cache_params_default(&c->cfg, &c->dec.params);
    c->dec.params.user_block_size = c->o.block_size;
    c->dec.params.block_size = c->o.decode_block_size;
    if ((xt_dtype("kv-dtype", c->o.kv_dtype, c->dec.params.kv_dtype, &c->dec.params.kv_dtype) != 0) ||
        (xt_dtype("ssm-dtype", c->o.ssm_dtype, c->dec.params.ssm_dtype, &c->dec.params.ssm_dtype) != 0) ||
        (xt_dtype("conv-dtype", c->o.conv_dtype, c->dec.params.conv_dtype, &c->dec.params.conv_dtype) != 0) ||
        (kvf_kernel_sizes_parse(c->o.decode_kernel_sizes, &c->dec.params.kernel_sizes) != KVF_OK) ||
        (kvf_kv_layout_parse(c->o.kv_layout, "--kv-layout", &c->dec.params.kv_layout) != KVF_OK)) {
        goto out;
    }
    c->pre.params = c->dec.params;
    c->pre.params.block_size = c->o.prefill_block_size;
    d = c->dec.params.kv_dtype;
    if ((xt_dtype("prefill-kv-dtype", c->o.prefill_kv_dtype, d, &c->pre.params.kv_dtype) != 0) ||
        (xt_dtype("prefill-ssm-dtype", c->o.prefill_ssm_dtype, c->dec.params.ssm_dtype,
                  &c->pre.params.ssm_dtype) != 0) ||
        (xt_dtype("prefill-conv-dtype", c->o.prefill_conv_dtype, c->dec.params.conv_dtype,
                  &c->pre.params.conv_dtype) != 0) ||
        (kvf_kernel_sizes_parse(c->o.prefill_kernel_sizes, &c->pre.params.kernel_sizes) != KVF_OK) ||
        ((strcmp(c->o.prefill_kv_layout, "same") != 0) &&
         (kvf_kv_layout_parse(c->o.prefill_kv_layout, "--prefill-kv-layout",
                              &c->pre.params.kv_layout) != KVF_OK))) {
        goto out;
    }
    rc = 1;
    if ((kvf_xt_side_init(c, &c->pre, true) != KVF_OK) || (kvf_xt_side_init(c, &c->dec, false) != KVF_OK)) {
        goto out;
    }
    printf("%s: %s layout %dp%dd, %d tokens\n"
           "  prefill: block %d kernel %d %s, kv/conv/ssm %s/%s/%s, pool %" PRId64 " blocks x %d "
           "slots x %zu B\n"
           "  decode:  block %d kernel %d %s, kv/conv/ssm %s/%s/%s, pool %" PRId64 " blocks x %d "
           "slots x %zu B\n", prog, c->o.model, c->lay.prefill_tp, c->lay.decode_tp,
           c->o.tokens, c->pre.geom[0].block_size, c->pre.geom[0].kernel_block_size,
           kvf_kv_layout_name((int)c->pre.params.kv_layout),
           kvf_dtype_name(c->pre.params.kv_dtype), kvf_dtype_name(c->pre.params.conv_dtype),
           kvf_dtype_name(c->pre.params.ssm_dtype), c->pre.num_blocks, c->layout->slots,
           c->pre.geom[0].page_size, c->dec.geom[0].block_size,
           c->dec.geom[0].kernel_block_size, kvf_kv_layout_name((int)c->dec.params.kv_layout),
           kvf_dtype_name(c->dec.params.kv_dtype),
           kvf_dtype_name(c->dec.params.conv_dtype), kvf_dtype_name(c->dec.params.ssm_dtype),
           c->dec.num_blocks, c->layout->slots, c->dec.geom[0].page_size);
    c->npulls = bench ? 1 + c->o.iters + (c->o.verify ? 1 : 0) : 1;
    if ((c->o.dev_kind != KVF_DEVICE_CPU) && (kvf_xt_device_probe(c, prog) != 0)) {
        rc = 1;   /* fail fast: no GPU, or a build without CUDA */
        goto out;
    }
    rc = xt_run(c);
out:
    if (c->layout != NULL) {
        free(c->layout);
    }
    kvf_xt_side_cleanup(&c->pre);
    kvf_xt_side_cleanup(&c->dec);
    free(c->ranks);
    free(c);
    return rc;
}

int kvf_cmd_xfer_test(int argc, char **argv)
{
    return xt_main(argc, argv, false);
}

int kvf_cmd_bench(int argc, char **argv)
{
    return xt_main(argc, argv, true);
}
