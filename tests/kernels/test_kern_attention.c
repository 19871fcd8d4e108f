/* Paged attention against dense softmax over contiguous K/V, for fp32, bf16
 * and fp16 caches, several block / kernel block sizes, chunked prefill then
 * decode, sliding windows and attention sinks; and the stale-NaN hazard of
 * whole-tile masking. */
#include "kvf_attention.h"
#include "kvf_attention_seqs.h"
#include "kvf_gemm.h"
#include "kvf_kern_test.h"

#include <stdlib.h>
#include <string.h>

enum { KVH = 2, QH = 6, HD = 8, SLOTS = 2, SLOT = 1, POOL_BLOCKS = 6 };
#define LDQKV ((QH + 2 * KVH) * HD)

typedef struct {
    kvf_paged_kv_t kv;
    void          *pool;
    size_t         pool_bytes;
} fixture_t;

static void fixture_init(fixture_t *f, kvf_dtype_t dtype, int bs, int kbs, const int32_t *table,
                         int nblocks, int fill_byte)
{
    memset(f, 0, sizeof(*f));
    f->kv.dtype = dtype;
    f->kv.kv_heads = KVH;
    f->kv.head_dim = HD;
    f->kv.block_size = bs;
    f->kv.kernel_block_size = kbs;
    f->kv.slots = SLOTS;
    f->kv.slot = SLOT;
    f->kv.page_size = (size_t)(bs / kbs) * kvf_paged_kv_kernel_block_bytes(&f->kv) + 32;
    f->pool_bytes = f->kv.page_size * SLOTS * POOL_BLOCKS;
    f->pool = malloc(f->pool_bytes);
    assert_non_null(f->pool);
    memset(f->pool, fill_byte, f->pool_bytes);
    f->kv.base = f->pool;
    f->kv.block_table = table;
    f->kv.num_blocks = nblocks;
    assert_int_equal(kvf_paged_kv_check(&f->kv), KVF_KERN_OK);
}

/* the sliding window ref_attention() applies (0: none), as kvf_paged_kv_t.window */
static int ref_window;
/* the attention sinks it applies (NULL: none), as kvf_paged_kv_t.sinks: one more logit per
 * query head in the softmax, with no value (transformers' gpt-oss eager attention) */
static const float *ref_sinks;
/* the score softcap it applies (0: none), as kvf_paged_kv_t.softcap: cap * tanh(s / cap) */
static double ref_softcap;

/* dense causal GQA over the dtype-rounded K/V of tokens [0, pos] (the last ref_window of
 * them under a window: transformers keeps key j when j > pos - window) */
static void ref_attention(const float *qkv, kvf_dtype_t dtype, int pos, int t_row, double *out)
{
    const int j0 = ((ref_window > 0) && (pos - ref_window + 1 > 0)) ? pos - ref_window + 1 : 0;
    const float *q = qkv + (size_t)t_row * LDQKV;
    double scale = 1.0 / sqrt((double)HD);
    double *s = malloc((size_t)(pos + 1) * sizeof(double));
    assert_non_null(s);
    for (int h = 0; h < QH; ++h) {
        int kh = h / (QH / KVH);
        double m = -INFINITY, l = 0;
        for (int j = j0; j <= pos; ++j) {
            const float *k = qkv + (size_t)j * LDQKV + QH * HD + kh * HD;
            double dot = 0;
            for (int d = 0; d < HD; ++d) {
                dot += (double)q[h * HD + d] * kvf_test_quant(dtype, k[d]);
            }
            s[j] = dot * scale;
            if (ref_softcap > 0) {
                s[j] = ref_softcap * tanh(s[j] / ref_softcap);
            }
            m = (s[j] > m) ? s[j] : m;
        }
        if (ref_sinks != NULL) {
            m = ((double)ref_sinks[h] > m) ? (double)ref_sinks[h] : m;
            l = exp((double)ref_sinks[h] - m);
        }
        for (int d = 0; d < HD; ++d) {
            out[h * HD + d] = 0;
        }
        for (int j = j0; j <= pos; ++j) {
            const float *v = qkv + (size_t)j * LDQKV + (QH + KVH) * HD + kh * HD;
            double p = exp(s[j] - m);
            l += p;
            for (int d = 0; d < HD; ++d) {
                out[h * HD + d] += p * kvf_test_quant(dtype, v[d]);
            }
        }
        for (int d = 0; d < HD; ++d) {
            out[h * HD + d] /= l;
        }
    }
    free(s);
}

/* write + attend tokens [t0, t1) of the sequence, compare every row */
static void run_chunk(fixture_t *f, const float *qkv, int t0, int t1, double tol)
{
    int n = t1 - t0;
    int32_t *pos = malloc((size_t)n * sizeof(*pos));
    float *out = malloc((size_t)n * QH * HD * sizeof(float));
    double ref[QH * HD];
    char what[96];

    assert_non_null(pos);
    assert_non_null(out);
    for (int i = 0; i < n; ++i) {
        pos[i] = t0 + i;
    }
    const float *row0 = qkv + (size_t)t0 * LDQKV;
    assert_int_equal(kvf_attn_cache_write(NULL, &f->kv, row0 + QH * HD, row0 + (QH + KVH) * HD,
                                          LDQKV, pos, n),
                     KVF_KERN_OK);
    assert_int_equal(kvf_attn_paged(NULL, &f->kv, row0, LDQKV, pos, n, QH, 0.0f, out),
                     KVF_KERN_OK);
    for (int i = 0; i < n; ++i) {
        ref_attention(qkv, f->kv.dtype, pos[i], t0 + i, ref);
        snprintf(what, sizeof(what), "%s bs %d kbs %d pos %d", kvf_dtype_name(f->kv.dtype),
                 f->kv.block_size, f->kv.kernel_block_size, pos[i]);
        kvf_test_assert_close(out + (size_t)i * QH * HD, ref, QH * HD, tol, tol, what);
    }
    free(out);
    free(pos);
}

static void test_against_dense(void **state)
{
    static const kvf_dtype_t dtypes[] = {KVF_DTYPE_FP32, KVF_DTYPE_BF16, KVF_DTYPE_FP16};
    static const int sizes[][2] = {{80, 16}, {80, 40}, {80, 80}, {32, 16}, {48, 16}, {16, 16}};
    static const int32_t table[] = {4, 1, 3, 0, 5};
    (void)state;

    for (size_t di = 0; di < 3; ++di) {
        for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); ++si) {
            int bs = sizes[si][0], kbs = sizes[si][1];
            int nb = (bs >= 80) ? 3 : 5;
            int n = nb * bs - 5;
            kvf_test_rng_t rng = {1000 + di * 17 + si};
            float *qkv = malloc((size_t)n * LDQKV * sizeof(float));
            fixture_t f;

            assert_non_null(qkv);
            n = (n > 200) ? 200 : n;
            kvf_test_fill(&rng, qkv, (size_t)n * LDQKV, -1.5f, 1.5f);
            fixture_init(&f, dtypes[di], bs, kbs, table, nb, 0x3f);   /* finite garbage */
            int c1 = n / 2 + 3;
            run_chunk(&f, qkv, 0, c1, 2e-5);               /* prefill chunk */
            run_chunk(&f, qkv, c1, n - 4, 2e-5);           /* chunked continuation */
            for (int t = n - 4; t < n; ++t) {
                run_chunk(&f, qkv, t, t + 1, 2e-5);        /* decode */
            }
            /* pages of other slots and the padding were never written */
            for (int b = 0; b < POOL_BLOCKS; ++b) {
                const unsigned char *other = (const unsigned char *)f.pool +
                                             (size_t)(b * SLOTS) * f.kv.page_size;
                for (size_t i = 0; i < f.kv.page_size; ++i) {
                    assert_int_equal(other[i], 0x3f);
                }
            }
            free(f.pool);
            free(qkv);
        }
    }
}

/* One request with 21 tokens in a pool pre-filled with 0xff (NaN in every
 * dtype). Kernel block 16: the query at position 20 reads kernel block 1,
 * slots 21..31 are stale NaN -> NaN output. Position 15 reads block 0 only.
 * After zeroing the pages and rewriting, both match the reference. */
static void test_stale_nan_hazard(void **state)
{
    static const kvf_dtype_t dtypes[] = {KVF_DTYPE_FP32, KVF_DTYPE_BF16, KVF_DTYPE_FP16};
    static const int32_t table[] = {2, 0};
    enum { N = 21 };
    (void)state;

    for (size_t di = 0; di < 3; ++di) {
        for (int kbs = 16; kbs <= 80; kbs += 64) {
            kvf_test_rng_t rng = {555 + di};
            float qkv[N * LDQKV], out[QH * HD];
            double ref[QH * HD];
            int32_t pos[N];
            fixture_t f;

            kvf_test_fill(&rng, qkv, N * LDQKV, -1, 1);
            for (int i = 0; i < N; ++i) {
                pos[i] = i;
            }
            fixture_init(&f, dtypes[di], 80, kbs, table, 2, 0xff);
            assert_int_equal(kvf_attn_cache_write(NULL, &f.kv, qkv + QH * HD,
                                                  qkv + (QH + KVH) * HD, LDQKV, pos, N),
                             KVF_KERN_OK);
            /* position 20: its kernel block has unwritten, NaN slots */
            assert_int_equal(kvf_attn_paged(NULL, &f.kv, qkv + 20 * LDQKV, LDQKV, &pos[20], 1,
                                            QH, 0.0f, out),
                             KVF_KERN_OK);
            assert_int_equal(kvf_test_count_nan(out, QH * HD), QH * HD);
            /* position 15: with kbs 16 its kernel block is full -> clean */
            assert_int_equal(kvf_attn_paged(NULL, &f.kv, qkv + 15 * LDQKV, LDQKV, &pos[15], 1,
                                            QH, 0.0f, out),
                             KVF_KERN_OK);
            if (kbs == 16) {
                ref_attention(qkv, dtypes[di], 15, 15, ref);
                kvf_test_assert_close(out, ref, QH * HD, 2e-5, 2e-5, "full kernel block");
            } else {
                assert_int_equal(kvf_test_count_nan(out, QH * HD), QH * HD);
            }
            /* the fix: zero the block's pages (both slots), then write */
            {
                const int64_t pages[] = {2 * SLOTS, 2 * SLOTS + 1};
                assert_int_equal(kvf_blocks_zero(NULL, f.pool, f.kv.page_size, pages, 2),
                                 KVF_KERN_OK);
            }
            assert_int_equal(kvf_attn_cache_write(NULL, &f.kv, qkv + QH * HD,
                                                  qkv + (QH + KVH) * HD, LDQKV, pos, N),
                             KVF_KERN_OK);
            assert_int_equal(kvf_attn_paged(NULL, &f.kv, qkv + 20 * LDQKV, LDQKV, &pos[20], 1,
                                            QH, 0.0f, out),
                             KVF_KERN_OK);
            ref_attention(qkv, dtypes[di], 20, 20, ref);
            kvf_test_assert_close(out, ref, QH * HD, 2e-5, 2e-5, "after zeroing");
            free(f.pool);
        }
    }
}

/* Every real score very negative (q = 8, k = -8 + noise: about -180 after the
 * scale) and the rest of the kernel block zeroed, so a masked slot's score (0)
 * exceeds the running max by far more than expf's range: masking must give
 * probability 0, not 0 * expf(180) = 0 * inf = NaN, on correct data. Found by
 * a trained checkpoint whose attention produced NaN logits. */
static void test_negative_scores_masked_slots(void **state)
{
    static const kvf_dtype_t dtypes[] = {KVF_DTYPE_FP32, KVF_DTYPE_BF16};
    static const int32_t table[] = {1, 0};
    enum { N = 21 };
    (void)state;

    for (size_t di = 0; di < 2; ++di) {
        kvf_test_rng_t rng = {777 + di};
        float qkv[N * LDQKV], out[QH * HD], noise[N * LDQKV];
        double ref[QH * HD];
        int32_t pos[N];
        fixture_t f;

        kvf_test_fill(&rng, qkv, N * LDQKV, -1, 1);
        kvf_test_fill(&rng, noise, N * LDQKV, -0.25f, 0.25f);
        for (int t = 0; t < N; ++t) {
            float *row = qkv + (size_t)t * LDQKV;
            pos[t] = t;
            for (int i = 0; i < QH * HD; ++i) {
                row[i] = 8.0f;                                  /* q */
            }
            for (int i = 0; i < KVH * HD; ++i) {
                row[QH * HD + i] = -8.0f + noise[t * LDQKV + i];  /* k */
            }
        }
        fixture_init(&f, dtypes[di], 80, 16, table, 2, 0);    /* zeroed, as after kvf_blocks_zero */
        assert_int_equal(kvf_attn_cache_write(NULL, &f.kv, qkv + QH * HD, qkv + (QH + KVH) * HD,
                                              LDQKV, pos, N),
                         KVF_KERN_OK);
        assert_int_equal(kvf_attn_paged(NULL, &f.kv, qkv + 20 * LDQKV, LDQKV, &pos[20], 1, QH,
                                        0.0f, out),
                         KVF_KERN_OK);
        assert_int_equal(kvf_test_count_nan(out, QH * HD), 0);
        ref_attention(qkv, dtypes[di], 20, 20, ref);
        kvf_test_assert_close(out, ref, QH * HD, 2e-5, 2e-5, "very negative scores");
        free(f.pool);
    }
}

/* Attending a chunk at once or token by token gives the same rows BIT FOR
 * BIT (batch invariance): the tile order per query is fixed (tile bounds
 * depend on the kernel block size alone) and each score and value sum is one
 * FMA chain in a fixed order whatever the rows around it (kvf_gemm_cpu_nn);
 * also a row attended in a sub-chunk that starts elsewhere. */
static void test_chunking_matches_steps(void **state)
{
    static const int32_t table[] = {3, 0};
    enum { N = 70 };
    kvf_test_rng_t rng = {4242};
    float *qkv = malloc((size_t)N * LDQKV * sizeof(float));
    float whole[N * QH * HD], one[QH * HD];
    int32_t pos[N];
    fixture_t f;
    (void)state;

    assert_non_null(qkv);
    kvf_test_fill(&rng, qkv, (size_t)N * LDQKV, -1, 1);
    for (int i = 0; i < N; ++i) {
        pos[i] = i;
    }
    fixture_init(&f, KVF_DTYPE_BF16, 48, 16, table, 2, 0);
    assert_int_equal(kvf_attn_cache_write(NULL, &f.kv, qkv + QH * HD, qkv + (QH + KVH) * HD,
                                          LDQKV, pos, N),
                     KVF_KERN_OK);
    assert_int_equal(kvf_attn_paged(NULL, &f.kv, qkv, LDQKV, pos, N, QH, 0, whole), KVF_KERN_OK);
    for (int t = N - 1; t >= 0; t -= 3) {   /* any order */
        assert_int_equal(kvf_attn_paged(NULL, &f.kv, qkv + (size_t)t * LDQKV, LDQKV, &pos[t], 1,
                                        QH, 0, one),
                         KVF_KERN_OK);
        assert_memory_equal(one, whole + (size_t)t * QH * HD, sizeof(one));
    }
    {
        float part[23 * QH * HD];       /* rows 31..53 as their own call */
        assert_int_equal(kvf_attn_paged(NULL, &f.kv, qkv + (size_t)31 * LDQKV, LDQKV, &pos[31],
                                        23, QH, 0, part),
                         KVF_KERN_OK);
        assert_memory_equal(part, whole + (size_t)31 * QH * HD, sizeof(part));
    }
    free(f.pool);
    free(qkv);
}

/*
 * The head-major block layout (kvf_kv_layout.h) is the same math at other addresses: the
 * same tokens written and attended at both layouts give bit-identical outputs (one call of
 * every row, the blocked path, and single decode rows, under a window too), while head h's
 * K row t sits where the layout's definition puts it (written out here, not through the
 * strides) and the two pools differ.
 */
static void test_layouts_bit_identical(void **state)
{
    static const int32_t table[] = {4, 1, 3};
    enum { N = 130, BS = 48, KBS = 16, PPL = BS / KBS };
    kvf_test_rng_t rng = {777};
    float *qkv = malloc((size_t)N * LDQKV * sizeof(float));
    float *out[2], one[2][QH * HD];
    int32_t pos[N];
    fixture_t f[2];
    (void)state;

    assert_non_null(qkv);
    kvf_test_fill(&rng, qkv, (size_t)N * LDQKV, -1, 1);
    for (int i = 0; i < N; ++i) {
        pos[i] = i;
    }
    for (int w = 0; w < 2; ++w) {
        for (int l = 0; l < 2; ++l) {
            fixture_init(&f[l], KVF_DTYPE_BF16, BS, KBS, table, 3, 0);
            f[l].kv.layout = l ? KVF_KV_HEAD_MAJOR : KVF_KV_LAYER_MAJOR;
            f[l].kv.window = w ? 40 : 0;
            assert_int_equal(kvf_paged_kv_check(&f[l].kv), KVF_KERN_OK);
            out[l] = malloc((size_t)N * QH * HD * sizeof(float));
            assert_non_null(out[l]);
            assert_int_equal(kvf_attn_cache_write(NULL, &f[l].kv, qkv + QH * HD,
                                                  qkv + (QH + KVH) * HD, LDQKV, pos, N),
                             KVF_KERN_OK);
            assert_int_equal(kvf_attn_paged(NULL, &f[l].kv, qkv, LDQKV, pos, N, QH, 0, out[l]),
                             KVF_KERN_OK);
            assert_int_equal(kvf_attn_paged(NULL, &f[l].kv, qkv + (size_t)(N - 1) * LDQKV,
                                            LDQKV, &pos[N - 1], 1, QH, 0, one[l]),
                             KVF_KERN_OK);
        }
        assert_memory_equal(out[0], out[1], (size_t)N * QH * HD * sizeof(float));
        assert_memory_equal(one[0], one[1], sizeof(one[0]));
        assert_memory_not_equal(f[0].pool, f[1].pool, f[0].pool_bytes);
        /* token 100 (block 2 -> id 3, kernel block 0 of it), K of head 1, dim 0 */
        {
            const size_t elt = 2, run = (size_t)KBS * HD * elt;
            const size_t off = 3u * SLOTS * f[1].kv.page_size + 1u * (SLOTS * PPL * 2 * run) +
                               (size_t)SLOT * (PPL * 2 * run) + 0u * (2 * run) +
                               (size_t)(100 % KBS) * HD * elt;
            const uint16_t want = kvf_fp32_to_bf16(qkv[(size_t)100 * LDQKV + QH * HD + HD]);
            uint16_t got;
            memcpy(&got, (const char *)f[1].pool + off, sizeof(got));
            assert_int_equal(got, want);
        }
        for (int l = 0; l < 2; ++l) {
            free(out[l]);
            free(f[l].pool);
        }
    }
    free(qkv);
}

/* kvf_attn_write_paged_seqs with q and out NULL: the K/V write of every request alone
 * (FlashInfer's forward path), the pool then byte for byte what the write-and-attend call
 * leaves; one of q / out NULL refused. */
static void test_seqs_write_only(void **state)
{
    static const int32_t ta[] = {3, 0}, tb[] = {5};
    const int32_t *tabs[2] = {ta, tb};
    const int ntok[2] = {5, 3}, nblk[2] = {2, 1};
    enum { T = 8 };
    const int32_t pos[T] = {40, 41, 42, 43, 44, 0, 1, 2};
    kvf_test_rng_t rng = {777};
    float qkv[T * LDQKV], out[T * QH * HD];
    fixture_t a, b;
    (void)state;

    kvf_test_fill(&rng, qkv, (size_t)T * LDQKV, -1, 1);
    fixture_init(&a, KVF_DTYPE_BF16, 48, 16, ta, 2, 0);
    fixture_init(&b, KVF_DTYPE_BF16, 48, 16, ta, 2, 0);
    const kvf_attn_seqs_t seqs = {.num_seqs = 2, .num_tokens = ntok, .block_tables = tabs,
                                  .num_blocks = nblk};
    assert_int_equal(kvf_attn_write_paged_seqs(NULL, &a.kv, &seqs, qkv + QH * HD,
                                               qkv + (QH + KVH) * HD, LDQKV, NULL, 0, pos, 0,
                                               0.0f, NULL),
                     KVF_KERN_OK);
    assert_int_equal(kvf_attn_write_paged_seqs(NULL, &b.kv, &seqs, qkv + QH * HD,
                                               qkv + (QH + KVH) * HD, LDQKV, qkv, LDQKV, pos,
                                               QH, 0.0f, out),
                     KVF_KERN_OK);
    assert_memory_equal(a.pool, b.pool, a.pool_bytes);
    {   /* something was written: 8 tokens x 2 x KVH x HD bf16 values, nearly all nonzero */
        size_t nz = 0;
        for (size_t i = 0; i < a.pool_bytes; ++i) {
            nz += (((unsigned char *)a.pool)[i] != 0);
        }
        assert_true(nz > (size_t)T * 2 * KVH * HD);
    }
    assert_int_equal(kvf_attn_write_paged_seqs(NULL, &a.kv, &seqs, qkv + QH * HD,
                                               qkv + (QH + KVH) * HD, LDQKV, qkv, LDQKV, pos,
                                               QH, 0.0f, NULL),
                     KVF_KERN_EINVAL);
    free(a.pool);
    free(b.pool);
}

/* A long chunk: 300 tokens take two key tiles and many query blocks; split
 * over two CPU threads (kvf_gemm_set_threads, as an instance of TP 1 does)
 * every row is computed by the same arithmetic, so the bits equal the one
 * thread's; both match the dense reference. */
static void test_long_chunk_threads(void **state)
{
    static const int32_t table[] = {4, 1, 5, 0};
    enum { N = 300 };
    float *qkv = malloc((size_t)N * LDQKV * sizeof(float));
    float *one = malloc((size_t)N * QH * HD * sizeof(float));
    float *two = malloc((size_t)N * QH * HD * sizeof(float));
    double ref[QH * HD];
    kvf_test_rng_t rng = {99};
    int32_t pos[N];
    fixture_t f;
    (void)state;

    assert_non_null(qkv);
    assert_non_null(one);
    assert_non_null(two);
    kvf_test_fill(&rng, qkv, (size_t)N * LDQKV, -1, 1);
    for (int i = 0; i < N; ++i) {
        pos[i] = i;
    }
    fixture_init(&f, KVF_DTYPE_FP16, 80, 16, table, 4, 0);
    assert_int_equal(kvf_attn_cache_write(NULL, &f.kv, qkv + QH * HD, qkv + (QH + KVH) * HD,
                                          LDQKV, pos, N),
                     KVF_KERN_OK);
    assert_int_equal(kvf_attn_paged(NULL, &f.kv, qkv, LDQKV, pos, N, QH, 0, one), KVF_KERN_OK);
    kvf_gemm_set_threads(2);
    assert_int_equal(kvf_attn_paged(NULL, &f.kv, qkv, LDQKV, pos, N, QH, 0, two), KVF_KERN_OK);
    kvf_gemm_set_threads(1);
    assert_memory_equal(one, two, (size_t)N * QH * HD * sizeof(float));
    for (int t = 0; t < N; t += 37) {
        ref_attention(qkv, KVF_DTYPE_FP16, t, t, ref);
        kvf_test_assert_close(one + (size_t)t * QH * HD, ref, QH * HD, 2e-5, 2e-5, "long chunk");
    }
    free(f.pool);
    free(two);
    free(one);
    free(qkv);
}

static void test_errors(void **state)
{
    static const int32_t table[] = {1, -1};
    fixture_t f;
    float row[LDQKV] = {0}, out[QH * HD];
    int32_t pos = 0;
    (void)state;

    fixture_init(&f, KVF_DTYPE_BF16, 32, 16, table, 2, 0);
    pos = 64;   /* past the table */
    assert_int_equal(kvf_attn_cache_write(NULL, &f.kv, row, row, LDQKV, &pos, 1),
                     KVF_KERN_EINVAL);
    pos = 40;   /* table entry 1 is -1 */
    assert_int_equal(kvf_attn_paged(NULL, &f.kv, row, LDQKV, &pos, 1, QH, 0, out),
                     KVF_KERN_EINVAL);
    pos = 3;
    assert_int_equal(kvf_attn_paged(NULL, &f.kv, row, LDQKV, &pos, 1, 5, 0, out),
                     KVF_KERN_EINVAL);   /* 5 q heads over 2 kv heads */
    f.kv.kernel_block_size = 24;         /* does not divide 32 */
    assert_int_equal(kvf_paged_kv_check(&f.kv), KVF_KERN_EINVAL);
    f.kv.kernel_block_size = 16;
    f.kv.page_size = 100;                /* too small for 2 kernel blocks */
    assert_int_equal(kvf_paged_kv_check(&f.kv), KVF_KERN_EINVAL);
    f.kv.page_size = 4096;
    f.kv.dtype = KVF_DTYPE_FP8;
    assert_int_equal(kvf_paged_kv_check(&f.kv), KVF_KERN_EINVAL);
    free(f.pool);
}

/* A sliding window of 37 tokens (not a multiple of any block size): prefill chunk, chunked
 * continuation and decode rows match the dense windowed reference; a chunk's rows equal the
 * same rows one by one bit for bit (tile boundaries do not move with the window); the
 * per-query path (positions not ascending) gives the same reference values; and a window
 * wider than the sequence changes no bit of full causal attention. */
static void test_sliding_window(void **state)
{
    static const int32_t table[] = {4, 1, 3, 0, 5};
    enum { N = 200, W = 37 };
    static const int sizes[][2] = {{80, 16}, {64, 32}, {48, 16}};
    float *qkv = malloc((size_t)N * LDQKV * sizeof(float));
    float *whole = malloc((size_t)N * QH * HD * sizeof(float));
    float *full = malloc((size_t)N * QH * HD * sizeof(float));
    float one[QH * HD], two[2 * QH * HD];
    double ref[QH * HD];
    int32_t pos[N];
    (void)state;

    assert_non_null(qkv);
    assert_non_null(whole);
    assert_non_null(full);
    for (int i = 0; i < N; ++i) {
        pos[i] = i;
    }
    for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); ++si) {
        const int bs = sizes[si][0], kbs = sizes[si][1], nb = (N + bs - 1) / bs;
        kvf_test_rng_t rng = {777 + si};
        fixture_t f;

        kvf_test_fill(&rng, qkv, (size_t)N * LDQKV, -1.5f, 1.5f);
        fixture_init(&f, KVF_DTYPE_BF16, bs, kbs, table, nb, 0x3f);
        f.kv.window = W;
        ref_window = W;
        run_chunk(&f, qkv, 0, 90, 2e-5);          /* prefill longer than the window */
        run_chunk(&f, qkv, 90, 150, 2e-5);        /* chunked continuation */
        for (int t = 150; t < N; ++t) {
            run_chunk(&f, qkv, t, t + 1, 2e-5);   /* decode */
        }
        assert_int_equal(kvf_attn_paged(NULL, &f.kv, qkv, LDQKV, pos, N, QH, 0, whole),
                         KVF_KERN_OK);
        for (int t = 0; t < N; t += 7) {
            assert_int_equal(kvf_attn_paged(NULL, &f.kv, qkv + (size_t)t * LDQKV, LDQKV,
                                            &pos[t], 1, QH, 0, one), KVF_KERN_OK);
            assert_memory_equal(one, whole + (size_t)t * QH * HD, sizeof(one));
        }
        {
            /* two rows in descending order: the per-query fold */
            const int32_t p2[2] = {160, 41};
            float q2[2 * LDQKV];
            memcpy(q2, qkv + (size_t)160 * LDQKV, LDQKV * sizeof(float));
            memcpy(q2 + LDQKV, qkv + (size_t)41 * LDQKV, LDQKV * sizeof(float));
            assert_int_equal(kvf_attn_paged(NULL, &f.kv, q2, LDQKV, p2, 2, QH, 0, two),
                             KVF_KERN_OK);
            for (int i = 0; i < 2; ++i) {
                ref_attention(qkv, f.kv.dtype, p2[i], p2[i], ref);
                kvf_test_assert_close(two + (size_t)i * QH * HD, ref, QH * HD, 2e-5, 2e-5,
                                      "window, per-query fold");
            }
        }
        /* a window of at least the sequence is full causal attention, bit for bit */
        f.kv.window = N;
        assert_int_equal(kvf_attn_paged(NULL, &f.kv, qkv, LDQKV, pos, N, QH, 0, whole),
                         KVF_KERN_OK);
        f.kv.window = 0;
        assert_int_equal(kvf_attn_paged(NULL, &f.kv, qkv, LDQKV, pos, N, QH, 0, full),
                         KVF_KERN_OK);
        assert_memory_equal(whole, full, (size_t)N * QH * HD * sizeof(float));
        ref_window = 0;
        free(f.pool);
    }
    free(full);
    free(whole);
    free(qkv);
}

/* gpt-oss's attention sinks, one far above every score (it sets the softmax's max), with a
 * window and without: prefill chunks, decode steps and the per-query fold against the dense
 * softmax with the sink's column; no sinks is the plain attention, bit for bit. */
static void test_sinks(void **state)
{
    static const int32_t table[] = {4, 1, 3, 0, 5};
    static const float sinks[QH] = {0.5f, -2.0f, 25.0f, 1.0f, 0.0f, -0.75f};
    enum { N = 150 };
    float *qkv = malloc((size_t)N * LDQKV * sizeof(float));
    float *a = malloc((size_t)N * QH * HD * sizeof(float));
    float *b = malloc((size_t)N * QH * HD * sizeof(float));
    float two[2 * QH * HD], q2[2 * LDQKV];
    const int32_t p2[2] = {140, 30};
    double ref[QH * HD];
    int32_t pos[N];
    (void)state;

    assert_non_null(qkv);
    assert_non_null(a);
    assert_non_null(b);
    for (int i = 0; i < N; ++i) {
        pos[i] = i;
    }
    for (int w = 0; w < 2; ++w) {
        kvf_test_rng_t rng = {4242 + (uint64_t)w};
        fixture_t f;

        kvf_test_fill(&rng, qkv, (size_t)N * LDQKV, -1.5f, 1.5f);
        fixture_init(&f, (w == 0) ? KVF_DTYPE_FP32 : KVF_DTYPE_BF16, 48, 16, table, 4, 0x3f);
        f.kv.window = ref_window = (w == 0) ? 0 : 37;
        f.kv.sinks = ref_sinks = sinks;
        run_chunk(&f, qkv, 0, 70, 2e-5);           /* prefill (the blocked path) */
        run_chunk(&f, qkv, 70, 140, 2e-5);
        for (int t = 140; t < N; ++t) {
            run_chunk(&f, qkv, t, t + 1, 2e-5);    /* decode */
        }
        memcpy(q2, qkv + (size_t)p2[0] * LDQKV, LDQKV * sizeof(float));
        memcpy(q2 + LDQKV, qkv + (size_t)p2[1] * LDQKV, LDQKV * sizeof(float));
        assert_int_equal(kvf_attn_paged(NULL, &f.kv, q2, LDQKV, p2, 2, QH, 0, two),
                         KVF_KERN_OK);   /* descending: the per-query fold */
        for (int i = 0; i < 2; ++i) {
            ref_attention(qkv, f.kv.dtype, p2[i], p2[i], ref);
            kvf_test_assert_close(two + (size_t)i * QH * HD, ref, QH * HD, 2e-5, 2e-5,
                                  "sinks, per-query fold");
        }
        /* the sinks change every head's output; without them the plain bits come back */
        assert_int_equal(kvf_attn_paged(NULL, &f.kv, qkv, LDQKV, pos, N, QH, 0, a), KVF_KERN_OK);
        f.kv.sinks = ref_sinks = NULL;
        assert_int_equal(kvf_attn_paged(NULL, &f.kv, qkv, LDQKV, pos, N, QH, 0, b), KVF_KERN_OK);
        for (int h = 0; h < QH; ++h) {
            assert_true(a[(size_t)(N - 1) * QH * HD + (size_t)h * HD] !=
                        b[(size_t)(N - 1) * QH * HD + (size_t)h * HD]);
        }
        ref_attention(qkv, f.kv.dtype, N - 1, N - 1, ref);
        kvf_test_assert_close(b + (size_t)(N - 1) * QH * HD, ref, QH * HD, 2e-5, 2e-5,
                              "no sinks");
        ref_window = 0;
        free(f.pool);
    }
    free(b);
    free(a);
    free(qkv);
}

/* gemma2's score softcap (a cap of 0.5 binds: scores of ~1 become ~0.38), with a window
 * and without: prefill chunks (the blocked path), decode steps and the per-query fold against
 * the dense softmax of the capped scores; the cap changes the output (it is applied). */
static void test_softcap(void **state)
{
    static const int32_t table[] = {4, 1, 3, 0, 5};
    enum { N = 150 };
    float *qkv = malloc((size_t)N * LDQKV * sizeof(float));
    float *a = malloc((size_t)N * QH * HD * sizeof(float));
    float *b = malloc((size_t)N * QH * HD * sizeof(float));
    float two[2 * QH * HD], q2[2 * LDQKV];
    const int32_t p2[2] = {140, 30};
    double ref[QH * HD];
    int32_t pos[N];
    (void)state;

    assert_non_null(qkv);
    assert_non_null(a);
    assert_non_null(b);
    for (int i = 0; i < N; ++i) {
        pos[i] = i;
    }
    for (int w = 0; w < 2; ++w) {
        kvf_test_rng_t rng = {777 + (uint64_t)w};
        fixture_t f;

        kvf_test_fill(&rng, qkv, (size_t)N * LDQKV, -1.5f, 1.5f);
        fixture_init(&f, (w == 0) ? KVF_DTYPE_FP32 : KVF_DTYPE_BF16, 48, 16, table, 4, 0x3f);
        f.kv.window = ref_window = (w == 0) ? 0 : 37;
        f.kv.softcap = 0.5f;
        ref_softcap = 0.5;
        run_chunk(&f, qkv, 0, 70, 2e-5);           /* prefill (the blocked path) */
        run_chunk(&f, qkv, 70, 140, 2e-5);
        for (int t = 140; t < N; ++t) {
            run_chunk(&f, qkv, t, t + 1, 2e-5);    /* decode */
        }
        memcpy(q2, qkv + (size_t)p2[0] * LDQKV, LDQKV * sizeof(float));
        memcpy(q2 + LDQKV, qkv + (size_t)p2[1] * LDQKV, LDQKV * sizeof(float));
        assert_int_equal(kvf_attn_paged(NULL, &f.kv, q2, LDQKV, p2, 2, QH, 0, two),
                         KVF_KERN_OK);   /* descending: the per-query fold */
        for (int i = 0; i < 2; ++i) {
            ref_attention(qkv, f.kv.dtype, p2[i], p2[i], ref);
            kvf_test_assert_close(two + (size_t)i * QH * HD, ref, QH * HD, 2e-5, 2e-5,
                                  "softcap, per-query fold");
        }
        assert_int_equal(kvf_attn_paged(NULL, &f.kv, qkv, LDQKV, pos, N, QH, 0, a), KVF_KERN_OK);
        f.kv.softcap = 0.0f;
        ref_softcap = 0;
        assert_int_equal(kvf_attn_paged(NULL, &f.kv, qkv, LDQKV, pos, N, QH, 0, b), KVF_KERN_OK);
        assert_true(memcmp(a, b, (size_t)N * QH * HD * sizeof(float)) != 0);
        ref_window = 0;
        free(f.pool);
    }
    free(b);
    free(a);
    free(qkv);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_dense),
        cmocka_unit_test(test_softcap),
        cmocka_unit_test(test_stale_nan_hazard),
        cmocka_unit_test(test_negative_scores_masked_slots),
        cmocka_unit_test(test_chunking_matches_steps),
        cmocka_unit_test(test_layouts_bit_identical),
        cmocka_unit_test(test_seqs_write_only),
        cmocka_unit_test(test_long_chunk_threads),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_sliding_window),
        cmocka_unit_test(test_sinks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
