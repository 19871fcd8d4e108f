/*
 * The chunked Gated DeltaNet prompt scan (kvf_gdn.h, kvf_gdn_scan_chunked): argument
 * checks, its scratch size, the CPU reference of the chunked math (a plain loop over
 * kvf_gdn_chunk_math.h's per-element functions, in the order the CUDA kernels use) and
 * the dispatch to CUDA. The chunks are the Mamba2 chunked scan's (kvf_ssd_math.h): cut at
 * absolute multiples of the state grid.
 */
#include "kvf_gdn.h"
#include "kvf_gdn_chunk_math.h"
#include "kvf_kern_internal.h"
#include "kvf_ssd.h"
#include "kvf_ssd_math.h"
#ifdef KVF_HAVE_CUDA
#include "kvf_device_cuda.h"
#endif

#include <stdlib.h>
#include <string.h>

size_t kvf_gdn_scratch_bytes(const kvf_gdn_params_t *p, int T, int grid)
{
    /* the worst position (one before a grid multiple) leaves one token in the first chunk */
    const long long nch = ((grid >= 1) && (T >= 1)) ? ((long long)T + grid - 2) / grid + 1 : 0;
    const long long per = (grid >= 1) ? ((KVF_GDN_WINDOW_TOKENS / grid > 0) ?
                                         KVF_GDN_WINDOW_TOKENS / grid : 1) : 0;
    size_t W, Lw, G, dk, dv, n;

    if ((p == NULL) || (nch <= 0)) {
        return 0;
    }
    W = (size_t)((nch < per) ? nch : per);
    G = (size_t)grid;
    Lw = W * G;
    dk = (size_t)p->key_dim;
    dv = (size_t)p->head_dim;
    n = (size_t)p->heads * dv * dk + Lw * (2 * (size_t)p->groups * dk + 3 * (size_t)p->heads) +
        W * (size_t)p->heads * (2 * G * G + G * (dk + dv));
    return 4 * n;
}

typedef struct {
    const kvf_gdn_params_t *p;
    const float *xbc, *ba;
    size_t ldx, ldba, ldy;
    float *y;
    int sdt;
} kvf_gdn_ref_t;

/* One chunk [c, c + L) (relative to the call) of value head @a h: S [dv][dk] the fp32 state
 * entering it, left as the state leaving it; w: the chunk's scratch (kvf_gdn_ref). */
static void kvf_gdn_ref_chunk(const kvf_gdn_ref_t *j, int h, size_t c, size_t L, float *S,
                              float *w)
{
    const kvf_gdn_params_t *p = j->p;
    const size_t dk = (size_t)p->key_dim, dv = (size_t)p->head_dim, G = (size_t)KVF_GDN_MAX_GRID;
    const size_t g = (size_t)(h / (p->heads / p->groups)), vd = (size_t)p->heads * dv;
    const float qscale = 1.0f / sqrtf((float)p->key_dim);
    float *kn = w, *qn = kn + G * dk, *cs = qn + G * dk, *beta = cs + G, *coef = beta + G;
    float *A = coef + G, *Tm = A + G * G, *Wm = Tm + G * G, *U = Wm + G * dk, *yi = U + G * dv;
    const float *v = j->xbc + c * j->ldx + (size_t)h * dv;

    for (size_t t = 0; t < L; ++t) {
        const float *row = j->xbc + (c + t) * j->ldx, *brow = j->ba + (c + t) * j->ldba;
        const float *kin = row + vd + g * dk, *qin = row + vd + (size_t)p->groups * dk + g * dk;
        const float kinv = kvf_gdn_inv_l2_hd(kin, p->key_dim);
        const float qinv = kvf_gdn_inv_l2_hd(qin, p->key_dim);
        for (size_t i = 0; i < dk; ++i) {
            kn[t * dk + i] = kin[i] * kinv;
            qn[t * dk + i] = (qin[i] * qinv) * qscale;
        }
        cs[t] = ((t > 0) ? cs[t - 1] : 0.0f) +
                kvf_gdn_logdecay_hd(p->A_log[h], brow[p->heads + h], p->dt_bias[h]);
        beta[t] = kvf_gdn_sigmoid_hd(brow[h]);
        coef[t] = beta[t] * expf(cs[t]);
    }
    for (size_t t = 0; t < L; ++t) {
        for (size_t s = 0; s < t; ++s) {
            A[t * G + s] = kvf_gdn_a_hd(beta[t], cs[t], cs[s],
                                        kvf_gdn_dot_hd(kn + t * dk, kn + s * dk, 1, dk));
        }
    }
    for (size_t col = 0; col < L; ++col) {
        kvf_gdn_tcol_hd(A, Tm, G, L, col);
    }
    for (size_t t = 0; t < L; ++t) {
        for (size_t i = 0; i < dk; ++i) {
            Wm[t * dk + i] = kvf_gdn_tmul_hd(Tm + t * G, coef, t, kn + i, dk);
        }
        for (size_t e = 0; e < dv; ++e) {
            U[t * dv + e] = kvf_gdn_tmul_hd(Tm + t * G, beta, t, v + e, j->ldx);
        }
        for (size_t s = 0; s <= t; ++s) {   /* M replaces A */
            A[t * G + s] = kvf_gdn_m_hd(cs[t], cs[s],
                                        kvf_gdn_dot_hd(qn + t * dk, kn + s * dk, 1, dk));
        }
    }
    for (size_t e = 0; e < dv; ++e) {
        float *Sj = S + e * dk;
        for (size_t t = 0; t < L; ++t) {
            U[t * dv + e] -= kvf_gdn_dot_hd(Wm + t * dk, Sj, 1, dk);   /* u_t[e] */
            yi[t] = expf(cs[t]) * kvf_gdn_dot_hd(qn + t * dk, Sj, 1, dk);
        }
        for (size_t t = 0; t < L; ++t) {
            j->y[(c + t) * j->ldy + (size_t)h * dv + e] =
                kvf_gdn_yout_hd(yi[t], A + t * G, t, U + e, dv);
        }
        for (size_t i = 0; i < dk; ++i) {
            Sj[i] = kvf_gdn_snew_hd(cs, L, Sj[i], U + e, dv, kn + i, dk, j->sdt);
        }
    }
}

static int kvf_gdn_ref(const kvf_gdn_ref_t *j, int T, long long pos0, int grid, void *state,
                       kvf_dtype_t state_dtype, int has_state)
{
    const kvf_gdn_params_t *p = j->p;
    const size_t dk = (size_t)p->key_dim, dv = (size_t)p->head_dim, G = KVF_GDN_MAX_GRID;
    const size_t per_head = dv * dk;
    const size_t wn = 2 * G * dk + 4 * G + 2 * G * G + G * (dk + dv);
    float *S = malloc((per_head + wn) * sizeof(float));

    if (S == NULL) {
        return KVF_KERN_ENOMEM;
    }
    for (int h = 0; h < p->heads; ++h) {
        if (has_state) {
            kvf_kern_load(state, state_dtype, (size_t)h * per_head, per_head, S);
        } else {
            memset(S, 0, per_head * sizeof(float));
        }
        for (long long pos = pos0; pos < pos0 + T;) {
            const long long e = kvf_ssd_chunk_end_hd(pos, pos0 + T, grid);
            kvf_gdn_ref_chunk(j, h, (size_t)(pos - pos0), (size_t)(e - pos), S, S + per_head);
            pos = e;
        }
        kvf_kern_store(state, state_dtype, (size_t)h * per_head, per_head, S);
    }
    free(S);
    return KVF_KERN_OK;
}

int kvf_gdn_scan_chunked(const kvf_device_t *dev, const kvf_gdn_params_t *p, int T,
                         long long pos0, int grid, const float *xbc, int ldx, const float *ba,
                         int ldba, void *state, kvf_dtype_t state_dtype, int has_state,
                         float *y, int ldy)
{
    if (kvf_gdn_args_bad(p, T, xbc, ldx, ba, ldba, state, state_dtype, y, ldy) || (pos0 < 0) ||
        (grid < 1) || (grid > KVF_GDN_MAX_GRID)) {
        return KVF_KERN_EINVAL;
    }
    if (T == 0) {
        return KVF_KERN_OK;
    }
    if (!kvf_kern_on_cpu(dev)) {
#ifdef KVF_HAVE_CUDA
        return kvf_cuda_gdn_scan_chunked(dev, p, T, pos0, grid, xbc, ldx, ba, ldba, state,
                                         (int)state_dtype, has_state, y, ldy);
#else
        return KVF_KERN_EUNSUPPORTED;
#endif
    }
    const kvf_gdn_ref_t j = {.p = p, .xbc = xbc, .ba = ba, .ldx = (size_t)ldx,
                             .ldba = (size_t)ldba, .ldy = (size_t)ldy, .y = y,
                             .sdt = (int)state_dtype};
    return kvf_gdn_ref(&j, T, pos0, grid, state, state_dtype, has_state);
}
