/*
 * TEST ONLY (kvf-devsim, kvf_devsim.c): what the simulated GPU checks of the tensor-core GEMM
 * (kvf_gemm_narrow, cuBLASLt on a real GPU). Batch invariance there rests on one rule
 * (kernels/kvf_gemm_plan.h): a weight matrix always gets the same algorithm key, whatever
 * the batch, because the key has no M and its pointers and strides are those of the layer.
 * So every call computes the key the CUDA launcher would (kvf_gemm_lt_key), and a weight
 * pointer seen before with another key, or a call the launcher would refuse (an odd address,
 * a bad stride), is counted as an error:
 *   gemm_lt_calls C gemm_lt_weights W gemm_lt_key_errors E
 * The table is keyed by the weight's address, which only means "this matrix" while its
 * allocation lives: kvf_device_free drops the keys inside the freed range
 * (devsim_gemm_lt_forget), so a later engine whose weights land on reused addresses starts
 * afresh instead of being compared with a freed matrix's key.
 * Rejected: keying on the shape (what the launcher's own cache does): two matrices of one
 * shape with other strides would then be reported, and a real change of one matrix's key
 * would hide behind another matrix of its shape.
 */
#include "kvf_devsim_gemm.h"
#include "kvf_gemm_plan.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>

#define DEVSIM_LT_CAP 4096

static pthread_mutex_t lt_lock = PTHREAD_MUTEX_INITIALIZER;
static const void *lt_w[DEVSIM_LT_CAP];
static kvf_gemm_lt_key_t lt_key[DEVSIM_LT_CAP];
static int lt_n, lt_seen;   /* live entries; weights ever checked (the report's) */
static atomic_ullong lt_calls, lt_errors;

static void lt_error(const char *why, int N, int K)
{
    if (atomic_fetch_add(&lt_errors, 1) < 8) {
        fprintf(stderr, "devsim: kvf_gemm_narrow N %d K %d: %s\n", N, K, why);
    }
}

void devsim_gemm_lt_check(int ordinal, int N, int K, const void *w, int wdtype, int ldw,
                          const void *xs, const float *y, int ldy)
{
    kvf_gemm_lt_key_t key;
    int i;

    atomic_fetch_add(&lt_calls, 1);
    if (kvf_gemm_lt_key(ordinal, N, K, ldw, (kvf_dtype_t)wdtype, w, xs, y, ldy, &key) != 0) {
        lt_error("the cuBLASLt launcher would refuse this call (kvf_gemm_lt_key)", N, K);
        return;
    }
    pthread_mutex_lock(&lt_lock);
    for (i = 0; (i < lt_n) && (lt_w[i] != w); ++i) {
    }
    if (i == lt_n) {
        if (lt_n < DEVSIM_LT_CAP) {
            lt_w[lt_n] = w;
            lt_key[lt_n++] = key;
            lt_seen++;
        }
    } else if (memcmp(&lt_key[i], &key, sizeof(key)) != 0) {
        pthread_mutex_unlock(&lt_lock);
        lt_error("a weight matrix got another algorithm key than before: its rows' bits would "
                 "change with the batch", N, K);
        return;
    }
    pthread_mutex_unlock(&lt_lock);
}

void devsim_gemm_lt_forget(uintptr_t lo, uintptr_t hi)
{
    pthread_mutex_lock(&lt_lock);
    for (int i = 0; i < lt_n;) {
        if (((uintptr_t)lt_w[i] >= lo) && ((uintptr_t)lt_w[i] < hi)) {
            --lt_n;   /* the last entry takes its place: order does not matter */
            lt_w[i] = lt_w[lt_n];
            lt_key[i] = lt_key[lt_n];
        } else {
            ++i;
        }
    }
    pthread_mutex_unlock(&lt_lock);
}

void devsim_gemm_lt_report(FILE *f)
{
    pthread_mutex_lock(&lt_lock);
    fprintf(f, " gemm_lt_calls %llu gemm_lt_weights %d gemm_lt_key_errors %llu",
            (unsigned long long)lt_calls, lt_seen, (unsigned long long)lt_errors);
    pthread_mutex_unlock(&lt_lock);
}
