/*
 * kvf_sample_rows(): checks, the CPU twin of the CUDA sampler and the dispatch to
 * kvf_sample_cuda.cu. The twin runs the kernel's steps (kvf_sample.h) with loops: each
 * "block reduction" is a loop over the lanes and the fixed tree of kvf_sample_math.h, so
 * its bits are the kernel's. common/engine's kvf_sampler_sample() reaches the same tokens
 * by another road (a sort); tests/kernels/test_kern_sample.c checks the two agree.
 */
#include "kvf_sample.h"
#include "kvf_argmax_math.h"
#include "kvf_kern_internal.h"

#include <math.h>
#include <string.h>

#ifdef KVF_HAVE_CUDA
#include "kvf_sample_cuda.h"
#endif

/* The result rows are compared and copied as bytes: no padding in them. */
_Static_assert(sizeof(kvf_sample_res_t) ==
               4 * sizeof(int32_t) + sizeof(double) + KVF_SAMPLE_MAX_TOP * 8,
               "kvf_sample_res_t has padding");

int kvf_sample_row_check(const kvf_sample_row_t *p, const kvf_sample_pen_t *pen, int num_pen,
                         int vocab)
{
    if (!(p->temperature >= 0.0f) || !(p->top_p >= 0.0f) || !(p->top_p <= 1.0f) ||
        !(p->min_p >= 0.0f) || !(p->min_p <= 1.0f) || !(p->rep > 0.0f) || !isfinite(p->rep) ||
        !isfinite(p->freq) || !isfinite(p->pres) || !isfinite(p->temperature) ||
        (p->num_top < 0) || (p->num_top > KVF_SAMPLE_MAX_TOP) || (p->pen_start < 0) ||
        (p->pen_count < 0) || (p->pen_start > num_pen) ||
        (p->pen_count > num_pen - p->pen_start) || ((p->pen_count > 0) && (pen == NULL))) {
        return KVF_KERN_EINVAL;
    }
    for (int e = 0; e < p->pen_count; ++e) {
        const kvf_sample_pen_t *x = &pen[p->pen_start + e];
        if ((x->id < 0) || (x->id >= vocab) || (x->count < 0) ||
            ((x->flags & KVF_SAMPLE_PEN_BIAS) && !isfinite(x->bias))) {
            return KVF_KERN_EINVAL;
        }
    }
    return KVF_KERN_OK;
}

float kvf_sample_res_logprob(const kvf_sample_res_t *res, float logit)
{
    return kvf_sample_logprob_hd(logit, res->max, res->sum);
}

/* The "block reduction" of a sum: every lane, then the tree (kvf_sample_math.h). */
static double kvf_twin_sum(const float *l, int vocab, const kvf_sample_keep_t *k,
                           int use_before, uint64_t before, double *node)
{
    for (int t = 0; t < KVF_SAMPLE_LANES; ++t) {
        node[KVF_SAMPLE_LANES + t] = kvf_sample_lane_sum_hd(l, vocab, t, k, use_before, before);
    }
    return kvf_sample_tree_hd(node);
}

/* Index of the largest non-NaN value of @a x that ranks after (prev_v, prev_id) in the
 * order (value desc, id asc); prev_id < 0: any. -1 when none. */
static int32_t kvf_twin_next(const float *x, int vocab, float prev_v, int32_t prev_id)
{
    kvf_argmax_cand_t c = {0.0f, -1};

    for (int i = 0; i < vocab; ++i) {
        if ((prev_id < 0) || (x[i] < prev_v) || ((x[i] == prev_v) && (i > prev_id))) {
            c = kvf_argmax_take(c, x[i], i);
        }
    }
    return c.idx;
}

/* top-p over the kept logits @l (in place): the tokens ranked after the cut pruned to -inf.
 * @vlo, @vhi: the order keys of the smallest and largest kept logit; @hi_key: the rank key of
 * the largest. */
static void kvf_twin_top_p(float *l, int vocab, const kvf_sample_keep_t *k, float top_p,
                           uint32_t vlo, uint32_t vhi, uint64_t hi_key, double *node)
{
    /* the smallest rank key K whose mass ahead (kept tokens ranked before K), over
     * the total, is below top_p: first its order key v (the mass ahead of
     * (v, any id) is that of the logits above v), then, when several kept tokens
     * tie at v, the id part; tokens ranked after K pruned */
    double total = kvf_twin_sum(l, vocab, k, 0, 0, node);
    uint32_t lo = vlo, hi = vhi;
    uint64_t klo, khi, cut;
    int ties = 0;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (kvf_sample_top_p_keep_hd(kvf_twin_sum(l, vocab, k, 1,
                                                  kvf_sample_vkey_hd(mid), node),
                                     total, top_p)) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    for (int i = 0; i < vocab; ++i) {
        ties += kvf_sample_alive_hd(l[i]) && (kvf_sample_okey_hd(l[i]) == lo);
    }
    cut = (uint64_t)lo << 32;
    if (ties > 1) {
        klo = cut | (0xffffffffu - (uint32_t)(vocab - 1));
        khi = (lo == vhi) ? hi_key : kvf_sample_vkey_hd(lo);
        while (klo < khi) {
            uint64_t mid = klo + (khi - klo) / 2;
            if (kvf_sample_top_p_keep_hd(kvf_twin_sum(l, vocab, k, 1, mid, node),
                                         total, top_p)) {
                khi = mid;
            } else {
                klo = mid + 1;
            }
        }
        cut = klo;
    }
    for (int i = 0; i < vocab; ++i) {
        l[i] = (kvf_sample_alive_hd(l[i]) && (kvf_sample_rkey_hd(l[i], i) < cut)) ?
               -INFINITY : l[i];
    }
}

/* The row's log-probability inputs: the raw logits' max and exp-sum, the chosen token's logit
 * and the num_top largest, in the order (value desc, id asc). */
static void kvf_twin_logprobs(const float *raw, int vocab, const kvf_sample_row_t *p,
                              double *node, kvf_sample_res_t *out)
{
    kvf_argmax_cand_t r = {0.0f, -1};
    int32_t top;
    for (int i = 0; i < vocab; ++i) {
        r = kvf_argmax_take(r, raw[i], i);
    }
    top = kvf_argmax_result(r, raw[0]);
    {
        kvf_sample_keep_t k1 = {raw[top], 1.0, 0.0f, 0, 0};
        out->max = raw[top];
        out->sum = kvf_twin_sum(raw, vocab, &k1, 0, 0, node);
    }
    out->token_logit = raw[out->token];
    for (int n = 0; n < p->num_top; ++n) {
        int32_t id = kvf_twin_next(raw, vocab, (n > 0) ? raw[out->top_ids[n - 1]] : 0.0f,
                                   (n > 0) ? out->top_ids[n - 1] : -1);
        if (id < 0) {
            break;
        }
        out->top_ids[n] = id;
        out->top_logits[n] = raw[id];
        out->num_top = n + 1;
    }
}

static void kvf_twin_row(const float *raw, int vocab, const kvf_sample_row_t *p,
                         const kvf_sample_pen_t *pen, float *l, kvf_sample_res_t *out)
{
    double node[2 * KVF_SAMPLE_LANES];
    kvf_argmax_cand_t c = {0.0f, -1};
    int32_t best;

    for (int i = 0; i < vocab; ++i) {
        l[i] = p->allow_only ? -INFINITY : raw[i];
    }
    for (int e = 0; e < p->pen_count; ++e) {
        const kvf_sample_pen_t *x = &pen[p->pen_start + e];
        if (!p->allow_only || (x->flags & KVF_SAMPLE_PEN_ALLOW)) {
            l[x->id] = kvf_sample_pen_apply_hd(raw[x->id], x->count, x->flags, x->bias, p->rep,
                                               p->freq, p->pres);
        }
    }
    for (int i = 0; i < vocab; ++i) {
        c = kvf_argmax_take(c, l[i], i);
    }
    best = kvf_argmax_result(c, l[0]);
    memset(out, 0, sizeof(*out));
    out->token = best;
    if (p->temperature >= KVF_SAMPLE_GREEDY_EPS) {
        kvf_sample_keep_t k = {l[best], 1.0 / (double)p->temperature, p->min_p, 0, 0};
        const uint32_t vhi = kvf_sample_okey_hd(k.max);
        const uint64_t hi_key = kvf_sample_rkey_hd(k.max, best);
        uint32_t vlo = vhi;
        double sum, u, acc = 0.0;
        int32_t pick = -1, last = -1;
        int lane, kept = 0;

        /* pass 1: the tokens temperature and min-p keep; the rest pruned to -inf */
        for (int i = 0; i < vocab; ++i) {
            if (kvf_sample_kept_hd(&k, l[i], i) > 0.0) {
                uint32_t v = kvf_sample_okey_hd(l[i]);
                kept++;
                vlo = (v < vlo) ? v : vlo;
            } else {
                l[i] = -INFINITY;
            }
        }
        if ((p->top_k > 0) && (p->top_k < kept)) {
            /* the largest order key v with at least top_k kept tokens at or above it (the
             * k-th largest kept logit), bisected over [vlo, vhi]; below it pruned */
            uint32_t lo = vlo, hi = vhi;
            while (lo < hi) {
                uint32_t mid = lo + (uint32_t)(((uint64_t)hi - lo + 1) / 2);
                int n = 0;
                for (int i = 0; i < vocab; ++i) {
                    n += kvf_sample_alive_hd(l[i]) && (kvf_sample_okey_hd(l[i]) >= mid);
                }
                if (n >= p->top_k) {
                    lo = mid;
                } else {
                    hi = mid - 1;
                }
            }
            for (int i = 0; i < vocab; ++i) {
                l[i] = (kvf_sample_okey_hd(l[i]) < lo) ? -INFINITY : l[i];
            }
            vlo = lo;
        }
        if ((kept > 0) && (p->top_p > 0.0f) && (p->top_p < 1.0f)) {
            kvf_twin_top_p(l, vocab, &k, p->top_p, vlo, vhi, hi_key, node);
        }
        sum = kvf_twin_sum(l, vocab, &k, 0, 0, node);
        u = kvf_sample_target_hd(p->draw, sum);
        lane = kvf_sample_descend_hd(node, &u);
        for (int i = lane; i < vocab; i += KVF_SAMPLE_LANES) {
            double w = kvf_sample_kept_hd(&k, l[i], i);
            last = (w > 0.0) ? i : last;
            if (kvf_sample_cdf_step_hd(&acc, w, u)) {
                pick = i;
                break;
            }
        }
        out->token = (pick >= 0) ? pick : (last >= 0) ? last : best;
    }
    if (p->want_logprobs) {
        kvf_twin_logprobs(raw, vocab, p, node, out);
    }
}

int kvf_sample_rows(const kvf_device_t *dev, const float *logits, int rows, int vocab, int ldl,
                    const kvf_sample_row_t *params, const kvf_sample_pen_t *pen, int num_pen,
                    float *scratch, kvf_sample_res_t *out)
{
    if ((rows < 0) || (vocab < 1) || (ldl < vocab) || (num_pen < 0)) {
        return KVF_KERN_EINVAL;
    }
    if (rows == 0) {
        return KVF_KERN_OK;
    }
    if ((logits == NULL) || (params == NULL) || (scratch == NULL) || (out == NULL)) {
        return KVF_KERN_EINVAL;
    }
    if (!kvf_kern_on_cpu(dev)) {
#ifdef KVF_HAVE_CUDA
        return kvf_cuda_sample_rows(dev, logits, rows, vocab, ldl, params, pen, scratch, out);
#else
        return KVF_KERN_EUNSUPPORTED;
#endif
    }
    for (int r = 0; r < rows; ++r) {
        if (kvf_sample_row_check(&params[r], pen, num_pen, vocab) != KVF_KERN_OK) {
            return KVF_KERN_EINVAL;
        }
    }
    for (int r = 0; r < rows; ++r) {
        kvf_twin_row(logits + (size_t)r * (size_t)ldl, vocab, &params[r], pen,
                     scratch + (size_t)r * (size_t)vocab, &out[r]);
    }
    return KVF_KERN_OK;
}
