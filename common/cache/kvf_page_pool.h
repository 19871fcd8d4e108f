/*
 * Unified page pool of one rank: the cache memory shared by every KV cache
 * group (attention K/V and Mamba state alike), as in vLLM's hybrid
 * allocator.
 *
 * Memory: num_blocks blocks x slots pages x page_size bytes, one device
 * allocation (kernels/kvf_device.h, CPU or CUDA) or memory the caller
 * hands in (params.memory: the transfer connector's shared memory, which a
 * same-host peer reads with a plain copy), laid out exactly as
 * common/geometry/kvf_geometry.h describes:
 *
 *     page(block b, slot j) = base + (b * slots + j) * page_size
 *
 * (a Mamba group's state lives in these pages; an attention block's bytes are the same
 * `slots` pages, addressed by the geometry's strides: per page at --kv-layout layer-major,
 * head by head across them at head-major, kvf_page_pool_attn_view() hands the layout on).
 *
 * A block id means the same pages on every rank of an instance, so WHICH
 * block a request gets is decided once per instance by the block manager
 * (common/cache/kvf_block_manager.h: free list, block tables, fresh-block
 * recording); this object only owns the memory and zeroes blocks on it.
 *
 * Zeroing: kvf_page_pool_zero_blocks() clears every page of a list of blocks
 * in ONE kvf_blocks_zero() call; the block manager calls it for freshly
 * allocated attention blocks before any kernel reads them (the fix for
 * stale-bytes NaN, docs/ARCHITECTURE.md §1). Test-only switch: params.disable_zeroing
 * turns it into a no-op so tests can reproduce the hazard. The pool reads no
 * environment: the daemons expose the switch as the hidden config row
 * TEST_NO_BLOCK_ZERO (daemon/kvf_role.h).
 *
 * Thread safety: one pool per rank, used by that rank's thread (zeroing,
 * kernels); the accessors are read-only after create and safe anywhere.
 */
#ifndef KVF_PAGE_POOL_H
#define KVF_PAGE_POOL_H

#include "kvf_geometry.h"
#include "kvf_status.h"
#include "kvf_attention.h"
#include "kvf_device.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kvf_page_pool *kvf_page_pool_h;

enum kvf_page_pool_params_field {           /* append only, never renumber */
    KVF_PAGE_POOL_PARAM_FIELD_NUM_BLOCKS = KVF_BIT(0),  /* required */
    KVF_PAGE_POOL_PARAM_FIELD_SLOTS      = KVF_BIT(1),  /* required */
    KVF_PAGE_POOL_PARAM_FIELD_PAGE_SIZE  = KVF_BIT(2),  /* required */
    KVF_PAGE_POOL_PARAM_FIELD_DEVICE     = KVF_BIT(3),  /* default: CPU */
    KVF_PAGE_POOL_PARAM_FIELD_NO_ZERO    = KVF_BIT(4),  /* default: zeroing on */
    KVF_PAGE_POOL_PARAM_FIELD_MEMORY     = KVF_BIT(5),  /* default: the pool allocates */
};
#define KVF_PAGE_POOL_PARAM_FIELDS_KNOWN (KVF_BIT(6) - 1)

typedef struct kvf_page_pool_params {
    uint64_t     field_mask;      /* bits of kvf_page_pool_params_field; first */
    int          num_blocks;      /* blocks, > 0 */
    int          slots;           /* pages per block (kvf_cache_layout_t.slots), > 0 */
    size_t       page_size;       /* bytes per page (kvf_rank_geometry_t.page_size), > 0 */
    kvf_device_t device;          /* where the memory lives */
    bool         disable_zeroing; /* TEST ONLY: zero_blocks becomes a no-op */
    void        *memory;          /* MEMORY: num_blocks * slots * page_size bytes on .device,
                                   * page aligned, allocated by the caller (e.g. a transfer
                                   * connector's shared memory); not owned: it must stay
                                   * valid while the pool is used, and destroy never touches
                                   * it, so the owner may free it before or after
                                   * kvf_page_pool_destroy(); contents undefined (fresh
                                   * blocks are zeroed before use as always) */
} kvf_page_pool_params_t;

/**
 * Fill @a params_p for @a num_blocks blocks of rank geometry @a geom and
 * cache layout @a layout on the CPU (set .device and the DEVICE bit after to
 * use a GPU). Sets the NUM_BLOCKS, SLOTS and PAGE_SIZE bits.
 */
void kvf_page_pool_params_init(const kvf_rank_geometry_t *geom, const kvf_cache_layout_t *layout,
                               int num_blocks, kvf_page_pool_params_t *params_p);

/**
 * How many blocks fit in @a bytes: floor(bytes / (slots * page_size)),
 * capped at INT32_MAX; 0 when slots or page_size is 0.
 */
int kvf_page_pool_blocks_for_bytes(size_t bytes, int slots, size_t page_size);

/**
 * Allocate the pool memory (uninitialised: it is zeroed block by block when
 * handed to attention, never as a whole).
 *
 * @return KVF_OK and *pool_p; KVF_ERR_INVALID_PARAM for unknown field bits, a
 *         missing required field, non-positive sizes or a total size that
 *         overflows; KVF_ERR_NO_MEMORY; KVF_ERR_CUDA; KVF_ERR_UNSUPPORTED
 *         (CUDA device in a CPU-only build). Every error is logged once.
 */
kvf_status_t kvf_page_pool_create(const kvf_page_pool_params_t *params, kvf_page_pool_h *pool_p);

/** Free the memory and the pool; NULL is a no-op. Kernels must be done with it. */
void kvf_page_pool_destroy(kvf_page_pool_h pool);

/** Base address of the pool memory (device pointer for CUDA). */
void *kvf_page_pool_base(kvf_page_pool_h pool);

/** Total bytes: num_blocks * slots * page_size (the region to register for RDMA). */
size_t kvf_page_pool_bytes(kvf_page_pool_h pool);

size_t kvf_page_pool_page_size(kvf_page_pool_h pool);
int    kvf_page_pool_slots(kvf_page_pool_h pool);
int    kvf_page_pool_num_blocks(kvf_page_pool_h pool);

/** The device the memory lives on (pointer valid for the pool's lifetime). */
const kvf_device_t *kvf_page_pool_device(kvf_page_pool_h pool);

/** True unless zeroing was disabled (params.disable_zeroing). */
bool kvf_page_pool_zeroing_enabled(kvf_page_pool_h pool);

/**
 * Address of page (block, slot); NULL when out of range. For CUDA pools this
 * is a device pointer (do not dereference on the host).
 */
void *kvf_page_pool_page(kvf_page_pool_h pool, int block, int slot);

/** Byte offset of page (block, slot) from the base: (block * slots + slot) * page_size. */
size_t kvf_page_pool_page_offset(kvf_page_pool_h pool, int block, int slot);

/**
 * Zero every page (all slots) of @a n blocks in ONE kvf_blocks_zero() call.
 * No-op returning KVF_OK when zeroing is disabled or n == 0.
 *
 * CUDA: makes the pool's device current on the calling thread first (the
 * zeroing kernel is launched there), and leaves it current.
 *
 * @param [in] block_ids  Host int32[n], each in [0, num_blocks).
 * @return KVF_OK (CUDA: enqueued on the pool device's stream);
 *         KVF_ERR_OUT_OF_RANGE for a bad id (nothing zeroed);
 *         KVF_ERR_NO_MEMORY; KVF_ERR_CUDA.
 */
kvf_status_t kvf_page_pool_zero_blocks(kvf_page_pool_h pool, const int32_t *block_ids, int n);

/**
 * Fill the kernel's view of one attention layer for one request (all
 * fields of kvf_paged_kv_t from the pool and rank geometry): base, page
 * size and slots of @a pool, dtype, kv_heads, block and kernel block size of
 * @a geom, @a head_dim from the model config, @a slot (layout.layer_slot of
 * the layer), and the request's block table of the layer's group
 * (kvf_req_blocks_t.blocks[g], .num_blocks[g]; not copied, must outlive the
 * kernel calls).
 */
void kvf_page_pool_attn_view(kvf_page_pool_h pool, const kvf_rank_geometry_t *geom, int head_dim,
                             int slot, const int32_t *block_table, int num_blocks,
                             kvf_paged_kv_t *kv_p);

/**
 * Mamba state of one layer of one request: the conv state
 * [conv_dim_rank][conv_kernel-1] (geom->conv_dtype) starts at the page, the
 * SSM state [mamba_heads_rank][head_dim][state] (geom->ssm_dtype) at
 * page + geom->conv_bytes. NULL when (block, slot) is out of range.
 */
void *kvf_page_pool_conv_state(kvf_page_pool_h pool, int block, int slot);
void *kvf_page_pool_ssm_state(kvf_page_pool_h pool, const kvf_rank_geometry_t *geom, int block,
                              int slot);

#endif
