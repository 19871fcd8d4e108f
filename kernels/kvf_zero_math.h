/*
 * Which bytes each thread of the device layer's zeroing kernel writes
 * (kvf_device_cuda.cu: kvf_blocks_zero() and kvf_zero_ranges(), one launch
 * for a whole list): the shared arithmetic, tested on the CPU
 * (tests/kernels/test_kern_zero_units.c: every byte of every range written
 * exactly once, nothing outside, for random range lists and grids).
 *
 * A range at address addr of len bytes is cut by kvf_zero_batch_split()
 * into head bytes up to a 16-byte boundary, 16-byte words, and tail bytes;
 * those are its UNITS, numbered head first: unit u < head is the byte u,
 * then one 16-byte word per unit, then the tail's bytes. The kernel gives
 * range r to row blockIdx.y (striding by gridDim.y) and unit u to the
 * thread x = blockIdx.x * blockDim.x + threadIdx.x with u = x, x + X, ...
 * (X = gridDim.x * blockDim.x), so a page-sized range is a coalesced run of
 * 16-byte stores and a misaligned one costs at most 30 byte stores.
 */
#ifndef KVF_ZERO_MATH_H
#define KVF_ZERO_MATH_H

#include "kvf_hd.h"
#include "kvf_zero_batch.h"

#include <stddef.h>
#include <stdint.h>

/** Units of the range [addr, addr + len): head + words + tail. */
static inline KVF_HD size_t kvf_zero_units(uintptr_t addr, size_t len)
{
    size_t head, words, tail;

    kvf_zero_batch_split(addr, len, &head, &words, &tail);
    return head + words + tail;
}

/**
 * Unit @a u (< kvf_zero_units(addr, len)) of the range: its byte offset
 * from addr in *off_p; @return its width, 1 (a byte) or 16 (a word at a
 * 16-byte aligned address).
 */
static inline KVF_HD unsigned kvf_zero_unit(uintptr_t addr, size_t len, size_t u, size_t *off_p)
{
    size_t head, words, tail;

    kvf_zero_batch_split(addr, len, &head, &words, &tail);
    (void)tail;
    if (u < head) {
        *off_p = u;
        return 1u;
    }
    if (u < head + words) {
        *off_p = head + (u - head) * 16u;
        return 16u;
    }
    *off_p = head + words * 16u + (u - head - words);
    return 1u;
}

#endif
