/*
 * KVF_HD: marks the arithmetic every kernel shares between the CPU and CUDA.
 *
 * The body of each kernel (what one element, row or (query, head) pair
 * computes) is written once, as a `static inline KVF_HD` function in a
 * kvf_*_math.h header. The CPU kernels (*.c) call it in loops; the CUDA
 * kernels (*_cuda.cu) call it from threads. Under nvcc KVF_HD is
 * `__host__ __device__`; for the C compiler it is empty, so a math header
 * is plain C11 and the CPU test suite runs exactly the arithmetic a GPU
 * runs (up to the device's libm ulps and nvcc's FMA contraction).
 *
 * Rules for a math header: no allocation, no I/O, no libc beyond <math.h>
 * functions that CUDA also provides (expf, log1pf, sqrt, ldexpf, frexpf,
 * rintf, erff, tanhf), no globals, and arrays are passed in by the caller
 * (a CPU scratch buffer or a GPU thread's local / global scratch).
 */
#ifndef KVF_HD_H
#define KVF_HD_H

#if defined(__CUDACC__)
#define KVF_HD __host__ __device__
#else
#define KVF_HD
#endif

#endif
