/*
 * TEST ONLY: gpu_vs_cpu's harness (gpu_vs_cpu.c), shared by its check files: the device under
 * test, the failure count, the random inputs, device copies and the table rows.
 */
#ifndef GPU_VS_CPU_H
#define GPU_VS_CPU_H

#include "kvf_device.h"
#include "kvf_dtype.h"

#include <stddef.h>
#include <stdint.h>

extern kvf_device_t gdev;   /* the device under test (the CPU with --cpu-twin) */
extern int failures;        /* FAIL rows so far */
extern uint64_t rng;        /* the inputs' generator state */

/* uniform in [lo, hi) */
float rnd(float lo, float hi);
/* @n such floats, malloc'd */
float *frand(size_t n, float lo, float hi);
/* exit(1) naming what failed */
void die(const char *what, int err);
#define CK(_what, _call)                                                                    \
    do {                                                                                    \
        int _e = (_call);                                                                   \
        if (_e != KVF_KERN_OK) {                                                            \
            die(_what, _e);                                                                 \
        }                                                                                   \
    } while (0)

/* a device copy of @bytes of host memory (uninitialised when @host is NULL) */
void *up(const void *host, size_t bytes);
/* @bytes of device memory @d into @host, after a sync */
void down(void *host, const void *d, size_t bytes);
float load_any(const void *p, kvf_dtype_t dt, size_t i);

/* The differences of n elements of dtype dt: max |gpu - cpu|, the max of |gpu - cpu| /
 * (1 + |cpu|) (absolute near 0, relative for large values), how many of those exceed 1e-4,
 * and the elements where only one side is NaN. */
typedef struct {
    double max, norm;
    size_t beyond, nan_mismatch;
} diff_t;
diff_t diff_of(const void *gpu, const void *cpu, kvf_dtype_t dt, size_t n);
/* the table rows (gpu_vs_cpu.c says what each one passes) */
void row(const char *op, const char *dtype, const void *gpu, const void *cpu,
         kvf_dtype_t dt, size_t n, double tol);
void rowf(const char *op, const char *dtype, const float *gpu, const float *cpu, size_t n,
          double tol);
void row_narrow_state(const char *op, const char *dtype, const void *gpu,
                      const void *cpu, kvf_dtype_t dt, size_t n, double tol);
void row_same(const char *op, const void *a, const void *b, size_t bytes);

/* the checks of gpu_vs_cpu_attn.c, gpu_vs_cpu_mamba.c and gpu_vs_cpu_nccl.c */
void check_attention(kvf_dtype_t dt);
void check_attention_seqs(kvf_dtype_t dt);
void check_attention_big_block(kvf_dtype_t dt);
void check_stale_nan(kvf_dtype_t dt);
void check_conv(kvf_dtype_t dt);
void check_ssm_seqs(kvf_dtype_t dt);
void check_mamba(kvf_dtype_t dt);
void check_gdn(kvf_dtype_t dt);
void check_stream_nccl(void);

#endif
