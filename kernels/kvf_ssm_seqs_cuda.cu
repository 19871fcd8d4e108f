/*
 * CUDA Mamba2 decode step of a batch (kvf_ssm_seqs.h): one upload of every
 * request's state pointers, row and dt clamp, then the conv step (one thread
 * per (request, channel)) and the state update (one thread per (request,
 * head, head-dim) row), each the body of the one-request kernels in
 * kvf_ssm_cuda.cu (kvf_ssm_math.h), so every request gets those kernels'
 * bits. A state row is updated in place: fp32 exactly as the one-request
 * kernel's trip through scratch; a 16-bit (or fp8) state element by element,
 * loaded, updated and stored rounded (kvf_mamba2_row_state_hd), the rounding
 * the one-request kernel applies before its store.
 * Rejected: a thread-local fp32 row for 16-bit states (up to 4 KiB of local
 * memory a thread, reserved for every resident thread of the GPU).
 */
#include "kvf_cuda_util.h"
#include "kvf_device_cuda.h"
#include "kvf_dtype_math.h"
#include "kvf_gdn_math.h"
#include "kvf_ssm_math.h"

#include <stdlib.h>
#include <string.h>

/* the per-request arrays on the device: [S] conv states, [S] SSM states, [S] rows, [S] dt_min,
 * [S] dt_max */
struct kvf_cuda_ssm_seqs {
    void *const *conv, *const *ssm;
    const int   *rows;
    const float *dt_min, *dt_max;
    int          n;
};

__global__ void kvf_conv_step_seqs_kernel(kvf_cuda_ssm_seqs s, const float *x_in, int ld_in,
                                          int channels, int kernel, const float *w,
                                          const float *bias, int dtype, float *xbc, int ld_xbc)
{
    const size_t taps = (size_t)(kernel - 1);
    float hist[KVF_CONV_KERNEL_MAX];

    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
         i < (size_t)s.n * (size_t)channels; i += (size_t)gridDim.x * blockDim.x) {
        const size_t q = i / (size_t)channels, c = i % (size_t)channels;
        const size_t r = (size_t)s.rows[q];
        void *state = s.conv[q];
        float b = (bias != NULL) ? bias[c] : 0.0f;
        for (size_t k = 0; k < taps; ++k) {
            hist[k] = kvf_hd_load(state, dtype, c * taps + k);
        }
        hist[taps] = x_in[r * (size_t)ld_in + c];
        for (size_t k = 0; k < taps; ++k) {
            kvf_hd_store(state, dtype, c * taps + k, hist[k + 1]);
        }
        xbc[r * (size_t)ld_xbc + c] = kvf_conv_tap_sum(w + c * (size_t)kernel, hist, kernel, b,
                                                       1);
    }
}

struct kvf_cuda_ssm_layer {
    int          heads, head_dim, groups, ns;
    const float *dt_bias, *A_log, *D;
};

__global__ void kvf_mamba2_step_seqs_kernel(kvf_cuda_ssm_seqs s, kvf_cuda_ssm_layer p,
                                            const float *xbc, int ld_xbc, const float *dt,
                                            int lddt, int dtype, float *y, int ldy)
{
    const size_t hd = (size_t)p.head_dim, ns = (size_t)p.ns, rows = (size_t)p.heads * hd;

    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (size_t)s.n * rows;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t q = i / rows, j = i % rows, h = j / hd;
        const size_t g = h / (size_t)(p.heads / p.groups), r = (size_t)s.rows[q];
        const float *xr = xbc + r * (size_t)ld_xbc;
        const float *Bg = xr + rows + g * ns;
        const float *Cg = xr + rows + (size_t)p.groups * ns + g * ns;
        float A = kvf_mamba2_A_hd(p.A_log[h]);
        float Dh = (p.D != NULL) ? p.D[h] : 0.0f;
        float bias = (p.dt_bias != NULL) ? p.dt_bias[h] : 0.0f;
        float dth = kvf_mamba2_dt_hd(dt[r * (size_t)lddt + h], bias, s.dt_min[q], s.dt_max[q]);
        float dA = kvf_mamba2_dA_hd(dth, A);
        float xv = xr[j];
        /* in place: fp32 as is, a narrow state rounded as it is stored */
        float acc = (dtype == KVF_HD_FP32) ?
                        kvf_mamba2_row_hd((float *)s.ssm[q] + j * ns, ns, dA, dth * xv, Bg, Cg) :
                        kvf_mamba2_row_state_hd(s.ssm[q], dtype, j * ns, ns, dA, dth * xv, Bg,
                                                Cg);
        y[r * (size_t)ldy + j] = kvf_mamba2_out_hd(acc, Dh, xv);
    }
}

/* the packed block (kvf_ssm_seqs_pack) on the device: uploaded, or the caller's as is */
static int kvf_cuda_seqs_upload(cudaStream_t stream, const kvf_ssm_seqs_t *seqs,
                                kvf_cuda_ssm_seqs *s, void **d)
{
    const size_t S = (size_t)seqs->num_seqs, bytes = kvf_ssm_seqs_packed_bytes((int)S);
    int rc;

    if (seqs->packed != NULL) {
        rc = kvf_cuda_scratch(stream, bytes, seqs->packed, d);   /* laid out by the caller */
    } else {
        void *h = malloc(bytes);
        if (h == NULL) {
            return KVF_KERN_ENOMEM;
        }
        kvf_ssm_seqs_pack(seqs, h);
        rc = kvf_cuda_scratch(stream, bytes, h, d);
        free(h);   /* staged by the copy */
    }
    if (rc == KVF_KERN_OK) {
        s->conv = (void *const *)*d;
        s->ssm = (void *const *)((char *)*d + S * sizeof(void *));
        s->rows = (const int *)((char *)*d + 2 * S * sizeof(void *));
        s->dt_min = (const float *)((char *)*d + 2 * S * sizeof(void *) + S * sizeof(int));
        s->dt_max = s->dt_min + S;
        s->n = (int)S;
    }
    return rc;
}

struct kvf_cuda_gdn_layer {
    int          heads, head_dim, groups, dk;
    const float *dt_bias, *A_log;
};

/* one thread per (request, state row): the token kernel's body on the row in place */
__global__ void kvf_gdn_step_seqs_kernel(kvf_cuda_ssm_seqs s, kvf_cuda_gdn_layer p,
                                         const float *xbc, int ld_xbc, const float *ba,
                                         int ldba, int dtype, float *y, int ldy)
{
    const size_t dv = (size_t)p.head_dim, dk = (size_t)p.dk, rows = (size_t)p.heads * dv;
    const float qscale = 1.0f / sqrtf((float)p.dk);

    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (size_t)s.n * rows;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t q = i / rows, j = i % rows, h = j / dv;
        const size_t g = h / (size_t)(p.heads / p.groups), r = (size_t)s.rows[q];
        const float *xr = xbc + r * (size_t)ld_xbc, *brow = ba + r * (size_t)ldba;
        const float *kin = xr + rows + g * dk, *qin = xr + rows + (size_t)p.groups * dk + g * dk;
        const float decay = kvf_gdn_decay_hd(p.A_log[h], brow[p.heads + h], p.dt_bias[h]);
        const float beta = kvf_gdn_sigmoid_hd(brow[h]);
        const float qinv = kvf_gdn_inv_l2_hd(qin, p.dk), kinv = kvf_gdn_inv_l2_hd(kin, p.dk);
        y[r * (size_t)ldy + j] =
            (dtype == KVF_HD_FP32) ?
                kvf_gdn_row_hd((float *)s.ssm[q] + j * dk, 1, p.dk, qin, qinv, qscale, kin,
                               kinv, xr[j], decay, beta) :
                kvf_gdn_row_state_hd(s.ssm[q], dtype, j * dk, p.dk, qin, qinv, qscale, kin,
                                     kinv, xr[j], decay, beta);
    }
}

extern "C" int kvf_cuda_gdn_decode_seqs(const kvf_device_t *dev, const kvf_ssm_seqs_t *seqs,
                                        const float *x_in, int ld_in, int channels, int kernel,
                                        const float *conv_w, kvf_dtype_t conv_dtype, float *xbc,
                                        int ld_xbc, const kvf_gdn_params_t *p, const float *ba,
                                        int ldba, kvf_dtype_t ssm_dtype, float *y, int ldy)
{
    cudaStream_t stream = kvf_cuda_stream_of(dev);
    kvf_cuda_ssm_seqs s;
    void *d = NULL;
    int rc = kvf_cuda_seqs_upload(stream, seqs, &s, &d);

    if (rc != KVF_KERN_OK) {
        return rc;
    }
    size_t n = (size_t)s.n * (size_t)channels;
    kvf_conv_step_seqs_kernel<<<kvf_cuda_blocks(n), KVF_CUDA_THREADS, 0, stream>>>(
        s, x_in, ld_in, channels, kernel, conv_w, NULL, (int)conv_dtype, xbc, ld_xbc);
    rc = kvf_cuda_launched("kvf_conv_step_seqs_kernel");
    if (rc == KVF_KERN_OK) {
        const kvf_cuda_gdn_layer l = {p->heads, p->head_dim, p->groups, p->key_dim, p->dt_bias,
                                      p->A_log};
        n = (size_t)s.n * (size_t)p->heads * (size_t)p->head_dim;
        kvf_gdn_step_seqs_kernel<<<kvf_cuda_blocks_for(n, KVF_CUDA_THREADS / 4),
                                   KVF_CUDA_THREADS / 4, 0, stream>>>(
            s, l, xbc, ld_xbc, ba, ldba, (int)ssm_dtype, y, ldy);
        rc = kvf_cuda_launched("kvf_gdn_step_seqs_kernel");
    }
    kvf_cuda_scratch_free(stream, d);
    return rc;
}

extern "C" int kvf_cuda_ssm_decode_seqs(const kvf_device_t *dev, const kvf_ssm_seqs_t *seqs,
                                        const float *x_in, int ld_in, int channels, int kernel,
                                        const float *conv_w, const float *conv_b,
                                        kvf_dtype_t conv_dtype, float *xbc, int ld_xbc,
                                        const kvf_mamba2_params_t *p, const float *dt,
                                        int lddt, kvf_dtype_t ssm_dtype, float *y, int ldy)
{
    cudaStream_t stream = kvf_cuda_stream_of(dev);
    const size_t S = (size_t)seqs->num_seqs;
    /* one upload: pointers first (8-byte aligned), then rows and dt clamps */
    const size_t bytes = kvf_ssm_seqs_packed_bytes((int)S);
    void *d = NULL;
    int rc;

    if (seqs->packed != NULL) {
        rc = kvf_cuda_scratch(stream, bytes, seqs->packed, &d);   /* laid out by the caller */
    } else {
        void *h = malloc(bytes);
        if (h == NULL) {
            return KVF_KERN_ENOMEM;
        }
        kvf_ssm_seqs_pack(seqs, h);
        rc = kvf_cuda_scratch(stream, bytes, h, &d);
        free(h);   /* staged by the copy */
    }
    if (rc != KVF_KERN_OK) {
        return rc;
    }
    kvf_cuda_ssm_seqs s;
    s.conv = (void *const *)d;
    s.ssm = (void *const *)((char *)d + S * sizeof(void *));
    s.rows = (const int *)((char *)d + 2 * S * sizeof(void *));
    s.dt_min = (const float *)((char *)d + 2 * S * sizeof(void *) + S * sizeof(int));
    s.dt_max = s.dt_min + S;
    s.n = (int)S;
    size_t n = S * (size_t)channels;
    kvf_conv_step_seqs_kernel<<<kvf_cuda_blocks(n), KVF_CUDA_THREADS, 0, stream>>>(
        s, x_in, ld_in, channels, kernel, conv_w, conv_b, (int)conv_dtype, xbc, ld_xbc);
    rc = kvf_cuda_launched("kvf_conv_step_seqs_kernel");
    if (rc == KVF_KERN_OK) {
        kvf_cuda_ssm_layer l;
        l.heads = p->heads;
        l.head_dim = p->head_dim;
        l.groups = p->groups;
        l.ns = p->state_size;
        l.dt_bias = p->dt_bias;
        l.A_log = p->A_log;
        l.D = p->D;
        n = S * (size_t)p->heads * (size_t)p->head_dim;
        kvf_mamba2_step_seqs_kernel<<<kvf_cuda_blocks_for(n, KVF_CUDA_THREADS / 4),
                                      KVF_CUDA_THREADS / 4, 0, stream>>>(
            s, l, xbc, ld_xbc, dt, lddt, (int)ssm_dtype, y, ldy);
        rc = kvf_cuda_launched("kvf_mamba2_step_seqs_kernel");
    }
    kvf_cuda_scratch_free(stream, d);
    return rc;
}
