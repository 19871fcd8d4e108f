/*
 * Mamba2 selective scan (SSD) as a sequential recurrence, fp32.
 *
 * Design: HF's torch_forward evaluates a prompt with the chunked SSD
 * algorithm and a decode token with the one-step recurrence; both compute
 * the same linear recurrence, so the CPU version runs the recurrence token
 * by token (O(T * heads * head_dim * state)), which is exact up to fp32
 * rounding order and trivially matches the decode step. Each head's state
 * is loaded to fp32 once per chunk, advanced T tokens, stored once; the
 * decode step updates the stored state element by element, so a bf16 state
 * rounds once per token in both paths. A fresh request starts from zero and
 * never reads the stored bytes (Mamba pages are recycled without zeroing).
 */
#include "kvf_mamba2.h"
#include "kvf_kern_internal.h"
#include "kvf_ssm_math.h"
#ifdef KVF_HAVE_CUDA
#include "kvf_device_cuda.h"
#endif

#include <math.h>
#include <stdlib.h>

static int kvf_mamba2_check(const kvf_mamba2_params_t *p, const void *state,
                            kvf_dtype_t state_dtype)
{
    if ((p == NULL) || (p->heads <= 0) || (p->head_dim <= 0) || (p->groups <= 0) ||
        (p->state_size <= 0) || ((p->heads % p->groups) != 0) || (p->A_log == NULL) ||
        !(p->dt_max >= p->dt_min) || (state == NULL) || !kvf_kern_cache_dtype_ok(state_dtype)) {
        return KVF_KERN_EINVAL;
    }
    return KVF_KERN_OK;
}

/* clamp(softplus(raw + bias)) of head @a h (kvf_ssm_math.h) */
static inline float kvf_mamba2_dt(const kvf_mamba2_params_t *p, int h, float raw)
{
    return kvf_mamba2_dt_hd(raw, (p->dt_bias != NULL) ? p->dt_bias[h] : 0.0f, p->dt_min,
                            p->dt_max);
}

int kvf_mamba2_scan(const kvf_device_t *dev, const kvf_mamba2_params_t *p, int T,
                    const float *x, int ldx, const float *dt, int lddt, const float *B,
                    const float *C, int ldbc, void *state, kvf_dtype_t state_dtype,
                    int has_state, float *y, int ldy)
{
    size_t hd, ns, per_head;
    float *S;

    if ((T < 0) || (kvf_mamba2_check(p, state, state_dtype) != KVF_KERN_OK)) {
        return KVF_KERN_EINVAL;
    }
    if ((ldx < p->heads * p->head_dim) || (lddt < p->heads) ||
        (ldbc < p->groups * p->state_size) || (ldy < p->heads * p->head_dim)) {
        return KVF_KERN_EINVAL;
    }
    if (T == 0) {
        return KVF_KERN_OK;
    }
    if ((x == NULL) || (dt == NULL) || (B == NULL) || (C == NULL) || (y == NULL)) {
        return KVF_KERN_EINVAL;
    }
    if (!kvf_kern_on_cpu(dev)) {
#ifdef KVF_HAVE_CUDA
        return kvf_cuda_mamba2_scan(dev, p, T, x, ldx, dt, lddt, B, C, ldbc, state, state_dtype,
                                    has_state, y, ldy);
#else
        return KVF_KERN_EUNSUPPORTED;
#endif
    }
    hd = (size_t)p->head_dim;
    ns = (size_t)p->state_size;
    per_head = hd * ns;
    S = malloc(per_head * sizeof(float));
    if (S == NULL) {
        return KVF_KERN_ENOMEM;
    }
    for (int h = 0; h < p->heads; ++h) {
        size_t g = (size_t)(h / (p->heads / p->groups));
        float A = kvf_mamba2_A_hd(p->A_log[h]);
        float Dh = (p->D != NULL) ? p->D[h] : 0.0f;
        if (has_state) {
            kvf_kern_load(state, state_dtype, (size_t)h * per_head, per_head, S);
        } else {
            memset(S, 0, per_head * sizeof(float));
        }
        for (size_t t = 0; t < (size_t)T; ++t) {
            float dth = kvf_mamba2_dt(p, h, dt[t * (size_t)lddt + (size_t)h]);
            float dA = kvf_mamba2_dA_hd(dth, A);
            const float *xh = x + t * (size_t)ldx + (size_t)h * hd;
            const float *Bg = B + t * (size_t)ldbc + g * ns;
            const float *Cg = C + t * (size_t)ldbc + g * ns;
            float *yh = y + t * (size_t)ldy + (size_t)h * hd;
            for (size_t d = 0; d < hd; ++d) {
                float acc = kvf_mamba2_row_hd(S + d * ns, ns, dA, dth * xh[d], Bg, Cg);
                yh[d] = kvf_mamba2_out_hd(acc, Dh, xh[d]);
            }
        }
        kvf_kern_store(state, state_dtype, (size_t)h * per_head, per_head, S);
    }
    free(S);
    return KVF_KERN_OK;
}

int kvf_mamba2_step(const kvf_device_t *dev, const kvf_mamba2_params_t *p, const float *x,
                    const float *dt, const float *B, const float *C, void *state,
                    kvf_dtype_t state_dtype, float *y)
{
    size_t hd, ns;
    float row[1024];

    if ((kvf_mamba2_check(p, state, state_dtype) != KVF_KERN_OK) || (x == NULL) ||
        (dt == NULL) || (B == NULL) || (C == NULL) || (y == NULL)) {
        return KVF_KERN_EINVAL;
    }
    if (!kvf_kern_on_cpu(dev)) {
#ifdef KVF_HAVE_CUDA
        return kvf_cuda_mamba2_step(dev, p, x, dt, B, C, state, state_dtype, y);
#else
        return KVF_KERN_EUNSUPPORTED;
#endif
    }
    hd = (size_t)p->head_dim;
    ns = (size_t)p->state_size;
    if (ns > sizeof(row) / sizeof(row[0])) {
        return KVF_KERN_EINVAL;
    }
    for (int h = 0; h < p->heads; ++h) {
        size_t g = (size_t)(h / (p->heads / p->groups));
        float A = kvf_mamba2_A_hd(p->A_log[h]);
        float Dh = (p->D != NULL) ? p->D[h] : 0.0f;
        float dth = kvf_mamba2_dt(p, h, dt[h]);
        float dA = kvf_mamba2_dA_hd(dth, A);
        const float *Bg = B + g * ns;
        const float *Cg = C + g * ns;
        for (size_t d = 0; d < hd; ++d) {
            size_t first = ((size_t)h * hd + d) * ns;
            float xv = x[(size_t)h * hd + d];
            kvf_kern_load(state, state_dtype, first, ns, row);
            float acc = kvf_mamba2_row_hd(row, ns, dA, dth * xv, Bg, Cg);
            kvf_kern_store(state, state_dtype, first, ns, row);
            y[(size_t)h * hd + d] = kvf_mamba2_out_hd(acc, Dh, xv);
        }
    }
    return KVF_KERN_OK;
}
