/*
 * Paged attention over a whole batch of requests in one call: the K/V cache
 * write and the causal attention of kvf_attention.h for num_seqs requests
 * whose query rows follow each other (request 0's tokens, then request
 * 1's, ...), each with its own block table. On the CPU it is exactly the
 * per-request calls of kvf_attention.h in request order (write, then
 * attend, per request; the same bits). On CUDA the block tables and
 * positions of every request go to the device in one copy and one launch
 * covers all of them, so a decode step of a batch of B requests costs two
 * launches per attention layer instead of 2 B, and its queries fill the
 * GPU together (split-K only when they do not).
 *
 * Requests must not write blocks that another request of the call reads
 * (true of a block manager's shared prefixes: only full, already computed
 * blocks are shared): the CUDA write of every request completes before any
 * attention reads.
 */
#ifndef KVF_ATTENTION_SEQS_H
#define KVF_ATTENTION_SEQS_H

#include "kvf_attention.h"

#ifdef __cplusplus
extern "C" {
#endif

/** The requests of one call (all HOST arrays, not retained). */
typedef struct kvf_attn_seqs {
    int                   num_seqs;      /* >= 0 */
    const int            *num_tokens;    /* [num_seqs] query rows of each, >= 1 */
    const int32_t *const *block_tables;  /* [num_seqs] -> int32[num_blocks[i]] */
    const int            *num_blocks;    /* [num_seqs] */
    /* Optional (0/NULL: unused), read by the CUDA path only; a decode step run as a CUDA
     * graph sets them (kernels/kvf_device_graph.h) so the launch reads no other host array:
     * packed: HOST int32 [2T + num_seqs * packed_maxb] = each row's request, each row's
     * position (= @a positions), then request i's table at i * packed_maxb (its num_blocks[i]
     * entries, the rest unread); uploaded as is (no copy at all when it lies in the stream's
     * published step inputs) instead of being packed per call. split_blocks: split-K sized
     * for queries spanning this many kernel blocks (kvf_attn_split_count()), >= the batch's
     * longest, instead of from the positions: a launch shape fixed for any batch of the same
     * size (the extra ranges are empty and change no bit: kvf_attention_math.h). With packed
 * set the CUDA path runs the per-token kernel even under KVF_GPU_ATTN=tiled (the tiled
 * kernel's tile plan is packed per call; it gives the per-token kernel's bits anyway). */
    const int32_t        *packed;
    int                   packed_maxb;   /* >= every num_blocks[i] when packed is set */
    int                   split_blocks;  /* 0, or >= max over rows of position / kbs + 1 */
} kvf_attn_seqs_t;

/**
 * The words of a packed block (kvf_attn_seqs_t.packed) of @a num_tokens rows, @a num_seqs
 * requests and tables @a maxb wide: 2 * num_tokens + num_seqs * maxb.
 */
size_t kvf_attn_seqs_packed_words(int num_tokens, int num_seqs, int maxb);

/**
 * Lay out @a seqs as the CUDA path reads it (the one definition of kvf_attn_seqs_t.packed):
 * [num_tokens] the request of each row, [num_tokens] @a positions, then request i's table
 * at 2 * num_tokens + i * maxb (its num_blocks[i] entries, the rest 0).
 * @param [in]  seqs        HOST arrays; every num_blocks[i] <= @a maxb.
 * @param [in]  positions   HOST int32 [num_tokens] (the sum of seqs->num_tokens).
 * @param [out] out         kvf_attn_seqs_packed_words() int32, all written.
 */
void kvf_attn_seqs_pack(const kvf_attn_seqs_t *seqs, const int32_t *positions, int num_tokens,
                        int maxb, int32_t *out);

/**
 * Store K and V of every request's new tokens, then attend: for request i
 * with rows [o_i, o_i + n_i), kvf_attn_cache_write() and kvf_attn_paged()
 * of @a kv with block_table = block_tables[i], num_blocks = num_blocks[i]
 * (kv's own block_table and num_blocks are not read) on rows
 * k/v/q + o_i * ld/ldq, positions + o_i, out + o_i * q_heads * head_dim.
 *
 * @param [in]  kv         Geometry of the layer's pages (base, page_size, slots, slot,
 *                         dtype, heads, block sizes).
 * @param [in]  seqs       The requests.
 * @param [in]  k, v, ld   As kvf_attn_cache_write(), rows of every request in order.
 * @param [in]  q, ldq     As kvf_attn_paged().
 * @param [in]  positions  HOST int32[sum n_i]: each row's absolute position in its request.
 * @param [in]  q_heads, scale  As kvf_attn_paged().
 * @param [out] out        fp32 [sum n_i][q_heads * head_dim].
 * @a q and @a out both NULL: the K/V write alone (q_heads, ldq and scale unread; on CUDA one
 * launch for the batch), for an attention that another kernel computes (FlashInfer's,
 * common/runtime/kvf_model_fi.c).
 * @return KVF_KERN_OK; KVF_KERN_EINVAL as the per-request calls (checked for
 *         every request before anything is written on CUDA; on the CPU the
 *         requests before a bad one are done); KVF_KERN_ENOMEM;
 *         KVF_KERN_ECUDA; KVF_KERN_EUNSUPPORTED.
 */
int kvf_attn_write_paged_seqs(const kvf_device_t *dev, const kvf_paged_kv_t *kv,
                              const kvf_attn_seqs_t *seqs, const float *k, const float *v,
                              int ld, const float *q, int ldq, const int32_t *positions,
                              int q_heads, float scale, float *out);

#ifdef __cplusplus
}
#endif

#endif
