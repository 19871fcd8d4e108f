/*
 * A step's device sampling in one call: the rows' parameters and penalty entries (host
 * arrays) go up in one copy, kvf_sample_rows() runs where the logits are, the results come
 * down in one copy. The buffers it needs on the device live in a workspace that grows to the
 * largest step seen (an allocation only when a step is larger than any before).
 *
 * Design: staging here rather than in the forward, so kvf_sample_rows() stays a plain
 * kernel entry point on device pointers (what tests/gpu and the simulated device wrap).
 * Rejected: keeping each request's history on the device and updating it per token (no
 * upload of the penalty entries, but a device allocation per request and a second copy of
 * state the host already owns).
 */
#ifndef KVF_SAMPLE_BATCH_H
#define KVF_SAMPLE_BATCH_H

#include "kvf_sample.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvf_sample_ws kvf_sample_ws_t;

/**
 * Sample @a rows rows of @a logits (memory of @a dev) with host parameters; synchronous:
 * @a out holds the results on return.
 *
 * @param [in,out] ws_p   the workspace (*ws_p NULL the first time: created here on @a dev;
 *                        one device per workspace); free with kvf_sample_ws_destroy().
 * @param [in]  params    host [rows], pen host [num_pen] (the rows' entries; distinct ids
 *                        within a row). Checked here (kvf_sample_row_check()).
 * @param [out] out       host [rows].
 * @return KVF_KERN_OK; KVF_KERN_EINVAL (a row or entry out of range, sizes); KVF_KERN_ENOMEM;
 *         KVF_KERN_ECUDA; KVF_KERN_EUNSUPPORTED. On error @a out is unspecified and the
 *         workspace stays usable.
 */
int kvf_sample_batch(const kvf_device_t *dev, kvf_sample_ws_t **ws_p, const float *logits,
                     int rows, int vocab, int ldl, const kvf_sample_row_t *params,
                     const kvf_sample_pen_t *pen, int num_pen, kvf_sample_res_t *out);

/**
 * Size the workspace for steps of up to @a rows rows of @a vocab logits and @a num_pen
 * penalty entries, at start (the engine's step limits), so a step within them allocates
 * nothing (issue: no device allocation inside a step). A later larger step still runs:
 * the workspace grows then, penalty entries to twice what the step needs.
 *
 * @param [in,out] ws_p  as kvf_sample_batch()'s (*ws_p NULL: created on @a dev)
 * @return KVF_KERN_OK; KVF_KERN_EINVAL (rows or vocab < 1, num_pen < 0); KVF_KERN_ENOMEM.
 */
int kvf_sample_ws_reserve(const kvf_device_t *dev, kvf_sample_ws_t **ws_p, int rows,
                          int vocab, int num_pen);

/** Device bytes a workspace of kvf_sample_ws_reserve(@a rows, @a vocab, @a num_pen) holds. */
size_t kvf_sample_ws_device_bytes(int rows, int vocab, int num_pen);

/** Bytes copied to the host per row by kvf_sample_batch() (its one download). */
size_t kvf_sample_batch_d2h_bytes(int rows);

/** Free a workspace; NULL is a no-op. */
void kvf_sample_ws_destroy(kvf_sample_ws_t *ws);

#ifdef __cplusplus
}
#endif

#endif
