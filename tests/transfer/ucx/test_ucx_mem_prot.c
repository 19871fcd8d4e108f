/*
 * KV memory protection as UCX enforces it (issue 22 item 2; docs/SECURITY.md
 * "KV memory"), measured with a real outsider: this binary re-executed as a
 * second process that is handed prefill's published rank metadata (worker
 * address, region address and length, rkey) and tries to PUT 256 KiB into
 * prefill's pool, then GETs (which prefill allows) to show it really holds
 * a working key.
 *
 * Prefill's agent maps its pool KVF_UCX_ACCESS_REMOTE_READ, i.e. ucp_mem_map
 * with UCP_MEM_MAP_PARAM_FIELD_PROT and prot = LOCAL_READ | LOCAL_WRITE |
 * REMOTE_READ. Per transport the test reports whether the PUT was refused,
 * left the bytes alone ("honoured") or landed ("IGNORED"). What it finds on
 * Debian 12's UCX 1.13.1 (and what it asserts for 1.13, so that the docs
 * stay true): PROT is ignored by every transport there is on a host without
 * RDMA hardware, 9 cases of 9:
 *   - UCX_TLS unset (the daemons' default), heap or UCX-allocated pool: the
 *             lanes are sysv/posix; the PUT lands;
 *   - tcp     RMA is emulated over active messages; the target's
 *             ucp_put_handler copies to whatever address the PUT names;
 *   - cma     process_vm_writev into the target's memory (UCX 1.13.1
 *             selects cma only without peer error handling, which the
 *             daemons always use; the cma rows turn it off on both sides);
 *   - posix,
 *     sysv    the peer maps the shared segment read-write and copies;
 * and ucp_mem_map itself never reads prot (ucp_mem_map_params2uct_flags
 * always asks the memory domains for UCT_MD_MEM_ACCESS_ALL), so an RDMA
 * memory region (ib verbs) would be registered for remote write as well.
 * The "beyond" cases go further: over tcp and cma a peer that claims a
 * longer region than was published writes past its end (nothing on the
 * target checks an address against a registration).
 *
 * What kvferry does enforce is checked in test_xfer_ucx_agent.c
 * (test_local_regions): a KVF_UCX_ACCESS_LOCAL region (decode's pool) never
 * has a key packed, so no peer is handed one.
 */
#include "kvf_ucx_agent.h"

#include "kvf_log.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <ucp/api/ucp.h>
#include <unistd.h>
#include <cmocka.h>

extern char **environ;

#define POOL      (1u << 20)   /* prefill's region */
#define SPAN      (256u << 10) /* bytes the outsider writes: large enough for zero-copy lanes */
#define GUARD     SPAN         /* heap past the registered region ("beyond" cases) */
#define OLD_BYTE  0x11
#define NEW_BYTE  0xa5

static const char *self_path;

typedef struct {
    const char *tls;
    bool        alloc;     /* pool from kvf_ucx_agent_mem_alloc (shared memory) */
    bool        beyond;    /* the outsider claims GUARD more bytes and writes there */
    bool        no_errh;   /* both sides without peer error handling: UCX 1.13.1 selects
                            * cma only then (the daemons always run with it) */
} prot_case_t;

static const prot_case_t cases[] = {
    {NULL,       false, false, false},   /* UCX_TLS unset: what the daemons use by default */
    {NULL,       true,  false, false},   /* ... with --pool-alloc ucx (the default) */
    {"tcp",      false, false, false},
    {"tcp",      false, true, false},
    {"cma,tcp",  false, false, true},
    {"cma,tcp",  false, true,  true},
    {"posix",    true,  false, false},
    {"sysv",     true,  false, false},
    {"posix",    false, false, false},   /* heap memory over posix: RMA emulated over its AMs */
};
#define NUM_CASES (sizeof(cases) / sizeof(cases[0]))

static kvf_ucx_agent_h make_agent(const char *name, kvf_ucx_access_t access, bool no_errh)
{
    kvf_ucx_agent_params_t p;
    kvf_ucx_agent_h a;

    memset(&p, 0, sizeof(p));
    p.field_mask = KVF_UCX_AGENT_PARAM_FIELD_NAME | KVF_UCX_AGENT_PARAM_FIELD_TIMEOUT_MS |
                   KVF_UCX_AGENT_PARAM_FIELD_ACCESS | KVF_UCX_AGENT_PARAM_FIELD_ERR_MODE;
    p.name = name;
    p.timeout_ms = 3000;
    p.access = access;
    p.peer_err_mode = !no_errh;
    if (kvf_ucx_agent_create(&p, &a) != KVF_OK) {
        return NULL;
    }
    return a;
}

/* ---- the outsider (child process) --------------------------------------- */

static int outsider_main(bool beyond, bool no_errh)
{
    kvf_rank_meta_t *m = calloc(1, sizeof(*m));
    static uint8_t local[2 * SPAN];
    kvf_ucx_agent_h a;
    kvf_ucx_peer_h peer = NULL;
    kvf_ucx_batch_h batch;
    kvf_status_t put = KVF_ERR_UCX, get = KVF_ERR_UCX;
    int region;
    uint64_t off = beyond ? POOL : 0;

    if ((m == NULL) || (fread(m, sizeof(*m), 1, stdin) != 1)) {
        printf("error: no metadata\n");
        return 1;
    }
    a = make_agent("outsider", KVF_UCX_ACCESS_LOCAL, no_errh);
    if ((a == NULL) || (kvf_ucx_agent_mem_register(a, local, sizeof(local), &region) != KVF_OK)) {
        printf("error: no agent\n");
        return 1;
    }
    if (beyond) {
        m->regions[0].length += GUARD;   /* the outsider's own claim */
    }
    if (kvf_ucx_peer_connect(a, m, &peer) != KVF_OK) {
        printf("put=%d get=%d lanes=none\n", KVF_ERR_PARSE, KVF_ERR_PARSE);
        return 0;
    }
    memset(local, NEW_BYTE, SPAN);
    {
        const kvf_xfer_desc_t d = {0, off, SPAN};
        put = kvf_ucx_xfer_post(a, peer, KVF_UCX_OP_PUT, region, 0, &d, 1, &batch);
        if (put == KVF_OK) {
            put = kvf_ucx_batch_wait(batch, 5000);
            kvf_ucx_batch_release(batch);
        }
    }
    if ((kvf_ucx_peer_status(peer) == KVF_OK) && !beyond) {
        const kvf_xfer_desc_t d = {SPAN, SPAN, SPAN};   /* bytes the PUT did not touch */
        get = kvf_ucx_xfer_post(a, peer, KVF_UCX_OP_GET, region, 0, &d, 1, &batch);
        if (get == KVF_OK) {
            get = kvf_ucx_batch_wait(batch, 5000);
            kvf_ucx_batch_release(batch);
        }
        if ((get == KVF_OK) && (local[SPAN] != OLD_BYTE)) {
            get = KVF_ERR_PARSE;   /* read something, but not prefill's bytes */
        }
    } else if (beyond) {
        get = KVF_OK;              /* not tried: nothing to read past the region */
    }
    printf("put=%d get=%d lanes=%s\n", put, get, kvf_ucx_agent_transports(a));
    fflush(stdout);
    kvf_ucx_peer_destroy(peer);
    kvf_ucx_agent_destroy(a);
    free(m);
    return 0;
}

/* ---- prefill (this process) --------------------------------------------- */

typedef struct {
    int  put, get;
    char lanes[400];
    bool landed;
} prot_result_t;

/* Spawn the outsider, hand it @a meta, progress @a agent until it answers. */
static void run_outsider(kvf_ucx_agent_h agent, const kvf_rank_meta_t *meta, bool beyond,
                         bool no_errh, prot_result_t *res)
{
    int in[2], out[2];
    posix_spawn_file_actions_t fa;
    char *argv[] = {(char *)self_path, (char *)"--outsider",
                    (char *)(beyond ? "beyond" : "in"), (char *)(no_errh ? "noerrh" : "errh"),
                    NULL};
    char line[600] = "";
    size_t used = 0;
    uint64_t deadline = kvf_time_now_ns() + 30000000000ull;
    pid_t pid;
    int wst;

    assert_int_equal(pipe(in), 0);
    assert_int_equal(pipe(out), 0);
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_addclose(&fa, in[1]);
    posix_spawn_file_actions_addclose(&fa, out[0]);
    assert_int_equal(posix_spawn(&pid, self_path, &fa, NULL, argv, environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    close(in[0]);
    close(out[1]);
    assert_int_equal(write(in[1], meta, sizeof(*meta)), (ssize_t)sizeof(*meta));
    close(in[1]);
    fcntl(out[0], F_SETFL, O_NONBLOCK);
    for (;;) {   /* the outsider's emulated RMA needs our worker progressed */
        ssize_t n;
        assert_true(kvf_time_now_ns() < deadline);
        struct pollfd pfd = {out[0], POLLIN, 0};
        if (kvf_ucx_agent_progress(agent) == 0) {
            (void)poll(&pfd, 1, 1);      /* idle: wait 1 ms for the outsider's answer */
        }
        n = read(out[0], line + used, sizeof(line) - 1 - used);
        if (n > 0) {
            used += (size_t)n;
            line[used] = '\0';
        } else if (n == 0) {
            break;                       /* the outsider closed its end (exited) */
        } else {
            assert_true(errno == EAGAIN);
        }
    }
    close(out[0]);
    assert_int_equal(waitpid(pid, &wst, 0), pid);
    assert_true(WIFEXITED(wst) && (WEXITSTATUS(wst) == 0));
    assert_int_equal(sscanf(line, "put=%d get=%d lanes=%399[^\n]", &res->put, &res->get,
                            res->lanes), 3);
}

static void run_case(const prot_case_t *c, prot_result_t *res)
{
    kvf_ucx_agent_h agent;
    kvf_rank_meta_t *m = calloc(1, sizeof(*m));
    uint8_t *heap = NULL, *pool, *target;
    int region;

    assert_non_null(m);
    if (c->tls != NULL) {
        setenv("UCX_TLS", c->tls, 1);
    } else {
        unsetenv("UCX_TLS");
    }
    agent = make_agent("prefill", KVF_UCX_ACCESS_REMOTE_READ, c->no_errh);
    assert_non_null(agent);
    if (c->alloc) {
        void *base;
        assert_int_equal(kvf_ucx_agent_mem_alloc(agent, POOL, &base, &region), KVF_OK);
        pool = base;
    } else {
        heap = malloc(POOL + GUARD);
        assert_non_null(heap);
        pool = heap;
        assert_int_equal(kvf_ucx_agent_mem_register(agent, pool, POOL, &region), KVF_OK);
        memset(pool + POOL, OLD_BYTE, GUARD);
    }
    memset(pool, OLD_BYTE, POOL);
    snprintf(m->engine_id, sizeof(m->engine_id), "prefill");
    m->tp_size = 1;
    m->num_regions = 1;
    assert_int_equal(kvf_ucx_agent_region_meta(agent, region, &m->regions[0]), KVF_OK);
    assert_true(m->regions[0].rkey_len > 0);   /* prefill publishes a read key */
    assert_int_equal(kvf_ucx_agent_worker_address(agent, m->worker_addr, sizeof(m->worker_addr),
                                                  &m->worker_addr_len), KVF_OK);
    run_outsider(agent, m, c->beyond, c->no_errh, res);
    target = c->beyond ? pool + POOL : pool;
    res->landed = false;
    for (unsigned i = 0; i < SPAN; ++i) {
        res->landed = res->landed || (target[i] == NEW_BYTE);
    }
    for (unsigned i = SPAN; i < POOL; ++i) {   /* nothing else moved either way */
        assert_int_equal(pool[i], OLD_BYTE);
    }
    kvf_ucx_agent_destroy(agent);
    free(heap);
    free(m);
}

static void test_put_into_read_only_pool(void **state)
{
    unsigned major, minor, release;
    int ignored = 0;

    (void)state;
    ucp_get_version(&major, &minor, &release);
    printf("UCX %u.%u.%u: PUT by a peer holding prefill's REMOTE_READ-only key\n", major, minor,
           release);
    for (size_t i = 0; i < NUM_CASES; ++i) {
        const prot_case_t *c = &cases[i];
        prot_result_t res;

        memset(&res, 0, sizeof(res));
        run_case(c, &res);
        printf("  UCX_TLS=%-8s %-5s %-6s %-7s put=%-4d get=%-4d -> %-26s (outsider: %s)\n",
               (c->tls != NULL) ? c->tls : "(unset)", c->alloc ? "alloc" : "heap",
               c->beyond ? "beyond" : "inside", c->no_errh ? "no-errh" : "errh", res.put,
               res.get, res.landed ? "IGNORED: the bytes changed" :
               ((res.put != KVF_OK) ? "honoured: PUT failed" : "honoured: bytes unchanged"),
               res.lanes);
        /* the key works for what it is for: reading */
        assert_int_equal(res.get, KVF_OK);
        ignored += res.landed ? 1 : 0;
        if ((major == 1) && (minor == 13)) {
            /* what docs/SECURITY.md says for Debian 12's UCX: no transport honours PROT */
            assert_true(res.landed);
            assert_int_equal(res.put, KVF_OK);
        }
    }
    printf("PROT ignored in %d of %zu cases\n", ignored, NUM_CASES);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_put_into_read_only_pool),
    };

    self_path = argv[0];
    /* both processes: keep the shared-memory transports with peer error handling */
    setenv("UCX_POSIX_ERROR_HANDLING", "y", 0);
    setenv("UCX_SYSV_ERROR_HANDLING", "y", 0);
    setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 0);
    if ((argc == 4) && (strcmp(argv[1], "--outsider") == 0)) {
        kvf_log_init("outsider");
        return outsider_main(strcmp(argv[2], "beyond") == 0, strcmp(argv[3], "noerrh") == 0);
    }
    kvf_log_init("test");
    signal(SIGPIPE, SIG_IGN);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
