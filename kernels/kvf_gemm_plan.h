/*
 * Which GEMM a linear layer runs on a GPU, and the one tensor-core algorithm each weight
 * shape gets: plain C, no CUDA, so every decision is unit-tested on the CPU
 * (tests/kernels/test_kern_gemm_plan.c) and the CUDA launcher (kvf_gemm_lt_cuda.cu) only
 * carries it out.
 *
 * Paths. A checkpoint's 16-bit (bf16/fp16) matrix on a GPU is kept 16-bit and multiplied on
 * tensor cores through cuBLASLt (KVF_GPU_WEIGHTS unset, empty or "native": the default):
 * x rounded to W's dtype, fp32 products and accumulation, fp32 y. KVF_GPU_WEIGHTS=exact
 * is the debugging mode that reproduces the CPU's bits (bf16 kept and widened in the
 * registers of kvferry's scalar fixed-order kernel, fp16 widened at load), fp32 widens
 * every matrix at load (the same bits as exact, twice the memory). Any other value is
 * refused by name. fp32 checkpoints take the fixed-order kernel in every mode.
 *
 * Batch invariance on tensor cores. A row's bits must not depend on M (the tokens batched
 * with it). cuBLASLt's own heuristic picks kernels, tile shapes, split-K and stream-K per
 * shape, M included, so it is asked ONCE per key: (device ordinal, N, K, ldw, dtype,
 * alignment class), never M. The key has no M by construction (kvf_gemm_lt_key() takes
 * none); the heuristic is asked for a nominal M (KVF_GEMM_LT_NOMINAL_M) and the answer is
 * kept and passed explicitly to every later call of that key, whatever its M. The algorithm
 * is pinned so the K loop runs in one order, in one pass: split-K 1
 * (CUBLASLT_ALGO_CONFIG_SPLITK_NUM), reduction scheme none
 * (CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME), and a zero workspace
 * (CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 0: no split-K or stream-K partial tiles can be
 * reduced without one); its tile, stages and swizzle are the heuristic's, fixed from then on.
 * The alignment class (16, 8, 4 or 2 bytes: the largest every pointer and row stride of the
 * call shares) is in the key and in the preference (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*),
 * so the kept algorithm is valid for every call of the key: a layer's pointers are fixed
 * offsets into its workspace, so its class does not change with the batch either.
 *
 * Rejected: letting cuBLAS choose per call (cublasGemmEx, what the 16-bit path did before:
 * a row's bits changed with the batch); a separate GEMV for small M (another summation
 * order: a request's bits would change when its batch grows past the switch).
 */
#ifndef KVF_GEMM_PLAN_H
#define KVF_GEMM_PLAN_H

#include "kvf_dtype.h"

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** How a checkpoint's 16-bit matrices sit on a GPU (KVF_GPU_WEIGHTS). */
typedef enum {
    KVF_GPU_W_NATIVE = 0, /**< unset, empty or "native" (default): kept, cuBLASLt tensor cores */
    KVF_GPU_W_EXACT,      /**< "exact": bf16 kept, widened in the fixed-order kernel (CPU bits) */
    KVF_GPU_W_FP32        /**< "fp32": every matrix widened to fp32 at load (CPU bits) */
} kvf_gpu_weights_t;

/** The GEMM a matrix runs on a GPU. */
typedef enum {
    KVF_GEMM_PATH_FIXED = 0, /**< kvferry's scalar fixed-order kernel (fp32 or bf16 W) */
    KVF_GEMM_PATH_LT         /**< cuBLASLt, 16-bit W and x, fp32 accumulation (kvf_gemm_narrow) */
} kvf_gemm_path_t;

/**
 * Parses a KVF_GPU_WEIGHTS value.
 *
 * @param [in]  value NULL or the variable's text.
 * @param [out] mode  The mode (KVF_GPU_W_NATIVE for NULL or "").
 * @return 0; -1 for any other text (@a mode then untouched): the caller refuses it by name
 *         with kvf_gpu_weights_help().
 */
int kvf_gpu_weights_parse(const char *value, kvf_gpu_weights_t *mode);

/** One line naming KVF_GPU_WEIGHTS' values and what each does (static storage). */
const char *kvf_gpu_weights_help(void);

/**
 * Whether a matrix stored as @a dtype stays in that dtype on the GPU under @a mode (else it
 * is widened to fp32 at load). fp32 is always "kept".
 */
int kvf_gpu_weights_keeps(kvf_gpu_weights_t mode, kvf_dtype_t dtype);

/** The path of a matrix stored as @a dtype under @a mode on a GPU (after kvf_gpu_weights_keeps). */
kvf_gemm_path_t kvf_gpu_gemm_path(kvf_gpu_weights_t mode, kvf_dtype_t dtype);

/** The M the heuristic is asked for, once per key (a prefill chunk's order of size). */
#define KVF_GEMM_LT_NOMINAL_M 1024

/** An algorithm's key: everything the choice may depend on, and nothing else (no M). */
typedef struct {
    int32_t ordinal; /**< CUDA device */
    int32_t n, k;    /**< W's rows (output features) and columns (input features) */
    int32_t ldw;     /**< W's row stride, elements */
    int32_t ldy;     /**< y's row stride, elements (fp32) */
    int32_t dtype;   /**< kvf_dtype_t of W and of the rounded x: bf16 or fp16 */
    int32_t align;   /**< alignment class, bytes: 16, 8, 4 or 2 */
} kvf_gemm_lt_key_t;

/**
 * The alignment class of a call: the largest of 16, 8, 4, 2 bytes dividing every base
 * address (@a w, @a xs, @a y) and every row stride in bytes (ldw and K of 2-byte
 * elements, ldy of fp32). 0 when even 2 does not (a 16-bit array at an odd address).
 */
int kvf_gemm_lt_align(const void *w, int ldw, const void *xs, int K, const float *y, int ldy);

/**
 * The key of a call (M is not an argument: the algorithm cannot depend on it).
 * @return 0; -1 for sizes < 1, strides below them, a dtype other than bf16/fp16 or an
 *         alignment class of 0.
 */
int kvf_gemm_lt_key(int ordinal, int N, int K, int ldw, kvf_dtype_t dtype, const void *w,
                    const void *xs, const float *y, int ldy, kvf_gemm_lt_key_t *key);

/** Size of an algorithm kept in the cache: cuBLASLt's cublasLtMatmulAlgo_t (8 x uint64). */
#define KVF_GEMM_LT_ALGO_BYTES 64

/** Keys one process keeps (the distinct weight shapes of the models it serves). */
#define KVF_GEMM_LT_CACHE_CAP 256

/** The process's chosen algorithms, one per key; thread-safe (rank threads share it). */
typedef struct {
    pthread_mutex_t   lock;
    int               n;
    kvf_gemm_lt_key_t keys[KVF_GEMM_LT_CACHE_CAP];
    uint64_t          algos[KVF_GEMM_LT_CACHE_CAP][KVF_GEMM_LT_ALGO_BYTES / 8];
} kvf_gemm_lt_cache_t;

/** Initializer of a static cache (C). */
#define KVF_GEMM_LT_CACHE_INIT { PTHREAD_MUTEX_INITIALIZER, 0, {{0}}, {{0}} }

/** The process's one cache, which the CUDA launcher uses. */
kvf_gemm_lt_cache_t *kvf_gemm_lt_cache_process(void);

/**
 * The algorithm kept for @a key.
 * @param [out] algo KVF_GEMM_LT_ALGO_BYTES bytes, written on a hit.
 * @return 1 found, 0 not yet chosen.
 */
int kvf_gemm_lt_cache_find(kvf_gemm_lt_cache_t *c, const kvf_gemm_lt_key_t *key, void *algo);

/**
 * Keeps @a algo for @a key, unless one is already kept (a racing rank thread chose first):
 * then that one is copied into @a algo, so every caller of a key uses one algorithm.
 * @return 0; -1 when the cache is full (the caller refuses the call by name).
 */
int kvf_gemm_lt_cache_put(kvf_gemm_lt_cache_t *c, const kvf_gemm_lt_key_t *key, void *algo);

/** Keys kept. */
int kvf_gemm_lt_cache_count(kvf_gemm_lt_cache_t *c);

#ifdef __cplusplus
}
#endif

#endif
