/*
 * The tensor-core GEMM of 16-bit weights through cuBLASLt, batch invariant:
 * y[M][N] (ld ldy) = beta * y + xs[M][K] * W[N][K]^T, xs and W bf16 or fp16, fp32 compute,
 * scale and y. The algorithm is chosen once per key (kvf_gemm_plan.h: device, N, K, ldw,
 * ldy, dtype, alignment; never M) by cublasLtMatmulAlgoGetHeuristic for the nominal M,
 * pinned (split-K 1, no reduction scheme, no workspace) and passed to every call of the
 * key, so a row's bits do not change with M.
 *
 * Row-major y = xs W^T is column-major y^T (N x M, ld ldy) = op_T(W as K x N, ld ldw) *
 * (xs^T as K x M, ld K): no copy. Descriptors are the *Init forms on the stack: no host
 * allocation per call. One cuBLASLt handle per thread and device (as the cuBLAS ones,
 * kvf_gemm_cuda.cu).
 */
#include "kvf_cuda_util.h"
#include "kvf_device_cuda.h"
#include "kvf_gemm_plan.h"

#include <cublasLt.h>
#include <stdio.h>
#include <string.h>

#define KVF_LT_MAX_ORDINALS 64

static_assert(sizeof(cublasLtMatmulAlgo_t) == KVF_GEMM_LT_ALGO_BYTES,
              "kvf_gemm_plan.h keeps cuBLASLt's algorithm as 64 bytes");

static thread_local cublasLtHandle_t kvf_lt_handles[KVF_LT_MAX_ORDINALS];

static int kvf_lt_error(cublasStatus_t st, const char *call)
{
    kvf_kern_report(call, cublasGetStatusString(st));
    return (st == CUBLAS_STATUS_ALLOC_FAILED) ? KVF_KERN_ENOMEM : KVF_KERN_ECUDA;
}

#define KVF_LT_CHECK(call)                                                                 \
    do {                                                                                   \
        cublasStatus_t st_ = (call);                                                       \
        if (st_ != CUBLAS_STATUS_SUCCESS) {                                                \
            return kvf_lt_error(st_, #call);                                               \
        }                                                                                  \
    } while (0)

static int kvf_lt_handle(const kvf_device_t *dev, cublasLtHandle_t *h_p)
{
    if ((dev->ordinal < 0) || (dev->ordinal >= KVF_LT_MAX_ORDINALS)) {
        return KVF_KERN_EINVAL;
    }
    KVF_CUDA_CHECK(cudaSetDevice(dev->ordinal));
    if (kvf_lt_handles[dev->ordinal] == NULL) {
        KVF_LT_CHECK(cublasLtCreate(&kvf_lt_handles[dev->ordinal]));
    }
    *h_p = kvf_lt_handles[dev->ordinal];
    return KVF_KERN_OK;
}

/* The operation and the three layouts of a key for @a M rows. */
typedef struct {
    cublasLtMatmulDescOpaque_t   op;
    cublasLtMatrixLayoutOpaque_t a, b, d;
} kvf_lt_desc_t;

static int kvf_lt_describe(const kvf_gemm_lt_key_t *key, int M, kvf_lt_desc_t *s)
{
    const cudaDataType_t ab = (key->dtype == (int)KVF_DTYPE_BF16) ? CUDA_R_16BF : CUDA_R_16F;
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;

    KVF_LT_CHECK(cublasLtMatmulDescInit(&s->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    KVF_LT_CHECK(cublasLtMatmulDescSetAttribute(&s->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta,
                                                sizeof(ta)));
    KVF_LT_CHECK(cublasLtMatmulDescSetAttribute(&s->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb,
                                                sizeof(tb)));
    KVF_LT_CHECK(cublasLtMatrixLayoutInit(&s->a, ab, (uint64_t)key->k, (uint64_t)key->n,
                                          (int64_t)key->ldw));
    KVF_LT_CHECK(cublasLtMatrixLayoutInit(&s->b, ab, (uint64_t)key->k, (uint64_t)M,
                                          (int64_t)key->k));
    KVF_LT_CHECK(cublasLtMatrixLayoutInit(&s->d, CUDA_R_32F, (uint64_t)key->n, (uint64_t)M,
                                          (int64_t)key->ldy));
    return KVF_KERN_OK;
}

/* @a from with split-K 1 and no reduction scheme, into @a algo, if cuBLASLt accepts it for
 * the descriptors without a workspace. */
static bool kvf_lt_pin(cublasLtHandle_t h, kvf_lt_desc_t *s, const cublasLtMatmulAlgo_t *from,
                       cublasLtMatmulAlgo_t *algo)
{
    const uint32_t one = 1, none = CUBLASLT_REDUCTION_SCHEME_NONE;
    cublasLtMatmulHeuristicResult_t chk;

    *algo = *from;
    return (cublasLtMatmulAlgoConfigSetAttribute(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &one,
                                                 sizeof(one)) == CUBLAS_STATUS_SUCCESS) &&
           (cublasLtMatmulAlgoConfigSetAttribute(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME,
                                                 &none, sizeof(none)) == CUBLAS_STATUS_SUCCESS) &&
           (cublasLtMatmulAlgoCheck(h, &s->op, &s->a, &s->b, &s->d, &s->d, algo, &chk) ==
            CUBLAS_STATUS_SUCCESS) &&
           (chk.workspaceSize == 0);
}

/* Asks the heuristic once for @a key at the nominal M and pins its answer (no split-K, no
 * reduction, no workspace); the first choice of a key is the one every caller then uses. */
static int kvf_lt_choose(cublasLtHandle_t h, const kvf_gemm_lt_key_t *key,
                         cublasLtMatmulAlgo_t *algo)
{
    cublasLtMatmulPreferenceOpaque_t pref;
    cublasLtMatmulHeuristicResult_t res[8];
    const uint64_t ws = 0;
    const uint32_t align = (uint32_t)key->align;
    kvf_lt_desc_t s;
    int found = 0, rc = kvf_lt_describe(key, KVF_GEMM_LT_NOMINAL_M, &s);

    if (rc != KVF_KERN_OK) {
        return rc;
    }
    KVF_LT_CHECK(cublasLtMatmulPreferenceInit(&pref));
    KVF_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(
        &pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    /* no CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK: NONE is 0, not a bit of the mask, so a
     * mask of it could filter every result; the zero workspace and the pinned config below
     * exclude split-K and stream-K instead */
    const cublasLtMatmulPreferenceAttributes_t aligns[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; ++i) {
        KVF_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(&pref, aligns[i], &align,
                                                          sizeof(align)));
    }
    KVF_LT_CHECK(cublasLtMatmulAlgoGetHeuristic(h, &s.op, &s.a, &s.b, &s.d, &s.d, &pref, 8, res,
                                                &found));
    /* the heuristic's order, first among the answers that need no split-K, then any */
    for (int pass = 0; pass < 2; ++pass) {
        for (int i = 0; i < found; ++i) {
            uint32_t splits = 0;
            size_t written = 0;
            if ((res[i].state != CUBLAS_STATUS_SUCCESS) || (res[i].workspaceSize != 0)) {
                continue;
            }
            (void)cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo,
                                                       CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits,
                                                       sizeof(splits), &written);
            if (((pass == 0) && (splits > 1)) || !kvf_lt_pin(h, &s, &res[i].algo, algo)) {
                continue;
            }
            return (kvf_gemm_lt_cache_put(kvf_gemm_lt_cache_process(), key, algo) == 0)
                       ? KVF_KERN_OK
                       : KVF_KERN_ENOMEM;
        }
    }
    char what[160];
    snprintf(what, sizeof(what), "no split-K-free algorithm without workspace for N %d K %d "
             "dtype %d alignment %d", key->n, key->k, key->dtype, key->align);
    kvf_kern_report("cublasLtMatmulAlgoGetHeuristic", what);
    return KVF_KERN_EUNSUPPORTED;
}

extern "C" int kvf_cuda_gemm_lt(const kvf_device_t *dev, int M, int N, int K, const void *xs,
                                const void *w, int wdtype, int ldw, float beta, float *y,
                                int ldy)
{
    const float alpha = 1.0f;
    cublasLtMatmulAlgo_t algo;
    kvf_gemm_lt_key_t key;
    cublasLtHandle_t h = NULL;
    kvf_lt_desc_t s;
    int rc;

    if (kvf_gemm_lt_key(dev->ordinal, N, K, ldw, (kvf_dtype_t)wdtype, w, xs, y, ldy, &key) !=
        0) {
        return KVF_KERN_EINVAL;
    }
    rc = kvf_lt_handle(dev, &h);
    if ((rc == KVF_KERN_OK) && !kvf_gemm_lt_cache_find(kvf_gemm_lt_cache_process(), &key, &algo)) {
        rc = kvf_lt_choose(h, &key, &algo);
    }
    if (rc == KVF_KERN_OK) {
        rc = kvf_lt_describe(&key, M, &s);
    }
    if (rc != KVF_KERN_OK) {
        return rc;
    }
    /* beta == 0: y is not read, so garbage (NaN) there is harmless */
    KVF_LT_CHECK(cublasLtMatmul(h, &s.op, &alpha, w, &s.a, xs, &s.b, &beta, y, &s.d, y, &s.d,
                                &algo, NULL, 0, kvf_cuda_stream_of(dev)));
    return KVF_KERN_OK;
}
