/*
 * Gated DeltaNet kernels (kvf_gdn.h): the CPU versions, one thread (the recurrence is per
 * head and per token; a decode step touches heads * head_dim * key_dim floats), on the
 * shared bodies of kvf_gdn_math.h; a CUDA device goes to kvf_gdn_cuda.cu.
 */
#include "kvf_gdn.h"
#include "kvf_gdn_math.h"
#include "kvf_kern_internal.h"
#ifdef KVF_HAVE_CUDA
#include "kvf_device_cuda.h"
#endif

#include <math.h>
#include <stdlib.h>

bool kvf_gdn_args_bad(const kvf_gdn_params_t *p, int T, const float *xbc, int ldx,
                      const float *ba, int ldba, const void *state, kvf_dtype_t state_dtype,
                      const float *y, int ldy)
{
    if ((p == NULL) || (p->heads < 1) || (p->head_dim < 1) || (p->groups < 1) ||
        (p->key_dim < 1) || (p->key_dim > 1024) || (p->heads % p->groups != 0) || (T < 0) ||
        (state == NULL) || (p->A_log == NULL) || (p->dt_bias == NULL) ||
        ((state_dtype != KVF_DTYPE_FP32) && (state_dtype != KVF_DTYPE_BF16) &&
         (state_dtype != KVF_DTYPE_FP16))) {
        return true;
    }
    return (T > 0) &&
           ((xbc == NULL) || (ba == NULL) || (y == NULL) || (ldy < p->heads * p->head_dim) ||
            (ldba < 2 * p->heads) || (ldx < p->heads * p->head_dim + 2 * p->groups * p->key_dim));
}

int kvf_gdn_scan(const kvf_device_t *dev, const kvf_gdn_params_t *p, int T, const float *xbc,
                 int ldx, const float *ba, int ldba, void *state, kvf_dtype_t state_dtype,
                 int has_state, float *y, int ldy)
{
    if (kvf_gdn_args_bad(p, T, xbc, ldx, ba, ldba, state, state_dtype, y, ldy)) {
        return KVF_KERN_EINVAL;
    }
    if (T == 0) {
        return KVF_KERN_OK;
    }
    if (!kvf_kern_on_cpu(dev)) {
#ifdef KVF_HAVE_CUDA
        return kvf_cuda_gdn_scan(dev, p, T, xbc, ldx, ba, ldba, state, state_dtype, has_state,
                                 y, ldy);
#else
        return KVF_KERN_EUNSUPPORTED;
#endif
    }
    const int dv = p->head_dim, dk = p->key_dim, per = p->heads / p->groups;
    const size_t n = (size_t)dv * (size_t)dk;
    const float qscale = 1.0f / sqrtf((float)dk);
    float *S = malloc(n * sizeof(float));

    if (S == NULL) {
        return KVF_KERN_ENOMEM;
    }
    for (int h = 0; h < p->heads; ++h) {
        const size_t base = (size_t)h * n;
        const int g = h / per;
        for (size_t e = 0; e < n; ++e) {
            S[e] = has_state ? kvf_dtype_load(state, state_dtype, base + e) : 0.0f;
        }
        for (int t = 0; t < T; ++t) {
            const float *row = xbc + (size_t)t * (size_t)ldx;
            const float *kin = row + p->heads * dv + g * dk;
            const float *qin = row + p->heads * dv + p->groups * dk + g * dk;
            const float *brow = ba + (size_t)t * (size_t)ldba;
            const float decay = kvf_gdn_decay_hd(p->A_log[h], brow[p->heads + h], p->dt_bias[h]);
            const float beta = kvf_gdn_sigmoid_hd(brow[h]);
            const float qinv = kvf_gdn_inv_l2_hd(qin, dk), kinv = kvf_gdn_inv_l2_hd(kin, dk);
            float *yt = y + (size_t)t * (size_t)ldy + h * dv;
            for (int j = 0; j < dv; ++j) {
                yt[j] = kvf_gdn_row_hd(S + (size_t)j * (size_t)dk, 1, dk, qin, qinv, qscale, kin,
                                       kinv, row[h * dv + j], decay, beta);
            }
            for (size_t e = 0; (state_dtype != KVF_DTYPE_FP32) && (e < n); ++e) {
                S[e] = kvf_hd_round(S[e], (int)state_dtype);   /* rounded per token */
            }
        }
        for (size_t e = 0; e < n; ++e) {
            kvf_dtype_store(state, state_dtype, base + e, S[e]);
        }
    }
    free(S);
    return KVF_KERN_OK;
}

int kvf_gdn_gated_norm(const kvf_device_t *dev, const float *y, int ldy, const float *z,
                       int ldz, const float *w, int T, int heads, int head_dim, float eps,
                       float *out, int ldo)
{
    if ((y == NULL) || (z == NULL) || (w == NULL) || (out == NULL) || (T < 0) || (heads < 1) ||
        (head_dim < 1) || (ldy < heads * head_dim) || (ldz < heads * head_dim) ||
        (ldo < heads * head_dim)) {
        return KVF_KERN_EINVAL;
    }
    if (!kvf_kern_on_cpu(dev)) {
#ifdef KVF_HAVE_CUDA
        return kvf_cuda_gdn_gated_norm(dev, y, ldy, z, ldz, w, T, heads, head_dim, eps, out, ldo);
#else
        return KVF_KERN_EUNSUPPORTED;
#endif
    }
    for (int t = 0; t < T; ++t) {
        for (int h = 0; h < heads; ++h) {
            const size_t c = (size_t)h * (size_t)head_dim;
            kvf_gdn_gated_norm_row_hd(y + (size_t)t * (size_t)ldy + c,
                                      z + (size_t)t * (size_t)ldz + c, w, head_dim, eps,
                                      out + (size_t)t * (size_t)ldo + c);
        }
    }
    return KVF_KERN_OK;
}

int kvf_sigmoid_gate(const kvf_device_t *dev, float *x, int ldx, const float *gate, int ldg,
                     int T, int n)
{
    if ((x == NULL) || (gate == NULL) || (T < 0) || (n < 0) || (ldx < n) || (ldg < n)) {
        return KVF_KERN_EINVAL;
    }
    if (!kvf_kern_on_cpu(dev)) {
#ifdef KVF_HAVE_CUDA
        return kvf_cuda_sigmoid_gate(dev, x, ldx, gate, ldg, T, n);
#else
        return KVF_KERN_EUNSUPPORTED;
#endif
    }
    for (int t = 0; t < T; ++t) {
        float *xr = x + (size_t)t * (size_t)ldx;
        const float *gr = gate + (size_t)t * (size_t)ldg;
        for (int i = 0; i < n; ++i) {
            xr[i] *= kvf_gdn_sigmoid_hd(gr[i]);
        }
    }
    return KVF_KERN_OK;
}

int kvf_sigmoid_row_scale(const kvf_device_t *dev, float *x, int ldx, const float *g, int T,
                          int n)
{
    if ((x == NULL) || (g == NULL) || (T < 0) || (n < 0) || (ldx < n)) {
        return KVF_KERN_EINVAL;
    }
    if (!kvf_kern_on_cpu(dev)) {
#ifdef KVF_HAVE_CUDA
        return kvf_cuda_sigmoid_row_scale(dev, x, ldx, g, T, n);
#else
        return KVF_KERN_EUNSUPPORTED;
#endif
    }
    for (int t = 0; t < T; ++t) {
        float *xr = x + (size_t)t * (size_t)ldx;
        const float sg = kvf_gdn_sigmoid_hd(g[t]);
        for (int i = 0; i < n; ++i) {
            xr[i] *= sg;
        }
    }
    return KVF_KERN_OK;
}
