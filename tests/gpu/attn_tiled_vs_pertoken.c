/*
 * The tiled CUDA paged attention against the per-token one, on one GPU: the
 * same random paged K/V (fp32, bf16 and fp16 caches), queries and positions
 * through both kernels (kvf_attention_cuda.h's *_as calls), outputs compared
 * BIT for bit (the tiled kernel's contract: each query's arithmetic is the
 * per-token kernel's), and the time of each (cudaEvent, median of 5 runs
 * after one warm-up, block-table upload included for both). One row per case
 * and cache dtype:
 *
 *   | case | dtype | per-token ms | tiled ms | speed-up | result |
 *
 * PASS: every output bit equal (NaN where the other has the same NaN) and the
 * tiled kernel ran (not its per-token fallback). Cases: prefill chunks of up
 * to 512 tokens at positions up to 8k on the Nemotron-Nano-9B-v2 attention
 * geometry (40 query heads, 8 KV heads, head_dim 128; kernel blocks of 16 and
 * of its hybrid 1312) and a tiny model's (8/2, 32), head_dim 256, no GQA,
 * kbs 8192, a decode batch of 16 requests and a mixed batch (kvf_attention_
 * seqs.h: own block tables, split-K), and a pool of stale NaN bytes past the
 * written slots (masked slots still meet them as 0 * v), and gpt-oss's attention sinks
 * (some above every score) with and without a window, decodes split-K.
 *
 * Exit: 0 all PASS, 1 any FAIL, 77 no usable GPU or no CUDA in this build
 * (prints "skipped: no GPU"; never a pass). Run by tests/gpu/run.sh.
 */
#include "kvf_attention.h"
#include "kvf_attention_seqs.h"
#include "kvf_device.h"
#include "kvf_dtype.h"

#ifdef KVF_HAVE_CUDA
#include "kvf_attention_cuda.h"

#include <cuda_runtime_api.h>
#endif

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef KVF_HAVE_CUDA
static kvf_device_t gdev;
static int failures;
static uint64_t rng = 0x243f6a8885a308d3ull;

static uint32_t rnd_u32(void)
{
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return (uint32_t)((rng * 2685821657736338717ull) >> 32);
}

static float rnd(float lo, float hi)
{
    return lo + (hi - lo) * (float)rnd_u32() / 4294967296.0f;
}

static void die(const char *what, int err)
{
    fprintf(stderr, "attn_tiled_vs_pertoken: %s failed: %s\n", what, kvf_kern_strerror(err));
    exit(1);
}

#define CK(_what, _call)                                                                    \
    do {                                                                                    \
        int _e = (_call);                                                                   \
        if (_e != KVF_KERN_OK) {                                                            \
            die(_what, _e);                                                                 \
        }                                                                                   \
    } while (0)

#define CKC(_what, _call)                                                                   \
    do {                                                                                    \
        cudaError_t _c = (_call);                                                           \
        if (_c != cudaSuccess) {                                                            \
            fprintf(stderr, "attn_tiled_vs_pertoken: %s: %s\n", _what,                      \
                    cudaGetErrorString(_c));                                                \
            exit(1);                                                                        \
        }                                                                                   \
    } while (0)

static void *up(const void *host, size_t bytes)
{
    void *d = NULL;
    CK("alloc", kvf_device_alloc(&gdev, bytes, &d));
    if (host != NULL) {
        CK("copy to device", kvf_device_memcpy(&gdev, d, host, bytes, KVF_COPY_H2D));
    }
    return d;
}

static void down(void *host, const void *d, size_t bytes)
{
    CK("sync", kvf_device_sync(&gdev));
    CK("copy to host", kvf_device_memcpy(&gdev, host, d, bytes, KVF_COPY_D2H));
}

/* One case: geometry, the requests (rows and first position of each; decode rows are 1),
 * and whether the pool holds stale NaN bytes instead of random values. */
typedef struct acase {
    const char *name;
    int q_heads, kv_heads, hd, kbs, block_size;
    int num_seqs;          /* 0: the one-request call (kvf_attn_paged) with seq 0 */
    int rows[16], pos0[16];
    int stale_nan;         /* pool of 0xff bytes; the rows' own K/V written first */
    int sinks;             /* gpt-oss: an attention sink per query head (kvf_paged_kv_t.sinks),
                            * some above every score (the sink sets the max), and a window */
} acase_t;

/* the attention of one case through one kernel: 1 warm-up then 5 timed runs (median ms) */
typedef struct arun {
    const kvf_paged_kv_t *kv;
    const kvf_attn_seqs_t *seqs;   /* NULL: one request */
    const float *dk, *dv, *dq;
    const int32_t *pos;
    int T, q_heads;
    float scale, *dout;
} arun_t;

static int run_once(const arun_t *r, kvf_attn_gpu_impl_t impl, kvf_attn_gpu_impl_t *ran)
{
    const int ld = r->kv->kv_heads * r->kv->head_dim, ldq = r->q_heads * r->kv->head_dim;
    if (r->seqs == NULL) {
        return kvf_cuda_attn_paged_as(impl, &gdev, r->kv, r->dq, ldq, r->pos, r->T, r->q_heads,
                                      r->scale, r->dout, ran);
    }
    return kvf_cuda_attn_write_paged_seqs_as(impl, &gdev, r->kv, r->seqs, r->dk, r->dv, ld,
                                             r->dq, ldq, r->pos, r->T, r->q_heads, r->scale,
                                             r->dout, ran);
}

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) ? -1 : (x > y);
}

static float time_runs(const arun_t *r, kvf_attn_gpu_impl_t impl, kvf_attn_gpu_impl_t *ran)
{
    cudaStream_t s = (cudaStream_t)gdev.stream;
    cudaEvent_t e0, e1;
    float ms[5];
    CKC("cudaEventCreate", cudaEventCreate(&e0));
    CKC("cudaEventCreate", cudaEventCreate(&e1));
    CK("attention (warm-up)", run_once(r, impl, ran));
    for (int i = 0; i < 5; ++i) {
        CKC("cudaEventRecord", cudaEventRecord(e0, s));
        CK("attention", run_once(r, impl, ran));
        CKC("cudaEventRecord", cudaEventRecord(e1, s));
        CKC("cudaEventSynchronize", cudaEventSynchronize(e1));
        CKC("cudaEventElapsedTime", cudaEventElapsedTime(&ms[i], e0, e1));
    }
    (void)cudaEventDestroy(e0);
    (void)cudaEventDestroy(e1);
    qsort(ms, 5, sizeof(float), cmp_float);
    return ms[2];
}

static void row(const char *name, kvf_dtype_t dt, float ms_a, float ms_b, const char *result)
{
    char a[32], b[32], x[32];
    snprintf(a, sizeof(a), "%.4f", (double)ms_a);
    snprintf(b, sizeof(b), "%.4f", (double)ms_b);
    snprintf(x, sizeof(x), "%.2fx", (ms_b > 0.0f) ? (double)(ms_a / ms_b) : 0.0);
    printf("| %-34s | %-5s | %-12s | %-12s | %-8s | %s |\n", name, kvf_dtype_name(dt), a, b, x,
           result);
}

/* Case @c's table row: the tiled kernel's @n outputs @hb bit for bit against the per-token
 * kernel's @ha, NaN where the pool is stale and nowhere else, and each kernel really run
 * (@ran_a per-token, @ran_b tiled); a FAIL is counted. */
static void report_case(const acase_t *c, kvf_dtype_t dt, const float *ha, const float *hb,
                        size_t n, kvf_attn_gpu_impl_t ran_a, kvf_attn_gpu_impl_t ran_b,
                        float ms_a, float ms_b)
{
    size_t ndiff = 0, first = 0, nnan = 0;
    for (size_t i = 0; i < n; ++i) {
        if (memcmp(&ha[i], &hb[i], sizeof(float)) != 0) {
            first = (ndiff == 0) ? i : first;
            ++ndiff;
        }
        nnan += isnan(ha[i]) ? 1 : 0;
    }
    char res[160], name[64];
    snprintf(name, sizeof(name), "%s", c->name);
    if (ran_a != KVF_ATTN_GPU_PERTOKEN || ran_b != KVF_ATTN_GPU_TILED) {
        snprintf(res, sizeof(res), "FAIL: the tiled kernel did not run (fell back)");
        ++failures;
    } else if (ndiff != 0) {
        snprintf(res, sizeof(res), "FAIL: %zu of %zu differ (first [%zu]: %.9g vs %.9g)", ndiff,
                 n, first, (double)ha[first], (double)hb[first]);
        ++failures;
    } else if (c->stale_nan && (nnan == 0)) {
        snprintf(res, sizeof(res), "FAIL: no NaN from the stale slots (expected some)");
        ++failures;
    } else if (!c->stale_nan && (nnan != 0)) {
        snprintf(res, sizeof(res), "FAIL: %zu NaN from a finite pool", nnan);
        ++failures;
    } else {
        snprintf(res, sizeof(res), "PASS (bits equal%s)", c->stale_nan ? ", NaN alike" : "");
    }
    row(name, dt, ms_a, ms_b, res);
}

static void run_case(const acase_t *c, kvf_dtype_t dt)
{
    const int nseq = (c->num_seqs == 0) ? 1 : c->num_seqs, hd = c->hd;
    int T = 0, maxb = 0, nblocks = 0;
    int nb[16], rows[16];
    int32_t *tab[16];

    for (int i = 0; i < nseq; ++i) {
        rows[i] = c->rows[i];
        T += rows[i];
        nb[i] = (c->pos0[i] + rows[i] - 1) / c->block_size + 1;
        nblocks += nb[i];
        maxb = (nb[i] > maxb) ? nb[i] : maxb;
    }
    /* the pool: nblocks + 3 blocks, each request's blocks a random draw without reuse */
    const int pool_blocks = nblocks + 3;
    int32_t *perm = malloc((size_t)pool_blocks * sizeof(int32_t));
    for (int i = 0; i < pool_blocks; ++i) {
        perm[i] = i;
    }
    for (int i = pool_blocks - 1; i > 0; --i) {
        int j = (int)(rnd_u32() % (uint32_t)(i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int i = 0, o = 0; i < nseq; ++i) {
        tab[i] = perm + o;
        o += nb[i];
    }
    kvf_paged_kv_t kv;
    memset(&kv, 0, sizeof(kv));
    kv.slots = 1;
    kv.dtype = dt;
    kv.kv_heads = c->kv_heads;
    kv.head_dim = hd;
    kv.block_size = c->block_size;
    kv.kernel_block_size = c->kbs;
    kv.block_table = tab[0];
    kv.num_blocks = nb[0];
    kv.page_size = (size_t)(c->block_size / c->kbs) * kvf_paged_kv_kernel_block_bytes(&kv);
    const size_t pool_bytes = (size_t)pool_blocks * kv.page_size, elt = kvf_dtype_size(dt);
    unsigned char *pool = malloc(pool_bytes);
    if (c->stale_nan) {
        memset(pool, 0xff, pool_bytes);   /* NaN as fp32, bf16 and fp16 */
    } else {
        for (size_t i = 0; i < pool_bytes / elt; ++i) {
            kvf_dtype_store(pool, dt, i, rnd(-1.0f, 1.0f));
        }
    }
    kv.base = up(pool, pool_bytes);
    float *hsinks = malloc((size_t)c->q_heads * sizeof(float));
    for (int h = 0; h < c->q_heads; ++h) {
        hsinks[h] = (h % 3 == 0) ? rnd(20.0f, 30.0f) : rnd(-2.0f, 2.0f);
    }
    if (c->sinks) {   /* 1: with a window of 1000 tokens; 2: full (long decodes split) */
        kv.sinks = up(hsinks, (size_t)c->q_heads * sizeof(float));
        kv.window = (c->sinks == 1) ? 1000 : 0;
    }

    const size_t ld = (size_t)c->kv_heads * hd, ldq = (size_t)c->q_heads * hd;
    float *k = malloc((size_t)T * ld * 4), *v = malloc((size_t)T * ld * 4);
    float *q = malloc((size_t)T * ldq * 4);
    int32_t *pos = malloc((size_t)T * sizeof(int32_t));
    for (size_t i = 0; i < (size_t)T * ld; ++i) {
        k[i] = rnd(-1.0f, 1.0f);
        v[i] = rnd(-1.0f, 1.0f);
    }
    for (size_t i = 0; i < (size_t)T * ldq; ++i) {
        q[i] = rnd(-2.0f, 2.0f);
    }
    for (int i = 0, o = 0; i < nseq; ++i) {
        for (int t = 0; t < rows[i]; ++t) {
            pos[o++] = c->pos0[i] + t;
        }
    }
    float *dk = up(k, (size_t)T * ld * 4), *dv = up(v, (size_t)T * ld * 4);
    float *dq = up(q, (size_t)T * ldq * 4);
    float *da = up(NULL, (size_t)T * ldq * 4), *db = up(NULL, (size_t)T * ldq * 4);
    float *ha = malloc((size_t)T * ldq * 4), *hb = malloc((size_t)T * ldq * 4);
    const int32_t *const *ctab = (const int32_t *const *)tab;
    kvf_attn_seqs_t seqs = {.num_seqs = nseq, .num_tokens = rows, .block_tables = ctab,
                            .num_blocks = nb};
    arun_t r = {&kv, (c->num_seqs == 0) ? NULL : &seqs, dk, dv, dq, pos, T, c->q_heads,
                1.0f / sqrtf((float)hd), da};
    kvf_attn_gpu_impl_t ran_a = KVF_ATTN_GPU_TILED, ran_b = KVF_ATTN_GPU_PERTOKEN;

    if (c->num_seqs == 0) {   /* the rows' own K/V (the seqs call writes them itself) */
        CK("cache write", kvf_attn_cache_write(&gdev, &kv, dk, dv, (int)ld, pos, T));
    }
    float ms_a = time_runs(&r, KVF_ATTN_GPU_PERTOKEN, &ran_a);
    r.dout = db;
    float ms_b = time_runs(&r, KVF_ATTN_GPU_TILED, &ran_b);
    down(ha, da, (size_t)T * ldq * 4);
    down(hb, db, (size_t)T * ldq * 4);

    report_case(c, dt, ha, hb, (size_t)T * ldq, ran_a, ran_b, ms_a, ms_b);

    kvf_device_free(&gdev, kv.base);
    kvf_device_free(&gdev, (void *)kv.sinks);
    free(hsinks);
    kvf_device_free(&gdev, dk);
    kvf_device_free(&gdev, dv);
    kvf_device_free(&gdev, dq);
    kvf_device_free(&gdev, da);
    kvf_device_free(&gdev, db);
    free(perm);
    free(pool);
    free(k);
    free(v);
    free(q);
    free(pos);
    free(ha);
    free(hb);
}

static int run_all(void)
{
    static acase_t cases[] = {
        {"9B prefill 512 @0, kbs 16", 40, 8, 128, 16, 64, 0, {512}, {0}, 0, 0},
        {"9B prefill 512 @7680, kbs 16", 40, 8, 128, 16, 64, 0, {512}, {7680}, 0, 0},
        {"9B prefill 77 @3001, kbs 16", 40, 8, 128, 16, 64, 0, {77}, {3001}, 0, 0},
        {"9B prefill 512 @7000, kbs 1312", 40, 8, 128, 1312, 1312, 0, {512}, {7000}, 0, 0},
        {"tiny prefill 512 @0, kbs 16", 8, 2, 32, 16, 32, 0, {512}, {0}, 0, 0},
        {"tiny prefill 300 @5000, kbs 96", 8, 2, 32, 96, 96, 0, {300}, {5000}, 0, 0},
        {"hd 256 prefill 200 @1000, kbs 64", 16, 2, 256, 64, 128, 0, {200}, {1000}, 0, 0},
        {"no GQA prefill 128 @4000, kbs 32", 8, 8, 64, 32, 64, 0, {128}, {4000}, 0, 0},
        {"kbs 8192 prefill 64 @8100", 8, 2, 128, 8192, 8192, 0, {64}, {8100}, 0, 0},
        {"9B decode 16 reqs up to 8k, kbs 16", 40, 8, 128, 16, 64, 16,
         {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1},
         {5, 8191, 2047, 2048, 4095, 700, 3333, 6000, 16, 17, 8000, 1, 4500, 5555, 7777, 123},
         0, 0},
        {"9B decode 16 reqs, kbs 1312", 40, 8, 128, 1312, 1312, 16,
         {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1},
         {5, 8191, 2047, 2048, 4095, 700, 3333, 6000, 16, 17, 8000, 1, 4500, 5555, 7777, 123},
         0, 0},
        {"9B mixed: 3 prefills + 5 decodes", 40, 8, 128, 16, 64, 8,
         {40, 1, 300, 1, 1, 70, 1, 1}, {0, 7000, 2000, 15, 4096, 6500, 2, 8100}, 0, 0},
        {"stale NaN pool, prefill 150", 8, 2, 64, 16, 32, 0, {150}, {0}, 1, 0},
        {"sinks, window 1000: prefill 300 @5000", 8, 2, 64, 16, 32, 0, {300}, {5000}, 0, 1},
        {"sinks, window 1000: 16 decodes to 8k", 8, 2, 64, 16, 32, 16,
         {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1},
         {5, 8191, 2047, 2048, 4095, 700, 3333, 6000, 16, 17, 8000, 1, 4500, 5555, 7777, 123},
         0, 1},
        {"sinks, full: 16 decodes to 8k (split-K)", 8, 2, 64, 16, 32, 16,
         {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1},
         {5, 8191, 2047, 2048, 4095, 700, 3333, 6000, 16, 17, 8000, 1, 4500, 5555, 7777, 123},
         0, 2},
    };
    static const kvf_dtype_t dts[3] = {KVF_DTYPE_FP32, KVF_DTYPE_BF16, KVF_DTYPE_FP16};

    printf("| %-34s | %-5s | %-12s | %-12s | %-8s | %s |\n", "attention (tiled vs per-token)",
           "dtype", "per-token ms", "tiled ms", "speed-up", "result");
    printf("|------------------------------------|-------|--------------|--------------|"
           "----------|--------|\n");
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); ++i) {
        for (int d = 0; d < 3; ++d) {
            run_case(&cases[i], dts[d]);
        }
    }
    printf("attn_tiled_vs_pertoken: %d failure(s)\n", failures);
    return failures ? 1 : 0;
}
#endif

int main(int argc, char **argv)
{
    (void)argv;
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc != 1) {
        fprintf(stderr, "usage: attn_tiled_vs_pertoken\n");
        return 2;
    }
#ifdef KVF_HAVE_CUDA
    if (!kvf_device_cuda_available() ||
        (kvf_device_init(KVF_DEVICE_CUDA, 0, &gdev) != KVF_KERN_OK)) {
        printf("skipped: no GPU (%s)\n", kvf_device_cuda_available()
                                            ? "device 0 would not initialise"
                                            : "cudaGetDeviceCount failed or found none");
        return 77;
    }
    return run_all();
#else
    printf("skipped: no GPU (no CUDA in this build)\n");
    return 77;
#endif
}
