/*
 * The NCCL world of kvf_collectives.h without a GPU:
 * - choosing it: kvf_comm_world_create() gives the CPU world for CPU ranks
 *   and refuses CUDA ranks with a clear message when there is no GPU (this
 *   machine) or no NCCL;
 * - its own code (rank start with one communicator per span group, host
 *   buffers staged, sums and broadcasts, failure and fail-fast, finalize or
 *   abort at destroy) over a fake NCCL on the CPU (fault-injection builds:
 *   kvf_comm_world_create_nccl_test()): a collective that NCCL fails, and
 *   one the fault point tp.barrier drops, break the world with a message
 *   naming the collective, the rank and NCCL's error; the peer waiting in
 *   "NCCL" is cancelled instead of waiting out its deadline; every later
 *   collective fails without entering NCCL again; all-gathers are only enqueued and
 *   settled before the host reads sums (a settle past the deadline breaks the world).
 * What it cannot show: kernels/kvf_nccl_cuda.cu itself (needs a GPU; see
 * tests/gpu).
 */
#include "kvf_collectives.h"
#include "kvf_fault.h"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* stderr of @a fn(arg) into @a out (the log is one write(2) per line to fd 2) */
static void capture_stderr(void (*fn)(void *), void *arg, char *out, size_t cap)
{
    FILE *tmp = tmpfile();
    int saved = dup(STDERR_FILENO);
    size_t n;

    assert_non_null(tmp);
    assert_true(saved >= 0);
    assert_true(dup2(fileno(tmp), STDERR_FILENO) >= 0);
    fn(arg);
    assert_true(dup2(saved, STDERR_FILENO) >= 0);
    close(saved);
    rewind(tmp);
    n = fread(out, 1, cap - 1, tmp);
    out[n] = '\0';
    fclose(tmp);
}

typedef struct {
    kvf_device_kind_t kind;
    int               size;
    kvf_device_t     *devs;
    kvf_status_t      status;
    kvf_comm_world_h  world;
} create_arg_t;

static void do_create(void *p)
{
    create_arg_t *a = p;
    a->status = kvf_comm_world_create(a->kind, a->size, a->devs, &a->world);
}

/* CPU ranks: the CPU world; CUDA ranks without a GPU (or NCCL): refused, saying why */
static void test_world_select(void **state)
{
    kvf_device_t devs[2] = {{KVF_DEVICE_CUDA, 0, NULL}, {KVF_DEVICE_CUDA, 1, NULL}};
    create_arg_t a = {KVF_DEVICE_CPU, 2, NULL, KVF_OK, NULL};
    char log[2048];

    (void)state;
    do_create(&a);
    assert_int_equal(a.status, KVF_OK);
    assert_string_equal(kvf_comm_world_kind(a.world), "cpu");
    assert_int_equal(kvf_comm_rank_start(kvf_comm_world_rank(a.world, 0)), KVF_OK);
    kvf_comm_world_destroy(a.world);

    a = (create_arg_t){(kvf_device_kind_t)7, 2, devs, KVF_OK, NULL};
    capture_stderr(do_create, &a, log, sizeof(log));
    assert_int_equal(a.status, KVF_ERR_INVALID_PARAM);
    assert_non_null(strstr(log, "unknown device kind 7"));

    if (kvf_device_cuda_available() && kvf_nccl_available()) {
        skip();   /* a GPU machine: tests/gpu runs the NCCL world there */
    }
    a = (create_arg_t){KVF_DEVICE_CUDA, 2, devs, KVF_OK, NULL};
    capture_stderr(do_create, &a, log, sizeof(log));
    assert_int_equal(a.status, KVF_ERR_UNSUPPORTED);
    assert_null(a.world);
    if (kvf_nccl_available()) {
        assert_non_null(strstr(log, "no GPU is visible"));
    } else {
        assert_non_null(strstr(log, "need NCCL, and this build has none"));
    }
    assert_non_null(strstr(log, "CPU ranks use the CPU collectives"));
}

#ifdef KVF_FAULT_INJECTION

/* ---- a fake NCCL: a clique of threads meeting at a condition-variable barrier ---- */

typedef struct fake_clique {
    pthread_mutex_t mu;
    pthread_cond_t  cv;
    int             nranks;     /* set by the first init */
    int             arrived;
    unsigned        gen;
    const void     *bufs[64];
} fake_clique_t;

struct kvf_nccl_comm {
    fake_clique_t *q;
    int            rank;
    int64_t        timeout_ms;
    const int     *cancel;
    bool           broken;
    bool           finalized;
    bool           pending;    /* an async all-gather not settled yet */
    char           why[320];
};

static struct {
    atomic_int     ids, inits, watched, colls, finalizes, aborts, destroys, timeouts;
    atomic_int     asyncs, settles, settled;   /* async all-gathers; settle calls; pending ones */
    atomic_int     fail_settle_rank;  /* this rank's first settle of a pending one times out */
    atomic_int     fail_rank;      /* this rank's fail_call-th collective fails (-1: none) */
    atomic_int     fail_call;
    atomic_int     rank_calls[64];
    pthread_mutex_t mu;
    fake_clique_t *cliques[128];
    int            ncliques;
} fake = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void fake_reset(void)
{
    pthread_mutex_lock(&fake.mu);
    for (int i = 0; i < fake.ncliques; ++i) {
        pthread_cond_destroy(&fake.cliques[i]->cv);
        pthread_mutex_destroy(&fake.cliques[i]->mu);
        free(fake.cliques[i]);
    }
    fake.ncliques = 0;
    pthread_mutex_unlock(&fake.mu);
    atomic_store(&fake.ids, 0);
    atomic_store(&fake.inits, 0);
    atomic_store(&fake.watched, 0);
    atomic_store(&fake.colls, 0);
    atomic_store(&fake.finalizes, 0);
    atomic_store(&fake.aborts, 0);
    atomic_store(&fake.destroys, 0);
    atomic_store(&fake.timeouts, 0);
    atomic_store(&fake.asyncs, 0);
    atomic_store(&fake.settles, 0);
    atomic_store(&fake.settled, 0);
    atomic_store(&fake.fail_settle_rank, -1);
    atomic_store(&fake.fail_rank, -1);
    atomic_store(&fake.fail_call, 0);
    for (int i = 0; i < 64; ++i) {
        atomic_store(&fake.rank_calls[i], 0);
    }
}

static int fake_id_make(kvf_nccl_id_t *id_p)
{
    fake_clique_t *q = calloc(1, sizeof(*q));

    assert_non_null(q);
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    pthread_mutex_lock(&fake.mu);
    assert_true(fake.ncliques < 128);
    fake.cliques[fake.ncliques++] = q;
    pthread_mutex_unlock(&fake.mu);
    memset(id_p, 0, sizeof(*id_p));
    memcpy(id_p->bytes, &q, sizeof(q));
    atomic_fetch_add(&fake.ids, 1);
    return KVF_KERN_OK;
}

static int fake_comm_init(const kvf_device_t *dev, const kvf_nccl_id_t *id, int nranks, int rank,
                          int64_t timeout_ms, kvf_nccl_comm_h *comm_p)
{
    struct kvf_nccl_comm *c = calloc(1, sizeof(*c));

    assert_non_null(dev);
    assert_non_null(c);
    assert_true((rank >= 0) && (rank < nranks) && (timeout_ms > 0));
    memcpy(&c->q, id->bytes, sizeof(c->q));
    c->rank = rank;
    c->timeout_ms = timeout_ms;
    pthread_mutex_lock(&c->q->mu);
    if (c->q->nranks == 0) {
        c->q->nranks = nranks;
    }
    assert_int_equal(c->q->nranks, nranks);
    pthread_mutex_unlock(&c->q->mu);
    atomic_fetch_add(&fake.inits, 1);
    *comm_p = c;
    return KVF_KERN_OK;
}

static void fake_comm_watch(kvf_nccl_comm_h c, const int *cancel)
{
    c->cancel = cancel;
    atomic_fetch_add(&fake.watched, 1);
}

static int fake_fail(struct kvf_nccl_comm *c, int rc, const char *why)
{
    if (!c->broken) {
        snprintf(c->why, sizeof(c->why), "%s; communicator aborted", why);
        c->broken = true;
    }
    return rc;
}

/* everyone of the clique arrives, or the watched cancel flag / the deadline ends the wait */
static int fake_barrier(struct kvf_nccl_comm *c, const char *call)
{
    fake_clique_t *q = c->q;
    struct timespec now;
    int64_t waited = 0;
    char why[128];
    unsigned g;

    pthread_mutex_lock(&q->mu);
    g = q->gen;
    if (++q->arrived == q->nranks) {
        q->arrived = 0;
        q->gen++;
        pthread_cond_broadcast(&q->cv);
        pthread_mutex_unlock(&q->mu);
        return KVF_KERN_OK;
    }
    while (q->gen == g) {
        clock_gettime(CLOCK_REALTIME, &now);
        now.tv_nsec += 5 * 1000000;
        if (now.tv_nsec >= 1000000000) {
            now.tv_sec++;
            now.tv_nsec -= 1000000000;
        }
        (void)pthread_cond_timedwait(&q->cv, &q->mu, &now);
        waited += 5;
        if (q->gen != g) {
            break;
        }
        if ((c->cancel != NULL) && (__atomic_load_n(c->cancel, __ATOMIC_ACQUIRE) != 0)) {
            pthread_mutex_unlock(&q->mu);
            snprintf(why, sizeof(why), "%s: cancelled (another rank of the instance failed "
                     "first)", call);
            return fake_fail(c, KVF_KERN_ENCCL, why);
        }
        if (waited >= c->timeout_ms) {
            pthread_mutex_unlock(&q->mu);
            atomic_fetch_add(&fake.timeouts, 1);
            snprintf(why, sizeof(why), "%s: not complete after %lld ms", call,
                     (long long)c->timeout_ms);
            return fake_fail(c, KVF_KERN_ETIMEDOUT, why);
        }
    }
    pthread_mutex_unlock(&q->mu);
    return KVF_KERN_OK;
}

/* the injected NCCL failure: this call of this (world) rank fails as NCCL would say */
static bool fake_injected(struct kvf_nccl_comm *c, const char *call)
{
    int world_rank = c->rank;   /* the tests inject on the world communicator (span == size) */
    int n = atomic_fetch_add(&fake.rank_calls[world_rank], 1) + 1;
    char why[200];

    if ((atomic_load(&fake.fail_rank) == world_rank) && (atomic_load(&fake.fail_call) == n)) {
        snprintf(why, sizeof(why), "%s: unhandled cuda error (run with NCCL_DEBUG=INFO for "
                 "details) (fake: injected)", call);
        (void)fake_fail(c, KVF_KERN_ENCCL, why);
        return true;
    }
    return false;
}

/* The fake sums in DESCENDING rank order: NCCL's order is its algorithm's (ring, tree,
 * chunking by size), not rank order, so a world that summed through it would not give the
 * CPU world's bits; the NCCL world must not depend on it for sums (test_nccl_world_order). */
static int fake_all_reduce(kvf_nccl_comm_h c, const float *send, float *recv, size_t n)
{
    fake_clique_t *q = c->q;
    float *sum;
    int rc;

    atomic_fetch_add(&fake.colls, 1);
    if (c->broken) {
        return KVF_KERN_ENCCL;
    }
    if (fake_injected(c, "ncclAllReduce(sum, fp32)")) {
        return KVF_KERN_ENCCL;
    }
    sum = calloc(n + 1, sizeof(float));
    assert_non_null(sum);
    q->bufs[c->rank] = send;
    rc = fake_barrier(c, "ncclAllReduce(sum, fp32)");
    for (int r = q->nranks - 1; (rc == KVF_KERN_OK) && (r >= 0); --r) {
        for (size_t i = 0; i < n; ++i) {
            sum[i] += ((const float *)q->bufs[r])[i];
        }
    }
    if (rc == KVF_KERN_OK) {
        rc = fake_barrier(c, "ncclAllReduce(sum, fp32)");
    }
    if (rc == KVF_KERN_OK) {
        memcpy(recv, sum, n * sizeof(float));
    }
    free(sum);
    return rc;
}

static int fake_all_gather(kvf_nccl_comm_h c, const float *send, float *recv, size_t n)
{
    fake_clique_t *q = c->q;
    int rc;

    atomic_fetch_add(&fake.colls, 1);
    if (c->broken) {
        return KVF_KERN_ENCCL;
    }
    if (fake_injected(c, "ncclAllGather(fp32)")) {
        return KVF_KERN_ENCCL;
    }
    q->bufs[c->rank] = send;
    rc = fake_barrier(c, "ncclAllGather(fp32)");
    for (int r = 0; (rc == KVF_KERN_OK) && (r < q->nranks); ++r) {
        memcpy(recv + (size_t)r * n, q->bufs[r], n * sizeof(float));
    }
    return (rc == KVF_KERN_OK) ? fake_barrier(c, "ncclAllGather(fp32)") : rc;
}

/* enqueued "without the wait": the fake moves the data at once and marks the communicator
 * pending, as the real one leaves it until kvf_nccl_comm_settle() */
static int fake_all_gather_async(kvf_nccl_comm_h c, const float *send, float *recv, size_t n)
{
    int rc = fake_all_gather(c, send, recv, n);

    atomic_fetch_add(&fake.asyncs, 1);
    c->pending = c->pending || (rc == KVF_KERN_OK);
    return rc;
}

static int fake_comm_settle(kvf_nccl_comm_h c, const char *what)
{
    char why[200];

    atomic_fetch_add(&fake.settles, 1);
    if (c->broken) {
        return KVF_KERN_ENCCL;
    }
    if (!c->pending) {
        return KVF_KERN_OK;
    }
    if (atomic_load(&fake.fail_settle_rank) == c->rank) {
        atomic_store(&fake.fail_settle_rank, -1);
        snprintf(why, sizeof(why), "%s: not complete after %lld ms (fake: settle)", what,
                 (long long)c->timeout_ms);
        return fake_fail(c, KVF_KERN_ETIMEDOUT, why);
    }
    c->pending = false;
    atomic_fetch_add(&fake.settled, 1);
    return KVF_KERN_OK;
}

static int fake_broadcast(kvf_nccl_comm_h c, const void *send, void *recv, size_t bytes,
                          int root)
{
    fake_clique_t *q = c->q;
    int rc;

    atomic_fetch_add(&fake.colls, 1);
    if (c->broken) {
        return KVF_KERN_ENCCL;
    }
    if (fake_injected(c, "ncclBroadcast(bytes)")) {
        return KVF_KERN_ENCCL;
    }
    q->bufs[c->rank] = send;
    rc = fake_barrier(c, "ncclBroadcast(bytes)");
    if ((rc == KVF_KERN_OK) && (c->rank != root)) {
        memcpy(recv, q->bufs[root], bytes);
    }
    return (rc == KVF_KERN_OK) ? fake_barrier(c, "ncclBroadcast(bytes)") : rc;
}

static const char *fake_comm_error(kvf_nccl_comm_h c)
{
    return c->broken ? c->why : NULL;
}

static void fake_comm_abort(kvf_nccl_comm_h c)
{
    atomic_fetch_add(&fake.aborts, 1);
    (void)fake_fail(c, KVF_KERN_ENCCL, "aborted by its owner");
}

static int fake_comm_finalize(kvf_nccl_comm_h c)
{
    assert_false(c->broken);
    c->finalized = true;
    atomic_fetch_add(&fake.finalizes, 1);
    return KVF_KERN_OK;
}

static void fake_comm_destroy(kvf_nccl_comm_h c)
{
    assert_true(c->finalized || c->broken);
    atomic_fetch_add(&fake.destroys, 1);
    free(c);
}

static const kvf_comm_nccl_backend_t fake_backend = {
    .id_make = fake_id_make, .comm_init = fake_comm_init, .comm_watch = fake_comm_watch,
    .all_reduce_sum = fake_all_reduce, .all_gather = fake_all_gather,
    .broadcast = fake_broadcast, .all_gather_async = fake_all_gather_async,
    .comm_settle = fake_comm_settle,
    .comm_error = fake_comm_error, .comm_abort = fake_comm_abort,
    .comm_finalize = fake_comm_finalize, .comm_destroy = fake_comm_destroy,
};

static kvf_comm_world_h fake_world(int size, uint32_t timeout_ms)
{
    kvf_device_t devs[8];
    kvf_comm_world_h w = NULL;

    for (int r = 0; r < size; ++r) {
        devs[r] = kvf_device_cpu();   /* the fake's "device" memory is host memory */
    }
    fake_reset();
    assert_int_equal(kvf_comm_world_create_nccl_test(size, devs, &fake_backend, &w), KVF_OK);
    assert_string_equal(kvf_comm_world_kind(w), "nccl");
    assert_int_equal(kvf_comm_world_set_barrier(w, "test-nccl", 0), KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_comm_world_set_barrier(w, "test-nccl", timeout_ms), KVF_OK);
    return w;
}

typedef struct {
    kvf_comm_t  *comm;
    bool         explicit_start;
    int          iters;
    int          errors;
    kvf_status_t first_error;
    kvf_status_t late;     /* a collective after the failure */
} rank_arg_t;

#define N 37

static void *rank_main(void *p)
{
    rank_arg_t *a = p;
    const int r = a->comm->rank, size = a->comm->size;
    kvf_status_t st;
    float buf[N];
    int bc[4];

    if (a->explicit_start) {
        st = kvf_comm_rank_start(a->comm);
        a->errors += (st != KVF_OK);
        a->errors += (kvf_comm_rank_start(a->comm) != KVF_ERR_INVALID_PARAM);   /* twice */
    }
    for (int it = 0; it < a->iters; ++it) {
        for (int i = 0; i < N; ++i) {
            buf[i] = (float)(r * 1000 + i + it);
        }
        if ((st = kvf_comm_all_reduce(a->comm, buf, N)) != KVF_OK) {
            a->first_error = st;
            break;
        }
        for (int i = 0; i < N; ++i) {
            /* sum over r of (1000 r + i + it) */
            a->errors += (buf[i] != (float)(1000 * size * (size - 1) / 2 + size * (i + it)));
        }
        for (int i = 0; i < N; ++i) {
            buf[i] = (float)(r + 1);
        }
        if ((st = kvf_comm_all_reduce_span(a->comm, buf, N, 2)) != KVF_OK) {
            a->first_error = st;
            break;
        }
        /* groups {0,1} -> 3, {2,3} -> 7 */
        a->errors += (buf[N - 1] != (float)(4 * (r / 2) + 3));
        memset(bc, 0, sizeof(bc));
        if (r == it % size) {
            bc[0] = it;
            bc[3] = -it;
        }
        if ((st = kvf_comm_broadcast(a->comm, bc, sizeof(bc), it % size)) != KVF_OK) {
            a->first_error = st;
            break;
        }
        a->errors += (bc[0] != it) || (bc[3] != -it);
        if ((st = kvf_comm_barrier(a->comm)) != KVF_OK) {
            a->first_error = st;
            break;
        }
    }
    if (a->first_error != KVF_OK) {
        float x = 2.0f;
        a->late = kvf_comm_all_reduce(a->comm, &x, 1);
        a->errors += (x != 2.0f);   /* untouched */
    }
    return NULL;
}

static void run_ranks(kvf_comm_world_h w, int size, bool explicit_start, int iters,
                      rank_arg_t *args)
{
    pthread_t th[8];

    for (int r = 0; r < size; ++r) {
        args[r] = (rank_arg_t){kvf_comm_world_rank(w, r), explicit_start, iters, 0, KVF_OK,
                               KVF_OK};
        assert_int_equal(pthread_create(&th[r], NULL, rank_main, &args[r]), 0);
    }
    for (int r = 0; r < size; ++r) {
        pthread_join(th[r], NULL);
    }
}

/* sums over the world and over span groups, broadcasts from every root, barriers */
static void test_nccl_world_collectives(void **state)
{
    rank_arg_t args[4];

    (void)state;
    for (int mode = 0; mode < 2; ++mode) {   /* explicit start, then started lazily */
        kvf_comm_world_h w = fake_world(4, 10000);

        assert_int_equal(atomic_load(&fake.ids), 1 + 2);   /* the world's + 2 groups of span 2 */
        run_ranks(w, 4, mode == 0, 50, args);
        for (int r = 0; r < 4; ++r) {
            assert_int_equal(args[r].first_error, KVF_OK);
            assert_int_equal(args[r].errors, 0);
        }
        assert_null(kvf_comm_world_error(w));
        /* every all-reduce's gather was only enqueued, and each (host buffers here) was
         * settled before its sums were copied back: 2 per iteration and rank */
        assert_int_equal(atomic_load(&fake.asyncs), 4 * 50 * 2);
        assert_int_equal(atomic_load(&fake.settled), 4 * 50 * 2);
        for (int r = 0; r < 4; ++r) {   /* nothing left pending: a settle is a no-op */
            int before = atomic_load(&fake.settled);
            assert_int_equal(kvf_comm_settle(kvf_comm_world_rank(w, r)), KVF_OK);
            assert_int_equal(atomic_load(&fake.settled), before);
        }
        /* each rank: one world communicator and its span-2 group's, all watched */
        assert_int_equal(atomic_load(&fake.inits), 8);
        assert_int_equal(atomic_load(&fake.watched), 8);
        assert_int_equal(kvf_comm_world_set_barrier(w, "late", 100), KVF_ERR_INVALID_PARAM);
        kvf_comm_world_destroy(w);
        assert_int_equal(atomic_load(&fake.finalizes), 8);   /* healthy: finalized, not aborted */
        assert_int_equal(atomic_load(&fake.aborts), 0);
        assert_int_equal(atomic_load(&fake.destroys), 8);
        assert_int_equal(atomic_load(&fake.timeouts), 0);
    }
    fake_reset();
}

/*
 * Sums in the CPU world's order: values where the order shows ((1e8 + 1) - 1e8 = 0 in fp32,
 * 1e8 + (1 - 1e8) = 1e8 - 1e8 ...), summed by the NCCL world over span 4 and span 2 and by the
 * CPU world, bit for bit equal; the fake NCCL's own all-reduce sums in another order, so a
 * world that handed sums to it would differ.
 */
typedef struct {
    kvf_comm_t *comm;
    float       out[2][N];   /* span 4, span 2 */
    kvf_status_t st;
} order_arg_t;

static float order_value(int r, int i)
{
    static const float v[4] = {1e8f, 1.0f, -1e8f, 3.0f};
    return v[(r + i) % 4] * (float)(1 + i % 3) + 0.25f * (float)i;
}

static void *order_main(void *p)
{
    order_arg_t *a = p;
    const int r = a->comm->rank;

    for (int k = 0; k < 2; ++k) {
        for (int i = 0; i < N; ++i) {
            a->out[k][i] = order_value(r, i);
        }
        kvf_status_t st = (k == 0) ? kvf_comm_all_reduce(a->comm, a->out[k], N)
                                   : kvf_comm_all_reduce_span(a->comm, a->out[k], N, 2);
        a->st = (a->st != KVF_OK) ? a->st : st;
    }
    return NULL;
}

static void run_order(kvf_comm_world_h w, order_arg_t *args)
{
    pthread_t th[4];

    for (int r = 0; r < 4; ++r) {
        args[r] = (order_arg_t){.comm = kvf_comm_world_rank(w, r), .st = KVF_OK};
        assert_int_equal(pthread_create(&th[r], NULL, order_main, &args[r]), 0);
    }
    for (int r = 0; r < 4; ++r) {
        pthread_join(th[r], NULL);
    }
}

static void test_nccl_world_order(void **state)
{
    order_arg_t nccl[4], cpu[4];
    kvf_comm_world_h w = fake_world(4, 10000), wc = NULL;
    int differs = 0;

    (void)state;
    run_order(w, nccl);
    kvf_comm_world_destroy(w);
    fake_reset();
    assert_int_equal(kvf_comm_world_create(KVF_DEVICE_CPU, 4, NULL, &wc), KVF_OK);
    run_order(wc, cpu);
    kvf_comm_world_destroy(wc);
    for (int r = 0; r < 4; ++r) {
        assert_int_equal(nccl[r].st, KVF_OK);
        assert_int_equal(cpu[r].st, KVF_OK);
        assert_memory_equal(nccl[r].out, cpu[r].out, sizeof(cpu[r].out));
    }
    /* the data does show the order: the fake's descending sum of span 4 differs somewhere */
    for (int i = 0; i < N; ++i) {
        float desc = 0.0f, asc = order_value(0, i);
        for (int r = 3; r >= 0; --r) {
            desc += order_value(r, i);
        }
        for (int r = 1; r < 4; ++r) {
            asc += order_value(r, i);
        }
        differs += (desc != asc);
    }
    assert_true(differs > 0);
}

/* after a failure: every rank failed, the world says why, later calls never enter NCCL */
static void check_broken(kvf_comm_world_h w, const rank_arg_t *args, int size,
                         kvf_status_t world_status, const char *needle)
{
    const char *why = kvf_comm_world_error(w);
    int colls = atomic_load(&fake.colls);
    float x = 5.0f;

    for (int r = 0; r < size; ++r) {
        assert_int_not_equal(args[r].first_error, KVF_OK);
        assert_int_equal(args[r].late, world_status);
        assert_int_equal(args[r].errors, 0);
    }
    assert_non_null(why);
    assert_non_null(strstr(why, "test-nccl NCCL world of 2 ranks broke"));
    assert_non_null(strstr(why, needle));
    assert_non_null(strstr(why, "every later collective of this world fails"));
    /* fail fast: the world's status at once, without a call into NCCL */
    assert_int_equal(kvf_comm_barrier(kvf_comm_world_rank(w, 0)), world_status);
    assert_int_equal(kvf_comm_broadcast(kvf_comm_world_rank(w, 1), &x, 4, 0), world_status);
    assert_int_equal(kvf_comm_all_reduce(kvf_comm_world_rank(w, 1), &x, 1), world_status);
    assert_true(x == 5.0f);
    assert_int_equal(atomic_load(&fake.colls), colls);
    /* the peer waiting in "NCCL" was cancelled, never ran into its 20 s deadline */
    assert_int_equal(atomic_load(&fake.timeouts), 0);
    kvf_comm_world_destroy(w);
    assert_int_equal(atomic_load(&fake.finalizes), 0);   /* broken: aborted, not finalized */
    assert_int_equal(atomic_load(&fake.destroys), 2);
    fake_reset();
}

/* NCCL fails rank 1's third collective: the world breaks naming NCCL's error */
static void test_nccl_world_nccl_error(void **state)
{
    kvf_comm_world_h w = fake_world(2, 20000);
    rank_arg_t args[2];

    (void)state;
    atomic_store(&fake.fail_call, 3);   /* world: all-reduce, (span 2 = world) all-reduce, bcast */
    atomic_store(&fake.fail_rank, 1);
    run_ranks(w, 2, true, 10, args);
    assert_int_equal(args[1].first_error, KVF_ERR_NCCL);
    assert_non_null(strstr(kvf_comm_world_error(w), "broadcast of 16 bytes (staged) from rank 0 "
                                                    "on rank 1 (cpu:0) failed: ncclBroadcast"));
    check_broken(w, args, 2, KVF_ERR_NCCL, "unhandled cuda error");
}

/*
 * The fault point tp.barrier drops a rank's collective: as a timeout, the world breaks.
 * Pass 8 is the second arrival at the fourth collective (the barrier of iteration 0), so the
 * first one already waits in "NCCL" and must be cancelled.
 */
static void test_nccl_world_fault_drop(void **state)
{
    kvf_comm_world_h w = fake_world(2, 20000);
    rank_arg_t args[2];

    (void)state;
    kvf_fault_disarm();
    assert_int_equal(kvf_fault_arm("tp.barrier@8=drop"), KVF_OK);
    run_ranks(w, 2, false, 10, args);
    kvf_fault_disarm();
    assert_true((args[0].first_error == KVF_ERR_TIMED_OUT) ||
                (args[1].first_error == KVF_ERR_TIMED_OUT));
    assert_true(atomic_load(&fake.aborts) >= 1);   /* the dropping rank aborted its own */
    check_broken(w, args, 2, KVF_ERR_TIMED_OUT, "the fault point tp.barrier dropped it");
}

/* An enqueued all-gather that never completes: rank 1's settle (before its sums come back)
 * runs into the deadline, the world breaks naming it, the peer waiting in "NCCL" is
 * cancelled and later collectives fail fast */
static void test_nccl_world_settle_timeout(void **state)
{
    kvf_comm_world_h w = fake_world(2, 20000);
    rank_arg_t args[2];

    (void)state;
    atomic_store(&fake.fail_settle_rank, 1);
    run_ranks(w, 2, true, 10, args);
    assert_int_equal(args[1].first_error, KVF_ERR_TIMED_OUT);
    assert_non_null(strstr(kvf_comm_world_error(w), "all-reduce (sum, fp32) on rank 1 (cpu:0) "
                                                    "failed"));
    check_broken(w, args, 2, KVF_ERR_TIMED_OUT, "not complete after 20000 ms (fake: settle)");
}

static void test_nccl_world_refusals(void **state)
{
    kvf_device_t devs[2] = {kvf_device_cpu(), kvf_device_cpu()};
    kvf_comm_world_h w = NULL;
    kvf_comm_nccl_backend_t partial = fake_backend;

    (void)state;
    partial.broadcast = NULL;
    assert_int_equal(kvf_comm_world_create_nccl_test(2, devs, &partial, &w),
                     KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_comm_world_create_nccl_test(0, devs, &fake_backend, &w),
                     KVF_ERR_INVALID_PARAM);
    assert_null(w);
    fake_reset();
}
#endif

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_world_select),
#ifdef KVF_FAULT_INJECTION
        cmocka_unit_test(test_nccl_world_collectives),
        cmocka_unit_test(test_nccl_world_order),
        cmocka_unit_test(test_nccl_world_nccl_error),
        cmocka_unit_test(test_nccl_world_fault_drop),
        cmocka_unit_test(test_nccl_world_settle_timeout),
        cmocka_unit_test(test_nccl_world_refusals),
#endif
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
