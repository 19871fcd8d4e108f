/*
 * Transfer planner (docs/ARCHITECTURE.md §6-§7): a pure function from (model, cache
 * layout, local decode geometry, the geometry of every prefill rank, local
 * and remote block ids per KV cache group, token count) to
 *   - one descriptor list per prefill rank to read: {local_off, remote_off,
 *     len}, bytes relative to the start of each side's registered pool
 *     region (the agent adds the base addresses), adjacent runs coalesced
 *     (and a Mamba page's padding read with it when that joins the next
 *     layer slot's page on both sides: pad_bytes);
 *   - post-ops: local byte ranges to zero after the last GET completes
 *     (the untransferred tail of the last partially filled attention block,
 *     and every local attention block past the transferred coverage);
 *     Mamba state is never zeroed;
 *   - summary counters.
 * It does no I/O. Every descriptor is checked against both region sizes
 * (num_blocks * slots * page_size), so a remote peer can never make the plan
 * read or write outside a region.
 *
 * Pool layout on each side (common/geometry/kvf_geometry.h):
 *   page(block b, slot j) = (b * slots + j) * page_size, from the region start;
 *   attention page = ppl kernel blocks, each [K|V][kv_heads_rank][kernel_block_size][head_dim];
 *   Mamba page     = [conv (conv_dim_rank, conv_kernel-1) x|B|C | SSM (heads, head_dim, state) | pad].
 * Token t of a request lives in logical block t / block_size of its group's
 * block list, at position t % block_size. A Mamba group holds the state after
 * all N tokens in the LAST id of its block list (one id per request normally;
 * vLLM-style lists with one id per block_size tokens also work).
 */
#ifndef KVF_XFER_PLAN_H
#define KVF_XFER_PLAN_H

#include "kvf_geometry.h"
#include "kvf_status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/** One transfer unit: copy len bytes from remote region + remote_off to local region + local_off. */
typedef struct kvf_xfer_desc {
    uint64_t local_off;    /* bytes from the local (decode) region start */
    uint64_t remote_off;   /* bytes from the remote (prefill) rank's region start */
    uint64_t len;          /* bytes, > 0 */
} kvf_xfer_desc_t;

/** A local byte range, [off, off + len) from the local region start. */
typedef struct kvf_xfer_range {
    uint64_t off;
    uint64_t len;
} kvf_xfer_range_t;

/** Block ids of one KV cache group of the request, on both sides. Not retained. */
typedef struct kvf_xfer_group_blocks {
    const int32_t *local_ids;     /* decode block ids, each in [0, local_num_blocks) */
    int            num_local;     /* attention: >= ceil(N / local block_size); Mamba: >= 1 */
    const int32_t *remote_ids;    /* prefill block ids, each in [0, remote_num_blocks[r]) */
    int            num_remote;    /* attention: >= ceil(N / remote block_size); Mamba: >= 1 */
} kvf_xfer_group_blocks_t;

enum kvf_xfer_plan_params_field {           /* append only, never renumber */
    KVF_XFER_PLAN_PARAM_FIELD_FLAGS  = KVF_BIT(0),
    KVF_XFER_PLAN_PARAM_FIELD_PIECES = KVF_BIT(1),
    KVF_XFER_PLAN_PARAM_FIELD_SKIP   = KVF_BIT(2),
};
#define KVF_XFER_PLAN_PARAM_FIELDS_KNOWN (KVF_BIT(3) - 1)

/** One decode rank's page pieces from one prefill engine (kvf_xfer_pieces_create()). */
typedef struct kvf_xfer_pieces kvf_xfer_pieces_t;

enum kvf_xfer_plan_flags {
    KVF_XFER_PLAN_FLAG_NO_COALESCE = KVF_BIT(0),  /* one descriptor per run (debugging, tests) */
    /* Pull the sliding layers only within their window: in an attention group with a
     * sliding layer (cfg->layer_window > 0; W the largest of the group), the logical blocks
     * below floor(max(0, N - W) / local block_size) are read in the full-attention layers'
     * slots only; the sliding layers' slots of those blocks are zeroed (post-ops), so a
     * sliding layer's bytes read stay at most ceil(W / block_size) + 1 blocks whatever N
     * (a group whose every layer slides: the whole pull). Decode's queries (position N - 1
     * on) attend to keys from N - W on only in a sliding layer, and its kernel reads zeros,
     * never stale bytes, in a kernel block it touches before the window. The caller must not
     * publish those blocks as cached prefix content (their sliding slots do not hold it). */
    KVF_XFER_PLAN_FLAG_WINDOW = KVF_BIT(1),
};

/**
 * Planner input. Pointers are borrowed for the duration of
 * kvf_xfer_plan_create() only.
 */
typedef struct kvf_xfer_plan_params {
    uint64_t                        field_mask;   /* bits of kvf_xfer_plan_params_field; first */

    const kvf_model_config_t       *cfg;
    const kvf_cache_layout_t       *layout;       /* kvf_cache_layout_build(cfg) */

    /* local side (decode), this rank */
    int                             local_tp;     /* decode TP size */
    int                             local_rank;   /* this decode rank, [0, local_tp) */
    const kvf_rank_geometry_t      *local_geom;   /* kvf_rank_geometry_compute(.., local_tp, local_rank) */
    int64_t                         local_num_blocks; /* blocks in the local pool region */

    /* remote side (prefill), every rank */
    int                             remote_tp;    /* prefill TP size */
    const kvf_rank_geometry_t      *remote_geoms; /* [remote_tp], entry r for prefill rank r;
                                                     only the ranks this decode rank reads
                                                     (kvf_tp_source_ranks()) are looked at */
    const int64_t                  *remote_num_blocks; /* [remote_tp], blocks in rank r's region;
                                                          same rule. Derive it from the length
                                                          the peer registered (len / (slots *
                                                          page_size)), so the checked region
                                                          never exceeds the registered one */

    /* the request */
    int                             num_groups;   /* == layout->num_groups */
    const kvf_xfer_group_blocks_t  *groups;       /* [num_groups], in layout group order */
    int64_t                         num_tokens;   /* N: prompt tokens whose state was computed, >= 1 */

    uint32_t                        flags;        /* kvf_xfer_plan_flags; needs FIELD_FLAGS; default 0 */
    const kvf_xfer_pieces_t        *pieces;       /* needs FIELD_PIECES; default: derived per plan */
    int64_t                         skip_tokens;  /* needs FIELD_SKIP; default 0. Tokens
                                                     [0, skip_tokens) are in the local blocks
                                                     already (decode's prefix cache hit,
                                                     docs/PREFIX_CACHE.md §6): no attention
                                                     block below skip_tokens / local
                                                     block_size is read or zeroed (they may be
                                                     shared). A multiple of the local
                                                     block_size in [0, num_tokens]; any remote
                                                     block size (the runs are cut per token).
                                                     The Mamba state is read as always */
} kvf_xfer_plan_params_t;

/**
 * Descriptors for one prefill rank. Sorted by local_off; no two descriptors of
 * a plan (any rank) overlap in the local region, and none overlaps a zero range,
 * so the GETs of all ranks may run in any order and in parallel.
 */
typedef struct kvf_xfer_rank_plan {
    int              remote_rank;   /* prefill rank to read */
    size_t           num_descs;
    kvf_xfer_desc_t *descs;         /* [num_descs], owned by the plan, ascending local_off */
    uint64_t         bytes;         /* sum of descs[].len */
} kvf_xfer_rank_plan_t;

/** Planner output; created by kvf_xfer_plan_create(), freed by kvf_xfer_plan_destroy(). */
typedef struct kvf_xfer_plan {
    int                   num_ranks;     /* prefill ranks read (>= 1 desc each), ascending */
    kvf_xfer_rank_plan_t *ranks;         /* [num_ranks] */

    /* the source ranks, derived once per plan (kvf_tp_source_ranks()) and handed on: every
     * prefill rank this decode rank reads from by the TP map, ascending; ranks[] is the
     * subset with descriptors for this request. A connector needs a peer for each. */
    int                   num_sources;
    int                  *sources;       /* [num_sources] */

    size_t                num_zero;      /* post-ops: zero after the last GET */
    kvf_xfer_range_t     *zero;          /* [num_zero], local ranges, ascending, disjoint */

    /* summary */
    uint64_t              total_bytes;   /* sum over ranks of bytes */
    uint64_t              attn_bytes;    /* of which attention K/V */
    uint64_t              mamba_bytes;   /* of which Mamba conv + SSM state */
    uint64_t              pad_bytes;     /* of which Mamba page padding, read so that a
                                            Mamba block's layer slots join into one
                                            descriptor (both sides' pads equal; 0 without
                                            coalescing) */
    size_t                total_descs;   /* sum over ranks of num_descs */
    uint64_t              zero_bytes;    /* sum of zero[].len */

    /* region sizes every descriptor was checked against */
    uint64_t              local_region_bytes;   /* local_num_blocks * slots * local page_size */
    int                   remote_tp;
    uint64_t             *remote_region_bytes;  /* [remote_tp], rank r's region size */
} kvf_xfer_plan_t;

/**
 * Plan the transfer of one request's cache into this decode rank.
 *
 * @param [in]  params   See kvf_xfer_plan_params_t.
 * @param [out] plan_p   New plan, owned by the caller (kvf_xfer_plan_destroy()).
 *                       Set only on success.
 *
 * @return KVF_OK;
 *         KVF_ERR_INVALID_PARAM (logged naming the field and values) for: NULL
 *         pointers, unknown field_mask bits, TPs that do not divide each
 *         other, a geometry inconsistent with cfg (shard, dtype, head_dim,
 *         page or block sizes), KV/conv/SSM dtype mismatch between local and
 *         remote, num_groups != layout->num_groups, num_tokens < 1;
 *         KVF_ERR_OUT_OF_RANGE (logged) for a block id outside [0, num_blocks)
 *         on either side, too few local or remote block ids for N tokens, or
 *         a descriptor or zero range that would leave a region;
 *         KVF_ERR_INVALID_PARAM for skip_tokens outside [0, N] or not a multiple of the
 *         local block_size (both values named);
 *         KVF_ERR_INVALID_PARAM also for a local block id listed twice in the
 *         request (two writes would land on one page);
 *         KVF_ERR_NO_MEMORY.
 */
kvf_status_t kvf_xfer_plan_create(const kvf_xfer_plan_params_t *params, kvf_xfer_plan_t **plan_p);

/** Free @a plan and everything it owns; NULL is a no-op. */
void kvf_xfer_plan_destroy(kvf_xfer_plan_t *plan);

/**
 * The first logical block (of @a block_size tokens, decode's) that a pull of @a num_tokens
 * prompt tokens under KVF_XFER_PLAN_FLAG_WINDOW reads in every layer slot: the largest over
 * @a layout's groups of floor(max(0, N - W) / block_size) for a group with a sliding layer
 * (W its largest window), 0 for a group without one. The plan zeroes the sliding layers'
 * slots of each such group's blocks below it (after a prefix hit: from the hit on), so a
 * caller must not index blocks [skip, first) as prompt content. 0: the window flag reads
 * everything (no sliding layer, or a prompt inside the window).
 */
int64_t kvf_xfer_window_first_block(const kvf_model_config_t *cfg,
                                    const kvf_cache_layout_t *layout, int64_t num_tokens,
                                    int block_size);

/**
 * What every plan of one (prefill engine, decode rank) pair derives the same way from the
 * geometries alone: which prefill rank and head each local KV head is read from, a whole
 * attention block's runs and a Mamba page's runs. Built once (a connector: at the pair's
 * first pull) and given to each later plan (params->pieces, FIELD_PIECES), which then skips
 * deriving them and re-deriving the geometries from the model (both were checked here; the
 * plan compares the geometries it is given with the ones kept here, byte for byte). Per
 * request work (regions, ids, the walk over the request's blocks) is unchanged.
 *
 * @param [in]  params    cfg, layout, local_tp, local_rank, local_geom, remote_tp,
 *                        remote_geoms (every rank: copied) and flags as for a plan; the
 *                        request fields (num_blocks, groups, num_tokens) are not read.
 * @param [out] pieces_p  New pieces, owned by the caller (kvf_xfer_pieces_destroy()). They
 *                        borrow cfg and layout, which must outlive them.
 * @return KVF_OK; KVF_ERR_INVALID_PARAM (logged) as kvf_xfer_plan_create() for the
 *         geometries and TPs; KVF_ERR_UNSUPPORTED; KVF_ERR_NO_MEMORY.
 */
kvf_status_t kvf_xfer_pieces_create(const kvf_xfer_plan_params_t *params,
                                    kvf_xfer_pieces_t **pieces_p);

/**
 * True when @a pieces were built for exactly @a params's pair: the same cfg and layout, TPs,
 * local rank, coalescing, and byte-equal local and remote geometries. A plan given pieces
 * that do not match refuses with KVF_ERR_INVALID_PARAM.
 */
bool kvf_xfer_pieces_match(const kvf_xfer_pieces_t *pieces, const kvf_xfer_plan_params_t *params);

/** Free @a pieces; NULL is a no-op. */
void kvf_xfer_pieces_destroy(kvf_xfer_pieces_t *pieces);

/**
 * Execute @a plan between host memory pools with memcpy: every descriptor of
 * every rank, then the zero post-ops. The reference implementation for the
 * loopback backend and the xfer-test tool.
 *
 * @param [in]  plan          A plan from kvf_xfer_plan_create().
 * @param [in]  local_base    Local region start (host memory).
 * @param [in]  local_len     Local region bytes; must be >= plan->local_region_bytes.
 * @param [in]  remote_bases  [plan->remote_tp] remote region starts; entries of
 *                            ranks the plan does not read may be NULL.
 * @param [in]  remote_lens   [plan->remote_tp] remote region bytes.
 *
 * @return KVF_OK; KVF_ERR_INVALID_PARAM for a NULL base of a rank that is read;
 *         KVF_ERR_OUT_OF_RANGE when a descriptor or zero range exceeds a given
 *         length (checked before any byte is copied, so nothing was written).
 */
kvf_status_t kvf_xfer_plan_apply_local(const kvf_xfer_plan_t *plan, void *local_base,
                                       size_t local_len, const void *const *remote_bases,
                                       const size_t *remote_lens);

#endif
