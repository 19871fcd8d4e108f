/*
 * tests/gpu only: row-major C = alpha * op(A) op(B) + beta * C, naive, in
 * double accumulation, for the standalone build of gpu_vs_cpu where the
 * machine has no OpenBLAS (tests/gpu/run.sh). Column-major is not needed.
 */
#include "cblas.h"

#include <stddef.h>

void cblas_sgemm(enum CBLAS_ORDER order, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M,
                 int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
                 float beta, float *C, int ldc)
{
    (void)order;   /* row-major only */
    for (int m = 0; m < M; ++m) {
        for (int n = 0; n < N; ++n) {
            double s = 0.0;
            for (int k = 0; k < K; ++k) {
                float a = (ta == CblasNoTrans) ? A[(size_t)m * lda + k] : A[(size_t)k * lda + m];
                float b = (tb == CblasNoTrans) ? B[(size_t)k * ldb + n] : B[(size_t)n * ldb + k];
                s += (double)a * (double)b;
            }
            float *c = &C[(size_t)m * ldc + n];
            *c = (float)(alpha * s) + ((beta == 0.0f) ? 0.0f : beta * *c);
        }
    }
}

void openblas_set_num_threads(int n)
{
    (void)n;
}
