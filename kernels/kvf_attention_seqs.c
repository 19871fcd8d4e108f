/*
 * kvf_attn_write_paged_seqs(): the CPU path (the per-request calls of
 * kvf_attention.c), the checks of the CUDA path and its dispatch
 * (kvf_attention_cuda.cu). kvf_attention_seqs.h says why.
 */
#include "kvf_attention_seqs.h"
#include "kvf_kern_internal.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

#ifdef KVF_HAVE_CUDA
#include "kvf_device_cuda.h"
#endif

size_t kvf_attn_seqs_packed_words(int num_tokens, int num_seqs, int maxb)
{
    return 2 * (size_t)num_tokens + (size_t)num_seqs * (size_t)maxb;
}

void kvf_attn_seqs_pack(const kvf_attn_seqs_t *seqs, const int32_t *positions, int num_tokens,
                        int maxb, int32_t *out)
{
    const size_t T = (size_t)num_tokens;

    memset(out, 0, kvf_attn_seqs_packed_words(num_tokens, seqs->num_seqs, maxb) * 4);
    for (int i = 0, o = 0; i < seqs->num_seqs; ++i) {
        for (int j = 0; j < seqs->num_tokens[i]; ++j) {
            out[o++] = i;
        }
        memcpy(out + 2 * T + (size_t)i * (size_t)maxb, seqs->block_tables[i],
               (size_t)seqs->num_blocks[i] * sizeof(int32_t));
    }
    memcpy(out + T, positions, T * sizeof(int32_t));
}

/* request i's view of the layer */
static kvf_paged_kv_t kvf_seq_kv(const kvf_paged_kv_t *kv, const kvf_attn_seqs_t *s, int i)
{
    kvf_paged_kv_t one = *kv;
    one.block_table = s->block_tables[i];
    one.num_blocks = s->num_blocks[i];
    return one;
}

/* The per-request checks of kvf_attention.c for request i: its view, its positions in range
 * and the blocks up to each position set. */
static int kvf_seq_check(const kvf_paged_kv_t *one, const int32_t *positions, int n)
{
    long limit = (long)one->num_blocks * (long)one->block_size;

    if ((n < 1) || (kvf_paged_kv_check(one) != KVF_KERN_OK)) {
        return KVF_KERN_EINVAL;
    }
    for (int t = 0; t < n; ++t) {
        if ((positions[t] < 0) || ((long)positions[t] >= limit)) {
            return KVF_KERN_EINVAL;
        }
        for (int b = 0; b <= positions[t] / one->block_size; ++b) {
            if (one->block_table[b] < 0) {
                return KVF_KERN_EINVAL;
            }
        }
    }
    return KVF_KERN_OK;
}

int kvf_attn_write_paged_seqs(const kvf_device_t *dev, const kvf_paged_kv_t *kv,
                              const kvf_attn_seqs_t *seqs, const float *k, const float *v,
                              int ld, const float *q, int ldq, const int32_t *positions,
                              int q_heads, float scale, float *out)
{
    int o = 0, e = KVF_KERN_OK;

    if ((kv == NULL) || (seqs == NULL) || (seqs->num_seqs < 0)) {
        return KVF_KERN_EINVAL;
    }
    if (seqs->num_seqs == 0) {
        return KVF_KERN_OK;
    }
    const bool write_only = (q == NULL) && (out == NULL);

    if ((seqs->num_tokens == NULL) || (seqs->block_tables == NULL) ||
        (seqs->num_blocks == NULL) || (k == NULL) || (v == NULL) ||
        (((q == NULL) || (out == NULL)) && !write_only) || (positions == NULL)) {
        return KVF_KERN_EINVAL;
    }
    if (kvf_kern_on_cpu(dev)) {
        const size_t orow = (size_t)q_heads * (size_t)kv->head_dim;
        for (int i = 0; (e == KVF_KERN_OK) && (i < seqs->num_seqs); ++i) {
            const kvf_paged_kv_t one = kvf_seq_kv(kv, seqs, i);
            const int n = seqs->num_tokens[i];
            e = kvf_attn_cache_write(dev, &one, k + (size_t)o * (size_t)ld,
                                     v + (size_t)o * (size_t)ld, ld, positions + o, n);
            if ((e == KVF_KERN_OK) && !write_only) {
                e = kvf_attn_paged(dev, &one, q + (size_t)o * (size_t)ldq, ldq, positions + o,
                                   n, q_heads, scale, out + (size_t)o * orow);
            }
            o += n;
        }
        return e;
    }
    if ((!write_only && ((q_heads <= 0) || ((q_heads % kv->kv_heads) != 0) ||
                         (ldq < q_heads * kv->head_dim))) ||
        (ld < kv->kv_heads * kv->head_dim)) {
        return KVF_KERN_EINVAL;
    }
    for (int i = 0; i < seqs->num_seqs; ++i) {
        const kvf_paged_kv_t one = kvf_seq_kv(kv, seqs, i);
        if ((seqs->block_tables[i] == NULL) ||
            (kvf_seq_check(&one, positions + o, seqs->num_tokens[i]) != KVF_KERN_OK)) {
            return KVF_KERN_EINVAL;
        }
        o += seqs->num_tokens[i];
    }
    if (!(scale > 0.0f)) {
        scale = 1.0f / sqrtf((float)kv->head_dim);
    }
#ifdef KVF_HAVE_CUDA
    return kvf_cuda_attn_write_paged_seqs(dev, kv, seqs, k, v, ld, q, ldq, positions, o,
                                          q_heads, scale, out);
#else
    return KVF_KERN_EUNSUPPORTED;
#endif
}
