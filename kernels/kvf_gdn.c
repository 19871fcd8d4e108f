/*
 * Gated DeltaNet kernels on the CPU (kvf_gdn.h). One thread: the recurrence is
 * per head and per token; a decode step touches heads * head_dim * key_dim floats.
 */
#include "kvf_gdn.h"
#include "kvf_kern_internal.h"

#include <math.h>
#include <stdlib.h>

/* torch's softplus (beta 1, threshold 20). */
static float kvf_gdn_softplus(float v)
{
    return (v > 20.0f) ? v : log1pf(expf(v));
}

/* x / sqrt(sum x^2 + 1e-6) * scale into out[n] (FLA's l2norm, as transformers). */
static void kvf_gdn_l2norm(const float *x, int n, float scale, float *out)
{
    float ss = 0.0f;
    for (int i = 0; i < n; ++i) {
        ss += x[i] * x[i];
    }
    float inv = 1.0f / sqrtf(ss + 1e-6f);
    for (int i = 0; i < n; ++i) {
        out[i] = x[i] * inv * scale;
    }
}

/* One token of one head on the fp32 state S [dv][dk]: the recurrence of kvf_gdn.h. */
static void kvf_gdn_token(float *S, int dv, int dk, const float *q, const float *k,
                          const float *v, float decay, float beta, float *y)
{
    for (int j = 0; j < dv; ++j) {
        float *row = S + (size_t)j * (size_t)dk;
        float mem = 0.0f, out = 0.0f, delta;
        for (int i = 0; i < dk; ++i) {
            row[i] *= decay;
            mem += row[i] * k[i];
        }
        delta = (v[j] - mem) * beta;
        for (int i = 0; i < dk; ++i) {
            row[i] += k[i] * delta;
            out += row[i] * q[i];
        }
        y[j] = out;
    }
}

int kvf_gdn_scan(const kvf_device_t *dev, const kvf_gdn_params_t *p, int T, const float *xbc,
                 int ldx, const float *ba, int ldba, void *state, kvf_dtype_t state_dtype,
                 int has_state, float *y, int ldy)
{
    if ((p == NULL) || (p->heads < 1) || (p->head_dim < 1) || (p->groups < 1) ||
        (p->key_dim < 1) || (p->key_dim > 1024) || (p->heads % p->groups != 0) || (T < 0) ||
        (state == NULL) || (p->A_log == NULL) || (p->dt_bias == NULL) ||
        ((state_dtype != KVF_DTYPE_FP32) && (state_dtype != KVF_DTYPE_BF16) &&
         (state_dtype != KVF_DTYPE_FP16))) {
        return KVF_KERN_EINVAL;
    }
    if (!kvf_kern_on_cpu(dev)) {
        return KVF_KERN_EUNSUPPORTED;
    }
    if (T == 0) {
        return KVF_KERN_OK;
    }
    if ((xbc == NULL) || (ba == NULL) || (y == NULL) || (ldy < p->heads * p->head_dim) ||
        (ldba < 2 * p->heads) || (ldx < p->heads * p->head_dim + 2 * p->groups * p->key_dim)) {
        return KVF_KERN_EINVAL;
    }
    const int dv = p->head_dim, dk = p->key_dim, per = p->heads / p->groups;
    const size_t n = (size_t)dv * (size_t)dk;
    const float qscale = 1.0f / sqrtf((float)dk);
    float q[1024], k[1024];
    float *S = malloc(n * sizeof(float));

    if (S == NULL) {
        return KVF_KERN_ENOMEM;
    }
    for (int h = 0; h < p->heads; ++h) {
        const size_t base = (size_t)h * n;
        const int g = h / per;
        const float A = expf(p->A_log[h]);
        for (size_t e = 0; e < n; ++e) {
            S[e] = has_state ? kvf_dtype_load(state, state_dtype, base + e) : 0.0f;
        }
        for (int t = 0; t < T; ++t) {
            const float *row = xbc + (size_t)t * (size_t)ldx;
            const float *kin = row + p->heads * dv + g * dk;
            const float *qin = row + p->heads * dv + p->groups * dk + g * dk;
            const float *brow = ba + (size_t)t * (size_t)ldba;
            const float decay = expf(-A * kvf_gdn_softplus(brow[p->heads + h] + p->dt_bias[h]));
            const float beta = 1.0f / (1.0f + expf(-brow[h]));
            kvf_gdn_l2norm(qin, dk, qscale, q);
            kvf_gdn_l2norm(kin, dk, 1.0f, k);
            kvf_gdn_token(S, dv, dk, q, k, row + h * dv, decay, beta,
                          y + (size_t)t * (size_t)ldy + h * dv);
            for (size_t e = 0; (state_dtype != KVF_DTYPE_FP32) && (e < n); ++e) {
                kvf_dtype_store(state, state_dtype, base + e, S[e]);   /* rounded per token */
                S[e] = kvf_dtype_load(state, state_dtype, base + e);
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
        return KVF_KERN_EUNSUPPORTED;
    }
    for (int t = 0; t < T; ++t) {
        for (int h = 0; h < heads; ++h) {
            const float *yr = y + (size_t)t * (size_t)ldy + h * head_dim;
            const float *zr = z + (size_t)t * (size_t)ldz + h * head_dim;
            float *o = out + (size_t)t * (size_t)ldo + h * head_dim;
            float ss = 0.0f;
            for (int j = 0; j < head_dim; ++j) {
                ss += yr[j] * yr[j];
            }
            const float inv = 1.0f / sqrtf(ss / (float)head_dim + eps);
            for (int j = 0; j < head_dim; ++j) {
                const float zs = zr[j] / (1.0f + expf(-zr[j]));   /* silu(z) */
                o[j] = w[j] * (yr[j] * inv) * zs;
            }
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
        return KVF_KERN_EUNSUPPORTED;
    }
    for (int t = 0; t < T; ++t) {
        float *xr = x + (size_t)t * (size_t)ldx;
        const float *gr = gate + (size_t)t * (size_t)ldg;
        for (int i = 0; i < n; ++i) {
            xr[i] *= 1.0f / (1.0f + expf(-gr[i]));
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
        return KVF_KERN_EUNSUPPORTED;
    }
    for (int t = 0; t < T; ++t) {
        float *xr = x + (size_t)t * (size_t)ldx;
        const float sg = 1.0f / (1.0f + expf(-g[t]));
        for (int i = 0; i < n; ++i) {
            xr[i] *= sg;
        }
    }
    return KVF_KERN_OK;
}
