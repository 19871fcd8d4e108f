/*
 * kvf_kern_parallel(): the kernels' CPU threads (kvf_kern_internal.h).
 *
 * Design: worker threads started on first use and kept for the process's
 * life, woken per job by a condition variable; the caller runs part 0 (and
 * any part without a worker) itself and waits for the others. One job at a
 * time: a second thread that calls while a job runs does all its parts
 * itself (the kernels' results never depend on how parts are spread: every
 * element's summation order is fixed), so concurrent callers (TP ranks,
 * several engines in one process) never wait for each other here.
 * Rejected: a thread started and joined per call (what this replaced): about
 * 30-60 us of pthread_create/join per call, so only products of 2^21
 * multiply-adds and more were worth splitting and a 2-thread TP 1 decode
 * (one-row GEMMs of 1-2M multiply-adds) stayed on one thread.
 * A child of fork() starts with no workers (pthread_atfork resets the pool).
 */
#include "kvf_kern_internal.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#define KVF_KERN_PAR_MAX 64

static struct {
    pthread_mutex_t   busy;          /* held by the one job that uses the workers */
    pthread_mutex_t   mu;            /* guards everything below */
    pthread_cond_t    go, done;
    int               workers;       /* started; worker w runs part w (1-based) */
    uint64_t          gen;           /* job number, bumped per job */
    kvf_kern_par_fn_t fn;
    void             *ctx;
    int               parts;         /* the job's parts, passed to fn */
    int               helped;        /* parts 1 .. helped run on workers */
    int               remaining;
    int               rc[KVF_KERN_PAR_MAX];
    uint64_t          born[KVF_KERN_PAR_MAX];   /* gen when worker w started: its first job
                                                 * is the next one, whenever it runs */
} kvf_pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER,
              PTHREAD_COND_INITIALIZER, 0, 0, NULL, NULL, 0, 0, 0, {0}, {0}};
static pthread_once_t kvf_pool_once = PTHREAD_ONCE_INIT;

static void kvf_pool_atfork_child(void)
{
    /* the workers did not survive the fork; the locks are this thread's copies */
    pthread_mutex_init(&kvf_pool.busy, NULL);
    pthread_mutex_init(&kvf_pool.mu, NULL);
    pthread_cond_init(&kvf_pool.go, NULL);
    pthread_cond_init(&kvf_pool.done, NULL);
    kvf_pool.workers = 0;
}

static void kvf_pool_init(void)
{
    (void)pthread_atfork(NULL, NULL, kvf_pool_atfork_child);
}

static void *kvf_pool_worker(void *p)
{
    const int part = (int)(intptr_t)p;
    uint64_t seen = 0;

    pthread_mutex_lock(&kvf_pool.mu);
    seen = kvf_pool.born[part];
    for (;;) {
        while (kvf_pool.gen == seen) {
            pthread_cond_wait(&kvf_pool.go, &kvf_pool.mu);
        }
        seen = kvf_pool.gen;
        if (part <= kvf_pool.helped) {
            kvf_kern_par_fn_t fn = kvf_pool.fn;
            void *ctx = kvf_pool.ctx;
            const int parts = kvf_pool.parts;
            int rc;

            pthread_mutex_unlock(&kvf_pool.mu);
            rc = fn(ctx, part, parts);
            pthread_mutex_lock(&kvf_pool.mu);
            kvf_pool.rc[part] = rc;
            if (--kvf_pool.remaining == 0) {
                pthread_cond_signal(&kvf_pool.done);
            }
        }
    }
    return NULL;
}

/* Workers for parts 1 .. want - 1 (as many as start); the count running. Under mu. */
static int kvf_pool_grow(int want)
{
    while (kvf_pool.workers + 1 < want) {
        pthread_t th;
        pthread_attr_t attr;
        int ok;

        kvf_pool.born[kvf_pool.workers + 1] = kvf_pool.gen;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        ok = (pthread_create(&th, &attr, kvf_pool_worker,
                             (void *)(intptr_t)(kvf_pool.workers + 1)) == 0);
        pthread_attr_destroy(&attr);
        if (!ok) {
            break;   /* the parts without a worker run on the caller */
        }
        kvf_pool.workers++;
    }
    return kvf_pool.workers;
}

int kvf_kern_parallel(int parts, kvf_kern_par_fn_t fn, void *ctx)
{
    int rc = KVF_KERN_OK, helped;

    parts = (parts < 1) ? 1 : (parts > KVF_KERN_PAR_MAX) ? KVF_KERN_PAR_MAX : parts;
    if ((parts == 1) || (pthread_mutex_trylock(&kvf_pool.busy) != 0)) {
        for (int i = 0; i < parts; ++i) {   /* alone, or another job has the workers */
            int r = fn(ctx, i, parts);
            rc = (rc != KVF_KERN_OK) ? rc : r;
        }
        return rc;
    }
    pthread_once(&kvf_pool_once, kvf_pool_init);
    pthread_mutex_lock(&kvf_pool.mu);
    helped = kvf_pool_grow(parts);
    helped = (helped > parts - 1) ? parts - 1 : helped;   /* parts 1 .. helped on workers */
    kvf_pool.fn = fn;
    kvf_pool.ctx = ctx;
    kvf_pool.parts = parts;
    kvf_pool.helped = helped;      /* workers take parts 1 .. helped; the rest are the caller's */
    kvf_pool.remaining = helped;
    kvf_pool.gen++;
    pthread_cond_broadcast(&kvf_pool.go);
    pthread_mutex_unlock(&kvf_pool.mu);

    rc = fn(ctx, 0, parts);
    for (int i = helped + 1; i < parts; ++i) {
        int r = fn(ctx, i, parts);
        rc = (rc != KVF_KERN_OK) ? rc : r;
    }

    pthread_mutex_lock(&kvf_pool.mu);
    while (kvf_pool.remaining > 0) {
        pthread_cond_wait(&kvf_pool.done, &kvf_pool.mu);
    }
    for (int i = 1; i <= helped; ++i) {
        rc = (rc != KVF_KERN_OK) ? rc : kvf_pool.rc[i];
    }
    pthread_mutex_unlock(&kvf_pool.mu);
    pthread_mutex_unlock(&kvf_pool.busy);
    return rc;
}
