/*
 * kvf_ssm_decode_seqs(): the per-request calls (the CPU), the checks of the
 * batched CUDA path and its dispatch (kvf_ssm_seqs_cuda.cu: every state dtype,
 * updated in place).
 */
#include "kvf_ssm_seqs.h"
#include "kvf_conv1d.h"
#include "kvf_gdn.h"
#include "kvf_kern_internal.h"
#include "kvf_ssm_math.h"

#include <string.h>

#ifdef KVF_HAVE_CUDA
#include "kvf_device_cuda.h"
#endif

size_t kvf_ssm_seqs_packed_bytes(int num_seqs)
{
    return (size_t)num_seqs * (2 * sizeof(void *) + sizeof(int) + 2 * sizeof(float));
}

void kvf_ssm_seqs_pack(const kvf_ssm_seqs_t *seqs, void *out)
{
    const size_t S = (size_t)seqs->num_seqs;
    char *h = out;

    memcpy(h, seqs->conv_states, S * sizeof(void *));
    memcpy(h + S * sizeof(void *), seqs->ssm_states, S * sizeof(void *));
    memcpy(h + 2 * S * sizeof(void *), seqs->rows, S * sizeof(int));
    memcpy(h + 2 * S * sizeof(void *) + S * sizeof(int), seqs->dt_min, S * sizeof(float));
    memcpy(h + 2 * S * sizeof(void *) + S * sizeof(int) + S * sizeof(float), seqs->dt_max,
           S * sizeof(float));
}

int kvf_ssm_decode_seqs(const kvf_device_t *dev, const kvf_ssm_seqs_t *seqs, const float *x_in,
                        int ld_in, int channels, int kernel, const float *conv_w,
                        const float *conv_b, kvf_dtype_t conv_dtype, float *xbc, int ld_xbc,
                        const kvf_mamba2_params_t *p, const float *dt, int lddt,
                        kvf_dtype_t ssm_dtype, float *y, int ldy)
{
    int e = KVF_KERN_OK;

    if ((seqs == NULL) || (seqs->num_seqs < 0) || (p == NULL)) {
        return KVF_KERN_EINVAL;
    }
    if (seqs->num_seqs == 0) {
        return KVF_KERN_OK;
    }
    if ((seqs->rows == NULL) || (seqs->conv_states == NULL) || (seqs->ssm_states == NULL) ||
        (seqs->dt_min == NULL) || (seqs->dt_max == NULL) || (x_in == NULL) || (xbc == NULL) ||
        (dt == NULL) || (y == NULL) || (channels < 1) || (ld_in < channels) || (ld_xbc < channels) ||
        (p->heads < 1) || (p->groups < 1) || (p->head_dim < 1) || (p->state_size < 1) ||
        (lddt < p->heads) || (ldy < p->heads * p->head_dim) ||
        (p->heads * p->head_dim + 2 * p->groups * p->state_size > channels)) {
        return KVF_KERN_EINVAL;
    }
    const size_t xb = (size_t)p->heads * (size_t)p->head_dim;
    const size_t gb = (size_t)p->groups * (size_t)p->state_size;
    if (kvf_kern_on_cpu(dev)) {
        /* the CPU: the per-request calls */
        for (int i = 0; (e == KVF_KERN_OK) && (i < seqs->num_seqs); ++i) {
            const size_t r = (size_t)seqs->rows[i];
            kvf_mamba2_params_t pi = *p;
            float *xr = xbc + r * (size_t)ld_xbc;
            pi.dt_min = seqs->dt_min[i];
            pi.dt_max = seqs->dt_max[i];
            e = kvf_conv1d_step(dev, x_in + r * (size_t)ld_in, channels, kernel, conv_w, conv_b,
                                1, seqs->conv_states[i], conv_dtype, xr);
            if (e == KVF_KERN_OK) {
                e = kvf_mamba2_step(dev, &pi, xr, dt + r * (size_t)lddt, xr + xb, xr + xb + gb,
                                    seqs->ssm_states[i], ssm_dtype, y + r * (size_t)ldy);
            }
        }
        return e;
    }
    if ((conv_w == NULL) || (kernel < 2) || (kernel > KVF_CONV_KERNEL_MAX) ||
        !kvf_kern_cache_dtype_ok(conv_dtype) || !kvf_kern_cache_dtype_ok(ssm_dtype) ||
        (p->A_log == NULL) || ((p->heads % p->groups) != 0) || (p->state_size > 1024)) {
        return KVF_KERN_EINVAL;
    }
    for (int i = 0; i < seqs->num_seqs; ++i) {
        if ((seqs->rows[i] < 0) || (seqs->conv_states[i] == NULL) ||
            (seqs->ssm_states[i] == NULL) || !(seqs->dt_max[i] >= seqs->dt_min[i])) {
            return KVF_KERN_EINVAL;
        }
    }
#ifdef KVF_HAVE_CUDA
    return kvf_cuda_ssm_decode_seqs(dev, seqs, x_in, ld_in, channels, kernel, conv_w, conv_b,
                                    conv_dtype, xbc, ld_xbc, p, dt, lddt, ssm_dtype, y, ldy);
#else
    return KVF_KERN_EUNSUPPORTED;
#endif
}

int kvf_gdn_decode_seqs(const kvf_device_t *dev, const kvf_ssm_seqs_t *seqs, const float *x_in,
                        int ld_in, int channels, int kernel, const float *conv_w,
                        kvf_dtype_t conv_dtype, float *xbc, int ld_xbc,
                        const kvf_gdn_params_t *p, const float *ba, int ldba,
                        kvf_dtype_t ssm_dtype, float *y, int ldy)
{
    int e = KVF_KERN_OK;

    if ((seqs == NULL) || (seqs->num_seqs < 0) || (p == NULL)) {
        return KVF_KERN_EINVAL;
    }
    if (seqs->num_seqs == 0) {
        return KVF_KERN_OK;
    }
    if ((seqs->rows == NULL) || (seqs->conv_states == NULL) || (seqs->ssm_states == NULL) ||
        (x_in == NULL) || (xbc == NULL) || (channels < 1) || (ld_in < channels) ||
        (ld_xbc < channels) || (p->heads < 1) || (p->groups < 1) || (p->head_dim < 1) ||
        (p->key_dim < 1) || (p->heads * p->head_dim + 2 * p->groups * p->key_dim > channels)) {
        return KVF_KERN_EINVAL;
    }
    if (kvf_kern_on_cpu(dev)) {
        for (int i = 0; (e == KVF_KERN_OK) && (i < seqs->num_seqs); ++i) {
            const size_t r = (size_t)seqs->rows[i];
            float *xr = xbc + r * (size_t)ld_xbc;
            e = kvf_conv1d_step(dev, x_in + r * (size_t)ld_in, channels, kernel, conv_w, NULL, 1,
                                seqs->conv_states[i], conv_dtype, xr);
            if (e == KVF_KERN_OK) {
                e = kvf_gdn_scan(dev, p, 1, xr, ld_xbc, ba + r * (size_t)ldba, ldba,
                                 seqs->ssm_states[i], ssm_dtype, 1, y + r * (size_t)ldy, ldy);
            }
        }
        return e;
    }
    if ((conv_w == NULL) || (kernel < 2) || (kernel > KVF_CONV_KERNEL_MAX) ||
        !kvf_kern_cache_dtype_ok(conv_dtype) ||
        kvf_gdn_args_bad(p, 1, xbc, ld_xbc, ba, ldba, seqs->ssm_states[0], ssm_dtype, y, ldy)) {
        return KVF_KERN_EINVAL;
    }
    for (int i = 0; i < seqs->num_seqs; ++i) {
        if ((seqs->rows[i] < 0) || (seqs->conv_states[i] == NULL) ||
            (seqs->ssm_states[i] == NULL)) {
            return KVF_KERN_EINVAL;
        }
    }
#ifdef KVF_HAVE_CUDA
    return kvf_cuda_gdn_decode_seqs(dev, seqs, x_in, ld_in, channels, kernel, conv_w,
                                    conv_dtype, xbc, ld_xbc, p, ba, ldba, ssm_dtype, y, ldy);
#else
    return KVF_KERN_EUNSUPPORTED;
#endif
}
