/*
 * TEST ONLY: gpu_vs_cpu's Mamba rows: the causal conv, the SSM scan and the batched SSM
 * decode (gpu_vs_cpu.c has the table).
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

void check_conv(kvf_dtype_t dt)
{
    enum { C = 200, KW = 4, T = 13, LD = 230 };
    float *x = frand((size_t)T * LD, -3, 3), *w = frand(C * KW, -1, 1), *b = frand(C, -1, 1);
    size_t sbytes = (size_t)C * (KW - 1) * kvf_dtype_size(dt);
    unsigned char *sc = malloc(sbytes), *sg = malloc(sbytes);
    float yc[T * C], yg[T * C];
    float *dx = up(x, (size_t)T * LD * 4), *dw = up(w, C * KW * 4), *db = up(b, C * 4);
    float *dy = up(NULL, sizeof(yc));
    void *ds = up(NULL, sbytes);
    char name[64];

    memset(sc, 0x7f, sbytes);   /* stale bytes: a fresh request must not read them */
    CK("state fill", kvf_device_memset(&gdev, ds, 0x7f, sbytes));
    for (int step = 0; step < 3; ++step) {
        int n = (step == 0) ? T : (step == 1) ? 2 : 1;
        if (step < 2) {
            CK("conv cpu", kvf_conv1d_chunk(NULL, x, LD, n, C, KW, w, b, 1, sc, dt, step, yc, C));
            CK("conv gpu", kvf_conv1d_chunk(&gdev, dx, LD, n, C, KW, dw, db, 1, ds, dt, step, dy,
                                            C));
        } else {
            CK("conv cpu", kvf_conv1d_step(NULL, x, C, KW, w, b, 1, sc, dt, yc));
            CK("conv gpu", kvf_conv1d_step(&gdev, dx, C, KW, dw, db, 1, ds, dt, dy));
        }
        down(yg, dy, (size_t)n * C * 4);
        down(sg, ds, sbytes);
        snprintf(name, sizeof(name), "conv1d %s y", (step == 0) ? "chunk fresh"
                                                    : (step == 1) ? "chunk cont." : "step");
        rowf(name, kvf_dtype_name(dt), yg, yc, (size_t)n * C, 1e-5);
        snprintf(name, sizeof(name), "conv1d %s state", (step == 0) ? "chunk fresh"
                                                        : (step == 1) ? "chunk cont." : "step");
        row(name, kvf_dtype_name(dt), sg, sc, dt, (size_t)C * (KW - 1), 0.0);
    }
    kvf_device_free(&gdev, dx);
    kvf_device_free(&gdev, dw);
    kvf_device_free(&gdev, db);
    kvf_device_free(&gdev, dy);
    kvf_device_free(&gdev, ds);
    free(x);
    free(w);
    free(b);
    free(sc);
    free(sg);
}

/* Mamba2: fresh scan, continued scan, decode step; y and state (a bf16/fp16 state rounds
 * after every token on both devices: row_narrow_state) */
/* the batched Mamba2 decode step (kvf_ssm_seqs.h): three requests at rows 2, 0, 1 of a
 * [3][R] projection, each with its own conv and SSM state (one launch each for the batch,
 * every state dtype), their dt clamps 0, 1e-3, 0; against the CPU within tolerance and
 * against the per-request GPU kernels bit for bit */
void check_ssm_seqs(kvf_dtype_t dt)
{
    enum { H = 8, P = 16, G = 2, N = 32, K = 4, S = 3 };
    const int HP = H * P, CD = HP + 2 * G * N, R = HP + CD + H + 5;   /* z | xBC | dt | pad */
    static const int rows[S] = {2, 0, 1};
    static const float dtmin[S] = {0.0f, 1e-3f, 0.0f};
    /* a prompt token's upper clamp (time_step_limit high) on the second request */
    static const float dtmax[S] = {INFINITY, 0.05f, INFINITY};
    float *xin = frand((size_t)S * R, -2, 2), *cw = frand((size_t)CD * K, -1, 1);
    float *cb = frand(CD, -1, 1), *dtb = frand(H, -1, 1), *al = frand(H, -2, 1);
    float *D = frand(H, -1, 1);
    size_t cbytes = (size_t)CD * (K - 1) * kvf_dtype_size(dt);
    size_t sbytes = (size_t)HP * N * kvf_dtype_size(dt);
    unsigned char *cc = malloc(S * cbytes), *scs = malloc(S * sbytes);
    unsigned char *cg = malloc(S * cbytes), *sg = malloc(S * sbytes);
    float *xc = calloc((size_t)S * CD, 4), *xgv = malloc((size_t)S * CD * 4);
    float *yc = calloc((size_t)S * R, 4), *yg = malloc((size_t)S * R * 4);
    float *fill = frand((S * (cbytes + sbytes)) / 2 + 1, -1, 1);

    for (size_t i = 0; i < S * cbytes / kvf_dtype_size(dt); ++i) {
        kvf_dtype_store(cc, dt, i, fill[i]);
    }
    for (size_t i = 0; i < S * sbytes / kvf_dtype_size(dt); ++i) {
        kvf_dtype_store(scs, dt, i, fill[i % ((S * (cbytes + sbytes)) / 2)] * 0.5f);
    }
    float *dxin = up(xin, (size_t)S * R * 4), *dcw = up(cw, (size_t)CD * K * 4);
    float *dcb = up(cb, CD * 4), *ddtb = up(dtb, H * 4), *dal = up(al, H * 4);
    float *dD = up(D, H * 4), *dxbc = up(xc, (size_t)S * CD * 4), *dy = up(yc, (size_t)S * R * 4);
    unsigned char *dconv = up(cc, S * cbytes), *dssm = up(scs, S * sbytes);
    void *hconv[S], *hssm[S], *dconvp[S], *dssmp[S];
    for (int i = 0; i < S; ++i) {
        hconv[i] = cc + (size_t)(S - 1 - i) * cbytes;   /* states in reverse order */
        hssm[i] = scs + (size_t)(S - 1 - i) * sbytes;
        dconvp[i] = dconv + (size_t)(S - 1 - i) * cbytes;
        dssmp[i] = dssm + (size_t)(S - 1 - i) * sbytes;
    }
    kvf_ssm_seqs_t qc = {.num_seqs = S, .rows = rows, .conv_states = hconv,
                         .ssm_states = hssm, .dt_min = dtmin, .dt_max = dtmax};
    kvf_ssm_seqs_t qg = {.num_seqs = S, .rows = rows, .conv_states = dconvp,
                         .ssm_states = dssmp, .dt_min = dtmin, .dt_max = dtmax};
    kvf_mamba2_params_t pc = {H, P, G, N, dtb, al, D, 0.0f, INFINITY};
    kvf_mamba2_params_t pg = {H, P, G, N, ddtb, dal, dD, 0.0f, INFINITY};
    /* the unbatched GPU path first, on copies of the states: the batch must give its bits */
    unsigned char *dconv1 = up(cc, S * cbytes), *dssm1 = up(scs, S * sbytes);
    float *dxbc1 = up(xc, (size_t)S * CD * 4), *dy1 = up(yc, (size_t)S * R * 4);
    for (int i = 0; i < S; ++i) {
        kvf_mamba2_params_t pi = pg;
        float *xr = dxbc1 + (size_t)rows[i] * CD;
        pi.dt_min = dtmin[i];
        pi.dt_max = dtmax[i];
        CK("ssm one seq gpu conv", kvf_conv1d_step(&gdev, dxin + (size_t)rows[i] * R + HP, CD, K,
                                                   dcw, dcb, 1,
                                                   dconv1 + (size_t)(S - 1 - i) * cbytes, dt,
                                                   xr));
        CK("ssm one seq gpu step", kvf_mamba2_step(&gdev, &pi, xr,
                                                   dxin + (size_t)rows[i] * R + HP + CD,
                                                   xr + HP, xr + HP + G * N,
                                                   dssm1 + (size_t)(S - 1 - i) * sbytes, dt,
                                                   dy1 + (size_t)rows[i] * R));
    }
    CK("ssm seqs cpu", kvf_ssm_decode_seqs(NULL, &qc, xin + HP, R, CD, K, cw, cb, dt, xc, CD,
                                           &pc, xin + HP + CD, R, dt, yc, R));
    CK("ssm seqs gpu", kvf_ssm_decode_seqs(&gdev, &qg, dxin + HP, R, CD, K, dcw, dcb, dt, dxbc,
                                           CD, &pg, dxin + HP + CD, R, dt, dy, R));
    down(xgv, dxbc, (size_t)S * CD * 4);
    down(yg, dy, (size_t)S * R * 4);
    down(cg, dconv, S * cbytes);
    down(sg, dssm, S * sbytes);
    rowf("ssm 3 seqs conv out", kvf_dtype_name(dt), xgv, xc, (size_t)S * CD, 1e-5);
    rowf("ssm 3 seqs y", kvf_dtype_name(dt), yg, yc, (size_t)S * R, 1e-4);
    row("ssm 3 seqs conv state", kvf_dtype_name(dt), cg, cc, dt,
        S * cbytes / kvf_dtype_size(dt), 0.0);
    row("ssm 3 seqs state", kvf_dtype_name(dt), sg, scs, dt, S * sbytes / kvf_dtype_size(dt),
        (dt == KVF_DTYPE_FP32) ? 1e-4 : 1e-2);
    {   /* batched = unbatched on the GPU, bit for bit (every state dtype: one launch each) */
        float *y1 = malloc((size_t)S * R * 4);
        unsigned char *s1 = malloc(S * sbytes);
        down(y1, dy1, (size_t)S * R * 4);
        down(s1, dssm1, S * sbytes);
        printf("(ssm 3 seqs, %s state: batched against per request on the GPU)\n",
               kvf_dtype_name(dt));
        row_same("ssm 3 seqs y = per request", yg, y1, (size_t)S * R * 4);
        row_same("ssm 3 seqs state = per req.", sg, s1, S * sbytes);
        free(y1);
        free(s1);
    }
    kvf_device_free(&gdev, dconv1);
    kvf_device_free(&gdev, dssm1);
    kvf_device_free(&gdev, dxbc1);
    kvf_device_free(&gdev, dy1);
    kvf_device_free(&gdev, dxin);
    kvf_device_free(&gdev, dcw);
    kvf_device_free(&gdev, dcb);
    kvf_device_free(&gdev, ddtb);
    kvf_device_free(&gdev, dal);
    kvf_device_free(&gdev, dD);
    kvf_device_free(&gdev, dxbc);
    kvf_device_free(&gdev, dy);
    kvf_device_free(&gdev, dconv);
    kvf_device_free(&gdev, dssm);
    free(xin);
    free(cw);
    free(cb);
    free(dtb);
    free(al);
    free(D);
    free(cc);
    free(scs);
    free(cg);
    free(sg);
    free(xc);
    free(xgv);
    free(yc);
    free(yg);
    free(fill);
}

void check_mamba(kvf_dtype_t dt)
{
    enum { H = 8, P = 16, G = 2, N = 32, T = 20 };
    const int HP = H * P, BC = G * N;
    float *x = frand((size_t)T * HP, -2, 2), *dtr = frand((size_t)T * H, -6, 6);
    float *B = frand((size_t)T * BC, -1, 1), *C = frand((size_t)T * BC, -1, 1);
    float *dtb = frand(H, -1, 1), *al = frand(H, -2, 1), *D = frand(H, -1, 1);
    size_t sbytes = (size_t)HP * N * kvf_dtype_size(dt);
    unsigned char *sc = malloc(sbytes), *sg = malloc(sbytes);
    float *yc = malloc((size_t)T * HP * 4), *yg = malloc((size_t)T * HP * 4);
    float *dx = up(x, (size_t)T * HP * 4), *ddt = up(dtr, (size_t)T * H * 4);
    float *dB = up(B, (size_t)T * BC * 4), *dC = up(C, (size_t)T * BC * 4);
    float *ddtb = up(dtb, H * 4), *dal = up(al, H * 4), *dD = up(D, H * 4);
    float *dy = up(NULL, (size_t)T * HP * 4);
    void *ds = up(NULL, sbytes);
    kvf_mamba2_params_t pc = {H, P, G, N, dtb, al, D, 1e-3f, 8.0f};
    kvf_mamba2_params_t pg = {H, P, G, N, ddtb, dal, dD, 1e-3f, 8.0f};
    char name[64];

    memset(sc, 0xff, sbytes);
    CK("state fill", kvf_device_memset(&gdev, ds, 0xff, sbytes));
    for (int step = 0; step < 3; ++step) {
        int n = (step == 0) ? T : (step == 1) ? 3 : 1;
        if (step < 2) {
            CK("scan cpu", kvf_mamba2_scan(NULL, &pc, n, x, HP, dtr, H, B, C, BC, sc, dt, step,
                                           yc, HP));
            CK("scan gpu", kvf_mamba2_scan(&gdev, &pg, n, dx, HP, ddt, H, dB, dC, BC, ds, dt,
                                           step, dy, HP));
        } else {
            CK("step cpu", kvf_mamba2_step(NULL, &pc, x, dtr, B, C, sc, dt, yc));
            CK("step gpu", kvf_mamba2_step(&gdev, &pg, dx, ddt, dB, dC, ds, dt, dy));
        }
        down(yg, dy, (size_t)n * HP * 4);
        down(sg, ds, sbytes);
        snprintf(name, sizeof(name), "mamba2 %s y", (step == 0) ? "scan fresh"
                                                    : (step == 1) ? "scan cont." : "step");
        if (dt == KVF_DTYPE_FP32) {
            rowf(name, kvf_dtype_name(dt), yg, yc, (size_t)n * HP, 1e-4);
        } else {
            row_narrow_state(name, kvf_dtype_name(dt), yg, yc, KVF_DTYPE_FP32, (size_t)n * HP,
                             (dt == KVF_DTYPE_BF16) ? 3e-2 : 1e-2);
        }
        snprintf(name, sizeof(name), "mamba2 %s state", (step == 0) ? "scan fresh"
                                                        : (step == 1) ? "scan cont." : "step");
        if (dt == KVF_DTYPE_FP32) {
            row(name, kvf_dtype_name(dt), sg, sc, dt, (size_t)HP * N, 1e-4);
        } else {
            row_narrow_state(name, kvf_dtype_name(dt), sg, sc, dt, (size_t)HP * N,
                             (dt == KVF_DTYPE_BF16) ? 2e-2 : 1e-2);
        }
    }
    kvf_device_free(&gdev, dx);
    kvf_device_free(&gdev, ddt);
    kvf_device_free(&gdev, dB);
    kvf_device_free(&gdev, dC);
    kvf_device_free(&gdev, ddtb);
    kvf_device_free(&gdev, dal);
    kvf_device_free(&gdev, dD);
    kvf_device_free(&gdev, dy);
    kvf_device_free(&gdev, ds);
    free(x), free(dtr), free(B), free(C), free(dtb), free(al), free(D);
    free(sc), free(sg), free(yc), free(yg);
}

/* batched block zeroing (16-byte and byte paths) and range zeroing: bytes equal */
