/*
 * The tiled CUDA attention kernel's own code (kernels/kvf_attention_tiled_kernel.h)
 * run on the CPU: one host thread per CUDA thread (256), a barrier for
 * __syncthreads(), a per-warp exchange for __shfl_down_sync(), the block's
 * shared arrays as statics (one block runs at a time), correctly rounded
 * __fmaf_rn/__fmul_rn/__fadd_rn/__fdiv_rn. Its outputs (out, or the split-K
 * partials m, l, acc) must equal BIT for bit the per-token CUDA kernel's
 * arithmetic, written here serially per (token, query head, split) in that
 * kernel's order: dot in dim order, score * scale, max over unmasked slots,
 * kvf_attn_prob, the denominator in slot order, l = fma(l, alpha, lsum),
 * acc * alpha then fma(p, v, acc) in slot order, out = acc / l. Host expf
 * serves both sides. A kernel whose threads disagree on a barrier count
 * hangs here (the ctest timeout fails it) as it would misbehave on a GPU.
 * What it cannot show: device expf, the GPU's memory model and races that
 * this schedule hides; tests/gpu/attn_tiled_vs_pertoken checks those.
 */
#include "kvf_kern_test.h"

#include "kvf_attention.h"
#include "kvf_attention_cuda.h"
#include "kvf_attention_math.h"
#include "kvf_attention_tile.h"
#include "kvf_dtype.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct emu_dim3 {
    unsigned x, y, z;
} emu_dim3;

static _Thread_local emu_dim3 emu_tid, emu_bid;
static emu_dim3 emu_grid;
static pthread_barrier_t emu_bar;
static pthread_barrier_t emu_warp_bar[KVF_ATTN_TILE_THREADS / 32];
static float emu_lanes[KVF_ATTN_TILE_THREADS / 32][32];
static float *emu_dyn;

/* correctly rounded, never contracted with a neighbour (volatile forces the rounding) */
static float emu_mul(float a, float b)
{
    volatile float r = a * b;
    return r;
}

static float emu_add(float a, float b)
{
    volatile float r = a + b;
    return r;
}

static float emu_div(float a, float b)
{
    volatile float r = a / b;
    return r;
}

static void emu_sync(void)
{
    pthread_barrier_wait(&emu_bar);
}

static float emu_shfl_down(float v, int o)
{
    const int lane = (int)emu_tid.x % 32, w = (int)emu_tid.x / 32;
    emu_lanes[w][lane] = v;
    pthread_barrier_wait(&emu_warp_bar[w]);
    const float r = (lane + o < 32) ? emu_lanes[w][lane + o] : v;
    pthread_barrier_wait(&emu_warp_bar[w]);
    return r;
}

#define KVF_TILE_KERNEL            static void
#define KVF_TILE_SHARED            static
#define KVF_TILE_DYN_SHARED(_name) float *_name = emu_dyn
#define KVF_TILE_UNROLL
#define KVF_TILE_FN                static inline
#define threadIdx                  emu_tid
#define blockIdx                   emu_bid
#define gridDim                    emu_grid
#define __syncthreads()            emu_sync()
#define __shfl_down_sync(_m, _v, _o) ((void)(_m), emu_shfl_down((_v), (_o)))
#define __fmaf_rn(_a, _b, _c)      fmaf((_a), (_b), (_c))
#define __fmul_rn(_a, _b)          emu_mul((_a), (_b))
#define __fadd_rn(_a, _b)          emu_add((_a), (_b))
#define __fdiv_rn(_a, _b)          emu_div((_a), (_b))
#include "kvf_attention_tiled_kernel.h"

/* one launch of the tiled kernel: its arguments and grid */
typedef struct emu_launch {
    kvf_cuda_kv    g;
    const float   *q;
    int            ldq, q_heads, maxb, qt, ntiles, splits;
    const int32_t *positions, *tok_seq, *tiles;
    float          scale, *out, *pm, *pl, *pacc;
} emu_launch_t;

typedef struct emu_thread_arg {
    const emu_launch_t *L;
    unsigned            tid;
} emu_thread_arg_t;

static void *emu_thread(void *arg)
{
    const emu_thread_arg_t *a = arg;
    const emu_launch_t *L = a->L;
    const int nblocks = L->ntiles * L->splits * L->g.kv_heads;
    emu_tid.x = a->tid;
    emu_tid.y = emu_tid.z = 0;
    for (int b = 0; b < nblocks; ++b) {
        emu_bid.x = (unsigned)(b % L->ntiles);
        emu_bid.y = (unsigned)((b / L->ntiles) % L->splits);
        emu_bid.z = (unsigned)(b / (L->ntiles * L->splits));
        kvf_attn_tiled_kernel(L->g, L->q, L->ldq, L->positions, L->q_heads, L->scale, L->out,
                              L->pm, L->pl, L->pacc, L->tok_seq, L->maxb, L->tiles, L->qt);
        emu_sync();   /* the block's statics are reused by the next one */
    }
    return NULL;
}

static void emu_run(emu_launch_t *L)
{
    pthread_t th[KVF_ATTN_TILE_THREADS];
    emu_thread_arg_t args[KVF_ATTN_TILE_THREADS];
    pthread_attr_t attr;
    const size_t smem = kvf_attn_tile_smem(L->qt, L->g.head_dim, L->g.kbs);
    emu_dyn = malloc(smem);
    assert_non_null(emu_dyn);
    memset(emu_dyn, 0xff, smem);   /* NaN: a read of a slot never written shows */
    emu_grid.x = (unsigned)L->ntiles;
    emu_grid.y = (unsigned)L->splits;
    emu_grid.z = (unsigned)L->g.kv_heads;
    assert_int_equal(pthread_barrier_init(&emu_bar, NULL, KVF_ATTN_TILE_THREADS), 0);
    for (int w = 0; w < KVF_ATTN_TILE_THREADS / 32; ++w) {
        assert_int_equal(pthread_barrier_init(&emu_warp_bar[w], NULL, 32), 0);
    }
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    for (int i = 0; i < KVF_ATTN_TILE_THREADS; ++i) {
        args[i].L = L;
        args[i].tid = (unsigned)i;
        assert_int_equal(pthread_create(&th[i], &attr, emu_thread, &args[i]), 0);
    }
    for (int i = 0; i < KVF_ATTN_TILE_THREADS; ++i) {
        pthread_join(th[i], NULL);
    }
    pthread_attr_destroy(&attr);
    pthread_barrier_destroy(&emu_bar);
    for (int w = 0; w < KVF_ATTN_TILE_THREADS / 32; ++w) {
        pthread_barrier_destroy(&emu_warp_bar[w]);
    }
    free(emu_dyn);
}

/*
 * The per-token kernel's arithmetic for query (t, qh), split y, serially: into o[hd]
 * (splits == 1: out = acc / l) or *m, *l, acc (the partials).
 */
static void pertoken_ref(const kvf_cuda_kv *g, const float *qv, const int32_t *table,
                         int limit, int qh, int kh, int y, int splits, float scale, float *m_p,
                         float *l_p, float *acc, float *o)
{
    const int hd = g->head_dim, kbs = g->kbs;
    float m = -INFINITY, l = 0.0f, *sc = malloc((size_t)kbs * sizeof(float));
    const int lo = kvf_attn_window_lo(limit, g->window);
    int kb0, kb1;
    assert_non_null(sc);
    kvf_attn_split_range(limit, lo, kbs, y, &kb0, &kb1);
    for (int d = 0; d < hd; ++d) {
        acc[d] = 0.0f;
    }
    for (int kb = kb0; kb < kb1; ++kb) {
        const int token0 = kb * kbs;
        const char *kt = kvf_cuda_run(g, table, token0, 0, kh);
        const char *vt = kvf_cuda_run(g, table, token0, 1, kh);
        float m_new = m;
        for (int j = 0; j < kbs; ++j) {
            float dot = 0.0f;
            if (kvf_attn_unmasked(token0 + j, lo, limit)) {
                for (int d = 0; d < hd; ++d) {
                    dot = fmaf(qv[d], kvf_hd_load(kt, g->dtype, (size_t)j * hd + d), dot);
                }
            }
            sc[j] = kvf_attn_softcap(emu_mul(dot, scale), g->softcap);
            if (kvf_attn_unmasked(token0 + j, lo, limit) && (sc[j] > m_new)) {
                m_new = sc[j];
            }
        }
        const float alpha = expf(m - m_new);
        float lsum = 0.0f;
        for (int j = 0; j < kbs; ++j) {
            sc[j] = kvf_attn_prob(sc[j], token0, (size_t)j, lo, limit, m_new);
            lsum = emu_add(lsum, sc[j]);
        }
        l = fmaf(l, alpha, lsum);
        for (int d = 0; d < hd; ++d) {
            acc[d] = emu_mul(acc[d], alpha);
            for (int j = 0; j < kbs; ++j) {
                acc[d] = fmaf(sc[j], kvf_hd_load(vt, g->dtype, (size_t)j * hd + d), acc[d]);
            }
        }
        m = m_new;
    }
    if ((splits == 1) && (g->sinks != NULL)) {   /* out = acc * kvf_attn_sink_factor */
        const float f = kvf_attn_sink_factor(m, l, g->sinks[qh]);
        for (int d = 0; d < hd; ++d) {
            o[d] = emu_mul(acc[d], f);
        }
    } else if (splits == 1) {
        for (int d = 0; d < hd; ++d) {
            o[d] = emu_div(acc[d], l);
        }
    }
    *m_p = m;
    *l_p = l;
    free(sc);
}

typedef struct ecase {
    kvf_dtype_t dt;
    int q_heads, kv_heads, hd, kbs, block_size, num_seqs;   /* num_seqs 0: one table */
    int rows[4], pos0[4];
    int scattered;   /* positions drawn at random below pos0 + rows instead of consecutive */
    int stale_nan;   /* the pool is NaN bytes but for the rows' own K/V */
    int window;      /* kvf_paged_kv_t.window (0: full causal) */
    int sinks;       /* kvf_paged_kv_t.sinks: gpt-oss's sink per query head (some above
                      * every score) */
    int layout;      /* kvf_paged_kv_t.layout (kvf_kv_layout.h); 0: layer-major */
} ecase_t;

/* kvf_paged_kv_t.softcap of every case run_case() runs (gemma2's score softcap; 0: none) */
static float emu_softcap;

/* Each request's blocks: distinct pool blocks, in reverse (tables are not identity); each
 * row's position (drawn when the case scatters them) and request. Returns the largest
 * position. */
static int fill_tables(const ecase_t *c, kvf_test_rng_t *r, int nseq, const int *nb, int maxb,
                       int nblocks, int32_t *tables, int32_t *pos, int32_t *tok_seq)
{
    int max_pos = 0;

    for (int i = 0, o = 0, b = nblocks + 1; i < nseq; ++i) {
        for (int j = 0; j < nb[i]; ++j) {
            tables[(size_t)i * maxb + j] = b--;
        }
        for (int t = 0; t < c->rows[i]; ++t, ++o) {
            pos[o] = c->scattered ? (int)kvf_test_rand(r, 0.0f, (float)(c->pos0[i] + t + 1))
                                  : c->pos0[i] + t;
            tok_seq[o] = i;
            max_pos = (pos[o] > max_pos) ? pos[o] : max_pos;
        }
    }
    return max_pos;
}

/* Every output of launch @L (@T tokens of case @c) against the per-token kernel's arithmetic
 * written serially, bit for bit (@racc, @ro: head_dim floats of scratch); adds the NaN values
 * seen to @nan_p. Returns the number of values compared. */
static size_t compare_pertoken(const ecase_t *c, const emu_launch_t *L, const int32_t *tables,
                               const int32_t *tok_seq, int T, float *racc, float *ro,
                               size_t *nan_p)
{
    const int hd = c->hd, group = c->q_heads / c->kv_heads, splits = L->splits;
    const int maxb = L->maxb;
    const size_t ldq = (size_t)L->ldq;
    const int32_t *pos = L->positions;
    const float *q = L->q, *out = L->out, *pm = L->pm, *pl = L->pl, *pacc = L->pacc;
    size_t compared = 0;

    for (int t = 0; t < T; ++t) {
        const int32_t *table = tables + (size_t)((c->num_seqs == 0) ? 0 : tok_seq[t]) * maxb;
        for (int qh = 0; qh < c->q_heads; ++qh) {
            const size_t row = (size_t)t * c->q_heads + qh;
            for (int y = 0; y < splits; ++y) {
                float m, l;
                pertoken_ref(&L->g, q + (size_t)t * ldq + (size_t)qh * hd, table, pos[t],
                             qh, qh / group, y, splits, L->scale, &m, &l, racc, ro);
                const size_t pi = row * splits + y;
                if (splits == 1) {
                    if (memcmp(ro, out + row * hd, (size_t)hd * 4) != 0) {
                        fail_msg("out of row %d head %d differs (first %.9g vs %.9g)", t, qh,
                                 (double)ro[0], (double)out[row * hd]);
                    }
                    *nan_p += kvf_test_count_nan(ro, (size_t)hd);
                } else if ((memcmp(&m, pm + pi, 4) != 0) || (memcmp(&l, pl + pi, 4) != 0) ||
                           (memcmp(racc, pacc + pi * hd, (size_t)hd * 4) != 0)) {
                    fail_msg("partials of row %d head %d split %d differ (m %.9g vs %.9g, "
                             "l %.9g vs %.9g)", t, qh, y, (double)m, (double)pm[pi], (double)l,
                             (double)pl[pi]);
                } else {
                    *nan_p += kvf_test_count_nan(racc, (size_t)hd);
                }
                compared += (size_t)hd + 2;
            }
        }
    }
    return compared;
}

/* 16 attention sinks, every third far above any score */
static const float *fill_sinks(kvf_test_rng_t *r, float *sinks)
{
    for (int h = 0; h < 16; ++h) {
        sinks[h] = (h % 3 == 1) ? 30.0f : kvf_test_rand(r, -2.0f, 2.0f);
    }
    return sinks;
}

/* both sides on one case; returns the number of values compared */
static size_t run_case(const ecase_t *c, uint64_t seed)
{
    kvf_test_rng_t r = {seed};
    const int nseq = (c->num_seqs == 0) ? 1 : c->num_seqs, hd = c->hd;
    const int group = c->q_heads / c->kv_heads;
    int T = 0, maxb = 1, nblocks = 0, nb[4], max_pos = 0;

    for (int i = 0; i < nseq; ++i) {
        T += c->rows[i];
        nb[i] = (c->pos0[i] + c->rows[i] - 1) / c->block_size + 1;
        nblocks += nb[i];
        maxb = (nb[i] > maxb) ? nb[i] : maxb;
    }
    kvf_paged_kv_t kv;
    memset(&kv, 0, sizeof(kv));
    kv.slots = 2;
    kv.slot = 1;
    kv.dtype = c->dt;
    kv.kv_heads = c->kv_heads;
    kv.head_dim = hd;
    kv.block_size = c->block_size;
    kv.kernel_block_size = c->kbs;
    kv.layout = c->layout;
    kv.page_size = (size_t)(c->block_size / c->kbs) * kvf_paged_kv_kernel_block_bytes(&kv) + 64;
    const size_t pool_bytes = (size_t)(nblocks + 2) * 2 * kv.page_size;
    const size_t elt = kvf_dtype_size(c->dt);
    unsigned char *pool = malloc(pool_bytes);
    int32_t *tables = calloc((size_t)nseq * maxb, sizeof(int32_t));
    int32_t *pos = malloc((size_t)T * sizeof(int32_t)), *tok_seq = malloc((size_t)T * 4);
    const size_t ldq = (size_t)c->q_heads * hd, ld = (size_t)c->kv_heads * hd;
    float *q = malloc((size_t)T * ldq * 4), *kv_rows = malloc((size_t)T * ld * 4);
    assert_non_null(pool);
    assert_non_null(tables);
    assert_non_null(pos);
    assert_non_null(tok_seq);
    assert_non_null(q);
    assert_non_null(kv_rows);
    if (c->stale_nan) {
        memset(pool, 0xff, pool_bytes);
    } else {
        for (size_t i = 0; i < pool_bytes / elt; ++i) {
            kvf_dtype_store(pool, c->dt, i, kvf_test_rand(&r, -1.0f, 1.0f));
        }
    }
    max_pos = fill_tables(c, &r, nseq, nb, maxb, nblocks, tables, pos, tok_seq);
    kvf_test_fill(&r, q, (size_t)T * ldq, -2.0f, 2.0f);
    kvf_test_fill(&r, kv_rows, (size_t)T * ld, -1.0f, 1.0f);
    if (c->stale_nan) {   /* the rows' own K and V written: the rest stays NaN */
        for (int i = 0, o = 0; i < nseq; ++i) {
            kvf_paged_kv_t one = kv;
            one.base = pool;
            one.block_table = tables + (size_t)i * maxb;
            one.num_blocks = nb[i];
            assert_int_equal(kvf_attn_cache_write(NULL, &one, kv_rows + (size_t)o * ld,
                                                  kv_rows + (size_t)o * ld, (int)ld, pos + o,
                                                  c->rows[i]), KVF_KERN_OK);
            o += c->rows[i];
        }
    }
    kv.base = pool;
    kv.block_table = tables;
    kv.num_blocks = maxb;
    kv.window = c->window;
    float sinks[16];
    kv.sinks = c->sinks ? fill_sinks(&r, sinks) : NULL;
    kv.softcap = emu_softcap;
    const kvf_cuda_kv g = kvf_cuda_kv_of(&kv, tables);
    const int splits = kvf_attn_split_count(max_pos / c->kbs + 1, c->kbs);
    const int qt = kvf_attn_tile_queries(hd, c->kbs);
    const size_t nq = (size_t)T * c->q_heads;
    int seq_tokens[4];
    for (int i = 0; i < nseq; ++i) {
        seq_tokens[i] = c->rows[i];
    }
    const int ntiles = kvf_attn_tile_count(seq_tokens, nseq, group, qt);
    int32_t *tiles = malloc((size_t)ntiles * 2 * sizeof(int32_t));
    float *out = malloc(nq * hd * 4), *pm = malloc(nq * splits * 4);
    float *pl = malloc(nq * splits * 4), *pacc = malloc(nq * splits * hd * 4);
    float *racc = malloc((size_t)hd * 4), *ro = malloc((size_t)hd * 4);
    assert_non_null(tiles);
    assert_non_null(out);
    assert_non_null(pm);
    assert_non_null(pl);
    assert_non_null(pacc);
    assert_non_null(racc);
    assert_non_null(ro);
    memset(out, 0xfe, nq * hd * 4);   /* not NaN-free garbage: every value must be written */
    memset(pm, 0xfe, nq * splits * 4);
    memset(pl, 0xfe, nq * splits * 4);
    memset(pacc, 0xfe, nq * splits * hd * 4);
    assert_int_equal(kvf_attn_tile_plan(seq_tokens, nseq, group, qt, tiles), ntiles);

    emu_launch_t L = {g, q, (int)ldq, c->q_heads, maxb, qt, ntiles, splits, pos,
                      (c->num_seqs == 0) ? NULL : tok_seq, tiles, 1.0f / sqrtf((float)hd),
                      out, pm, pl, pacc};
    emu_run(&L);

    size_t nan_out = 0;
    const size_t compared = compare_pertoken(c, &L, tables, tok_seq, T, racc, ro, &nan_out);
    /* a stale pool must poison the rows whose last kernel block holds unwritten slots */
    if (c->stale_nan) {
        assert_true(nan_out > 0);
    } else {
        assert_int_equal(nan_out, 0);
    }
    free(pool);
    free(tables);
    free(pos);
    free(tok_seq);
    free(q);
    free(kv_rows);
    free(tiles);
    free(out);
    free(pm);
    free(pl);
    free(pacc);
    free(racc);
    free(ro);
    return compared;
}

/* prefill chunks, one table: fp32 kbs 16 from 0; bf16 kbs 48 (rows staged in two passes)
 * mid-context with 5 query heads per KV head; fp16 head_dim 80, scattered positions;
 * head_dim 128 and 256 */
static void test_tiled_emu_prefill(void **state)
{
    static const ecase_t cases[] = {
        {KVF_DTYPE_FP32, 8, 2, 32, 16, 32, 0, {40}, {0}, 0, 0, 0, 0, 0},
        {KVF_DTYPE_BF16, 10, 2, 32, 48, 96, 0, {21}, {100}, 0, 0, 0, 0, 0},
        {KVF_DTYPE_FP16, 3, 1, 80, 16, 16, 0, {9}, {60}, 1, 0, 0, 0, 0},
        {KVF_DTYPE_BF16, 10, 2, 128, 16, 64, 0, {7}, {40}, 0, 0, 0, 0, 0},  /* 9B's hd, GQA 5 */
        {KVF_DTYPE_FP32, 4, 2, 256, 64, 64, 0, {5}, {70}, 0, 0, 0, 0, 0},    /* passes of 8 rows */
    };
    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); ++i) {
        assert_true(run_case(&cases[i], 0x1234 + i) > 0);
    }
}

/* a batch of requests with their own tables, long enough for split-K (kbs 256: ranges of 8
 * kernel blocks), decode rows and a prefill row run together */
static void test_tiled_emu_split(void **state)
{
    static const ecase_t c = {KVF_DTYPE_FP16, 4, 2, 32, 256, 256, 3, {1, 1, 3}, {5000, 100,
                              2300}, 0, 0, 0, 0, 0};
    (void)state;
    assert_true(run_case(&c, 0x777) > 0);
}

/* stale NaN bytes in the unwritten slots of the rows' last kernel blocks: the same NaN on
 * both sides (masked slots meet V as 0 * v) */
static void test_tiled_emu_stale_nan(void **state)
{
    static const ecase_t c = {KVF_DTYPE_FP32, 4, 1, 32, 16, 32, 0, {21}, {0}, 0, 1, 0, 0, 0};
    (void)state;
    assert_true(run_case(&c, 0x99) > 0);
}

/* a sliding window (kvf_paged_kv_t.window): a prefill chunk whose rows' windows start in
 * different kernel blocks, and a batch with split-K decode rows far past the window */
static void test_tiled_emu_window(void **state)
{
    static const ecase_t p = {KVF_DTYPE_BF16, 8, 2, 32, 16, 32, 0, {40}, {70}, 0, 0, 37, 0, 0};
    static const ecase_t d = {KVF_DTYPE_FP16, 4, 2, 32, 256, 256, 3, {1, 1, 3}, {5000, 100,
                              2300}, 0, 0, 700, 0, 0};
    (void)state;
    assert_true(run_case(&p, 0x3131) > 0);
    assert_true(run_case(&d, 0x3232) > 0);
}

/* gpt-oss's attention sinks: a prefill chunk under a window and split-K decodes (their
 * partials: the merge applies the sink) */
/* the head-major block layout (kvf_kv_layout.h): both kernels' twins address K/V through
 * the same strides; a prefill chunk, split-K decode rows, and stale NaN bytes */
static void test_tiled_emu_head_major(void **state)
{
    static const ecase_t cases[] = {
        {KVF_DTYPE_BF16, 10, 2, 32, 48, 96, 0, {21}, {100}, 0, 0, 0, 0, KVF_KV_HEAD_MAJOR},
        {KVF_DTYPE_FP16, 4, 2, 32, 256, 256, 3, {1, 1, 3}, {5000, 100, 2300}, 0, 0, 0, 0,
         KVF_KV_HEAD_MAJOR},
        {KVF_DTYPE_FP32, 4, 1, 32, 16, 32, 0, {21}, {0}, 0, 1, 0, 0, KVF_KV_HEAD_MAJOR},
    };
    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); ++i) {
        assert_true(run_case(&cases[i], 0x4242 + i) > 0);
    }
}

static void test_tiled_emu_sinks(void **state)
{
    static const ecase_t p = {KVF_DTYPE_FP32, 8, 2, 32, 16, 32, 0, {40}, {70}, 0, 0, 37, 1, 0};
    static const ecase_t f = {KVF_DTYPE_BF16, 6, 2, 32, 16, 32, 0, {21}, {100}, 0, 0, 0, 1, 0};
    static const ecase_t d = {KVF_DTYPE_FP16, 4, 2, 32, 256, 256, 3, {1, 1, 3}, {5000, 100,
                              2300}, 0, 0, 0, 1, 0};
    (void)state;
    assert_true(run_case(&p, 0x5151) > 0);
    assert_true(run_case(&f, 0x5252) > 0);
    assert_true(run_case(&d, 0x5353) > 0);
}

/* gemma2's score softcap (0.75 binds on these scores): a prefill chunk under a window, a
 * full-attention chunk and split-K decodes */
static void test_tiled_emu_softcap(void **state)
{
    static const ecase_t p = {KVF_DTYPE_FP32, 8, 2, 32, 16, 32, 0, {40}, {70}, 0, 0, 37, 0, 0};
    static const ecase_t f = {KVF_DTYPE_BF16, 6, 2, 32, 16, 32, 0, {21}, {100}, 0, 0, 0, 0, 0};
    static const ecase_t d = {KVF_DTYPE_FP16, 4, 2, 32, 256, 256, 3, {1, 1, 3}, {5000, 100,
                              2300}, 0, 0, 0, 0, 0};
    (void)state;
    emu_softcap = 0.75f;
    assert_true(run_case(&p, 0x6161) > 0);
    assert_true(run_case(&f, 0x6262) > 0);
    assert_true(run_case(&d, 0x6363) > 0);
    emu_softcap = 0.0f;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiled_emu_prefill),
        cmocka_unit_test(test_tiled_emu_split),
        cmocka_unit_test(test_tiled_emu_stale_nan),
        cmocka_unit_test(test_tiled_emu_window),
        cmocka_unit_test(test_tiled_emu_sinks),
        cmocka_unit_test(test_tiled_emu_softcap),
        cmocka_unit_test(test_tiled_emu_head_major),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
