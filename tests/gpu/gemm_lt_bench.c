/*
 * GEMM micro-benchmark on one GPU: a Llama-3-8B-like MLP up projection (N 14336, K 4096,
 * bf16 W) at M = 1, 16, 64, 1024 and 8192 rows, through the default tensor-core path
 * (kvf_gemm_narrow: cuBLASLt, one pinned algorithm) and the debugging mode's scalar
 * fixed-order kernel (kvf_gemm_w with bf16 W: the CPU's bits). Each time is the median of 5
 * runs after one warm-up, measured on the host around a stream sync (the round-off to x's
 * 16 bits included for cuBLASLt). One table row, figures as measured:
 *
 *   | GEMM 14336x4096 bf16 ms (cuBLASLt / scalar) | M=1 a / b | ... | speed-up at 8192 | result |
 *
 * PASS when both paths ran; the figures are what they are (no threshold).
 * Exit: 0 PASS, 1 FAIL (a call failed), 77 no usable GPU or no CUDA in this build.
 */
#include "kvf_device.h"
#include "kvf_dtype.h"
#include "kvf_gemm.h"
#include "kvf_gemm_narrow.h"
#include "kvf_kern.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define N 14336
#define K 4096
#define MMAX 8192

#ifdef KVF_HAVE_CUDA
static kvf_device_t gdev;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* median ms of 5 runs of one path at M rows (after a warm-up); < 0 on failure */
static double timed(int lt, int M, const float *x, const void *w, float *y, void *xs)
{
    double t[5];
    for (int r = -1; r < 5; ++r) {
        double t0 = now_ms();
        int rc = lt ? kvf_gemm_narrow(&gdev, M, N, K, x, K, w, KVF_DTYPE_BF16, K, NULL, y, N, xs)
                    : kvf_gemm_w(&gdev, M, N, K, x, K, w, KVF_DTYPE_BF16, K, NULL, y, N);
        if ((rc != KVF_KERN_OK) || (kvf_device_sync(&gdev) != KVF_KERN_OK)) {
            return -1.0;
        }
        if (r >= 0) {
            t[r] = now_ms() - t0;
        }
    }
    qsort(t, 5, sizeof(t[0]), cmp_d);
    return t[2];
}
#endif

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
#ifdef KVF_HAVE_CUDA
    const int Ms[] = {1, 16, 64, 1024, MMAX};
    void *w = NULL, *xs = NULL, *x = NULL, *y = NULL;
    uint16_t *wh;
    float *xh;
    char row[512];
    int len = 0;
    double a = 0, b = 0;

    if (!kvf_device_cuda_available() ||
        (kvf_device_init(KVF_DEVICE_CUDA, 0, &gdev) != KVF_KERN_OK)) {
        printf("skipped: no GPU\n");
        return 77;
    }
    wh = malloc((size_t)N * K * 2);
    xh = malloc((size_t)MMAX * K * 4);
    if ((wh == NULL) || (xh == NULL) ||
        (kvf_device_alloc(&gdev, (size_t)N * K * 2, &w) != KVF_KERN_OK) ||
        (kvf_device_alloc(&gdev, (size_t)MMAX * K * 2, &xs) != KVF_KERN_OK) ||
        (kvf_device_alloc(&gdev, (size_t)MMAX * K * 4, &x) != KVF_KERN_OK) ||
        (kvf_device_alloc(&gdev, (size_t)MMAX * N * 4, &y) != KVF_KERN_OK)) {
        printf("| GEMM 14336x4096 bf16 | allocation failed | FAIL |\n");
        return 1;
    }
    for (size_t i = 0; i < (size_t)N * K; ++i) {
        wh[i] = kvf_fp32_to_bf16((float)((i * 2654435761u) % 2001) / 20000.0f - 0.05f);
    }
    for (size_t i = 0; i < (size_t)MMAX * K; ++i) {
        xh[i] = (float)((i * 40503u) % 2001) / 1000.0f - 1.0f;
    }
    if ((kvf_device_memcpy(&gdev, w, wh, (size_t)N * K * 2, KVF_COPY_H2D) != KVF_KERN_OK) ||
        (kvf_device_memcpy(&gdev, x, xh, (size_t)MMAX * K * 4, KVF_COPY_H2D) != KVF_KERN_OK)) {
        printf("| GEMM 14336x4096 bf16 | copy failed | FAIL |\n");
        return 1;
    }
    len = snprintf(row, sizeof(row), "| GEMM 14336x4096 bf16 ms (cuBLASLt / scalar) |");
    for (size_t i = 0; i < sizeof(Ms) / sizeof(Ms[0]); ++i) {
        a = timed(1, Ms[i], x, w, y, xs);
        b = timed(0, Ms[i], x, w, y, xs);
        if ((a < 0) || (b < 0)) {
            printf("%s M=%d: a call failed | FAIL |\n", row, Ms[i]);
            return 1;
        }
        len += snprintf(row + len, sizeof(row) - (size_t)len, " M=%d %.3f / %.3f |", Ms[i], a,
                        b);
    }
    printf("%s speed-up at M=%d %.1fx | PASS |\n", row, MMAX, b / a);
    return 0;
#else
    printf("skipped: no GPU (no CUDA in this build)\n");
    return 77;
#endif
}
