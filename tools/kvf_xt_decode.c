/*
 * kvf xfer-test: the decode side's rank threads (pull, raw GET reference,
 * verify) and the pipe from the prefill child.
 */
#include "kvf_xt_int.h"

/* ---- decode ----------------------------------------------------------- */

/* This thread's CPU time in ns: what a step took without the time it waited for a core. */
static uint64_t xt_thread_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* One pull of the request through the connector, timed into slot @a it. Sets r->status. */
static void xt_decode_pull(xt_rank_t *r, int it, bool *killed)
{
    xt_ctx_t *c = r->ctx;
    const kvf_xfer_params_msg_t *pm = &c->pm;
    kvf_connector_pull_t pull;
    kvf_connector_stats_t st;
    kvf_connector_req_h req = NULL;
    kvf_status_t status, rs;

    memset(&pull, 0, sizeof(pull));
    pull.engine_id = pm->engine_id;
    pull.request_id = pm->request_id;
    pull.num_tokens = pm->num_tokens;
    pull.num_groups = pm->num_groups;
    for (int gi = 0; gi < pm->num_groups; ++gi) {
        pull.remote_ids[gi] = pm->ids[gi];
        pull.num_remote_ids[gi] = pm->num_ids[gi];
        pull.local_ids[gi] = c->dec.ids[gi];
        pull.num_local_ids[gi] = c->dec.num_ids[gi];
    }
    r->t_cpu[it] = xt_thread_cpu_ns();
    r->t_start[it] = kvf_time_now_ns();
    status = c->xops->start_pull(c->conn, r->rank, &pull, &req);
    r->t_post[it] = kvf_time_now_ns();
    r->t_cpu[it] = xt_thread_cpu_ns() - r->t_cpu[it];
    if (status != KVF_OK) {
        r->start_status = status;
        r->t_end[it] = r->t_post[it];
        snprintf(r->err, sizeof(r->err), "decode rank %d: start_pull refused: %s", r->rank,
                 kvf_status_str(status));
        r->status = status;
        return;
    }
    if (c->xops->req_stats(c->conn, r->rank, req, &st) == KVF_OK) {
        r->bytes = st.bytes;
        r->descs = st.descriptors;
        r->t_plan[it] = (st.planned_ns > st.started_ns) ? st.planned_ns - st.started_ns : 0;
        r->zero_bytes = st.zero_bytes;
        r->reads = st.remote_ranks;
        r->path = st.path;
        snprintf(r->path_why, sizeof(r->path_why), "%s", (st.path_why != NULL) ?
                 st.path_why : "");
        r->gather_ops += (st.path == KVF_CONNECTOR_PATH_IPC) ? st.gather_ops : 0;
        r->ops_posted += (st.path == KVF_CONNECTOR_PATH_IPC) ? 0 : st.descriptors;   /* GETs */
    }
    do {
        status = c->xops->poll(c->conn, r->rank, req);
        if (c->o.fault_kill_prefill && (r->rank == 0) && !*killed) {
            c->t_kill = kvf_time_now_ns();
            kill(c->child, SIGKILL);
            *killed = true;
            kvf_info("decode rank 0: killed the prefill (pid %d) after the first window",
                     (int)c->child);
        }
    } while (status == KVF_INPROGRESS);
    r->t_end[it] = kvf_time_now_ns();
    if (status == KVF_OK) {   /* the daemons' --kv-digest on: what hashing the landed KV costs */
        const kvf_kv_digest_t *dg;
        int ndg;
        if (c->xops->req_digests(c->conn, r->rank, req, &dg, &ndg) == KVF_OK) {
            r->t_digest[it] = kvf_time_now_ns() - r->t_end[it];
        }
    }
    rs = c->xops->notify_release(c->conn, r->rank, req);   /* frees req */
    if (status != KVF_OK) {
        r->t_fail = r->t_end[it];
        snprintf(r->err, sizeof(r->err), "decode rank %d: transfer failed: %s (%d)", r->rank,
                 kvf_status_str(status), (int)status);
        r->status = status;
    } else if (rs != KVF_OK) {
        r->t_fail = kvf_time_now_ns();
        snprintf(r->err, sizeof(r->err), "decode rank %d: release to prefill failed: %s",
                 r->rank, kvf_status_str(rs));
        r->status = rs;
    }
}

/* Raw reference: this rank's bytes as one contiguous GET per prefill rank it reads. */
static void xt_decode_raw(xt_rank_t *r, int it)
{
    xt_ctx_t *c = r->ctx;
    kvf_ucx_batch_h batches[KVF_XFER_MAX_TP] = {NULL};
    int src[KVF_XFER_MAX_TP], nsrc = 0;
    kvf_status_t status;

    status = kvf_tp_source_ranks(&c->cfg, c->pre.tp, c->dec.tp, r->rank, src, &nsrc);
    for (int i = 0; (i < nsrc) && (status == KVF_OK); ++i) {
        if (r->raw_peers[src[i]] == NULL) {
            status = kvf_ucx_peer_connect(r->raw_agent, &c->raw.ranks[src[i]],
                                          &r->raw_peers[src[i]]);
        }
    }
    r->t_raw_start[it] = kvf_time_now_ns();
    r->raw_bytes = 0;
    for (int i = 0; (i < nsrc) && (status == KVF_OK); ++i) {
        uint64_t share = r->bytes / (uint64_t)nsrc;
        kvf_xfer_desc_t d = {0, 0, share};
        status = kvf_ucx_xfer_post(r->raw_agent, r->raw_peers[src[i]], KVF_UCX_OP_GET,
                                   r->raw_region, 0, &d, 1, &batches[i]);
        r->raw_bytes += share;
        r->ops_posted += (status == KVF_OK);
    }
    for (int i = 0; i < nsrc; ++i) {
        if (batches[i] != NULL) {
            kvf_status_t s = kvf_ucx_batch_wait(batches[i], (uint32_t)c->o.timeout_ms);
            status = (status == KVF_OK) ? s : status;
            kvf_ucx_batch_release(batches[i]);
        }
    }
    r->t_raw_end[it] = kvf_time_now_ns();
    if (status != KVF_OK) {
        snprintf(r->err, sizeof(r->err), "decode rank %d: raw GET failed: %s", r->rank,
                 kvf_status_str(status));
        r->status = status;
    }
    snprintf(r->transports, sizeof(r->transports), "%s%s%s",
             kvf_ucx_agent_transports(r->raw_agent),
             (kvf_ucx_agent_device_config(r->raw_agent)[0] != '\0') ? "; device memory: " : "",
             kvf_ucx_agent_device_config(r->raw_agent));   /* what a CUDA pool's agent set */
}

/* bench: whether a raw GET (iteration p - 1) comes before pull p. */
bool kvf_xt_raw_before(const xt_ctx_t *c, int p)
{
    return c->bench && (p >= 1) && (p <= c->o.iters);
}

/* Index of the pull timed as iteration @a it. */
int kvf_xt_timed_pull(const xt_ctx_t *c, int it)
{
    return c->bench ? it + 1 : it;
}

void *kvf_xt_decode_thread(void *arg)
{
    xt_rank_t *r = arg;
    xt_ctx_t *c = r->ctx;
    bool killed = false;

    r->status = kvf_xt_rank_setup(r);
    pthread_barrier_wait(&c->barrier);           /* registered */
    pthread_barrier_wait(&c->barrier);           /* handshake verdict */
    if ((r->status != KVF_OK) || !c->go) {
        goto out;                                /* main skips the pull barriers too */
    }
    /*
     * bench: pull 0 warms up (endpoints connect), then each timed iteration
     * is a raw GET and a pull, so the last thing prefill serves is a pull and
     * its release ends it; with --verify one more pull into a poisoned pool.
     */
    for (int p = 0; p < c->npulls; ++p) {
        bool last_verify = c->bench && c->o.verify && (p == c->npulls - 1);
        /* every rank passes every barrier, failed or not, so none can hang */
        if (kvf_xt_raw_before(c, p)) {
            pthread_barrier_wait(&c->barrier);
            if (r->status == KVF_OK) {
                xt_decode_raw(r, p - 1);
            }
        }
        pthread_barrier_wait(&c->barrier);
        if ((r->status == KVF_OK) && last_verify) {
            /* the raw GETs overwrote the pool: poison it again, pull once more, verify */
            kvf_xt_poison(r->host, r->pool_len, XT_POISON_DECODE);
            r->status = kvf_xt_pool_push(r);
        }
        if (r->status == KVF_OK) {
            xt_decode_pull(r, p, &killed);
        }
    }
    if ((r->status == KVF_OK) && c->o.verify) {
        r->status = kvf_xt_pool_pull(r);   /* a device pool: what landed, to the host */
        if (r->status != KVF_OK) {
            snprintf(r->err, sizeof(r->err), "decode rank %d: copying the pool from %.40s to "
                     "the host failed: %s", r->rank, c->o.device, kvf_status_str(r->status));
        }
    }
    if ((r->status == KVF_OK) && c->o.verify) {
        r->status = kvf_xt_decode_verify(c, r);
    }
out:
    kvf_xt_raw_teardown(r);
    return NULL;
}

static int xt_read_all(int fd, void *buf, size_t len, int timeout_ms)
{
    uint8_t *p = buf;
    uint64_t deadline = kvf_time_now_ns() + (uint64_t)timeout_ms * 1000000ull;

    while (len > 0) {
        struct pollfd pfd = {fd, POLLIN, 0};
        int64_t left = (int64_t)(deadline - kvf_time_now_ns()) / 1000000;
        ssize_t n;

        if ((left <= 0) || (poll(&pfd, 1, (int)left) <= 0)) {
            return -1;
        }
        n = read(fd, p, len);
        if (n <= 0) {
            if ((n < 0) && (errno == EINTR)) {
                continue;
            }
            return -1;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Reap the prefill child within @a timeout_ms (then SIGKILL it). Returns its exit code. */
int kvf_xt_reap(pid_t pid, int timeout_ms)
{
    uint64_t deadline = kvf_time_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    int wstatus;

    for (;;) {
        pid_t w = waitpid(pid, &wstatus, WNOHANG);
        if (w == pid) {
            return WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);
        }
        if ((w < 0) && (errno != EINTR)) {
            return -1;
        }
        if (kvf_time_now_ns() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &wstatus, 0);
            return -1;
        }
        struct timespec ts = {0, 2000000};   /* poll interval, bounded by the deadline */
        nanosleep(&ts, NULL);
    }
}

/* Read one length-prefixed message from the prefill child. NULL on failure. */
uint8_t *kvf_xt_read_msg(int fd, int timeout_ms, uint32_t *len_p)
{
    uint32_t len32 = 0;
    uint8_t *buf;

    if ((xt_read_all(fd, &len32, sizeof(len32), timeout_ms) != 0) || (len32 == 0) ||
        (len32 > (64u << 20))) {
        return NULL;
    }
    buf = malloc(len32);
    if ((buf != NULL) && (xt_read_all(fd, buf, len32, timeout_ms) != 0)) {
        free(buf);
        return NULL;
    }
    *len_p = len32;
    return buf;
}
