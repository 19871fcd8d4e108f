/*
 * FlashInfer decode on kvferry's pages: the refusals, the page geometry, a request's page
 * indices and the fixed split-KV work plan (kvf_fi_plan.h says why each is so).
 */
#include "kvf_fi_plan.h"

#include <limits.h>

int kvf_fi_built(kvf_dtype_t dtype, int head_dim)
{
#ifdef KVF_HAVE_FLASHINFER
    return (dtype == KVF_DTYPE_BF16) && ((head_dim == 32) || (head_dim == 64) ||
                                         (head_dim == 128) || (head_dim == 256));
#else
    (void)dtype;
    (void)head_dim;
    return 0;
#endif
}

int kvf_fi_decode_group(int group)
{
    return (group == 1) || (group == 2) || (group == 3) || (group == 4) || (group == 6) ||
           (group == 8) || (group == 16);
}

static uint64_t kvf_gcd(uint64_t a, uint64_t b)
{
    while (b != 0) {
        uint64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

const char *kvf_fi_geometry_kv(kvf_dtype_t dtype, int head_dim, int q_heads, int kv_heads,
                               int kbs, const kvf_kv_strides_t *st, size_t pool_bytes,
                               int built, kvf_fi_geom_t *g)
{
    int group;
    uint64_t elt, kbb, unit, sp, sh;

    if ((head_dim <= 0) || (kv_heads <= 0) || (q_heads <= 0) || (kbs <= 0) ||
        (q_heads % kv_heads != 0) || (st == NULL)) {
        return "bad geometry (head_dim, heads or kernel block size)";
    }
    if ((dtype != KVF_DTYPE_BF16) && (dtype != KVF_DTYPE_FP16)) {
        return "KV cache dtype: FlashInfer takes bf16 or fp16 caches, not fp32 or fp8";
    }
    if (!built) {
        return "dtype and head_dim: no FlashInfer decode instantiated for them in this build";
    }
    group = q_heads / kv_heads;
    elt = kvf_dtype_size(dtype);
    kbb = 2u * (uint64_t)kv_heads * (uint64_t)kbs * (uint64_t)head_dim * elt;
    if ((st->slot == 0) || (st->kblock == 0) || (st->block < kbb) ||
        (pool_bytes < st->block)) {
        return "page size below one kernel block, or pool below one page";
    }
    /* every (block, slot, kernel block) start is a multiple of unit */
    unit = kvf_gcd(kvf_gcd((uint64_t)st->block, (uint64_t)st->slot), (uint64_t)st->kblock);
    if (unit % 16u != 0) {
        /* FlashInfer loads K and V rows as 16-byte vectors from base + index * unit (and a
         * layer's base moved by whole slots): every page start must keep that alignment */
        return "page size: not a multiple of 16 bytes (FlashInfer reads 16-byte vectors)";
    }
    sp = unit / elt;
    sh = (uint64_t)st->head / elt;
    if ((unit % elt != 0) || (sp > UINT32_MAX) || (sh * (uint64_t)kv_heads > UINT32_MAX) ||
        ((uint64_t)kbs * (uint64_t)head_dim > UINT32_MAX)) {
        return "strides: a page or head stride past 32 bits";
    }
    if (pool_bytes / unit > (uint64_t)INT32_MAX) {
        return "pool size: page indices (pool bytes / gcd(block, slot and kernel block bytes))"
               " past INT32_MAX";
    }
    g->stride_page = (uint32_t)sp;
    g->stride_h = (uint32_t)sh;
    g->stride_n = (uint32_t)head_dim;
    g->v_offset = (uint64_t)st->kv / elt;
    g->unit = unit;
    g->block_bytes = st->block;
    g->slot_bytes = st->slot;
    g->kblock_bytes = st->kblock;
    /* the slots of a block: a head's run of them at head-major (head >= slot), the block's
     * pages at layer-major */
    g->slots = (int)((st->head >= st->slot) ? st->head / st->slot : st->block / st->slot);
    g->page_tokens = kbs;
    g->chunk_pages = (KVF_FI_SPLIT_TOKENS / kbs > 0) ? KVF_FI_SPLIT_TOKENS / kbs : 1;
    g->decode_on_prefill = !kvf_fi_decode_group(group);
    return NULL;
}

const char *kvf_fi_geometry(kvf_dtype_t dtype, int head_dim, int q_heads, int kv_heads, int kbs,
                            size_t page_size, size_t pool_bytes, int built, kvf_fi_geom_t *g)
{
    /* layer-major: one slot per page (block = the page; the slot count moves no index) */
    kvf_kv_strides_t st = kvf_kv_strides_make((int)KVF_KV_LAYER_MAJOR, 1, page_size, 1,
                                              kv_heads, kbs, head_dim,
                                              kvf_dtype_size(dtype));
    if ((head_dim > 0) && (kv_heads > 0) && (kbs > 0) &&
        (page_size < 2u * (uint64_t)kv_heads * (uint64_t)kbs * (uint64_t)head_dim *
                     kvf_dtype_size(dtype))) {
        return "page size below one kernel block, or pool below one page";
    }
    return kvf_fi_geometry_kv(dtype, head_dim, q_heads, kv_heads, kbs, &st, pool_bytes, built,
                              g);
}

int kvf_fi_pages_kv(const kvf_fi_geom_t *g, const int32_t *block_table, int block_size,
                    int slot, int tokens, int32_t *pages, int cap)
{
    const int kbs = g->page_tokens;
    int n;

    if ((block_table == NULL) || (pages == NULL) || (tokens < 0) || (block_size < kbs) ||
        (block_size % kbs != 0) || (slot < 0) || (slot >= g->slots)) {
        return -1;
    }
    n = (tokens + kbs - 1) / kbs;
    if (n > cap) {
        return -1;
    }
    for (int i = 0; i < n; ++i) {
        int pos = i * kbs;
        int32_t b = block_table[pos / block_size];
        uint64_t off = (uint64_t)b * g->block_bytes + (uint64_t)slot * g->slot_bytes +
                       (uint64_t)((pos % block_size) / kbs) * g->kblock_bytes;
        if ((b < 0) || (off / g->unit > (uint64_t)INT32_MAX)) {
            return -1;
        }
        pages[i] = (int32_t)(off / g->unit);
    }
    return n;
}

int kvf_fi_pages(const kvf_fi_geom_t *g, const int32_t *block_table, int block_size, int slots,
                 int slot, size_t page_size, int tokens, int32_t *pages, int cap)
{
    kvf_fi_geom_t lm = *g;   /* layer-major pages: a block is `slots` pages */

    if ((slots < 1) || (slot >= slots)) {
        return -1;
    }
    lm.block_bytes = (uint64_t)slots * (uint64_t)page_size;
    lm.slot_bytes = page_size;
    lm.slots = slots;
    return kvf_fi_pages_kv(&lm, block_table, block_size, slot, tokens, pages, cap);
}

int kvf_fi_decode_plan(const kvf_fi_geom_t *g, const int32_t *kv_len, int batch,
                       int32_t *request_indices, int32_t *kv_tile_indices, int32_t *o_indptr,
                       int cap)
{
    int n = 0;

    if ((kv_len == NULL) || (batch < 0) || (o_indptr == NULL) || (g->chunk_pages < 1)) {
        return -1;
    }
    o_indptr[0] = 0;
    for (int r = 0; r < batch; ++r) {
        int pages, chunks;
        if (kv_len[r] < 1) {
            return -1;
        }
        pages = (kv_len[r] + g->page_tokens - 1) / g->page_tokens;
        chunks = (pages + g->chunk_pages - 1) / g->chunk_pages;
        for (int c = 0; c < chunks; ++c, ++n) {
            if (n >= cap) {
                return -1;
            }
            request_indices[n] = r;
            kv_tile_indices[n] = c;
        }
        o_indptr[r + 1] = n;
    }
    return n;
}

int kvf_fi_prefill_plan(const int32_t *qo_len, int batch, int group, int32_t *request_indices,
                        int32_t *qo_tile_indices, int32_t *kv_tile_indices, int32_t *q_indptr,
                        int cap)
{
    int n = 0;

    if ((qo_len == NULL) || (batch < 0) || (group < 1) || (q_indptr == NULL)) {
        return -1;
    }
    q_indptr[0] = 0;
    for (int r = 0; r < batch; ++r) {
        long long rows;
        if (qo_len[r] < 1) {
            return -1;
        }
        rows = (long long)qo_len[r] * group;
        for (long long t = 0; t * KVF_FI_PREFILL_TILE_Q < rows; ++t, ++n) {
            if (n >= cap) {
                return -1;
            }
            request_indices[n] = r;
            qo_tile_indices[n] = (int32_t)t;
            kv_tile_indices[n] = 0;
        }
        q_indptr[r + 1] = q_indptr[r] + qo_len[r];
    }
    return n;
}
