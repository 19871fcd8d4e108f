/*
 * The GPU's default GEMM of 16-bit weights (kvf_gemm_narrow: cuBLASLt on tensor cores, one
 * pinned algorithm per weight shape, kernels/kvf_gemm_plan.h) is batch invariant, checked
 * GPU against GPU: random bf16 and fp16 W (a Llama-3-8B-like 4096 x 4096 and 14336 x 4096,
 * Nemotron-Nano-9B-v2's 4480 x 15680), 1024 random rows of x; each batch size M in 1..64,
 * 100, 257, 1024 multiplies the first M rows, and every row's output must equal, bit for
 * bit, that row's output at M = 1024. Each output is also checked against the CPU reference
 * (kvf_gemm_narrow on the CPU: the same 16-bit rounding, fp32 sums in k order) within
 * |gpu - cpu| / (1 + |cpu|) <= 1e-3 on a sample of rows. One table row:
 *
 *   | GEMM cuBLASLt batch invariance | shapes | rows equal bitwise | max rel vs CPU | result |
 *
 * Exit: 0 PASS, 1 FAIL, 77 no usable GPU or no CUDA in this build (prints "skipped: no GPU").
 */
#include "kvf_device.h"
#include "kvf_dtype.h"
#include "kvf_gemm_narrow.h"
#include "kvf_kern.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MMAX 1024

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static float rnd(void)
{
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return (float)((rng * 2685821657736338717ull) >> 40) / 8388608.0f - 1.0f;
}

#ifdef KVF_HAVE_CUDA
static kvf_device_t gdev;

/* to the device; exits 1 naming the call on failure */
static void *up(const void *host, size_t bytes)
{
    void *d = NULL;
    if ((kvf_device_alloc(&gdev, bytes, &d) != KVF_KERN_OK) ||
        ((host != NULL) &&
         (kvf_device_memcpy(&gdev, d, host, bytes, KVF_COPY_H2D) != KVF_KERN_OK))) {
        printf("| GEMM cuBLASLt batch invariance | device allocation or copy failed | FAIL |\n");
        exit(1);
    }
    return d;
}

static int gemm(int M, int N, int K, const float *x, const void *w, kvf_dtype_t dt, float *y,
                void *xs)
{
    return kvf_gemm_narrow(&gdev, M, N, K, x, K, w, dt, K, NULL, y, N, xs);
}

/* One shape and dtype: @a bad counts rows that changed bits, @a maxrel the CPU distance. */
static int one_shape(int N, int K, kvf_dtype_t dt, long *bad, long *rows, float *maxrel)
{
    const int Ms[] = {100, 257};
    size_t nw = (size_t)N * (size_t)K, nx = (size_t)MMAX * (size_t)K, ny = (size_t)MMAX * N;
    uint16_t *w = malloc(nw * 2);
    float *x = malloc(nx * 4), *ref = malloc(ny * 4), *got = malloc(ny * 4);
    void *xs_h = malloc(nx * 2);
    int rc = KVF_KERN_OK;

    if ((w == NULL) || (x == NULL) || (ref == NULL) || (got == NULL) || (xs_h == NULL)) {
        return KVF_KERN_ENOMEM;
    }
    for (size_t i = 0; i < nw; ++i) {
        float v = rnd() * 0.05f;
        w[i] = (dt == KVF_DTYPE_BF16) ? kvf_fp32_to_bf16(v) : kvf_fp32_to_fp16(v);
    }
    for (size_t i = 0; i < nx; ++i) {
        x[i] = rnd();
    }
    void *dw = up(w, nw * 2), *dxs = up(NULL, nx * 2);
    float *dx = up(x, nx * 4), *dy = up(NULL, ny * 4);
    rc = gemm(MMAX, N, K, dx, dw, dt, dy, dxs);
    rc = (rc == KVF_KERN_OK) ? kvf_device_memcpy(&gdev, ref, dy, ny * 4, KVF_COPY_D2H) : rc;
    for (int M = 1; (rc == KVF_KERN_OK) && (M <= 66); ++M) {
        int m = (M <= 64) ? M : Ms[M - 65];
        rc = gemm(m, N, K, dx, dw, dt, dy, dxs);
        rc = (rc == KVF_KERN_OK) ? kvf_device_memcpy(&gdev, got, dy, (size_t)m * N * 4,
                                                     KVF_COPY_D2H) : rc;
        for (int r = 0; (rc == KVF_KERN_OK) && (r < m); ++r) {
            *bad += memcmp(got + (size_t)r * N, ref + (size_t)r * N, (size_t)N * 4) != 0;
            ++*rows;
        }
    }
    /* against the CPU reference on 8 rows */
    float *cy = malloc((size_t)8 * N * 4);
    if ((rc == KVF_KERN_OK) && (cy != NULL) &&
        (kvf_gemm_narrow(NULL, 8, N, K, x, K, w, dt, K, NULL, cy, N, xs_h) == KVF_KERN_OK)) {
        for (size_t i = 0; i < (size_t)8 * N; ++i) {
            float d = fabsf(ref[i] - cy[i]) / (1.0f + fabsf(cy[i]));
            *maxrel = (d > *maxrel) || isnan(d) ? d : *maxrel;
        }
    } else if (rc == KVF_KERN_OK) {
        rc = KVF_KERN_ENOMEM;
    }
    kvf_device_free(&gdev, dw);
    kvf_device_free(&gdev, dxs);
    kvf_device_free(&gdev, dx);
    kvf_device_free(&gdev, dy);
    free(cy);
    free(w);
    free(x);
    free(ref);
    free(got);
    free(xs_h);
    return rc;
}
#endif

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
#ifdef KVF_HAVE_CUDA
    const int shapes[][2] = {{4096, 4096}, {14336, 4096}, {4480, 15680}};
    long bad = 0, rows = 0;
    float maxrel = 0.0f;

    if (!kvf_device_cuda_available() ||
        (kvf_device_init(KVF_DEVICE_CUDA, 0, &gdev) != KVF_KERN_OK)) {
        printf("skipped: no GPU\n");
        return 77;
    }
    for (int s = 0; s < 3; ++s) {
        for (int d = 0; d < 2; ++d) {
            int rc = one_shape(shapes[s][0], shapes[s][1],
                               d ? KVF_DTYPE_FP16 : KVF_DTYPE_BF16, &bad, &rows, &maxrel);
            if (rc != KVF_KERN_OK) {
                printf("| GEMM cuBLASLt batch invariance | N %d K %d: %s | FAIL |\n",
                       shapes[s][0], shapes[s][1], kvf_kern_strerror(rc));
                return 1;
            }
        }
    }
    int ok = (bad == 0) && (maxrel <= 1e-3f);
    printf("| GEMM cuBLASLt batch invariance | bf16/fp16 4096x4096 14336x4096 4480x15680, "
           "M 1..64 100 257 vs 1024 | rows equal bitwise %ld/%ld | max rel vs CPU %.2e | %s |\n",
           rows - bad, rows, (double)maxrel, ok ? "PASS" : "FAIL");
    return ok ? 0 : 1;
#else
    (void)rnd;
    printf("skipped: no GPU (no CUDA in this build)\n");
    return 77;
#endif
}
