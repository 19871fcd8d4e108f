/*
 * Greedy sampling on the device: the argmax of each row of logits, so a
 * greedy decode step copies one int32 per sequence to the host instead of
 * a row of vocabulary-size floats. The index is the one common/engine's
 * serial greedy scan picks (kvf_argmax_math.h: lowest index of the largest
 * non-NaN value; 0 when the row's first value is NaN).
 *
 * CUDA: one thread block per row, threads striding over the columns, then a
 * shared-memory reduction with the order-independent merge of
 * kvf_argmax_math.h; enqueued on dev->stream.
 */
#ifndef KVF_ARGMAX_H
#define KVF_ARGMAX_H

#include "kvf_device.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/**
 * out[r] = argmax of x[r][0..cols) for r < rows.
 *
 * @param [in]  dev   NULL, the CPU or a CUDA device (then x and out are
 *                    device memory).
 * @param [in]  x     fp32 [rows][ldx], ldx >= cols.
 * @param [in]  rows  >= 0 (0: no-op). @param cols > 0.
 * @param [out] out   int32 [rows].
 * @return KVF_KERN_OK; KVF_KERN_EINVAL (NULL with rows > 0, cols < 1, ldx
 *         < cols); KVF_KERN_ECUDA; KVF_KERN_EUNSUPPORTED (CUDA device, build
 *         without CUDA).
 */
int kvf_argmax_rows(const kvf_device_t *dev, const float *x, int rows, int cols, int ldx,
                    int32_t *out);

#ifdef __cplusplus
}
#endif

#endif
