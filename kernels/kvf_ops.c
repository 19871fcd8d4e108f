/*
 * The model forward's small ops on the CPU: loops over the shared bodies of
 * kvf_ops_math.h (and kvf_dtype_math.h for the typed row gather); CUDA in
 * kvf_ops_cuda.cu. The loops keep the order of operations of the host
 * loops they replace in common/runtime/kvf_model_fwd.c, so CPU outputs are
 * unchanged bit for bit.
 */
#include "kvf_ops.h"
#include "kvf_kern_internal.h"
#include "kvf_ops_math.h"
#ifdef KVF_HAVE_CUDA
#include "kvf_ops_cuda.h"
#endif

#ifdef KVF_HAVE_CUDA
#define KVF_OPS_CUDA(_call) return (_call)
#else
#define KVF_OPS_CUDA(_call) return KVF_KERN_EUNSUPPORTED
#endif

static bool kvf_ids_ok(const int32_t *ids, int n)
{
    for (int i = 0; i < n; ++i) {
        if (ids[i] < 0) {
            return false;
        }
    }
    return true;
}

int kvf_scale(const kvf_device_t *dev, float *x, size_t n, float alpha)
{
    if (n == 0) {
        return KVF_KERN_OK;
    }
    if (x == NULL) {
        return KVF_KERN_EINVAL;
    }
    if (!kvf_kern_on_cpu(dev)) {
        KVF_OPS_CUDA(kvf_cuda_scale(dev, x, n, alpha));
    }
    for (size_t i = 0; i < n; ++i) {
        x[i] *= alpha;
    }
    return KVF_KERN_OK;
}

int kvf_add(const kvf_device_t *dev, float *y, const float *x, size_t n)
{
    if (n == 0) {
        return KVF_KERN_OK;
    }
    if ((y == NULL) || (x == NULL)) {
        return KVF_KERN_EINVAL;
    }
    if (!kvf_kern_on_cpu(dev)) {
        KVF_OPS_CUDA(kvf_cuda_add(dev, y, x, n));
    }
    for (size_t i = 0; i < n; ++i) {
        y[i] += x[i];
    }
    return KVF_KERN_OK;
}

int kvf_gather_rows(const kvf_device_t *dev, const void *src, kvf_dtype_t src_dtype, int cols,
                    const int32_t *ids, int n, float *dst)
{
    if (((unsigned)src_dtype >= KVF_DTYPE_COUNT) || (cols < 1) || (n < 0)) {
        return KVF_KERN_EINVAL;
    }
    if (n == 0) {
        return KVF_KERN_OK;
    }
    if ((src == NULL) || (ids == NULL) || (dst == NULL) || !kvf_ids_ok(ids, n)) {
        return KVF_KERN_EINVAL;
    }
    if (!kvf_kern_on_cpu(dev)) {
        KVF_OPS_CUDA(kvf_cuda_gather_rows(dev, src, (int)src_dtype, cols, ids, n, dst));
    }
    for (int i = 0; i < n; ++i) {
        size_t first = (size_t)ids[i] * (size_t)cols;
        float *out = dst + (size_t)i * (size_t)cols;
        if (src_dtype == KVF_DTYPE_FP32) {
            memcpy(out, (const float *)src + first, (size_t)cols * sizeof(float));
            continue;
        }
        for (int c = 0; c < cols; ++c) {
            out[c] = kvf_hd_load(src, (int)src_dtype, first + (size_t)c);
        }
    }
    return KVF_KERN_OK;
}

int kvf_scatter_add_rows(const kvf_device_t *dev, float *y, int ldy, const int32_t *rows,
                         const float *wt, int n, const float *x, int cols)
{
    if ((cols < 1) || (ldy < cols) || (n < 0)) {
        return KVF_KERN_EINVAL;
    }
    if (n == 0) {
        return KVF_KERN_OK;
    }
    if ((y == NULL) || (rows == NULL) || (wt == NULL) || (x == NULL) || !kvf_ids_ok(rows, n)) {
        return KVF_KERN_EINVAL;
    }
    if (!kvf_kern_on_cpu(dev)) {
        KVF_OPS_CUDA(kvf_cuda_scatter_add_rows(dev, y, ldy, rows, wt, n, x, cols));
    }
    for (int j = 0; j < n; ++j) {
        float *dst = y + (size_t)rows[j] * (size_t)ldy;
        const float *src = x + (size_t)j * (size_t)cols;
        for (int c = 0; c < cols; ++c) {
            dst[c] = kvf_add_scaled_hd(dst[c], src[c], wt[j]);
        }
    }
    return KVF_KERN_OK;
}

int kvf_act_mul(const kvf_device_t *dev, int act, const float *x, int M, int C, float *y)
{
    if ((act < 0) || (act >= KVF_KACT_COUNT) || (C < 1) || (M < 0)) {
        return KVF_KERN_EINVAL;
    }
    if (M == 0) {
        return KVF_KERN_OK;
    }
    if ((x == NULL) || (y == NULL)) {
        return KVF_KERN_EINVAL;
    }
    if (!kvf_kern_on_cpu(dev)) {
        KVF_OPS_CUDA(kvf_cuda_act_mul(dev, act, x, M, C, y));
    }
    for (int t = 0; t < M; ++t) {
        const float *gate = x + (size_t)t * (size_t)(2 * C);
        float *out = y + (size_t)t * (size_t)C;
        for (int i = 0; i < C; ++i) {
            out[i] = kvf_act_mul_hd(act, gate[i], gate[C + i]);
        }
    }
    return KVF_KERN_OK;
}

int kvf_swiglu_clamp(const kvf_device_t *dev, float alpha, float limit, const float *x, int M,
                     int C, float *y)
{
    if ((C < 1) || (M < 0) || !(limit > 0.0f)) {
        return KVF_KERN_EINVAL;
    }
    if (M == 0) {
        return KVF_KERN_OK;
    }
    if ((x == NULL) || (y == NULL)) {
        return KVF_KERN_EINVAL;
    }
    if (!kvf_kern_on_cpu(dev)) {
        KVF_OPS_CUDA(kvf_cuda_swiglu_clamp(dev, alpha, limit, x, M, C, y));
    }
    for (int t = 0; t < M; ++t) {
        const float *gate = x + (size_t)t * (size_t)(2 * C);
        float *out = y + (size_t)t * (size_t)C;
        for (int i = 0; i < C; ++i) {
            out[i] = kvf_swiglu_clamp_hd(gate[i], gate[C + i], alpha, limit);
        }
    }
    return KVF_KERN_OK;
}

int kvf_rope(const kvf_device_t *dev, const float *inv_freq, int head_dim,
             const int32_t *positions, int T, float *x, int ldx, int heads)
{
    const int half = head_dim / 2;

    if ((head_dim < 2) || ((head_dim % 2) != 0) || (heads < 1) || (T < 0) ||
        ((long long)ldx < (long long)heads * head_dim)) {
        return KVF_KERN_EINVAL;
    }
    if (T == 0) {
        return KVF_KERN_OK;
    }
    if ((inv_freq == NULL) || (positions == NULL) || (x == NULL)) {
        return KVF_KERN_EINVAL;
    }
    if (!kvf_kern_on_cpu(dev)) {
        KVF_OPS_CUDA(kvf_cuda_rope(dev, inv_freq, head_dim, positions, T, x, ldx, heads));
    }
    for (int t = 0; t < T; ++t) {
        float *xt = x + (size_t)t * (size_t)ldx;
        for (int i = 0; i < half; ++i) {
            float c, s;
            kvf_rope_cos_sin_hd(kvf_rope_angle_hd(positions[t], inv_freq[i]), &c, &s);
            for (int h = 0; h < heads; ++h) {
                float *v = xt + (size_t)h * (size_t)head_dim;
                kvf_rope_rotate_hd(c, s, &v[i], &v[i + half]);
            }
        }
    }
    return KVF_KERN_OK;
}
