/*
 * TEST ONLY (kvf-devsim, kvf_devsim.c): FlashInfer's decode attention on the simulated GPU.
 * kvf_fi_built says what a -DKVF_FLASHINFER=ON build says (bf16, head_dim 32 and 128;
 * DEVSIM_FI=0: what this build says), so KVF_GPU_ATTN=flashinfer takes its path here.
 * Each kvf_fi_decode call has its plan arguments checked against what they must be for the
 * request lengths they encode (page counts and last-page fill, the fixed split-KV plan of
 * kvf_fi_decode_plan, the chunk size, every entry valid, every page index inside device
 * memory), errors counted, then the attention is computed on the CPU the way the arguments
 * say (pages read through the indices and strides; bf16 q, K, V and output, fp32 sums):
 *   fi_decode_calls C fi_plan_errors E
 */
#include "kvf_devsim_ssd.h"
#include "kvf_fi_decode.h"
#include "kvf_dtype.h"
#include "kvf_kern.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static pthread_mutex_t fi_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned long long fi_calls, fi_errors;

int __real_kvf_fi_built(kvf_dtype_t dtype, int head_dim);
int __wrap_kvf_fi_built(kvf_dtype_t dtype, int head_dim);
int __wrap_kvf_fi_built(kvf_dtype_t dtype, int head_dim)
{
    const char *e = getenv("DEVSIM_FI");

    if ((e != NULL) && (strcmp(e, "0") == 0)) {
        return __real_kvf_fi_built(dtype, head_dim);
    }
    return (dtype == KVF_DTYPE_BF16) && ((head_dim == 32) || (head_dim == 128));
}

static void fi_error(const char *what, long long v)
{
    pthread_mutex_lock(&fi_lock);
    if (fi_errors++ < 8) {
        fprintf(stderr, "devsim: kvf_fi_decode: %s (%lld)\n", what, v);
    }
    pthread_mutex_unlock(&fi_lock);
}

/* The plan arguments against the request lengths they encode; the lengths into kv_len. */
static void fi_check(const kvf_fi_decode_args_t *a, int32_t *kv_len)
{
    const kvf_fi_geom_t *g = &a->geom;
    const int cap = a->work + 1;
    int32_t *req = calloc((size_t)cap, 4), *tile = calloc((size_t)cap, 4);
    int32_t *oind = calloc((size_t)a->batch + 1, 4);
    int w;

    if (a->indptr[0] != 0) {
        fi_error("indptr[0] is not 0", a->indptr[0]);
    }
    for (int r = 0; r < a->batch; ++r) {
        const int np = a->indptr[r + 1] - a->indptr[r], last = a->last_page_len[r];
        if ((np < 1) || (last < 1) || (last > g->page_tokens)) {
            fi_error("a request's pages or last-page fill out of range", r);
            kv_len[r] = 1;
            continue;
        }
        kv_len[r] = (np - 1) * g->page_tokens + last;
        for (int p = a->indptr[r]; p < a->indptr[r + 1]; ++p) {
            const uint8_t *k = (const uint8_t *)a->pool + (uint64_t)a->indices[p] * g->unit;
            if ((a->indices[p] < 0) || !devsim_is_device_ptr(k) ||
                !devsim_is_device_ptr(k + g->v_offset * 2)) {
                fi_error("a page index outside the pool", a->indices[p]);
            }
        }
    }
    w = ((req != NULL) && (tile != NULL) && (oind != NULL)) ?
        kvf_fi_decode_plan(g, kv_len, a->batch, req, tile, oind, cap) : -1;
    if ((w != a->work) ||
        (memcmp(req, a->request_indices, (size_t)w * 4) != 0) ||
        (memcmp(tile, a->kv_tile_indices, (size_t)w * 4) != 0) ||
        (memcmp(oind, a->o_indptr, (size_t)(a->batch + 1) * 4) != 0)) {
        fi_error("the plan is not the fixed split-KV plan of the request lengths", w);
    }
    if (a->chunk_tokens[0] != g->chunk_pages * g->page_tokens) {
        fi_error("chunk_tokens is not chunk_pages x page_tokens", a->chunk_tokens[0]);
    }
    for (int i = 0; i < a->work; ++i) {
        if (!a->valid[i]) {
            fi_error("a plan entry marked invalid", i);
        }
    }
    free(req);
    free(tile);
    free(oind);
}

/* Request r, query head h: softmax(q.K * scale) V over its kv_len tokens. */
static void fi_head(const kvf_fi_decode_args_t *a, int r, int h, int kv_len, float *sc)
{
    const kvf_fi_geom_t *g = &a->geom;
    const int hd = a->head_dim, kvh = h / (a->q_heads / a->kv_heads);
    const uint16_t *q = (const uint16_t *)a->q + ((size_t)r * a->q_heads + h) * hd;
    uint16_t *o = (uint16_t *)a->o + ((size_t)r * a->q_heads + h) * hd;
    float mx = -INFINITY, sum = 0.0f;

    for (int j = 0; j < kv_len; ++j) {
        const int32_t page = a->indices[a->indptr[r] + j / g->page_tokens];
        const uint16_t *k = (const uint16_t *)a->pool + (uint64_t)page * g->stride_page +
                            (uint64_t)kvh * g->stride_h + (uint64_t)(j % g->page_tokens) *
                            g->stride_n;
        float d = 0.0f;
        for (int e = 0; e < hd; ++e) {
            d += kvf_bf16_to_fp32(q[e]) * kvf_bf16_to_fp32(k[e]);
        }
        sc[j] = d * a->sm_scale;
        mx = (sc[j] > mx) ? sc[j] : mx;
    }
    for (int e = 0; e < hd; ++e) {
        float acc = 0.0f;
        sum = 0.0f;
        for (int j = 0; j < kv_len; ++j) {
            const int32_t page = a->indices[a->indptr[r] + j / g->page_tokens];
            const uint16_t *v = (const uint16_t *)a->pool + (uint64_t)page * g->stride_page +
                                g->v_offset + (uint64_t)kvh * g->stride_h +
                                (uint64_t)(j % g->page_tokens) * g->stride_n;
            const float p = expf(sc[j] - mx);
            sum += p;
            acc += p * kvf_bf16_to_fp32(v[e]);
        }
        o[e] = kvf_fp32_to_bf16(acc / sum);
    }
    a->lse[(size_t)r * a->q_heads + h] = mx + logf(sum);
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
    for (int r = 0; (sc != NULL) && (r < a->batch); ++r) {
        for (int h = 0; h < a->q_heads; ++h) {
            fi_head(a, r, h, kv_len[r], sc);
        }
    }
    free(sc);
    free(kv_len);
    return (sc != NULL) ? KVF_KERN_OK : KVF_KERN_ENOMEM;
}

void devsim_fi_report(FILE *f)
{
    pthread_mutex_lock(&fi_lock);
    fprintf(f, " fi_decode_calls %llu fi_plan_errors %llu", fi_calls, fi_errors);
    pthread_mutex_unlock(&fi_lock);
}
