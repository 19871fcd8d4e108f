/*
 * Every CUDA kernel of kernels/ against its CPU twin, on one GPU: the same
 * random inputs through the CPU kernel (host memory) and the CUDA kernel
 * (device memory), then one table row per op and dtype:
 *
 *   | op | dtype | max abs diff | d/(1+abs(c)) | tol | result |
 *
 * over every output element (and the updated state for the stateful
 * kernels); "result" is PASS when the normalised diff is within the
 * tolerance and NaN appears in the same places, else FAIL. Also the stale-fp32 Mamba
 * NaN case on the device: a pool filled with 0xff bytes (NaN as fp32 and
 * bf16), one partly written kernel block, attention with and without
 * kvf_blocks_zero first: NaN expected without, none (and equal to the CPU)
 * with.
 *
 * Exit: 0 all PASS, 1 any FAIL, 77 no usable GPU (prints "skipped: no GPU";
 * tests/gpu/run.sh turns that into its own exit code). Built in every build
 * (a build without CUDA always skips), run by tests/gpu/run.sh.
 * `gpu_vs_cpu --cpu-twin` runs the same harness with the CPU as the device
 * (ctest test_gpu_harness): it proves the harness (buffer sizes, copies,
 * the comparison), not CUDA.
 */
#include "kvf_act.h"
#include "kvf_argmax.h"
#include "kvf_attention.h"
#include "kvf_attention_seqs.h"
#include "kvf_conv1d.h"
#include "kvf_device.h"
#include "kvf_gemm.h"
#include "kvf_gemm_narrow.h"
#include "kvf_mamba2.h"
#include "kvf_moe.h"
#include "kvf_nccl.h"
#include "kvf_norm.h"
#include "kvf_ops.h"
#include "kvf_sample.h"
#include "kvf_ssm_seqs.h"
#include "gpu_vs_cpu.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

kvf_device_t gdev;
int failures;
uint64_t rng = 0x9e3779b97f4a7c15ull;

float rnd(float lo, float hi)
{
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return lo + (hi - lo) * (float)((double)((rng * 2685821657736338717ull) >> 11) /
                                    9007199254740992.0);
}

float *frand(size_t n, float lo, float hi)
{
    float *a = malloc(n * sizeof(float));
    for (size_t i = 0; i < n && a != NULL; ++i) {
        a[i] = rnd(lo, hi);
    }
    return a;
}

void die(const char *what, int err)
{
    fprintf(stderr, "gpu_vs_cpu: %s failed: %s\n", what, kvf_kern_strerror(err));
    exit(1);
}


/* a device copy of @a bytes of host memory */
void *up(const void *host, size_t bytes)
{
    void *d = NULL;
    CK("alloc", kvf_device_alloc(&gdev, bytes, &d));
    if (host != NULL) {
        CK("copy to device", kvf_device_memcpy(&gdev, d, host, bytes, KVF_COPY_H2D));
    }
    return d;
}

void down(void *host, const void *d, size_t bytes)
{
    CK("sync", kvf_device_sync(&gdev));
    CK("copy to host", kvf_device_memcpy(&gdev, host, d, bytes, KVF_COPY_D2H));
}

float load_any(const void *p, kvf_dtype_t dt, size_t i)
{
    return kvf_dtype_load(p, dt, i);
}


diff_t diff_of(const void *gpu, const void *cpu, kvf_dtype_t dt, size_t n)
{
    diff_t r = {0.0, 0.0, 0, 0};
    for (size_t i = 0; i < n; ++i) {
        float g = load_any(gpu, dt, i), c = load_any(cpu, dt, i);
        if (isnan(g) || isnan(c)) {
            r.nan_mismatch += (isnan(g) != isnan(c)) ? 1 : 0;
            continue;
        }
        double d = fabs((double)g - (double)c);
        r.max = (d > r.max) ? d : r.max;
        d /= 1.0 + fabs((double)c);
        r.norm = (d > r.norm) ? d : r.norm;
        r.beyond += (d > 1e-4) ? 1 : 0;
    }
    return r;
}

/*
 * One table row over n elements of dtype dt: the max |gpu - cpu|, and the pass test on the
 * max relative difference (diff_of) against @a tol; NaN must be in the same places.
 */
void row(const char *op, const char *dtype, const void *gpu, const void *cpu,
         kvf_dtype_t dt, size_t n, double tol)
{
    diff_t d = diff_of(gpu, cpu, dt, n);
    int ok = (d.norm <= tol) && (d.nan_mismatch == 0);
    failures += ok ? 0 : 1;
    printf("| %-28s | %-5s | %-12.3g | %-12.3g | %-7.1g | %s%s |\n", op, dtype, d.max, d.norm,
           tol, ok ? "PASS" : "FAIL", d.nan_mismatch ? " (NaN mismatch)" : "");
}

void rowf(const char *op, const char *dtype, const float *gpu, const float *cpu, size_t n,
          double tol)
{
    row(op, dtype, gpu, cpu, KVF_DTYPE_FP32, n, tol);
}

/*
 * row() for what a scan over a bf16/fp16 state gives (its y, fp32, or the state, @a dt):
 * both devices round the state after every token, but an fp32 value they compute an ulp
 * apart (FMA contraction, libm) may round to neighbouring state values, and that element
 * then differs by a state ulp or so in every later token of its (head, head-dim) row. So
 * PASS needs every element within @a tol (a few state ulps, relative) and at most 5 % of
 * them beyond 1e-4 relative; a scan without the per-token rounding differs beyond 1e-4 in
 * most elements (a CPU emulation of the two devices: 10-97 % a call, against 0-2.4 % with
 * the rounding mirrored).
 */
void row_narrow_state(const char *op, const char *dtype, const void *gpu,
                      const void *cpu, kvf_dtype_t dt, size_t n, double tol)
{
    diff_t d = diff_of(gpu, cpu, dt, n);
    int ok = (d.norm <= tol) && (d.beyond * 20 <= n) && (d.nan_mismatch == 0);
    failures += ok ? 0 : 1;
    printf("| %-28s | %-5s | %-12.3g | %-12.3g | %-7.1g | %s (%zu of %zu > 1e-4)%s |\n", op,
           dtype, d.max, d.norm, tol, ok ? "PASS" : "FAIL", d.beyond, n,
           d.nan_mismatch ? " (NaN mismatch)" : "");
}

/* A bits row: the device's fused kernel against the same device's unfused launches. */
void row_same(const char *op, const void *a, const void *b, size_t bytes)
{
    int same = (memcmp(a, b, bytes) == 0);
    printf("| %-28s | %-5s | %-12s | %-12s | %-7s | %s |\n", op, "fp32", same ? "0" : "differ",
           "-", "0", same ? "PASS (bits = unfused)" : "FAIL: bits differ from unfused");
    failures += same ? 0 : 1;
}

/*
 * The fused norms of the forward against their unfused launches on the same device, bit
 * for bit: kvf_add_rmsnorm (the residual add and the next norm) against kvf_add then
 * kvf_rmsnorm, both h and y; the one-launch gated norm against its two phases; and the
 * fused add + norm against the CPU within rmsnorm's tolerance.
 */
static void check_fused_norms(const float *x, const float *z, const float *w, const float *dx,
                              const float *dz, const float *dw, int R, int D, int GS)
{
    const size_t n = (size_t)R * (size_t)D, bytes = n * sizeof(float);
    float *h_c = malloc(bytes), *y_c = malloc(bytes), *a = malloc(bytes), *b = malloc(bytes);
    float *h1 = up(x, bytes), *h2 = up(x, bytes), *y1 = up(NULL, bytes), *y2 = up(NULL, bytes);
    float *ss = up(NULL, (size_t)R * (size_t)(D / GS) * sizeof(float));

    if ((h_c == NULL) || (y_c == NULL) || (a == NULL) || (b == NULL)) {
        die("malloc", KVF_KERN_ENOMEM);
    }
    memcpy(h_c, x, bytes);
    CK("add_rmsnorm cpu", kvf_add_rmsnorm(NULL, h_c, z, w, y_c, R, D, 1e-5f));
    CK("add_rmsnorm gpu", kvf_add_rmsnorm(&gdev, h1, dz, dw, y1, R, D, 1e-5f));
    CK("add gpu", kvf_add(&gdev, h2, dz, n));
    CK("rmsnorm gpu", kvf_rmsnorm(&gdev, h2, dw, y2, R, D, 1e-5f));
    down(a, y1, bytes);
    rowf("add_rmsnorm", "fp32", a, y_c, n, 1e-5);
    down(b, y2, bytes);
    row_same("add_rmsnorm = add, rmsnorm", a, b, bytes);
    down(a, h1, bytes);
    down(b, h2, bytes);
    row_same("add_rmsnorm's h = add", a, b, bytes);
    CK("gated gpu", kvf_gated_rmsnorm(&gdev, dx, dz, D, dw, R, D, GS, 1e-5f, y1));
    CK("sumsq gpu", kvf_gated_rmsnorm_sumsq(&gdev, dx, dz, D, R, D, GS, y2, ss));
    CK("apply gpu", kvf_gated_rmsnorm_apply(&gdev, y2, ss, dw, R, D, GS, GS, 1e-5f, y2));
    down(a, y1, bytes);
    down(b, y2, bytes);
    row_same("gated (one launch) = phases", a, b, bytes);
    /* Qwen3's per-head norms (kvf_rmsnorm_heads): rows of D as tokens of D / GS heads of
     * GS, one launch against a kvf_rmsnorm launch per token (bits) and the CPU */
    memcpy(h_c, x, bytes);
    CK("rmsnorm_heads cpu", kvf_rmsnorm_heads(NULL, h_c, D, R, D / GS, GS, w, 1e-6f));
    CK("copy", kvf_device_memcpy(&gdev, h1, dx, bytes, KVF_COPY_D2D));
    CK("copy", kvf_device_memcpy(&gdev, h2, dx, bytes, KVF_COPY_D2D));
    CK("rmsnorm_heads gpu", kvf_rmsnorm_heads(&gdev, h1, D, R, D / GS, GS, dw, 1e-6f));
    for (int t = 0; t < R; ++t) {
        float *r = h2 + (size_t)t * (size_t)D;
        CK("rmsnorm gpu (a token)", kvf_rmsnorm(&gdev, r, dw, r, D / GS, GS, 1e-6f));
    }
    down(a, h1, bytes);
    down(b, h2, bytes);
    rowf("rmsnorm_heads", "fp32", a, h_c, n, 1e-5);
    row_same("rmsnorm_heads = per token", a, b, bytes);
    kvf_device_free(&gdev, h1);
    kvf_device_free(&gdev, h2);
    kvf_device_free(&gdev, y1);
    kvf_device_free(&gdev, y2);
    kvf_device_free(&gdev, ss);
    free(h_c);
    free(y_c);
    free(a);
    free(b);
}

static void check_norms(void)
{
    enum { R = 7, D = 384, GS = 128 };
    float *x = frand(R * D, -3, 3), *z = frand(R * D, -6, 6), *w = frand(D, 0.5f, 1.5f);
    float cpu[R * D], gpu[R * D], ss_c[R * 3], ss_g[R * 3];
    float *dx = up(x, sizeof(cpu)), *dz = up(z, sizeof(cpu)), *dw = up(w, D * 4);
    float *dy = up(NULL, sizeof(cpu)), *dss = up(NULL, sizeof(ss_c));

    CK("rmsnorm cpu", kvf_rmsnorm(NULL, x, w, cpu, R, D, 1e-5f));
    CK("rmsnorm gpu", kvf_rmsnorm(&gdev, dx, dw, dy, R, D, 1e-5f));
    down(gpu, dy, sizeof(gpu));
    rowf("rmsnorm", "fp32", gpu, cpu, R * D, 1e-5);
    CK("gated cpu", kvf_gated_rmsnorm(NULL, x, z, D, w, R, D, GS, 1e-5f, cpu));
    CK("gated gpu", kvf_gated_rmsnorm(&gdev, dx, dz, D, dw, R, D, GS, 1e-5f, dy));
    down(gpu, dy, sizeof(gpu));
    rowf("gated_rmsnorm", "fp32", gpu, cpu, R * D, 1e-5);
    CK("sumsq cpu", kvf_gated_rmsnorm_sumsq(NULL, x, z, D, R, D, GS, cpu, ss_c));
    CK("sumsq gpu", kvf_gated_rmsnorm_sumsq(&gdev, dx, dz, D, R, D, GS, dy, dss));
    down(ss_g, dss, sizeof(ss_g));
    rowf("gated_rmsnorm_sumsq", "fp32", ss_g, ss_c, R * 3, 1e-6);
    CK("apply cpu", kvf_gated_rmsnorm_apply(NULL, cpu, ss_c, w, R, D, GS, 2 * GS, 1e-6f, cpu));
    CK("apply gpu", kvf_gated_rmsnorm_apply(&gdev, dy, dss, dw, R, D, GS, 2 * GS, 1e-6f, dy));
    down(gpu, dy, sizeof(gpu));
    rowf("gated_rmsnorm_apply (TP 2)", "fp32", gpu, cpu, R * D, 1e-5);
    check_fused_norms(x, z, w, dx, dz, dw, R, D, GS);
    kvf_device_free(&gdev, dx);
    kvf_device_free(&gdev, dz);
    kvf_device_free(&gdev, dw);
    kvf_device_free(&gdev, dy);
    kvf_device_free(&gdev, dss);
    free(x);
    free(z);
    free(w);
}

/* The fixed-order GEMM (the default; kvf_gemm_fixed_cuda.cu) gives the CPU's bits: tol 0.
 * Under KVF_GPU_GEMM=cublas the rows are cuBLAS's, within fp32 rounding (1e-4). K and N not
 * multiples of the 16 lanes / 32-column tile, so the padded tail and the edge run. */
static void check_gemm(void)
{
    enum { M = 37, N = 97, K = 250, LDX = 300, LDY = 130, ROW = 29 };
    const char *mode = getenv("KVF_GPU_GEMM");
    const int cublas = (mode != NULL) && (strcmp(mode, "cublas") == 0);
    const double tol = cublas ? 1e-4 : 0.0;
    float *x = frand(M * LDX, -1, 1), *w = frand(N * K, -1, 1), *b = frand(N, -1, 1);
    float *y0 = frand(M * LDY, -1, 1), cpu[M * LDY], gpu[M * LDY], one[N];
    uint16_t *wb = malloc((size_t)N * K * sizeof(uint16_t));
    float *dx = up(x, M * LDX * 4), *dw = up(w, N * K * 4), *db = up(b, N * 4);
    float *dy = up(y0, sizeof(cpu));
    void *dwb;

    memcpy(cpu, y0, sizeof(cpu));
    CK("gemm cpu", kvf_gemm_ex(NULL, M, N, K, x, LDX, w, K, b, 1.0f, cpu, LDY));
    CK("gemm gpu", kvf_gemm_ex(&gdev, M, N, K, dx, LDX, dw, K, db, 1.0f, dy, LDY));
    down(gpu, dy, sizeof(gpu));
    rowf(cublas ? "gemm (cuBLAS, bias, beta 1)" : "gemm fixed (bias, beta 1)", "fp32",
         gpu, cpu, M * LDY, tol);
    CK("gemm cpu", kvf_gemm(NULL, M, N, K, x, w, NULL, cpu));
    CK("gemm gpu", kvf_gemm(&gdev, M, N, K, dx, dw, NULL, dy));
    down(gpu, dy, (size_t)M * N * 4);
    rowf(cublas ? "gemm (cuBLAS, beta 0)" : "gemm fixed (beta 0)", "fp32", gpu, cpu,
         (size_t)M * N, tol);
    /* batch invariance: row ROW alone equals row ROW of the 37-row product, bit for bit */
    CK("gemm gpu 1 row", kvf_gemm(&gdev, 1, N, K, dx + (size_t)ROW * K, dw, NULL, dy));
    down(one, dy, sizeof(one));
    rowf(cublas ? "gemm 1 row vs 37 (cuBLAS)" : "gemm 1 row vs 37 (fixed)", "fp32", one,
         gpu + (size_t)ROW * N, N, cublas ? 1e-4 : 0.0);
    /* bf16 W widened in the register on both devices */
    for (size_t i = 0; i < (size_t)N * K; ++i) {
        wb[i] = kvf_fp32_to_bf16(w[i]);
    }
    dwb = up(wb, (size_t)N * K * sizeof(uint16_t));
    memcpy(cpu, y0, sizeof(cpu));
    CK("copy y0", kvf_device_memcpy(&gdev, dy, y0, sizeof(cpu), KVF_COPY_H2D));
    CK("gemm_w cpu", kvf_gemm_w(NULL, M, N, K, x, LDX, wb, KVF_DTYPE_BF16, K, b, cpu, LDY));
    CK("gemm_w gpu", kvf_gemm_w(&gdev, M, N, K, dx, LDX, dwb, KVF_DTYPE_BF16, K, db, dy, LDY));
    down(gpu, dy, sizeof(gpu));
    rowf("gemm fixed, bf16 W", "bf16", gpu, cpu, M * LDY, 0.0);
    /* the MLP's up projection with its ReLU^2 in the GEMM's store: the unfused pair's bits
     * on the device, and the CPU's (fixed order) */
    CK("gemm_w_act gpu", kvf_gemm_w_act(&gdev, M, N, K, dx, LDX, dwb, KVF_DTYPE_BF16, K, db,
                                        KVF_KACT_RELU2, dy, N));
    down(gpu, dy, (size_t)M * N * 4);
    CK("gemm_w gpu", kvf_gemm_w(&gdev, M, N, K, dx, LDX, dwb, KVF_DTYPE_BF16, K, db, dy, N));
    CK("act gpu", kvf_act(&gdev, KVF_KACT_RELU2, dy, (size_t)M * N));
    down(cpu, dy, (size_t)M * N * 4);
    row_same("gemm_w_act = gemm_w, act", gpu, cpu, (size_t)M * N * 4);
    CK("gemm_w_act cpu", kvf_gemm_w_act(NULL, M, N, K, x, LDX, wb, KVF_DTYPE_BF16, K, b,
                                        KVF_KACT_RELU2, cpu, N));
    rowf("gemm_w_act (ReLU^2), bf16 W", "bf16", gpu, cpu, (size_t)M * N, 0.0);
    kvf_device_free(&gdev, dx);
    kvf_device_free(&gdev, dw);
    kvf_device_free(&gdev, dwb);
    kvf_device_free(&gdev, db);
    kvf_device_free(&gdev, dy);
    free(x);
    free(w);
    free(wb);
    free(b);
    free(y0);
}

/* 16-bit weights on tensor cores (kvf_gemm_narrow.h) against the CPU reference: x rounded
 * alike, products exact in fp32 on both, only the sum order differs */
static void check_gemm_narrow(kvf_dtype_t wdt)
{
    enum { M = 37, N = 96, K = 256, LDX = 300, LDY = 130 };
    float *x = frand(M * LDX, -1, 1), *wf = frand(N * K, -1, 1), *b = frand(N, -1, 1);
    float *y0 = frand(M * LDY, -1, 1), cpu[M * LDY], gpu[M * LDY];
    uint16_t *w = malloc((size_t)N * K * 2), xs[M * K];
    char name[64];

    for (size_t i = 0; i < (size_t)N * K; ++i) {
        w[i] = (wdt == KVF_DTYPE_BF16) ? kvf_fp32_to_bf16(wf[i]) : kvf_fp32_to_fp16(wf[i]);
    }
    float *dx = up(x, M * LDX * 4), *db = up(b, N * 4), *dy = up(y0, sizeof(cpu));
    void *dw = up(w, (size_t)N * K * 2), *dxs = up(NULL, sizeof(xs));

    memcpy(cpu, y0, sizeof(cpu));
    CK("gemm_narrow cpu", kvf_gemm_narrow(NULL, M, N, K, x, LDX, w, wdt, K, b, cpu, LDY, xs));
    CK("gemm_narrow gpu", kvf_gemm_narrow(&gdev, M, N, K, dx, LDX, dw, wdt, K, db, dy, LDY, dxs));
    down(gpu, dy, sizeof(gpu));
    snprintf(name, sizeof(name), "gemm 16-bit W (GemmEx, bias)");
    rowf(name, kvf_dtype_name(wdt), gpu, cpu, M * LDY, 1e-3);
    CK("gemm_narrow cpu", kvf_gemm_narrow(NULL, 1, N, K, x, LDX, w, wdt, K, NULL, cpu, N, xs));
    CK("gemm_narrow gpu", kvf_gemm_narrow(&gdev, 1, N, K, dx, LDX, dw, wdt, K, NULL, dy, N, dxs));
    down(gpu, dy, (size_t)N * 4);
    rowf("gemm 16-bit W (1 row)", kvf_dtype_name(wdt), gpu, cpu, N, 1e-3);
    kvf_device_free(&gdev, dx);
    kvf_device_free(&gdev, dw);
    kvf_device_free(&gdev, db);
    kvf_device_free(&gdev, dy);
    kvf_device_free(&gdev, dxs);
    free(x);
    free(wf);
    free(w);
    free(b);
    free(y0);
}

/* greedy ids (kvf_argmax.h): equal to the CPU's, also with ties, NaNs and a NaN first */
static void check_argmax(void)
{
    enum { ROWS = 5, V = 50000 };
    float *x = frand((size_t)ROWS * V, -4, 4);
    int32_t cpu[ROWS], gpu[ROWS];
    int32_t *dout = up(NULL, sizeof(gpu));

    for (size_t i = 0; i < (size_t)ROWS * V; ++i) {
        x[i] = roundf(x[i] * 4.0f) / 4.0f;   /* many ties at the max */
    }
    x[(size_t)1 * V] = NAN;
    x[(size_t)2 * V + 17] = NAN;
    x[(size_t)3 * V + V - 1] = 100.0f;
    float *dx = up(x, (size_t)ROWS * V * 4);
    CK("argmax cpu", kvf_argmax_rows(NULL, x, ROWS, V, V, cpu));
    CK("argmax gpu", kvf_argmax_rows(&gdev, dx, ROWS, V, V, dout));
    down(gpu, dout, sizeof(gpu));
    int same = (memcmp(gpu, cpu, sizeof(cpu)) == 0);
    printf("| %-28s | %-5s | %-12s | %-12s | %-7s | %s |\n", "argmax (greedy ids)", "i32",
           same ? "0" : "differ", "-", "0", same ? "PASS" : "FAIL");
    failures += same ? 0 : 1;
    kvf_device_free(&gdev, dx);
    kvf_device_free(&gdev, dout);
    free(x);
}

/*
 * Device sampling (kvf_sample.h): the CUDA sampler against its CPU twin on the same logits,
 * parameters, penalty entries and draws: token, logprob parts and top ids bit for bit
 * (memcmp of the result rows). A vocabulary of 131072 (several lanes' worth per thread) with
 * every filter, and a small one with ties, -inf and -0.
 */
static void check_sample_v(int V, int ROWS, int ties)
{
    float *x = frand((size_t)ROWS * V, -6, 6);
    kvf_sample_row_t *rows = calloc((size_t)ROWS, sizeof(*rows));
    kvf_sample_pen_t *pen = calloc((size_t)ROWS * 8, sizeof(*pen));
    kvf_sample_res_t *cpu = calloc((size_t)ROWS, sizeof(*cpu));
    kvf_sample_res_t *gpu = calloc((size_t)ROWS, sizeof(*gpu));
    float *scratch = malloc((size_t)ROWS * V * sizeof(float));
    char name[40];
    int np = 0;

    for (size_t i = 0; ties && (i < (size_t)ROWS * V); ++i) {
        x[i] = (rnd(0, 1) < 0.2f) ? -INFINITY : roundf(x[i] * 2.0f) / 2.0f;
        x[i] = (x[i] == 0.0f) && (rnd(0, 1) < 0.5f) ? -0.0f : x[i];
    }
    for (int r = 0; r < ROWS; ++r) {
        static const float temps[] = {0.0f, 0.3f, 0.7f, 1.0f, 1.6f};
        kvf_sample_row_t *p = &rows[r];
        p->temperature = temps[r % 5];
        p->top_p = (r % 3 == 0) ? 1.0f : rnd(0.05f, 0.98f);
        p->top_k = (r % 4 == 0) ? 0 : (r % 4 == 1) ? 1 : (int)rnd(2, 200);
        p->min_p = (r % 2) ? 0.0f : rnd(0.0f, 0.2f);
        p->rep = (r % 3 == 1) ? rnd(0.5f, 2.0f) : 1.0f;
        p->freq = rnd(-2, 2);
        p->pres = rnd(-2, 2);
        p->want_logprobs = (r % 5 != 4);
        p->num_top = p->want_logprobs ? (r * 7) % 21 : 0;
        p->pen_start = np;
        p->pen_count = r % 8;
        p->allow_only = (r % 7 == 3) && (p->pen_count > 0);   /* allowed_token_ids */
        for (int e = 0; e < p->pen_count; ++e) {   /* distinct ids (< 8 of them, <= V) */
            size_t step = (V >= 8) ? (size_t)V / 8 : 1;
            int32_t flags = 1 + (e % 3 == 2);
            flags |= (e % 2) ? KVF_SAMPLE_PEN_BIAS : 0;              /* logit_bias */
            flags |= ((e % 3) != 1) ? KVF_SAMPLE_PEN_ALLOW : 0;
            pen[np++] = (kvf_sample_pen_t){.id = (int32_t)(((size_t)e * step + (size_t)r) %
                                                           (size_t)V),
                                           .count = e % 3, .flags = flags,
                                           .bias = rnd(-100, 100)};
        }
        p->draw = ((uint64_t)(rnd(0, 1) * 4294967296.0) << 32) ^
                  (uint64_t)(rnd(0, 1) * 4294967296.0);
    }
    float *dx = up(x, (size_t)ROWS * V * 4);
    void *drows = up(rows, (size_t)ROWS * sizeof(*rows));
    void *dpen = up(pen, (size_t)(np ? np : 1) * sizeof(*pen));
    float *dscr = up(NULL, (size_t)ROWS * V * sizeof(float));
    void *dout = up(NULL, (size_t)ROWS * sizeof(*gpu));
    CK("sample cpu", kvf_sample_rows(NULL, x, ROWS, V, V, rows, pen, np, scratch, cpu));
    CK("sample gpu", kvf_sample_rows(&gdev, dx, ROWS, V, V, drows, dpen, np, dscr, dout));
    down(gpu, dout, (size_t)ROWS * sizeof(*gpu));
    int bad = 0;
    for (int r = 0; r < ROWS; ++r) {
        /* every field (unused top entries are 0 on both) */
        bad += memcmp(&cpu[r], &gpu[r], sizeof(cpu[r])) != 0;
        if ((cpu[r].token != gpu[r].token) && (bad < 4)) {
            printf("  sample row %d: token %d (gpu) vs %d (cpu)\n", r, gpu[r].token,
                   cpu[r].token);
        }
    }
    snprintf(name, sizeof(name), "sample (vocab %d%s)", V, ties ? ", ties" : "");
    printf("| %-28s | %-5s | %-12s | %-12s | %-7s | %s |\n", name, "rows",
           bad ? "differ" : "0", "-", "0", bad ? "FAIL" : "PASS");
    failures += bad ? 1 : 0;
    kvf_device_free(&gdev, dx);
    kvf_device_free(&gdev, drows);
    kvf_device_free(&gdev, dpen);
    kvf_device_free(&gdev, dscr);
    kvf_device_free(&gdev, dout);
    free(x);
    free(rows);
    free(pen);
    free(cpu);
    free(gpu);
    free(scratch);
}

static void check_sample(void)
{
    check_sample_v(131072, 10, 0);
    check_sample_v(1000, 20, 1);
    check_sample_v(7, 6, 1);
}

static void check_elementwise(void)
{
    static const char *const acts[KVF_KACT_COUNT] = {"silu", "relu2", "relu", "gelu",
                                                     "gelu_tanh", "quick_gelu", "sigmoid", "tanh"};
    enum { N = 10000 };
    float *x = frand(N, -12, 12), cpu[N], gpu[N];
    float *dx = up(NULL, sizeof(cpu));
    char name[64];

    for (int a = 0; a < KVF_KACT_COUNT; ++a) {
        memcpy(cpu, x, sizeof(cpu));
        CK("act cpu", kvf_act(NULL, a, cpu, N));
        CK("act to device", kvf_device_memcpy(&gdev, dx, x, sizeof(cpu), KVF_COPY_H2D));
        CK("act gpu", kvf_act(&gdev, a, dx, N));
        down(gpu, dx, sizeof(gpu));
        snprintf(name, sizeof(name), "act %s", acts[a]);
        rowf(name, "fp32", gpu, cpu, N, 1e-6);
    }
    for (int dt = KVF_DTYPE_BF16; dt <= KVF_DTYPE_FP8; ++dt) {
        unsigned char hc[N * 4], hg[N * 4];
        void *dd = up(NULL, N * 4);
        CK("convert to device", kvf_device_memcpy(&gdev, dx, x, sizeof(cpu), KVF_COPY_H2D));
        CK("convert cpu", kvf_convert(NULL, hc, (kvf_dtype_t)dt, x, KVF_DTYPE_FP32, N));
        CK("convert gpu", kvf_convert(&gdev, dd, (kvf_dtype_t)dt, dx, KVF_DTYPE_FP32, N));
        down(hg, dd, N * kvf_dtype_size((kvf_dtype_t)dt));
        snprintf(name, sizeof(name), "convert fp32->%s (bytes)", kvf_dtype_name((kvf_dtype_t)dt));
        row(name, kvf_dtype_name((kvf_dtype_t)dt), hg, hc, (kvf_dtype_t)dt, N, 0.0);
        kvf_device_free(&gdev, dd);
    }
    kvf_device_free(&gdev, dx);
    free(x);
}

/* The forward's glue kernels (kvf_ops.h): residual add, row gather (fp32 and
 * bf16 embeddings), MoE weighted scatter-add, act(gate) * up, RoPE. */
static void check_ops(void)
{
    enum { N = 4096, R = 50, C = 96, G = 37, LDY = 128, M = 20, HD = 64, H = 3, T = 40 };
    float *y = frand(N, -2, 2), *x = frand(N, -2, 2), yc[N], yg[N];
    float *dy = up(y, sizeof(yc)), *dx = up(x, sizeof(yc));
    int32_t ids[G], rows[G], pos[T];
    float wt[G];

    memcpy(yc, y, sizeof(yc));
    CK("add cpu", kvf_add(NULL, yc, x, N));
    CK("add gpu", kvf_add(&gdev, dy, dx, N));
    down(yg, dy, sizeof(yg));
    rowf("add (residual)", "fp32", yg, yc, N, 0.0);

    for (int i = 0; i < G; ++i) {
        ids[i] = (int32_t)((i * 7 + 3) % R);        /* repeats allowed */
        rows[i] = (int32_t)((i * 11) % R);           /* distinct: 11 and 50 coprime, G < R */
        wt[i] = rnd(0.0f, 1.0f);
    }
    for (int dt = KVF_DTYPE_FP32; dt <= KVF_DTYPE_BF16; ++dt) {
        unsigned char src[R * C * 4];
        float gc[G * C], gg[G * C];
        void *dsrc;
        float *ddst = up(NULL, sizeof(gc));
        char name[64];
        float *vals = frand((size_t)R * C, -3, 3);
        CK("gather convert", kvf_convert(NULL, src, (kvf_dtype_t)dt, vals, KVF_DTYPE_FP32,
                                         R * C));
        free(vals);
        dsrc = up(src, (size_t)R * C * kvf_dtype_size((kvf_dtype_t)dt));
        CK("gather cpu", kvf_gather_rows(NULL, src, (kvf_dtype_t)dt, C, ids, G, gc));
        CK("gather gpu", kvf_gather_rows(&gdev, dsrc, (kvf_dtype_t)dt, C, ids, G, ddst));
        down(gg, ddst, sizeof(gg));
        snprintf(name, sizeof(name), "gather_rows from %s", kvf_dtype_name((kvf_dtype_t)dt));
        rowf(name, "fp32", gg, gc, (size_t)G * C, 0.0);
        kvf_device_free(&gdev, dsrc);
        kvf_device_free(&gdev, ddst);
    }

    {   /* y [R][LDY] += x [G][C] * wt into rows */
        float *base = frand((size_t)R * LDY, -1, 1), *sc = malloc((size_t)R * LDY * 4);
        float *sg = malloc((size_t)R * LDY * 4), *dsy = up(base, (size_t)R * LDY * 4);
        if ((sc == NULL) || (sg == NULL)) {
            die("scatter alloc", KVF_KERN_ENOMEM);
        }
        memcpy(sc, base, (size_t)R * LDY * 4);
        CK("scatter cpu", kvf_scatter_add_rows(NULL, sc, LDY, rows, wt, G, x, C));
        CK("scatter gpu", kvf_scatter_add_rows(&gdev, dsy, LDY, rows, wt, G, dx, C));
        down(sg, dsy, (size_t)R * LDY * 4);
        rowf("scatter_add_rows (moe)", "fp32", sg, sc, (size_t)R * LDY, 1e-6);
        kvf_device_free(&gdev, dsy);
        free(base);
        free(sc);
        free(sg);
    }

    for (int a = 0; a < KVF_KACT_COUNT; a += KVF_KACT_COUNT - 1) {   /* first and last */
        float mc[M * C], mg[M * C];
        float *dm = up(NULL, sizeof(mc));
        char name[64];
        CK("act_mul cpu", kvf_act_mul(NULL, a, x, M, C, mc));
        CK("act_mul gpu", kvf_act_mul(&gdev, a, dx, M, C, dm));
        down(mg, dm, sizeof(mg));
        snprintf(name, sizeof(name), "act_mul act %d", a);
        rowf(name, "fp32", mg, mc, (size_t)M * C, 1e-6);
        kvf_device_free(&gdev, dm);
    }
    {   /* gpt-oss's clamped SwiGLU, a limit inside x's range [-1, 1] so both clamps bind */
        float mc[M * C], mg[M * C];
        float *dm = up(NULL, sizeof(mc));
        CK("swiglu_clamp cpu", kvf_swiglu_clamp(NULL, 1.702f, 0.5f, x, M, C, mc));
        CK("swiglu_clamp gpu", kvf_swiglu_clamp(&gdev, 1.702f, 0.5f, dx, M, C, dm));
        down(mg, dm, sizeof(mg));
        rowf("swiglu_clamp (gpt-oss)", "fp32", mg, mc, (size_t)M * C, 1e-6);
        kvf_device_free(&gdev, dm);
    }

    {   /* RoPE on T tokens of H heads, rows of H * HD + 16 floats */
        enum { LDX = H * HD + 16 };
        float inv[HD / 2], *q = frand((size_t)T * LDX, -1, 1), *rc = malloc((size_t)T * LDX * 4);
        float *rg = malloc((size_t)T * LDX * 4), *dq = up(q, (size_t)T * LDX * 4), *dinv;
        if ((rc == NULL) || (rg == NULL)) {
            die("rope alloc", KVF_KERN_ENOMEM);
        }
        for (int i = 0; i < HD / 2; ++i) {
            inv[i] = powf(10000.0f, -2.0f * (float)i / (float)HD);
        }
        for (int t = 0; t < T; ++t) {
            pos[t] = t * 97;   /* angles up to about 3800 rad */
        }
        dinv = up(inv, sizeof(inv));
        memcpy(rc, q, (size_t)T * LDX * 4);
        CK("rope cpu", kvf_rope(NULL, inv, HD, pos, T, rc, LDX, H));
        CK("rope gpu", kvf_rope(&gdev, dinv, HD, pos, T, dq, LDX, H));
        down(rg, dq, (size_t)T * LDX * 4);
        rowf("rope", "fp32", rg, rc, (size_t)T * LDX, 1e-5);
        kvf_device_free(&gdev, dq);
        kvf_device_free(&gdev, dinv);
        free(q);
        free(rc);
        free(rg);
    }
    kvf_device_free(&gdev, dy);
    kvf_device_free(&gdev, dx);
    free(y);
    free(x);
}

/* The router on the GPU against the CPU: NemotronH's grouped sigmoid router, the softmax of
 * the top-k logits (granite, qwen3_next) and the top-k entries of the full softmax
 * (qwen3_next with norm_topk_prob false). */
static void check_moe(void)
{
    enum { T = 300, E = 64, K = 6 };
    static const struct {
        const char *name;
        int ng, topk_group, softmax_topk, softmax_full;
    } variants[] = {
        {"moe_route", 8, 4, 0, 0},
        {"moe_route softmax_topk", 1, 1, 1, 0},
        {"moe_route softmax_full", 1, 1, 1, 1},
    };
    float *logits = frand(T * E, -4, 4), *bias = frand(E, -0.5f, 0.5f);
    float sc_c[T * E], sc_g[T * E], wt_c[T * K], wt_g[T * K];
    int32_t idx_c[T * K], idx_g[T * K];
    float *dl = up(logits, sizeof(sc_c)), *db = up(bias, E * 4), *ds = up(NULL, sizeof(sc_c));
    float *dwt = up(NULL, sizeof(wt_c));
    int32_t *didx = up(NULL, sizeof(idx_c));
    char name[96];

    for (size_t v = 0; v < sizeof(variants) / sizeof(variants[0]); ++v) {
        kvf_moe_route_params_t p = {
            .experts = E, .top_k = K, .n_group = variants[v].ng,
            .topk_group = variants[v].topk_group, .norm_topk_prob = 1, .routed_scaling = 2.5f,
            .bias = bias, .softmax_topk = variants[v].softmax_topk,
            .softmax_full = variants[v].softmax_full,
        };
        size_t same = 0;

        CK("route cpu", kvf_moe_route(NULL, &p, logits, T, sc_c, idx_c, wt_c));
        p.bias = db;
        CK("route gpu", kvf_moe_route(&gdev, &p, dl, T, ds, didx, dwt));
        down(sc_g, ds, sizeof(sc_g));
        down(wt_g, dwt, sizeof(wt_g));
        down(idx_g, didx, sizeof(idx_g));
        for (size_t i = 0; i < T * K; ++i) {
            same += (idx_c[i] == idx_g[i]) ? 1 : 0;
        }
        snprintf(name, sizeof(name), "%s scores", variants[v].name);
        rowf(name, "fp32", sc_g, sc_c, T * E, 1e-6);
        snprintf(name, sizeof(name), "%s weights", variants[v].name);
        rowf(name, "fp32", wt_g, wt_c, T * K, 1e-5);
        snprintf(name, sizeof(name), "%s experts differing", variants[v].name);
        printf("| %-28s | %-5s | %-12zu | %-12s | %-7d | %s |\n", name,
               "int32", (size_t)(T * K) - same, "-", 0, (same == T * K) ? "PASS" : "FAIL");
        failures += (same == T * K) ? 0 : 1;
    }
    kvf_device_free(&gdev, dl);
    kvf_device_free(&gdev, db);
    kvf_device_free(&gdev, ds);
    kvf_device_free(&gdev, dwt);
    kvf_device_free(&gdev, didx);
    free(logits);
    free(bias);
}

static void check_zeroing(void)
{
    static const size_t page_sizes[2] = {4096, 1000};
    static const int64_t ids[5] = {3, 7, 7, 60, 0};
    static const size_t offs[3] = {5, 9000, 20000}, lens[3] = {100, 0, 3333};
    enum { PAGES = 64 };
    unsigned char *hc = malloc(PAGES * 4096), *hg = malloc(PAGES * 4096);
    void *dp = up(NULL, PAGES * 4096);
    char name[64];

    for (int i = 0; i < 2; ++i) {
        memset(hc, 0xab, PAGES * 4096);
        CK("fill", kvf_device_memset(&gdev, dp, 0xab, PAGES * 4096));
        CK("zero cpu", kvf_blocks_zero(NULL, hc, page_sizes[i], ids, 5));
        CK("zero gpu", kvf_blocks_zero(&gdev, dp, page_sizes[i], ids, 5));
        down(hg, dp, PAGES * 4096);
        snprintf(name, sizeof(name), "blocks_zero page %zu", page_sizes[i]);
        row(name, "u8", hg, hc, KVF_DTYPE_FP8, PAGES * 4096, 0.0);
    }
    CK("zero cpu", kvf_zero_ranges(NULL, hc, offs, lens, 3));
    CK("zero gpu", kvf_zero_ranges(&gdev, dp, offs, lens, 3));
    down(hg, dp, PAGES * 4096);
    {
        int ok = memcmp(hg, hc, PAGES * 4096) == 0;
        printf("| %-28s | %-5s | %-12s | %-12s | %-7s | %s |\n", "zero_ranges", "u8",
               ok ? "0" : "bytes differ", "-", "0", ok ? "PASS" : "FAIL");
        failures += ok ? 0 : 1;
    }
    kvf_device_free(&gdev, dp);
    free(hc);
    free(hg);
}

int main(int argc, char **argv)
{
    static const kvf_dtype_t cache[3] = {KVF_DTYPE_FP32, KVF_DTYPE_BF16, KVF_DTYPE_FP16};

    setvbuf(stdout, NULL, _IOLBF, 0);
    if ((argc == 2) && (strcmp(argv[1], "--cpu-twin") == 0)) {
        /* the harness itself, with the CPU as the "device": every row must be 0 and PASS */
        gdev = kvf_device_cpu();
    } else if (argc != 1) {
        fprintf(stderr, "usage: gpu_vs_cpu [--cpu-twin]\n");
        return 2;
    } else if (!kvf_device_cuda_available() ||
        (kvf_device_init(KVF_DEVICE_CUDA, 0, &gdev) != KVF_KERN_OK)) {
        printf("skipped: no GPU (%s)\n", kvf_device_cuda_available()
                                            ? "device 0 would not initialise"
                                            : "no CUDA in this build or cudaGetDeviceCount failed");
        return 77;
    }
    printf("| %-28s | %-5s | %-12s | %-12s | %-7s | %s |\n", "op (CUDA vs CPU)", "dtype",
           "max abs diff", "d/(1+abs(c))", "tol", "result");
    printf("|------------------------------|-------|--------------|--------------|---------|"
           "--------|\n");
    check_norms();
    check_gemm();
    check_gemm_narrow(KVF_DTYPE_BF16);
    check_gemm_narrow(KVF_DTYPE_FP16);
    check_argmax();
    check_sample();
    check_elementwise();
    check_ops();
    check_moe();
    check_zeroing();
    check_stream_nccl();
    for (int i = 0; i < 3; ++i) {
        check_attention(cache[i]);
        check_attention_seqs(cache[i]);
        check_attention_big_block(cache[i]);
        check_conv(cache[i]);
        check_mamba(cache[i]);
        check_gdn(cache[i]);
        check_ssm_seqs(cache[i]);
        check_stale_nan(cache[i]);
    }
    printf("gpu_vs_cpu: %d failure(s)\n", failures);
    return failures ? 1 : 0;
}
