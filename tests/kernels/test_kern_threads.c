/* Kernels called concurrently from several threads (TP ranks are threads):
 * every thread's GEMM and scan results equal the single-threaded
 * ones bit for bit; the kernels' worker pool (kvf_kern_pool.c) runs every
 * part of a job exactly once with the job's part count, from concurrent
 * callers too, and GEMMs split over it give the one-thread bits. Meant to
 * run under TSan too. */
#include "kvf_gemm.h"
#include "kvf_mamba2.h"
#include "kvf_kern_internal.h"
#include "kvf_kern_test.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

enum { NTHREADS = 4, ITERS = 30, M = 24, N = 40, K = 64 };

typedef struct {
    float x[M * K], w[N * K], y[M * N], y_ref[M * N];
    float S[2 * 4 * 8], S_ref[2 * 4 * 8], ys[6 * 8], ys_ref[6 * 8];
    int   mismatches;
} work_t;

/* 0 on success; no cmocka asserts here, it runs on worker threads */
static int run_once(work_t *wk, float *y, float *S, float *ys)
{
    static const float A_log[2] = {0.1f, -0.2f}, D[2] = {0.5f, 1.0f};
    const kvf_mamba2_params_t p = {2, 4, 1, 8, NULL, A_log, D, 0.0f, INFINITY};
    float xs[6 * 24], dt[6 * 2];

    int err = kvf_gemm(NULL, M, N, K, wk->x, wk->w, NULL, y);
    for (int i = 0; i < 6 * 24; ++i) {
        xs[i] = wk->x[i] * 0.5f;
    }
    for (int i = 0; i < 12; ++i) {
        dt[i] = wk->w[i];
    }
    err |= kvf_mamba2_scan(NULL, &p, 6, xs, 24, dt, 2, xs + 8, xs + 16, 24, S, KVF_DTYPE_FP32, 0,
                           ys, 8);
    return err;
}

static void *worker(void *arg)
{
    work_t *wk = arg;
    for (int it = 0; it < ITERS; ++it) {
        if (run_once(wk, wk->y, wk->S, wk->ys) != 0 || memcmp(wk->y, wk->y_ref, sizeof(wk->y)) != 0 ||
            memcmp(wk->ys, wk->ys_ref, sizeof(wk->ys)) != 0 ||
            memcmp(wk->S, wk->S_ref, sizeof(wk->S)) != 0) {
            wk->mismatches++;
        }
    }
    return NULL;
}

static void test_concurrent(void **state)
{
    work_t *wk = calloc(NTHREADS, sizeof(*wk));
    pthread_t th[NTHREADS];
    (void)state;

    assert_non_null(wk);
    for (int i = 0; i < NTHREADS; ++i) {
        kvf_test_rng_t rng = {100 + (uint64_t)i};
        kvf_test_fill(&rng, wk[i].x, M * K, -1, 1);
        kvf_test_fill(&rng, wk[i].w, N * K, -1, 1);
        assert_int_equal(run_once(&wk[i], wk[i].y_ref, wk[i].S_ref, wk[i].ys_ref), 0);
    }
    for (int i = 0; i < NTHREADS; ++i) {
        assert_int_equal(pthread_create(&th[i], NULL, worker, &wk[i]), 0);
    }
    for (int i = 0; i < NTHREADS; ++i) {
        assert_int_equal(pthread_join(th[i], NULL), 0);
        assert_int_equal(wk[i].mismatches, 0);
    }
    free(wk);
}

/* kvf_kern_parallel: each part once, with the job's part count, whoever runs it */
typedef struct {
    int hits[64];
    int bad_parts;
} par_job_t;

static int par_mark(void *ctx, int part, int parts)
{
    par_job_t *j = ctx;
    __atomic_add_fetch(&j->hits[part], 1, __ATOMIC_RELAXED);
    if (parts != 5) {
        __atomic_add_fetch(&j->bad_parts, 1, __ATOMIC_RELAXED);
    }
    return (part == 3) ? KVF_KERN_EINVAL : KVF_KERN_OK;   /* a failing part's code comes back */
}

static void *par_caller(void *arg)
{
    int *errors = arg;
    for (int it = 0; it < 200; ++it) {
        par_job_t j = {{0}, 0};
        int rc = kvf_kern_parallel(5, par_mark, &j);
        for (int p = 0; p < 64; ++p) {
            *errors += (j.hits[p] != ((p < 5) ? 1 : 0));
        }
        *errors += j.bad_parts + (rc != KVF_KERN_EINVAL);
    }
    return NULL;
}

static void test_pool_parts(void **state)
{
    pthread_t th[NTHREADS];
    int errors[NTHREADS] = {0};

    (void)state;
    for (int i = 0; i < NTHREADS; ++i) {
        assert_int_equal(pthread_create(&th[i], NULL, par_caller, &errors[i]), 0);
    }
    for (int i = 0; i < NTHREADS; ++i) {
        assert_int_equal(pthread_join(th[i], NULL), 0);
        assert_int_equal(errors[i], 0);
    }
}

/* GEMMs large enough to split (2^18 multiply-adds and more) over 3 kernel threads, from
 * concurrent callers: the one-thread bits */
enum { BM = 33, BN = 200, BK = 80 };

typedef struct {
    float x[BM * BK], w[BN * BK], y[BM * BN], y_ref[BM * BN];
    int   mismatches;
} big_t;

static void *big_worker(void *arg)
{
    big_t *b = arg;
    for (int it = 0; it < 20; ++it) {
        if ((kvf_gemm(NULL, BM, BN, BK, b->x, b->w, NULL, b->y) != KVF_KERN_OK) ||
            (memcmp(b->y, b->y_ref, sizeof(b->y)) != 0)) {
            b->mismatches++;
        }
    }
    return NULL;
}

static void test_pool_gemm(void **state)
{
    big_t *b = calloc(NTHREADS, sizeof(*b));
    pthread_t th[NTHREADS];

    (void)state;
    assert_non_null(b);
    kvf_gemm_set_threads(1);
    for (int i = 0; i < NTHREADS; ++i) {
        kvf_test_rng_t rng = {300 + (uint64_t)i};
        kvf_test_fill(&rng, b[i].x, BM * BK, -1, 1);
        kvf_test_fill(&rng, b[i].w, BN * BK, -1, 1);
        assert_int_equal(kvf_gemm(NULL, BM, BN, BK, b[i].x, b[i].w, NULL, b[i].y_ref), 0);
    }
    kvf_gemm_set_threads(3);
    for (int i = 0; i < NTHREADS; ++i) {
        assert_int_equal(pthread_create(&th[i], NULL, big_worker, &b[i]), 0);
    }
    for (int i = 0; i < NTHREADS; ++i) {
        assert_int_equal(pthread_join(th[i], NULL), 0);
        assert_int_equal(b[i].mismatches, 0);
    }
    kvf_gemm_set_threads(1);
    free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_concurrent),
        cmocka_unit_test(test_pool_parts),
        cmocka_unit_test(test_pool_gemm),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
