/* Kernels called concurrently from several threads (TP ranks are threads):
 * every thread's GEMM and scan results equal the single-threaded
 * ones bit for bit. Meant to run under TSan too. */
#include "kvf_gemm.h"
#include "kvf_mamba2.h"
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_concurrent),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
