/* TEST ONLY: kvf-devsim's check of the tensor-core GEMM's algorithm keys (kvf_devsim_gemm.c). */
#ifndef KVF_DEVSIM_GEMM_H
#define KVF_DEVSIM_GEMM_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* One kvf_gemm_narrow call on a simulated GPU: its key as the CUDA launcher computes it,
 * compared with the key this weight matrix had before (counted, reported by the next). */
void devsim_gemm_lt_check(int ordinal, int N, int K, const void *w, int wdtype, int ldw,
                          const void *xs, const float *y, int ldy);

/* A device allocation [lo, hi) was freed: the keys of weights inside it are dropped, so its
 * addresses, once reused by another matrix, are not compared with the old one's key. */
void devsim_gemm_lt_forget(uintptr_t lo, uintptr_t hi);

/* Appends " gemm_lt_calls C gemm_lt_weights W gemm_lt_key_errors E" to the devsim line. */
void devsim_gemm_lt_report(FILE *f);

#endif
