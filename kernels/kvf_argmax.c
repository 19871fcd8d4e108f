/*
 * kvf_argmax_rows(): checks, the CPU loop (the shared candidate fold of
 * kvf_argmax_math.h in index order) and the dispatch to kvf_argmax_cuda.cu.
 */
#include "kvf_argmax.h"
#include "kvf_argmax_math.h"
#include "kvf_kern_internal.h"

#ifdef KVF_HAVE_CUDA
#include "kvf_device_cuda.h"
#endif

int kvf_argmax_rows(const kvf_device_t *dev, const float *x, int rows, int cols, int ldx,
                    int32_t *out)
{
    if ((rows < 0) || (cols < 1) || (ldx < cols)) {
        return KVF_KERN_EINVAL;
    }
    if (rows == 0) {
        return KVF_KERN_OK;
    }
    if ((x == NULL) || (out == NULL)) {
        return KVF_KERN_EINVAL;
    }
    if (!kvf_kern_on_cpu(dev)) {
#ifdef KVF_HAVE_CUDA
        return kvf_cuda_argmax_rows(dev, x, rows, cols, ldx, out);
#else
        return KVF_KERN_EUNSUPPORTED;
#endif
    }
    for (int r = 0; r < rows; ++r) {
        const float *row = x + (size_t)r * (size_t)ldx;
        kvf_argmax_cand_t c = {0.0f, -1};
        for (int i = 0; i < cols; ++i) {
            c = kvf_argmax_take(c, row[i], i);
        }
        out[r] = kvf_argmax_result(c, row[0]);
    }
    return KVF_KERN_OK;
}
