/*
 * The same-node gather by block templates: what kvf_gather() does for one pull, with the
 * per-pull host work cut to the request's block id pairs.
 *
 * A pull of one (prefill engine, decode rank) pair copies the same pieces of every page
 * (kvf_xfer_pieces_t: a whole attention block's runs, a Mamba page's runs, each from one
 * source rank at an offset in its page); only the block ids move. A table holds those pieces
 * once (uploaded to the device when it is made, at the handshake), grouped into templates (a
 * whole attention block, a partial one, a Mamba page, a zeroed page), with every source
 * pool's mapped base and page size. A pull is then a short list of jobs, one per request
 * block (template, local block id, source block id, layer slots, tokens held), and the
 * kernel expands each job into its ops (layer slot x piece) on the device: the host writes
 * 24 bytes per block instead of 24 bytes per 128 KiB op and runs no planner.
 *
 * A piece is copied whole, or, when it has a row size (a partial attention block's runs,
 * uncoalesced: one (kernel block, K/V, head) run each), clipped at the job's token count:
 * rows of tokens below it copied, the rest of the piece zeroed (the plan's zero tail). A
 * piece's pad (Mamba page padding read so slots join) is dropped on the job's last slot, as
 * the planner does. Ops per job: slots x pieces, each at most KVF_GATHER_CHUNK bytes (the
 * table splits longer pieces), so one CUDA block moves one op, as in kvf_gather().
 *
 * Safety: the table checks each piece inside its page on both sides, a job's ids are
 * checked against both sides' block counts and its slots against the table's, so no job
 * list addresses bytes outside a registered region whatever the peer sent.
 *
 * The op a job's r-th op is (kvf_gather_tmpl_op()) is one inline function shared by the
 * CPU twin (kvf_gather_tmpl.c, which the device simulator runs) and the CUDA kernel
 * (kvf_gather_cuda.cu), so both write the same bytes.
 */
#ifndef KVF_GATHER_TMPL_H
#define KVF_GATHER_TMPL_H

#include "kvf_gather.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVF_GATHER_TMPL_ZERO    0xffffffffu   /* piece source: zero the destination */
#define KVF_GATHER_TMPL_MAX_SRC 16            /* source pools of one table */
#define KVF_GATHER_TMPL_WHOLE   0xffffffffu   /* job tokens: every piece whole */

/** One piece of a page: bytes from the page starts on both sides. */
typedef struct kvf_gather_piece {
    uint32_t src;    /* source pool index, or KVF_GATHER_TMPL_ZERO */
    uint32_t row;    /* > 0: clip-able at the job's tokens (len a multiple of it); 0: whole */
    uint32_t tok0;   /* clip-able: the block token of its first row */
    uint32_t pad;    /* of len, bytes not read on the job's last slot */
    uint64_t loff;   /* from the local page start */
    uint64_t roff;   /* from the source page start */
    uint64_t len;    /* bytes, (0, KVF_GATHER_CHUNK] once in a table */
} kvf_gather_piece_t;

/** A template: pieces [first, first + count) of its table. */
typedef struct kvf_gather_tmpl {
    uint32_t first;
    uint32_t count;
} kvf_gather_tmpl_t;

/** One block of a pull. */
typedef struct kvf_gather_job {
    uint32_t tmpl;      /* template index */
    uint32_t nslots;    /* layer slots [0, nslots) of the block, 1..table slots */
    int32_t  lid;       /* local block id */
    int32_t  rid;       /* source block id (every source pool's) */
    uint32_t tokens;    /* tokens the block holds (clip-able pieces); KVF_GATHER_TMPL_WHOLE */
    uint32_t first_op;  /* set by kvf_gather_tmpl_run(): ops of the jobs before it */
} kvf_gather_job_t;

/** What kvf_gather_tmpl_op() reads: the device-resident view of a table. */
typedef struct kvf_gather_tmpl_view {
    uint64_t                  dst_base;   /* local pool start */
    uint64_t                  dst_page;   /* local page bytes */
    uint32_t                  slots;      /* layer slots per block (both sides) */
    uint32_t                  num_src;
    uint64_t                  src_base[KVF_GATHER_TMPL_MAX_SRC];
    uint64_t                  src_page[KVF_GATHER_TMPL_MAX_SRC];
    const kvf_gather_piece_t *pieces;     /* device memory on CUDA */
    const kvf_gather_tmpl_t  *tmpls;
} kvf_gather_tmpl_view_t;

/** The table's description, for kvf_gather_table_create(). Arrays copied. */
typedef struct kvf_gather_table_desc {
    uint64_t                  dst_base, dst_page;
    int64_t                   dst_blocks;   /* blocks of the local pool */
    uint32_t                  slots, num_src;
    uint64_t                  src_base[KVF_GATHER_TMPL_MAX_SRC];
    uint64_t                  src_page[KVF_GATHER_TMPL_MAX_SRC];
    int64_t                   src_blocks[KVF_GATHER_TMPL_MAX_SRC];
    const kvf_gather_piece_t *pieces;       /* host; longer than a chunk: split here */
    size_t                    num_pieces;
    const kvf_gather_tmpl_t  *tmpls;        /* host, over @a pieces */
    size_t                    num_tmpls;
} kvf_gather_table_desc_t;

typedef struct kvf_gather_table kvf_gather_table_t;

/**
 * Make a table on @a dev (CUDA: pieces and templates uploaded once, synchronously).
 * @return KVF_KERN_OK; KVF_KERN_EINVAL (logged: a piece outside its page on either side, a
 *         source index past num_src, a zero or unaligned clip-able length, a template past
 *         the pieces, num_src over KVF_GATHER_TMPL_MAX_SRC); KVF_KERN_ENOMEM; KVF_KERN_ECUDA.
 */
int kvf_gather_table_create(const kvf_device_t *dev, const kvf_gather_table_desc_t *desc,
                            kvf_gather_table_t **table_p);

/** Free @a table (no run of it may be in flight); NULL is a no-op. */
void kvf_gather_table_destroy(const kvf_device_t *dev, kvf_gather_table_t *table);

/** Ops @a n jobs expand to (also sets each job's first_op); 0 when a job names no template
 *  or they are more than UINT32_MAX. */
size_t kvf_gather_tmpl_ops(const kvf_gather_table_t *table, kvf_gather_job_t *jobs, size_t n);

/**
 * Run @a n jobs (first_op set here). CPU: done on return. CUDA: @a jobs (pinned host memory
 * the caller keeps until the stream passed this point) copied to @a dev_jobs (device memory
 * of room for n jobs) and one kernel on dev->stream, as kvf_gather_staged(). Jobs must not
 * write one another's bytes.
 * @return KVF_KERN_OK; KVF_KERN_EINVAL (logged: a template index, a block id on either side
 *         or a slot count out of range, naming the job and both values); KVF_KERN_ECUDA.
 */
int kvf_gather_tmpl_run(const kvf_device_t *dev, const kvf_gather_table_t *table,
                        kvf_gather_job_t *jobs, kvf_gather_job_t *dev_jobs, size_t n);

#ifdef __CUDACC__
#define KVF_GATHER_HD __host__ __device__
#else
#define KVF_GATHER_HD
#endif

/**
 * Op @a r of job @a job: @a op->src/dst/len the whole piece range (src 0: zero), of which
 * the first @a *copy_p bytes are copied from src and the rest zeroed.
 */
static inline KVF_GATHER_HD void kvf_gather_tmpl_op(const kvf_gather_tmpl_view_t *v,
                                                    const kvf_gather_job_t *job, uint32_t r,
                                                    kvf_gather_op_t *op, uint64_t *copy_p)
{
    const kvf_gather_tmpl_t t = v->tmpls[job->tmpl];
    const uint32_t j = r / t.count;
    const kvf_gather_piece_t pc = v->pieces[t.first + r % t.count];
    uint64_t len = pc.len, copy;

    if (j + 1 == job->nslots) {
        len -= pc.pad;
    }
    copy = len;
    if ((pc.row > 0) && (job->tokens != KVF_GATHER_TMPL_WHOLE)) {
        uint64_t rows = (job->tokens > pc.tok0) ? job->tokens - pc.tok0 : 0;
        copy = (rows * pc.row < len) ? rows * pc.row : len;
    }
    op->dst = v->dst_base + ((uint64_t)job->lid * v->slots + j) * v->dst_page + pc.loff;
    op->len = len;
    if (pc.src == KVF_GATHER_TMPL_ZERO) {
        op->src = 0;
        copy = 0;
    } else {
        op->src = v->src_base[pc.src] +
                  ((uint64_t)job->rid * v->slots + j) * v->src_page[pc.src] + pc.roff;
    }
    *copy_p = copy;
}

/** The job holding op @a o of @a n jobs (first_op ascending): a binary search. */
static inline KVF_GATHER_HD size_t kvf_gather_tmpl_job(const kvf_gather_job_t *jobs, size_t n,
                                                       uint64_t o)
{
    size_t lo = 0, hi = n;

    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (jobs[mid].first_op <= o) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    return lo;
}

#ifdef __cplusplus
}
#endif

#endif
