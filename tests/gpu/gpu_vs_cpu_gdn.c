/*
 * TEST ONLY: gpu_vs_cpu's Gated DeltaNet rows (kvf_gdn.h): the scan fresh, continued and as a
 * one-token step (y and state; a bf16 / fp16 state rounds after every token on both devices:
 * row_narrow_state), the per-head gated norm and the two sigmoid gates (gpu_vs_cpu.c has the
 * table).
 */
#include "kvf_device.h"
#include "kvf_gdn.h"
#include "gpu_vs_cpu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void check_gdn(kvf_dtype_t dt)
{
    /* 4 value heads of 8 over 2 key heads of 16: the conv output v | k | q, then b | a */
    enum { HV = 4, DV = 8, G = 2, DK = 16, T = 11, LDX = HV * DV + 2 * G * DK + 5,
           LDB = 2 * HV, HP = HV * DV };
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
