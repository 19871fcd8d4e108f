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

const char *kvf_fi_geometry(kvf_dtype_t dtype, int head_dim, int q_heads, int kv_heads, int kbs,
                            size_t page_size, size_t pool_bytes, int built, kvf_fi_geom_t *g)
{
    int group;
    uint64_t elt, kbb, unit, sp;

    if ((head_dim <= 0) || (kv_heads <= 0) || (q_heads <= 0) || (kbs <= 0) ||
        (q_heads % kv_heads != 0)) {
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
    if ((page_size < kbb) || (pool_bytes < page_size)) {
        return "page size below one kernel block, or pool below one page";
    }
    unit = kvf_gcd((uint64_t)page_size, kbb);
    if (unit % 16u != 0) {
        /* FlashInfer loads K and V rows as 16-byte vectors from base + index * unit (and a
         * layer's base moved by whole pages): every page start must keep that alignment */
        return "page size: not a multiple of 16 bytes (FlashInfer reads 16-byte vectors)";
    }
    sp = unit / elt;
    if ((unit % elt != 0) || (sp > UINT32_MAX) ||
        ((uint64_t)kbs * (uint64_t)head_dim > UINT32_MAX)) {
        return "strides: a page stride past 32 bits";
    }
    if (pool_bytes / unit > (uint64_t)INT32_MAX) {
        return "pool size: page indices (pool bytes / gcd(page size, kernel block bytes)) past "
               "INT32_MAX";
    }
    g->stride_page = (uint32_t)sp;
    g->stride_h = (uint32_t)((uint64_t)kbs * (uint64_t)head_dim);
    g->stride_n = (uint32_t)head_dim;
    g->v_offset = (uint64_t)kv_heads * (uint64_t)kbs * (uint64_t)head_dim;
    g->unit = unit;
    g->page_tokens = kbs;
    g->chunk_pages = (KVF_FI_SPLIT_TOKENS / kbs > 0) ? KVF_FI_SPLIT_TOKENS / kbs : 1;
    g->decode_on_prefill = !kvf_fi_decode_group(group);
    return NULL;
}

int kvf_fi_pages(const kvf_fi_geom_t *g, const int32_t *block_table, int block_size, int slots,
                 int slot, size_t page_size, int tokens, int32_t *pages, int cap)
{
    const int kbs = g->page_tokens;
    const uint64_t kbb = (uint64_t)g->v_offset * 2u * (g->unit / g->stride_page);
    int n;

    if ((block_table == NULL) || (pages == NULL) || (tokens < 0) || (block_size < kbs) ||
        (block_size % kbs != 0) || (slots < 1) || (slot < 0) || (slot >= slots)) {
        return -1;
    }
    n = (tokens + kbs - 1) / kbs;
    if (n > cap) {
        return -1;
    }
    for (int i = 0; i < n; ++i) {
        int pos = i * kbs;
        uint64_t page = (uint64_t)block_table[pos / block_size] * (uint64_t)slots + (uint64_t)slot;
        uint64_t off = page * (uint64_t)page_size + (uint64_t)((pos % block_size) / kbs) * kbb;
        if ((block_table[pos / block_size] < 0) || (off / g->unit > (uint64_t)INT32_MAX)) {
            return -1;
        }
        pages[i] = (int32_t)(off / g->unit);
    }
    return n;
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
