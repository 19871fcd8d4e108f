/*
 * TEST ONLY (kvf-devsim, kvf_devsim.c): FlashInfer's decode and prefill attention on the
 * simulated GPU.
 * kvf_fi_built says what a -DKVF_FLASHINFER=ON build says (bf16, head_dim 32, 64, 128, 256;
 * DEVSIM_FI=0: what this build says), so KVF_GPU_ATTN=flashinfer takes its path here.
 * Each kvf_fi_decode call has its plan arguments checked against what they must be for the
 * request lengths they encode (page counts and last-page fill, the fixed split-KV plan of
 * kvf_fi_decode_plan, the chunk size, every entry valid, every page index inside device
 * memory), errors counted, then the attention is computed on the CPU the way the arguments
 * say (pages read through the indices and strides; bf16 q, K, V and output, fp32 sums).
 * kvf_fi_prefill likewise: its plan is kvf_fi_prefill_plan of the query lengths q_indptr
 * encodes (each within its kv length), query row t of a request at position
 * kv_len - qo_len + t attends causally, its dot products summed in the reverse order (the
 * two kernels give a row other bits on a GPU too: a token sent to the other kernel because
 * of its batch shows as a batch-invariance failure here). Counted:
 *   fi_decode_calls C fi_prefill_calls P fi_plan_errors E
 */
#include "kvf_devsim_ssd.h"
#include "kvf_fi_decode.h"
#include "kvf_fi_prefill.h"
#include "kvf_dtype.h"
#include "kvf_kern.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static pthread_mutex_t fi_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned long long fi_calls, fi_prefill_calls, fi_errors;

int __real_kvf_fi_built(kvf_dtype_t dtype, int head_dim);
int __wrap_kvf_fi_built(kvf_dtype_t dtype, int head_dim);
int __wrap_kvf_fi_built(kvf_dtype_t dtype, int head_dim)
{
    const char *e = getenv("DEVSIM_FI");

    if ((e != NULL) && (strcmp(e, "0") == 0)) {
        return __real_kvf_fi_built(dtype, head_dim);
    }
    return (dtype == KVF_DTYPE_BF16) && ((head_dim == 32) || (head_dim == 64) ||
                                         (head_dim == 128) || (head_dim == 256));
}

static void fi_error(const char *who, const char *what, long long v)
{
    pthread_mutex_lock(&fi_lock);
    if (fi_errors++ < 8) {
        fprintf(stderr, "devsim: %s: %s (%lld)\n", who, what, v);
    }
    pthread_mutex_unlock(&fi_lock);
}

/* Request r's kv_len from its pages and last-page fill (1 when out of range: counted), its
 * page indices checked against the pool. */
static int fi_kv_len(const kvf_fi_geom_t *g, void *pool, const int32_t *indices,
                     const int32_t *indptr, const int32_t *last_page_len, int r,
                     const char *who)
{
    const int np = indptr[r + 1] - indptr[r], last = last_page_len[r];

    if ((np < 1) || (last < 1) || (last > g->page_tokens)) {
        fi_error(who, "a request's pages or last-page fill out of range", r);
        return 1;
    }
    for (int p = indptr[r]; p < indptr[r + 1]; ++p) {
        const uint8_t *k = (const uint8_t *)pool + (uint64_t)indices[p] * g->unit;
        if ((indices[p] < 0) || !devsim_is_device_ptr(k) ||
            !devsim_is_device_ptr(k + g->v_offset * 2)) {
            fi_error(who, "a page index outside the pool", indices[p]);
        }
    }
    return (np - 1) * g->page_tokens + last;
}

/* The decode plan arguments against the request lengths they encode; lengths into kv_len. */
static void fi_check(const kvf_fi_decode_args_t *a, int32_t *kv_len)
{
    const kvf_fi_geom_t *g = &a->geom;
    const int cap = a->work + 1;
    int32_t *req = calloc((size_t)cap, 4), *tile = calloc((size_t)cap, 4);
    int32_t *oind = calloc((size_t)a->batch + 1, 4);
    int w;

    if (a->indptr[0] != 0) {
        fi_error("kvf_fi_decode", "indptr[0] is not 0", a->indptr[0]);
    }
    for (int r = 0; r < a->batch; ++r) {
        kv_len[r] = fi_kv_len(g, a->pool, a->indices, a->indptr, a->last_page_len, r,
                              "kvf_fi_decode");
    }
    w = ((req != NULL) && (tile != NULL) && (oind != NULL)) ?
        kvf_fi_decode_plan(g, kv_len, a->batch, req, tile, oind, cap) : -1;
    if ((w != a->work) ||
        (memcmp(req, a->request_indices, (size_t)w * 4) != 0) ||
        (memcmp(tile, a->kv_tile_indices, (size_t)w * 4) != 0) ||
        (memcmp(oind, a->o_indptr, (size_t)(a->batch + 1) * 4) != 0)) {
        fi_error("kvf_fi_decode", "the plan is not the fixed split-KV plan of the request "
                 "lengths", w);
    }
    if (a->chunk_tokens[0] != g->chunk_pages * g->page_tokens) {
        fi_error("kvf_fi_decode", "chunk_tokens is not chunk_pages x page_tokens",
                 a->chunk_tokens[0]);
    }
    for (int i = 0; i < a->work; ++i) {
        if (!a->valid[i]) {
            fi_error("kvf_fi_decode", "a plan entry marked invalid", i);
        }
    }
    free(req);
    free(tile);
    free(oind);
}

/* One query row (bf16 @a q, KV head @a kvh) against the first @a kv_len tokens of the pages
 * at @a pages: softmax(q.K * scale) V into bf16 @a o; its log-sum-exp returned. */
static float fi_row(const kvf_fi_geom_t *g, const void *pool, const int32_t *pages, int hd,
                    int kvh, float scale, const uint16_t *q, int kv_len, float *sc,
                    uint16_t *o, bool prefill)
{
    float mx = -INFINITY, sum = 0.0f;

    for (int j = 0; j < kv_len; ++j) {
        const uint16_t *k = (const uint16_t *)pool + (uint64_t)pages[j / g->page_tokens] *
                            g->stride_page + (uint64_t)kvh * g->stride_h +
                            (uint64_t)(j % g->page_tokens) * g->stride_n;
        float d = 0.0f;
        for (int i = 0; i < hd; ++i) {
            const int e = prefill ? hd - 1 - i : i;   /* another order: other bits */
            d += kvf_bf16_to_fp32(q[e]) * kvf_bf16_to_fp32(k[e]);
        }
        sc[j] = d * scale;
        mx = (sc[j] > mx) ? sc[j] : mx;
    }
    for (int e = 0; e < hd; ++e) {
        float acc = 0.0f;
        sum = 0.0f;
        for (int j = 0; j < kv_len; ++j) {
            const uint16_t *v = (const uint16_t *)pool + (uint64_t)pages[j / g->page_tokens] *
                                g->stride_page + g->v_offset + (uint64_t)kvh * g->stride_h +
                                (uint64_t)(j % g->page_tokens) * g->stride_n;
            const float p = expf(sc[j] - mx);
            sum += p;
            acc += p * kvf_bf16_to_fp32(v[e]);
        }
        o[e] = kvf_fp32_to_bf16(acc / sum);
    }
    return mx + logf(sum);
}

int __real_kvf_fi_decode(const kvf_device_t *dev, const kvf_fi_decode_args_t *a);
int __wrap_kvf_fi_decode(const kvf_device_t *dev, const kvf_fi_decode_args_t *a);
int __wrap_kvf_fi_decode(const kvf_device_t *dev, const kvf_fi_decode_args_t *a)
{
    int32_t *kv_len;
    float *sc;
    int maxlen = 1;

    if ((dev == NULL) || (dev->kind == KVF_DEVICE_CPU) || (a == NULL) || (a->batch < 1) ||
        (a->work < a->batch) || (a->kv_heads < 1) || (a->q_heads % a->kv_heads != 0)) {
        return __real_kvf_fi_decode(dev, a);
    }
    pthread_mutex_lock(&fi_lock);
    fi_calls++;
    pthread_mutex_unlock(&fi_lock);
    kv_len = calloc((size_t)a->batch, sizeof(int32_t));
    if (kv_len == NULL) {
        return KVF_KERN_ENOMEM;
    }
    fi_check(a, kv_len);
    for (int r = 0; r < a->batch; ++r) {
        maxlen = (kv_len[r] > maxlen) ? kv_len[r] : maxlen;
    }
    sc = malloc((size_t)maxlen * sizeof(float));
    const size_t qld = (a->q_ld > 0) ? (size_t)a->q_ld : (size_t)a->q_heads * a->head_dim;
    for (int r = 0; (sc != NULL) && (r < a->batch); ++r) {
        for (int h = 0; h < a->q_heads; ++h) {
            a->lse[(size_t)r * a->q_heads + h] =
                fi_row(&a->geom, a->pool, a->indices + a->indptr[r], a->head_dim,
                       h / (a->q_heads / a->kv_heads), a->sm_scale,
                       (const uint16_t *)a->q + r * qld + (size_t)h * a->head_dim, kv_len[r],
                       sc, (uint16_t *)a->o + ((size_t)r * a->q_heads + h) * a->head_dim,
                       false);
        }
    }
    free(sc);
    free(kv_len);
    return (sc != NULL) ? KVF_KERN_OK : KVF_KERN_ENOMEM;
}

/* The prefill plan arguments against the lengths they encode; kv lengths into kv_len. */
static void fi_prefill_check(const kvf_fi_prefill_args_t *a, int32_t *kv_len)
{
    const int cap = a->work + 1;
    int32_t *req = calloc((size_t)cap, 4), *qt = calloc((size_t)cap, 4);
    int32_t *kt = calloc((size_t)cap, 4), *qind = calloc((size_t)a->batch + 1, 4);
    int32_t *qo = calloc((size_t)a->batch, 4);
    int w = -1;

    if ((a->indptr[0] != 0) || (a->q_indptr[0] != 0)) {
        fi_error("kvf_fi_prefill", "indptr[0] or q_indptr[0] is not 0", a->q_indptr[0]);
    }
    for (int r = 0; r < a->batch; ++r) {
        kv_len[r] = fi_kv_len(&a->geom, a->pool, a->indices, a->indptr, a->last_page_len, r,
                              "kvf_fi_prefill");
        if (qo != NULL) {
            qo[r] = a->q_indptr[r + 1] - a->q_indptr[r];
            if ((qo[r] < 1) || (qo[r] > kv_len[r])) {
                fi_error("kvf_fi_prefill", "a request's query tokens not in 1..kv_len", qo[r]);
                qo[r] = 1;
            }
        }
    }
    if ((req != NULL) && (qt != NULL) && (kt != NULL) && (qind != NULL) && (qo != NULL)) {
        w = kvf_fi_prefill_plan(qo, a->batch, a->q_heads / a->kv_heads, req, qt, kt, qind,
                                cap);
    }
    if ((w != a->work) || (memcmp(req, a->request_indices, (size_t)w * 4) != 0) ||
        (memcmp(qt, a->qo_tile_indices, (size_t)w * 4) != 0) ||
        (memcmp(kt, a->kv_tile_indices, (size_t)w * 4) != 0) ||
        (memcmp(qind, a->q_indptr, (size_t)(a->batch + 1) * 4) != 0)) {
        fi_error("kvf_fi_prefill", "the plan is not the fixed-tile plan of the query lengths",
                 w);
    }
    free(req);
    free(qt);
    free(kt);
    free(qind);
    free(qo);
}

int __real_kvf_fi_prefill(const kvf_device_t *dev, const kvf_fi_prefill_args_t *a);
int __wrap_kvf_fi_prefill(const kvf_device_t *dev, const kvf_fi_prefill_args_t *a);
int __wrap_kvf_fi_prefill(const kvf_device_t *dev, const kvf_fi_prefill_args_t *a)
{
    int32_t *kv_len;
    float *sc;
    int maxlen = 1;

    if ((dev == NULL) || (dev->kind == KVF_DEVICE_CPU) || (a == NULL) || (a->batch < 1) ||
        (a->work < a->batch) || (a->kv_heads < 1) || (a->q_heads % a->kv_heads != 0)) {
        return __real_kvf_fi_prefill(dev, a);
    }
    pthread_mutex_lock(&fi_lock);
    fi_prefill_calls++;
    pthread_mutex_unlock(&fi_lock);
    kv_len = calloc((size_t)a->batch, sizeof(int32_t));
    if (kv_len == NULL) {
        return KVF_KERN_ENOMEM;
    }
    fi_prefill_check(a, kv_len);
    for (int r = 0; r < a->batch; ++r) {
        maxlen = (kv_len[r] > maxlen) ? kv_len[r] : maxlen;
    }
    sc = malloc((size_t)maxlen * sizeof(float));
    const size_t qld = (a->q_ld > 0) ? (size_t)a->q_ld : (size_t)a->q_heads * a->head_dim;
    /* query row t of request r is at position kv_len - qo_len + t: causal up to it */
    for (int r = 0; (sc != NULL) && (r < a->batch); ++r) {
        const int qo = a->q_indptr[r + 1] - a->q_indptr[r];
        for (int t = 0; t < qo; ++t) {
            const size_t row = (size_t)a->q_indptr[r] + (size_t)t;
            const int len = kv_len[r] - qo + t + 1;
            for (int h = 0; (len >= 1) && (h < a->q_heads); ++h) {
                a->lse[row * a->q_heads + h] =
                    fi_row(&a->geom, a->pool, a->indices + a->indptr[r], a->head_dim,
                           h / (a->q_heads / a->kv_heads), a->sm_scale,
                           (const uint16_t *)a->q + row * qld + (size_t)h * a->head_dim, len,
                           sc, (uint16_t *)a->o + (row * a->q_heads + h) * a->head_dim,
                           true);
            }
        }
    }
    free(sc);
    free(kv_len);
    return (sc != NULL) ? KVF_KERN_OK : KVF_KERN_ENOMEM;
}

void devsim_fi_report(FILE *f)
{
    pthread_mutex_lock(&fi_lock);
    fprintf(f, " fi_decode_calls %llu fi_prefill_calls %llu fi_plan_errors %llu", fi_calls,
            fi_prefill_calls, fi_errors);
    pthread_mutex_unlock(&fi_lock);
}
