/* TEST ONLY: kvf-devsim's account of the Mamba2 prompt scans (kvf_devsim_ssd.c), of
 * FlashInfer's attention (kvf_devsim_fi.c) and of the batched Mamba2 decode step
 * (kvf_devsim_ssm.c). */
#ifndef KVF_DEVSIM_SSD_H
#define KVF_DEVSIM_SSD_H

#include "kvf_gdn.h"
#include "kvf_mamba2.h"
#include "kvf_ssm_seqs.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

/* A workspace reserved on a simulated GPU: its arena bytes (the smallest is kept). */
void devsim_ssd_reserved(size_t device_bytes);

/* One kvf_mamba2_scan_chunked call on a simulated GPU: counted, its grid kept, and its
 * scratch (kvf_ssd_scratch_bytes, what the CUDA launcher takes from the arena) compared with
 * the smallest arena reserved (an error when it does not fit). */
void devsim_ssd_chunked(const kvf_mamba2_params_t *p, int T, long long pos0, int grid);

/* One kvf_gdn_scan_chunked call on a simulated GPU: as devsim_ssd_chunked, with
 * kvf_gdn_scratch_bytes (the worst position of T tokens on the grid). */
void devsim_gdn_chunked(const kvf_gdn_params_t *p, int T, long long pos0, int grid);

/* One token-by-token kvf_gdn_scan call on a simulated GPU (counted). */
void devsim_gdn_token(void);

/* One token-by-token kvf_mamba2_scan call on a simulated GPU (counted). */
void devsim_ssd_token(void);

/* Appends " ssd_calls C ssd_grid G ssd_ws_errors E token_scan_calls S" and " gdn_chunked_calls
 * C gdn_grid G gdn_ws_errors E gdn_token_calls S" to the devsim line (G: the grid of the last
 * chunked call, 0 when none). */
void devsim_ssd_report(FILE *f);

/* kvf_devsim.c: whether @a p lies in the simulated GPUs' memory. */
bool devsim_is_device_ptr(const void *p);

/* kvf_devsim_fi.c: appends " fi_decode_calls C fi_prefill_calls P fi_plan_errors E" to the
 * devsim line. */
void devsim_fi_report(FILE *f);

/* kvf_devsim_ssm.c: the batched decode step's CUDA body against the per-request path, on
 * copies of the states of one kvf_ssm_decode_seqs call (its arguments); counted, and
 * " ssm_seqs_checked C ssm_seqs_narrow N ssm_seqs_mismatches M" appended to the line. */
void devsim_ssm_seqs_twin(const kvf_ssm_seqs_t *s, const float *x_in, int ld_in, int channels,
                          int kernel, const float *conv_w, const float *conv_b,
                          kvf_dtype_t conv_dtype, const kvf_mamba2_params_t *p, const float *dt,
                          int lddt, kvf_dtype_t ssm_dtype);
void devsim_ssm_report(FILE *f);

/* kvf_devsim_ssm.c: the batched Gated DeltaNet decode step's CUDA body against the per-request
 * path likewise (one kvf_gdn_decode_seqs call's arguments); " gdn_seqs_checked C
 * gdn_seqs_narrow N gdn_seqs_mismatches M" appended to the line by devsim_ssm_report. */
void devsim_gdn_twin(const kvf_ssm_seqs_t *s, const float *x_in, int ld_in, int channels,
                     int kernel, const float *conv_w, kvf_dtype_t conv_dtype,
                     const kvf_gdn_params_t *p, const float *ba, int ldba,
                     kvf_dtype_t ssm_dtype);

#endif
