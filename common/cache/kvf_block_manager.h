/*
 * Block manager (vLLM's hybrid KV cache manager, simplified): decides which
 * blocks of the unified page pool each request uses, for every KV cache group.
 *
 * - One free list of block ids shared by ALL groups (attention and Mamba),
 *   LIFO: the block freed last is handed out first. So a block that just
 *   held a request's fp32 Mamba state is the next block an attention group
 *   gets, which is exactly the recycling that exposes stale bytes.
 * - Block tables per request and group live in a caller-owned
 *   kvf_req_blocks_t. Attention groups get ceil(tokens / block_size) blocks
 *   (all attention groups the same count); each Mamba group gets exactly one
 *   block, on the first allocation.
 * - Freshly allocated ATTENTION blocks are recorded; before any kernel reads
 *   them the caller zeroes them all with kvf_block_manager_zero_fresh() (one
 *   kvf_blocks_zero call per rank pool). Mamba blocks are not zeroed: the
 *   conv/scan kernels of a fresh request write the whole state without
 *   reading it (has_state = 0).
 * - Allocation is all-or-nothing: on KVF_ERR_NO_RESOURCE nothing changed.
 * - Prefix cache (docs/PREFIX_CACHE.md): a block marked cached
 *   (kvf_block_manager_set_cached) is refcounted, may be held by several
 *   requests (kvf_block_manager_share), and when its last holder frees it it
 *   waits in an LRU list instead of the free list: it counts as free and is
 *   taken, least recently freed first, only when the free list is empty; the
 *   eviction callback tells the cache before it is reused.
 *
 * - Sliding window (kvf_block_manager_release_before): blocks a request's window left are
 *   given back through their references and its table entries name one zero block the
 *   manager holds while any table names it.
 *
 * A block id names the same pages on every rank of an instance, so one block
 * manager serves all ranks (it sits with the scheduler), while each rank has
 * its own kvf_page_pool_h memory.
 *
 * Thread safety: none. One block manager per instance, driven by the
 * scheduler thread only; rank threads get block ids by value (block tables
 * and the fresh list) and zero / read their own pools.
 */
#ifndef KVF_BLOCK_MANAGER_H
#define KVF_BLOCK_MANAGER_H

#include "kvf_geometry.h"
#include "kvf_page_pool.h"
#include "kvf_status.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct kvf_block_manager *kvf_block_manager_h;

/**
 * Block tables of one request. Caller-owned; zero-initialise it
 * (kvf_req_blocks_t r = {0}) before first use, release its blocks with
 * kvf_block_manager_free(). Read-only for the caller: group g's block table
 * is blocks[g][0 .. num_blocks[g]); for layer L use
 * g = layout.layer_group[L], slot = layout.layer_slot[L]; a Mamba group's
 * state is page (blocks[g][0], slot).
 */
typedef struct kvf_req_blocks {
    int      num_tokens;                     /* tokens covered (attention capacity asked for) */
    int      num_groups;                     /* = layout num_groups once allocated; 0 = empty */
    int      num_blocks[KVF_MAX_KV_GROUPS];  /* blocks held per group */
    int      capacity[KVF_MAX_KV_GROUPS];    /* allocated entries of blocks[g] */
    int32_t *blocks[KVF_MAX_KV_GROUPS];      /* block table per group (manager-owned memory) */
    int      released[KVF_MAX_KV_GROUPS];    /* entries [0, released[g]) were given back before
                                              * a sliding window: they name the manager's zero
                                              * block (kvf_block_manager_release_before) */
} kvf_req_blocks_t;

enum kvf_block_manager_params_field {       /* append only, never renumber */
    KVF_BLOCK_MANAGER_PARAM_FIELD_NUM_BLOCKS = KVF_BIT(0),  /* required */
    KVF_BLOCK_MANAGER_PARAM_FIELD_BLOCK_SIZE = KVF_BIT(1),  /* required */
    KVF_BLOCK_MANAGER_PARAM_FIELD_LAYOUT     = KVF_BIT(2),  /* required */
};
#define KVF_BLOCK_MANAGER_PARAM_FIELDS_KNOWN (KVF_BIT(3) - 1)

typedef struct kvf_block_manager_params {
    uint64_t                  field_mask;  /* bits of kvf_block_manager_params_field; first */
    int                       num_blocks;  /* blocks in each rank's pool, > 0 */
    int                       block_size;  /* logical block, tokens, > 0 */
    const kvf_cache_layout_t *layout;      /* copied at create */
} kvf_block_manager_params_t;

/**
 * Create a block manager with all num_blocks blocks free.
 * @return KVF_OK; KVF_ERR_INVALID_PARAM (unknown bits, missing field, bad
 *         value, layout with no groups); KVF_ERR_NO_MEMORY.
 */
kvf_status_t kvf_block_manager_create(const kvf_block_manager_params_t *params,
                                      kvf_block_manager_h *bm_p);

/** Destroy; NULL is a no-op. Requests still holding blocks must be freed first
 *  (their tables would dangle); a leak is logged at warn level. */
void kvf_block_manager_destroy(kvf_block_manager_h bm);

/** Free blocks now (the free-page count is this times the pool's slots). */
int kvf_block_manager_num_free(kvf_block_manager_h bm);

/** Of those, free cached blocks (kept for the prefix cache, reused last). */
int kvf_block_manager_num_cached_free(kvf_block_manager_h bm);

/** Free pages: kvf_block_manager_num_free() * layout slots. */
int kvf_block_manager_num_free_pages(kvf_block_manager_h bm);

/** Total blocks managed. */
int kvf_block_manager_num_blocks(kvf_block_manager_h bm);

/** Logical block size, tokens. */
int kvf_block_manager_block_size(kvf_block_manager_h bm);

/**
 * New blocks kvf_block_manager_allocate(bm, req, num_tokens) would take:
 * for each attention group max(0, ceil(num_tokens / block_size) - held),
 * plus one per Mamba group if @a req is still empty.
 */
int kvf_block_manager_blocks_needed(kvf_block_manager_h bm, const kvf_req_blocks_t *req,
                                    int num_tokens);

/** True when the blocks needed are free now. */
bool kvf_block_manager_can_allocate(kvf_block_manager_h bm, const kvf_req_blocks_t *req,
                                    int num_tokens);

/**
 * Make @a req cover @a num_tokens tokens: grow every attention group to
 * ceil(num_tokens / block_size) blocks and, on the first call, give each
 * Mamba group one block. New attention blocks are recorded as fresh (to be
 * zeroed). Asking for fewer tokens than held changes nothing (never shrinks).
 *
 * @param [in,out] req         Zero-initialised or previously allocated.
 * @param [in]     num_tokens  >= 0 (0 on an empty request still allocates
 *                             the Mamba blocks).
 * @return KVF_OK; KVF_ERR_NO_RESOURCE when not enough blocks are free;
 *         KVF_ERR_NO_MEMORY for a block table; KVF_ERR_INVALID_PARAM. On any
 *         error @a req and the free list are exactly as before (rollback).
 */
kvf_status_t kvf_block_manager_allocate(kvf_block_manager_h bm, kvf_req_blocks_t *req,
                                        int num_tokens);

/**
 * Decode growth: kvf_block_manager_allocate(bm, req, req->num_tokens + 1).
 * Takes a new block per attention group only when the token crosses a block
 * boundary.
 */
kvf_status_t kvf_block_manager_append_token(kvf_block_manager_h bm, kvf_req_blocks_t *req);

/**
 * Return all of @a req's blocks to the free list (finish or abort) and reset
 * @a req to empty (table memory released). Idempotent: freeing an empty
 * request is a no-op returning KVF_OK. Fresh blocks not yet zeroed are
 * dropped from the fresh record.
 * @return KVF_OK; KVF_ERR_INVALID_PARAM when a block id is out of range or
 *         already free (double free: logged, that id skipped, the others
 *         freed, @a req still reset).
 */
kvf_status_t kvf_block_manager_free(kvf_block_manager_h bm, kvf_req_blocks_t *req);

/**
 * Low level: take @a n blocks off the free list for a group of @a kind,
 * outside any request (transfer staging, tests). Attention blocks are
 * recorded fresh. All-or-nothing.
 * @param [out] ids  int32[n] block ids.
 * @return KVF_OK, KVF_ERR_NO_RESOURCE (nothing taken), KVF_ERR_INVALID_PARAM.
 */
kvf_status_t kvf_block_manager_alloc_blocks(kvf_block_manager_h bm, kvf_group_kind_t kind,
                                            int n, int32_t *ids);

/**
 * Low level: return @a n blocks to the free list, in order (ids[n-1] is
 * handed out first next). Double free / bad ids as kvf_block_manager_free().
 */
kvf_status_t kvf_block_manager_free_blocks(kvf_block_manager_h bm, const int32_t *ids, int n);

/** Recorded fresh attention blocks not yet taken (upper bound: num_blocks). */
int kvf_block_manager_num_fresh(kvf_block_manager_h bm);

/**
 * Move up to @a cap recorded fresh blocks into @a ids (each id once, only
 * blocks still allocated) and forget them. For TP runners that ship the list
 * to rank threads, which then call kvf_page_pool_zero_blocks() on their own
 * pool before the step's kernels. @return the count written.
 */
int kvf_block_manager_take_fresh(kvf_block_manager_h bm, int32_t *ids, int cap);

/**
 * Zero all recorded fresh blocks on each of @a n_pools pools (one
 * kvf_blocks_zero call per pool) and forget them. Call once per scheduler
 * step, after all allocations of the step and before any kernel runs.
 * @return KVF_OK or the first pool error (the record is cleared anyway).
 */
kvf_status_t kvf_block_manager_zero_fresh(kvf_block_manager_h bm, kvf_page_pool_h *pools,
                                          int n_pools);

/**
 * Called when free cached block @a block is taken for reuse, before its new
 * owner gets it: the prefix cache drops its entry (and may un-cache other
 * blocks with kvf_block_manager_set_cached(.., false); never allocate here).
 */
typedef void (*kvf_block_evict_fn_t)(void *ctx, int32_t block);

/** Set (or clear, NULL) the eviction callback. */
void kvf_block_manager_set_evict(kvf_block_manager_h bm, kvf_block_evict_fn_t fn, void *ctx);

/**
 * Mark allocated block @a b cached (the prefix cache keys it) or not. Un-
 * caching a free cached block moves it to the free list.
 * @return KVF_OK; KVF_ERR_INVALID_PARAM for a bad id or a free block.
 */
kvf_status_t kvf_block_manager_set_cached(kvf_block_manager_h bm, int32_t b, bool cached);

/**
 * A prefix hit: put @a n cached blocks at the start of every attention
 * group of the empty @a req, one more reference each (a free cached block
 * leaves the LRU). @a ids is [n][attention groups] (block j of the k-th
 * attention group at ids[j * groups + k]). The request then holds only
 * those: call kvf_block_manager_allocate() next (it adds the Mamba groups'
 * blocks and any attention block past them) or kvf_block_manager_free().
 * An id of -1 in a KVF_GROUP_SLIDING group (a block before the hit's window,
 * which the prefix cache need not keep) gets a fresh block, zeroed like any
 * new attention block by the next zero_fresh; the sliding window gives it back.
 * @return KVF_OK; KVF_ERR_INVALID_PARAM (request not empty, a block not
 *         cached, -1 in a full group); KVF_ERR_NO_RESOURCE (no block for a -1
 *         entry; nothing held); KVF_ERR_NO_MEMORY (nothing held).
 */
kvf_status_t kvf_block_manager_share(kvf_block_manager_h bm, kvf_req_blocks_t *req,
                                     const int32_t *ids, int n);

/**
 * Sliding window (docs/ARCHITECTURE.md §7): give back @a req's blocks [0, @a first) of
 * attention group @a g, whose layers every query from now on attends past (the caller's
 * arithmetic: a group whose every layer slides). Each is released through its reference
 * count (a block the prefix cache keeps, or another request shares, stays as it is for
 * them), and its table entry then names the manager's zero block, one block the manager
 * takes at the first release and never frees: the table keeps its length (kernels, page
 * lists and CUDA graphs walk it contiguously) and a kernel that touches a block before the
 * window inside a tile reads zeros there, as after a window-bounded pull. The zero block is
 * recorded fresh like any new attention block, so the caller's next zero_fresh /
 * take_fresh zeroes it before a kernel reads it; nothing may write it (a query's own K/V
 * lands at its position, inside the window). kvf_block_manager_free() skips those
 * entries. A prefix cache must not index those entries (kvf_block_manager_zero_block()
 * names them; the prefix cache keeps a sliding group's block as -1, "not cached").
 * @param [out] freed_p  blocks given back by this call (0 when none were due).
 * @return KVF_OK; KVF_ERR_INVALID_PARAM (bad group, not attention, a bad or free id).
 */
kvf_status_t kvf_block_manager_release_before(kvf_block_manager_h bm, kvf_req_blocks_t *req,
                                              int g, int first, int *freed_p);

/** The zero block that released entries name (release_before), or -1 while there is none. */
int32_t kvf_block_manager_zero_block(kvf_block_manager_h bm);

/** Blocks of @a req's group @a g that are its own (not the zero block of a release). */
int kvf_block_manager_held(kvf_block_manager_h bm, const kvf_req_blocks_t *req, int g);

#endif
