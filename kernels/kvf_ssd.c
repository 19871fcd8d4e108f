/*
 * The chunked (SSD) Mamba2 prompt scan: the chunk list, argument checks, the CPU reference
 * of the chunked math (a plain loop over kvf_ssd_math.h's per-element functions, in the
 * order the CUDA kernels use) and the dispatch to CUDA. kvf_ssd.h says why.
 */
#include "kvf_ssd.h"
#include "kvf_kern_internal.h"
#include "kvf_ssd_math.h"
#ifdef KVF_HAVE_CUDA
#include "kvf_device_cuda.h"
#endif

#include <stdlib.h>
#include <string.h>

int kvf_ssd_chunks(long long pos0, int T, int grid, long long *starts, int *lens, int cap)
{
    long long pos = pos0, end = pos0 + T;
    int n = 0;

    if ((T < 0) || (pos0 < 0) || (grid < 1)) {
        return -1;
    }
    while (pos < end) {
        long long e = kvf_ssd_chunk_end_hd(pos, end, grid);
        if (n < cap) {
            if (starts != NULL) {
                starts[n] = pos;
            }
            if (lens != NULL) {
                lens[n] = (int)(e - pos);
            }
        }
        ++n;
        pos = e;
    }
    return n;
}

size_t kvf_ssd_scratch_bytes(const kvf_mamba2_params_t *p, int T, long long pos0, int grid)
{
    /* the worst pos0 (one before a grid multiple) leaves one token in the first chunk and
     * T - 1 for the rest */
    const long long nch = (pos0 >= 0) ? kvf_ssd_chunks(pos0, T, grid, NULL, NULL, 0) :
                          ((grid >= 1) && (T >= 1)) ? ((long long)T + grid - 2) / grid + 1 : -1;
    const size_t W = (size_t)((nch < KVF_SSD_WINDOW_CHUNKS) ? nch : KVF_SSD_WINDOW_CHUNKS);
    size_t n_state;

    if ((p == NULL) || (T <= 0) || (nch <= 0)) {
        return 0;
    }
    n_state = (size_t)p->heads * (size_t)p->head_dim * (size_t)p->state_size;
    return 4 * (2 * (size_t)p->heads * (size_t)T +
                (size_t)p->groups * W * (size_t)grid * (size_t)grid + (W + 1) * n_state);
}

typedef struct {
    const kvf_mamba2_params_t *p;
    size_t ldx, lddt, ldbc, ldy;
    const float *x, *dt, *B, *C;
    float *y;
    int sdt;
} kvf_ssd_ref_t;

/* One chunk of head @a h: [c, c + L) relative to the call's first token; S [hd][ns] the
 * state entering it, left as the state leaving it; w: 2 * L + L floats of scratch. */
static void kvf_ssd_ref_chunk(const kvf_ssd_ref_t *j, int h, size_t c, size_t L, float *S,
                              float *w)
{
    const kvf_mamba2_params_t *p = j->p;
    const size_t hd = (size_t)p->head_dim, ns = (size_t)p->state_size;
    const size_t g = (size_t)(h / (p->heads / p->groups));
    const float A = kvf_mamba2_A_hd(p->A_log[h]), Dh = (p->D != NULL) ? p->D[h] : 0.0f;
    const float bias = (p->dt_bias != NULL) ? p->dt_bias[h] : 0.0f;
    const float *x = j->x + c * j->ldx + (size_t)h * hd;
    const float *B = j->B + c * j->ldbc + g * ns, *C = j->C + c * j->ldbc + g * ns;
    float *dts = w, *cs = w + L, *cb = w + 2 * L;

    for (size_t s = 0; s < L; ++s) {
        dts[s] = kvf_mamba2_dt_hd(j->dt[(c + s) * j->lddt + (size_t)h], bias, p->dt_min,
                                  p->dt_max);
        cs[s] = ((s > 0) ? cs[s - 1] : 0.0f) + dts[s] * A;
    }
    for (size_t t = 0; t < L; ++t) {
        for (size_t s = 0; s <= t; ++s) {
            cb[s] = kvf_ssd_dot_hd(C + t * j->ldbc, B + s * j->ldbc, ns);
        }
        for (size_t d = 0; d < hd; ++d) {
            float intra = kvf_ssd_intra_hd(cb, cs, dts, t, x + d, j->ldx);
            float cs0 = kvf_ssd_dot_hd(C + t * j->ldbc, S + d * ns, ns);
            j->y[(c + t) * j->ldy + (size_t)h * hd + d] =
                kvf_ssd_out_hd(intra, cs[t], cs0, Dh, x[t * j->ldx + d]);
        }
    }
    for (size_t d = 0; d < hd; ++d) {
        for (size_t n = 0; n < ns; ++n) {
            float local = kvf_ssd_local_hd(cs, dts, L, x + d, j->ldx, B + n, j->ldbc);
            S[d * ns + n] = kvf_ssd_pass_hd(cs[L - 1], S[d * ns + n], local, j->sdt);
        }
    }
}

static int kvf_ssd_ref(const kvf_ssd_ref_t *j, int T, long long pos0, int grid, void *state,
                       kvf_dtype_t state_dtype, int has_state)
{
    const kvf_mamba2_params_t *p = j->p;
    const size_t per_head = (size_t)p->head_dim * (size_t)p->state_size;
    float *S = malloc((per_head + 3 * (size_t)grid) * sizeof(float));

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
            long long e = kvf_ssd_chunk_end_hd(pos, pos0 + T, grid);
            kvf_ssd_ref_chunk(j, h, (size_t)(pos - pos0), (size_t)(e - pos), S, S + per_head);
            pos = e;
        }
        kvf_kern_store(state, state_dtype, (size_t)h * per_head, per_head, S);
    }
    free(S);
    return KVF_KERN_OK;
}

int kvf_mamba2_scan_chunked(const kvf_device_t *dev, const kvf_mamba2_params_t *p, int T,
                            long long pos0, int grid, const float *x, int ldx, const float *dt,
                            int lddt, const float *B, const float *C, int ldbc, void *state,
                            kvf_dtype_t state_dtype, int has_state, float *y, int ldy)
{
    if ((T < 0) || (pos0 < 0) || (grid < 1) || (grid > KVF_SSD_MAX_GRID) || (p == NULL) ||
        (p->heads <= 0) || (p->head_dim <= 0) || (p->groups <= 0) || (p->state_size <= 0) ||
        ((p->heads % p->groups) != 0) || (p->A_log == NULL) || !(p->dt_max >= p->dt_min) ||
        (state == NULL) || !kvf_kern_cache_dtype_ok(state_dtype) ||
        (ldx < p->heads * p->head_dim) || (lddt < p->heads) ||
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
        return kvf_cuda_ssd_scan(dev, p, T, pos0, grid, x, ldx, dt, lddt, B, C, ldbc, state,
                                 (int)state_dtype, has_state, y, ldy);
#else
        return KVF_KERN_EUNSUPPORTED;
#endif
    }
    const kvf_ssd_ref_t j = {.p = p, .ldx = (size_t)ldx, .lddt = (size_t)lddt,
                             .ldbc = (size_t)ldbc, .ldy = (size_t)ldy, .x = x, .dt = dt,
                             .B = B, .C = C, .y = y, .sdt = (int)state_dtype};
    return kvf_ssd_ref(&j, T, pos0, grid, state, state_dtype, has_state);
}
