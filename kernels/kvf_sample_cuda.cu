/*
 * CUDA sampler (kvf_sample.h): one block of KVF_SAMPLE_LANES threads per row, thread t
 * being lane t of kvf_sample_math.h's order. Sums: each thread its lane's ids (t, t + L,
 * ...: the warp's reads coalesce) in ascending order, then the tree level by level in shared
 * memory (each node one addition of the same two values as the CPU twin's serial loop).
 * Counts, maxima and minima are exact in any order and use the same striding. The pick:
 * thread 0 descends the tree and scans the chosen lane. Enqueued on dev->stream; nothing is
 * synchronised here.
 */
#include "kvf_argmax_math.h"
#include "kvf_cuda_util.h"
#include "kvf_sample_cuda.h"

#define L KVF_SAMPLE_LANES

struct kvf_sample_smem {
    double   node[2 * L];
    float    cv[L];
    int32_t  ci[L];
    uint32_t key[L];
    int      cnt[L];
};

/* The block's argmax of x over the tokens ranked after (prev_v, prev_id) (prev_id < 0: all). */
static __device__ int32_t kvf_blk_argmax(kvf_sample_smem *s, const float *x, int vocab,
                                         float prev_v, int32_t prev_id)
{
    const int t = (int)threadIdx.x;
    kvf_argmax_cand_t c = {0.0f, -1};

    for (int i = t; i < vocab; i += L) {
        float v = x[i];
        if ((prev_id < 0) || (v < prev_v) || ((v == prev_v) && (i > prev_id))) {
            c = kvf_argmax_take(c, v, i);
        }
    }
    s->cv[t] = c.v;
    s->ci[t] = c.idx;
    __syncthreads();
    for (int w = L / 2; w > 0; w /= 2) {
        if (t < w) {
            kvf_argmax_cand_t a = {s->cv[t], s->ci[t]}, b = {s->cv[t + w], s->ci[t + w]};
            a = kvf_argmax_merge(a, b);
            s->cv[t] = a.v;
            s->ci[t] = a.idx;
        }
        __syncthreads();
    }
    int32_t r = s->ci[0];
    __syncthreads();
    return r;
}

/* The fixed-order sum (kvf_sample_math.h): leaves by lane, then the tree; node[] stays. */
static __device__ double kvf_blk_sum(kvf_sample_smem *s, const float *l, int vocab,
                                     const kvf_sample_keep_t *k, int use_before,
                                     uint64_t before)
{
    const int t = (int)threadIdx.x;

    s->node[L + t] = kvf_sample_lane_sum_hd(l, vocab, t, k, use_before, before);
    __syncthreads();
    for (int w = L / 2; w > 0; w /= 2) {
        if (t < w) {
            kvf_sample_tree_node_hd(s->node, w + t);
        }
        __syncthreads();
    }
    double r = s->node[1];
    __syncthreads();
    return r;
}

/* The block's sum of the threads' @a n. */
static __device__ int kvf_blk_add(kvf_sample_smem *s, int n)
{
    const int t = (int)threadIdx.x;

    s->cnt[t] = n;
    __syncthreads();
    for (int w = L / 2; w > 0; w /= 2) {
        if (t < w) {
            s->cnt[t] += s->cnt[t + w];
        }
        __syncthreads();
    }
    int r = s->cnt[0];
    __syncthreads();
    return r;
}

/* The block's minimum of the threads' @a m. */
static __device__ uint32_t kvf_blk_min(kvf_sample_smem *s, uint32_t m)
{
    const int t = (int)threadIdx.x;

    s->key[t] = m;
    __syncthreads();
    for (int w = L / 2; w > 0; w /= 2) {
        if ((t < w) && (s->key[t + w] < s->key[t])) {
            s->key[t] = s->key[t + w];
        }
        __syncthreads();
    }
    uint32_t r = (uint32_t)s->key[0];
    __syncthreads();
    return r;
}

/* Kept tokens (alive after pruning) whose order key is >= @a v (@a eq: == v). */
static __device__ int kvf_blk_count(kvf_sample_smem *s, const float *l, int vocab, uint32_t v,
                                    int eq)
{
    int n = 0;

    for (int i = (int)threadIdx.x; i < vocab; i += L) {
        uint32_t o = kvf_sample_okey_hd(l[i]);
        n += kvf_sample_alive_hd(l[i]) && (eq ? (o == v) : (o >= v));
    }
    return kvf_blk_add(s, n);
}

/* top-p over the kept logits @l (kvf_sample.c's kvf_twin_top_p, strided over the row; every
 * thread calls it alike): the tokens ranked after the cut pruned to -inf. */
static __device__ void kvf_blk_top_p(kvf_sample_smem *s, float *l, int vocab,
                                     const kvf_sample_keep_t *k, float top_p, uint32_t vlo,
                                     uint32_t vhi, uint64_t hi_key)
{
    const int t = (int)threadIdx.x;
    double total = kvf_blk_sum(s, l, vocab, k, 0, 0);
    uint32_t lo = vlo, hi = vhi;
    uint64_t cut;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (kvf_sample_top_p_keep_hd(kvf_blk_sum(s, l, vocab, k, 1,
                                                 kvf_sample_vkey_hd(mid)),
                                     total, top_p)) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    cut = (uint64_t)lo << 32;
    if (kvf_blk_count(s, l, vocab, lo, 1) > 1) {
        uint64_t klo = cut | (0xffffffffu - (uint32_t)(vocab - 1));
        uint64_t khi = (lo == vhi) ? hi_key : kvf_sample_vkey_hd(lo);
        while (klo < khi) {
            uint64_t mid = klo + (khi - klo) / 2;
            if (kvf_sample_top_p_keep_hd(kvf_blk_sum(s, l, vocab, k, 1, mid), total,
                                         top_p)) {
                khi = mid;
            } else {
                klo = mid + 1;
            }
        }
        cut = klo;
    }
    for (int i = t; i < vocab; i += L) {
        l[i] = (kvf_sample_alive_hd(l[i]) && (kvf_sample_rkey_hd(l[i], i) < cut)) ?
               -INFINITY : l[i];
    }
    __syncthreads();
}

/* The row's log-probability inputs into @o (thread 0 writes): the raw logits' max and
 * exp-sum, the chosen @token's logit and the @num_top largest; every thread calls it alike. */
static __device__ void kvf_blk_logprobs(kvf_sample_smem *s, const float *raw, int vocab,
                                        int num_top, int32_t token, kvf_sample_res_t *o)
{
    const int t = (int)threadIdx.x;
    int32_t top = kvf_blk_argmax(s, raw, vocab, 0.0f, -1);
    top = kvf_argmax_result(kvf_argmax_cand_t{0.0f, top}, raw[0]);
    kvf_sample_keep_t k1 = {raw[top], 1.0, 0.0f, 0, 0};
    double rsum = kvf_blk_sum(s, raw, vocab, &k1, 0, 0);
    int32_t prev = -1;
    if (t == 0) {
        o->max = raw[top];
        o->sum = rsum;
        o->token_logit = raw[token];
    }
    for (int n = 0; n < num_top; ++n) {
        int32_t id = kvf_blk_argmax(s, raw, vocab, (prev >= 0) ? raw[prev] : 0.0f, prev);
        if (id < 0) {
            break;
        }
        if (t == 0) {
            o->top_ids[n] = id;
            o->top_logits[n] = raw[id];
            o->num_top = n + 1;
        }
        prev = id;
    }
}

__global__ void __launch_bounds__(L)
kvf_sample_rows_kernel(const float *logits, int vocab, size_t ldl, const kvf_sample_row_t *params,
                       const kvf_sample_pen_t *pen, float *scratch, kvf_sample_res_t *out)
{
    __shared__ kvf_sample_smem s;
    __shared__ int32_t pick_s;
    const int t = (int)threadIdx.x;
    const kvf_sample_row_t p = params[blockIdx.x];
    const float *raw = logits + (size_t)blockIdx.x * ldl;
    float *l = scratch + (size_t)blockIdx.x * (size_t)vocab;
    kvf_sample_res_t *o = &out[blockIdx.x];
    int32_t best, token;

    if (t == 0) {   /* every byte of the result defined, as the CPU twin's memset */
        o->token = 0;
        o->num_top = 0;
        o->token_logit = 0.0f;
        o->max = 0.0f;
        o->sum = 0.0;
        for (int n = 0; n < KVF_SAMPLE_MAX_TOP; ++n) {
            o->top_ids[n] = 0;
            o->top_logits[n] = 0.0f;
        }
    }
    for (int i = t; i < vocab; i += L) {
        l[i] = p.allow_only ? -INFINITY : raw[i];
    }
    __syncthreads();
    for (int e = t; e < p.pen_count; e += L) {   /* distinct ids: no two threads collide */
        const kvf_sample_pen_t x = pen[p.pen_start + e];
        if (!p.allow_only || (x.flags & KVF_SAMPLE_PEN_ALLOW)) {
            l[x.id] = kvf_sample_pen_apply_hd(raw[x.id], x.count, x.flags, x.bias, p.rep,
                                              p.freq, p.pres);
        }
    }
    __syncthreads();
    best = kvf_blk_argmax(&s, l, vocab, 0.0f, -1);
    best = kvf_argmax_result(kvf_argmax_cand_t{0.0f, best}, l[0]);
    token = best;
    if (p.temperature >= KVF_SAMPLE_GREEDY_EPS) {
        /* the CPU twin's steps (kvf_sample.c), each pass strided over the row: a thread
         * only ever prunes its own ids, and every pass ends in a barrier */
        kvf_sample_keep_t k = {l[best], 1.0 / (double)p.temperature, p.min_p, 0, 0};
        const uint32_t vhi = kvf_sample_okey_hd(k.max);
        const uint64_t hi_key = kvf_sample_rkey_hd(k.max, best);
        uint32_t vlo = vhi;
        int kept = 0;
        double sum;

        __syncthreads();   /* every thread has read l[best] and l[0] before any is pruned */
        for (int i = t; i < vocab; i += L) {
            if (kvf_sample_kept_hd(&k, l[i], i) > 0.0) {
                uint32_t v = kvf_sample_okey_hd(l[i]);
                kept++;
                vlo = (v < vlo) ? v : vlo;
            } else {
                l[i] = -INFINITY;
            }
        }
        kept = kvf_blk_add(&s, kept);
        vlo = kvf_blk_min(&s, vlo);
        if ((p.top_k > 0) && (p.top_k < kept)) {
            uint32_t lo = vlo, hi = vhi;
            while (lo < hi) {   /* uniform across the block: every thread iterates alike */
                uint32_t mid = lo + (uint32_t)(((uint64_t)hi - lo + 1) / 2);
                if (kvf_blk_count(&s, l, vocab, mid, 0) >= p.top_k) {
                    lo = mid;
                } else {
                    hi = mid - 1;
                }
            }
            for (int i = t; i < vocab; i += L) {
                l[i] = (kvf_sample_okey_hd(l[i]) < lo) ? -INFINITY : l[i];
            }
            __syncthreads();
            vlo = lo;
        }
        if ((kept > 0) && (p.top_p > 0.0f) && (p.top_p < 1.0f)) {
            kvf_blk_top_p(&s, l, vocab, &k, p.top_p, vlo, vhi, hi_key);
        }
        sum = kvf_blk_sum(&s, l, vocab, &k, 0, 0);
        if (t == 0) {
            /* node[] still holds the kept mass's tree (kvf_blk_sum leaves it) */
            double u = kvf_sample_target_hd(p.draw, sum), acc = 0.0;
            int lane = kvf_sample_descend_hd(s.node, &u);
            int32_t pick = -1, last = -1;
            for (int i = lane; i < vocab; i += L) {
                double w = kvf_sample_kept_hd(&k, l[i], i);
                last = (w > 0.0) ? i : last;
                if (kvf_sample_cdf_step_hd(&acc, w, u)) {
                    pick = i;
                    break;
                }
            }
            pick_s = (pick >= 0) ? pick : (last >= 0) ? last : best;
        }
        __syncthreads();
        token = pick_s;
    }
    if (t == 0) {
        o->token = token;
    }
    if (p.want_logprobs) {
        kvf_blk_logprobs(&s, raw, vocab, p.num_top, token, o);
    }
}

extern "C" int kvf_cuda_sample_rows(const kvf_device_t *dev, const float *logits, int rows,
                                    int vocab, int ldl, const kvf_sample_row_t *params,
                                    const kvf_sample_pen_t *pen, float *scratch,
                                    kvf_sample_res_t *out)
{
    kvf_sample_rows_kernel<<<(unsigned)rows, L, 0, kvf_cuda_stream_of(dev)>>>(
        logits, vocab, (size_t)ldl, params, pen, scratch, out);
    return kvf_cuda_launched("kvf_sample_rows_kernel");
}
