/*
 * FlashInfer's paged decode attention on kvferry's own KV pages: which caches it can take,
 * how kvferry's kernel blocks map to its pages, and a batch-invariant work plan. Plain C,
 * unit-tested on the CPU (tests/kernels/test_kern_fi_plan.c); the CUDA launcher
 * (kvf_fi_decode_cuda.cu, built with -DKVF_FLASHINFER=ON) only carries it out.
 *
 * Pages. FlashInfer reads a page p of one KV head h at k_data + p * stride_page + h *
 * stride_h + row * stride_n (HND). One FlashInfer page is one kvferry kernel block
 * ([K|V][kv_heads][kbs][head_dim], docs/ARCHITECTURE.md): k_data is the pool's base, v_data
 * base + kv_heads * kbs * head_dim elements, stride_h = kbs * head_dim, stride_n = head_dim.
 * A kernel block's byte offset, (block * slots + slot) * page_size + kb * kernel_block_bytes,
 * is a multiple of u = gcd(page_size, kernel_block_bytes), so stride_page = u / elt and the
 * page index is offset / u (refused by name if an index could pass INT32_MAX).
 *
 * Batch invariance. FlashInfer's own planner sizes split-KV from the batch (its work
 * estimate), so a request's sums would change with the batch around it. kvferry fills the
 * plan arrays itself instead (the layout of DecodeSplitKVIndptr): every request is cut into
 * chunks of a FIXED number of pages, KVF_FI_SPLIT_TOKENS / kbs (at least 1), always in the
 * partitioned mode (partial states merged in chunk order), whatever the batch.
 *
 * GQA groups. FlashInfer's decode dispatches groups 1, 2, 3, 4, 6, 8 and 16 only; for any
 * other (Nemotron-Nano-9B-v2's 40 / 8 = 5, 7, 10...) decode_on_prefill is set and output
 * tokens take its prefill kernel as requests of one query token each (its prefill packs
 * (token, head) rows through a runtime group divisor, so any group works; what vLLM's
 * tensor-core decode does), with the prefill's fixed plan (kvf_fi_prefill_plan: one query
 * tile per token, no split-KV): batch invariant like the decode's.
 *
 * Refused (by name at start): fp32 KV caches (FlashInfer takes 16-bit ones), a dtype or
 * head_dim not instantiated (kvf_fi_built()), strides past uint32, a page size that is not
 * a multiple of 16 bytes (its 16-byte vector loads; kvferry's pages are whole tokens of K
 * and V, so it holds).
 */
#ifndef KVF_FI_PLAN_H
#define KVF_FI_PLAN_H

#include "kvf_dtype.h"
#include "kvf_kv_layout.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Tokens of one split-KV chunk (rounded down to whole kernel blocks, at least one). */
#define KVF_FI_SPLIT_TOKENS 2048

/** The geometry FlashInfer reads kvferry's pool with (elements of the cache dtype). */
typedef struct {
    uint32_t stride_page; /**< elements between consecutive page indices */
    uint32_t stride_h;    /**< elements between KV heads in a kernel block */
    uint32_t stride_n;    /**< elements between tokens: head_dim */
    uint64_t v_offset;    /**< elements from a kernel block's K to its V */
    uint64_t unit;        /**< bytes per page index (gcd of page size and kernel block) */
    uint64_t block_bytes; /**< bytes between blocks (kvf_kv_strides_t.block) */
    uint64_t slot_bytes;  /**< bytes between a block's layer slots (kvf_kv_strides_t.slot) */
    uint64_t kblock_bytes;/**< bytes between a slot's kernel blocks (kvf_kv_strides_t.kblock) */
    int      slots;       /**< layer slots of a block */
    int      page_tokens; /**< FlashInfer's page size: the kernel block size */
    int      chunk_pages; /**< pages per split-KV chunk (fixed) */
    int      decode_on_prefill; /**< 1: a GQA group FlashInfer's decode does not dispatch:
                                 *   output tokens go to its prefill, one query token each */
} kvf_fi_geom_t;

/** Whether this build instantiated FlashInfer's decode for a @a dtype cache of @a head_dim
 * (bf16, head_dim 32, 64, 128 and 256 with -DKVF_FLASHINFER=ON; never without it). */
int kvf_fi_built(kvf_dtype_t dtype, int head_dim);

/** Whether FlashInfer's decode kernel dispatches GQA group @a group (1, 2, 3, 4, 6, 8, 16);
 * other groups take its prefill kernel (kvf_fi_geom_t.decode_on_prefill). */
int kvf_fi_decode_group(int group);

/**
 * Whether FlashInfer can serve a cache, and how it reads it.
 *
 * @param dtype       the KV cache dtype
 * @param head_dim    > 0
 * @param q_heads     query heads on this rank; @a kv_heads KV heads (> 0, divides q_heads)
 * @param kbs         kernel block size, tokens
 * @param page_size   bytes of one kvferry page (a block's slot)
 * @param pool_bytes  bytes of the whole pool (bounds the page indices)
 * @param built       whether dtype and head_dim count as instantiated (a test passes 1;
 *                    the runtime passes kvf_fi_built(dtype, head_dim))
 * @param [out] g     the geometry, when served
 * @return NULL when served; else why not, a static string naming the field and value
 *         class (the caller says it once and uses its own kernel).
 */
const char *kvf_fi_geometry(kvf_dtype_t dtype, int head_dim, int q_heads, int kv_heads, int kbs,
                            size_t page_size, size_t pool_bytes, int built, kvf_fi_geom_t *g);

/**
 * kvf_fi_geometry() for a block laid out by @a st (kernels/kvf_kv_layout.h: layer-major or
 * head-major): one FlashInfer page is one kernel block of one slot, stride_h the head
 * stride, v_offset the K -> V stride, and the page unit gcd(block, slot, kernel block
 * bytes). A layer in slot j reads from the pool's base moved by j * st->slot bytes.
 */
const char *kvf_fi_geometry_kv(kvf_dtype_t dtype, int head_dim, int q_heads, int kv_heads,
                               int kbs, const kvf_kv_strides_t *st, size_t pool_bytes,
                               int built, kvf_fi_geom_t *g);

/**
 * A request's FlashInfer page indices from its kvferry block table: for each logical block
 * b of its first @a tokens tokens, the kernel blocks it holds, in token order.
 *
 * @param block_table logical block ids; @a block_size tokens each (a multiple of kbs)
 * @param slots, slot the layer's page in each block
 * @param [out] pages ceil(tokens / kbs) indices
 * @return the number written; -1 on bad arguments or fewer than @a cap entries.
 */
int kvf_fi_pages(const kvf_fi_geom_t *g, const int32_t *block_table, int block_size, int slots,
                 int slot, size_t page_size, int tokens, int32_t *pages, int cap);

/** kvf_fi_pages() by @a g's own strides (kvf_fi_geometry_kv()): kernel block k of block b,
 * slot @a slot, is at b * block_bytes + slot * slot_bytes + k * kblock_bytes. */
int kvf_fi_pages_kv(const kvf_fi_geom_t *g, const int32_t *block_table, int block_size,
                    int slot, int tokens, int32_t *pages, int cap);

/**
 * The decode work plan: request r (kv_len[r] tokens, >= 1) is cut into
 * ceil(pages_r / chunk_pages) chunks; entry i of request_indices / kv_tile_indices names
 * (request, chunk), o_indptr[r] .. o_indptr[r + 1] are request r's entries. Depends on
 * each request's own length only.
 *
 * @param [out] request_indices, kv_tile_indices  @a cap entries each
 * @param [out] o_indptr  batch + 1 entries
 * @return entries (FlashInfer's padded batch size); -1 on bad arguments or too small @a cap.
 */
int kvf_fi_decode_plan(const kvf_fi_geom_t *g, const int32_t *kv_len, int batch,
                       int32_t *request_indices, int32_t *kv_tile_indices, int32_t *o_indptr,
                       int cap);

/** Packed query rows (query tokens x GQA group) of one FlashInfer prefill work tile. */
#define KVF_FI_PREFILL_TILE_Q 64

/**
 * The prefill work plan: request r (qo_len[r] >= 1 query tokens, the last ones of its KV) is
 * cut into ceil(qo_len[r] * group / KVF_FI_PREFILL_TILE_Q) query tiles, each over the
 * request's whole KV (no split-KV, so no merge: a row's sums run over its KV in one order
 * whatever the batch; masked tiles past its causal limit add exact zeros). Entry i names
 * (request, query tile, kv tile 0); q_indptr[r] .. q_indptr[r + 1] are request r's query
 * tokens (also FlashInfer's o_indptr in this mode).
 *
 * @param [out] request_indices, qo_tile_indices, kv_tile_indices  @a cap entries each
 * @param [out] q_indptr  batch + 1 entries
 * @return entries; -1 on bad arguments or too small @a cap.
 */
int kvf_fi_prefill_plan(const int32_t *qo_len, int batch, int group, int32_t *request_indices,
                        int32_t *qo_tile_indices, int32_t *kv_tile_indices, int32_t *q_indptr,
                        int cap);

#ifdef __cplusplus
}
#endif

#endif
