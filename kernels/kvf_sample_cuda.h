/* The CUDA launcher of kvf_sample_rows() (kvf_sample_cuda.cu); kernels/ internal. */
#ifndef KVF_SAMPLE_CUDA_H
#define KVF_SAMPLE_CUDA_H

#include "kvf_sample.h"

#ifdef __cplusplus
extern "C" {
#endif

/** kvf_sample_rows() on a CUDA device (arguments checked by the caller). */
int kvf_cuda_sample_rows(const kvf_device_t *dev, const float *logits, int rows, int vocab,
                         int ldl, const kvf_sample_row_t *params, const kvf_sample_pen_t *pen,
                         float *scratch, kvf_sample_res_t *out);

#ifdef __cplusplus
}
#endif

#endif
