/*
 * The chunked Gated DeltaNet prompt scan on a GPU (kvf_gdn.h, kvf_gdn_scan_chunked): the
 * WY / UT-transform form of kvf_gdn_chunk_math.h, chunks cut at absolute multiples of the
 * state grid (kvf_ssd_math.h's chunk functions), the state rounded at chunk ends only. Each
 * element is one of kvf_gdn_chunk_math.h's functions, in the CPU reference's order.
 *
 * Per window of up to max(1, KVF_GDN_WINDOW_TOKENS / grid) chunks (windows one after
 * another on the stream):
 *   1. per (token, key head), one thread: k and q l2-normed (q times 1/sqrt(key_dim));
 *   2. per (chunk, value head), one block: the running sum cs of the log decays and beta
 *      (thread 0, the reference's serial order), then A, its inverse column by column, W,
 *      Ut and the masked q.k matrix M (each element a thread) -- every chunk at once;
 *   3. per (value head, tile of 32 state rows), one block over the window's chunks in
 *      order: u = Ut - W S0 and exp(cs) q.S0 (a thread per (token, row)), then y = that +
 *      M u and S = round(exp(cs_last) S0 + sum exp(cs_last - cs_s) u_s k_s) (a thread per
 *      state element). State rows are independent in the recurrence: no block waits on
 *      another.
 * The fp32 state is scratch between windows; the stored state (its dtype) is read before
 * the first window and written after the last. Why it is faster than kvf_gdn_scan_kernel
 * (one thread per state row, token after token): step 2 is parallel over every chunk and
 * step 3 over the chunk's tokens, where the token kernel has heads * head_dim threads
 * walking T tokens. Rejected for now: tensor cores for the GEMM-shaped products (W S0, M u,
 * the state update); this is fp32 FMA arithmetic, its first GPU run is still to come.
 */
#include "kvf_cuda_util.h"
#include "kvf_device_cuda.h"
#include "kvf_dtype_math.h"
#include "kvf_gdn_chunk_math.h"
#include "kvf_ssd.h"
#include "kvf_ssd_math.h"

struct kvf_gdn_geo {
    long long pos0;
    int       T, grid, k0, c0, Lw;   /* window: first chunk k0, first token c0, Lw tokens room */
};

struct kvf_gdn_dims {
    int          heads, dv, groups, dk;
    const float *dt_bias, *A_log;
};

/* 1: kn[tw][g][i], qn[tw][g][i] of the window's nt tokens */
__global__ void kvf_gdn_ck_norm_kernel(const kvf_gdn_geo g, kvf_gdn_dims d, int nt,
                                       const float *xbc, int ldx, float *kn, float *qn)
{
    const size_t dk = (size_t)d.dk, vd = (size_t)d.heads * (size_t)d.dv;
    const size_t n = (size_t)nt * (size_t)d.groups;
    const float qscale = 1.0f / sqrtf((float)d.dk);

    for (size_t r = (size_t)blockIdx.x * blockDim.x + threadIdx.x; r < n;
         r += (size_t)gridDim.x * blockDim.x) {
        const size_t tw = r / (size_t)d.groups, grp = r % (size_t)d.groups;
        const float *row = xbc + (size_t)(g.c0 + (int)tw) * (size_t)ldx;
        const float *kin = row + vd + grp * dk, *qin = row + vd + (size_t)d.groups * dk + grp * dk;
        const float kinv = kvf_gdn_inv_l2_hd(kin, d.dk), qinv = kvf_gdn_inv_l2_hd(qin, d.dk);
        for (size_t i = 0; i < dk; ++i) {
            kn[r * dk + i] = kin[i] * kinv;
            qn[r * dk + i] = (qin[i] * qinv) * qscale;
        }
    }
}

/* 2: per (chunk, head): cs, beta, coef; A -> Tm; W, Ut, M (M over A) */
__global__ void kvf_gdn_ck_chunk_kernel(const kvf_gdn_geo g, kvf_gdn_dims d, const float *xbc,
                                        int ldx, const float *ba, int ldba, const float *kn,
                                        const float *qn, float *csb, float *betab,
                                        float *coefb, float *mats)
{
    const int ch = (int)blockIdx.x, h = (int)blockIdx.y;
    const size_t dk = (size_t)d.dk, dv = (size_t)d.dv, G = (size_t)g.grid, kst = (size_t)d.groups * dk;
    const size_t grp = (size_t)(h / (d.heads / d.groups));
    int c, Li;

    kvf_ssd_chunk_at_hd(g.pos0, g.T, g.grid, g.k0 + ch, &c, &Li);
    const size_t L = (size_t)Li, tw0 = (size_t)(c - g.c0);
    float *cs = csb + (size_t)h * (size_t)g.Lw + tw0, *beta = betab + (size_t)h * (size_t)g.Lw + tw0;
    float *coef = coefb + (size_t)h * (size_t)g.Lw + tw0;
    float *A = mats + ((size_t)ch * (size_t)d.heads + (size_t)h) * (2 * G * G + G * (dk + dv));
    float *Tm = A + G * G, *Wm = Tm + G * G, *U = Wm + G * dk;
    const float *kc = kn + tw0 * kst + grp * dk, *qc = qn + tw0 * kst + grp * dk;
    const float *v = xbc + (size_t)c * (size_t)ldx + (size_t)h * dv;

    if (threadIdx.x == 0) {
        for (size_t t = 0; t < L; ++t) {
            const float *brow = ba + (size_t)(c + (int)t) * (size_t)ldba;
            cs[t] = ((t > 0) ? cs[t - 1] : 0.0f) +
                    kvf_gdn_logdecay_hd(d.A_log[h], brow[d.heads + h], d.dt_bias[h]);
            beta[t] = kvf_gdn_sigmoid_hd(brow[h]);
            coef[t] = beta[t] * expf(cs[t]);
        }
    }
    __syncthreads();
    for (size_t e = threadIdx.x; e < L * L; e += blockDim.x) {
        const size_t t = e / L, s = e % L;
        if (s < t) {
            A[t * G + s] = kvf_gdn_a_hd(beta[t], cs[t], cs[s],
                                        kvf_gdn_dot_hd(kc + t * kst, kc + s * kst, 1, dk));
        }
    }
    __syncthreads();
    for (size_t col = threadIdx.x; col < L; col += blockDim.x) {
        kvf_gdn_tcol_hd(A, Tm, G, L, col);
    }
    __syncthreads();
    for (size_t e = threadIdx.x; e < L * dk; e += blockDim.x) {
        const size_t t = e / dk, i = e % dk;
        Wm[t * dk + i] = kvf_gdn_tmul_hd(Tm + t * G, coef, t, kc + i, kst);
    }
    for (size_t e = threadIdx.x; e < L * dv; e += blockDim.x) {
        const size_t t = e / dv, j = e % dv;
        U[t * dv + j] = kvf_gdn_tmul_hd(Tm + t * G, beta, t, v + j, (size_t)ldx);
    }
    for (size_t e = threadIdx.x; e < L * L; e += blockDim.x) {
        const size_t t = e / L, s = e % L;
        if (s <= t) {
            A[t * G + s] = kvf_gdn_m_hd(cs[t], cs[s],
                                        kvf_gdn_dot_hd(qc + t * kst, kc + s * kst, 1, dk));
        }
    }
}

#define KVF_GDN_ROWS 32   /* state rows a block of step 3 */

/* 3: per (head, row tile), the window's nch chunks in order */
__global__ void kvf_gdn_ck_pass_kernel(const kvf_gdn_geo g, kvf_gdn_dims d, int nch,
                                       const float *kn, const float *qn, const float *csb,
                                       float *mats, float *Sf, float *y, int ldy, int sdt)
{
    const int h = (int)blockIdx.x;
    const size_t dk = (size_t)d.dk, dv = (size_t)d.dv, G = (size_t)g.grid, kst = (size_t)d.groups * dk;
    const size_t grp = (size_t)(h / (d.heads / d.groups));
    const size_t j0 = (size_t)blockIdx.y * KVF_GDN_ROWS;
    const size_t jt = (dv - j0 < KVF_GDN_ROWS) ? dv - j0 : KVF_GDN_ROWS;

    for (int ch = 0; ch < nch; ++ch) {
        int c, Li;
        kvf_ssd_chunk_at_hd(g.pos0, g.T, g.grid, g.k0 + ch, &c, &Li);
        const size_t L = (size_t)Li, tw0 = (size_t)(c - g.c0);
        const float *cs = csb + (size_t)h * (size_t)g.Lw + tw0;
        float *M = mats + ((size_t)ch * (size_t)d.heads + (size_t)h) * (2 * G * G +
                                                                       G * (dk + dv));
        const float *Wm = M + 2 * G * G;
        float *U = M + 2 * G * G + G * dk;
        const float *kc = kn + tw0 * kst + grp * dk, *qc = qn + tw0 * kst + grp * dk;
        for (size_t e = threadIdx.x; e < L * jt; e += blockDim.x) {
            const size_t t = e / jt, j = j0 + e % jt;
            const float *Sj = Sf + ((size_t)h * dv + j) * dk;
            U[t * dv + j] -= kvf_gdn_dot_hd(Wm + t * dk, Sj, 1, dk);
            y[(size_t)(c + (int)t) * (size_t)ldy + (size_t)h * dv + j] =
                expf(cs[t]) * kvf_gdn_dot_hd(qc + t * kst, Sj, 1, dk);
        }
        __syncthreads();
        for (size_t e = threadIdx.x; e < L * jt; e += blockDim.x) {
            const size_t t = e / jt, j = j0 + e % jt;
            float *yo = y + (size_t)(c + (int)t) * (size_t)ldy + (size_t)h * dv + j;
            *yo = kvf_gdn_yout_hd(*yo, M + t * G, t, U + j, dv);
        }
        for (size_t e = threadIdx.x; e < jt * dk; e += blockDim.x) {
            const size_t j = j0 + e / dk, i = e % dk;
            float *s = Sf + ((size_t)h * dv + j) * dk + i;
            *s = kvf_gdn_snew_hd(cs, L, *s, U + j, dv, kc + i, kst, sdt);
        }
        __syncthreads();
    }
}

/* the stored state to fp32 (zeros for a fresh request: its bytes are not read), and back */
__global__ void kvf_gdn_ck_state_kernel(void *state, int sdt, int has_state, float *S, size_t n,
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

#define KVF_GDN_CK_THREADS 256

extern "C" int kvf_cuda_gdn_scan_chunked(const kvf_device_t *dev, const kvf_gdn_params_t *p,
                                         int T, long long pos0, int grid, const float *xbc,
                                         int ldx, const float *ba, int ldba, void *state,
                                         int state_dtype, int has_state, float *y, int ldy)
{
    cudaStream_t st = kvf_cuda_stream_of(dev);
    const int nchunks = kvf_ssd_chunks(pos0, T, grid, NULL, NULL, 0);
    const int per = (KVF_GDN_WINDOW_TOKENS / grid > 0) ? KVF_GDN_WINDOW_TOKENS / grid : 1;
    const int W = (nchunks < per) ? nchunks : per;
    const size_t dk = (size_t)p->key_dim, dv = (size_t)p->head_dim, G = (size_t)grid;
    const size_t n_state = (size_t)p->heads * dv * dk, Lw = (size_t)W * G;
    const kvf_gdn_dims d = {p->heads, p->head_dim, p->groups, p->key_dim, p->dt_bias, p->A_log};
    void *scratch = NULL;
    int rc;

    if (nchunks <= 0) {
        return (nchunks == 0) ? KVF_KERN_OK : KVF_KERN_EINVAL;
    }
    KVF_CUDA_CHECK(cudaSetDevice(dev->ordinal));
    /* the layout below; its size is kvf_gdn_scratch_bytes() (the workspace sizes by it) */
    rc = kvf_cuda_scratch(st, kvf_gdn_scratch_bytes(p, T, grid), NULL, &scratch);
    if (rc != KVF_KERN_OK) {
        return rc;
    }
    float *S = (float *)scratch, *kn = S + n_state, *qn = kn + Lw * (size_t)p->groups * dk;
    float *cs = qn + Lw * (size_t)p->groups * dk, *beta = cs + (size_t)p->heads * Lw;
    float *coef = beta + (size_t)p->heads * Lw, *mats = coef + (size_t)p->heads * Lw;

    kvf_gdn_ck_state_kernel<<<kvf_cuda_blocks(n_state), KVF_CUDA_THREADS, 0, st>>>(
        state, state_dtype, has_state, S, n_state, 0);
    rc = kvf_cuda_launched("kvf_gdn_ck_state_kernel");
    for (int k0 = 0; (rc == KVF_KERN_OK) && (k0 < nchunks); k0 += W) {
        const int nch = (nchunks - k0 < W) ? (nchunks - k0) : W;
        int c0, L0, cl, Ll;
        kvf_ssd_chunk_at_hd(pos0, T, grid, k0, &c0, &L0);
        kvf_ssd_chunk_at_hd(pos0, T, grid, k0 + nch - 1, &cl, &Ll);
        const int nt = cl + Ll - c0;
        const kvf_gdn_geo g = {pos0, T, grid, k0, c0, (int)Lw};
        const size_t nrows = (size_t)nt * (size_t)p->groups;

        kvf_gdn_ck_norm_kernel<<<kvf_cuda_blocks_for(nrows, 64), 64, 0, st>>>(g, d, nt, xbc, ldx,
                                                                              kn, qn);
        kvf_gdn_ck_chunk_kernel<<<dim3((unsigned)nch, (unsigned)p->heads), KVF_GDN_CK_THREADS, 0,
                                  st>>>(g, d, xbc, ldx, ba, ldba, kn, qn, cs, beta, coef, mats);
        kvf_gdn_ck_pass_kernel<<<dim3((unsigned)p->heads,
                                      (unsigned)((dv + KVF_GDN_ROWS - 1) / KVF_GDN_ROWS)),
                                 KVF_GDN_CK_THREADS, 0, st>>>(g, d, nch, kn, qn, cs, mats, S, y,
                                                              ldy, state_dtype);
        rc = kvf_cuda_launched("kvf_gdn chunked window kernels");
    }
    if (rc == KVF_KERN_OK) {
        kvf_gdn_ck_state_kernel<<<kvf_cuda_blocks(n_state), KVF_CUDA_THREADS, 0, st>>>(
            state, state_dtype, has_state, S, n_state, 1);
        rc = kvf_cuda_launched("kvf_gdn_ck_state_kernel");
    }
    kvf_cuda_scratch_free(st, scratch);
    return rc;
}
