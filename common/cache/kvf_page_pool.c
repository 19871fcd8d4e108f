/*
 * Per-rank unified page pool: one device allocation, page addressing, and
 * block zeroing.
 *
 * Design: the pool owns memory only; which block a request gets is decided
 * once per instance by the block manager, because a block id must name the
 * same pages on every TP rank. Zeroing converts a block list to the list of
 * all its pages (block * slots + j) and issues a single kvf_blocks_zero()
 * call, so a scheduler step costs one launch per rank however many blocks it
 * allocated. The memory is never cleared as a whole at create time: stale
 * bytes are the normal state of a recycled page, and tests rely on that.
 */
#include "kvf_page_pool.h"
#include "kvf_kern_status.h"
#include "kvf_log.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

struct kvf_page_pool {
    kvf_device_t device;
    void        *base;
    size_t       bytes;
    size_t       page_size;
    int          slots;
    int          num_blocks;
    bool         zeroing;
    bool         owns_memory;   /* false: params.memory, the caller frees it */
};

#define KVF_PAGE_POOL_REQUIRED (KVF_PAGE_POOL_PARAM_FIELD_NUM_BLOCKS |   \
                                KVF_PAGE_POOL_PARAM_FIELD_SLOTS |        \
                                KVF_PAGE_POOL_PARAM_FIELD_PAGE_SIZE)

void kvf_page_pool_params_init(const kvf_rank_geometry_t *geom, const kvf_cache_layout_t *layout,
                               int num_blocks, kvf_page_pool_params_t *params_p)
{
    memset(params_p, 0, sizeof(*params_p));
    params_p->field_mask = KVF_PAGE_POOL_REQUIRED;
    params_p->num_blocks = num_blocks;
    params_p->slots = layout->slots;
    params_p->page_size = geom->page_size;
    params_p->device = kvf_device_cpu();
}

int kvf_page_pool_blocks_for_bytes(size_t bytes, int slots, size_t page_size)
{
    size_t n;

    if ((slots <= 0) || (page_size == 0) || (page_size > SIZE_MAX / (size_t)slots)) {
        return 0;
    }
    n = bytes / ((size_t)slots * page_size);
    return (n > INT32_MAX) ? INT32_MAX : (int)n;
}

kvf_status_t kvf_page_pool_create(const kvf_page_pool_params_t *params, kvf_page_pool_h *pool_p)
{
    struct kvf_page_pool *pool;
    kvf_status_t status;
    size_t pages;
    int err;

    if ((params == NULL) || (pool_p == NULL)) {
        return KVF_ERR_INVALID_PARAM;
    }
    if (params->field_mask & ~(uint64_t)KVF_PAGE_POOL_PARAM_FIELDS_KNOWN) {
        kvf_error("unknown page pool params bits 0x%" PRIx64,
                  params->field_mask & ~(uint64_t)KVF_PAGE_POOL_PARAM_FIELDS_KNOWN);
        return KVF_ERR_INVALID_PARAM;
    }
    if ((params->field_mask & KVF_PAGE_POOL_REQUIRED) != KVF_PAGE_POOL_REQUIRED) {
        kvf_error("page pool params need num_blocks, slots and page_size");
        return KVF_ERR_INVALID_PARAM;
    }
    if ((params->num_blocks <= 0) || (params->slots <= 0) || (params->page_size == 0)) {
        kvf_error("page pool: num_blocks %d slots %d page_size %zu must all be positive",
                  params->num_blocks, params->slots, params->page_size);
        return KVF_ERR_INVALID_PARAM;
    }
    pages = (size_t)params->num_blocks * (size_t)params->slots;
    if (params->page_size > SIZE_MAX / pages) {
        kvf_error("page pool: %zu pages of %zu bytes overflow", pages, params->page_size);
        return KVF_ERR_INVALID_PARAM;
    }

    pool = calloc(1, sizeof(*pool));
    if (pool == NULL) {
        kvf_error("failed to allocate page pool");
        return KVF_ERR_NO_MEMORY;
    }
    pool->device = (params->field_mask & KVF_PAGE_POOL_PARAM_FIELD_DEVICE) ? params->device :
                                                                            kvf_device_cpu();
    pool->bytes = pages * params->page_size;
    pool->page_size = params->page_size;
    pool->slots = params->slots;
    pool->num_blocks = params->num_blocks;
    pool->zeroing = !((params->field_mask & KVF_PAGE_POOL_PARAM_FIELD_NO_ZERO) &&
                      params->disable_zeroing);

    if (params->field_mask & KVF_PAGE_POOL_PARAM_FIELD_MEMORY) {
        if ((params->memory == NULL) || ((uintptr_t)params->memory % 64 != 0)) {
            kvf_error("page pool: outside memory %p must be non-NULL and 64-byte aligned",
                      params->memory);
            status = KVF_ERR_INVALID_PARAM;
            goto err_free_pool;
        }
        pool->base = params->memory;
        err = KVF_KERN_OK;
    } else {
        pool->owns_memory = true;
        err = kvf_device_alloc(&pool->device, pool->bytes, &pool->base);
    }
    if (err != KVF_KERN_OK) {
        status = kvf_status_from_kern(err);
        kvf_error("page pool: %s allocation of %zu bytes failed: %s",
                  kvf_device_kind_name(pool->device.kind), pool->bytes, kvf_kern_strerror(err));
        goto err_free_pool;
    }
    if (!pool->zeroing) {
        kvf_warn("page pool: fresh block zeroing DISABLED (test only): stale bytes may "
                 "reach attention kernels");
    }
    kvf_log(KVF_LOG_DEBUG, KVF_SUB_POOL, "page pool: %d blocks x %d slots x %zu bytes on %s",
            pool->num_blocks, pool->slots, pool->page_size,
            kvf_device_kind_name(pool->device.kind));
    *pool_p = pool;
    return KVF_OK;

err_free_pool:
    free(pool);
    return status;
}

void kvf_page_pool_destroy(kvf_page_pool_h pool)
{
    if (pool == NULL) {
        return;
    }
    if (pool->owns_memory) {
        kvf_device_free(&pool->device, pool->base);
    }
    free(pool);
}

void *kvf_page_pool_base(kvf_page_pool_h pool)
{
    return pool->base;
}

size_t kvf_page_pool_bytes(kvf_page_pool_h pool)
{
    return pool->bytes;
}

size_t kvf_page_pool_page_size(kvf_page_pool_h pool)
{
    return pool->page_size;
}

int kvf_page_pool_slots(kvf_page_pool_h pool)
{
    return pool->slots;
}

int kvf_page_pool_num_blocks(kvf_page_pool_h pool)
{
    return pool->num_blocks;
}

const kvf_device_t *kvf_page_pool_device(kvf_page_pool_h pool)
{
    return &pool->device;
}

bool kvf_page_pool_zeroing_enabled(kvf_page_pool_h pool)
{
    return pool->zeroing;
}

size_t kvf_page_pool_page_offset(kvf_page_pool_h pool, int block, int slot)
{
    return ((size_t)block * (size_t)pool->slots + (size_t)slot) * pool->page_size;
}

void *kvf_page_pool_page(kvf_page_pool_h pool, int block, int slot)
{
    if ((block < 0) || (block >= pool->num_blocks) || (slot < 0) || (slot >= pool->slots)) {
        return NULL;
    }
    return (char *)pool->base + kvf_page_pool_page_offset(pool, block, slot);
}

kvf_status_t kvf_page_pool_zero_blocks(kvf_page_pool_h pool, const int32_t *block_ids, int n)
{
    int64_t *pages;
    size_t np = 0;
    int err;

    if (n < 0 || ((n > 0) && (block_ids == NULL))) {
        return KVF_ERR_INVALID_PARAM;
    }
    if ((n == 0) || !pool->zeroing) {
        return KVF_OK;
    }
    for (int i = 0; i < n; ++i) {
        if ((block_ids[i] < 0) || (block_ids[i] >= pool->num_blocks)) {
            kvf_error("page pool: zero of block %d outside [0, %d)", block_ids[i],
                      pool->num_blocks);
            return KVF_ERR_OUT_OF_RANGE;
        }
    }
    pages = malloc((size_t)n * (size_t)pool->slots * sizeof(*pages));
    if (pages == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    for (int i = 0; i < n; ++i) {
        for (int j = 0; j < pool->slots; ++j) {
            pages[np++] = (int64_t)block_ids[i] * pool->slots + j;
        }
    }
    /* a GPU pool's zeroing is launched on the calling thread's current device: make it the
     * pool's (decode's leader zeroes every rank's fresh blocks at import, rank r's pool on
     * cuda:N+r; without peer access another GPU's memory is an illegal address) */
    err = kvf_device_bind(&pool->device);
    if (err == KVF_KERN_OK) {
        err = kvf_blocks_zero(&pool->device, pool->base, pool->page_size, pages, np);
    }
    free(pages);
    if (err != KVF_KERN_OK) {
        kvf_error("page pool: zeroing %d blocks failed: %s", n, kvf_kern_strerror(err));
        return kvf_status_from_kern(err);
    }
    return KVF_OK;
}

void kvf_page_pool_attn_view(kvf_page_pool_h pool, const kvf_rank_geometry_t *geom, int head_dim,
                             int slot, const int32_t *block_table, int num_blocks,
                             kvf_paged_kv_t *kv_p)
{
    memset(kv_p, 0, sizeof(*kv_p));
    kv_p->base = pool->base;
    kv_p->page_size = pool->page_size;
    kv_p->slots = pool->slots;
    kv_p->slot = slot;
    kv_p->dtype = geom->kv_dtype;
    kv_p->kv_heads = geom->shard.kv_heads;
    kv_p->head_dim = head_dim;
    kv_p->block_size = geom->block_size;
    kv_p->kernel_block_size = geom->kernel_block_size;
    kv_p->layout = (int)geom->kv_layout;
    kv_p->block_table = block_table;
    kv_p->num_blocks = num_blocks;
}

void *kvf_page_pool_conv_state(kvf_page_pool_h pool, int block, int slot)
{
    return kvf_page_pool_page(pool, block, slot);
}

void *kvf_page_pool_ssm_state(kvf_page_pool_h pool, const kvf_rank_geometry_t *geom, int block,
                              int slot)
{
    char *page = kvf_page_pool_page(pool, block, slot);
    return (page == NULL) ? NULL : page + geom->conv_bytes;
}
