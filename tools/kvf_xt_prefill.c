/*
 * kvf xfer-test: the prefill child: rank threads that fill their pools and
 * wait for the releases, and the params (or altered metadata) sent to decode.
 */
#include "kvf_xt_int.h"

/* ---- prefill ---------------------------------------------------------- */

/* Decode ranks that read prefill rank @a p (each sends one release per pull). */
static int xt_expected_releases(const xt_ctx_t *c, int p)
{
    int ranks[KVF_XFER_MAX_TP], n, count = 0;

    for (int d = 0; d < c->lay.decode_tp; ++d) {
        if (kvf_tp_source_ranks(&c->cfg, c->lay.prefill_tp, c->lay.decode_tp, d, ranks, &n) !=
            KVF_OK) {
            continue;
        }
        for (int i = 0; i < n; ++i) {
            count += (ranks[i] == p);
        }
    }
    return count;
}

#define XT_NAP_NS 50000L   /* after KVF_CONNECTOR_SPIN_NS idle: nap this long between polls */

static void *xt_prefill_thread(void *arg)
{
    xt_rank_t *r = arg;
    xt_ctx_t *c = r->ctx;
    int expected, got = 0;
    uint64_t deadline, last_work;
    pid_t parent = getppid();

    r->status = kvf_xt_rank_setup(r);
    pthread_barrier_wait(&c->barrier);           /* registered */
    pthread_barrier_wait(&c->barrier);           /* side channel up */
    if (r->status != KVF_OK) {
        goto out;
    }
    expected = xt_expected_releases(c, r->rank) * c->npulls;
    /* bench runs several pulls; give it time in proportion */
    deadline = kvf_time_now_ns() + (uint64_t)c->o.timeout_ms * 1000000ull *
               (uint64_t)(2 + c->npulls);
    last_work = kvf_time_now_ns();
    while (got < expected) {
        char rid[KVF_ENGINE_ID_MAX];
        int drank;
        kvf_status_t st;
        /* the raw agent needs progress too (GETs without a one-sided transport) */
        kvf_status_t s = c->xops->poll_release(c->conn, r->rank, c->bench ? 0 : 100, rid,
                                               sizeof(rid), &drank, &st);
        bool raw_work = (r->raw_agent != NULL) && (kvf_ucx_agent_progress(r->raw_agent) > 0);
        uint64_t now = kvf_time_now_ns();

        /*
         * The daemons' progress policy (transfer/ucx/kvf_connector_ucx.c): spin while
         * there was work in the last 5 ms, then sleep. A GET from a UCX-mapped pool
         * gives this side no work at all, and spinning prefill ranks would take the
         * cores the decode ranks copy with (2-core hosts: half the bandwidth).
         */
        if ((s == KVF_OK) || (s == KVF_INPROGRESS) || raw_work) {
            last_work = now;
        } else if (now - last_work < KVF_CONNECTOR_SPIN_NS) {
            sched_yield();
        } else {
            struct timespec nap = {.tv_sec = 0, .tv_nsec = XT_NAP_NS};
            nanosleep(&nap, NULL);
        }
        if (s == KVF_OK) {
            if (st != KVF_OK) {
                snprintf(r->err, sizeof(r->err), "prefill rank %d: decode rank %d reported "
                         "failure: %s", r->rank, drank, kvf_status_str(st));
                r->status = KVF_ERR_CANCELED;
                goto out;
            }
            got++;
        } else if ((kvf_time_now_ns() > deadline) || (getppid() != parent)) {
            snprintf(r->err, sizeof(r->err), "prefill rank %d: %d of %d releases before "
                     "giving up", r->rank, got, expected);
            r->status = KVF_ERR_LEASE_EXPIRED;
            goto out;
        }
    }
out:
    kvf_xt_raw_teardown(r);
    return NULL;
}

static int xt_write_all(int fd, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            return -1;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static int xt_write_msg(int fd, const uint8_t *buf, size_t len)
{
    uint32_t len32 = (uint32_t)len;
    return (xt_write_all(fd, &len32, sizeof(len32)) != 0) ||
           ((len32 > 0) && (xt_write_all(fd, buf, len) != 0));
}

/*
 * A lying prefill (fault flags): what the connector serves, fetched back as
 * a decode would, altered, and served again on a side channel of the tool's
 * own, whose port goes into the transfer params.
 */
static kvf_status_t xt_serve_altered(xt_ctx_t *c, kvf_side_channel_server_h *server_p,
                                     int *port_p)
{
    kvf_side_channel_client_h client = NULL;
    const kvf_handshake_reply_t *reply;
    kvf_side_channel_params_t sp;
    kvf_rank_meta_t *metas = NULL;
    int port = 0;
    kvf_status_t status;

    status = c->xops->serve(c->conn, &port);
    if (status == KVF_OK) {
        status = kvf_side_channel_client_create("xfer-test-liar", (uint32_t)c->o.timeout_ms,
                                                &client);
    }
    if (status == KVF_OK) {
        status = kvf_side_channel_fetch(client, c->pre.engine_id, "127.0.0.1", port, &reply);
    }
    if ((status == KVF_OK) && (reply->num_ranks != c->pre.tp)) {
        status = KVF_ERR_PARSE;
    }
    if (status == KVF_OK) {
        metas = calloc((size_t)c->pre.tp, sizeof(*metas));
        status = (metas == NULL) ? KVF_ERR_NO_MEMORY : KVF_OK;
    }
    for (int r = 0; (status == KVF_OK) && (r < c->pre.tp); ++r) {
        metas[r] = reply->ranks[r];
        if (c->o.fault_version != 0) {
            metas[r].protocol_version = (uint32_t)c->o.fault_version;
        }
        if (c->o.fault_fingerprint) {
            metas[r].model_fingerprint ^= 0x5a5a5a5a00000001ull;
        }
        if (c->o.fault_region_len) {
            metas[r].regions[0].length += c->pre.geom[r].page_size;
        }
    }
    if (status == KVF_OK) {
        memset(&sp, 0, sizeof(sp));
        sp.engine_id = c->pre.engine_id;
        sp.ranks = metas;
        sp.num_ranks = c->pre.tp;
        status = kvf_side_channel_server_start(&sp, server_p);
    }
    if (status == KVF_OK) {
        *port_p = kvf_side_channel_server_port(*server_p);
    }
    free(metas);
    kvf_side_channel_client_destroy(client);
    return status;
}

/* The prefill instance (child process). Returns the exit code. */
int kvf_xt_prefill_main(xt_ctx_t *c, int fd)
{
    kvf_side_channel_server_h lying = NULL;
    kvf_xfer_params_msg_t pm;
    kvf_handshake_reply_t raw;
    uint8_t *buf = NULL, *rbuf = NULL;
    size_t len = 0, rlen = 0;
    int rc = 1, ok = 1, port = 0;

    kvf_log_init("prefill");
    c->ranks = calloc((size_t)c->pre.tp, sizeof(*c->ranks));
    if ((c->ranks == NULL) || (kvf_xt_conn_create(c, &c->pre) != KVF_OK)) {
        return 1;
    }
    kvf_xt_start_ranks(c, &c->pre, xt_prefill_thread);
    pthread_barrier_wait(&c->barrier);
    for (int r = 0; r < c->pre.tp; ++r) {
        if (c->ranks[r].status != KVF_OK) {
            kvf_error("prefill rank %d setup failed: %s", r, kvf_status_str(c->ranks[r].status));
            ok = 0;
        }
    }
    if (ok) {
        bool lie = (c->o.fault_version != 0) || c->o.fault_fingerprint || c->o.fault_region_len;
        ok = ((lie ? xt_serve_altered(c, &lying, &port) : c->xops->serve(c->conn, &port)) ==
              KVF_OK);
    }
    if (ok) {
        memset(&pm, 0, sizeof(pm));
        snprintf(pm.engine_id, sizeof(pm.engine_id), "%s", c->pre.engine_id);
        snprintf(pm.host, sizeof(pm.host), "127.0.0.1");
        snprintf(pm.request_id, sizeof(pm.request_id), "req-0");
        pm.port = port;
        pm.num_groups = c->layout->num_groups;
        for (int gi = 0; gi < pm.num_groups; ++gi) {
            pm.ids[gi] = c->pre.ids[gi];
            pm.num_ids[gi] = c->pre.num_ids[gi];
        }
        pm.num_tokens = c->o.tokens;
        pm.has_lease_expiry = true;
        pm.lease_expiry_ms = (uint64_t)time(NULL) * 1000u + (uint64_t)c->o.timeout_ms * 2u;
        pm.first_token = 42;
        pm.has_incarnation = true;
        pm.incarnation = c->xops->incarnation(c->conn);
        if (c->o.fault_block_id) {
            pm.ids[0][pm.num_ids[0] - 1] = (int32_t)c->pre.num_blocks;
        }
        ok = (kvf_xfer_params_msg_pack(&pm, &buf, &len) == KVF_OK);
    }
    if (ok && c->bench) {
        /* the raw reference's addresses and keys ride the same pipe */
        kvf_rank_meta_t *metas = calloc((size_t)c->pre.tp, sizeof(*metas));
        ok = (metas != NULL);
        for (int r = 0; ok && (r < c->pre.tp); ++r) {
            metas[r] = c->ranks[r].raw_meta;
        }
        memset(&raw, 0, sizeof(raw));
        raw.accepted = true;
        snprintf(raw.engine_id, sizeof(raw.engine_id), "%s", c->pre.engine_id);
        raw.num_ranks = c->pre.tp;
        raw.ranks = metas;
        ok = ok && (kvf_handshake_reply_pack(&raw, &rbuf, &rlen) == KVF_OK);
        free(metas);
    }
    (void)(xt_write_msg(fd, buf, ok ? len : 0) ||
           (ok && c->bench && xt_write_msg(fd, rbuf, rlen)));
    close(fd);
    free(buf);
    free(rbuf);
    pthread_barrier_wait(&c->barrier);
    rc = ok ? 0 : 1;
    for (int r = 0; r < c->pre.tp; ++r) {
        pthread_join(c->ranks[r].thread, NULL);
        if (c->ranks[r].status != KVF_OK) {
            if (c->ranks[r].err[0] != '\0') {
                kvf_error("%s", c->ranks[r].err);
            }
            rc = 1;
        }
    }
    kvf_side_channel_server_stop(lying);
    c->xops->destroy(c->conn);
    for (int r = 0; r < c->pre.tp; ++r) {
        kvf_xt_pool_free(&c->ranks[r]);
    }
    pthread_barrier_destroy(&c->barrier);
    return rc;
}
