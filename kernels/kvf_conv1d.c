/*
 * Causal depthwise conv1d + bias + SiLU with a cached state (Mamba2).
 *
 * Design: the chunk version builds, per channel, one contiguous fp32 window
 * [kernel-1 history taps | T new inputs] and slides the filter over it; the
 * history comes from the stored state (continuation) or is zero (fresh
 * request: the stored bytes are NOT read, since Mamba pages are recycled
 * without zeroing). The new state is the window's last kernel-1 entries,
 * which covers T < kernel-1 (part old history, part new tokens) with no
 * special case. The decode step works on the state in place and needs no
 * scratch. Inputs are converted once, so a bf16 state rounds once per chunk.
 */
#include "kvf_conv1d.h"
#include "kvf_kern_internal.h"
#include "kvf_ssm_math.h"
#ifdef KVF_HAVE_CUDA
#include "kvf_device_cuda.h"
#endif

#include <math.h>
#include <stdlib.h>

static int kvf_conv_check(int channels, int kernel, const float *w, const void *state,
                          kvf_dtype_t state_dtype)
{
    if ((channels <= 0) || (kernel < 2) || (w == NULL) || (state == NULL) ||
        !kvf_kern_cache_dtype_ok(state_dtype)) {
        return KVF_KERN_EINVAL;
    }
    return KVF_KERN_OK;
}

int kvf_conv1d_chunk(const kvf_device_t *dev, const float *x, int ldx, int T, int channels,
                     int kernel, const float *w, const float *bias, int silu, void *state,
                     kvf_dtype_t state_dtype, int has_state, float *y, int ldy)
{
    size_t taps = (size_t)(kernel - 1);
    size_t win_len;
    float *win;

    if ((T < 0) || (kvf_conv_check(channels, kernel, w, state, state_dtype) != KVF_KERN_OK) ||
        (ldx < channels) || (ldy < channels)) {
        return KVF_KERN_EINVAL;
    }
    if (T == 0) {
        return KVF_KERN_OK;
    }
    if ((x == NULL) || (y == NULL)) {
        return KVF_KERN_EINVAL;
    }
    if (!kvf_kern_on_cpu(dev)) {
#ifdef KVF_HAVE_CUDA
        return kvf_cuda_conv1d_chunk(dev, x, ldx, T, channels, kernel, w, bias, silu, state,
                                     state_dtype, has_state, y, ldy);
#else
        return KVF_KERN_EUNSUPPORTED;
#endif
    }
    win_len = taps + (size_t)T;
    /* all channels' windows first: y may alias x, so read every input before writing */
    win = malloc((size_t)channels * win_len * sizeof(float));
    if (win == NULL) {
        return KVF_KERN_ENOMEM;
    }
    for (size_t c = 0; c < (size_t)channels; ++c) {
        float *wc = win + c * win_len;
        if (has_state) {
            kvf_kern_load(state, state_dtype, c * taps, taps, wc);
        } else {
            memset(wc, 0, taps * sizeof(float));
        }
        for (size_t t = 0; t < (size_t)T; ++t) {
            wc[taps + t] = x[t * (size_t)ldx + c];
        }
    }
    for (size_t c = 0; c < (size_t)channels; ++c) {
        const float *wc = win + c * win_len;
        const float *filt = w + c * (size_t)kernel;
        float b = (bias != NULL) ? bias[c] : 0.0f;
        for (size_t t = 0; t < (size_t)T; ++t) {
            y[t * (size_t)ldy + c] = kvf_conv_tap_sum(filt, wc + t, kernel, b, silu);
        }
        kvf_kern_store(state, state_dtype, c * taps, taps, wc + (size_t)T);
    }
    free(win);
    return KVF_KERN_OK;
}

int kvf_conv1d_step(const kvf_device_t *dev, const float *x, int channels, int kernel,
                    const float *w, const float *bias, int silu, void *state,
                    kvf_dtype_t state_dtype, float *y)
{
    size_t taps = (size_t)(kernel - 1);
    float hist[KVF_CONV_KERNEL_MAX];

    if ((kvf_conv_check(channels, kernel, w, state, state_dtype) != KVF_KERN_OK) ||
        (x == NULL) || (y == NULL) || (taps + 1 > sizeof(hist) / sizeof(hist[0]))) {
        return KVF_KERN_EINVAL;
    }
    if (!kvf_kern_on_cpu(dev)) {
#ifdef KVF_HAVE_CUDA
        return kvf_cuda_conv1d_step(dev, x, channels, kernel, w, bias, silu, state, state_dtype,
                                    y);
#else
        return KVF_KERN_EUNSUPPORTED;
#endif
    }
    for (size_t c = 0; c < (size_t)channels; ++c) {
        const float *filt = w + c * (size_t)kernel;
        float b = (bias != NULL) ? bias[c] : 0.0f;
        kvf_kern_load(state, state_dtype, c * taps, taps, hist);
        hist[taps] = x[c];
        kvf_kern_store(state, state_dtype, c * taps, taps, hist + 1);
        y[c] = kvf_conv_tap_sum(filt, hist, kernel, b, silu);
    }
    return KVF_KERN_OK;
}
