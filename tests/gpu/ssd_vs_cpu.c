/*
 * The chunked (SSD) Mamba2 prompt scan on one GPU (kernels/kvf_ssd.h) on
 * Nemotron-Nano-9B-v2's Mamba geometry (128 heads, head_dim 80, state 128, 8 groups), state
 * grid 128:
 * - against the CPU reference of the same chunked math (1000 tokens from position 0, then
 *   300 more continuing from the state): y and state within |gpu - cpu| / (1 + |cpu|) <=
 *   1e-4 (fp32 state) / 1e-2 (bf16 state);
 * - the grid rule on the GPU: the same 1000 tokens cut into calls at 256 and 768 (grid
 *   multiples) give the uncut call's y and state bit for bit;
 * - time of an 8192-token prompt, chunked against the token-by-token scan (kvf_mamba2_scan),
 *   fp32 state, median of 3 after a warm-up, as measured.
 * One table row:
 *   | Mamba2 SSD chunked scan | max rel vs CPU fp32 / bf16 | grid cuts bitwise | ms chunked / serial at 8k | result |
 * Exit: 0 PASS, 1 FAIL, 77 no usable GPU or no CUDA in this build.
 */
#include "kvf_device.h"
#include "kvf_dtype.h"
#include "kvf_kern.h"
#include "kvf_mamba2.h"
#include "kvf_ssd.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { H = 128, P = 80, G = 8, NS = 128, GRID = 128, TBIG = 8192, TCMP = 1000, TMORE = 300 };
#define DIM (H * P)
#define LDC (DIM + 2 * G * NS) /* the conv output xBC's row */
#define SN ((size_t)H * P * NS)

#ifdef KVF_HAVE_CUDA
static kvf_device_t gdev;
static uint64_t rng = 0x2545f4914f6cdd1dull;

static float rnd(float lo, float hi)
{
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return lo + (hi - lo) * (float)((rng * 2685821657736338717ull) >> 40) / 16777216.0f;
}

static void *up(const void *h, size_t bytes)
{
    void *d = NULL;
    if ((kvf_device_alloc(&gdev, bytes, &d) != KVF_KERN_OK) ||
        ((h != NULL) && (kvf_device_memcpy(&gdev, d, h, bytes, KVF_COPY_H2D) != KVF_KERN_OK))) {
        printf("| Mamba2 SSD chunked scan | device allocation or copy failed | FAIL |\n");
        exit(1);
    }
    return d;
}

static void down(void *h, const void *d, size_t bytes)
{
    if (kvf_device_memcpy(&gdev, h, d, bytes, KVF_COPY_D2H) != KVF_KERN_OK) {
        printf("| Mamba2 SSD chunked scan | copy back failed | FAIL |\n");
        exit(1);
    }
}

typedef struct {
    const kvf_device_t *dev;
    kvf_mamba2_params_t p;
    const float *xbc, *dt;
    float *y;
} run_t;

/* tokens [t0, t0 + n) chunked from absolute position t0 */
static int chunked(const run_t *r, int t0, int n, void *state, kvf_dtype_t sdt, int has)
{
    const float *x = r->xbc + (size_t)t0 * LDC;
    return kvf_mamba2_scan_chunked(r->dev, &r->p, n, t0, GRID, x, LDC, r->dt + (size_t)t0 * H,
                                   H, x + DIM, x + DIM + G * NS, LDC, state, sdt, has,
                                   r->y + (size_t)t0 * DIM, DIM);
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static float maxrel(const float *a, const float *b, size_t n, float m)
{
    for (size_t i = 0; i < n; ++i) {
        float d = fabsf(a[i] - b[i]) / (1.0f + fabsf(b[i]));
        m = ((d > m) || isnan(d)) ? d : m;
    }
    return m;
}
#endif

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
#ifdef KVF_HAVE_CUDA
    const size_t nx = (size_t)TBIG * LDC, ny = (size_t)TBIG * DIM;
    float *xbc = malloc(nx * 4), *dt = malloc((size_t)TBIG * H * 4), *yc = malloc(ny * 4);
    float *yg = malloc(ny * 4), *sc = malloc(SN * 4), *sg = malloc(SN * 4), *s2 = malloc(SN * 4);
    float prm[3][H], rel[2] = {0, 0};
    int bitwise = 1;

    if (!kvf_device_cuda_available() ||
        (kvf_device_init(KVF_DEVICE_CUDA, 0, &gdev) != KVF_KERN_OK)) {
        printf("skipped: no GPU\n");
        return 77;
    }
    if ((xbc == NULL) || (dt == NULL) || (yc == NULL) || (yg == NULL) || (sc == NULL) ||
        (sg == NULL) || (s2 == NULL)) {
        printf("| Mamba2 SSD chunked scan | host memory | FAIL |\n");
        return 1;
    }
    for (size_t i = 0; i < nx; ++i) {
        xbc[i] = rnd(-1, 1);
    }
    for (size_t i = 0; i < (size_t)TBIG * H; ++i) {
        dt[i] = rnd(-4, 0.5f);
    }
    for (int h = 0; h < H; ++h) {
        prm[0][h] = rnd(-1, 1);   /* dt_bias */
        prm[1][h] = rnd(-1, 1);   /* A_log */
        prm[2][h] = rnd(0, 1);    /* D */
    }
    kvf_mamba2_params_t p = {H, P, G, NS, prm[0], prm[1], prm[2], 0.0f, INFINITY};
    kvf_mamba2_params_t pd = {H, P, G, NS, up(prm[0], H * 4), up(prm[1], H * 4),
                              up(prm[2], H * 4), 0.0f, INFINITY};
    float *dx = up(xbc, nx * 4), *ddt = up(dt, (size_t)TBIG * H * 4), *dy = up(NULL, ny * 4);
    void *dst = up(NULL, SN * 4);
    run_t cpu = {NULL, p, xbc, dt, yc}, gpu = {&gdev, pd, dx, ddt, dy};
    int rc = KVF_KERN_OK;

    for (int d = 0; (rc == KVF_KERN_OK) && (d < 2); ++d) {
        kvf_dtype_t sdt = d ? KVF_DTYPE_BF16 : KVF_DTYPE_FP32;
        size_t sb = SN * kvf_dtype_size(sdt);
        rc = chunked(&cpu, 0, TCMP, sc, sdt, 0);
        rc = (rc == KVF_KERN_OK) ? chunked(&cpu, TCMP, TMORE, sc, sdt, 1) : rc;
        rc = (rc == KVF_KERN_OK) ? chunked(&gpu, 0, TCMP, dst, sdt, 0) : rc;
        rc = (rc == KVF_KERN_OK) ? chunked(&gpu, TCMP, TMORE, dst, sdt, 1) : rc;
        if (rc != KVF_KERN_OK) {
            break;
        }
        down(yg, dy, (size_t)(TCMP + TMORE) * DIM * 4);
        down(sg, dst, sb);
        rel[d] = maxrel(yg, yc, (size_t)(TCMP + TMORE) * DIM, rel[d]);
        for (size_t i = 0; i < SN; ++i) {
            float a = kvf_dtype_load(sg, sdt, i), b = kvf_dtype_load(sc, sdt, i);
            rel[d] = maxrel(&a, &b, 1, rel[d]);
        }
        /* grid cuts on the GPU: uncut (kept in yc/sc), then cut at 256 and 768 */
        rc = chunked(&gpu, 0, TCMP, dst, sdt, 0);
        down(yc, dy, (size_t)TCMP * DIM * 4);
        down(sc, dst, sb);
        const int at[] = {0, 256, 768, TCMP};
        for (int k = 0; (rc == KVF_KERN_OK) && (k < 3); ++k) {
            rc = chunked(&gpu, at[k], at[k + 1] - at[k], dst, sdt, k > 0);
        }
        down(yg, dy, (size_t)TCMP * DIM * 4);
        down(s2, dst, sb);
        bitwise &= (memcmp(yg, yc, (size_t)TCMP * DIM * 4) == 0) && (memcmp(s2, sc, sb) == 0);
    }
    double tc[3], ts[3], t0;
    for (int r = -1; (rc == KVF_KERN_OK) && (r < 3); ++r) {
        t0 = now_ms();
        rc = chunked(&gpu, 0, TBIG, dst, KVF_DTYPE_FP32, 0);
        rc = (rc == KVF_KERN_OK) ? kvf_device_sync(&gdev) : rc;
        if (r >= 0) {
            tc[r] = now_ms() - t0;
        }
        t0 = now_ms();
        rc = (rc == KVF_KERN_OK) ? kvf_mamba2_scan(&gdev, &pd, TBIG, dx, LDC, ddt, H, dx + DIM,
                                                   dx + DIM + G * NS, LDC, dst, KVF_DTYPE_FP32,
                                                   0, dy, DIM) : rc;
        rc = (rc == KVF_KERN_OK) ? kvf_device_sync(&gdev) : rc;
        if (r >= 0) {
            ts[r] = now_ms() - t0;
        }
    }
    if (rc != KVF_KERN_OK) {
        printf("| Mamba2 SSD chunked scan | %s | FAIL |\n", kvf_kern_strerror(rc));
        return 1;
    }
    /* medians of 3 */
    double mc = tc[0] + tc[1] + tc[2] - fmin(tc[0], fmin(tc[1], tc[2])) -
                fmax(tc[0], fmax(tc[1], tc[2]));
    double ms = ts[0] + ts[1] + ts[2] - fmin(ts[0], fmin(ts[1], ts[2])) -
                fmax(ts[0], fmax(ts[1], ts[2]));
    int ok = (rel[0] <= 1e-4f) && (rel[1] <= 1e-2f) && bitwise;
    printf("| Mamba2 SSD chunked scan (9B geometry, grid %d) | max rel vs CPU fp32 %.2e / bf16 "
           "%.2e | grid cuts bitwise %s | ms at %d tokens chunked %.2f / serial %.2f | %s |\n",
           GRID, (double)rel[0], (double)rel[1], bitwise ? "yes" : "NO", TBIG, mc, ms,
           ok ? "PASS" : "FAIL");
    return ok ? 0 : 1;
#else
    printf("skipped: no GPU (no CUDA in this build)\n");
    return 77;
#endif
}
