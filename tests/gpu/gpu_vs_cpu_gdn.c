/*
 * TEST ONLY: gpu_vs_cpu's Gated DeltaNet rows (kvf_gdn.h): the scan fresh, continued and as a
 * one-token step (y and state; a bf16 / fp16 state rounds after every token on both devices:
 * row_narrow_state), the chunked scan on grid 4 fresh and continued off the grid, the batched
 * decode step (kvf_ssm_seqs.h) of 2 requests against the per-request path, the per-head gated
 * norm and the two sigmoid gates (gpu_vs_cpu.c has the table).
 */
#include "kvf_conv1d.h"
#include "kvf_device.h"
#include "kvf_gdn.h"
#include "kvf_ssm_seqs.h"
#include "gpu_vs_cpu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { HV = 4, DV = 8, G = 2, DK = 16, T = 11, LDX = HV * DV + 2 * G * DK + 5, LDB = 2 * HV,
       HP = HV * DV, CH = HP + 2 * G * DK, K = 4 };

/* y (fp32, or a narrow state's rounding; none when ny is 0) and state rows of one comparison */
static void gdn_rows(const char *what, kvf_dtype_t dt, const float *yg, const float *yc,
                     size_t ny, const void *sg, const void *sc, size_t ns)
{
    char name[64];

    snprintf(name, sizeof(name), "%s y", what);
    if (ny == 0) {   /* a state row only */
    } else if (dt == KVF_DTYPE_FP32) {
        rowf(name, kvf_dtype_name(dt), yg, yc, ny, 1e-4);
    } else {
        row_narrow_state(name, kvf_dtype_name(dt), yg, yc, KVF_DTYPE_FP32, ny, 1e-4);
    }
    snprintf(name, sizeof(name), "%s state", what);
    if (dt == KVF_DTYPE_FP32) {
        row(name, kvf_dtype_name(dt), sg, sc, dt, ns, 1e-4);
    } else {
        row_narrow_state(name, kvf_dtype_name(dt), sg, sc, dt, ns, 1e-4);
    }
}

/* the chunked prompt scan on grid 4 (chunks 4, 4, 3 from position 0; then 3, 4 from 11) */
static void check_gdn_chunked(kvf_dtype_t dt, const kvf_gdn_params_t *pc,
                              const kvf_gdn_params_t *pg, const float *x, const float *dx,
                              const float *ba, const float *dba)
{
    const size_t sbytes = (size_t)HP * DK * kvf_dtype_size(dt);
    unsigned char *sc = malloc(sbytes), *sg = malloc(sbytes);
    float yc[T * HP], yg[T * HP];
    float *dy = up(NULL, sizeof(yc));
    void *ds = up(NULL, sbytes);

    CK("gdn chunked cpu", kvf_gdn_scan_chunked(NULL, pc, T, 0, 4, x, LDX, ba, LDB, sc, dt, 0,
                                               yc, HP));
    CK("gdn chunked gpu", kvf_gdn_scan_chunked(&gdev, pg, T, 0, 4, dx, LDX, dba, LDB, ds, dt, 0,
                                               dy, HP));
    down(yg, dy, sizeof(yg));
    down(sg, ds, sbytes);
    gdn_rows("gdn chunked g4 fresh", dt, yg, yc, (size_t)T * HP, sg, sc, (size_t)HP * DK);
    CK("gdn chunked cpu", kvf_gdn_scan_chunked(NULL, pc, 7, 11, 4, x, LDX, ba, LDB, sc, dt, 1,
                                               yc, HP));
    CK("gdn chunked gpu", kvf_gdn_scan_chunked(&gdev, pg, 7, 11, 4, dx, LDX, dba, LDB, ds, dt, 1,
                                               dy, HP));
    down(yg, dy, (size_t)7 * HP * 4);
    down(sg, ds, sbytes);
    gdn_rows("gdn chunked g4 cont.", dt, yg, yc, (size_t)7 * HP, sg, sc, (size_t)HP * DK);
    kvf_device_free(&gdev, dy);
    kvf_device_free(&gdev, ds);
    free(sc);
    free(sg);
}

/* the batched decode step (kvf_gdn_decode_seqs) of 2 requests (rows 1, 0) against the
 * per-request conv step + one-token scan on the CPU, from states of a 6-token scan */
static void check_gdn_decode(kvf_dtype_t dt, const kvf_gdn_params_t *pc,
                             const kvf_gdn_params_t *pg, const float *x, const float *dx,
                             const float *ba, const float *dba)
{
    const size_t sbytes = (size_t)HP * DK * kvf_dtype_size(dt), cbytes = (size_t)CH * (K - 1) * 4;
    float *w = frand((size_t)CH * K, -0.5f, 0.5f), *dw = up(w, (size_t)CH * K * 4);
    float yc[2 * HP], yg[2 * HP], xc[2 * LDX], yt[6 * HP];   /* yt: the 6-token scan's rows */
    float *dxbc = up(NULL, sizeof(xc)), *dy = up(NULL, sizeof(yg));
    unsigned char *sc[2], *sg[2];
    float *cc[2];
    void *ds[2], *dc[2];
    const int rows[2] = {1, 0};
    const float dmin[2] = {0, 0}, dmax[2] = {0, 0};

    for (int q = 0; q < 2; ++q) {
        sc[q] = malloc(sbytes);
        sg[q] = malloc(sbytes);
        cc[q] = frand((size_t)CH * (K - 1), -1, 1);
        ds[q] = up(NULL, sbytes);
        dc[q] = up(cc[q], cbytes);
        CK("gdn decode state", kvf_gdn_scan(NULL, pc, 6, x + (size_t)q * LDX, LDX,
                                            ba + (size_t)q * LDB, LDB, sc[q], dt, 0, yt, HP));
        CK("gdn decode state up", kvf_device_memcpy(&gdev, ds[q], sc[q], sbytes, KVF_COPY_H2D));
    }
    /* the inputs: rows 0, 1 of x as the conv inputs (channels CH), of ba as b | a */
    for (int q = 0; q < 2; ++q) {
        const int r = rows[q];
        CK("gdn decode conv cpu", kvf_conv1d_step(NULL, x + (size_t)r * LDX, CH, K, w, NULL, 1,
                                                  cc[q], KVF_DTYPE_FP32, xc + (size_t)r * LDX));
        CK("gdn decode cpu", kvf_gdn_scan(NULL, pc, 1, xc + (size_t)r * LDX, LDX,
                                          ba + (size_t)r * LDB, LDB, sc[q], dt, 1,
                                          yc + (size_t)r * HP, HP));
    }
    const kvf_ssm_seqs_t seqs = {2, rows, dc, ds, dmin, dmax, NULL};
    CK("gdn decode gpu", kvf_gdn_decode_seqs(&gdev, &seqs, dx, LDX, CH, K, dw, KVF_DTYPE_FP32,
                                             dxbc, LDX, pg, dba, LDB, dt, dy, HP));
    down(yg, dy, sizeof(yg));
    for (int q = 0; q < 2; ++q) {
        down(sg[q], ds[q], sbytes);
    }
    gdn_rows("gdn decode 2 seqs", dt, yg, yc, 2 * HP, sg[0], sc[0], (size_t)HP * DK);
    gdn_rows("gdn decode seq 2", dt, yg, yc, 0, sg[1], sc[1], (size_t)HP * DK);
    for (int q = 0; q < 2; ++q) {
        kvf_device_free(&gdev, ds[q]);
        kvf_device_free(&gdev, dc[q]);
        free(sc[q]);
        free(sg[q]);
        free(cc[q]);
    }
    kvf_device_free(&gdev, dw);
    kvf_device_free(&gdev, dxbc);
    kvf_device_free(&gdev, dy);
    free(w);
}

void check_gdn(kvf_dtype_t dt)
{
    /* 4 value heads of 8 over 2 key heads of 16: the conv output v | k | q, then b | a */
    float *x = frand((size_t)T * LDX, -2, 2), *ba = frand((size_t)T * LDB, -3, 3);
    float *dtb = frand(HV, -1, 1), *alog = frand(HV, -1, 2);
    const size_t sbytes = (size_t)HP * DK * kvf_dtype_size(dt);
    unsigned char *sc = malloc(sbytes), *sg = malloc(sbytes);
    float yc[T * HP], yg[T * HP];
    float *dx = up(x, (size_t)T * LDX * 4), *dba = up(ba, (size_t)T * LDB * 4);
    float *dy = up(NULL, sizeof(yc));
    void *ds = up(NULL, sbytes);
    kvf_gdn_params_t pc = {.heads = HV, .head_dim = DV, .groups = G, .key_dim = DK,
                           .dt_bias = dtb, .A_log = alog};
    kvf_gdn_params_t pg = pc;
    char name[64];

    pg.dt_bias = up(dtb, HV * 4);
    pg.A_log = up(alog, HV * 4);
    memset(sc, 0x7f, sbytes);   /* stale bytes: a fresh request must not read them */
    CK("state fill", kvf_device_memset(&gdev, ds, 0x7f, sbytes));
    for (int step = 0; step < 3; ++step) {
        const int n = (step == 0) ? 8 : (step == 1) ? 2 : 1, t0 = (step == 0) ? 0 : 8 + step;
        const size_t off = (size_t)t0 * LDX, boff = (size_t)t0 * LDB;
        CK("gdn cpu", kvf_gdn_scan(NULL, &pc, n, x + off, LDX, ba + boff, LDB, sc, dt, step > 0,
                                   yc, HP));
        CK("gdn gpu", kvf_gdn_scan(&gdev, &pg, n, dx + off, LDX, dba + boff, LDB, ds, dt,
                                   step > 0, dy, HP));
        down(yg, dy, (size_t)n * HP * 4);
        down(sg, ds, sbytes);
        snprintf(name, sizeof(name), "gdn %s y", (step == 0) ? "fresh" : (step == 1) ?
                 "cont." : "step");
        if (dt == KVF_DTYPE_FP32) {
            rowf(name, kvf_dtype_name(dt), yg, yc, (size_t)n * HP, 1e-4);
        } else {
            row_narrow_state(name, kvf_dtype_name(dt), yg, yc, KVF_DTYPE_FP32, (size_t)n * HP,
                             1e-4);
        }
        snprintf(name, sizeof(name), "gdn %s state", (step == 0) ? "fresh" : (step == 1) ?
                 "cont." : "step");
        if (dt == KVF_DTYPE_FP32) {
            row(name, kvf_dtype_name(dt), sg, sc, dt, (size_t)HP * DK, 1e-4);
        } else {
            row_narrow_state(name, kvf_dtype_name(dt), sg, sc, dt, (size_t)HP * DK, 1e-4);
        }
    }
    check_gdn_chunked(dt, &pc, &pg, x, dx, ba, dba);
    check_gdn_decode(dt, &pc, &pg, x, dx, ba, dba);
    if (dt == KVF_DTYPE_FP32) {   /* the dtype-free ones once */
        float *z = frand((size_t)T * HP, -3, 3), *w = frand(DV, 0.5f, 1.5f);
        float oc[T * HP], og[T * HP], gc[T * HP], gg[T * HP];
        float *dz = up(z, sizeof(oc)), *dw = up(w, DV * 4), *dout = up(NULL, sizeof(oc));
        float *dyc = up(yc, HP * 4);   /* the same input on both devices */
        CK("gdn norm cpu", kvf_gdn_gated_norm(NULL, yc, HP, z, HP, w, 1, HV, DV, 1e-6f, oc, HP));
        CK("gdn norm gpu", kvf_gdn_gated_norm(&gdev, dyc, HP, dz, HP, dw, 1, HV, DV, 1e-6f, dout,
                                              HP));
        kvf_device_free(&gdev, dyc);
        down(og, dout, HP * 4);
        rowf("gdn gated norm", "fp32", og, oc, HP, 1e-5);
        memcpy(gc, z, sizeof(gc));
        CK("sigmoid gate cpu", kvf_sigmoid_gate(NULL, gc, HP, x, LDX, T, HP));
        CK("sigmoid gate gpu", kvf_sigmoid_gate(&gdev, dz, HP, dx, LDX, T, HP));
        down(gg, dz, sizeof(gg));
        rowf("sigmoid gate", "fp32", gg, gc, (size_t)T * HP, 1e-6);
        CK("row scale cpu", kvf_sigmoid_row_scale(NULL, gc, HP, ba, T, HP));
        CK("row scale gpu", kvf_sigmoid_row_scale(&gdev, dz, HP, dba, T, HP));
        down(gg, dz, sizeof(gg));
        rowf("sigmoid row scale", "fp32", gg, gc, (size_t)T * HP, 1e-6);
        kvf_device_free(&gdev, dz);
        kvf_device_free(&gdev, dw);
        kvf_device_free(&gdev, dout);
        free(z);
        free(w);
    }
    kvf_device_free(&gdev, dx);
    kvf_device_free(&gdev, dba);
    kvf_device_free(&gdev, dy);
    kvf_device_free(&gdev, ds);
    kvf_device_free(&gdev, (void *)pg.dt_bias);
    kvf_device_free(&gdev, (void *)pg.A_log);
    free(x);
    free(ba);
    free(dtb);
    free(alog);
    free(sc);
    free(sg);
}
