/*
 * TP collectives for GPU ranks over NCCL (kvf_collectives.h), through
 * kernels/kvf_nccl.h: one thread and one CUDA device per rank, in one process.
 *
 * Design: the world is made once per instance with every id it will need
 * (kvf_nccl_id_make: one for the whole world and one per span group, for
 * every span that divides the size); each rank thread then makes its
 * communicators in kvf_comm_rank_start(), all ranks at once, in the same
 * order: the world's, then its own group's for each span in increasing
 * order. A span all-reduce goes on the group's communicator, so ranks of
 * other groups are not involved. Rejected: ncclCommSplit per span (one
 * collective init per span too, and one more wrapper in kernels/ that only
 * a GPU could test; the ids are made at start either way).
 *
 * Buffers: device memory of the rank's device is reduced in place; host
 * memory (the model's one-float agreement flags) is staged through a device
 * buffer of the rank that grows to the largest call. Every kvf_nccl call
 * returns only when its work completed on the stream, so the staged copy
 * back reads the result.
 *
 * Sums: an all-reduce is an all-gather of the span's partial sums into a
 * device buffer [span][n] of the rank, then, on the rank's device, the copy
 * of the group's first rank's partial and kvf_add() of the others in rank
 * order: ((p0 + p1) + p2) + ..., the CPU world's order. NCCL's own sum
 * follows its algorithm (ring or tree) and chunking, which it picks by
 * message size and topology, so a row's sum would change with the number
 * of rows in the step (issue 33's batch invariance) and differ from the
 * CPU's; the gather moves the same bytes as a ring all-reduce at TP 2 and
 * (n - 1) / 2 times more at TP n (n - 1 partials in, against 2 (n - 1) / n).
 * Rejected: NCCL_ALGO/NCCL_PROTO pinned by the environment: a ring's
 * element order still depends on where the element falls in the chunks.
 *
 * Failure: a kvf_nccl call that fails or passes its deadline has aborted its
 * communicator; the world then breaks for good, as a CPU world does when a
 * barrier times out: the first failing rank writes why (collective, rank,
 * device, NCCL's text from kvf_nccl_comm_error()), publishes the status and
 * sets the cancel flag every communicator of the world watches, so peers
 * waiting in NCCL abort at once instead of at their deadline; every later
 * collective returns the world's status before entering NCCL. The fault
 * point tp.barrier (drop) makes a rank's collective fail as a timeout would.
 * Compiled, not yet run on a GPU.
 */
#include "kvf_collectives_int.h"
#include "kvf_fault.h"
#include "kvf_kern_status.h"
#include "kvf_log.h"
#include "kvf_ops.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KVF_NCCL_MAX_SPANS 12        /* divisors in (1, size) of a size <= 64: at most 10 (60) */
#define KVF_NCCL_STAGE_MIN 256       /* bytes; the barrier's float lives there */

typedef struct {
    kvf_device_t    dev;
    bool            started;
    kvf_nccl_comm_h all;                         /* the whole world */
    kvf_nccl_comm_h span[KVF_NCCL_MAX_SPANS];    /* this rank's group of spans[i] */
    void           *stage;                       /* device buffer for host buffers */
    size_t          stage_cap;
    void           *gather;                      /* device [span][n]: all-reduce partials */
    size_t          gather_cap;
} kvf_nccl_rank_t;

typedef struct kvf_comm_nccl_world {
    struct kvf_comm_world   base;      /* first: the public handle */
    kvf_comm_nccl_backend_t be;
    int                     size;
    uint32_t                timeout_ms;
    char                    name[64];
    int                     nspans;
    int                     spans[KVF_NCCL_MAX_SPANS];
    kvf_nccl_id_t           all_id;
    kvf_nccl_id_t          *span_ids[KVF_NCCL_MAX_SPANS];   /* size / spans[i] ids each */
    atomic_int              started;   /* ranks that began kvf_comm_rank_start() */
    int                     cancel;    /* __atomic_*; 1 once broken: NCCL waits end */
    atomic_int              broken;    /* KVF_OK, or what every later collective returns */
    atomic_bool             breaking;  /* claimed by the rank that breaks it */
    char                    why[640];  /* written once, before broken is published */
    kvf_nccl_rank_t         ranks[KVF_COMM_MAX_RANKS];
} kvf_comm_nccl_world_t;

static const kvf_comm_nccl_backend_t kvf_nccl_backend_real = {
    .id_make        = kvf_nccl_id_make,
    .comm_init      = kvf_nccl_comm_init,
    .comm_watch     = kvf_nccl_comm_watch,
    .all_reduce_sum = kvf_nccl_all_reduce_sum,
    .all_gather     = kvf_nccl_all_gather,
    .all_gather_async = kvf_nccl_all_gather_async,
    .comm_settle    = kvf_nccl_comm_settle,
    .broadcast      = kvf_nccl_broadcast,
    .comm_error     = kvf_nccl_comm_error,
    .comm_abort     = kvf_nccl_comm_abort,
    .comm_finalize  = kvf_nccl_comm_finalize,
    .comm_destroy   = kvf_nccl_comm_destroy,
};

/* Break the world for good (first caller only records why); returns @a status. */
static kvf_status_t kvf_nccl_world_break(kvf_comm_nccl_world_t *w, int rank, const char *op,
                                         kvf_status_t status, const char *detail)
{
    if (!atomic_exchange(&w->breaking, true)) {
        const kvf_device_t *d = &w->ranks[rank].dev;

        snprintf(w->why, sizeof(w->why), "%s NCCL world of %d ranks broke: %s on rank %d "
                 "(%s:%d) failed: %s; every later collective of this world fails", w->name,
                 w->size, op, rank, kvf_device_kind_name(d->kind), d->ordinal, detail);
        kvf_error("%s", w->why);
        atomic_store(&w->broken, status);
        __atomic_store_n(&w->cancel, 1, __ATOMIC_RELEASE);   /* peers' NCCL waits end now */
    }
    return status;
}

/* A kvf_nccl result: KVF_OK, or the world breaks naming the collective and NCCL's text. */
static kvf_status_t kvf_nccl_check(kvf_comm_nccl_world_t *w, int rank, kvf_nccl_comm_h comm,
                                   int rc, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static kvf_status_t kvf_nccl_check(kvf_comm_nccl_world_t *w, int rank, kvf_nccl_comm_h comm,
                                   int rc, const char *fmt, ...)
{
    const char *err;
    char op[128];
    va_list ap;

    if (rc == KVF_KERN_OK) {
        return KVF_OK;
    }
    va_start(ap, fmt);
    vsnprintf(op, sizeof(op), fmt, ap);
    va_end(ap);
    err = (comm != NULL) ? w->be.comm_error(comm) : NULL;
    return kvf_nccl_world_break(w, rank, op, kvf_status_from_kern(rc),
                                (err != NULL) ? err : kvf_kern_strerror(rc));
}

static void kvf_nccl_rank_abort(kvf_comm_nccl_world_t *w, kvf_nccl_rank_t *rk)
{
    if (rk->all != NULL) {
        w->be.comm_abort(rk->all);
    }
    for (int i = 0; i < w->nspans; ++i) {
        if (rk->span[i] != NULL) {
            w->be.comm_abort(rk->span[i]);
        }
    }
}

static kvf_status_t kvf_nccl_start_rank(kvf_comm_world_h world, int rank);

/*
 * Every collective's entry: the world's status once broken; a rank not
 * started yet starts here (every rank's first collective is the same one,
 * so the inits still pair up); the fault point.
 */
static kvf_status_t kvf_nccl_enter(kvf_comm_nccl_world_t *w, int rank, const char *op)
{
    kvf_status_t st = (kvf_status_t)atomic_load(&w->broken);

    if (st != KVF_OK) {
        return st;              /* fail fast: never enter NCCL on a broken world */
    }
    if (!w->ranks[rank].started) {
        st = kvf_nccl_start_rank(&w->base, rank);
        if (st != KVF_OK) {
            return st;
        }
    }
    if (KVF_FAULT(TP_BARRIER) == KVF_FAULT_DROP) {
        /* tests: this rank's collective is lost, as if NCCL never completed it */
        kvf_nccl_rank_abort(w, &w->ranks[rank]);
        return kvf_nccl_world_break(w, rank, op, KVF_ERR_TIMED_OUT, "the fault point "
                                    "tp.barrier dropped it (as a timeout would); the rank's "
                                    "communicators are aborted");
    }
    return KVF_OK;
}

static kvf_status_t kvf_nccl_settle_op(void *ctx, int rank);

/* *buf_p grown to at least @a bytes of the rank's device memory (old contents dropped) */
static kvf_status_t kvf_nccl_grow(kvf_comm_nccl_world_t *w, int rank, void **buf_p,
                                  size_t *cap_p, size_t bytes, const char *what, const char *op)
{
    kvf_nccl_rank_t *rk = &w->ranks[rank];

    if (*cap_p < bytes) {
        size_t cap = (bytes > 2 * *cap_p) ? bytes : 2 * *cap_p;
        void *p = NULL;
        int rc = kvf_device_alloc(&rk->dev, cap, &p);

        if (rc != KVF_KERN_OK) {
            char detail[128];
            snprintf(detail, sizeof(detail), "no device memory for a %s of %zu bytes: %s", what,
                     cap, kvf_kern_strerror(rc));
            return kvf_nccl_world_break(w, rank, op, kvf_status_from_kern(rc), detail);
        }
        if (*buf_p != NULL) {
            /* an enqueued all-gather may still read or write the old buffer: wait for it
             * (with the deadline) before freeing, not inside cudaFree without one */
            kvf_status_t st = kvf_nccl_settle_op(w, rank);
            if (st != KVF_OK) {
                kvf_device_free(&rk->dev, p);
                return st;
            }
        }
        kvf_device_free(&rk->dev, *buf_p);
        *buf_p = p;
        *cap_p = cap;
    }
    return KVF_OK;
}

static kvf_status_t kvf_nccl_stage(kvf_comm_nccl_world_t *w, int rank, size_t bytes,
                                   const char *op, void **stage_p)
{
    kvf_nccl_rank_t *rk = &w->ranks[rank];
    kvf_status_t st = kvf_nccl_grow(w, rank, &rk->stage, &rk->stage_cap, bytes,
                                    "staging buffer", op);

    *stage_p = rk->stage;
    return st;
}

static kvf_status_t kvf_nccl_copy(kvf_comm_nccl_world_t *w, int rank, void *dst,
                                  const void *src, size_t bytes, kvf_copy_kind_t kind,
                                  const char *op)
{
    int rc = kvf_device_memcpy(&w->ranks[rank].dev, dst, src, bytes, kind);

    if (rc != KVF_KERN_OK) {
        char detail[128];
        snprintf(detail, sizeof(detail), "the staging copy %s of %zu bytes failed: %s",
                 (kind == KVF_COPY_H2D) ? "to the device" : "back to the host", bytes,
                 kvf_kern_strerror(rc));
        return kvf_nccl_world_break(w, rank, op, kvf_status_from_kern(rc), detail);
    }
    return KVF_OK;
}

static bool kvf_nccl_on_device(const kvf_nccl_rank_t *rk, const void *buf)
{
    return (rk->dev.kind == KVF_DEVICE_CUDA) && kvf_device_ptr_is_cuda(buf);
}

static kvf_status_t kvf_nccl_barrier_op(void *ctx, int rank)
{
    kvf_comm_nccl_world_t *w = ctx;
    kvf_nccl_rank_t *rk = &w->ranks[rank];
    kvf_status_t st = kvf_nccl_enter(w, rank, "barrier");

    if (st != KVF_OK) {
        return st;
    }
    /* NCCL has no barrier: a one-float all-reduce on the rank's device buffer */
    return kvf_nccl_check(w, rank, rk->all,
                          w->be.all_reduce_sum(rk->all, rk->stage, rk->stage, 1),
                          "barrier (one-float all-reduce)");
}

/* buf (n floats, the rank's device memory) = the span group's sum in rank order: all-gather
 * on @a comm, then the first partial copied and the others added (see the top of the file) */
static kvf_status_t kvf_nccl_sum_in_order(kvf_comm_nccl_world_t *w, int rank,
                                          kvf_nccl_comm_h comm, float *buf, size_t n, int span,
                                          const char *op)
{
    kvf_nccl_rank_t *rk = &w->ranks[rank];
    const size_t bytes = n * sizeof(float);
    kvf_status_t st = kvf_nccl_grow(w, rank, &rk->gather, &rk->gather_cap, (size_t)span * bytes,
                                    "gather buffer", op);
    float *g = rk->gather;
    /* enqueued only, when the backend can: the adds below and every later kernel run in
     * the rank's stream order; kvf_nccl_settle_op() waits (with the deadline) */
    const bool async = (w->be.all_gather_async != NULL) && (w->be.comm_settle != NULL);

    if ((st != KVF_OK) ||
        ((st = kvf_nccl_check(w, rank, comm,
                              async ? w->be.all_gather_async(comm, buf, g, n) :
                                      w->be.all_gather(comm, buf, g, n),
                              "%s of %zu floats over span %d (all-gather)", op, n, span)) !=
         KVF_OK) ||
        ((st = kvf_nccl_copy(w, rank, buf, g, bytes, KVF_COPY_D2D, op)) != KVF_OK)) {
        return st;
    }
    for (int r = 1; r < span; ++r) {
        int rc = kvf_add(&rk->dev, buf, g + (size_t)r * n, n);
        if (rc != KVF_KERN_OK) {
            char detail[128];
            snprintf(detail, sizeof(detail), "adding rank %d's partial sum failed: %s", r,
                     kvf_kern_strerror(rc));
            return kvf_nccl_world_break(w, rank, op, kvf_status_from_kern(rc), detail);
        }
    }
    return KVF_OK;
}

/* @a comm's enqueued collectives waited for (a no-op without a settling backend) */
static kvf_status_t kvf_nccl_settle_comm(kvf_comm_nccl_world_t *w, int rank,
                                         kvf_nccl_comm_h comm, const char *op)
{
    if ((comm == NULL) || (w->be.comm_settle == NULL)) {
        return KVF_OK;
    }
    return kvf_nccl_check(w, rank, comm, w->be.comm_settle(comm, op), "%s", op);
}

static kvf_status_t kvf_nccl_all_reduce_op(void *ctx, int rank, float *buf, size_t n, int span)
{
    kvf_comm_nccl_world_t *w = ctx;
    kvf_nccl_rank_t *rk = &w->ranks[rank];
    kvf_nccl_comm_h comm = NULL;
    const size_t bytes = n * sizeof(float);
    const char *op = "all-reduce (sum, fp32)";
    kvf_status_t st;
    void *stage;

    if ((span <= 0) || (w->size % span != 0)) {
        kvf_error("all-reduce span %d does not divide the world size %d", span, w->size);
        st = kvf_nccl_barrier_op(ctx, rank);    /* still meet the others, so nobody hangs */
        return (st != KVF_OK) ? st : KVF_ERR_INVALID_PARAM;
    }
    if (span == 1) {
        return kvf_nccl_barrier_op(ctx, rank);  /* a no-op that synchronises, as the CPU's */
    }
    st = kvf_nccl_enter(w, rank, op);
    if (st != KVF_OK) {
        return st;
    }
    if (span == w->size) {
        comm = rk->all;
    }
    for (int i = 0; (comm == NULL) && (i < w->nspans); ++i) {
        comm = (w->spans[i] == span) ? rk->span[i] : NULL;
    }
    if (n == 0) {
        return KVF_OK;
    }
    if (kvf_nccl_on_device(rk, buf)) {
        return kvf_nccl_sum_in_order(w, rank, comm, buf, n, span, op);
    }
    if (((st = kvf_nccl_stage(w, rank, bytes, op, &stage)) != KVF_OK) ||
        ((st = kvf_nccl_copy(w, rank, stage, buf, bytes, KVF_COPY_H2D, op)) != KVF_OK) ||
        ((st = kvf_nccl_sum_in_order(w, rank, comm, stage, n, span, op)) != KVF_OK) ||
        ((st = kvf_nccl_settle_comm(w, rank, comm, op)) != KVF_OK)) {
        return st;   /* settled first: the copy back must not wait on a hung collective */
    }
    return kvf_nccl_copy(w, rank, buf, stage, bytes, KVF_COPY_D2H, op);
}

/* kvf_comm_settle(): every communicator of the rank with an enqueued collective waited for
 * (with the deadline), or the world breaks naming it */
static kvf_status_t kvf_nccl_settle_op(void *ctx, int rank)
{
    kvf_comm_nccl_world_t *w = ctx;
    kvf_nccl_rank_t *rk = &w->ranks[rank];
    kvf_status_t st = (kvf_status_t)atomic_load(&w->broken);

    if (st != KVF_OK) {
        return st;
    }
    if (!rk->started) {
        return KVF_OK;   /* nothing begun */
    }
    st = kvf_nccl_settle_comm(w, rank, rk->all, "the step's all-reduces (settle)");
    for (int i = 0; (st == KVF_OK) && (i < w->nspans); ++i) {
        st = kvf_nccl_settle_comm(w, rank, rk->span[i], "the step's all-reduces (settle)");
    }
    return st;
}

static kvf_status_t kvf_nccl_broadcast_op(void *ctx, int rank, void *buf, size_t n, int root)
{
    kvf_comm_nccl_world_t *w = ctx;
    kvf_nccl_rank_t *rk = &w->ranks[rank];
    const char *op = "broadcast";
    kvf_status_t st;
    void *stage;

    if ((root < 0) || (root >= w->size)) {
        kvf_error("broadcast root %d is outside the world's ranks [0, %d)", root, w->size);
        st = kvf_nccl_barrier_op(ctx, rank);
        return (st != KVF_OK) ? st : KVF_ERR_INVALID_PARAM;
    }
    st = kvf_nccl_enter(w, rank, op);
    if ((st != KVF_OK) || (n == 0)) {
        return st;
    }
    if (kvf_nccl_on_device(rk, buf)) {
        return kvf_nccl_check(w, rank, rk->all, w->be.broadcast(rk->all, buf, buf, n, root),
                              "%s of %zu bytes from rank %d", op, n, root);
    }
    if (((st = kvf_nccl_stage(w, rank, n, op, &stage)) != KVF_OK) ||
        ((rank == root) &&
         ((st = kvf_nccl_copy(w, rank, stage, buf, n, KVF_COPY_H2D, op)) != KVF_OK)) ||
        ((st = kvf_nccl_check(w, rank, rk->all, w->be.broadcast(rk->all, stage, stage, n, root),
                              "%s of %zu bytes (staged) from rank %d", op, n, root)) !=
         KVF_OK)) {
        return st;
    }
    return (rank == root) ? KVF_OK : kvf_nccl_copy(w, rank, buf, stage, n, KVF_COPY_D2H, op);
}

static const kvf_comm_ops_t kvf_comm_nccl_ops = {
    .abi_version        = KVF_COMM_ABI,
    .name               = "nccl",
    .all_reduce_sum_f32 = kvf_nccl_all_reduce_op,
    .broadcast          = kvf_nccl_broadcast_op,
    .barrier            = kvf_nccl_barrier_op,
    .settle             = kvf_nccl_settle_op,
};

/* one communicator of the rank: made, watched, or the world breaks naming it */
static kvf_status_t kvf_nccl_make_comm(kvf_comm_nccl_world_t *w, int rank,
                                       const kvf_nccl_id_t *id, int nranks, int sub_rank,
                                       const char *which, kvf_nccl_comm_h *comm_p)
{
    kvf_nccl_rank_t *rk = &w->ranks[rank];
    int rc = w->be.comm_init(&rk->dev, id, nranks, sub_rank, (int64_t)w->timeout_ms, comm_p);

    if (rc != KVF_KERN_OK) {
        char detail[160];
        snprintf(detail, sizeof(detail), "%s (%s; the NCCL line logged above says why)",
                 kvf_kern_strerror(rc), (rc == KVF_KERN_ETIMEDOUT) ?
                 "not every rank joined within the timeout" : "ncclCommInitRankConfig");
        *comm_p = NULL;
        return kvf_nccl_world_break(w, rank, which, kvf_status_from_kern(rc), detail);
    }
    w->be.comm_watch(*comm_p, &w->cancel);
    return KVF_OK;
}

static kvf_status_t kvf_nccl_start_rank(kvf_comm_world_h world, int rank)
{
    kvf_comm_nccl_world_t *w = (kvf_comm_nccl_world_t *)world;
    kvf_nccl_rank_t *rk = &w->ranks[rank];
    kvf_status_t st = (kvf_status_t)atomic_load(&w->broken);
    char which[96];
    int rc;

    if (rk->started || (rk->stage != NULL)) {
        kvf_error("rank %d of the %s NCCL world was started twice", rank, w->name);
        return KVF_ERR_INVALID_PARAM;
    }
    atomic_fetch_add(&w->started, 1);
    if (st != KVF_OK) {
        return st;
    }
    rc = kvf_device_bind(&rk->dev);
    if (rc == KVF_KERN_OK) {
        rc = kvf_device_alloc(&rk->dev, KVF_NCCL_STAGE_MIN, &rk->stage);
    }
    if (rc != KVF_KERN_OK) {
        return kvf_nccl_world_break(w, rank, "rank start", kvf_status_from_kern(rc),
                                    "the rank's device could not be bound to its thread or "
                                    "give a staging buffer");
    }
    rk->stage_cap = KVF_NCCL_STAGE_MIN;
    if (w->size > 1) {
        st = kvf_nccl_make_comm(w, rank, &w->all_id, w->size, rank,
                                "the world communicator's init", &rk->all);
    }
    for (int i = 0; (st == KVF_OK) && (i < w->nspans); ++i) {
        const int s = w->spans[i];

        snprintf(which, sizeof(which), "the init of span %d group %d's communicator", s,
                 rank / s);
        st = kvf_nccl_make_comm(w, rank, &w->span_ids[i][rank / s], s, rank % s, which,
                                &rk->span[i]);
    }
    rk->started = (st == KVF_OK);
    return st;
}

static kvf_status_t kvf_nccl_set_barrier(kvf_comm_world_h world, const char *name,
                                         uint32_t timeout_ms)
{
    kvf_comm_nccl_world_t *w = (kvf_comm_nccl_world_t *)world;

    if (timeout_ms == 0) {
        kvf_error("the %s NCCL world needs a timeout: every NCCL wait has a deadline (0, "
                  "wait forever, is the CPU world's only)", w->name);
        return KVF_ERR_INVALID_PARAM;
    }
    if (atomic_load(&w->started) > 0) {
        kvf_error("the %s NCCL world's timeout is fixed once a rank started", w->name);
        return KVF_ERR_INVALID_PARAM;
    }
    snprintf(w->name, sizeof(w->name), "%s", name);
    w->timeout_ms = timeout_ms;
    return KVF_OK;
}

static const char *kvf_nccl_world_error(kvf_comm_world_h world)
{
    kvf_comm_nccl_world_t *w = (kvf_comm_nccl_world_t *)world;

    return (atomic_load(&w->broken) != KVF_OK) ? w->why : NULL;
}

/* finalize (begin all, then wait each: a finalize completes when every rank's began) or abort */
static void kvf_nccl_world_destroy(kvf_comm_world_h world)
{
    kvf_comm_nccl_world_t *w = (kvf_comm_nccl_world_t *)world;
    const bool broken = (atomic_load(&w->broken) != KVF_OK);

    for (int pass = 0; pass < 2; ++pass) {
        for (int r = 0; r < w->size; ++r) {
            kvf_nccl_rank_t *rk = &w->ranks[r];

            for (int i = -1; i < w->nspans; ++i) {
                kvf_nccl_comm_h *c = (i < 0) ? &rk->all : &rk->span[i];

                if (*c == NULL) {
                    continue;
                }
                if (pass == 1) {
                    w->be.comm_destroy(*c);
                    *c = NULL;
                } else if (broken) {
                    w->be.comm_abort(*c);
                } else {
                    (void)w->be.comm_finalize(*c);   /* a failure aborts; destroy copes */
                }
            }
            if ((pass == 1) && ((rk->stage != NULL) || (rk->gather != NULL))) {
                (void)kvf_device_bind(&rk->dev);
                kvf_device_free(&rk->dev, rk->stage);
                kvf_device_free(&rk->dev, rk->gather);
            }
        }
    }
    for (int i = 0; i < w->nspans; ++i) {
        free(w->span_ids[i]);
    }
    free(w);
}

static const kvf_comm_world_vtbl_t kvf_comm_nccl_world_vtbl = {
    .kind        = "nccl",
    .start_rank  = kvf_nccl_start_rank,
    .set_barrier = kvf_nccl_set_barrier,
    .error       = kvf_nccl_world_error,
    .destroy     = kvf_nccl_world_destroy,
};

/* the world and every id it will need; the ranks make their communicators at start */
static kvf_status_t kvf_nccl_world_create_with(int size, const kvf_device_t *devs,
                                               const kvf_comm_nccl_backend_t *be,
                                               kvf_comm_world_h *world_p)
{
    kvf_comm_nccl_world_t *w = calloc(1, sizeof(*w));
    int rc = KVF_KERN_OK;

    if (w == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    w->be = *be;
    w->size = size;
    w->timeout_ms = KVF_COMM_BARRIER_TIMEOUT_MS;
    snprintf(w->name, sizeof(w->name), "tp");
    atomic_init(&w->broken, KVF_OK);
    w->base.vt = &kvf_comm_nccl_world_vtbl;
    w->base.size = size;
    for (int s = 2; s < size; ++s) {
        if ((size % s == 0) && (w->nspans < KVF_NCCL_MAX_SPANS)) {
            w->spans[w->nspans++] = s;
        }
    }
    for (int r = 0; r < size; ++r) {
        w->ranks[r].dev = devs[r];
        w->base.comms[r] = (kvf_comm_t){
            .ops = &kvf_comm_nccl_ops, .ctx = w, .rank = r, .size = size,
        };
    }
    if (size > 1) {
        rc = be->id_make(&w->all_id);
    }
    for (int i = 0; (rc == KVF_KERN_OK) && (i < w->nspans); ++i) {
        const int groups = size / w->spans[i];

        w->span_ids[i] = calloc((size_t)groups, sizeof(kvf_nccl_id_t));
        if (w->span_ids[i] == NULL) {
            rc = KVF_KERN_ENOMEM;
        }
        for (int g = 0; (rc == KVF_KERN_OK) && (g < groups); ++g) {
            rc = be->id_make(&w->span_ids[i][g]);
        }
    }
    if (rc != KVF_KERN_OK) {
        kvf_error("NCCL world of %d ranks: its ids could not be made (ncclGetUniqueId): %s",
                  size, kvf_kern_strerror(rc));
        kvf_nccl_world_destroy(&w->base);
        return kvf_status_from_kern(rc);
    }
    *world_p = &w->base;
    return KVF_OK;
}

kvf_status_t kvf_comm_world_create_nccl(int size, const kvf_device_t *devs,
                                        kvf_comm_world_h *world_p)
{
    if ((size < 1) || (size > KVF_COMM_MAX_RANKS)) {
        kvf_error("communicator size %d is outside [1, %d]", size, KVF_COMM_MAX_RANKS);
        return KVF_ERR_INVALID_PARAM;
    }
    if (!kvf_nccl_available()) {
        kvf_error("TP collectives on CUDA ranks need NCCL, and this build has none (nccl.h and "
                  "libnccl were not found when it was configured); CPU ranks use the CPU "
                  "collectives");
        return KVF_ERR_UNSUPPORTED;
    }
    if (!kvf_device_cuda_available()) {
        kvf_error("TP collectives on CUDA ranks: no GPU is visible (no CUDA device, or "
                  "cudaGetDeviceCount failed), so no NCCL world can be made; CPU ranks use "
                  "the CPU collectives");
        return KVF_ERR_UNSUPPORTED;
    }
    if (devs == NULL) {
        kvf_error("TP collectives on CUDA ranks: no devices given for the %d ranks", size);
        return KVF_ERR_INVALID_PARAM;
    }
    for (int r = 0; r < size; ++r) {
        if (devs[r].kind != KVF_DEVICE_CUDA) {
            kvf_error("TP collectives on CUDA ranks: rank %d's device is %s, not cuda (every "
                      "rank of an NCCL world is a GPU)", r, kvf_device_kind_name(devs[r].kind));
            return KVF_ERR_INVALID_PARAM;
        }
        for (int q = 0; q < r; ++q) {
            if (devs[q].ordinal == devs[r].ordinal) {
                kvf_error("TP collectives on CUDA ranks: ranks %d and %d are both on cuda:%d; "
                          "NCCL takes one GPU per rank", q, r, devs[r].ordinal);
                return KVF_ERR_INVALID_PARAM;
            }
        }
    }
    return kvf_nccl_world_create_with(size, devs, &kvf_nccl_backend_real, world_p);
}

#ifdef KVF_FAULT_INJECTION
kvf_status_t kvf_comm_world_create_nccl_test(int size, const kvf_device_t *devs,
                                             const kvf_comm_nccl_backend_t *be,
                                             kvf_comm_world_h *world_p)
{
    if ((size < 1) || (size > KVF_COMM_MAX_RANKS) || (devs == NULL) || (be == NULL) ||
        (be->id_make == NULL) || (be->comm_init == NULL) || (be->comm_watch == NULL) ||
        (be->all_reduce_sum == NULL) || (be->all_gather == NULL) || (be->broadcast == NULL) || (be->comm_error == NULL) ||
        (be->comm_abort == NULL) || (be->comm_finalize == NULL) ||
        (be->comm_destroy == NULL) || (world_p == NULL)) {
        kvf_error("NCCL test world: size %d outside [1, %d], or devices, backend function or "
                  "world_p missing", size, KVF_COMM_MAX_RANKS);
        return KVF_ERR_INVALID_PARAM;
    }
    return kvf_nccl_world_create_with(size, devs, be, world_p);
}
#endif
