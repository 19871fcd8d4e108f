/*
 * TEST ONLY (kvf-devsim, kvf_devsim.c): the batched Mamba2 decode step's CUDA body checked on
 * the simulated GPU against the unbatched path, with the engine's own data. Before each
 * kvf_ssm_decode_seqs call on a simulated GPU (which then runs the CPU's per-request path as
 * usual), both are run on copies of the requests' conv and SSM states: the per-request calls
 * (kvf_conv1d_step, kvf_mamba2_step on the CPU) and the CUDA kernel's rows
 * (kvf_ssm_seqs_cuda.cu: kvf_mamba2_row_hd for an fp32 state, kvf_mamba2_row_state_hd in
 * place for a narrow one, one (request, head, head-dim) row at a time); y and every state
 * byte must be equal:
 *   ssm_seqs_checked C ssm_seqs_narrow N ssm_seqs_mismatches M
 * and likewise the batched Gated DeltaNet decode step (kvf_gdn_decode_seqs: kvf_gdn_row_hd
 * for an fp32 state, kvf_gdn_row_state_hd in place for a narrow one) against the per-request
 * kvf_conv1d_step + one-token kvf_gdn_scan:
 *   gdn_seqs_checked C gdn_seqs_narrow N gdn_seqs_mismatches M
 */
#include "kvf_devsim_ssd.h"
#include "kvf_conv1d.h"
#include "kvf_dtype.h"
#include "kvf_dtype_math.h"
#include "kvf_kern.h"
#include "kvf_gdn.h"
#include "kvf_gdn_math.h"
#include "kvf_ssm_math.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static pthread_mutex_t ssm_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned long long ssm_checked, ssm_narrow, ssm_mismatch;
static unsigned long long gdn_checked, gdn_narrow, gdn_mismatch;

/* The kernel's rows of request q (row r) on state @a S, from its conv output @a xr. */
static void ssm_body(const kvf_mamba2_params_t *p, const float *xr, const float *dtr,
                     float dmin, float dmax, void *S, int dtype, float *y)
{
    const size_t hd = (size_t)p->head_dim, ns = (size_t)p->state_size;
    const size_t rows = (size_t)p->heads * hd;

    for (size_t j = 0; j < rows; ++j) {
        const size_t h = j / hd, g = h / (size_t)(p->heads / p->groups);
        const float *Bg = xr + rows + g * ns, *Cg = xr + rows + (size_t)p->groups * ns + g * ns;
        float dth = kvf_mamba2_dt_hd(dtr[h], (p->dt_bias != NULL) ? p->dt_bias[h] : 0.0f, dmin,
                                     dmax);
        float dA = kvf_mamba2_dA_hd(dth, kvf_mamba2_A_hd(p->A_log[h]));
        float acc = (dtype == KVF_HD_FP32) ?
                        kvf_mamba2_row_hd((float *)S + j * ns, ns, dA, dth * xr[j], Bg, Cg) :
                        kvf_mamba2_row_state_hd(S, dtype, j * ns, ns, dA, dth * xr[j], Bg, Cg);
        y[j] = kvf_mamba2_out_hd(acc, (p->D != NULL) ? p->D[h] : 0.0f, xr[j]);
    }
}

void devsim_ssm_seqs_twin(const kvf_ssm_seqs_t *s, const float *x_in, int ld_in, int channels,
                          int kernel, const float *conv_w, const float *conv_b,
                          kvf_dtype_t conv_dtype, const kvf_mamba2_params_t *p, const float *dt,
                          int lddt, kvf_dtype_t ssm_dtype)
{
    const size_t rows = (size_t)p->heads * (size_t)p->head_dim;
    const size_t sb = rows * (size_t)p->state_size * kvf_dtype_size(ssm_dtype);
    const size_t cb = (size_t)channels * (size_t)(kernel - 1) * kvf_dtype_size(conv_dtype);
    uint8_t *sa = malloc(sb), *sp = malloc(sb), *ca = malloc(cb), *cp = malloc(cb);
    float *xa = malloc((size_t)channels * 4), *ya = malloc(rows * 4), *yp = malloc(rows * 4);
    const kvf_device_t cpu = kvf_device_cpu();
    int bad = 0;

    if ((sa == NULL) || (sp == NULL) || (ca == NULL) || (cp == NULL) || (xa == NULL) ||
        (ya == NULL) || (yp == NULL)) {
        abort();   /* test binary: out of memory */
    }
    for (int q = 0; q < s->num_seqs; ++q) {
        const size_t r = (size_t)s->rows[q];
        kvf_mamba2_params_t pq = *p;
        pq.dt_min = s->dt_min[q];
        pq.dt_max = s->dt_max[q];
        memcpy(sa, s->ssm_states[q], sb);
        memcpy(sp, s->ssm_states[q], sb);
        memcpy(ca, s->conv_states[q], cb);
        memcpy(cp, s->conv_states[q], cb);
        /* unbatched: the per-request calls (they write their conv output in place: xa) */
        if ((kvf_conv1d_step(&cpu, x_in + r * (size_t)ld_in, channels, kernel, conv_w, conv_b, 1,
                             cp, conv_dtype, xa) != KVF_KERN_OK) ||
            (kvf_mamba2_step(&cpu, &pq, xa, dt + r * (size_t)lddt, xa + rows,
                             xa + rows + (size_t)p->groups * p->state_size, sp, ssm_dtype,
                             yp) != KVF_KERN_OK)) {
            bad++;
            continue;
        }
        /* batched: the kernel's rows on the same conv output */
        ssm_body(p, xa, dt + r * (size_t)lddt, s->dt_min[q], s->dt_max[q], sa, (int)ssm_dtype,
                 ya);
        bad += (memcmp(ya, yp, rows * 4) != 0) || (memcmp(sa, sp, sb) != 0);
    }
    pthread_mutex_lock(&ssm_lock);
    ssm_checked++;
    ssm_narrow += (ssm_dtype != KVF_DTYPE_FP32);
    if ((bad > 0) && (ssm_mismatch++ < 4)) {
        fprintf(stderr, "devsim: kvf_ssm_decode_seqs: the batched body differs from the "
                "per-request path for %d of %d requests (%s state)\n", bad, s->num_seqs,
                kvf_dtype_name(ssm_dtype));
    }
    pthread_mutex_unlock(&ssm_lock);
    free(sa);
    free(sp);
    free(ca);
    free(cp);
    free(xa);
    free(ya);
    free(yp);
}

/* The GDN kernel's rows of one request on state @a S, from its conv output @a xr. */
static void gdn_body(const kvf_gdn_params_t *p, const float *xr, const float *brow, void *S,
                     int dtype, float *y)
{
    const size_t dv = (size_t)p->head_dim, dk = (size_t)p->key_dim, rows = (size_t)p->heads * dv;
    const float qscale = 1.0f / sqrtf((float)p->key_dim);

    for (size_t j = 0; j < rows; ++j) {
        const size_t h = j / dv, g = h / (size_t)(p->heads / p->groups);
        const float *kin = xr + rows + g * dk, *qin = xr + rows + (size_t)p->groups * dk + g * dk;
        const float decay = kvf_gdn_decay_hd(p->A_log[h], brow[p->heads + h], p->dt_bias[h]);
        const float beta = kvf_gdn_sigmoid_hd(brow[h]);
        const float qinv = kvf_gdn_inv_l2_hd(qin, p->key_dim);
        const float kinv = kvf_gdn_inv_l2_hd(kin, p->key_dim);
        y[j] = (dtype == KVF_HD_FP32) ?
                   kvf_gdn_row_hd((float *)S + j * dk, 1, p->key_dim, qin, qinv, qscale, kin,
                                  kinv, xr[j], decay, beta) :
                   kvf_gdn_row_state_hd(S, dtype, j * dk, p->key_dim, qin, qinv, qscale, kin,
                                        kinv, xr[j], decay, beta);
    }
}

void devsim_gdn_twin(const kvf_ssm_seqs_t *s, const float *x_in, int ld_in, int channels,
                     int kernel, const float *conv_w, kvf_dtype_t conv_dtype,
                     const kvf_gdn_params_t *p, const float *ba, int ldba,
                     kvf_dtype_t ssm_dtype)
{
    if ((s == NULL) || (s->num_seqs < 1) || (p == NULL) || (p->A_log == NULL) ||
        (p->dt_bias == NULL) || (p->groups < 1) || (p->heads % p->groups != 0) ||
        (x_in == NULL) || (ba == NULL) || (kernel < 2) || (conv_w == NULL)) {
        return;   /* the real call refuses these */
    }
    const size_t rows = (size_t)p->heads * (size_t)p->head_dim;
    const size_t sb = rows * (size_t)p->key_dim * kvf_dtype_size(ssm_dtype);
    const size_t cb = (size_t)channels * (size_t)(kernel - 1) * kvf_dtype_size(conv_dtype);
    uint8_t *sa = malloc(sb), *sp = malloc(sb), *cp = malloc(cb);
    float *xa = malloc((size_t)channels * 4), *ya = malloc(rows * 4), *yp = malloc(rows * 4);
    const kvf_device_t cpu = kvf_device_cpu();
    int bad = 0;

    if ((sa == NULL) || (sp == NULL) || (cp == NULL) || (xa == NULL) || (ya == NULL) ||
        (yp == NULL)) {
        abort();   /* test binary: out of memory */
    }
    for (int q = 0; q < s->num_seqs; ++q) {
        const size_t r = (size_t)s->rows[q];
        memcpy(sa, s->ssm_states[q], sb);
        memcpy(sp, s->ssm_states[q], sb);
        memcpy(cp, s->conv_states[q], cb);
        if ((kvf_conv1d_step(&cpu, x_in + r * (size_t)ld_in, channels, kernel, conv_w, NULL, 1,
                             cp, conv_dtype, xa) != KVF_KERN_OK) ||
            (kvf_gdn_scan(&cpu, p, 1, xa, channels, ba + r * (size_t)ldba, ldba, sp, ssm_dtype,
                          1, yp, (int)rows) != KVF_KERN_OK)) {
            bad++;
            continue;
        }
        gdn_body(p, xa, ba + r * (size_t)ldba, sa, (int)ssm_dtype, ya);
        bad += (memcmp(ya, yp, rows * 4) != 0) || (memcmp(sa, sp, sb) != 0);
    }
    pthread_mutex_lock(&ssm_lock);
    gdn_checked++;
    gdn_narrow += (ssm_dtype != KVF_DTYPE_FP32);
    if ((bad > 0) && (gdn_mismatch++ < 4)) {
        fprintf(stderr, "devsim: kvf_gdn_decode_seqs: the batched body differs from the "
                "per-request path for %d of %d requests (%s state)\n", bad, s->num_seqs,
                kvf_dtype_name(ssm_dtype));
    }
    pthread_mutex_unlock(&ssm_lock);
    free(sa);
    free(sp);
    free(cp);
    free(xa);
    free(ya);
    free(yp);
}

void devsim_ssm_report(FILE *f)
{
    pthread_mutex_lock(&ssm_lock);
    fprintf(f, " ssm_seqs_checked %llu ssm_seqs_narrow %llu ssm_seqs_mismatches %llu",
            ssm_checked, ssm_narrow, ssm_mismatch);
    fprintf(f, " gdn_seqs_checked %llu gdn_seqs_narrow %llu gdn_seqs_mismatches %llu",
            gdn_checked, gdn_narrow, gdn_mismatch);
    pthread_mutex_unlock(&ssm_lock);
}
