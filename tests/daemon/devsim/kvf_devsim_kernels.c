/*
 * TEST ONLY: kvf-devsim's kernel entry points (see kvf_devsim.c's opening comment): each
 * kernel given a simulated GPU runs its CPU version after its pointers are checked, and
 * inside a CUDA graph body its call is recorded or compared (argument hashes below), with
 * the packed step inputs the batched attention and Mamba decode read checked against the
 * requests' arrays.
 */
#include "kvf_act.h"
#include "kvf_argmax.h"
#include "kvf_attention.h"
#include "kvf_attention_seqs.h"
#include "kvf_conv1d.h"
#include "kvf_device.h"
#include "kvf_gdn.h"
#include "kvf_gemm.h"
#include "kvf_gemm_narrow.h"
#include "kvf_mamba2.h"
#include "kvf_ssd.h"
#include "kvf_moe.h"
#include "kvf_norm.h"
#include "kvf_ops.h"
#include "kvf_sample.h"
#include "kvf_ssm_seqs.h"
#include "kvf_devsim_gemm.h"
#include "kvf_devsim_ssd.h"
#include "kvf_devsim_int.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* argument hashes: raw bytes, or the fields of a parameter struct a launcher reads (its
 * padding and per-request host views left out) */
static uint64_t devsim_h_raw(uint64_t h, const void *a, size_t n)
{
    return devsim_mix(h, a, n);
}

static uint64_t devsim_h_kv(uint64_t h, const void *a, size_t n)
{
    const kvf_paged_kv_t *kv = *(const kvf_paged_kv_t *const *)a;
    const long long f[] = {(long long)(uintptr_t)kv->base, (long long)kv->page_size, kv->slots,
                           kv->slot, kv->dtype, kv->kv_heads, kv->head_dim, kv->block_size,
                           kv->kernel_block_size, kv->window, (long long)(uintptr_t)kv->sinks,
                           kv->layout};
    (void)n;
    return devsim_mix(h, f, sizeof(f));
}

static uint64_t devsim_h_aseqs(uint64_t h, const void *a, size_t n)
{
    const kvf_attn_seqs_t *q = *(const kvf_attn_seqs_t *const *)a;
    const long long f[] = {q->num_seqs, (long long)(uintptr_t)q->packed, q->packed_maxb,
                           q->split_blocks};
    (void)n;
    h = devsim_mix(h, f, sizeof(f));
    return devsim_mix(h, q->num_tokens, (size_t)q->num_seqs * sizeof(int));
}

static uint64_t devsim_h_sseqs(uint64_t h, const void *a, size_t n)
{
    const kvf_ssm_seqs_t *q = *(const kvf_ssm_seqs_t *const *)a;
    const long long f[] = {q->num_seqs, (long long)(uintptr_t)q->packed};
    (void)n;
    return devsim_mix(h, f, sizeof(f));
}

static uint64_t devsim_h_mp(uint64_t h, const void *a, size_t n)
{
    const kvf_mamba2_params_t *p = *(const kvf_mamba2_params_t *const *)a;
    const long long f[] = {p->heads, p->head_dim, p->groups, p->state_size,
                           (long long)(uintptr_t)p->dt_bias, (long long)(uintptr_t)p->A_log,
                           (long long)(uintptr_t)p->D};
    (void)n;
    h = devsim_mix(h, f, sizeof(f));
    h = devsim_mix(h, &p->dt_min, sizeof(p->dt_min));
    return devsim_mix(h, &p->dt_max, sizeof(p->dt_max));
}

static uint64_t devsim_h_gp(uint64_t h, const void *a, size_t n)
{
    const kvf_gdn_params_t *p = *(const kvf_gdn_params_t *const *)a;
    const long long f[] = {p->heads, p->head_dim, p->groups, p->key_dim,
                           (long long)(uintptr_t)p->dt_bias, (long long)(uintptr_t)p->A_log};
    (void)n;
    return devsim_mix(h, f, sizeof(f));
}

#define DEVSIM_HASH_ARG(a)                                                             \
    devsim_h_ = _Generic((a),                                                          \
                         const kvf_gdn_params_t *: devsim_h_gp,                        \
                         const kvf_paged_kv_t *: devsim_h_kv,                          \
                         const kvf_attn_seqs_t *: devsim_h_aseqs,                      \
                         const kvf_ssm_seqs_t *: devsim_h_sseqs,                       \
                         const kvf_mamba2_params_t *: devsim_h_mp,                     \
                         default: devsim_h_raw)(devsim_h_, &(a), sizeof(a));
#define DEVSIM_NARGS_(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, \
                      _16, _17, _18, N, ...) N
#define DEVSIM_NARGS(...) \
    DEVSIM_NARGS_(__VA_ARGS__, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1)
#define DEVSIM_FE_1(m, a) m(a)
#define DEVSIM_FE_2(m, a, ...) m(a) DEVSIM_FE_1(m, __VA_ARGS__)
#define DEVSIM_FE_3(m, a, ...) m(a) DEVSIM_FE_2(m, __VA_ARGS__)
#define DEVSIM_FE_4(m, a, ...) m(a) DEVSIM_FE_3(m, __VA_ARGS__)
#define DEVSIM_FE_5(m, a, ...) m(a) DEVSIM_FE_4(m, __VA_ARGS__)
#define DEVSIM_FE_6(m, a, ...) m(a) DEVSIM_FE_5(m, __VA_ARGS__)
#define DEVSIM_FE_7(m, a, ...) m(a) DEVSIM_FE_6(m, __VA_ARGS__)
#define DEVSIM_FE_8(m, a, ...) m(a) DEVSIM_FE_7(m, __VA_ARGS__)
#define DEVSIM_FE_9(m, a, ...) m(a) DEVSIM_FE_8(m, __VA_ARGS__)
#define DEVSIM_FE_10(m, a, ...) m(a) DEVSIM_FE_9(m, __VA_ARGS__)
#define DEVSIM_FE_11(m, a, ...) m(a) DEVSIM_FE_10(m, __VA_ARGS__)
#define DEVSIM_FE_12(m, a, ...) m(a) DEVSIM_FE_11(m, __VA_ARGS__)
#define DEVSIM_FE_13(m, a, ...) m(a) DEVSIM_FE_12(m, __VA_ARGS__)
#define DEVSIM_FE_14(m, a, ...) m(a) DEVSIM_FE_13(m, __VA_ARGS__)
#define DEVSIM_FE_15(m, a, ...) m(a) DEVSIM_FE_14(m, __VA_ARGS__)
#define DEVSIM_FE_16(m, a, ...) m(a) DEVSIM_FE_15(m, __VA_ARGS__)
#define DEVSIM_FE_17(m, a, ...) m(a) DEVSIM_FE_16(m, __VA_ARGS__)
#define DEVSIM_CAT_(a, b) a##b
#define DEVSIM_CAT(a, b) DEVSIM_CAT_(a, b)
#define DEVSIM_FE(m, ...) DEVSIM_CAT(DEVSIM_FE_, DEVSIM_NARGS(__VA_ARGS__))(m, __VA_ARGS__)
/* the hash of a call's arguments after the device (the first) */
#define DEVSIM_ARGS_HASH_(dev_, ...) DEVSIM_FE(DEVSIM_HASH_ARG, __VA_ARGS__)
#define DEVSIM_ARGS_HASH(...) DEVSIM_ARGS_HASH_(__VA_ARGS__)
#define DEVSIM_UNPAREN(...) __VA_ARGS__

/* A graphed step's batched attention: its tables packed in the published inputs (the
 * launcher reads no other host array then) and split-K of a fixed shape. */
static void devsim_want_seqs_packed(const kvf_attn_seqs_t *q, const int32_t *positions)
{
    size_t T = 0;
    bool bad = false;

    if (tl_graph == 0) {
        return;
    }
    if ((q->packed == NULL) || (q->split_blocks <= 0)) {
        devsim_not_in_graph("kvf_attn_write_paged_seqs without packed tables and fixed "
                            "split-K (packs and uploads them per call)");
        return;
    }
    for (int i = 0; i < q->num_seqs; ++i) {
        T += (size_t)q->num_tokens[i];
    }
    devsim_want_input(q->packed, (2 * T + (size_t)q->num_seqs * (size_t)q->packed_maxb) * 4,
                      "kvf_attn_write_paged_seqs packed");
    /* the CUDA launcher reads only the packed block: it must say what the arrays say (each
     * row's request, its position, each request's table), the padding unread */
    for (int i = 0; i < q->num_seqs; ++i) {
        bad |= (q->num_blocks[i] > q->packed_maxb);
    }
    if (!bad) {
        size_t words = kvf_attn_seqs_packed_words((int)T, q->num_seqs, q->packed_maxb);
        int32_t *want = malloc(words * sizeof(int32_t));
        if (want == NULL) {
            abort();   /* test binary: out of memory */
        }
        kvf_attn_seqs_pack(q, positions, (int)T, q->packed_maxb, want);
        bad = (memcmp(want, q->packed, 2 * T * sizeof(int32_t)) != 0);
        for (int i = 0; i < q->num_seqs; ++i) {
            size_t at = 2 * T + (size_t)i * (size_t)q->packed_maxb;
            bad |= (memcmp(want + at, q->packed + at, (size_t)q->num_blocks[i] * 4) != 0);
        }
        free(want);
    }
    if (bad) {
        devsim_graph_error(&st_graph_host_inputs, "kvf_attn_write_paged_seqs: the packed "
                           "block differs from the requests' arrays");
    }
}

/* The batched Mamba decode's packed block: the five arrays as the CUDA launcher reads them. */
static void devsim_want_ssm_packed(const kvf_ssm_seqs_t *q)
{
    const size_t bytes = kvf_ssm_seqs_packed_bytes(q->num_seqs);
    void *want;
    bool bad;

    if (tl_graph == 0) {
        return;
    }
    devsim_want_input(q->packed, bytes, "kvf_ssm_decode_seqs packed");
    want = malloc(bytes ? bytes : 1);
    if (want == NULL) {
        abort();   /* test binary: out of memory */
    }
    kvf_ssm_seqs_pack(q, want);
    bad = (q->packed == NULL) || (memcmp(want, q->packed, bytes) != 0);
    free(want);
    if (bad) {
        devsim_graph_error(&st_graph_host_inputs, "kvf_ssm_decode_seqs: the packed block "
                           "differs from the requests' arrays");
    }
}

/* the batched decode body against the per-request path (kvf_devsim_ssm.c), for the calls
 * the real function would accept */
static void devsim_ssm_twin_checked(const kvf_ssm_seqs_t *s, const float *x_in, int ld_in,
                                    int channels, int kernel, const float *conv_w,
                                    const float *conv_b, kvf_dtype_t conv_dtype,
                                    const kvf_mamba2_params_t *p, const float *dt, int lddt,
                                    kvf_dtype_t ssm_dtype)
{
    if ((s != NULL) && (s->num_seqs > 0) && (p != NULL) && (p->A_log != NULL) &&
        (p->groups > 0) && (p->heads % p->groups == 0) && (x_in != NULL) && (dt != NULL) &&
        (kernel >= 2) && (conv_w != NULL)) {
        devsim_ssm_seqs_twin(s, x_in, ld_in, channels, kernel, conv_w, conv_b, conv_dtype, p,
                             dt, lddt, ssm_dtype);
    }
}

/* ---- kernels: a CUDA device runs the CPU version ------------------------------ */

/* @a dev (a parameter) becomes the CPU when it is a simulated GPU; counts the launch. */
#define DEVSIM_ON_CPU(_dev)                                                            \
    kvf_device_t devsim_cpu_ = kvf_device_cpu();                                       \
    bool devsim_gpu_ = devsim_is_cuda(_dev);                                           \
    if (devsim_gpu_) {                                                                 \
        st_kernels++;                                                                  \
        (_dev) = &devsim_cpu_;                                                         \
    }

/* in a kernel's checks: device memory, of the GPU the launch goes to */
#define devsim_want_dev(_p, _what)                                                     \
    (devsim_want_dev_fn(_p, _what), devsim_want_current(devsim_kdev_, _p, _what, true))

#define DEVSIM_KERNEL(_name, _params, _args, _checks)                                  \
    int __real_##_name _params;                                                        \
    int __wrap_##_name _params;                                                        \
    int __wrap_##_name _params                                                         \
    {                                                                                  \
        const kvf_device_t *devsim_kdev_ = dev;                                        \
        DEVSIM_ON_CPU(dev);                                                            \
        if (devsim_gpu_) {                                                             \
            _checks;                                                                   \
            if (tl_graph != 0) {                                                       \
                if (devsim_kdev_->stream != (void *)&devsim_capture_stream) {          \
                    devsim_graph_error(&st_graph_host_inputs, #_name " launched on "   \
                                       "another stream than the capture's");          \
                }                                                                      \
                uint64_t devsim_h_ = 1469598103934665603ull;                           \
                DEVSIM_ARGS_HASH(DEVSIM_UNPAREN _args)                                 \
                devsim_graph_call(#_name, devsim_h_);                                  \
            }                                                                          \
        }                                                                              \
        return __real_##_name _args;                                                   \
    }

DEVSIM_KERNEL(kvf_act, (const kvf_device_t *dev, int act, float *x, size_t n),
              (dev, act, x, n), devsim_want_dev(x, "kvf_act x"))
DEVSIM_KERNEL(kvf_convert, (const kvf_device_t *dev, void *dst, kvf_dtype_t dst_dtype,
                            const void *src, kvf_dtype_t src_dtype, size_t n),
              (dev, dst, dst_dtype, src, src_dtype, n), devsim_want_dev(dst, "kvf_convert dst"))
DEVSIM_KERNEL(kvf_attn_cache_write, (const kvf_device_t *dev, const kvf_paged_kv_t *kv,
                                     const float *k, const float *v, int ld,
                                     const int32_t *positions, int num_tokens),
              (dev, kv, k, v, ld, positions, num_tokens),
              (devsim_want_dev(k, "kvf_attn_cache_write k"),
               devsim_want_dev(v, "kvf_attn_cache_write v"),
               devsim_not_in_graph("kvf_attn_cache_write (uploads its block table per call)")))
DEVSIM_KERNEL(kvf_attn_paged, (const kvf_device_t *dev, const kvf_paged_kv_t *kv, const float *q,
                               int ldq, const int32_t *positions, int num_tokens, int q_heads,
                               float scale, float *out),
              (dev, kv, q, ldq, positions, num_tokens, q_heads, scale, out),
              (devsim_want_dev(q, "kvf_attn_paged q"), devsim_want_dev(out, "kvf_attn_paged out"),
               devsim_not_in_graph("kvf_attn_paged (uploads its block table per call)")))
DEVSIM_KERNEL(kvf_conv1d_chunk, (const kvf_device_t *dev, const float *x, int ldx, int T,
                                 int channels, int kernel, const float *w, const float *bias,
                                 int silu, void *state, kvf_dtype_t state_dtype, int has_state,
                                 float *y, int ldy),
              (dev, x, ldx, T, channels, kernel, w, bias, silu, state, state_dtype, has_state, y,
               ldy),
              (devsim_want_dev(x, "kvf_conv1d_chunk x"), devsim_want_dev(y, "kvf_conv1d_chunk y"),
               devsim_want_dev(state, "kvf_conv1d_chunk state")))
DEVSIM_KERNEL(kvf_conv1d_step, (const kvf_device_t *dev, const float *x, int channels, int kernel,
                                const float *w, const float *bias, int silu, void *state,
                                kvf_dtype_t state_dtype, float *y),
              (dev, x, channels, kernel, w, bias, silu, state, state_dtype, y),
              (devsim_want_dev(x, "kvf_conv1d_step x"), devsim_want_dev(y, "kvf_conv1d_step y"),
               devsim_want_dev(state, "kvf_conv1d_step state")))
DEVSIM_KERNEL(kvf_gemm, (const kvf_device_t *dev, int M, int N, int K, const float *x,
                         const float *w, const float *bias, float *y),
              (dev, M, N, K, x, w, bias, y),
              (devsim_want_dev(x, "kvf_gemm x"), devsim_want_dev(w, "kvf_gemm w"),
               devsim_want_dev(y, "kvf_gemm y")))
DEVSIM_KERNEL(kvf_gemm_ex, (const kvf_device_t *dev, int M, int N, int K, const float *x, int ldx,
                            const float *w, int ldw, const float *bias, float beta, float *y,
                            int ldy),
              (dev, M, N, K, x, ldx, w, ldw, bias, beta, y, ldy),
              (devsim_want_dev(x, "kvf_gemm_ex x"), devsim_want_dev(w, "kvf_gemm_ex w"),
               devsim_want_dev(y, "kvf_gemm_ex y")))
DEVSIM_KERNEL(kvf_mamba2_scan, (const kvf_device_t *dev, const kvf_mamba2_params_t *p, int T,
                                const float *x, int ldx, const float *dt, int lddt,
                                const float *B, const float *C, int ldbc, void *state,
                                kvf_dtype_t state_dtype, int has_state, float *y, int ldy),
              (dev, p, T, x, ldx, dt, lddt, B, C, ldbc, state, state_dtype, has_state, y, ldy),
              (devsim_want_dev(x, "kvf_mamba2_scan x"), devsim_want_dev(y, "kvf_mamba2_scan y"),
               devsim_want_dev(state, "kvf_mamba2_scan state"), devsim_ssd_token()))
DEVSIM_KERNEL(kvf_mamba2_scan_chunked, (const kvf_device_t *dev, const kvf_mamba2_params_t *p,
                                        int T, long long pos0, int grid, const float *x,
                                        int ldx, const float *dt, int lddt, const float *B,
                                        const float *C, int ldbc, void *state,
                                        kvf_dtype_t state_dtype, int has_state, float *y,
                                        int ldy),
              (dev, p, T, pos0, grid, x, ldx, dt, lddt, B, C, ldbc, state, state_dtype,
               has_state, y, ldy),
              (devsim_want_dev(x, "kvf_mamba2_scan_chunked x"),
               devsim_want_dev(y, "kvf_mamba2_scan_chunked y"),
               devsim_want_dev(state, "kvf_mamba2_scan_chunked state"),
               devsim_ssd_chunked(p, T, pos0, grid)))
DEVSIM_KERNEL(kvf_mamba2_step, (const kvf_device_t *dev, const kvf_mamba2_params_t *p,
                                const float *x, const float *dt, const float *B, const float *C,
                                void *state, kvf_dtype_t state_dtype, float *y),
              (dev, p, x, dt, B, C, state, state_dtype, y),
              (devsim_want_dev(x, "kvf_mamba2_step x"), devsim_want_dev(y, "kvf_mamba2_step y"),
               devsim_want_dev(state, "kvf_mamba2_step state")))
DEVSIM_KERNEL(kvf_gdn_scan, (const kvf_device_t *dev, const kvf_gdn_params_t *p, int T,
                             const float *xbc, int ldx, const float *ba, int ldba, void *state,
                             kvf_dtype_t state_dtype, int has_state, float *y, int ldy),
              (dev, p, T, xbc, ldx, ba, ldba, state, state_dtype, has_state, y, ldy),
              (devsim_want_dev(xbc, "kvf_gdn_scan xbc"), devsim_want_dev(ba, "kvf_gdn_scan ba"),
               devsim_want_dev(state, "kvf_gdn_scan state"), devsim_want_dev(y, "kvf_gdn_scan y"),
               devsim_want_dev(p->A_log, "kvf_gdn_scan A_log"),
               devsim_want_dev(p->dt_bias, "kvf_gdn_scan dt_bias"), devsim_gdn_token()))
DEVSIM_KERNEL(kvf_gdn_scan_chunked, (const kvf_device_t *dev, const kvf_gdn_params_t *p, int T,
                                     long long pos0, int grid, const float *xbc, int ldx,
                                     const float *ba, int ldba, void *state,
                                     kvf_dtype_t state_dtype, int has_state, float *y, int ldy),
              (dev, p, T, pos0, grid, xbc, ldx, ba, ldba, state, state_dtype, has_state, y, ldy),
              (devsim_want_dev(xbc, "kvf_gdn_scan_chunked xbc"),
               devsim_want_dev(ba, "kvf_gdn_scan_chunked ba"),
               devsim_want_dev(state, "kvf_gdn_scan_chunked state"),
               devsim_want_dev(y, "kvf_gdn_scan_chunked y"),
               devsim_want_dev(p->A_log, "kvf_gdn_scan_chunked A_log"),
               devsim_want_dev(p->dt_bias, "kvf_gdn_scan_chunked dt_bias"),
               devsim_gdn_chunked(p, T, pos0, grid)))
DEVSIM_KERNEL(kvf_gdn_gated_norm, (const kvf_device_t *dev, const float *y, int ldy,
                                   const float *z, int ldz, const float *w, int T, int heads,
                                   int head_dim, float eps, float *out, int ldo),
              (dev, y, ldy, z, ldz, w, T, heads, head_dim, eps, out, ldo),
              (devsim_want_dev(y, "kvf_gdn_gated_norm y"), devsim_want_dev(z, "kvf_gdn_gated_norm z"),
               devsim_want_dev(w, "kvf_gdn_gated_norm w"),
               devsim_want_dev(out, "kvf_gdn_gated_norm out")))
DEVSIM_KERNEL(kvf_sigmoid_gate, (const kvf_device_t *dev, float *x, int ldx, const float *gate,
                                  int ldg, int T, int n),
              (dev, x, ldx, gate, ldg, T, n),
              (devsim_want_dev(x, "kvf_sigmoid_gate x"),
               devsim_want_dev(gate, "kvf_sigmoid_gate gate")))
DEVSIM_KERNEL(kvf_sigmoid_row_scale, (const kvf_device_t *dev, float *x, int ldx, const float *g,
                                      int T, int n),
              (dev, x, ldx, g, T, n),
              (devsim_want_dev(x, "kvf_sigmoid_row_scale x"),
               devsim_want_dev(g, "kvf_sigmoid_row_scale g")))
DEVSIM_KERNEL(kvf_moe_route, (const kvf_device_t *dev, const kvf_moe_route_params_t *p,
                              const float *logits, int T, float *scores, int32_t *idx, float *wt),
              (dev, p, logits, T, scores, idx, wt), devsim_want_dev(logits, "kvf_moe_route"))
DEVSIM_KERNEL(kvf_rmsnorm, (const kvf_device_t *dev, const float *x, const float *w, float *y,
                            int rows, int dim, float eps),
              (dev, x, w, y, rows, dim, eps),
              (devsim_want_dev(x, "kvf_rmsnorm x"), devsim_want_dev(y, "kvf_rmsnorm y")))
DEVSIM_KERNEL(kvf_rmsnorm_heads, (const kvf_device_t *dev, float *x, int ld, int tokens,
                                  int heads, int head_dim, const float *w, float eps),
              (dev, x, ld, tokens, heads, head_dim, w, eps),
              (devsim_want_dev(x, "kvf_rmsnorm_heads x"),
               devsim_want_dev(w, "kvf_rmsnorm_heads w")))
DEVSIM_KERNEL(kvf_add_rmsnorm, (const kvf_device_t *dev, float *h, const float *delta,
                                const float *w, float *y, int rows, int dim, float eps),
              (dev, h, delta, w, y, rows, dim, eps),
              (devsim_want_dev(h, "kvf_add_rmsnorm h"),
               devsim_want_dev(delta, "kvf_add_rmsnorm delta"),
               devsim_want_dev(y, "kvf_add_rmsnorm y")))
DEVSIM_KERNEL(kvf_gated_rmsnorm_sumsq, (const kvf_device_t *dev, const float *x, const float *z,
                                        int ld, int rows, int dim, int group_size, float *g,
                                        float *sumsq),
              (dev, x, z, ld, rows, dim, group_size, g, sumsq),
              devsim_want_dev(x, "kvf_gated_rmsnorm_sumsq x"))
DEVSIM_KERNEL(kvf_gated_rmsnorm_apply, (const kvf_device_t *dev, const float *g,
                                        const float *sumsq, const float *w, int rows, int dim,
                                        int group_size, int norm_elems, float eps, float *y),
              (dev, g, sumsq, w, rows, dim, group_size, norm_elems, eps, y),
              devsim_want_dev(y, "kvf_gated_rmsnorm_apply y"))
DEVSIM_KERNEL(kvf_gated_rmsnorm, (const kvf_device_t *dev, const float *x, const float *z, int ld,
                                  const float *w, int rows, int dim, int group_size, float eps,
                                  float *y),
              (dev, x, z, ld, w, rows, dim, group_size, eps, y),
              (devsim_want_dev(x, "kvf_gated_rmsnorm x"),
               devsim_want_dev(y, "kvf_gated_rmsnorm y")))
DEVSIM_KERNEL(kvf_add, (const kvf_device_t *dev, float *y, const float *x, size_t n),
              (dev, y, x, n), (devsim_want_dev(x, "kvf_add x"), devsim_want_dev(y, "kvf_add y")))
DEVSIM_KERNEL(kvf_scale, (const kvf_device_t *dev, float *x, size_t n, float alpha),
              (dev, x, n, alpha), devsim_want_dev(x, "kvf_scale x"))
DEVSIM_KERNEL(kvf_gather_rows, (const kvf_device_t *dev, const void *src, kvf_dtype_t src_dtype,
                                int cols, const int32_t *ids, int n, float *dst),
              (dev, src, src_dtype, cols, ids, n, dst),
              (devsim_want_dev(src, "kvf_gather_rows src"),
               devsim_want_dev(dst, "kvf_gather_rows dst"),
               devsim_want_input(ids, (size_t)n * 4, "kvf_gather_rows ids")))
DEVSIM_KERNEL(kvf_scatter_add_rows, (const kvf_device_t *dev, float *y, int ldy,
                                     const int32_t *rows, const float *wt, int n, const float *x,
                                     int cols),
              (dev, y, ldy, rows, wt, n, x, cols),
              (devsim_want_dev(x, "kvf_scatter_add_rows x"),
               devsim_want_dev(y, "kvf_scatter_add_rows y"),
               devsim_want_input(rows, (size_t)n * 4, "kvf_scatter_add_rows rows"),
               devsim_want_input(wt, (size_t)n * 4, "kvf_scatter_add_rows wt")))
DEVSIM_KERNEL(kvf_act_mul, (const kvf_device_t *dev, int act, const float *x, int M, int C,
                            float *y),
              (dev, act, x, M, C, y),
              (devsim_want_dev(x, "kvf_act_mul x"), devsim_want_dev(y, "kvf_act_mul y")))
DEVSIM_KERNEL(kvf_swiglu_clamp, (const kvf_device_t *dev, float alpha, float limit,
                                 const float *x, int M, int C, float *y),
              (dev, alpha, limit, x, M, C, y),
              (devsim_want_dev(x, "kvf_swiglu_clamp x"), devsim_want_dev(y, "kvf_swiglu_clamp y")))
DEVSIM_KERNEL(kvf_rope, (const kvf_device_t *dev, const float *inv_freq, int head_dim,
                         const int32_t *positions, int T, float *x, int ldx, int heads),
              (dev, inv_freq, head_dim, positions, T, x, ldx, heads),
              (devsim_want_dev(x, "kvf_rope x"),
               devsim_want_input(positions, (size_t)T * 4, "kvf_rope positions")))
/* the batched and fixed-order entry points the forward calls (greedy ids, the attention and
 * Mamba decode of a whole batch, the invariant GEMM and the 16-bit-weight GEMM) */
DEVSIM_KERNEL(kvf_gemm_w, (const kvf_device_t *dev, int M, int N, int K, const float *x, int ldx,
                           const void *w, kvf_dtype_t w_dtype, int ldw, const float *bias,
                           float *y, int ldy),
              (dev, M, N, K, x, ldx, w, w_dtype, ldw, bias, y, ldy),
              (devsim_want_dev(x, "kvf_gemm_w x"), devsim_want_dev(w, "kvf_gemm_w w"),
               devsim_want_dev(y, "kvf_gemm_w y")))
DEVSIM_KERNEL(kvf_gemm_w_act, (const kvf_device_t *dev, int M, int N, int K, const float *x,
                               int ldx, const void *w, kvf_dtype_t w_dtype, int ldw,
                               const float *bias, int act, float *y, int ldy),
              (dev, M, N, K, x, ldx, w, w_dtype, ldw, bias, act, y, ldy),
              (devsim_want_dev(x, "kvf_gemm_w_act x"), devsim_want_dev(w, "kvf_gemm_w_act w"),
               devsim_want_dev(y, "kvf_gemm_w_act y")))
DEVSIM_KERNEL(kvf_gemm_narrow, (const kvf_device_t *dev, int M, int N, int K, const float *x,
                                int ldx, const void *w, kvf_dtype_t wdtype, int ldw,
                                const float *bias, float *y, int ldy, void *xs),
              (dev, M, N, K, x, ldx, w, wdtype, ldw, bias, y, ldy, xs),
              (devsim_want_dev(x, "kvf_gemm_narrow x"), devsim_want_dev(w, "kvf_gemm_narrow w"),
               devsim_want_dev(y, "kvf_gemm_narrow y"), devsim_want_dev(xs, "kvf_gemm_narrow xs"),
               devsim_gemm_lt_check(dev->ordinal, N, K, w, (int)wdtype, ldw, xs, y, ldy)))
DEVSIM_KERNEL(kvf_argmax_rows, (const kvf_device_t *dev, const float *x, int rows, int cols,
                                int ldx, int32_t *out),
              (dev, x, rows, cols, ldx, out), devsim_want_dev(x, "kvf_argmax_rows x"))
DEVSIM_KERNEL(kvf_attn_write_paged_seqs, (const kvf_device_t *dev, const kvf_paged_kv_t *kv,
                                          const kvf_attn_seqs_t *seqs, const float *k,
                                          const float *v, int ld, const float *q, int ldq,
                                          const int32_t *positions, int q_heads, float scale,
                                          float *out),
              (dev, kv, seqs, k, v, ld, q, ldq, positions, q_heads, scale, out),
              (devsim_want_dev(q, "kvf_attn_write_paged_seqs q"),
               devsim_want_dev(out, "kvf_attn_write_paged_seqs out"),
               (kv->sinks != NULL) ? devsim_want_dev(kv->sinks, "kvf_attn_write_paged_seqs sinks")
                                   : (void)0,
               devsim_want_seqs_packed(seqs, positions)))
DEVSIM_KERNEL(kvf_ssm_decode_seqs, (const kvf_device_t *dev, const kvf_ssm_seqs_t *seqs,
                                    const float *x_in, int ld_in, int channels, int kernel,
                                    const float *conv_w, const float *conv_b,
                                    kvf_dtype_t conv_dtype, float *xbc, int ld_xbc,
                                    const kvf_mamba2_params_t *p, const float *dt, int lddt,
                                    kvf_dtype_t ssm_dtype, float *y, int ldy),
              (dev, seqs, x_in, ld_in, channels, kernel, conv_w, conv_b, conv_dtype, xbc, ld_xbc,
               p, dt, lddt, ssm_dtype, y, ldy),
              (devsim_want_dev(x_in, "kvf_ssm_decode_seqs x"),
               devsim_want_dev(y, "kvf_ssm_decode_seqs y"),
               devsim_want_ssm_packed(seqs),
               devsim_ssm_twin_checked(seqs, x_in, ld_in, channels, kernel, conv_w, conv_b,
                                       conv_dtype, p, dt, lddt, ssm_dtype)))
DEVSIM_KERNEL(kvf_gdn_decode_seqs, (const kvf_device_t *dev, const kvf_ssm_seqs_t *seqs,
                                    const float *x_in, int ld_in, int channels, int kernel,
                                    const float *conv_w, kvf_dtype_t conv_dtype, float *xbc,
                                    int ld_xbc, const kvf_gdn_params_t *p, const float *ba,
                                    int ldba, kvf_dtype_t ssm_dtype, float *y, int ldy),
              (dev, seqs, x_in, ld_in, channels, kernel, conv_w, conv_dtype, xbc, ld_xbc, p, ba,
               ldba, ssm_dtype, y, ldy),
              (devsim_want_dev(x_in, "kvf_gdn_decode_seqs x"),
               devsim_want_dev(ba, "kvf_gdn_decode_seqs ba"),
               devsim_want_dev(y, "kvf_gdn_decode_seqs y"),
               devsim_want_ssm_packed(seqs),
               devsim_gdn_twin(seqs, x_in, ld_in, channels, kernel, conv_w, conv_dtype, p, ba,
                               ldba, ssm_dtype)))
/* device sampling (kvf_sample.h): the rows' logits, parameters, entries and results are all
 * device memory (kvf_sample_batch() uploads and downloads around it, counted as copies) */
DEVSIM_KERNEL(kvf_sample_rows, (const kvf_device_t *dev, const float *logits, int rows, int vocab,
                                int ldl, const kvf_sample_row_t *params,
                                const kvf_sample_pen_t *pen, int num_pen, float *scratch,
                                kvf_sample_res_t *out),
              (dev, logits, rows, vocab, ldl, params, pen, num_pen, scratch, out),
              (devsim_want_dev(logits, "kvf_sample_rows logits"),
               devsim_want_dev(params, "kvf_sample_rows params"),
               devsim_want_dev(scratch, "kvf_sample_rows scratch"),
               devsim_want_dev(out, "kvf_sample_rows out")))
