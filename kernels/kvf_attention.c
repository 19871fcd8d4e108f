/*
 * Paged causal GQA attention on the CPU, written the way GPU paged-attention
 * kernels work so that it has their failure modes.
 *
 * Design: for each query token and KV head, walk the request's kernel blocks
 * in order, load one whole kernel block of K and V (all kernel_block_size
 * slots, written or not) into fp32 tiles, and fold it into an online softmax
 * (FlashAttention style: running max m, denominator l, accumulator acc,
 * rescaled by exp(m_old - m_new) per tile). Slots past the query's causal
 * limit get probability 0, selected as a GPU kernel selects -inf for a
 * masked score, and still enter the value sum: acc += 0 * v. A GPU kernel
 * does the same (the whole V tile goes through the P.V product), which is
 * why a stale NaN/Inf in an unwritten slot of a recycled block poisons the
 * output. This must stay: tests use it to prove that kvf_blocks_zero is
 * what fixes it. The running max only looks at unmasked scores (as
 * -inf-masked max does). The probability is selected, not multiplied by 0
 * after the exp: a masked slot's score (0 for a zeroed slot) can exceed the
 * running max by more than exp's range when every real score is very
 * negative, and 0 * inf would be NaN on correct data.
 *
 * Calls with ascending positions (every chunk the model runs) take the
 * blocked path, kvf_attn_paged_blocked below: per KV head its K and V
 * converted to fp32 once, whole kernel blocks, then FlashAttention-style
 * blocks of query rows against key tiles of several kernel blocks, the
 * Q K^T and P V tile products in kvferry's fixed-order product
 * (kvf_gemm_cpu_nn: every score is one FMA chain over head dims, every value
 * sum one over the tile's slots, whatever the number of rows) around the
 * same shared fold step (kvf_attn_tile_probs);
 * other calls the per-query fold of kvf_attn_fold_tile. A query row's bits
 * depend on its own q, position and the cache alone: never on the other
 * rows of the call, so neither on the chunking nor on the batch (a decode
 * token gives the bits it would give inside any prompt chunk). The blocked
 * and per-query paths agree to fp32 rounding, not bit for bit.
 * The fp32 copy of a head's K/V is per call and covers whole kernel blocks,
 * so it hides no stale slot; it costs O(tokens * head_dim) against the
 * O(queries * tokens * head_dim) products.
 */
#include "kvf_attention.h"
#include "kvf_attention_math.h"
#include "kvf_kern_internal.h"
#ifdef KVF_HAVE_CUDA
#include "kvf_device_cuda.h"
#endif

#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

size_t kvf_paged_kv_kernel_block_bytes(const kvf_paged_kv_t *kv)
{
    return 2u * (size_t)kv->kv_heads * (size_t)kv->kernel_block_size * (size_t)kv->head_dim *
           kvf_dtype_size(kv->dtype);
}

kvf_kv_strides_t kvf_paged_kv_strides(const kvf_paged_kv_t *kv)
{
    return kvf_kv_strides_make(kv->layout, kv->slots, kv->page_size,
                               kv->block_size / kv->kernel_block_size, kv->kv_heads,
                               kv->kernel_block_size, kv->head_dim, kvf_dtype_size(kv->dtype));
}

int kvf_paged_kv_check(const kvf_paged_kv_t *kv)
{
    if ((kv == NULL) || (kv->base == NULL) || (kv->page_size == 0) || (kv->slots <= 0) ||
        (kv->slot < 0) || (kv->slot >= kv->slots) || !kvf_kern_cache_dtype_ok(kv->dtype) ||
        (kv->kv_heads <= 0) || (kv->head_dim <= 0) || (kv->block_size <= 0) ||
        (kv->kernel_block_size <= 0) || ((kv->block_size % kv->kernel_block_size) != 0) ||
        (kv->num_blocks < 0) || ((kv->num_blocks > 0) && (kv->block_table == NULL)) ||
        (kv->window < 0) || (kv->layout < 0) || (kv->layout >= KVF_KV_LAYOUT_COUNT)) {
        return KVF_KERN_EINVAL;
    }
    size_t ppl = (size_t)(kv->block_size / kv->kernel_block_size);
    if (ppl * kvf_paged_kv_kernel_block_bytes(kv) > kv->page_size) {
        return KVF_KERN_EINVAL;
    }
    return KVF_KERN_OK;
}

/* Start of the run (K/V @a is_v, head @a h) of the kernel block holding token position @a pos
 * (validated): kbs rows of head_dim elements. */
static inline char *kvf_attn_run(const kvf_paged_kv_t *kv, const kvf_kv_strides_t *st, int pos,
                                 int is_v, size_t h)
{
    return (char *)kv->base + kvf_kv_pos_run_off(st, kv->block_table, kv->block_size,
                                                 kv->kernel_block_size, kv->slot, pos, is_v,
                                                 (int)h);
}

static int kvf_attn_check_positions(const kvf_paged_kv_t *kv, const int32_t *positions, int n)
{
    long limit = (long)kv->num_blocks * (long)kv->block_size;
    for (int t = 0; t < n; ++t) {
        if ((positions[t] < 0) || ((long)positions[t] >= limit)) {
            return KVF_KERN_EINVAL;
        }
    }
    /* every block a query may touch: [0, max position] */
    for (int t = 0; t < n; ++t) {
        for (int b = 0; b <= positions[t] / kv->block_size; ++b) {
            if (kv->block_table[b] < 0) {
                return KVF_KERN_EINVAL;
            }
        }
    }
    return KVF_KERN_OK;
}

int kvf_attn_cache_write(const kvf_device_t *dev, const kvf_paged_kv_t *kv, const float *k,
                         const float *v, int ld, const int32_t *positions, int num_tokens)
{
    int err = kvf_paged_kv_check(kv);
    kvf_kv_strides_t st;
    size_t hd, elt_heads;

    if ((err != KVF_KERN_OK) || (num_tokens < 0) || (ld < kv->kv_heads * kv->head_dim)) {
        return KVF_KERN_EINVAL;
    }
    if (num_tokens == 0) {
        return KVF_KERN_OK;
    }
    if ((k == NULL) || (v == NULL) || (positions == NULL)) {
        return KVF_KERN_EINVAL;
    }
    err = kvf_attn_check_positions(kv, positions, num_tokens);
    if (err != KVF_KERN_OK) {
        return err;
    }
    if (!kvf_kern_on_cpu(dev)) {
#ifdef KVF_HAVE_CUDA
        return kvf_cuda_attn_cache_write(dev, kv, k, v, ld, positions, num_tokens);
#else
        return KVF_KERN_EUNSUPPORTED;
#endif
    }
    st = kvf_paged_kv_strides(kv);
    hd = (size_t)kv->head_dim;
    elt_heads = (size_t)kv->kv_heads;
    for (int t = 0; t < num_tokens; ++t) {
        size_t first = (size_t)(positions[t] % kv->kernel_block_size) * hd;
        for (size_t h = 0; h < elt_heads; ++h) {
            kvf_kern_store(kvf_attn_run(kv, &st, positions[t], 0, h), kv->dtype, first, hd,
                           k + (size_t)t * (size_t)ld + h * hd);
            kvf_kern_store(kvf_attn_run(kv, &st, positions[t], 1, h), kv->dtype, first, hd,
                           v + (size_t)t * (size_t)ld + h * hd);
        }
    }
    return KVF_KERN_OK;
}

/* One (query, head)'s output: acc / l, or under head @a qh's attention sink acc * f
 * (kvf_attn_sink_factor). */
static void kvf_attn_finish_head(const float *acc, float m, float l, const float *sinks,
                                 size_t qh, size_t hd, float *o)
{
    if (sinks == NULL) {
        kvf_attn_finish(acc, l, hd, o);
        return;
    }
    const float f = kvf_attn_sink_factor(m, l, sinks[qh]);
    for (size_t d = 0; d < hd; ++d) {
        o[d] = acc[d] * f;
    }
}

/* Key tokens of one CPU tile: whole kernel blocks, about this many (at
 * least one kernel block). The online softmax rescales once per tile; tile
 * bounds depend on the kernel block size alone, never on the call. */
#define KVF_ATTN_CPU_TILE 64
/* Query rows (token, GQA head) of one CPU block: as many as keep a tile
 * product (rows x tile x head_dim) below 2^18 multiply-adds, 16 to 128, so
 * that their scores and accumulators stay in cache while the key tiles
 * stream past. Where even 16 rows would not fit (a kernel block of more than
 * 256 tokens at head_dim 64), 64 rows. A row's bits depend on neither, nor
 * on the thread that runs its block (kvf_gemm_cpu_nn). */
#define KVF_ATTN_CPU_MNK ((1u << 18) - 1)
#define KVF_ATTN_CPU_QROWS_MIN 16
#define KVF_ATTN_CPU_QROWS_MAX 128

/* One KV head's work of the blocked path (values; scratch owned by the caller). */
typedef struct kvf_attn_cpu {
    const float   *kt;          /* fp32 [hd][ntok]: this head's K transposed, whole kernel
                                   blocks (a score is one FMA chain over head dims) */
    const float   *vf;          /* fp32 [ntok][hd]: its V */
    size_t         ntok;
    size_t         t0;          /* token of kt/vf column 0: a multiple of tw (0 without a
                                   window; under one, the first row's first tile) */
    int            window;      /* kvf_paged_kv_t.window */
    const float   *Q;           /* fp32 [nq][hd]: the GQA group's query rows, packed */
    const int32_t *positions;   /* of query row i: positions[i / group] */
    size_t         hd, group, kbs, tw, qr;   /* qr: rows of a query block */
    float          scale, cap;   /* cap: kvf_paged_kv_t.softcap */
    float         *S, *acc, *m, *l;   /* [qr][tw], [qr][hd], [qr], [qr] */
} kvf_attn_cpu_t;

/* Slots of the tile starting at token j0 that query row i reads: up to the
 * end of its own kernel block, at most the tile. */
static inline size_t kvf_attn_row_width(const kvf_attn_cpu_t *c, size_t i, size_t j0)
{
    size_t own = ((size_t)c->positions[i / c->group] / c->kbs + 1) * c->kbs - j0;
    return (own < c->tw) ? own : c->tw;
}

/*
 * Query rows [r0, r1) against every key tile they reach. Per tile, one GEMM
 * gives the scaled scores of all rows reaching it (rows whose limit is below
 * the tile start read nothing of it), up to the widest row's own kernel
 * block; the shared online-softmax step kvf_attn_tile_probs turns each row's
 * own width into probabilities (masked slots selected as 0); then one GEMM
 * per run of rows of equal width adds P V, so a row's value sum takes
 * exactly the slots up to the end of its own kernel block, written or not:
 * a stale NaN/Inf there poisons it (0 * v), one in a later kernel block
 * does not, as in the per-query fold.
 */
static inline int kvf_attn_row_lo(const kvf_attn_cpu_t *c, size_t i)
{
    return kvf_attn_window_lo(c->positions[i / c->group], c->window);
}

static void kvf_attn_cpu_qblock(const kvf_attn_cpu_t *c, size_t r0, size_t r1)
{
    const size_t hd = c->hd, tw = c->tw;
    const int last = c->positions[(r1 - 1) / c->group];
    size_t a = r0;
    /* tiles at multiples of tw from token 0 whatever the window, so a row's folds (and
     * bits) do not depend on the chunk it runs in */
    const size_t first = ((size_t)kvf_attn_row_lo(c, r0) / tw) * tw;

    for (size_t i = 0; i < r1 - r0; ++i) {
        c->m[i] = -INFINITY;
        c->l[i] = 0.0f;
    }
    memset(c->acc, 0, (r1 - r0) * hd * sizeof(float));
    for (size_t j0 = first; (int)j0 <= last; j0 += tw) {
        size_t b = r1;
        while (c->positions[a / c->group] < (int)j0) {
            ++a;   /* tile entirely in this row's future: not read */
        }
        while ((b > a) && ((size_t)kvf_attn_row_lo(c, b - 1) >= j0 + tw)) {
            --b;   /* tile entirely before this row's window: not read */
        }
        if (b == a) {
            continue;
        }
        const size_t wmax = kvf_attn_row_width(c, b - 1, j0);
        (void)kvf_gemm_cpu_nn((int)(b - a), (int)wmax, (int)hd, c->scale, c->Q + a * hd, hd,
                              c->kt + (j0 - c->t0), c->ntok, 0.0f, c->S + (a - r0) * tw, tw);
        for (size_t s0 = a, s1; s0 < b; s0 = s1) {
            const size_t w = kvf_attn_row_width(c, s0, j0);
            for (s1 = s0; (s1 < b) && (kvf_attn_row_width(c, s1, j0) == w); ++s1) {
                float *arow = c->acc + (s1 - r0) * hd;
                const float alpha = kvf_attn_tile_probs(c->S + (s1 - r0) * tw, w, (int)j0,
                                                        kvf_attn_row_lo(c, s1),
                                                        c->positions[s1 / c->group], c->cap,
                                                        &c->m[s1 - r0], &c->l[s1 - r0]);
                for (size_t d = 0; d < hd; ++d) {
                    arow[d] *= alpha;
                }
            }
            (void)kvf_gemm_cpu_nn((int)(s1 - s0), (int)hd, (int)w, 1.0f, c->S + (s0 - r0) * tw,
                                  tw, c->vf + (j0 - c->t0) * hd, hd, 1.0f,
                                  c->acc + (s0 - r0) * hd, hd);
        }
    }
}

/* One kvf_kern_parallel() job: the query blocks of one KV head, dealt out
 * round robin (causal blocks grow with their position) over parts that
 * each have their own score and accumulator scratch. */
typedef struct kvf_attn_cpu_job {
    kvf_attn_cpu_t c;           /* shared fields; S/acc/m/l: part 0's scratch */
    size_t         nq, q_heads, kh, scratch_part;   /* floats of scratch a part */
    const float   *sinks;       /* kvf_paged_kv_t.sinks */
    float         *out;
} kvf_attn_cpu_job_t;

static int kvf_attn_cpu_part(void *ctx, int part, int parts)
{
    const kvf_attn_cpu_job_t *j = ctx;
    const size_t hd = j->c.hd, group = j->c.group, qr = j->c.qr;
    kvf_attn_cpu_t c = j->c;

    c.S += (size_t)part * j->scratch_part;
    c.acc += (size_t)part * j->scratch_part;
    c.m += (size_t)part * j->scratch_part;
    c.l += (size_t)part * j->scratch_part;
    for (size_t r0 = (size_t)part * qr; r0 < j->nq; r0 += (size_t)parts * qr) {
        const size_t r1 = (j->nq - r0 < qr) ? j->nq : r0 + qr;
        kvf_attn_cpu_qblock(&c, r0, r1);
        for (size_t i = r0; i < r1; ++i) {
            const size_t qh = j->kh * group + i % group;
            kvf_attn_finish_head(c.acc + (i - r0) * hd, c.m[i - r0], c.l[i - r0], j->sinks, qh,
                                 hd, j->out + (i / group) * j->q_heads * hd + qh * hd);
        }
    }
    return KVF_KERN_OK;
}

/*
 * Blocked CPU attention for ascending positions (every chunk the model runs),
 * FlashAttention-style with the fixed-order product for the tiles: per KV
 * head, its K (transposed) and V for every kernel block up to the one holding
 * the last position are converted to fp32 once (each kernel block whole,
 * written slots or not), the
 * GQA group's query rows packed as Q[nq][hd], and blocks of rows run
 * against the key tiles (kvf_attn_cpu_qblock),
 * on kvf_kern_cpu_threads() threads when there are at least two blocks
 * (each row's arithmetic is the same on any thread). The stale-slot
 * poisoning is the per-query fold's (tests/common/cache/test_page_pool_nan.c);
 * the result matches it to fp32 rounding, and a chunk matches the same
 * tokens one by one bit for bit.
 */
static int kvf_attn_paged_blocked(const kvf_paged_kv_t *kv, const float *q, int ldq,
                                  const int32_t *positions, int num_tokens, int q_heads,
                                  float scale, float *out)
{
    const size_t hd = (size_t)kv->head_dim, kbs = (size_t)kv->kernel_block_size;
    const size_t nkv = (size_t)kv->kv_heads, group = (size_t)q_heads / nkv;
    const size_t tw = ((kbs < KVF_ATTN_CPU_TILE) ? KVF_ATTN_CPU_TILE / kbs : 1) * kbs;
    const size_t fit = KVF_ATTN_CPU_MNK / (tw * hd), nq = (size_t)num_tokens * group;
    const bool small = (fit >= KVF_ATTN_CPU_QROWS_MIN);
    const size_t qr = !small ? 64 : (fit < KVF_ATTN_CPU_QROWS_MAX) ? fit : KVF_ATTN_CPU_QROWS_MAX;
    const kvf_kv_strides_t st = kvf_paged_kv_strides(kv);
    /* under a sliding window only the tiles from the first row's window on are read */
    const size_t t0 = ((size_t)kvf_attn_window_lo(positions[0], kv->window) / tw) * tw;
    const size_t kb0 = t0 / kbs, nkb = (size_t)positions[num_tokens - 1] / kbs + 1;
    const size_t ntok = (nkb - kb0) * kbs;
    const size_t nblk = (nq + qr - 1) / qr, per = qr * (tw + hd + 2);
    const int th = kvf_kern_cpu_threads();
    const int parts = (th < 2) ? 1 : ((size_t)th < nblk) ? th : (int)nblk;
    float *scratch, *kt, *vf, *kb, *Q;
    kvf_attn_cpu_job_t j = {.c = {.positions = positions, .hd = hd, .group = group,
                                  .kbs = kbs, .tw = tw, .qr = qr, .scale = scale,
                                  .cap = kv->softcap, .t0 = t0,
                                  .window = kv->window},
                            .nq = nq, .q_heads = (size_t)q_heads, .scratch_part = per,
                            .sinks = kv->sinks, .out = out};
    int rc = KVF_KERN_OK;

    scratch = malloc((2 * ntok * hd + kbs * hd + nq * hd + (size_t)parts * per) * sizeof(float));
    if (scratch == NULL) {
        return KVF_KERN_ENOMEM;
    }
    kt = scratch;
    vf = kt + ntok * hd;
    kb = vf + ntok * hd;
    Q = kb + kbs * hd;
    j.c.kt = kt;
    j.c.vf = vf;
    j.c.ntok = ntok;
    j.c.Q = Q;
    j.c.S = Q + nq * hd;                 /* part p: S, acc, m, l at + p * per */
    j.c.acc = j.c.S + qr * tw;
    j.c.m = j.c.acc + qr * hd;
    j.c.l = j.c.m + qr;
    for (size_t kh = 0; (kh < nkv) && (rc == KVF_KERN_OK); ++kh) {
        for (size_t b = kb0; b < nkb; ++b) {
            const size_t c0 = (b - kb0) * kbs;   /* this kernel block's first column */
            kvf_kern_load(kvf_attn_run(kv, &st, (int)(b * kbs), 0, kh), kv->dtype, 0, kbs * hd,
                          kb);
            kvf_kern_load(kvf_attn_run(kv, &st, (int)(b * kbs), 1, kh), kv->dtype, 0, kbs * hd,
                          vf + c0 * hd);
            for (size_t t = 0; t < kbs; ++t) {
                for (size_t d = 0; d < hd; ++d) {
                    kt[d * ntok + c0 + t] = kb[t * hd + d];
                }
            }
        }
        for (size_t t = 0; t < (size_t)num_tokens; ++t) {
            memcpy(Q + t * group * hd, q + t * (size_t)ldq + kh * group * hd,
                   group * hd * sizeof(float));
        }
        j.kh = kh;
        rc = (parts > 1) ? kvf_kern_parallel(parts, kvf_attn_cpu_part, &j)
                         : kvf_attn_cpu_part(&j, 0, 1);
    }
    free(scratch);
    return rc;
}

int kvf_attn_paged(const kvf_device_t *dev, const kvf_paged_kv_t *kv, const float *q, int ldq,
                   const int32_t *positions, int num_tokens, int q_heads, float scale,
                   float *out)
{
    int err = kvf_paged_kv_check(kv);
    kvf_kv_strides_t st;
    size_t hd, kbs, nkv, group, nq, nstate;
    float *scratch, *ktile, *vtile, *s, *acc, *m, *l;
    int max_pos = 0, min_lo = INT_MAX;

    if ((err != KVF_KERN_OK) || (num_tokens < 0) || (q_heads <= 0) ||
        ((q_heads % kv->kv_heads) != 0) || (ldq < q_heads * kv->head_dim)) {
        return KVF_KERN_EINVAL;
    }
    if (num_tokens == 0) {
        return KVF_KERN_OK;
    }
    if ((q == NULL) || (positions == NULL) || (out == NULL)) {
        return KVF_KERN_EINVAL;
    }
    err = kvf_attn_check_positions(kv, positions, num_tokens);
    if (err != KVF_KERN_OK) {
        return err;
    }
    if (!(scale > 0.0f)) {
        scale = 1.0f / sqrtf((float)kv->head_dim);
    }
    if (!kvf_kern_on_cpu(dev)) {
#ifdef KVF_HAVE_CUDA
        return kvf_cuda_attn_paged(dev, kv, q, ldq, positions, num_tokens, q_heads, scale, out);
#else
        return KVF_KERN_EUNSUPPORTED;
#endif
    }
    {
        bool ascending = true;
        for (int t = 1; t < num_tokens; ++t) {
            ascending = ascending && (positions[t] >= positions[t - 1]);
        }
        if (ascending) {
            return kvf_attn_paged_blocked(kv, q, ldq, positions, num_tokens, q_heads, scale, out);
        }
    }
    for (int t = 0; t < num_tokens; ++t) {
        const int lo = kvf_attn_window_lo(positions[t], kv->window);
        max_pos = (positions[t] > max_pos) ? positions[t] : max_pos;
        min_lo = (lo < min_lo) ? lo : min_lo;
    }
    st = kvf_paged_kv_strides(kv);
    hd = (size_t)kv->head_dim;
    kbs = (size_t)kv->kernel_block_size;
    nkv = (size_t)kv->kv_heads;
    group = (size_t)q_heads / nkv;
    nq = (size_t)num_tokens * group;   /* (query, head of the GQA group) pairs */
    nstate = nq * (hd + 2);

    scratch = malloc((2 * kbs * hd + kbs + nstate) * sizeof(float));
    if (scratch == NULL) {
        return KVF_KERN_ENOMEM;
    }
    ktile = scratch;
    vtile = ktile + kbs * hd;
    s = vtile + kbs * hd;
    acc = s + kbs;
    m = acc + nq * hd;
    l = m + nq;

    /* Tiles in the outer loop: each kernel block is loaded (and converted)
     * once per KV head for all queries of the call, as a GPU kernel streams
     * K/V tiles past a tile of queries. Per query the tiles still arrive in
     * ascending order, so the result does not depend on the chunking. */
    for (size_t kh = 0; kh < nkv; ++kh) {
        for (size_t i = 0; i < nq; ++i) {
            m[i] = -INFINITY;
            l[i] = 0.0f;
        }
        memset(acc, 0, nq * hd * sizeof(float));
        for (int kb = min_lo / kv->kernel_block_size; kb <= max_pos / kv->kernel_block_size;
             ++kb) {
            int token0 = kb * kv->kernel_block_size;
            /* the whole tile, written slots or not, as a GPU kernel loads it */
            kvf_kern_load(kvf_attn_run(kv, &st, token0, 0, kh), kv->dtype, 0, kbs * hd, ktile);
            kvf_kern_load(kvf_attn_run(kv, &st, token0, 1, kh), kv->dtype, 0, kbs * hd, vtile);
            for (int t = 0; t < num_tokens; ++t) {
                int limit = positions[t], lo = kvf_attn_window_lo(limit, kv->window);
                if ((limit < token0) || (lo >= token0 + (int)kbs)) {
                    continue;   /* tile entirely in this query's future or before its
                                   window: not read */
                }
                for (size_t g = 0; g < group; ++g) {
                    const float *qv = q + (size_t)t * (size_t)ldq + (kh * group + g) * hd;
                    size_t qi = (size_t)t * group + g;
                    kvf_attn_fold_tile(qv, ktile, vtile, KVF_HD_FP32, kbs, hd, token0, lo, limit,
                                       scale, kv->softcap, &m[qi], &l[qi], acc + qi * hd,
                                       s);
                }
            }
        }
        for (int t = 0; t < num_tokens; ++t) {
            for (size_t g = 0; g < group; ++g) {
                size_t qi = (size_t)t * group + g;
                float *o = out + (size_t)t * (size_t)q_heads * hd + (kh * group + g) * hd;
                kvf_attn_finish_head(acc + qi * hd, m[qi], l[qi], kv->sinks, kh * group + g, hd,
                                     o);
            }
        }
    }
    free(scratch);
    return KVF_KERN_OK;
}
