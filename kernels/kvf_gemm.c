/*
 * fp32 GEMM for linear layers through cblas_sgemm.
 *
 * Design: y = x * W^T maps to one sgemm with W transposed in place (no copy),
 * row-major. Bias is pre-broadcast into y and folded in with beta = 1, so
 * the BLAS does a single pass. OpenBLAS is pinned to one thread on first use
 * (pthread_once): TP ranks are threads, and each rank calling a BLAS that
 * spawns its own pool oversubscribes the cores and makes timings noisy. An
 * instance of one rank may give its BLAS more (kvf_gemm_set_threads); the
 * same count splits the CPU attention and scan over threads of their own
 * (kvf_kern_parallel), whose BLAS calls are small enough that OpenBLAS runs
 * them on the calling thread.
 * On a CUDA device the same call goes to cuBLAS (kvf_gemm_cuda.cu).
 */
#include "kvf_gemm.h"
#include "kvf_kern_internal.h"
#ifdef KVF_HAVE_CUDA
#include "kvf_device_cuda.h"
#endif

#include <cblas.h>
#include <pthread.h>
#include <string.h>

static pthread_once_t kvf_gemm_once = PTHREAD_ONCE_INIT;
static int kvf_gemm_threads = 1;        /* kvf_gemm_set_threads() */
static int kvf_gemm_blas_now = 1;       /* what OpenBLAS was last told */

/* Products of fewer rows (decode steps) run on one BLAS thread: OpenBLAS
 * would split a 1-row product over its threads and wait for them at every
 * call, slower than one thread (TP 1 on 2 threads decoded at 0.75x). */
#define KVF_GEMM_THREAD_MIN_ROWS 16

static void kvf_gemm_init_once(void)
{
    const int n = __atomic_load_n(&kvf_gemm_threads, __ATOMIC_ACQUIRE);
    openblas_set_num_threads(n);
    __atomic_store_n(&kvf_gemm_blas_now, n, __ATOMIC_RELEASE);
}

void kvf_gemm_set_threads(int n)
{
    n = (n < 1) ? 1 : n;
    __atomic_store_n(&kvf_gemm_threads, n, __ATOMIC_RELEASE);
    pthread_once(&kvf_gemm_once, kvf_gemm_init_once);
    openblas_set_num_threads(n);
    __atomic_store_n(&kvf_gemm_blas_now, n, __ATOMIC_RELEASE);
}

/* OpenBLAS threads for a product of M rows: all of kvf_gemm_set_threads()
 * from KVF_GEMM_THREAD_MIN_ROWS rows, else 1. Only an instance of TP 1 has
 * more than one (its rank thread is the only caller), so nothing switches
 * while another thread is inside the BLAS. */
static void kvf_gemm_pick_threads(int M)
{
    const int all = __atomic_load_n(&kvf_gemm_threads, __ATOMIC_ACQUIRE);
    const int want = (M < KVF_GEMM_THREAD_MIN_ROWS) ? 1 : all;

    if ((all > 1) && (__atomic_load_n(&kvf_gemm_blas_now, __ATOMIC_ACQUIRE) != want)) {
        openblas_set_num_threads(want);
        __atomic_store_n(&kvf_gemm_blas_now, want, __ATOMIC_RELEASE);
    }
}

int kvf_kern_cpu_threads(void)
{
    return __atomic_load_n(&kvf_gemm_threads, __ATOMIC_ACQUIRE);
}

typedef struct kvf_kern_par_arg {
    kvf_kern_par_fn_t fn;
    void             *ctx;
    int               part, parts, rc;
} kvf_kern_par_arg_t;

static void *kvf_kern_par_main(void *p)
{
    kvf_kern_par_arg_t *a = p;
    a->rc = a->fn(a->ctx, a->part, a->parts);
    return NULL;
}

int kvf_kern_parallel(int parts, kvf_kern_par_fn_t fn, void *ctx)
{
    enum { KVF_KERN_PAR_MAX = 64 };
    kvf_kern_par_arg_t arg[KVF_KERN_PAR_MAX];
    pthread_t th[KVF_KERN_PAR_MAX];
    int started = 1, rc = KVF_KERN_OK;

    parts = (parts < 1) ? 1 : (parts > KVF_KERN_PAR_MAX) ? KVF_KERN_PAR_MAX : parts;
    for (int i = 0; i < parts; ++i) {
        arg[i] = (kvf_kern_par_arg_t){.fn = fn, .ctx = ctx, .part = i, .parts = parts};
    }
    /* a part whose thread cannot start runs on the caller: same result, slower */
    for (; started < parts; ++started) {
        if (pthread_create(&th[started], NULL, kvf_kern_par_main, &arg[started]) != 0) {
            break;
        }
    }
    for (int i = started; i < parts; ++i) {
        kvf_kern_par_main(&arg[i]);
    }
    kvf_kern_par_main(&arg[0]);
    for (int i = 1; i < started; ++i) {
        pthread_join(th[i], NULL);
    }
    for (int i = 0; i < parts; ++i) {
        rc = (rc != KVF_KERN_OK) ? rc : arg[i].rc;
    }
    return rc;
}

int kvf_gemm_ex(const kvf_device_t *dev, int M, int N, int K, const float *x, int ldx,
                const float *w, int ldw, const float *bias, float beta, float *y, int ldy)
{
    if ((M < 0) || (N <= 0) || (K <= 0) || (ldx < K) || (ldw < K) || (ldy < N)) {
        return KVF_KERN_EINVAL;
    }
    if (M == 0) {
        return KVF_KERN_OK;
    }
    if ((x == NULL) || (w == NULL) || (y == NULL)) {
        return KVF_KERN_EINVAL;
    }
    if ((dev != NULL) && (dev->kind != KVF_DEVICE_CPU)) {
#ifdef KVF_HAVE_CUDA
        return kvf_cuda_gemm(dev, M, N, K, x, ldx, w, ldw, bias, beta, y, ldy);
#else
        return KVF_KERN_EUNSUPPORTED;
#endif
    }
    pthread_once(&kvf_gemm_once, kvf_gemm_init_once);
    kvf_gemm_pick_threads(M);

    if (bias != NULL) {
        for (int m = 0; m < M; ++m) {
            float *row = y + (size_t)m * (size_t)ldy;
            if (beta == 0.0f) {
                memcpy(row, bias, (size_t)N * sizeof(float));
            } else {
                for (int n = 0; n < N; ++n) {
                    row[n] = beta * row[n] + bias[n];
                }
            }
        }
        beta = 1.0f;
    } else if (beta == 0.0f) {
        /* BLAS may compute 0 * y; make garbage (NaN) in y harmless */
        for (int m = 0; m < M; ++m) {
            memset(y + (size_t)m * (size_t)ldy, 0, (size_t)N * sizeof(float));
        }
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, x, ldx, w, ldw, beta,
                y, ldy);
    return KVF_KERN_OK;
}

int kvf_gemm(const kvf_device_t *dev, int M, int N, int K, const float *x, const float *w,
             const float *bias, float *y)
{
    return kvf_gemm_ex(dev, M, N, K, x, K, w, K, bias, 0.0f, y, N);
}
