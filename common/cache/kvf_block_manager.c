/*
 * Block manager: one LIFO free list of block ids shared by every KV cache
 * group, per-request block tables, and the record of fresh attention blocks
 * that must be zeroed before a kernel reads them.
 *
 * Design: the free list is a stack. Freeing a request pushes its attention
 * groups' blocks first and its Mamba groups' blocks last, so the very next
 * allocation - typically another request's attention blocks - receives the
 * pages that just held fp32 Mamba state. That is the worst case for stale
 * bytes, chosen on purpose: the zeroing path is exercised on every reuse
 * instead of only under memory pressure. Rejected alternative: a FIFO or
 * bitmap allocator, which would rarely recycle a page immediately and hide
 * a missing zeroing step in tests.
 *
 * Per-block state is one byte (free / allocated, plus a "fresh" bit for
 * attention blocks not yet zeroed). The fresh list holds exactly the blocks
 * with the bit set, each once: freeing a fresh block removes it eagerly, so
 * a block freed and re-allocated to a Mamba group within one step is never
 * zeroed, and one re-allocated to attention is zeroed once.
 *
 * Allocation is all-or-nothing: the block count is checked against the free
 * count and table memory is reserved before any block is popped, so the
 * only failure after the first block leaves the stack is impossible.
 */
#include "kvf_block_manager.h"
#include "kvf_log.h"
#include "kvf_array.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

enum {
    KVF_BLOCK_FREE      = 0,
    KVF_BLOCK_ALLOCATED = 1,
    KVF_BLOCK_FRESH     = 2,   /* bit: allocated to attention, not yet zeroed */
    KVF_BLOCK_CACHED    = 4,   /* bit: the prefix cache keys it; at ref 0 it waits in the LRU */
    KVF_BLOCK_TO_LRU    = 8,   /* bit, inside kvf_block_manager_free only */
};

struct kvf_block_manager {
    int               num_blocks;
    int               block_size;
    int               num_groups;
    int               slots;
    kvf_group_kind_t  kinds[KVF_MAX_KV_GROUPS];
    int32_t          *free_stack;   /* [num_blocks]; top = free_stack[num_free - 1] */
    int               num_free;
    uint8_t          *state;        /* [num_blocks] */
    int32_t          *fresh;        /* [num_blocks] */
    int               num_fresh;
    /* prefix cache (kvf_block_manager_set_cached): references per block and the free
     * cached blocks, least recently freed first, as a doubly linked list */
    int32_t          *ref;          /* [num_blocks] holders (requests) of each block */
    int32_t          *lru_prev, *lru_next;   /* [num_blocks]; -1 ends */
    int32_t           lru_head, lru_tail;
    int               num_lru;
    kvf_block_evict_fn_t evict;
    void             *evict_ctx;
    int32_t           hole;         /* the zero block standing for blocks given back before a
                                     * sliding window (kvf_block_manager_release_before); -1:
                                     * none. Held by the manager while a request names it */
    int               hole_users;   /* requests whose table names it */
};

#define KVF_BLOCK_MANAGER_REQUIRED (KVF_BLOCK_MANAGER_PARAM_FIELD_NUM_BLOCKS |     \
                                    KVF_BLOCK_MANAGER_PARAM_FIELD_BLOCK_SIZE |     \
                                    KVF_BLOCK_MANAGER_PARAM_FIELD_LAYOUT)

kvf_status_t kvf_block_manager_create(const kvf_block_manager_params_t *params,
                                      kvf_block_manager_h *bm_p)
{
    struct kvf_block_manager *bm;

    if ((params == NULL) || (bm_p == NULL)) {
        return KVF_ERR_INVALID_PARAM;
    }
    if (params->field_mask & ~(uint64_t)KVF_BLOCK_MANAGER_PARAM_FIELDS_KNOWN) {
        kvf_error("unknown block manager params bits 0x%" PRIx64,
                  params->field_mask & ~(uint64_t)KVF_BLOCK_MANAGER_PARAM_FIELDS_KNOWN);
        return KVF_ERR_INVALID_PARAM;
    }
    if (((params->field_mask & KVF_BLOCK_MANAGER_REQUIRED) != KVF_BLOCK_MANAGER_REQUIRED) ||
        (params->layout == NULL)) {
        kvf_error("block manager params need num_blocks, block_size and layout");
        return KVF_ERR_INVALID_PARAM;
    }
    if ((params->num_blocks <= 0) || (params->block_size <= 0) ||
        (params->layout->num_groups <= 0) || (params->layout->num_groups > KVF_MAX_KV_GROUPS)) {
        kvf_error("block manager: num_blocks %d block_size %d groups %d out of range",
                  params->num_blocks, params->block_size, params->layout->num_groups);
        return KVF_ERR_INVALID_PARAM;
    }

    bm = calloc(1, sizeof(*bm));
    if (bm == NULL) {
        goto err_nomem;
    }
    bm->free_stack = malloc((size_t)params->num_blocks * sizeof(*bm->free_stack));
    if (bm->free_stack == NULL) {
        goto err_free_bm;
    }
    bm->state = calloc((size_t)params->num_blocks, sizeof(*bm->state));
    if (bm->state == NULL) {
        goto err_free_stack;
    }
    bm->fresh = malloc((size_t)params->num_blocks * sizeof(*bm->fresh));
    if (bm->fresh == NULL) {
        goto err_free_state;
    }
    bm->ref = calloc((size_t)params->num_blocks, sizeof(*bm->ref));
    bm->lru_prev = malloc((size_t)params->num_blocks * sizeof(*bm->lru_prev));
    bm->lru_next = malloc((size_t)params->num_blocks * sizeof(*bm->lru_next));
    if ((bm->ref == NULL) || (bm->lru_prev == NULL) || (bm->lru_next == NULL)) {
        free(bm->ref);
        free(bm->lru_prev);
        free(bm->lru_next);
        free(bm->fresh);
        goto err_free_state;
    }
    bm->lru_head = bm->lru_tail = -1;
    bm->hole = -1;
    bm->num_blocks = params->num_blocks;
    bm->block_size = params->block_size;
    bm->num_groups = params->layout->num_groups;
    bm->slots = params->layout->slots;
    for (int g = 0; g < bm->num_groups; ++g) {
        bm->kinds[g] = params->layout->groups[g].kind;
    }
    /* highest id at the bottom, so a new manager hands out 0, 1, 2, ... */
    for (int i = 0; i < bm->num_blocks; ++i) {
        bm->free_stack[i] = bm->num_blocks - 1 - i;
    }
    bm->num_free = bm->num_blocks;
    *bm_p = bm;
    return KVF_OK;

err_free_state:
    free(bm->state);
err_free_stack:
    free(bm->free_stack);
err_free_bm:
    free(bm);
err_nomem:
    kvf_error("failed to allocate block manager of %d blocks", params->num_blocks);
    return KVF_ERR_NO_MEMORY;
}

void kvf_block_manager_destroy(kvf_block_manager_h bm)
{
    if (bm == NULL) {
        return;
    }
    if (bm->num_free + bm->num_lru != bm->num_blocks) {
        kvf_warn("block manager destroyed with %d of %d blocks still allocated",
                 bm->num_blocks - bm->num_free - bm->num_lru, bm->num_blocks);
    }
    free(bm->ref);
    free(bm->lru_prev);
    free(bm->lru_next);
    free(bm->fresh);
    free(bm->state);
    free(bm->free_stack);
    free(bm);
}

int kvf_block_manager_num_free(kvf_block_manager_h bm)
{
    return bm->num_free + bm->num_lru;
}

int kvf_block_manager_num_free_pages(kvf_block_manager_h bm)
{
    return (bm->num_free + bm->num_lru) * bm->slots;
}

int kvf_block_manager_num_cached_free(kvf_block_manager_h bm)
{
    return bm->num_lru;
}

static void kvf_lru_unlink(struct kvf_block_manager *bm, int32_t b)
{
    int32_t p = bm->lru_prev[b], n = bm->lru_next[b];

    if (p >= 0) {
        bm->lru_next[p] = n;
    } else {
        bm->lru_head = n;
    }
    if (n >= 0) {
        bm->lru_prev[n] = p;
    } else {
        bm->lru_tail = p;
    }
    --bm->num_lru;
}

static void kvf_lru_append(struct kvf_block_manager *bm, int32_t b)
{
    bm->lru_prev[b] = bm->lru_tail;
    bm->lru_next[b] = -1;
    if (bm->lru_tail >= 0) {
        bm->lru_next[bm->lru_tail] = b;
    } else {
        bm->lru_head = b;
    }
    bm->lru_tail = b;
    ++bm->num_lru;
}

int kvf_block_manager_num_blocks(kvf_block_manager_h bm)
{
    return bm->num_blocks;
}

int kvf_block_manager_block_size(kvf_block_manager_h bm)
{
    return bm->block_size;
}

static int kvf_bm_attn_blocks(const struct kvf_block_manager *bm, int num_tokens)
{
    return (int)(((long)num_tokens + bm->block_size - 1) / bm->block_size);
}

/* Per-group new block counts for covering num_tokens; -1 for a foreign/bad req. */
static int kvf_bm_plan(const struct kvf_block_manager *bm, const kvf_req_blocks_t *req,
                       int num_tokens, int add[KVF_MAX_KV_GROUPS])
{
    bool first = (req->num_groups <= 0);   /* -1: shared prefix blocks only (share()) */
    int need = kvf_bm_attn_blocks(bm, num_tokens);
    int total = 0;

    if ((num_tokens < 0) || (!first && (req->num_groups != bm->num_groups))) {
        return -1;
    }
    for (int g = 0; g < bm->num_groups; ++g) {
        int held = req->num_blocks[g];
        if (bm->kinds[g] == KVF_GROUP_MAMBA) {
            add[g] = first ? 1 : 0;
        } else {
            add[g] = (need > held) ? (need - held) : 0;
        }
        total += add[g];
    }
    return total;
}

int kvf_block_manager_blocks_needed(kvf_block_manager_h bm, const kvf_req_blocks_t *req,
                                    int num_tokens)
{
    int add[KVF_MAX_KV_GROUPS];
    int total = kvf_bm_plan(bm, req, num_tokens, add);
    return (total < 0) ? 0 : total;
}

bool kvf_block_manager_can_allocate(kvf_block_manager_h bm, const kvf_req_blocks_t *req,
                                    int num_tokens)
{
    int add[KVF_MAX_KV_GROUPS];
    int total = kvf_bm_plan(bm, req, num_tokens, add);
    return (total >= 0) && (total <= bm->num_free + bm->num_lru);
}

/* A free block: the free stack first; when it is empty, the least recently freed cached
 * block, whose cache entry is dropped first (the eviction callback). Callers checked that
 * num_free + num_lru covers what they take. */
static int32_t kvf_bm_pop(struct kvf_block_manager *bm, kvf_group_kind_t kind)
{
    int32_t b;

    if (bm->num_free == 0) {
        b = bm->lru_head;
        kvf_lru_unlink(bm, b);
        bm->state[b] = KVF_BLOCK_ALLOCATED;   /* not cached: set_cached(false) is a no-op */
        if (bm->evict != NULL) {
            bm->evict(bm->evict_ctx, b);
        }
    } else {
        b = bm->free_stack[--bm->num_free];
    }
    bm->ref[b] = 1;
    bm->state[b] = KVF_BLOCK_ALLOCATED;
    if (kvf_group_is_attention(kind)) {
        bm->state[b] |= KVF_BLOCK_FRESH;
        bm->fresh[bm->num_fresh++] = b;
    }
    return b;
}

/* Push one block back; false for a bad id or a double free (logged). */
static bool kvf_bm_push(struct kvf_block_manager *bm, int32_t b)
{
    if ((b == bm->hole) && (b >= 0)) {
        return true;   /* the manager's zero block: an entry given back, nothing to free */
    }
    if ((b < 0) || (b >= bm->num_blocks)) {
        kvf_error("block manager: free of block %" PRId32 " outside [0, %d)", b, bm->num_blocks);
        return false;
    }
    if (!(bm->state[b] & KVF_BLOCK_ALLOCATED)) {
        kvf_error("block manager: double free of block %" PRId32, b);
        return false;
    }
    if (--bm->ref[b] > 0) {
        return true;   /* a shared cached block another request still holds */
    }
    if (bm->state[b] & KVF_BLOCK_FRESH) {
        for (int i = 0; i < bm->num_fresh; ++i) {
            if (bm->fresh[i] == b) {
                bm->fresh[i] = bm->fresh[--bm->num_fresh];
                break;
            }
        }
    }
    if (bm->state[b] & KVF_BLOCK_CACHED) {
        bm->state[b] = KVF_BLOCK_CACHED;   /* free cached: waits in the LRU, most recent last */
        kvf_lru_append(bm, b);
        return true;
    }
    bm->state[b] = KVF_BLOCK_FREE;
    bm->free_stack[bm->num_free++] = b;
    return true;
}

/* @a req's table no longer names the zero block (it is freed): the last such request frees
 * it, so an idle manager holds no block. */
static void kvf_bm_hole_put(struct kvf_block_manager *bm, const kvf_req_blocks_t *req)
{
    bool named = false;

    for (int g = 0; g < KVF_MAX_KV_GROUPS; ++g) {
        named = named || (req->released[g] > 0);
    }
    if (named && (bm->hole >= 0) && (--bm->hole_users == 0)) {
        int32_t b = bm->hole;
        bm->hole = -1;
        (void)kvf_bm_push(bm, b);
    }
}

/* A valid allocated cached block of which the caller holds the last reference. */
static bool kvf_bm_last_cached_ref(const struct kvf_block_manager *bm, int32_t b)
{
    return (b >= 0) && (b < bm->num_blocks) && (bm->state[b] & KVF_BLOCK_ALLOCATED) &&
           (bm->state[b] & KVF_BLOCK_CACHED) && (bm->ref[b] == 1);
}

static void kvf_bm_req_release_tables(kvf_req_blocks_t *req)
{
    for (int g = 0; g < KVF_MAX_KV_GROUPS; ++g) {
        free(req->blocks[g]);
    }
    memset(req, 0, sizeof(*req));
}

kvf_status_t kvf_block_manager_allocate(kvf_block_manager_h bm, kvf_req_blocks_t *req,
                                        int num_tokens)
{
    int add[KVF_MAX_KV_GROUPS];
    bool first;
    int total;

    if ((bm == NULL) || (req == NULL)) {
        return KVF_ERR_INVALID_PARAM;
    }
    total = kvf_bm_plan(bm, req, num_tokens, add);
    if (total < 0) {
        kvf_error("block manager: bad allocation request (%d tokens, %d groups, expected %d)",
                  num_tokens, req->num_groups, bm->num_groups);
        return KVF_ERR_INVALID_PARAM;
    }
    if (total > bm->num_free + bm->num_lru) {
        kvf_log(KVF_LOG_DEBUG, KVF_SUB_POOL, "block manager: need %d blocks, %d free", total,
                bm->num_free + bm->num_lru);
        return KVF_ERR_NO_RESOURCE;
    }
    first = (req->num_groups == 0);

    /* reserve table memory first, so popping blocks cannot fail half way */
    for (int g = 0; g < bm->num_groups; ++g) {
        int want = req->num_blocks[g] + add[g];
        if (KVF_ARRAY_GROW(req->blocks[g], req->capacity[g], want, 4) != KVF_OK) {
            kvf_error("block manager: failed to grow a block table to %d entries", want);
            if (first) {
                kvf_bm_req_release_tables(req);   /* nothing was taken yet */
            }
            return KVF_ERR_NO_MEMORY;
        }
    }
    for (int g = 0; g < bm->num_groups; ++g) {
        for (int i = 0; i < add[g]; ++i) {
            req->blocks[g][req->num_blocks[g]++] = kvf_bm_pop(bm, bm->kinds[g]);
        }
    }
    req->num_groups = bm->num_groups;
    if (num_tokens > req->num_tokens) {
        req->num_tokens = num_tokens;
    }
    return KVF_OK;
}

kvf_status_t kvf_block_manager_append_token(kvf_block_manager_h bm, kvf_req_blocks_t *req)
{
    if (req == NULL) {
        return KVF_ERR_INVALID_PARAM;
    }
    return kvf_block_manager_allocate(bm, req, req->num_tokens + 1);
}

kvf_status_t kvf_block_manager_free(kvf_block_manager_h bm, kvf_req_blocks_t *req)
{
    kvf_status_t status = KVF_OK;

    if ((bm == NULL) || (req == NULL)) {
        return KVF_ERR_INVALID_PARAM;
    }
    if (req->num_groups == 0) {
        kvf_bm_req_release_tables(req);   /* idempotent; also drops spare capacity */
        return KVF_OK;
    }
    if (req->num_groups < 0) {
        req->num_groups = bm->num_groups;   /* shared prefix blocks only */
    }
    /* groups in order: attention first, Mamba last, so Mamba pages are reused first; a
     * cached block whose last holder this is joins the LRU from the request's tail back,
     * so a prefix's later blocks are evicted before its first (a hit needs them all) */
    for (int g = 0; g < req->num_groups; ++g) {
        for (int i = 0; i < req->num_blocks[g]; ++i) {
            if (kvf_bm_last_cached_ref(bm, req->blocks[g][i])) {
                bm->state[req->blocks[g][i]] |= KVF_BLOCK_TO_LRU;   /* second pass */
                continue;
            }
            if (!kvf_bm_push(bm, req->blocks[g][i])) {
                status = KVF_ERR_INVALID_PARAM;
            }
        }
        for (int i = req->num_blocks[g] - 1; i >= 0; --i) {
            int32_t b = req->blocks[g][i];
            if ((b >= 0) && (b < bm->num_blocks) && (bm->state[b] & KVF_BLOCK_TO_LRU)) {
                bm->state[b] &= (uint8_t)~KVF_BLOCK_TO_LRU;
                (void)kvf_bm_push(bm, b);
            }
        }
    }
    kvf_bm_hole_put(bm, req);
    kvf_bm_req_release_tables(req);
    return status;
}

kvf_status_t kvf_block_manager_alloc_blocks(kvf_block_manager_h bm, kvf_group_kind_t kind,
                                            int n, int32_t *ids)
{
    if ((bm == NULL) || (n < 0) || ((n > 0) && (ids == NULL)) ||
        (!kvf_group_is_attention(kind) && (kind != KVF_GROUP_MAMBA))) {
        return KVF_ERR_INVALID_PARAM;
    }
    if (n > bm->num_free + bm->num_lru) {
        return KVF_ERR_NO_RESOURCE;
    }
    for (int i = 0; i < n; ++i) {
        ids[i] = kvf_bm_pop(bm, kind);
    }
    return KVF_OK;
}

kvf_status_t kvf_block_manager_free_blocks(kvf_block_manager_h bm, const int32_t *ids, int n)
{
    kvf_status_t status = KVF_OK;

    if ((bm == NULL) || (n < 0) || ((n > 0) && (ids == NULL))) {
        return KVF_ERR_INVALID_PARAM;
    }
    for (int i = 0; i < n; ++i) {
        if (!kvf_bm_push(bm, ids[i])) {
            status = KVF_ERR_INVALID_PARAM;
        }
    }
    return status;
}

int kvf_block_manager_num_fresh(kvf_block_manager_h bm)
{
    return bm->num_fresh;
}

int kvf_block_manager_take_fresh(kvf_block_manager_h bm, int32_t *ids, int cap)
{
    int n;

    if ((ids == NULL) || (cap <= 0)) {
        return 0;
    }
    n = (bm->num_fresh < cap) ? bm->num_fresh : cap;
    for (int i = 0; i < n; ++i) {
        ids[i] = bm->fresh[i];
        bm->state[ids[i]] &= (uint8_t)~KVF_BLOCK_FRESH;
    }
    memmove(bm->fresh, bm->fresh + n, (size_t)(bm->num_fresh - n) * sizeof(*bm->fresh));
    bm->num_fresh -= n;
    return n;
}

kvf_status_t kvf_block_manager_zero_fresh(kvf_block_manager_h bm, kvf_page_pool_h *pools,
                                          int n_pools)
{
    kvf_status_t status = KVF_OK;

    if ((bm == NULL) || (n_pools < 0) || ((n_pools > 0) && (pools == NULL))) {
        return KVF_ERR_INVALID_PARAM;
    }
    for (int p = 0; p < n_pools; ++p) {
        kvf_status_t s = kvf_page_pool_zero_blocks(pools[p], bm->fresh, bm->num_fresh);
        if ((s != KVF_OK) && (status == KVF_OK)) {
            status = s;
        }
    }
    for (int i = 0; i < bm->num_fresh; ++i) {
        bm->state[bm->fresh[i]] &= (uint8_t)~KVF_BLOCK_FRESH;
    }
    bm->num_fresh = 0;
    return status;
}

void kvf_block_manager_set_evict(kvf_block_manager_h bm, kvf_block_evict_fn_t fn, void *ctx)
{
    bm->evict = fn;
    bm->evict_ctx = ctx;
}

kvf_status_t kvf_block_manager_set_cached(kvf_block_manager_h bm, int32_t b, bool cached)
{
    if ((bm == NULL) || (b < 0) || (b >= bm->num_blocks) ||
        (bm->state[b] == KVF_BLOCK_FREE)) {
        return KVF_ERR_INVALID_PARAM;
    }
    if (cached) {
        bm->state[b] |= KVF_BLOCK_CACHED;
    } else if (!(bm->state[b] & KVF_BLOCK_ALLOCATED)) {   /* free cached: now plain free */
        kvf_lru_unlink(bm, b);
        bm->state[b] = KVF_BLOCK_FREE;
        bm->free_stack[bm->num_free++] = b;
    } else {
        bm->state[b] &= (uint8_t)~KVF_BLOCK_CACHED;
    }
    return KVF_OK;
}

kvf_status_t kvf_block_manager_share(kvf_block_manager_h bm, kvf_req_blocks_t *req,
                                     const int32_t *ids, int n)
{
    int n_attn = 0, n_fresh = 0, n_lru = 0;
    bool sliding[KVF_MAX_KV_GROUPS];

    if ((bm == NULL) || (req == NULL) || (n < 0) || ((n > 0) && (ids == NULL)) ||
        (req->num_groups != 0)) {
        return KVF_ERR_INVALID_PARAM;
    }
    for (int g = 0; g < bm->num_groups; ++g) {
        if (kvf_group_is_attention(bm->kinds[g])) {
            sliding[n_attn++] = (bm->kinds[g] == KVF_GROUP_SLIDING);
        }
    }
    for (int i = 0; i < n * n_attn; ++i) {
        if ((ids[i] == -1) && sliding[i % n_attn]) {
            ++n_fresh;   /* a sliding block before the hit's window: a fresh one */
            continue;
        }
        if ((ids[i] < 0) || (ids[i] >= bm->num_blocks) || !(bm->state[ids[i]] & KVF_BLOCK_CACHED)) {
            kvf_error("block manager: share of block %" PRId32 ", not a cached block", ids[i]);
            return KVF_ERR_INVALID_PARAM;
        }
        n_lru += !(bm->state[ids[i]] & KVF_BLOCK_ALLOCATED);   /* leaves the LRU below */
    }
    if (n_fresh > bm->num_free + bm->num_lru - n_lru) {
        return KVF_ERR_NO_RESOURCE;
    }
    for (int g = 0; g < bm->num_groups; ++g) {
        if (kvf_group_is_attention(bm->kinds[g]) &&
            (KVF_ARRAY_GROW(req->blocks[g], req->capacity[g], n, 4) != KVF_OK)) {
            kvf_bm_req_release_tables(req);
            return KVF_ERR_NO_MEMORY;
        }
    }
    for (int g = 0, a = 0; g < bm->num_groups; ++g) {
        if (!kvf_group_is_attention(bm->kinds[g])) {
            continue;
        }
        for (int j = 0; j < n; ++j) {
            int32_t b = ids[(size_t)j * (size_t)n_attn + (size_t)a];
            if (b == -1) {   /* checked above: a sliding group's; filled below */
                req->blocks[g][req->num_blocks[g]++] = -1;
                continue;
            }
            if (!(bm->state[b] & KVF_BLOCK_ALLOCATED)) {   /* free cached: leaves the LRU */
                kvf_lru_unlink(bm, b);
                bm->state[b] = KVF_BLOCK_ALLOCATED | KVF_BLOCK_CACHED;
                bm->ref[b] = 0;
            }
            ++bm->ref[b];
            req->blocks[g][req->num_blocks[g]++] = b;
        }
        ++a;
    }
    /* after every cached block left the LRU, so a pop's eviction cannot take one of them */
    for (int g = 0; (n_fresh > 0) && (g < bm->num_groups); ++g) {
        for (int j = 0; kvf_group_is_attention(bm->kinds[g]) && (j < n); ++j) {
            if (req->blocks[g][j] == -1) {
                req->blocks[g][j] = kvf_bm_pop(bm, bm->kinds[g]);   /* zeroed as fresh */
            }
        }
    }
    req->num_tokens = n * bm->block_size;
    /* the Mamba groups' blocks come with the first kvf_block_manager_allocate() */
    req->num_groups = (n > 0) ? -1 : 0;
    return KVF_OK;
}

kvf_status_t kvf_block_manager_release_before(kvf_block_manager_h bm, kvf_req_blocks_t *req,
                                              int g, int first, int *freed_p)
{
    int freed = 0;

    if ((bm == NULL) || (req == NULL) || (freed_p == NULL) || (g < 0) ||
        (g >= req->num_groups) || !kvf_group_is_attention(bm->kinds[g]) || (first < 0)) {
        return KVF_ERR_INVALID_PARAM;
    }
    *freed_p = 0;
    first = (first < req->num_blocks[g]) ? first : req->num_blocks[g];
    if (first <= req->released[g]) {
        return KVF_OK;
    }
    if (bm->hole < 0) {
        if (bm->num_free + bm->num_lru == 0) {
            return KVF_OK;   /* no block for the zero block yet: the next call frees them */
        }
        bm->hole = kvf_bm_pop(bm, KVF_GROUP_ATTENTION);
    }
    bool named = false;
    for (int k = 0; k < KVF_MAX_KV_GROUPS; ++k) {
        named = named || (req->released[k] > 0);
    }
    bm->hole_users += !named;   /* its table names the zero block from now on */
    for (int i = req->released[g]; i < first; ++i) {
        int32_t b = req->blocks[g][i];
        if (b == bm->hole) {
            continue;
        }
        if (!kvf_bm_push(bm, b)) {   /* a cached block another holder keeps stays cached */
            return KVF_ERR_INVALID_PARAM;
        }
        req->blocks[g][i] = bm->hole;
        req->released[g] = i + 1;
        ++freed;
    }
    req->released[g] = (first > req->released[g]) ? first : req->released[g];
    *freed_p = freed;
    return KVF_OK;
}

int32_t kvf_block_manager_zero_block(kvf_block_manager_h bm)
{
    return bm->hole;
}

int kvf_block_manager_held(kvf_block_manager_h bm, const kvf_req_blocks_t *req, int g)
{
    int n = 0;

    for (int i = 0; (g >= 0) && (g < req->num_groups) && (i < req->num_blocks[g]); ++i) {
        n += (req->blocks[g][i] != bm->hole) || (bm->hole < 0);
    }
    return n;
}
