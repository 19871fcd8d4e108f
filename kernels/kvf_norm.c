/*
 * RMSNorm and gated grouped RMSNorm (Mamba2 MambaRMSNormGated), fp32.
 *
 * Design: sums of squares accumulate in double so the CPU result is a
 * stable reference for the CUDA kernel and for TP all-reduces whose
 * reduction order differs from the single-rank order. The gated norm is
 * split into sumsq/apply so a TP caller can all-reduce the per-group sums
 * when a norm group spans ranks (vLLM's Mixer2RMSNormGated does the same).
 */
#include "kvf_norm.h"
#include "kvf_norm_math.h"
#include "kvf_ops.h"
#ifdef KVF_HAVE_CUDA
#include "kvf_device_cuda.h"
#endif

#include <math.h>
#include <stdlib.h>

static inline bool kvf_norm_on_cpu(const kvf_device_t *dev)
{
    return (dev == NULL) || (dev->kind == KVF_DEVICE_CPU);
}

int kvf_rmsnorm(const kvf_device_t *dev, const float *x, const float *w, float *y, int rows,
                int dim, float eps)
{
    if ((rows < 0) || (dim <= 0) || !(eps >= 0.0f)) {
        return KVF_KERN_EINVAL;
    }
    if (rows == 0) {
        return KVF_KERN_OK;
    }
    if ((x == NULL) || (w == NULL) || (y == NULL)) {
        return KVF_KERN_EINVAL;
    }
    if (!kvf_norm_on_cpu(dev)) {
#ifdef KVF_HAVE_CUDA
        return kvf_cuda_rmsnorm(dev, x, w, y, rows, dim, eps);
#else
        return KVF_KERN_EUNSUPPORTED;
#endif
    }
    for (int r = 0; r < rows; ++r) {
        const float *xr = x + (size_t)r * (size_t)dim;
        float *yr = y + (size_t)r * (size_t)dim;
        double s = 0.0;
        for (int c = 0; c < dim; ++c) {
            s += kvf_norm_sq_hd(xr[c]);
        }
        float inv = kvf_norm_inv_hd(s, (double)dim, eps);
        for (int c = 0; c < dim; ++c) {
            yr[c] = kvf_norm_scale_hd(xr[c], inv, w[c]);
        }
    }
    return KVF_KERN_OK;
}

int kvf_add_rmsnorm(const kvf_device_t *dev, float *h, const float *delta, const float *w,
                    float *y, int rows, int dim, float eps)
{
    if ((rows < 0) || (dim <= 0) || !(eps >= 0.0f)) {
        return KVF_KERN_EINVAL;
    }
    if (rows == 0) {
        return KVF_KERN_OK;
    }
    if ((h == NULL) || (delta == NULL) || (w == NULL) || (y == NULL) || (delta == h) ||
        (y == h) || (y == delta)) {
        return KVF_KERN_EINVAL;
    }
    if (!kvf_norm_on_cpu(dev)) {
#ifdef KVF_HAVE_CUDA
        return kvf_cuda_add_rmsnorm(dev, h, delta, w, y, rows, dim, eps);
#else
        return KVF_KERN_EUNSUPPORTED;
#endif
    }
    int e = kvf_add(dev, h, delta, (size_t)rows * (size_t)dim);
    return (e != KVF_KERN_OK) ? e : kvf_rmsnorm(dev, h, w, y, rows, dim, eps);
}

int kvf_rmsnorm_heads(const kvf_device_t *dev, float *x, int ld, int tokens, int heads,
                      int head_dim, const float *w, float eps)
{
    int e = KVF_KERN_OK;

    if ((tokens < 0) || (heads <= 0) || (head_dim <= 0) || !(eps >= 0.0f) ||
        ((long)ld < (long)heads * (long)head_dim)) {
        return KVF_KERN_EINVAL;
    }
    if (tokens == 0) {
        return KVF_KERN_OK;
    }
    if ((x == NULL) || (w == NULL)) {
        return KVF_KERN_EINVAL;
    }
    if (!kvf_norm_on_cpu(dev)) {
#ifdef KVF_HAVE_CUDA
        return kvf_cuda_rmsnorm_heads(dev, x, ld, tokens, heads, head_dim, w, eps);
#else
        return KVF_KERN_EUNSUPPORTED;
#endif
    }
    for (int t = 0; (e == KVF_KERN_OK) && (t < tokens); ++t) {
        float *row = x + (size_t)t * (size_t)ld;
        e = kvf_rmsnorm(dev, row, w, row, heads, head_dim, eps);
    }
    return e;
}

static int kvf_gated_check(int rows, int dim, int group_size)
{
    if ((rows < 0) || (dim <= 0) || (group_size <= 0) || ((dim % group_size) != 0)) {
        return KVF_KERN_EINVAL;
    }
    return KVF_KERN_OK;
}

int kvf_gated_rmsnorm_sumsq(const kvf_device_t *dev, const float *x, const float *z, int ld,
                            int rows, int dim, int group_size, float *g, float *sumsq)
{
    int err = kvf_gated_check(rows, dim, group_size);
    int ngroups;

    if ((err != KVF_KERN_OK) || (ld < dim)) {
        return KVF_KERN_EINVAL;
    }
    if (rows == 0) {
        return KVF_KERN_OK;
    }
    if ((x == NULL) || (z == NULL) || (g == NULL) || (sumsq == NULL)) {
        return KVF_KERN_EINVAL;
    }
    if (!kvf_norm_on_cpu(dev)) {
#ifdef KVF_HAVE_CUDA
        return kvf_cuda_gated_rmsnorm_sumsq(dev, x, z, ld, rows, dim, group_size, g, sumsq);
#else
        return KVF_KERN_EUNSUPPORTED;
#endif
    }
    ngroups = dim / group_size;
    for (int r = 0; r < rows; ++r) {
        const float *xr = x + (size_t)r * (size_t)ld;
        const float *zr = z + (size_t)r * (size_t)ld;
        float *gr = g + (size_t)r * (size_t)dim;
        for (int k = 0; k < ngroups; ++k) {
            double s = 0.0;
            for (int c = k * group_size; c < (k + 1) * group_size; ++c) {
                float v = kvf_norm_gate_hd(xr[c], zr[c]);
                gr[c] = v;
                s += kvf_norm_sq_hd(v);
            }
            sumsq[(size_t)r * (size_t)ngroups + (size_t)k] = (float)s;
        }
    }
    return KVF_KERN_OK;
}

int kvf_gated_rmsnorm_apply(const kvf_device_t *dev, const float *g, const float *sumsq,
                            const float *w, int rows, int dim, int group_size, int norm_elems,
                            float eps, float *y)
{
    int err = kvf_gated_check(rows, dim, group_size);
    int ngroups;

    if ((err != KVF_KERN_OK) || (norm_elems < group_size) || !(eps >= 0.0f)) {
        return KVF_KERN_EINVAL;
    }
    if (rows == 0) {
        return KVF_KERN_OK;
    }
    if ((g == NULL) || (sumsq == NULL) || (w == NULL) || (y == NULL)) {
        return KVF_KERN_EINVAL;
    }
    if (!kvf_norm_on_cpu(dev)) {
#ifdef KVF_HAVE_CUDA
        return kvf_cuda_gated_rmsnorm_apply(dev, g, sumsq, w, rows, dim, group_size, norm_elems,
                                            eps, y);
#else
        return KVF_KERN_EUNSUPPORTED;
#endif
    }
    ngroups = dim / group_size;
    for (int r = 0; r < rows; ++r) {
        const float *gr = g + (size_t)r * (size_t)dim;
        float *yr = y + (size_t)r * (size_t)dim;
        for (int k = 0; k < ngroups; ++k) {
            double s = sumsq[(size_t)r * (size_t)ngroups + (size_t)k];
            float inv = kvf_norm_inv_hd(s, (double)norm_elems, eps);
            for (int c = k * group_size; c < (k + 1) * group_size; ++c) {
                yr[c] = kvf_norm_scale_hd(gr[c], inv, w[c]);
            }
        }
    }
    return KVF_KERN_OK;
}

int kvf_gated_rmsnorm(const kvf_device_t *dev, const float *x, const float *z, int ld,
                      const float *w, int rows, int dim, int group_size, float eps, float *y)
{
    float *sumsq;
    int err = kvf_gated_check(rows, dim, group_size);

    if ((err != KVF_KERN_OK) || (ld < dim)) {
        return KVF_KERN_EINVAL;
    }
    if (rows == 0) {
        return KVF_KERN_OK;
    }
    if ((x == NULL) || (z == NULL) || (w == NULL) || (y == NULL)) {
        return KVF_KERN_EINVAL;
    }
    if (!kvf_norm_on_cpu(dev)) {
#ifdef KVF_HAVE_CUDA
        return kvf_cuda_gated_rmsnorm(dev, x, z, ld, w, rows, dim, group_size, eps, y);
#else
        return KVF_KERN_EUNSUPPORTED;
#endif
    }
    sumsq = malloc((size_t)rows * (size_t)(dim / group_size) * sizeof(float));
    if (sumsq == NULL) {
        return KVF_KERN_ENOMEM;
    }
    err = kvf_gated_rmsnorm_sumsq(dev, x, z, ld, rows, dim, group_size, y, sumsq);
    if (err == KVF_KERN_OK) {
        err = kvf_gated_rmsnorm_apply(dev, y, sumsq, w, rows, dim, group_size, group_size, eps,
                                      y);
    }
    free(sumsq);
    return err;
}
