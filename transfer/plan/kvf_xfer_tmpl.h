/*
 * The same-node pull without a plan: an (engine, decode rank) pair's pieces
 * (kvf_xfer_pieces_t) as the templates of a gather table (kernels/kvf_gather_tmpl.h), and a
 * request as one job per block, from the block ids alone. What the gather then writes is, byte
 * for byte, what kvf_xfer_plan_create()'s descriptors and zero ranges write
 * (tests/transfer/plan/test_xfer_tmpl.c proves it for every layout of the matrix).
 *
 * Templates (index = enum kvf_xfer_tmpl_kind): a zeroed page (blocks past the tokens, before
 * a sliding window); a Mamba page (its pieces, pad and all: the pad is dropped on a group's
 * last slot as the plan does); a whole attention block (the coalesced pieces); the partial
 * last attention block (one run per kernel block, K/V and head, clipped at the block's
 * tokens and zeroed past them: the plan's zero tail). A pair whose source ranks' block or
 * kernel block sizes differ from decode's has no templates (a local block then spans
 * several source blocks): its pulls keep the plan and its op list.
 */
#ifndef KVF_XFER_TMPL_H
#define KVF_XFER_TMPL_H

#include "kvf_gather_tmpl.h"
#include "kvf_xfer_plan.h"

enum kvf_xfer_tmpl_kind {
    KVF_XFER_TMPL_ZERO = 0,
    KVF_XFER_TMPL_MAMBA,
    KVF_XFER_TMPL_WHOLE,
    KVF_XFER_TMPL_PART,
    KVF_XFER_TMPL_COUNT
};

/** A pair's templates, for kvf_gather_table_create() (src = the prefill rank). */
typedef struct kvf_xfer_tmpls {
    kvf_gather_piece_t *pieces;                      /* owned */
    size_t              num_pieces;
    kvf_gather_tmpl_t   tmpls[KVF_XFER_TMPL_COUNT];  /* an absent kind: the zero page's */
    int                 num_sources;                 /* prefill ranks read, ascending */
    int                 sources[KVF_GATHER_TMPL_MAX_SRC];
} kvf_xfer_tmpls_t;

/**
 * The templates of @a pc's pair into @a out (kvf_xfer_tmpls_free()).
 * @return KVF_OK; KVF_ERR_UNSUPPORTED with the reason in @a why (not logged): block or kernel
 *         block sizes that differ between the sides, more than KVF_GATHER_TMPL_MAX_SRC
 *         prefill ranks; KVF_ERR_NO_MEMORY.
 */
kvf_status_t kvf_xfer_tmpls_build(const kvf_xfer_pieces_t *pc, kvf_xfer_tmpls_t *out,
                                  char *why, size_t why_len);

/** Free what kvf_xfer_tmpls_build() put in @a t. */
void kvf_xfer_tmpls_free(kvf_xfer_tmpls_t *t);

/** Jobs kvf_xfer_tmpl_jobs() writes at most for @a p's request. */
size_t kvf_xfer_tmpl_jobs_max(const kvf_xfer_plan_params_t *p);

/**
 * The jobs of @a p's request (its pieces given: FIELD_PIECES, the ones the templates were
 * built from) into @a jobs (room for kvf_xfer_tmpl_jobs_max()), with the checks of
 * kvf_xfer_plan_create() (ids against both regions, enough ids for the tokens, no local id
 * twice, skip tokens), and the bytes it copies into @a bytes_p and zeroes into @a zero_p.
 * @return KVF_OK; the plan's errors (logged); KVF_ERR_UNSUPPORTED when the pieces have no
 *         templates (sizes differ).
 */
kvf_status_t kvf_xfer_tmpl_jobs(const kvf_xfer_plan_params_t *p, kvf_gather_job_t *jobs,
                                size_t *n_p, uint64_t *bytes_p, uint64_t *zero_p);

#endif
