/*
 * Mamba2's prompt scan in the chunked (SSD) form, chunk-parallel, on a state grid.
 *
 * The same recurrence as kvf_mamba2_scan() (kvf_mamba2.h: dt clamp, A = -exp(A_log), B/C
 * groups, D skip), evaluated chunk by chunk: within a chunk every output and the chunk's
 * own contribution to the state are independent sums over its tokens (kvf_ssd_math.h), so
 * chunks run in parallel; only the state passes from chunk to chunk, sequentially, as
 * S_k = round(exp(sum of the chunk's a) * S_{k-1} + local_k).
 *
 * The state grid. Chunks are cut at ABSOLUTE positions: multiples of @a grid counted from
 * the request's first token (a call whose first token is at position @a pos0 has a first
 * chunk [pos0, next multiple) and full chunks after it). The state is rounded to its dtype
 * (bf16/fp16; fp32 is exact) at each chunk's end only, and stored at the call's end. So a
 * prompt scanned in one call and the same prompt cut into calls at grid multiples perform
 * the same operations in the same order: the same y and state, bit for bit (the scheduler
 * must cut prompt chunks on the grid, and prefix caching's state checkpoints sit on it
 * too; the grid is one constant both share, passed in here, not defined here). A call cut
 * elsewhere is correct within rounding, not bitwise equal to the uncut one.
 *
 * Against kvf_mamba2_scan() (token by token, a narrow state rounded after every token):
 * equal within fp32 rounding for an fp32 state (another summation order); a bf16/fp16
 * state rounds once per chunk here, once per token there, so they differ by the narrow
 * dtype's rounding. The decode step (kvf_mamba2_step) continues from either.
 *
 * CPU: the reference of the chunked math, a plain loop (tests; not for serving). CUDA
 * (kvf_ssd_cuda.cu): per chunk and group the C.B matrix, per chunk and head the intra-chunk
 * outputs and the chunk's local state (one block each, all chunks at once), per head the
 * sequential pass over chunks, then per chunk and head the inter-chunk outputs; fp32 FMA
 * arithmetic (not tensor cores). Scratch: 4 * (heads * T * 2 + groups * chunks * grid^2 +
 * chunks * heads * head_dim * state_size) bytes for a window of at most
 * KVF_SSD_WINDOW_CHUNKS chunks (longer calls run window after window: the same bits).
 */
#ifndef KVF_SSD_H
#define KVF_SSD_H

#include "kvf_device.h"
#include "kvf_dtype.h"
#include "kvf_mamba2.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Largest state grid (chunk length) the kernels take. */
#define KVF_SSD_MAX_GRID 256

/** Chunks one CUDA window processes at once (bounds the scratch). */
#define KVF_SSD_WINDOW_CHUNKS 16

/**
 * The chunks of a call: @a T tokens from absolute position @a pos0, cut at multiples of
 * @a grid. Writes up to @a cap (start, length) pairs to @a starts / @a lens (either may be
 * NULL to count only).
 * @return the number of chunks (may exceed @a cap: then only @a cap were written); -1 for
 *         T < 0, pos0 < 0 or grid < 1.
 */
int kvf_ssd_chunks(long long pos0, int T, int grid, long long *starts, int *lens, int cap);

/**
 * Device scratch, in bytes, that kvf_mamba2_scan_chunked() takes on a GPU (from the stream's
 * arena, kvf_cuda_scratch()) for a call of @a T tokens from position @a pos0 on @a grid:
 * 4 * (2 * heads * T + groups * W * grid^2 + (W + 1) * heads * head_dim * state_size) with
 * W = min(chunks, KVF_SSD_WINDOW_CHUNKS). @a pos0 < 0: the most any pos0 needs (a workspace
 * sized for steps of at most @a T tokens: common/runtime kvf_model_ws_device_bytes()).
 * @return the bytes; 0 for T <= 0, grid < 1 or a NULL @a p.
 */
size_t kvf_ssd_scratch_bytes(const kvf_mamba2_params_t *p, int T, long long pos0, int grid);

/**
 * kvf_mamba2_scan() in the chunked form on the state grid: arguments as there, plus
 *
 * @param [in] pos0  Absolute position (within the request) of the call's first token, >= 0.
 * @param [in] grid  The state grid: chunk length, 1..KVF_SSD_MAX_GRID.
 *
 * @return KVF_KERN_OK; KVF_KERN_EINVAL (as kvf_mamba2_scan(), or pos0 / grid out of range);
 *         KVF_KERN_ENOMEM; KVF_KERN_ECUDA; KVF_KERN_EUNSUPPORTED for a CUDA device in a
 *         build without CUDA.
 */
int kvf_mamba2_scan_chunked(const kvf_device_t *dev, const kvf_mamba2_params_t *p, int T,
                            long long pos0, int grid, const float *x, int ldx, const float *dt,
                            int lddt, const float *B, const float *C, int ldbc, void *state,
                            kvf_dtype_t state_dtype, int has_state, float *y, int ldy);

#ifdef __cplusplus
}
#endif

#endif
