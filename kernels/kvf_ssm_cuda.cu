/*
 * CUDA causal conv1d (a chunk: one thread per (token, channel), each building the
 * window the serial loop would hold at its token, then one per channel storing the new
 * history; the serial kernel, one thread per channel with a rolling window, when y
 * overlaps x; a decode step: one thread per channel) and Mamba2 scan / step (one thread per (head, head-dim)
 * row, all tokens in order, the fp32 rows interleaved in stream-ordered global
 * scratch so a warp's state loads are coalesced),
 * through the shared bodies of kvf_ssm_math.h: the same tap sums, dt clamp
 * and recurrence as the CPU kernels, in the same order per row.
 *
 * State rounding matches the CPU (batch invariance): a chunk loads the
 * state once and stores it once, and in between a narrow (bf16/fp16) state
 * is rounded after every token (kvf_hd_round through the shared bodies
 * kvf_conv_chunk_channel_hd and kvf_mamba2_row_scan_hd): a token's conv
 * history taps and the SSM state it reads are what the decode step's store
 * and load give, so the outputs do not depend on where a prompt is cut into
 * chunks. A fresh request (has_state 0) never reads the stored bytes.
 * The scan rounds each element as it writes it back (the output sum has
 * read the fp32 value), as the CPU's sum-then-round order gives. Rejected: a
 * second pass rounding the scratch row after each token (one more read and
 * write of the row a token, same bits). GPU and CPU still differ by FMA
 * contraction and libm ulps; with a narrow state such an ulp can move a
 * value across a rounding point (tests/gpu/gpu_vs_cpu.c, row_narrow_state).
 */
#include "kvf_cuda_util.h"
#include "kvf_device_cuda.h"
#include "kvf_dtype_math.h"
#include "kvf_ssm_math.h"

__global__ void kvf_conv_chunk_kernel(const float *x, int ldx, int T, int channels, int kernel,
                                      const float *w, const float *bias, int silu, void *state,
                                      int dtype, int has_state, float *y, int ldy)
{
    const size_t taps = (size_t)(kernel - 1);
    float win[KVF_CONV_KERNEL_MAX];

    for (size_t c = (size_t)blockIdx.x * blockDim.x + threadIdx.x; c < (size_t)channels;
         c += (size_t)gridDim.x * blockDim.x) {
        const float *filt = w + c * (size_t)kernel;
        float b = (bias != NULL) ? bias[c] : 0.0f;
        for (size_t i = 0; i < taps; ++i) {
            win[i] = has_state ? kvf_hd_load(state, dtype, c * taps + i) : 0.0f;
        }
        /* history taps at the state's precision (each input rounded after its own tap) */
        kvf_conv_chunk_channel_hd(filt, win, kernel, b, silu, x + c, (size_t)ldx, (size_t)T,
                                  y + c, (size_t)ldy, dtype);
        for (size_t i = 0; i < taps; ++i) {
            kvf_hd_store(state, dtype, c * taps + i, win[i]);
        }
    }
}

/* one thread per (token, channel): every output of the chunk at once (kvf_conv_chunk_token_hd) */
__global__ void kvf_conv_chunk_tok_kernel(const float *x, int ldx, int T, int channels,
                                          int kernel, const float *w, const float *bias,
                                          int silu, const void *state, int dtype, int has_state,
                                          float *y, int ldy)
{
    const size_t n = (size_t)T * (size_t)channels;

    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t t = i / (size_t)channels, c = i % (size_t)channels;
        y[t * (size_t)ldy + c] = kvf_conv_chunk_token_hd(
            w + c * (size_t)kernel, kernel, (bias != NULL) ? bias[c] : 0.0f, silu, x + c,
            (size_t)ldx, t, state, c, has_state, dtype);
    }
}

/* after it, one thread per channel: the new history into the state (kvf_conv_chunk_tail_hd) */
__global__ void kvf_conv_chunk_tail_kernel(const float *x, int ldx, int T, int channels,
                                           int kernel, void *state, int dtype, int has_state)
{
    for (size_t c = (size_t)blockIdx.x * blockDim.x + threadIdx.x; c < (size_t)channels;
         c += (size_t)gridDim.x * blockDim.x) {
        kvf_conv_chunk_tail_hd(x + c, (size_t)ldx, (size_t)T, state, c, kernel - 1, has_state,
                               dtype);
    }
}

__global__ void kvf_conv_step_kernel(const float *x, int channels, int kernel, const float *w,
                                     const float *bias, int silu, void *state, int dtype,
                                     float *y)
{
    const size_t taps = (size_t)(kernel - 1);
    float hist[KVF_CONV_KERNEL_MAX];

    for (size_t c = (size_t)blockIdx.x * blockDim.x + threadIdx.x; c < (size_t)channels;
         c += (size_t)gridDim.x * blockDim.x) {
        float b = (bias != NULL) ? bias[c] : 0.0f;
        for (size_t i = 0; i < taps; ++i) {
            hist[i] = kvf_hd_load(state, dtype, c * taps + i);
        }
        hist[taps] = x[c];
        for (size_t i = 0; i < taps; ++i) {
            kvf_hd_store(state, dtype, c * taps + i, hist[i + 1]);
        }
        y[c] = kvf_conv_tap_sum(w + c * (size_t)kernel, hist, kernel, b, silu);
    }
}

extern "C" int kvf_cuda_conv1d_chunk(const kvf_device_t *dev, const float *x, int ldx, int T,
                                     int channels, int kernel, const float *w,
                                     const float *bias, int silu, void *state,
                                     kvf_dtype_t state_dtype, int has_state, float *y, int ldy)
{
    cudaStream_t stream = kvf_cuda_stream_of(dev);
    const size_t n = (size_t)T * (size_t)channels;
    /* the bytes x and y span: when they overlap (y may alias x) an output written could be
     * an input another thread has yet to read, so the serial kernel runs instead */
    const uintptr_t x0 = (uintptr_t)x, x1 = x0 + ((size_t)(T - 1) * ldx + channels) * 4u;
    const uintptr_t y0 = (uintptr_t)y, y1 = y0 + ((size_t)(T - 1) * ldy + channels) * 4u;
    int rc;

    if (kernel > KVF_CONV_KERNEL_MAX) {
        return KVF_KERN_EINVAL;   /* the thread's window: kernel - 1 taps + 1 input */
    }
    if ((x1 <= y0) || (y1 <= x0)) {
        /* a prompt's tokens in parallel, then the history: same bits as the serial loop */
        kvf_conv_chunk_tok_kernel<<<kvf_cuda_blocks(n), KVF_CUDA_THREADS, 0, stream>>>(
            x, ldx, T, channels, kernel, w, bias, silu, state, (int)state_dtype, has_state, y,
            ldy);
        rc = kvf_cuda_launched("kvf_conv_chunk_tok_kernel");
        if (rc == KVF_KERN_OK) {
            kvf_conv_chunk_tail_kernel<<<kvf_cuda_blocks((size_t)channels), KVF_CUDA_THREADS, 0,
                                         stream>>>(x, ldx, T, channels, kernel, state,
                                                   (int)state_dtype, has_state);
            rc = kvf_cuda_launched("kvf_conv_chunk_tail_kernel");
        }
        return rc;
    }
    kvf_conv_chunk_kernel<<<kvf_cuda_blocks((size_t)channels), KVF_CUDA_THREADS, 0, stream>>>(
        x, ldx, T, channels, kernel, w, bias, silu, state, (int)state_dtype, has_state, y, ldy);
    return kvf_cuda_launched("kvf_conv_chunk_kernel");
}

extern "C" int kvf_cuda_conv1d_step(const kvf_device_t *dev, const float *x, int channels,
                                    int kernel, const float *w, const float *bias, int silu,
                                    void *state, kvf_dtype_t state_dtype, float *y)
{
    kvf_conv_step_kernel<<<kvf_cuda_blocks((size_t)channels), KVF_CUDA_THREADS, 0,
                           kvf_cuda_stream_of(dev)>>>(x, channels, kernel, w, bias, silu, state,
                                                      (int)state_dtype, y);
    return kvf_cuda_launched("kvf_conv_step_kernel");
}

/* the layer constants a thread needs (pointers are device memory) */
struct kvf_cuda_ssm {
    int          heads, head_dim, groups, ns;
    const float *dt_bias, *A_log, *D;
    float        dt_min, dt_max;
};

static kvf_cuda_ssm kvf_cuda_ssm_of(const kvf_mamba2_params_t *p)
{
    kvf_cuda_ssm s;
    s.heads = p->heads;
    s.head_dim = p->head_dim;
    s.groups = p->groups;
    s.ns = p->state_size;
    s.dt_bias = p->dt_bias;
    s.A_log = p->A_log;
    s.D = p->D;
    s.dt_min = p->dt_min;
    s.dt_max = p->dt_max;
    return s;
}

/*
 * One thread per (h, d) row: T tokens through S (fp32 scratch row), loaded
 * from the state first (has_state), rounded to a narrow state's dtype after
 * every token and stored back once at the end (the rounded values store
 * exactly). The decode step is T = 1 with has_state = 1.
 */
__global__ void kvf_mamba2_scan_kernel(kvf_cuda_ssm p, int T, const float *x, int ldx,
                                       const float *dt, int lddt, const float *B, const float *C,
                                       int ldbc, void *state, int dtype, int has_state,
                                       float *y, int ldy, float *scratch)
{
    const size_t hd = (size_t)p.head_dim, ns = (size_t)p.ns, rows = (size_t)p.heads * hd;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < rows;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t h = i / hd, d = i % hd;
        size_t g = h / (size_t)(p.heads / p.groups);
        float A = kvf_mamba2_A_hd(p.A_log[h]);
        float Dh = (p.D != NULL) ? p.D[h] : 0.0f;
        float bias = (p.dt_bias != NULL) ? p.dt_bias[h] : 0.0f;
        /* row i's element n at scratch[n * rows + i]: a warp's threads read one line */
        float *S = scratch + i;
        for (size_t n = 0; n < ns; ++n) {
            S[n * rows] = has_state ? kvf_hd_load(state, dtype, i * ns + n) : 0.0f;
        }
        /* a narrow state rounded after every token, as the decode step stores it */
        kvf_mamba2_row_scan_hd(S, rows, ns, (size_t)T, dt + h, (size_t)lddt, bias, p.dt_min,
                               p.dt_max, A, Dh, x + h * hd + d, (size_t)ldx, B + g * ns,
                               C + g * ns, (size_t)ldbc, y + h * hd + d, (size_t)ldy, dtype);
        for (size_t n = 0; n < ns; ++n) {
            kvf_hd_store(state, dtype, i * ns + n, S[n * rows]);
        }
    }
}

static int kvf_cuda_mamba2_run(const kvf_device_t *dev, const kvf_mamba2_params_t *p, int T,
                               const float *x, int ldx, const float *dt, int lddt,
                               const float *B, const float *C, int ldbc, void *state,
                               kvf_dtype_t state_dtype, int has_state, float *y, int ldy)
{
    cudaStream_t stream = kvf_cuda_stream_of(dev);
    size_t rows = (size_t)p->heads * (size_t)p->head_dim;
    void *scratch = NULL;
    int rc = kvf_cuda_scratch(stream, rows * (size_t)p->state_size * sizeof(float), NULL,
                              &scratch);
    if (rc != KVF_KERN_OK) {
        return rc;
    }
    kvf_mamba2_scan_kernel<<<kvf_cuda_blocks_for(rows, KVF_CUDA_THREADS / 4),
                             KVF_CUDA_THREADS / 4, 0, stream>>>(
        kvf_cuda_ssm_of(p), T, x, ldx, dt, lddt, B, C, ldbc, state, (int)state_dtype,
        has_state, y, ldy, (float *)scratch);
    rc = kvf_cuda_launched("kvf_mamba2_scan_kernel");
    kvf_cuda_scratch_free(stream, scratch);
    return rc;
}

extern "C" int kvf_cuda_mamba2_scan(const kvf_device_t *dev, const kvf_mamba2_params_t *p,
                                    int T, const float *x, int ldx, const float *dt, int lddt,
                                    const float *B, const float *C, int ldbc, void *state,
                                    kvf_dtype_t state_dtype, int has_state, float *y, int ldy)
{
    return kvf_cuda_mamba2_run(dev, p, T, x, ldx, dt, lddt, B, C, ldbc, state, state_dtype,
                               has_state, y, ldy);
}

extern "C" int kvf_cuda_mamba2_step(const kvf_device_t *dev, const kvf_mamba2_params_t *p,
                                    const float *x, const float *dt, const float *B,
                                    const float *C, void *state, kvf_dtype_t state_dtype,
                                    float *y)
{
    int hd = p->heads * p->head_dim, bc = p->groups * p->state_size;
    return kvf_cuda_mamba2_run(dev, p, 1, x, hd, dt, p->heads, B, C, bc, state, state_dtype, 1,
                               y, hd);
}
