/*
 * Causal depthwise conv1d + bias + SiLU with a cached state (Mamba2).
 *
 * Design: the chunk version builds one time-major fp32 window
 * [kernel-1 history rows | T new input rows][channels] and slides the
 * filter over it, channels innermost so the loops vectorise; the
 * history comes from the stored state (continuation) or is zero (fresh
 * request: the stored bytes are NOT read, since Mamba pages are recycled
 * without zeroing). The new state is the window's last kernel-1 rows,
 * which covers T < kernel-1 (part old history, part new tokens) with no
 * special case. The decode step works on the state in place and needs no
 * scratch.
 * Batch invariance: a token's history taps always read the inputs at the
 * state's precision (a bf16 state: rounded to bf16), its own tap the fp32
 * input, inside a chunk as across chunk boundaries and in the decode step.
 * So the output is the same bits however the prompt is cut into chunks,
 * and the scheduler may cut it wherever the other requests of a step leave
 * room. Rejected: fp32 history inside a chunk and state precision only at
 * its edges (the former rule): with a bf16 state a chunk boundary moved a
 * history input by up to 2^-8 of its value, and the trained tiny hybrid's
 * logits by up to 0.2 (tests/common/engine/test_batch_invariance.c).
 */
#include "kvf_conv1d.h"
#include "kvf_kern_internal.h"
#include "kvf_ssm_math.h"
#ifdef KVF_HAVE_CUDA
#include "kvf_device_cuda.h"
#endif

#include <math.h>
#include <stdbool.h>
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

/*
 * y rows [0, T) from the time-major window win[taps + T][channels] and the
 * transposed filter wt[kernel][channels] (history taps i < kernel - 1 from
 * winr, the window at the state's precision): per token, acc[c] = bias[c], then
 * acc[c] += wt[i][c] * win[t + i][c] for i ascending (kvf_conv_tap_sum's
 * order, so the step agrees bit for bit), then SiLU; the loops over
 * channels vectorise (contraction off, as the scalar step is compiled).
 */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("O3", "fp-contract=off")))
#endif
static void kvf_conv_rows(const float *restrict win, const float *restrict winr,
                          const float *restrict wt, const float *restrict bias, size_t channels,
                          size_t kernel, size_t T, int silu, float *restrict y, size_t ldy)
{
    for (size_t t = 0; t < T; ++t) {
        float *restrict acc = y + t * ldy;
        for (size_t c = 0; c < channels; ++c) {
            acc[c] = (bias != NULL) ? bias[c] : 0.0f;
        }
        for (size_t i = 0; i < kernel; ++i) {
            /* history taps at the state's precision, the token's own tap exact */
            const float *restrict in = ((i + 1 < kernel) ? winr : win) + (t + i) * channels;
            const float *restrict w = wt + i * channels;
            for (size_t c = 0; c < channels; ++c) {
                acc[c] += w[c] * in[c];
            }
        }
        if (silu) {
            for (size_t c = 0; c < channels; ++c) {
                acc[c] = kvf_silu_hd(acc[c]);
            }
        }
    }
}

int kvf_conv1d_chunk(const kvf_device_t *dev, const float *x, int ldx, int T, int channels,
                     int kernel, const float *w, const float *bias, int silu, void *state,
                     kvf_dtype_t state_dtype, int has_state, float *y, int ldy)
{
    const size_t taps = (size_t)(kernel - 1), nc = (size_t)channels;
    const bool narrow = (state_dtype != KVF_DTYPE_FP32);
    float *win, *wt, *hist, *winr;

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
    /* time-major window [taps history | T inputs][channels], the filter transposed and
     * the state's [channel][tap] history; every input is read before y (which may
     * alias x) is written */
    win = malloc(((taps + (size_t)T) * nc * (narrow ? 2 : 1) + (size_t)kernel * nc + nc * taps) *
                 sizeof(float));
    if (win == NULL) {
        return KVF_KERN_ENOMEM;
    }
    wt = win + (taps + (size_t)T) * nc;
    hist = wt + (size_t)kernel * nc;
    winr = narrow ? hist + nc * taps : win;
    if (has_state) {
        kvf_kern_load(state, state_dtype, 0, nc * taps, hist);
    } else {
        memset(hist, 0, nc * taps * sizeof(float));
    }
    for (size_t c = 0; c < nc; ++c) {
        for (size_t i = 0; i < taps; ++i) {
            win[i * nc + c] = hist[c * taps + i];
        }
        for (size_t i = 0; i < (size_t)kernel; ++i) {
            wt[i * nc + c] = w[c * (size_t)kernel + i];
        }
    }
    for (size_t t = 0; t < (size_t)T; ++t) {
        memcpy(win + (taps + t) * nc, x + t * (size_t)ldx, nc * sizeof(float));
    }
    /* the new state: the window's last taps rows */
    for (size_t c = 0; c < nc; ++c) {
        for (size_t i = 0; i < taps; ++i) {
            hist[c * taps + i] = win[((size_t)T + i) * nc + c];
        }
    }
    if (narrow) {
        memcpy(winr, win, (taps + (size_t)T) * nc * sizeof(float));
        kvf_kern_round(winr, (taps + (size_t)T) * nc, state_dtype);
    }
    kvf_conv_rows(win, winr, wt, bias, nc, (size_t)kernel, (size_t)T, silu, y, (size_t)ldy);
    kvf_kern_store(state, state_dtype, 0, nc * taps, hist);
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
