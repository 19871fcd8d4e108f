/*
 * CPU collectives: rank threads publish a pointer to their buffer, meet at a
 * barrier, each computes its own result from the published buffers into a
 * private scratch, meet again, and copy the scratch back. Two barriers per
 * call; every rank reads every peer buffer of its span, which is fine for
 * the few-KB activations of CPU tensor parallelism. Rejected: a
 * reduce-scatter/all-gather ring (three barriers, no gain at 2-4 ranks on
 * two cores).
 *
 * The barrier spins briefly, then sleeps on a futex: a decode step crosses
 * about two barriers per layer, and glibc's pthread_barrier always sleeps,
 * which costs a wake-up (tens of microseconds) per crossing when the ranks
 * have cores of their own. The spin is short so that oversubscribed runs
 * (TP4 on two cores) give their time slice away quickly.
 *
 * A barrier that waits longer than its timeout (a rank thread stuck or
 * gone) breaks the world: the rank that saw the timeout records why (the
 * barrier's name and timeout), wakes every sleeper, and from then on every
 * wait of every rank returns KVF_ERR_TIMED_OUT at once, so no rank hangs
 * and none reads a peer buffer that may no longer exist. Rejected: a
 * resettable barrier (the ranks would have to agree on the reset, which is
 * the very synchronisation that failed).
 */
#include "kvf_collectives_int.h"
#include "kvf_fault.h"
#include "kvf_log.h"
#include "kvf_time.h"

#include <limits.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define KVF_BARRIER_SPIN 4000

static inline void kvf_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

typedef struct {
    _Atomic int      count;
    _Atomic unsigned gen;
    _Atomic int      sleepers;
    _Atomic int      broken;      /* KVF_OK, or the status every wait returns from now on */
    atomic_bool      breaking;    /* claimed by the rank that breaks it */
    int              size;
    uint32_t         timeout_ms;  /* 0: wait forever */
    char             name[64];
    char             why[256];    /* written once, by the rank that broke it */
} kvf_barrier_t;

/* Break the barrier for good: every rank waiting or arriving later returns an error. */
static kvf_status_t kvf_barrier_break(kvf_barrier_t *b, int arrived)
{
    if (!atomic_exchange(&b->breaking, true)) {
        /* why is written before broken is published: readers see it whole */
        snprintf(b->why, sizeof(b->why), "%s barrier of %d ranks timed out after %u ms: only "
                 "%d rank(s) arrived (a rank thread is stuck or gone); every later collective "
                 "of this world fails", b->name, b->size, b->timeout_ms, arrived);
        kvf_error("%s", b->why);
        atomic_store(&b->broken, KVF_ERR_TIMED_OUT);
        atomic_fetch_add(&b->gen, 1);   /* release everyone, as a completion would */
        syscall(SYS_futex, &b->gen, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
    }
    while (atomic_load(&b->broken) == KVF_OK) {
        kvf_cpu_relax();                /* another rank is publishing it */
    }
    return (kvf_status_t)atomic_load(&b->broken);
}

/*
 * The wake-up pairing is the store-buffering pattern: the last arrival
 * writes gen then reads sleepers; a sleeper writes sleepers then reads gen.
 * With acquire/release alone both may read the old value (the last arrival
 * skips the wake, the sleeper sleeps on a gen that already moved: futex's
 * own check closes that window only on the kernel side). Every access of
 * count, gen and sleepers is therefore seq_cst, so at least one side sees
 * the other's write.
 */
static kvf_status_t kvf_barrier_wait(kvf_barrier_t *b)
{
    kvf_status_t broken = (kvf_status_t)atomic_load(&b->broken);
    uint64_t deadline;
    unsigned g;

    if (broken != KVF_OK) {
        return broken;
    }
    if (KVF_FAULT(TP_BARRIER) == KVF_FAULT_DROP) {
        /* tests: this rank never arrives; the barrier breaks as its timeout would */
        return kvf_barrier_break(b, atomic_load(&b->count));
    }
    g = atomic_load(&b->gen);
    if (atomic_fetch_add(&b->count, 1) == b->size - 1) {
        atomic_store(&b->count, 0);
        atomic_fetch_add(&b->gen, 1);
        if (atomic_load(&b->sleepers) > 0) {
            syscall(SYS_futex, &b->gen, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
        }
        return (kvf_status_t)atomic_load(&b->broken);
    }
    for (int i = 0; i < KVF_BARRIER_SPIN; ++i) {
        if (atomic_load(&b->gen) != g) {
            return (kvf_status_t)atomic_load(&b->broken);
        }
        kvf_cpu_relax();
    }
    deadline = kvf_time_now_ns() + (uint64_t)b->timeout_ms * 1000000ull;
    atomic_fetch_add(&b->sleepers, 1);
    while (atomic_load(&b->gen) == g) {
        uint64_t now = kvf_time_now_ns();
        struct timespec ts;
        uint64_t left;

        if ((b->timeout_ms > 0) && (now >= deadline)) {
            int arrived = atomic_load(&b->count);
            atomic_fetch_sub(&b->sleepers, 1);
            return kvf_barrier_break(b, arrived);
        }
        left = (b->timeout_ms > 0) ? deadline - now : 1000000000ull;
        ts.tv_sec = (time_t)(left / 1000000000ull);
        ts.tv_nsec = (long)(left % 1000000000ull);
        /* returns at once if gen already moved on (EAGAIN); ETIMEDOUT loops to the check */
        syscall(SYS_futex, &b->gen, FUTEX_WAIT_PRIVATE, g, &ts, NULL, 0);
    }
    atomic_fetch_sub(&b->sleepers, 1);
    return (kvf_status_t)atomic_load(&b->broken);
}

typedef struct {
    float  *scratch;
    size_t  cap;
} kvf_comm_rank_state_t;

typedef struct kvf_comm_cpu_world {
    struct kvf_comm_world base;   /* first: the public handle */
    int                   size;
    kvf_barrier_t         bar;
    void                 *bufs[KVF_COMM_MAX_RANKS];
    kvf_comm_rank_state_t st[KVF_COMM_MAX_RANKS];
} kvf_comm_cpu_world_t;

static kvf_status_t kvf_comm_wait(kvf_comm_cpu_world_t *w)
{
    return kvf_barrier_wait(&w->bar);
}

static kvf_status_t kvf_comm_cpu_all_reduce(void *ctx, int rank, float *buf, size_t n, int span)
{
    kvf_comm_cpu_world_t *w = ctx;
    kvf_comm_rank_state_t *st = &w->st[rank];
    kvf_status_t status = KVF_OK, wait;
    int first;

    if ((span <= 0) || (w->size % span != 0)) {
        kvf_error("all-reduce span %d does not divide the world size %d", span, w->size);
        status = KVF_ERR_INVALID_PARAM;   /* still meet the others, so nobody hangs */
    }
    if ((status == KVF_OK) && (st->cap < n)) {
        float *s = realloc(st->scratch, n * sizeof(float));
        if (s == NULL) {
            status = KVF_ERR_NO_MEMORY;
        } else {
            st->scratch = s;
            st->cap = n;
        }
    }
    w->bufs[rank] = buf;
    wait = kvf_comm_wait(w);
    if (wait != KVF_OK) {
        return wait;            /* broken world: peers' buffers may be gone */
    }
    if ((status == KVF_OK) && (span > 1)) {
        first = rank / span * span;
        memcpy(st->scratch, w->bufs[first], n * sizeof(float));
        for (int r = first + 1; r < first + span; ++r) {
            const float *src = w->bufs[r];
            for (size_t i = 0; i < n; ++i) {
                st->scratch[i] += src[i];
            }
        }
    }
    wait = kvf_comm_wait(w);
    if (wait != KVF_OK) {
        return wait;
    }
    if ((status == KVF_OK) && (span > 1)) {
        memcpy(buf, st->scratch, n * sizeof(float));
    }
    return status;
}

static kvf_status_t kvf_comm_cpu_broadcast(void *ctx, int rank, void *buf, size_t n, int root)
{
    kvf_comm_cpu_world_t *w = ctx;
    kvf_status_t status;

    w->bufs[rank] = buf;
    status = kvf_comm_wait(w);
    if (status != KVF_OK) {
        return status;
    }
    if ((rank != root) && (n > 0)) {
        memcpy(buf, w->bufs[root], n);
    }
    return kvf_comm_wait(w);
}

static kvf_status_t kvf_comm_cpu_barrier(void *ctx, int rank)
{
    (void)rank;
    return kvf_comm_wait(ctx);
}

static const kvf_comm_ops_t kvf_comm_cpu_ops = {
    .abi_version        = KVF_COMM_ABI,
    .name               = "cpu",
    .all_reduce_sum_f32 = kvf_comm_cpu_all_reduce,
    .broadcast          = kvf_comm_cpu_broadcast,
    .barrier            = kvf_comm_cpu_barrier,
};

static kvf_status_t kvf_comm_cpu_set_barrier(kvf_comm_world_h world, const char *name,
                                             uint32_t timeout_ms)
{
    kvf_comm_cpu_world_t *w = (kvf_comm_cpu_world_t *)world;

    snprintf(w->bar.name, sizeof(w->bar.name), "%s", name);
    w->bar.timeout_ms = timeout_ms;
    return KVF_OK;
}

static const char *kvf_comm_cpu_error(kvf_comm_world_h world)
{
    kvf_comm_cpu_world_t *w = (kvf_comm_cpu_world_t *)world;

    return (atomic_load(&w->bar.broken) != KVF_OK) ? w->bar.why : NULL;
}

static void kvf_comm_cpu_destroy(kvf_comm_world_h world)
{
    kvf_comm_cpu_world_t *w = (kvf_comm_cpu_world_t *)world;

    for (int r = 0; r < w->size; ++r) {
        free(w->st[r].scratch);
    }
    free(w);
}

static const kvf_comm_world_vtbl_t kvf_comm_cpu_world_vtbl = {
    .kind        = "cpu",
    .start_rank  = NULL,
    .set_barrier = kvf_comm_cpu_set_barrier,
    .error       = kvf_comm_cpu_error,
    .destroy     = kvf_comm_cpu_destroy,
};

kvf_status_t kvf_comm_world_create_cpu(int size, kvf_comm_world_h *world_p)
{
    kvf_comm_cpu_world_t *w;

    if ((size < 1) || (size > KVF_COMM_MAX_RANKS)) {
        kvf_error("communicator size %d is outside [1, %d]", size, KVF_COMM_MAX_RANKS);
        return KVF_ERR_INVALID_PARAM;
    }
    w = calloc(1, sizeof(*w));
    if (w == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    w->bar.size = size;
    w->bar.timeout_ms = KVF_COMM_BARRIER_TIMEOUT_MS;
    snprintf(w->bar.name, sizeof(w->bar.name), "tp");
    atomic_init(&w->bar.broken, KVF_OK);
    w->size = size;
    w->base.vt = &kvf_comm_cpu_world_vtbl;
    w->base.size = size;
    for (int r = 0; r < size; ++r) {
        w->base.comms[r] = (kvf_comm_t){
            .ops = &kvf_comm_cpu_ops, .ctx = w, .rank = r, .size = size,
        };
    }
    *world_p = &w->base;
    return KVF_OK;
}

/* ---- the world functions of kvf_collectives.h, for every backend ---- */

kvf_status_t kvf_comm_world_create(kvf_device_kind_t kind, int size, const kvf_device_t *devs,
                                   kvf_comm_world_h *world_p)
{
    if (world_p == NULL) {
        return KVF_ERR_INVALID_PARAM;
    }
    switch (kind) {
    case KVF_DEVICE_CPU:
        return kvf_comm_world_create_cpu(size, world_p);
    case KVF_DEVICE_CUDA:
        return kvf_comm_world_create_nccl(size, devs, world_p);
    default:
        kvf_error("TP collectives: unknown device kind %d (want cpu or cuda)", (int)kind);
        return KVF_ERR_INVALID_PARAM;
    }
}

kvf_status_t kvf_comm_rank_start(kvf_comm_t *comm)
{
    kvf_comm_world_h w;

    if ((comm == NULL) || (comm->ctx == NULL)) {
        return KVF_ERR_INVALID_PARAM;
    }
    /* every backend's ctx is its world, whose first member is the base */
    w = (kvf_comm_world_h)comm->ctx;
    return (w->vt->start_rank != NULL) ? w->vt->start_rank(w, comm->rank) : KVF_OK;
}

const char *kvf_comm_world_kind(kvf_comm_world_h world)
{
    return world->vt->kind;
}

void kvf_comm_world_destroy(kvf_comm_world_h world)
{
    if (world != NULL) {
        world->vt->destroy(world);
    }
}

kvf_status_t kvf_comm_world_set_barrier(kvf_comm_world_h world, const char *name,
                                        uint32_t timeout_ms)
{
    if ((world == NULL) || (name == NULL) || (name[0] == '\0') || (strlen(name) >= 64)) {
        kvf_error("communicator barrier name must be 1..63 bytes");
        return KVF_ERR_INVALID_PARAM;
    }
    return world->vt->set_barrier(world, name, timeout_ms);
}

const char *kvf_comm_world_error(kvf_comm_world_h world)
{
    return world->vt->error(world);
}

kvf_comm_t *kvf_comm_world_rank(kvf_comm_world_h world, int rank)
{
    return ((rank >= 0) && (rank < world->size)) ? &world->comms[rank] : NULL;
}
