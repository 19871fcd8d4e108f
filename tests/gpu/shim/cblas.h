/*
 * tests/gpu only: the two OpenBLAS entry points kernels/kvf_gemm.c uses, for
 * tests/gpu/run.sh's standalone build on a GPU machine without OpenBLAS
 * (cblas_shim.c, a naive loop). Never used by the CMake build.
 */
#ifndef KVF_GPU_CBLAS_SHIM_H
#define KVF_GPU_CBLAS_SHIM_H

enum CBLAS_ORDER { CblasRowMajor = 101, CblasColMajor = 102 };
enum CBLAS_TRANSPOSE { CblasNoTrans = 111, CblasTrans = 112 };

void cblas_sgemm(enum CBLAS_ORDER order, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M,
                 int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
                 float beta, float *C, int ldc);
void openblas_set_num_threads(int n);

#endif
