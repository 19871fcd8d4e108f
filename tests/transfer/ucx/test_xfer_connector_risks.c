/*
 * The UCX connector under the conditions that used to break it (tiny-dense,
 * prefill instances with a progress thread, decode TP 1, one process):
 * - more prefill engines than decode's table holds (16): the least recently
 *   used idle entry is evicted, an evicted engine handshakes again and its
 *   pull lands its own bytes (not the endpoint of the engine that held the
 *   slot before); only when every entry has a pull in flight is a new engine
 *   refused, and it is accepted once one of them finishes.
 * - a handshake stalled on a side channel that accepts and never answers
 *   does not hold the connector's lock: another thread (the decode rank's
 *   own) pulls from an engine handshaken before, to completion, while the
 *   handshake is still waiting; the handshake then fails naming the peer.
 * - tail zeroing goes through the device layer: kvf_zero_ranges() is
 *   wrapped at link time (-Wl,--wrap) and must see exactly the zeroed bytes
 *   the pull reports.
 * - the incarnation comes from getrandom(2), wrapped at link time: the value
 *   drawn is the incarnation, EINTR is retried, and a failure, a short read or
 *   zero draws fail create instead of falling back to a weaker source.
 */
#include "kvf_connector_ucx.h"
#include "kvf_ucx_agent.h"

#include "kvf_log.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <semaphore.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#define TABLE     16          /* KVF_CONN_MAX_ENGINES in kvf_connector_ucx.c */
#define ENGINES   (TABLE + 2)
#define TOKENS    40          /* 3 blocks of 16, the last one partial: a zeroed tail */
#define P_BLOCKS  4
#define NB        3           /* blocks per pull */
#define D_BLOCKS  (TABLE * NB)

static kvf_model_config_t cfg;
static kvf_cache_layout_t layout;
static kvf_cache_params_t params;
static const kvf_connector_ops_t *ops;

/* ---- link-time wraps ---------------------------------------------------- */

int __real_kvf_zero_ranges(const kvf_device_t *dev, void *base, const size_t *offsets,
                           const size_t *lens, size_t n);
int __wrap_kvf_zero_ranges(const kvf_device_t *dev, void *base, const size_t *offsets,
                           const size_t *lens, size_t n);
ssize_t __real_getrandom(void *buf, size_t len, unsigned int flags);
ssize_t __wrap_getrandom(void *buf, size_t len, unsigned int flags);

static atomic_int zero_calls;
static atomic_ullong zero_bytes;

int __wrap_kvf_zero_ranges(const kvf_device_t *dev, void *base, const size_t *offsets,
                           const size_t *lens, size_t n)
{
    atomic_fetch_add(&zero_calls, 1);
    for (size_t i = 0; i < n; ++i) {
        atomic_fetch_add(&zero_bytes, lens[i]);
    }
    return __real_kvf_zero_ranges(dev, base, offsets, lens, n);
}

typedef enum { RND_REAL, RND_FIXED, RND_EINTR_ONCE, RND_ENOSYS, RND_SHORT, RND_ZERO } rnd_mode_t;
static rnd_mode_t rnd_mode = RND_REAL;
static int rnd_calls;
#define RND_FIXED_VALUE 0x1122334455667788ull

ssize_t __wrap_getrandom(void *buf, size_t len, unsigned int flags)
{
    uint64_t v = RND_FIXED_VALUE;

    ++rnd_calls;
    switch (rnd_mode) {
    case RND_REAL:
        return __real_getrandom(buf, len, flags);
    case RND_EINTR_ONCE:
        if (rnd_calls == 1) {
            errno = EINTR;
            return -1;
        }
        /* fall through */
    case RND_FIXED:
        memset(buf, 0, len);
        memcpy(buf, &v, (len < sizeof(v)) ? len : sizeof(v));
        return (ssize_t)len;
    case RND_ENOSYS:
        errno = ENOSYS;
        return -1;
    case RND_SHORT:
        memset(buf, 0x5a, len);
        return (ssize_t)(len / 2);
    case RND_ZERO:
        memset(buf, 0, len);
        return (ssize_t)len;
    }
    return -1;
}

/* ---- instances -------------------------------------------------------------- */

typedef struct {
    char            id[32];
    kvf_connector_h conn;
    uint8_t        *pool;
    size_t          len;
    int             port;
} prefill_t;

static size_t pool_bytes(int64_t blocks)
{
    kvf_rank_geometry_t g;
    assert_int_equal(kvf_rank_geometry_compute(&cfg, &params, 1, 0, &g), KVF_OK);
    return (size_t)blocks * (size_t)layout.slots * g.page_size;
}

static size_t block_bytes(void)
{
    return pool_bytes(1);
}

/* A TP 1 prefill whose pool is all @a value; a progress thread serves GETs. */
static void prefill_start(prefill_t *p, int index, uint8_t value)
{
    kvf_connector_config_t pc;

    memset(p, 0, sizeof(*p));
    snprintf(p->id, sizeof(p->id), "prefill-%d", index);
    memset(&pc, 0, sizeof(pc));
    pc.field_mask = KVF_CONNECTOR_CONFIG_FIELD_PROGRESS;
    pc.engine_id = p->id;
    pc.role = KVF_CONNECTOR_ROLE_PREFILL;
    pc.tp_size = 1;
    pc.cfg = &cfg;
    pc.progress_thread = true;
    assert_int_equal(ops->create(&pc, &p->conn), KVF_OK);
    p->len = pool_bytes(P_BLOCKS);
    p->pool = malloc(p->len);
    assert_non_null(p->pool);
    memset(p->pool, value, p->len);
    {
        kvf_connector_pool_t pool = {0, p->pool, p->len, P_BLOCKS, params, kvf_device_cpu()};
        assert_int_equal(ops->register_pool(p->conn, &pool), KVF_OK);
    }
    assert_int_equal(ops->serve(p->conn, &p->port), KVF_OK);
}

static void prefill_stop(prefill_t *p)
{
    ops->destroy(p->conn);
    free(p->pool);
}

static kvf_connector_h decode_create(const char *id, uint32_t timeout_ms)
{
    kvf_connector_config_t dc;
    kvf_connector_h conn;

    memset(&dc, 0, sizeof(dc));
    dc.field_mask = KVF_CONNECTOR_CONFIG_FIELD_TIMEOUT_MS;
    dc.engine_id = id;
    dc.role = KVF_CONNECTOR_ROLE_DECODE;
    dc.tp_size = 1;
    dc.cfg = &cfg;
    dc.timeout_ms = timeout_ms;
    assert_int_equal(ops->create(&dc, &conn), KVF_OK);
    return conn;
}

static void decode_register(kvf_connector_h conn, uint8_t *dpool, size_t dlen)
{
    kvf_connector_pool_t pool = {0, dpool, dlen, D_BLOCKS, params, kvf_device_cpu()};
    assert_int_equal(ops->register_pool(conn, &pool), KVF_OK);
}

static const int32_t remote_ids[NB] = {0, 1, 2};

/* Start a pull of blocks {0,1,2} of @a engine into local blocks base_block.. */
static kvf_status_t pull_start(kvf_connector_h conn, const char *engine, int32_t *local_ids,
                               int base_block, kvf_connector_req_h *req_p)
{
    kvf_connector_pull_t pull;

    for (int i = 0; i < NB; ++i) {
        local_ids[i] = base_block + i;
    }
    memset(&pull, 0, sizeof(pull));
    pull.engine_id = engine;
    pull.request_id = engine;
    pull.num_tokens = TOKENS;
    pull.num_groups = 1;
    pull.remote_ids[0] = remote_ids;
    pull.num_remote_ids[0] = NB;
    pull.local_ids[0] = local_ids;
    pull.num_local_ids[0] = NB;
    return ops->start_pull(conn, 0, &pull, req_p);
}

static kvf_status_t pull_wait(kvf_connector_h conn, kvf_connector_req_h req)
{
    uint64_t deadline = kvf_time_now_ns() + 20000000000ull;
    kvf_status_t st;

    while (((st = ops->poll(conn, 0, req)) == KVF_INPROGRESS) && (kvf_time_now_ns() < deadline)) {
    }
    return st;
}

/* A whole pull from @a engine into blocks 0..2: its first byte is @a value, the
 * zeroed tail went through kvf_zero_ranges() and matches the pull's stats. */
static void pull_check(kvf_connector_h conn, const char *engine, uint8_t *dpool, uint8_t value)
{
    kvf_connector_req_h req;
    kvf_connector_stats_t stats;
    int32_t local[NB];
    int calls0 = atomic_load(&zero_calls);
    unsigned long long bytes0 = atomic_load(&zero_bytes);

    memset(dpool, 0xee, (size_t)NB * block_bytes());
    assert_int_equal(pull_start(conn, engine, local, 0, &req), KVF_OK);
    assert_int_equal(pull_wait(conn, req), KVF_OK);
    assert_int_equal(ops->req_stats(conn, 0, req, &stats), KVF_OK);
    assert_true(stats.zero_bytes > 0);
    assert_int_equal(atomic_load(&zero_calls), calls0 + 1);
    assert_int_equal(atomic_load(&zero_bytes) - bytes0, stats.zero_bytes);
    assert_int_equal(dpool[0], value);
    assert_int_equal(dpool[block_bytes()], value);
    assert_int_equal(ops->finish_pull(conn, 0, req), KVF_OK);
}

/* c + e: 18 engines through a table of 16 */
static void test_engine_table_evicts_idle(void **state)
{
    prefill_t *p = calloc(ENGINES, sizeof(*p));
    kvf_connector_req_h busy[TABLE];
    int32_t busy_ids[TABLE][NB];
    const char *busy_engine[TABLE];
    kvf_connector_h d;
    uint8_t *dpool;
    size_t dlen = pool_bytes(D_BLOCKS);
    char why[512];
    int n = 0;

    (void)state;
    assert_non_null(p);
    for (int i = 0; i < ENGINES; ++i) {
        prefill_start(&p[i], i, (uint8_t)(i + 1));
    }
    d = decode_create("decode-lru", 5000);
    dpool = malloc(dlen);
    assert_non_null(dpool);
    decode_register(d, dpool, dlen);

    /* every engine handshakes and serves a pull: the 17th and 18th evict the oldest idle */
    for (int i = 0; i < ENGINES; ++i) {
        assert_int_equal(ops->handshake(d, p[i].id, "127.0.0.1", p[i].port, why, sizeof(why)),
                         KVF_OK);
        pull_check(d, p[i].id, dpool, (uint8_t)(i + 1));
    }
    /* prefill-0 and prefill-1 were the least recently used: gone */
    {
        kvf_connector_req_h req;
        int32_t local[NB];
        uint64_t inc;
        assert_int_equal(pull_start(d, p[0].id, local, 0, &req), KVF_ERR_NOT_FOUND);
        assert_int_equal(ops->remote_incarnation(d, p[1].id, &inc), KVF_ERR_NOT_FOUND);
        assert_int_equal(ops->remote_incarnation(d, p[2].id, &inc), KVF_OK);
    }
    /* prefill-0 comes back: it evicts prefill-2 and its pull reads prefill-0's bytes,
     * not through the endpoint prefill-2 left in that slot */
    assert_int_equal(ops->handshake(d, p[0].id, "127.0.0.1", p[0].port, why, sizeof(why)),
                     KVF_OK);
    pull_check(d, p[0].id, dpool, 1);
    {
        uint64_t inc;
        assert_int_equal(ops->remote_incarnation(d, p[2].id, &inc), KVF_ERR_NOT_FOUND);
    }

    /* a pull in flight on each of the 16 cached engines: nothing can be evicted */
    for (int i = 0; i < ENGINES; ++i) {
        uint64_t inc;
        if (ops->remote_incarnation(d, p[i].id, &inc) != KVF_OK) {
            continue;
        }
        busy_engine[n] = p[i].id;
        assert_int_equal(pull_start(d, p[i].id, busy_ids[n], n * NB, &busy[n]), KVF_OK);
        assert_int_equal(pull_wait(d, busy[n]), KVF_OK);   /* landed, not finished */
        ++n;
    }
    assert_int_equal(n, TABLE);
    assert_int_equal(ops->handshake(d, p[1].id, "127.0.0.1", p[1].port, why, sizeof(why)),
                     KVF_ERR_NO_RESOURCE);
    assert_non_null(strstr(why, "in flight"));
    assert_non_null(strstr(why, p[1].id));
    /* one finishes: its engine is the only idle one, so it is the one evicted */
    assert_int_equal(ops->finish_pull(d, 0, busy[5]), KVF_OK);
    assert_int_equal(ops->handshake(d, p[1].id, "127.0.0.1", p[1].port, why, sizeof(why)),
                     KVF_OK);
    {
        uint64_t inc;
        assert_int_equal(ops->remote_incarnation(d, busy_engine[5], &inc), KVF_ERR_NOT_FOUND);
        assert_int_equal(ops->remote_incarnation(d, busy_engine[4], &inc), KVF_OK);
    }
    for (int i = 0; i < TABLE; ++i) {
        if (i != 5) {
            assert_int_equal(ops->finish_pull(d, 0, busy[i]), KVF_OK);
        }
    }
    pull_check(d, p[1].id, dpool, 2);

    ops->destroy(d);
    free(dpool);
    for (int i = 0; i < ENGINES; ++i) {
        prefill_stop(&p[i]);
    }
    free(p);
}

/* ---- d: a handshake stalled on a silent side channel -------------------------- */

typedef struct {
    int         lfd;
    int         port;
    sem_t       accepted;
    atomic_bool stop;
    int         fds[8];
    int         nfds;
} silent_t;

/* Accepts connections and never writes a byte. */
static void *silent_main(void *arg)
{
    silent_t *s = arg;
    while (!atomic_load(&s->stop)) {
        struct pollfd pf = {.fd = s->lfd, .events = POLLIN, .revents = 0};
        if ((poll(&pf, 1, 50) > 0) && (s->nfds < 8)) {
            int fd = accept(s->lfd, NULL, NULL);
            if (fd >= 0) {
                s->fds[s->nfds++] = fd;
                sem_post(&s->accepted);
            }
        }
    }
    return NULL;
}

static void silent_start(silent_t *s, pthread_t *th)
{
    struct sockaddr_in a;
    socklen_t alen = sizeof(a);

    memset(s, 0, sizeof(*s));
    s->lfd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(s->lfd >= 0);
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(s->lfd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(listen(s->lfd, 8), 0);
    assert_int_equal(getsockname(s->lfd, (struct sockaddr *)&a, &alen), 0);
    s->port = ntohs(a.sin_port);
    sem_init(&s->accepted, 0, 0);
    atomic_init(&s->stop, false);
    assert_int_equal(pthread_create(th, NULL, silent_main, s), 0);
}

static void silent_stop(silent_t *s, pthread_t th)
{
    atomic_store(&s->stop, true);
    pthread_join(th, NULL);
    for (int i = 0; i < s->nfds; ++i) {
        close(s->fds[i]);
    }
    close(s->lfd);
    sem_destroy(&s->accepted);
}

typedef struct {
    kvf_connector_h conn;
    const char     *engine;
    uint8_t        *dpool;
    size_t          dlen;
    pthread_barrier_t *registered;
    silent_t       *silent;
    atomic_bool    *handshake_returned;
    kvf_status_t    pull_status;
    bool            returned_before_pull_done;
    uint8_t         first_byte;
    int             waited;
} rank_arg_t;

/* Decode rank 0's own thread: register, then pull while the leader's handshake stalls. */
static void *rank_main(void *arg)
{
    rank_arg_t *a = arg;
    kvf_connector_req_h req;
    int32_t local[NB];
    struct timespec ts;

    decode_register(a->conn, a->dpool, a->dlen);
    pthread_barrier_wait(a->registered);
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 20;
    a->waited = sem_timedwait(&a->silent->accepted, &ts);   /* the handshake is in flight */
    memset(a->dpool, 0xee, a->dlen);
    a->pull_status = pull_start(a->conn, a->engine, local, 0, &req);
    if (a->pull_status == KVF_OK) {
        a->pull_status = pull_wait(a->conn, req);
        a->first_byte = a->dpool[0];
        (void)ops->finish_pull(a->conn, 0, req);
    }
    a->returned_before_pull_done = atomic_load(a->handshake_returned);
    return NULL;
}

static void test_stalled_handshake_unlocked(void **state)
{
    prefill_t p;
    silent_t silent;
    pthread_t sth, rth;
    pthread_barrier_t registered;
    atomic_bool returned;
    rank_arg_t ra;
    kvf_connector_h d;
    char why[512];
    char peer[64];

    (void)state;
    prefill_start(&p, 99, 0x42);
    d = decode_create("decode-stall", 3000);   /* the handshake waits up to 3 s */
    pthread_barrier_init(&registered, NULL, 2);
    atomic_init(&returned, false);
    silent_start(&silent, &sth);
    memset(&ra, 0, sizeof(ra));
    ra.conn = d;
    ra.engine = p.id;
    ra.dlen = pool_bytes(D_BLOCKS);
    ra.dpool = malloc(ra.dlen);
    assert_non_null(ra.dpool);
    ra.registered = &registered;
    ra.silent = &silent;
    ra.handshake_returned = &returned;
    assert_int_equal(pthread_create(&rth, NULL, rank_main, &ra), 0);
    pthread_barrier_wait(&registered);

    /* the leader: a good engine first, then one whose side channel never answers */
    assert_int_equal(ops->handshake(d, p.id, "127.0.0.1", p.port, why, sizeof(why)), KVF_OK);
    assert_int_equal(ops->handshake(d, "stuck", "127.0.0.1", silent.port, why, sizeof(why)),
                     KVF_ERR_PEER_TIMEOUT);
    atomic_store(&returned, true);
    pthread_join(rth, NULL);

    assert_int_equal(ra.waited, 0);
    assert_int_equal(ra.pull_status, KVF_OK);
    assert_int_equal(ra.first_byte, 0x42);
    assert_false(ra.returned_before_pull_done);   /* pulled while the handshake waited */
    snprintf(peer, sizeof(peer), "127.0.0.1:%d", silent.port);
    assert_non_null(strstr(why, "stuck"));
    assert_non_null(strstr(why, peer));

    ops->destroy(d);
    silent_stop(&silent, sth);
    pthread_barrier_destroy(&registered);
    prefill_stop(&p);
    free(ra.dpool);
}

/* ---- h: the incarnation ------------------------------------------------------ */

static kvf_status_t create_with(rnd_mode_t mode, kvf_connector_h *conn_p)
{
    kvf_connector_config_t pc;
    kvf_status_t st;

    memset(&pc, 0, sizeof(pc));
    pc.engine_id = "prefill-inc";
    pc.role = KVF_CONNECTOR_ROLE_PREFILL;
    pc.tp_size = 1;
    pc.cfg = &cfg;
    rnd_mode = mode;
    rnd_calls = 0;
    st = ops->create(&pc, conn_p);
    rnd_mode = RND_REAL;
    return st;
}

static void test_incarnation_getrandom(void **state)
{
    kvf_connector_h c, c2;

    (void)state;
    assert_int_equal(create_with(RND_FIXED, &c), KVF_OK);
    assert_true(ops->incarnation(c) == RND_FIXED_VALUE);   /* the kernel's draw, as is */
    assert_int_equal(rnd_calls, 1);
    ops->destroy(c);

    assert_int_equal(create_with(RND_EINTR_ONCE, &c), KVF_OK);   /* interrupted: retried */
    assert_true(ops->incarnation(c) == RND_FIXED_VALUE);
    assert_int_equal(rnd_calls, 2);
    ops->destroy(c);

    assert_int_equal(create_with(RND_ENOSYS, &c), KVF_ERR_IO);
    assert_int_equal(create_with(RND_SHORT, &c), KVF_ERR_IO);
    assert_int_equal(create_with(RND_ZERO, &c), KVF_ERR_IO);

    /* the real source: two instances differ and neither is 0 */
    assert_int_equal(create_with(RND_REAL, &c), KVF_OK);
    assert_int_equal(create_with(RND_REAL, &c2), KVF_OK);
    assert_true(ops->incarnation(c) != 0);
    assert_true(ops->incarnation(c) != ops->incarnation(c2));
    ops->destroy(c);
    ops->destroy(c2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_incarnation_getrandom),
        cmocka_unit_test(test_stalled_handshake_unlocked),
        cmocka_unit_test(test_engine_table_evicts_idle),
    };
    kvf_log_init("test");
    if ((kvf_model_config_load(KVF_SOURCE_DIR "/tests/data/models/tiny-dense.config.json",
                               &cfg) != KVF_OK) ||
        (kvf_cache_layout_build(&cfg, &layout) != KVF_OK)) {
        return 1;
    }
    kvf_cache_params_default(&cfg, &params);
    ops = kvf_connector_ucx_ops();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
