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
 */
#include "kvf_collectives.h"
#include "kvf_log.h"

#include <limits.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
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
    int              size;
} kvf_barrier_t;

static void kvf_barrier_wait(kvf_barrier_t *b)
{
    unsigned g = atomic_load_explicit(&b->gen, memory_order_acquire);

    if (atomic_fetch_add_explicit(&b->count, 1, memory_order_acq_rel) == b->size - 1) {
        atomic_store_explicit(&b->count, 0, memory_order_relaxed);
        atomic_fetch_add_explicit(&b->gen, 1, memory_order_release);
        if (atomic_load_explicit(&b->sleepers, memory_order_acquire) > 0) {
            syscall(SYS_futex, &b->gen, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
        }
        return;
    }
    for (int i = 0; i < KVF_BARRIER_SPIN; ++i) {
        if (atomic_load_explicit(&b->gen, memory_order_acquire) != g) {
            return;
        }
        kvf_cpu_relax();
    }
    atomic_fetch_add_explicit(&b->sleepers, 1, memory_order_acq_rel);
    while (atomic_load_explicit(&b->gen, memory_order_acquire) == g) {
        /* returns at once if gen already moved on (EAGAIN) */
        syscall(SYS_futex, &b->gen, FUTEX_WAIT_PRIVATE, g, NULL, NULL, 0);
    }
    atomic_fetch_sub_explicit(&b->sleepers, 1, memory_order_acq_rel);
}

typedef struct {
    float  *scratch;
    size_t  cap;
} kvf_comm_rank_state_t;

struct kvf_comm_world {
    int                   size;
    kvf_barrier_t         bar;
    void                 *bufs[KVF_COMM_MAX_RANKS];
    kvf_comm_rank_state_t st[KVF_COMM_MAX_RANKS];
    kvf_comm_t            comms[KVF_COMM_MAX_RANKS];
};

static void kvf_comm_wait(struct kvf_comm_world *w)
{
    kvf_barrier_wait(&w->bar);
}

static kvf_status_t kvf_comm_cpu_all_reduce(void *ctx, int rank, float *buf, size_t n, int span)
{
    struct kvf_comm_world *w = ctx;
    kvf_comm_rank_state_t *st = &w->st[rank];
    kvf_status_t status = KVF_OK;
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
    kvf_comm_wait(w);
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
    kvf_comm_wait(w);
    if ((status == KVF_OK) && (span > 1)) {
        memcpy(buf, st->scratch, n * sizeof(float));
    }
    return status;
}

static kvf_status_t kvf_comm_cpu_broadcast(void *ctx, int rank, void *buf, size_t n, int root)
{
    struct kvf_comm_world *w = ctx;

    w->bufs[rank] = buf;
    kvf_comm_wait(w);
    if ((rank != root) && (n > 0)) {
        memcpy(buf, w->bufs[root], n);
    }
    kvf_comm_wait(w);
    return KVF_OK;
}

static kvf_status_t kvf_comm_cpu_barrier(void *ctx, int rank)
{
    (void)rank;
    kvf_comm_wait(ctx);
    return KVF_OK;
}

static const kvf_comm_ops_t kvf_comm_cpu_ops = {
    .abi_version        = KVF_COMM_ABI,
    .name               = "cpu",
    .all_reduce_sum_f32 = kvf_comm_cpu_all_reduce,
    .broadcast          = kvf_comm_cpu_broadcast,
    .barrier            = kvf_comm_cpu_barrier,
};

kvf_status_t kvf_comm_world_create_cpu(int size, kvf_comm_world_h *world_p)
{
    struct kvf_comm_world *w;

    if ((size < 1) || (size > KVF_COMM_MAX_RANKS)) {
        kvf_error("communicator size %d is outside [1, %d]", size, KVF_COMM_MAX_RANKS);
        return KVF_ERR_INVALID_PARAM;
    }
    w = calloc(1, sizeof(*w));
    if (w == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    w->bar.size = size;
    w->size = size;
    for (int r = 0; r < size; ++r) {
        w->comms[r] = (kvf_comm_t){.ops = &kvf_comm_cpu_ops, .ctx = w, .rank = r, .size = size};
    }
    *world_p = w;
    return KVF_OK;
}

void kvf_comm_world_destroy(kvf_comm_world_h world)
{
    if (world == NULL) {
        return;
    }
    for (int r = 0; r < world->size; ++r) {
        free(world->st[r].scratch);
    }
    free(world);
}

kvf_comm_t *kvf_comm_world_rank(kvf_comm_world_h world, int rank)
{
    return ((rank >= 0) && (rank < world->size)) ? &world->comms[rank] : NULL;
}
