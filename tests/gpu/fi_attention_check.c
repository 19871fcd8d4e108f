/*
 * FlashInfer's paged decode and prefill on kvferry's pages (kernels/kvf_fi_decode.h,
 * kvf_fi_prefill.h; a -DKVF_FLASHINFER=ON build) on one GPU, against kvferry's own attention
 * (kvf_attn_paged) on the same bf16 cache: a Llama-3-8B-like layer (32 query heads, 8 KV
 * heads, head_dim 128), kernel blocks of 16 in blocks of 64 tokens, four requests of 1, 37,
 * 700 and 2100 tokens written by kvf_attn_cache_write.
 * - decode (one query per request, at its last position): within |fi - kvf| / (1 + |kvf|) <=
 *   2e-2 (bf16 query and output); the request of 2100 tokens (two split-KV chunks) alone and
 *   inside the batch of four gives the same output bits (the fixed split);
 * - prefill: the last 300 tokens of the 700-token request as queries, causal, within the same
 *   tolerance; alone and beside the 37-token request's prefill, the same bits.
 * One table row:
 *   | FlashInfer on kvferry pages | decode max rel | prefill max rel | batch bits | result |
 * Exit: 0 PASS, 1 FAIL, 77 no GPU, no CUDA or FlashInfer not in this build.
 */
#include "kvf_act.h"
#include "kvf_attention.h"
#include "kvf_device.h"
#include "kvf_dtype.h"
#include "kvf_fi_decode.h"
#include "kvf_fi_prefill.h"
#include "kvf_kern.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { QH = 32, KVH = 8, HD = 128, KBS = 16, BS = 64, NB = 64, NREQ = 4, PQ = 300 };
#define ROW (QH * HD)

#ifdef KVF_HAVE_CUDA
static kvf_device_t gdev;
static const int lens[NREQ] = {1, 37, 700, 2100};
static int32_t tables[NREQ][NB];
static uint64_t rng = 0x6a09e667f3bcc909ull;

static float rnd(void)
{
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return (float)((rng * 2685821657736338717ull) >> 40) / 8388608.0f - 1.0f;
}

static void *dmem(const void *h, size_t bytes)
{
    void *d = NULL;
    if ((kvf_device_alloc(&gdev, bytes, &d) != KVF_KERN_OK) ||
        ((h != NULL) && (kvf_device_memcpy(&gdev, d, h, bytes, KVF_COPY_H2D) != KVF_KERN_OK))) {
        printf("| FlashInfer on kvferry pages | device allocation or copy failed | FAIL |\n");
        exit(1);
    }
    return d;
}

static void fail_rc(const char *what, int rc)
{
    printf("| FlashInfer on kvferry pages | %s: %s | FAIL |\n", what, kvf_kern_strerror(rc));
    exit(1);
}

static kvf_paged_kv_t cache(void *pool, size_t page_size, int r)
{
    kvf_paged_kv_t kv = {pool, page_size, 1, 0, KVF_DTYPE_BF16, KVH, HD, BS, KBS,
                         tables[r], NB, 0, NULL, 0.0f, KVF_KV_LAYER_MAJOR}; /* window 0: full
                                                                       * attention; no sinks */
    return kv;
}

/* q (fp32, device) rounded to bf16 the way FlashInfer gets it, and kvferry's q the same
 * rounded values, so both see one query */
static float *round_q(float *dq, size_t n, void **bf)
{
    *bf = dmem(NULL, n * 2);
    if ((kvf_convert(&gdev, *bf, KVF_DTYPE_BF16, dq, KVF_DTYPE_FP32, n) != KVF_KERN_OK) ||
        (kvf_convert(&gdev, dq, KVF_DTYPE_FP32, *bf, KVF_DTYPE_BF16, n) != KVF_KERN_OK)) {
        fail_rc("kvf_convert", KVF_KERN_ECUDA);
    }
    return dq;
}

/* the page lists of requests @a rs (n of them), uploaded; indptr and last lengths too */
static void pages_of(const kvf_fi_geom_t *g, size_t page_size, const int *rs, const int *kvl,
                     int n, int32_t **d_idx, int32_t **d_ptr, int32_t **d_last)
{
    static int32_t idx[NREQ * NB * (BS / KBS)], ptr[NREQ + 1], last[NREQ];
    ptr[0] = 0;
    for (int i = 0; i < n; ++i) {
        int m = kvf_fi_pages(g, tables[rs[i]], BS, 1, 0, page_size, kvl[i], idx + ptr[i],
                             NB * (BS / KBS));
        if (m < 0) {
            fail_rc("kvf_fi_pages", KVF_KERN_EINVAL);
        }
        ptr[i + 1] = ptr[i] + m;
        last[i] = kvl[i] - (m - 1) * KBS;
    }
    *d_idx = dmem(idx, (size_t)ptr[n] * 4);
    *d_ptr = dmem(ptr, (size_t)(n + 1) * 4);
    *d_last = dmem(last, (size_t)n * 4);
}

/* decode of requests @a rs (their last position), FlashInfer's output as fp32 [n][ROW] */
static void fi_decode(const kvf_fi_geom_t *g, void *pool, size_t page_size, const int *rs, int n,
                      const void *qbf, float *out)
{
    kvf_fi_decode_args_t a;
    int32_t kvl[NREQ], ri[64], ti[64], oi[NREQ + 1], chunk = g->chunk_pages * g->page_tokens;
    bool valid[64];

    for (int i = 0; i < n; ++i) {
        kvl[i] = lens[rs[i]];
    }
    memset(&a, 0, sizeof(a));
    a.work = kvf_fi_decode_plan(g, kvl, n, ri, ti, oi, 64);
    for (int i = 0; i < a.work; ++i) {
        valid[i] = true;
    }
    pages_of(g, page_size, rs, kvl, n, &a.indices, &a.indptr, &a.last_page_len);
    a.geom = *g;
    a.head_dim = HD;
    a.q_heads = QH;
    a.kv_heads = KVH;
    a.batch = n;
    a.sm_scale = 1.0f / sqrtf((float)HD);
    a.q = qbf;
    a.pool = pool;
    a.request_indices = dmem(ri, (size_t)a.work * 4);
    a.kv_tile_indices = dmem(ti, (size_t)a.work * 4);
    a.o_indptr = dmem(oi, (size_t)(n + 1) * 4);
    a.chunk_tokens = dmem(&chunk, 4);
    a.valid = dmem(valid, (size_t)a.work);
    a.tmp_v = dmem(NULL, (size_t)a.work * ROW * 2);
    a.tmp_s = dmem(NULL, (size_t)a.work * QH * 4);
    a.o = dmem(NULL, (size_t)n * ROW * 2);
    a.lse = dmem(NULL, (size_t)n * QH * 4);
    int rc = kvf_fi_decode(&gdev, &a);
    float *o32 = dmem(NULL, (size_t)n * ROW * 4);
    rc = (rc == KVF_KERN_OK) ? kvf_convert(&gdev, o32, KVF_DTYPE_FP32, a.o, KVF_DTYPE_BF16,
                                           (size_t)n * ROW) : rc;
    rc = (rc == KVF_KERN_OK) ? kvf_device_memcpy(&gdev, out, o32, (size_t)n * ROW * 4,
                                                 KVF_COPY_D2H) : rc;
    if (rc != KVF_KERN_OK) {
        fail_rc("kvf_fi_decode", rc);
    }
}

/* prefill of the last qn[i] tokens of requests rs[i] (queries q32's rows in order) */
static void fi_prefill(const kvf_fi_geom_t *g, void *pool, size_t page_size, const int *rs,
                       const int32_t *qn, int n, const void *qbf, float *out)
{
    kvf_fi_prefill_args_t a;
    int32_t kvl[NREQ], ri[256], qi[256], ki[256], qp[NREQ + 1], chunk = 1 << 30;

    for (int i = 0; i < n; ++i) {
        kvl[i] = lens[rs[i]];
    }
    memset(&a, 0, sizeof(a));
    a.work = kvf_fi_prefill_plan(qn, n, QH / KVH, ri, qi, ki, qp, 256);
    pages_of(g, page_size, rs, kvl, n, &a.indices, &a.indptr, &a.last_page_len);
    a.geom = *g;
    a.head_dim = HD;
    a.q_heads = QH;
    a.kv_heads = KVH;
    a.batch = n;
    a.sm_scale = 1.0f / sqrtf((float)HD);
    a.q = qbf;
    a.pool = pool;
    a.q_indptr = dmem(qp, (size_t)(n + 1) * 4);
    a.request_indices = dmem(ri, (size_t)a.work * 4);
    a.qo_tile_indices = dmem(qi, (size_t)a.work * 4);
    a.kv_tile_indices = dmem(ki, (size_t)a.work * 4);
    a.kv_chunk_tokens = dmem(&chunk, 4);
    a.o = dmem(NULL, (size_t)qp[n] * ROW * 2);
    a.lse = dmem(NULL, (size_t)qp[n] * QH * 4);
    int rc = kvf_fi_prefill(&gdev, &a);
    float *o32 = dmem(NULL, (size_t)qp[n] * ROW * 4);
    rc = (rc == KVF_KERN_OK) ? kvf_convert(&gdev, o32, KVF_DTYPE_FP32, a.o, KVF_DTYPE_BF16,
                                           (size_t)qp[n] * ROW) : rc;
    rc = (rc == KVF_KERN_OK) ? kvf_device_memcpy(&gdev, out, o32, (size_t)qp[n] * ROW * 4,
                                                 KVF_COPY_D2H) : rc;
    if (rc != KVF_KERN_OK) {
        fail_rc("kvf_fi_prefill", rc);
    }
}

static float maxrel(const float *a, const float *b, size_t n)
{
    float m = 0.0f;
    for (size_t i = 0; i < n; ++i) {
        float d = fabsf(a[i] - b[i]) / (1.0f + fabsf(b[i]));
        m = ((d > m) || isnan(d)) ? d : m;
    }
    return m;
}

static int run(void)
{
    const size_t page_size = 4u * 2 * KVH * KBS * HD * 2; /* four kernel blocks a page */
    const int maxlen = lens[NREQ - 1];
    kvf_fi_geom_t g;
    const char *why = kvf_fi_geometry(KVF_DTYPE_BF16, HD, QH, KVH, KBS, page_size,
                                      (size_t)NREQ * NB * page_size, 1, &g);
    float *kv_h = malloc((size_t)maxlen * KVH * HD * 4), *q_h = malloc((size_t)PQ * ROW * 4);
    float *ref = malloc((size_t)PQ * ROW * 4), *got = malloc((size_t)PQ * ROW * 4);
    float *got1 = malloc((size_t)PQ * ROW * 4);
    int32_t *pos = malloc((size_t)maxlen * 4);

    if ((why != NULL) || !kvf_fi_built(KVF_DTYPE_BF16, HD) || (kv_h == NULL) || (q_h == NULL) ||
        (ref == NULL) || (got == NULL) || (got1 == NULL) || (pos == NULL)) {
        printf("| FlashInfer on kvferry pages | %s | FAIL |\n", why ? why : "host memory");
        return 1;
    }
    void *pool = dmem(NULL, (size_t)NREQ * NB * page_size);
    for (int r = 0; r < NREQ; ++r) {   /* request r owns blocks r, r + 4, r + 8, ... */
        for (int b = 0; b < NB; ++b) {
            tables[r][b] = (int32_t)(b * NREQ + r) % (NREQ * NB);
        }
    }
    for (int r = 0; r < NREQ; ++r) {
        kvf_paged_kv_t kv = cache(pool, page_size, r);
        for (int t = 0; t < lens[r]; ++t) {
            pos[t] = t;
        }
        for (size_t i = 0; i < (size_t)lens[r] * KVH * HD; ++i) {
            kv_h[i] = rnd();
        }
        float *dk = dmem(kv_h, (size_t)lens[r] * KVH * HD * 4);
        for (size_t i = 0; i < (size_t)lens[r] * KVH * HD; ++i) {
            kv_h[i] = rnd();
        }
        float *dv = dmem(kv_h, (size_t)lens[r] * KVH * HD * 4);
        int rc = kvf_attn_cache_write(&gdev, &kv, dk, dv, KVH * HD, pos, lens[r]);
        if (rc != KVF_KERN_OK) {
            fail_rc("kvf_attn_cache_write", rc);
        }
    }
    /* decode: one query per request */
    for (size_t i = 0; i < (size_t)PQ * ROW; ++i) {
        q_h[i] = rnd();
    }
    void *qbf;
    float *dq = round_q(dmem(q_h, (size_t)NREQ * ROW * 4), (size_t)NREQ * ROW, &qbf);
    float *dout = dmem(NULL, (size_t)PQ * ROW * 4);
    for (int r = 0; r < NREQ; ++r) {
        kvf_paged_kv_t kv = cache(pool, page_size, r);
        int32_t p = lens[r] - 1;
        int rc = kvf_attn_paged(&gdev, &kv, dq + (size_t)r * ROW, ROW, &p, 1, QH, 0.0f,
                                dout + (size_t)r * ROW);
        if (rc != KVF_KERN_OK) {
            fail_rc("kvf_attn_paged", rc);
        }
    }
    if (kvf_device_memcpy(&gdev, ref, dout, (size_t)NREQ * ROW * 4, KVF_COPY_D2H) != KVF_KERN_OK) {
        fail_rc("copy", KVF_KERN_ECUDA);
    }
    const int all[NREQ] = {0, 1, 2, 3}, last[1] = {3};
    fi_decode(&g, pool, page_size, all, NREQ, qbf, got);
    float dec = maxrel(got, ref, (size_t)NREQ * ROW);
    fi_decode(&g, pool, page_size, last, 1, (const char *)qbf + (size_t)3 * ROW * 2, got1);
    int bits = memcmp(got1, got + (size_t)3 * ROW, (size_t)ROW * 4) == 0;
    /* prefill: the last PQ tokens of the 700-token request */
    dq = round_q(dmem(q_h, (size_t)PQ * ROW * 4), (size_t)PQ * ROW, &qbf);
    for (int t = 0; t < PQ; ++t) {
        pos[t] = lens[2] - PQ + t;
    }
    kvf_paged_kv_t kv2 = cache(pool, page_size, 2);
    int rc = kvf_attn_paged(&gdev, &kv2, dq, ROW, pos, PQ, QH, 0.0f, dout);
    rc = (rc == KVF_KERN_OK) ? kvf_device_memcpy(&gdev, ref, dout, (size_t)PQ * ROW * 4,
                                                 KVF_COPY_D2H) : rc;
    if (rc != KVF_KERN_OK) {
        fail_rc("kvf_attn_paged (prefill)", rc);
    }
    const int one[1] = {2};
    const int32_t qn1[1] = {PQ};
    fi_prefill(&g, pool, page_size, one, qn1, 1, qbf, got);
    float pre = maxrel(got, ref, (size_t)PQ * ROW);
    /* beside the 37-token request's last 20 tokens (its queries after this request's) */
    void *qbf2 = dmem(NULL, (size_t)(PQ + 20) * ROW * 2);
    if (kvf_device_memcpy(&gdev, qbf2, qbf, (size_t)PQ * ROW * 2, KVF_COPY_D2D) != KVF_KERN_OK) {
        fail_rc("copy", KVF_KERN_ECUDA);
    }
    const int two[2] = {2, 1};
    const int32_t qn2[2] = {PQ, 20};
    float *got2 = malloc((size_t)(PQ + 20) * ROW * 4);
    if (got2 == NULL) {
        return 1;
    }
    fi_prefill(&g, pool, page_size, two, qn2, 2, qbf2, got2);
    bits &= memcmp(got2, got, (size_t)PQ * ROW * 4) == 0;
    int ok = (dec <= 2e-2f) && (pre <= 2e-2f) && bits;
    printf("| FlashInfer on kvferry pages (32/8 heads, hd 128, kbs 16, bf16) | decode max rel %.2e "
           "| prefill max rel %.2e | alone = in batch bitwise %s | %s |\n", (double)dec,
           (double)pre, bits ? "yes" : "NO", ok ? "PASS" : "FAIL");
    return ok ? 0 : 1;
}
#endif

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
#ifdef KVF_HAVE_CUDA
    if (!kvf_fi_built(KVF_DTYPE_BF16, HD)) {
        printf("skipped: FlashInfer not in this build (-DKVF_FLASHINFER=ON)\n");
        return 77;
    }
    if (!kvf_device_cuda_available() ||
        (kvf_device_init(KVF_DEVICE_CUDA, 0, &gdev) != KVF_KERN_OK)) {
        printf("skipped: no GPU\n");
        return 77;
    }
    return run();
#else
    printf("skipped: no GPU (no CUDA in this build)\n");
    return 77;
#endif
}
