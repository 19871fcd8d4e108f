/*
 * The Gated DeltaNet GPU kernels on one GPU (kernels/kvf_gdn.h, kvf_ssm_seqs.h) on
 * Qwen3-Next-80B-A3B's linear-attention geometry at TP 1 (32 value heads of 128, 16 key
 * heads of 128), state grid 64:
 * - the chunked prompt scan against the CPU reference of the same chunked math (1000 tokens
 *   from position 0, then 300 more from the state): y and state within |gpu - cpu| /
 *   (1 + |cpu|) <= 1e-4 (fp32 state) / 1e-2 (bf16 state);
 * - against the token-by-token kernel on the GPU (fp32 state): the max abs difference of y,
 *   printed, relative <= 1e-3;
 * - the grid rule on the GPU: the same 1000 tokens cut at 256 and 768 give the uncut call's
 *   y and state bit for bit;
 * - the batched decode step (kvf_gdn_decode_seqs, the one CUDA graphs record) against the
 *   per-request conv step + one-token scan, 3 requests, fp32 and bf16 states: every bit;
 * - prompt throughput: an 8192-token prompt, chunked against the token kernel, fp32 state,
 *   median of 3 after a warm-up, as measured.
 * One table row:
 *   | GDN chunked scan | rel vs CPU | vs token kernel | grid cuts | decode batch | ms | result |
 * Exit: 0 PASS, 1 FAIL, 77 no usable GPU or no CUDA in this build.
 */
#include "kvf_conv1d.h"
#include "kvf_device.h"
#include "kvf_dtype.h"
#include "kvf_gdn.h"
#include "kvf_kern.h"
#include "kvf_ssm_seqs.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { H = 32, DV = 128, G = 16, DK = 128, GRID = 64, TBIG = 8192, TCMP = 1000, TMORE = 300 };
#define VD (H * DV)
#define LDX (VD + 2 * G * DK) /* the conv output v | k | q */
#define LDBA (2 * H)
#define SN ((size_t)H * DV * DK)
#define NAME "Gated DeltaNet chunked scan (Qwen3-Next TP 1, grid 64)"

#ifdef KVF_HAVE_CUDA
static kvf_device_t gdev;
static uint64_t rng = 0x9e3779b97f4a7c15ull;

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
        printf("| " NAME " | device allocation or copy failed | FAIL |\n");
        exit(1);
    }
    return d;
}

static void down(void *h, const void *d, size_t bytes)
{
    if (kvf_device_memcpy(&gdev, h, d, bytes, KVF_COPY_D2H) != KVF_KERN_OK) {
        printf("| " NAME " | copy back failed | FAIL |\n");
        exit(1);
    }
}

typedef struct {
    const kvf_device_t *dev;
    kvf_gdn_params_t p;
    const float *xbc, *ba;
    float *y;
} run_t;

static int chunked(const run_t *r, int t0, int n, void *state, kvf_dtype_t sdt, int has)
{
    return kvf_gdn_scan_chunked(r->dev, &r->p, n, t0, GRID, r->xbc + (size_t)t0 * LDX, LDX,
                                r->ba + (size_t)t0 * LDBA, LDBA, state, sdt, has,
                                r->y + (size_t)t0 * VD, VD);
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

static double median3(const double *t)
{
    return t[0] + t[1] + t[2] - fmin(t[0], fmin(t[1], t[2])) - fmax(t[0], fmax(t[1], t[2]));
}

/* the batched decode step against the per-request calls, 3 requests, on the GPU: 1 if every
 * y and state bit agrees */
static int decode_bits(const run_t *g, kvf_dtype_t sdt, int *rc)
{
    enum { S = 3, K = 4 };
    const size_t sb = SN * kvf_dtype_size(sdt), cb = (size_t)LDX * (K - 1) * 2;
    float *w = malloc((size_t)LDX * K * 4), *hx = malloc((size_t)S * LDX * 4);
    float *ya = malloc((size_t)S * VD * 4), *yb = malloc((size_t)S * VD * 4);
    uint8_t *ha = malloc(S * sb), *hb = malloc(S * sb);
    int ok = 1;

    for (size_t i = 0; i < (size_t)LDX * K; ++i) {
        w[i] = rnd(-0.5f, 0.5f);
    }
    for (size_t i = 0; i < (size_t)S * LDX; ++i) {
        hx[i] = rnd(-1, 1);
    }
    float *dw = up(w, (size_t)LDX * K * 4), *dx = up(hx, (size_t)S * LDX * 4);
    float *dxbc = up(NULL, (size_t)S * LDX * 4), *dy = up(NULL, (size_t)S * VD * 4);
    void *st[2][S], *cv[2][S];
    int rows[S];
    float dmin[S] = {0}, dmax[S] = {0};
    for (int q = 0; q < S; ++q) {
        rows[q] = q;
        for (int c = 0; c < 2; ++c) {   /* two copies of the same states: a and b */
            st[c][q] = up(NULL, sb);
            cv[c][q] = up(NULL, cb);
        }
        /* a state reached by the chunked scan (150 tokens), then copied */
        *rc = (*rc == KVF_KERN_OK) ? chunked(g, 0, 150, st[0][q], sdt, 0) : *rc;
        *rc = (*rc == KVF_KERN_OK) ?
              kvf_device_memcpy(&gdev, st[1][q], st[0][q], sb, KVF_COPY_D2D) : *rc;
        *rc = (*rc == KVF_KERN_OK) ? kvf_device_memset(&gdev, cv[0][q], 0, cb) : *rc;
        *rc = (*rc == KVF_KERN_OK) ? kvf_device_memset(&gdev, cv[1][q], 0, cb) : *rc;
    }
    for (int step = 0; (*rc == KVF_KERN_OK) && (step < 3); ++step) {
        const kvf_ssm_seqs_t seqs = {S, rows, cv[0], st[0], dmin, dmax, NULL};
        *rc = kvf_gdn_decode_seqs(&gdev, &seqs, dx, LDX, LDX, K, dw, KVF_DTYPE_BF16, dxbc, LDX,
                                  &g->p, g->ba + (size_t)step * LDBA, LDBA, sdt, dy, VD);
        if (*rc == KVF_KERN_OK) {
            down(ya, dy, (size_t)S * VD * 4);
        }
        for (int q = 0; (*rc == KVF_KERN_OK) && (q < S); ++q) {
            *rc = kvf_conv1d_step(&gdev, dx + (size_t)q * LDX, LDX, K, dw, NULL, 1, cv[1][q],
                                  KVF_DTYPE_BF16, dxbc + (size_t)q * LDX);
            *rc = (*rc == KVF_KERN_OK) ?
                  kvf_gdn_scan(&gdev, &g->p, 1, dxbc + (size_t)q * LDX, LDX,
                               g->ba + (size_t)(step + q) * LDBA, LDBA, st[1][q], sdt,
                               1, dy + (size_t)q * VD, VD) : *rc;
        }
        if (*rc == KVF_KERN_OK) {
            down(yb, dy, (size_t)S * VD * 4);
            ok &= (memcmp(ya, yb, (size_t)S * VD * 4) == 0);
        }
    }
    for (int q = 0; (*rc == KVF_KERN_OK) && (q < S); ++q) {
        down(ha + q * sb, st[0][q], sb);
        down(hb + q * sb, st[1][q], sb);
    }
    ok &= (*rc == KVF_KERN_OK) && (memcmp(ha, hb, S * sb) == 0);
    free(w);
    free(hx);
    free(ya);
    free(yb);
    free(ha);
    free(hb);
    return ok;
}
#endif

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
#ifdef KVF_HAVE_CUDA
    const size_t nx = (size_t)TBIG * LDX, ny = (size_t)TBIG * VD;
    float *xbc = malloc(nx * 4), *ba = malloc((size_t)TBIG * LDBA * 4), *yc = malloc(ny * 4);
    float *yg = malloc(ny * 4), *sc = malloc(SN * 4), *sg = malloc(SN * 4), *s2 = malloc(SN * 4);
    float prm[2][H], rel[2] = {0, 0}, vs_tok = 0, abs_tok = 0;
    int bitwise = 1, dec = 1, rc = KVF_KERN_OK;

    if (!kvf_device_cuda_available() ||
        (kvf_device_init(KVF_DEVICE_CUDA, 0, &gdev) != KVF_KERN_OK)) {
        printf("skipped: no GPU\n");
        return 77;
    }
    if ((xbc == NULL) || (ba == NULL) || (yc == NULL) || (yg == NULL) || (sc == NULL) ||
        (sg == NULL) || (s2 == NULL)) {
        printf("| " NAME " | host memory | FAIL |\n");
        return 1;
    }
    for (size_t i = 0; i < nx; ++i) {
        xbc[i] = rnd(-1, 1);
    }
    for (size_t i = 0; i < (size_t)TBIG * LDBA; ++i) {
        ba[i] = rnd(-3, 3);
    }
    for (int h = 0; h < H; ++h) {
        prm[0][h] = rnd(-1, 1);    /* dt_bias */
        prm[1][h] = rnd(-2, 0.5f); /* A_log */
    }
    const kvf_gdn_params_t p = {H, DV, G, DK, prm[0], prm[1]};
    const kvf_gdn_params_t pd = {H, DV, G, DK, up(prm[0], H * 4), up(prm[1], H * 4)};
    float *dx = up(xbc, nx * 4), *dba = up(ba, (size_t)TBIG * LDBA * 4), *dy = up(NULL, ny * 4);
    void *dst = up(NULL, SN * 4);
    run_t cpu = {NULL, p, xbc, ba, yc}, gpu = {&gdev, pd, dx, dba, dy};

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
        down(yg, dy, (size_t)(TCMP + TMORE) * VD * 4);
        down(sg, dst, sb);
        rel[d] = maxrel(yg, yc, (size_t)(TCMP + TMORE) * VD, rel[d]);
        for (size_t i = 0; i < SN; ++i) {
            float a = kvf_dtype_load(sg, sdt, i), b = kvf_dtype_load(sc, sdt, i);
            rel[d] = maxrel(&a, &b, 1, rel[d]);
        }
        if (d == 0) {   /* the token kernel on the GPU, the same tokens (yg: the chunked y) */
            rc = kvf_gdn_scan(&gdev, &pd, TCMP + TMORE, dx, LDX, dba, LDBA, dst, sdt, 0, dy, VD);
            if (rc != KVF_KERN_OK) {
                break;
            }
            down(yc, dy, (size_t)(TCMP + TMORE) * VD * 4);
            vs_tok = maxrel(yg, yc, (size_t)(TCMP + TMORE) * VD, 0.0f);
            for (size_t i = 0; i < (size_t)(TCMP + TMORE) * VD; ++i) {
                abs_tok = fmaxf(abs_tok, fabsf(yg[i] - yc[i]));
            }
        }
        /* grid cuts on the GPU: uncut (kept in yc/sc), then cut at 256 and 768 */
        rc = chunked(&gpu, 0, TCMP, dst, sdt, 0);
        down(yc, dy, (size_t)TCMP * VD * 4);
        down(sc, dst, sb);
        const int at[] = {0, 256, 768, TCMP};
        for (int k = 0; (rc == KVF_KERN_OK) && (k < 3); ++k) {
            rc = chunked(&gpu, at[k], at[k + 1] - at[k], dst, sdt, k > 0);
        }
        down(yg, dy, (size_t)TCMP * VD * 4);
        down(s2, dst, sb);
        bitwise &= (memcmp(yg, yc, (size_t)TCMP * VD * 4) == 0) && (memcmp(s2, sc, sb) == 0);
        dec &= (rc == KVF_KERN_OK) && decode_bits(&gpu, sdt, &rc);
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
        rc = (rc == KVF_KERN_OK) ? kvf_gdn_scan(&gdev, &pd, TBIG, dx, LDX, dba, LDBA, dst,
                                                KVF_DTYPE_FP32, 0, dy, VD) : rc;
        rc = (rc == KVF_KERN_OK) ? kvf_device_sync(&gdev) : rc;
        if (r >= 0) {
            ts[r] = now_ms() - t0;
        }
    }
    if (rc != KVF_KERN_OK) {
        printf("| " NAME " | %s | FAIL |\n", kvf_kern_strerror(rc));
        return 1;
    }
    int ok = (rel[0] <= 1e-4f) && (rel[1] <= 1e-2f) && (vs_tok <= 1e-3f) && bitwise && dec;
    printf("| " NAME " | max rel vs CPU fp32 %.2e / bf16 %.2e | vs token kernel max abs %.2e "
           "(rel %.2e) | grid cuts bitwise %s | decode batch = token bits %s | ms at %d tokens "
           "chunked %.2f / token %.2f (%.1fx) | %s |\n",
           (double)rel[0], (double)rel[1], (double)abs_tok, (double)vs_tok,
           bitwise ? "yes" : "NO", dec ? "yes" : "NO", TBIG, median3(tc), median3(ts),
           median3(ts) / median3(tc), ok ? "PASS" : "FAIL");
    return ok ? 0 : 1;
#else
    printf("skipped: no GPU (no CUDA in this build)\n");
    return 77;
#endif
}
