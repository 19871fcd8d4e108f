/*
 * Internal: the CUDA side of kvf_gather_tmpl.h (kvf_gather_cuda.cu). Same contracts as the
 * public functions; those check the arguments first.
 */
#ifndef KVF_GATHER_TMPL_CUDA_H
#define KVF_GATHER_TMPL_CUDA_H

#include "kvf_gather_tmpl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Copy @a pieces and @a tmpls to device memory (synchronously) and point @a view at them. */
int  kvf_cuda_gather_table_upload(const kvf_device_t *dev, const kvf_gather_piece_t *pieces,
                                  size_t num_pieces, const kvf_gather_tmpl_t *tmpls,
                                  size_t num_tmpls, kvf_gather_tmpl_view_t *view);
/* Free what kvf_cuda_gather_table_upload() put in @a view. */
void kvf_cuda_gather_table_free(const kvf_device_t *dev, kvf_gather_tmpl_view_t *view);
/* @a jobs (pinned) -> @a dev_jobs on dev->stream, then one kernel over @a ops ops. */
int  kvf_cuda_gather_tmpl_run(const kvf_device_t *dev, const kvf_gather_tmpl_view_t *view,
                              const kvf_gather_job_t *jobs, kvf_gather_job_t *dev_jobs,
                              size_t n, size_t ops);

#ifdef __cplusplus
}
#endif

#endif
