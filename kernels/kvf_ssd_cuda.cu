/*
 * The chunked (SSD) Mamba2 prompt scan on a GPU (kvf_ssd.h): chunk-parallel, the state
 * rounded only at the ends of chunks, which lie on the absolute state grid. Each output is
 * one of kvf_ssd_math.h's per-element functions, in the CPU reference's order.
 *
 * Per window of up to KVF_SSD_WINDOW_CHUNKS chunks (windows run one after another on the
 * stream; a window's chunks at once):
 *   1. per (chunk, head), one thread: the clamped dt and the running sum cs of a = dt * A
 *      over the chunk's tokens (a serial sum: the reference's order);
 *   2. per (chunk, group): the chunk's C.B matrix (t >= s), each entry a thread;
 *   3. per (chunk, head): the intra-chunk sums into y (token, head dim a thread) and the
 *      chunk's local state (head dim, state index a thread);
 *   4. per head: the pass over the window's chunks in order, S = round(exp(cs_last) S +
 *      local); each chunk's local slot is replaced by the state entering it;
 *   5. per (chunk, head): y = (intra + exp(cs_t) C_t . S_in) + D x.
 * The fp32 state carried between windows is scratch; the stored state (its dtype) is read
 * before the first window and written after the last.
 * Rejected for now: the matrix products on tensor cores (C.B, the intra sum, C.S_in are
 * GEMM-shaped); this is plain fp32 FMA, its first GPU run is still to come.
 */
#include "kvf_cuda_util.h"
#include "kvf_device_cuda.h"
#include "kvf_dtype_math.h"
#include "kvf_ssd.h"
#include "kvf_ssd_math.h"

/* The window's chunks: k0 the first chunk's index in the call, ch the window's chunk k. */
struct kvf_ssd_geo {
    long long pos0;
    int       T, grid, k0;
};

__device__ static void kvf_ssd_chunk(const kvf_ssd_geo g, int ch, int *c, int *L)
{
    kvf_ssd_chunk_at_hd(g.pos0, g.T, g.grid, g.k0 + ch, c, L);
}

/* 1: dts[h][t], cs[h][t] (t relative to the call) of the chunk's tokens */
__global__ void kvf_ssd_cs_kernel(const kvf_ssd_geo g, kvf_mamba2_params_t p, const float *dt,
                                  int lddt, float *dts, float *cs)
{
    const int h = (int)blockIdx.y;
    int c, L;

    kvf_ssd_chunk(g, (int)blockIdx.x, &c, &L);
    if (threadIdx.x != 0) {
        return;
    }
    const float A = kvf_mamba2_A_hd(p.A_log[h]);
    const float bias = (p.dt_bias != NULL) ? p.dt_bias[h] : 0.0f;
    float *d = dts + (size_t)h * (size_t)g.T + c, *s = cs + (size_t)h * (size_t)g.T + c;
    for (int i = 0; i < L; ++i) {
        d[i] = kvf_mamba2_dt_hd(dt[(size_t)(c + i) * (size_t)lddt + (size_t)h], bias, p.dt_min,
                                p.dt_max);
        s[i] = ((i > 0) ? s[i - 1] : 0.0f) + d[i] * A;
    }
}

/* 2: cb[grp][ch][t][s] = C_t . B_s for s <= t */
__global__ void kvf_ssd_cb_kernel(const kvf_ssd_geo g, int ns, int groups, const float *B,
                                  const float *C, int ldbc, float *cb)
{
    const int ch = (int)blockIdx.x, grp = (int)blockIdx.y;
    const size_t G2 = (size_t)g.grid * (size_t)g.grid;
    int c, L;

    kvf_ssd_chunk(g, ch, &c, &L);
    float *out = cb + ((size_t)ch * (size_t)groups + (size_t)grp) * G2;
    for (size_t i = threadIdx.x; i < (size_t)L * (size_t)L; i += blockDim.x) {
        const size_t t = i / (size_t)L, s = i % (size_t)L;
        if (s <= t) {
            out[t * (size_t)g.grid + s] =
                kvf_ssd_dot_hd(C + (size_t)(c + (int)t) * (size_t)ldbc + (size_t)grp * ns,
                               B + (size_t)(c + (int)s) * (size_t)ldbc + (size_t)grp * ns,
                               (size_t)ns);
        }
    }
}

/* 3: the intra-chunk sums into y, and local[ch][h][d][n] */
__global__ void kvf_ssd_intra_kernel(const kvf_ssd_geo g, kvf_mamba2_params_t p, const float *x,
                                     int ldx, const float *B, int ldbc, const float *dts,
                                     const float *cs, const float *cb, float *y, int ldy,
                                     float *local)
{
    const int ch = (int)blockIdx.x, h = (int)blockIdx.y;
    const size_t hd = (size_t)p.head_dim, ns = (size_t)p.state_size;
    const size_t grp = (size_t)(h / (p.heads / p.groups));
    const size_t G2 = (size_t)g.grid * (size_t)g.grid;
    int c, L;

    kvf_ssd_chunk(g, ch, &c, &L);
    const float *d = dts + (size_t)h * (size_t)g.T + c, *s = cs + (size_t)h * (size_t)g.T + c;
    const float *xc = x + (size_t)c * (size_t)ldx + (size_t)h * hd;
    const float *m = cb + ((size_t)ch * (size_t)p.groups + grp) * G2;
    for (size_t i = threadIdx.x; i < (size_t)L * hd; i += blockDim.x) {
        const size_t t = i / hd, e = i % hd;
        y[(size_t)(c + (int)t) * (size_t)ldy + (size_t)h * hd + e] =
            kvf_ssd_intra_hd(m + t * (size_t)g.grid, s, d, t, xc + e, (size_t)ldx);
    }
    float *loc = local + ((size_t)ch * (size_t)p.heads + (size_t)h) * hd * ns;
    const float *Bc = B + (size_t)c * (size_t)ldbc + grp * ns;
    for (size_t i = threadIdx.x; i < hd * ns; i += blockDim.x) {
        const size_t e = i / ns, n = i % ns;
        loc[i] = kvf_ssd_local_hd(s, d, (size_t)L, xc + e, (size_t)ldx, Bc + n, (size_t)ldbc);
    }
}

/* 4: per head, the window's chunks in order; local[ch] becomes the state entering chunk ch */
__global__ void kvf_ssd_pass_kernel(const kvf_ssd_geo g, int nch, int heads, size_t per_head,
                                    const float *cs, float *local, float *S, int sdt)
{
    const int h = (int)blockIdx.x;

    for (size_t i = threadIdx.x; i < per_head; i += blockDim.x) {
        float st = S[(size_t)h * per_head + i];
        for (int ch = 0; ch < nch; ++ch) {
            int c, L;
            kvf_ssd_chunk(g, ch, &c, &L);
            float *slot = local + ((size_t)ch * (size_t)heads + (size_t)h) * per_head + i;
            const float mine = *slot;
            *slot = st;
            st = kvf_ssd_pass_hd(cs[(size_t)h * (size_t)g.T + (size_t)(c + L - 1)], st, mine,
                                 sdt);
        }
        S[(size_t)h * per_head + i] = st;
    }
}

/* 5: y = (intra + exp(cs_t) C_t . S_in) + D x */
__global__ void kvf_ssd_out_kernel(const kvf_ssd_geo g, kvf_mamba2_params_t p, const float *x,
                                   int ldx, const float *C, int ldbc, const float *cs,
                                   const float *local, float *y, int ldy)
{
    const int ch = (int)blockIdx.x, h = (int)blockIdx.y;
    const size_t hd = (size_t)p.head_dim, ns = (size_t)p.state_size;
    const size_t grp = (size_t)(h / (p.heads / p.groups));
    const float Dh = (p.D != NULL) ? p.D[h] : 0.0f;
    int c, L;

    kvf_ssd_chunk(g, ch, &c, &L);
    const float *Sin = local + ((size_t)ch * (size_t)p.heads + (size_t)h) * hd * ns;
    for (size_t i = threadIdx.x; i < (size_t)L * hd; i += blockDim.x) {
        const size_t t = i / hd, e = i % hd, row = (size_t)(c + (int)t);
        float *yo = y + row * (size_t)ldy + (size_t)h * hd + e;
        const float cs0 = kvf_ssd_dot_hd(C + row * (size_t)ldbc + grp * ns, Sin + e * ns, ns);
        *yo = kvf_ssd_out_hd(*yo, cs[(size_t)h * (size_t)g.T + row], cs0, Dh,
                             x[row * (size_t)ldx + (size_t)h * hd + e]);
    }
}

/* the stored state to fp32 (zeros for a fresh request: its bytes are not read), and back */
__global__ void kvf_ssd_state_kernel(void *state, int sdt, int has_state, float *S, size_t n,
                                     int store)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        if (store) {
            kvf_hd_store(state, sdt, i, S[i]);
        } else {
            S[i] = has_state ? kvf_hd_load(state, sdt, i) : 0.0f;
        }
    }
}

#define KVF_SSD_THREADS 256

/* The five launches of one window of @a nch chunks. */
static int kvf_ssd_window(cudaStream_t st, const kvf_ssd_geo g, int nch,
                          const kvf_mamba2_params_t *p, const float *x, int ldx, const float *B,
                          const float *C, int ldbc, float *y, int ldy, float *dts, float *cs,
                          float *cb, float *local, float *S, int sdt)
{
    const size_t per_head = (size_t)p->head_dim * (size_t)p->state_size;
    const dim3 by_head((unsigned)nch, (unsigned)p->heads), by_group((unsigned)nch,
                                                                  (unsigned)p->groups);

    kvf_ssd_cb_kernel<<<by_group, KVF_SSD_THREADS, 0, st>>>(g, p->state_size, p->groups, B, C,
                                                            ldbc, cb);
    kvf_ssd_intra_kernel<<<by_head, KVF_SSD_THREADS, 0, st>>>(g, *p, x, ldx, B, ldbc, dts, cs,
                                                              cb, y, ldy, local);
    kvf_ssd_pass_kernel<<<(unsigned)p->heads, KVF_SSD_THREADS, 0, st>>>(g, nch, p->heads,
                                                                        per_head, cs, local, S,
                                                                        sdt);
    kvf_ssd_out_kernel<<<by_head, KVF_SSD_THREADS, 0, st>>>(g, *p, x, ldx, C, ldbc, cs, local,
                                                            y, ldy);
    return kvf_cuda_launched("kvf_ssd window kernels");
}

extern "C" int kvf_cuda_ssd_scan(const kvf_device_t *dev, const kvf_mamba2_params_t *p, int T,
                                 long long pos0, int grid, const float *x, int ldx,
                                 const float *dt, int lddt, const float *B, const float *C,
                                 int ldbc, void *state, int state_dtype, int has_state, float *y,
                                 int ldy)
{
    cudaStream_t st = kvf_cuda_stream_of(dev);
    const int nchunks = kvf_ssd_chunks(pos0, T, grid, NULL, NULL, 0);
    const int W = (nchunks < KVF_SSD_WINDOW_CHUNKS) ? nchunks : KVF_SSD_WINDOW_CHUNKS;
    const size_t per_head = (size_t)p->head_dim * (size_t)p->state_size;
    const size_t n_state = (size_t)p->heads * per_head;
    const size_t f_dts = (size_t)p->heads * (size_t)T, f_cb = (size_t)p->groups * (size_t)W *
                                                              (size_t)grid * (size_t)grid;
    /* the layout below; its size is kvf_ssd_scratch_bytes() (the workspace sizes by it) */
    const size_t bytes = kvf_ssd_scratch_bytes(p, T, pos0, grid);
    void *scratch = NULL;
    int rc;

    if (nchunks <= 0) {
        return (nchunks == 0) ? KVF_KERN_OK : KVF_KERN_EINVAL;
    }
    KVF_CUDA_CHECK(cudaSetDevice(dev->ordinal));
    rc = kvf_cuda_scratch(st, bytes, NULL, &scratch);
    if (rc != KVF_KERN_OK) {
        return rc;
    }
    float *dts = (float *)scratch, *cs = dts + f_dts, *cb = cs + f_dts, *local = cb + f_cb;
    float *S = local + (size_t)W * n_state;
    kvf_ssd_geo g = {pos0, T, grid, 0};

    kvf_ssd_state_kernel<<<kvf_cuda_blocks(n_state), KVF_CUDA_THREADS, 0, st>>>(
        state, state_dtype, has_state, S, n_state, 0);
    kvf_ssd_cs_kernel<<<dim3((unsigned)nchunks, (unsigned)p->heads), 32, 0, st>>>(
        g, *p, dt, lddt, dts, cs);
    rc = kvf_cuda_launched("kvf_ssd_cs_kernel");
    for (int k0 = 0; (rc == KVF_KERN_OK) && (k0 < nchunks); k0 += W) {
        g.k0 = k0;
        rc = kvf_ssd_window(st, g, (nchunks - k0 < W) ? (nchunks - k0) : W, p, x, ldx, B, C,
                            ldbc, y, ldy, dts, cs, cb, local, S, state_dtype);
    }
    if (rc == KVF_KERN_OK) {
        kvf_ssd_state_kernel<<<kvf_cuda_blocks(n_state), KVF_CUDA_THREADS, 0, st>>>(
            state, state_dtype, has_state, S, n_state, 1);
        rc = kvf_cuda_launched("kvf_ssd_state_kernel");
    }
    kvf_cuda_scratch_free(st, scratch);
    return rc;
}
