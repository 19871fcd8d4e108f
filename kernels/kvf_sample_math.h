/*
 * Shared (CPU and CUDA) arithmetic of token sampling (common/engine/kvf_sampler.h):
 * the per-token bodies of the penalties, the temperature, the min-p test and
 * the request's random numbers, the exponential (+ - * only, so no libm enters), the
 * one order every sum over the vocabulary follows (strided lanes + a fixed
 * tree), the inverse CDF as a descent of that tree, and the rank keys of the
 * "larger logit, then lower id" order. The CPU sampler (a sort) and the device
 * sampler (kernels/kvf_sample.h: threshold searches; its CPU twin and its CUDA
 * kernel) are built from these alone, so all three draw the same token from the same
 * logits and seed, bit for bit.
 *
 * Semantics are vLLM's (facts of its sampler, not its code):
 *   repetition penalty r (prompt and output tokens seen): l > 0 ? l / r : l * r
 *   frequency f, presence p (output tokens, count c):     l - f * c - p * (c > 0)
 *   temperature T: weights exp((l - max) / T); T below 1e-5 is greedy
 *   min-p m: keep a token whose probability is at least m times the largest
 *   top-k / top-p (nucleus) run on what min-p kept (kvf_sampler.c).
 * Source: vLLM SamplingParams documentation and its sampler's order (penalties,
 * temperature, min-p, top-k, top-p).
 */
#ifndef KVF_SAMPLE_MATH_H
#define KVF_SAMPLE_MATH_H

#include "kvf_hd.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/* Below this temperature a request samples greedily (vLLM's epsilon). */
#define KVF_SAMPLE_GREEDY_EPS 1e-5f

/* The penalised logit of one token: @a seen in the prompt or the output, @a count in
 * the output. rep 1, freq 0, pres 0 leave it as it is. Each operation rounds once, as
 * written (no FMA contraction of freq * count + pres on the device). */
static inline KVF_HD float kvf_sample_penalize_hd(float logit, int seen, int count, float rep,
                                                  float freq, float pres)
{
#ifdef __CUDA_ARCH__
    if (seen && (rep != 1.0f)) {
        logit = (logit > 0.0f) ? __fdiv_rn(logit, rep) : __fmul_rn(logit, rep);
    }
    if (count > 0) {
        logit = __fsub_rn(logit, __fadd_rn(__fmul_rn(freq, (float)count), pres));
    }
#else
    if (seen && (rep != 1.0f)) {
        logit = (logit > 0.0f) ? logit / rep : logit * rep;
    }
    if (count > 0) {
        logit -= freq * (float)count + pres;
    }
#endif
    return logit;
}

/* ---- exact-rounding arithmetic: the same bits on the host and the device ----------------
 * Each product, sum and quotient below rounds once, as written: under nvcc the _rn
 * intrinsics (never contracted into an FMA); on the host plain operators, in files compiled
 * with -ffp-contract=off (kernels/ and common/engine CMakeLists set it for the files that use
 * this header; x86-64's baseline has no FMA to contract into anyway). */
static inline KVF_HD double kvf_sample_dadd(double a, double b)
{
#ifdef __CUDA_ARCH__
    return __dadd_rn(a, b);
#else
    return a + b;
#endif
}

static inline KVF_HD double kvf_sample_dmul(double a, double b)
{
#ifdef __CUDA_ARCH__
    return __dmul_rn(a, b);
#else
    return a * b;
#endif
}

static inline KVF_HD double kvf_sample_ddiv(double a, double b)
{
#ifdef __CUDA_ARCH__
    return __ddiv_rn(a, b);
#else
    return a / b;
#endif
}

/*
 * exp(x) in double from + - * and rint only, so the CPU and a GPU give the same bits
 * (libm's exp and CUDA's differ in the last place). x = k ln2 + r with |r| <= ln2 / 2
 * (Cody-Waite: ln2 split in a high part with 11 trailing zero bits, so k * ln2_hi is exact),
 * exp(r) by the Taylor polynomial of degree 13 in Horner form (truncation below 5e-18),
 * times 2^k built from its bits. Within 2 ulp of exp (tests/kernels/test_kern_sample.c
 * measures it). Defined as 0 below -707 (where 2^k would near the subnormals; such a weight
 * is below 1e-307 of the largest, whose weight is 1) and for -inf; NaN stays NaN.
 */
static inline KVF_HD double kvf_sample_exp_hd(double x)
{
    double k, r, p, two_k;
    uint64_t bits;

    if (x != x) {
        return x;
    }
    if (x < -707.0) {
        return 0.0;
    }
    if (x > 709.0) {
        return (double)INFINITY;
    }
    k = rint(kvf_sample_dmul(x, 0x1.71547652b82fep+0));
    r = kvf_sample_dadd(x, -kvf_sample_dmul(k, 0x1.62e42fee00000p-1));
    r = kvf_sample_dadd(r, -kvf_sample_dmul(k, 0x1.a39ef35793c76p-33));
    p = 0x1.6124613a86d09p-33;   /* 1/n!, n = 13 down to 0 */
    p = kvf_sample_dadd(kvf_sample_dmul(p, r), 0x1.1eed8eff8d898p-29);
    p = kvf_sample_dadd(kvf_sample_dmul(p, r), 0x1.ae64567f544e4p-26);
    p = kvf_sample_dadd(kvf_sample_dmul(p, r), 0x1.27e4fb7789f5cp-22);
    p = kvf_sample_dadd(kvf_sample_dmul(p, r), 0x1.71de3a556c734p-19);
    p = kvf_sample_dadd(kvf_sample_dmul(p, r), 0x1.a01a01a01a01ap-16);
    p = kvf_sample_dadd(kvf_sample_dmul(p, r), 0x1.a01a01a01a01ap-13);
    p = kvf_sample_dadd(kvf_sample_dmul(p, r), 0x1.6c16c16c16c17p-10);
    p = kvf_sample_dadd(kvf_sample_dmul(p, r), 0x1.1111111111111p-7);
    p = kvf_sample_dadd(kvf_sample_dmul(p, r), 0x1.5555555555555p-5);
    p = kvf_sample_dadd(kvf_sample_dmul(p, r), 0x1.5555555555555p-3);
    p = kvf_sample_dadd(kvf_sample_dmul(p, r), 0x1.0000000000000p-1);
    p = kvf_sample_dadd(kvf_sample_dmul(p, r), 0x1.0000000000000p+0);
    p = kvf_sample_dadd(kvf_sample_dmul(p, r), 0x1.0000000000000p+0);
    bits = (uint64_t)((int64_t)k + 1023) << 52;
    memcpy(&two_k, &bits, sizeof(two_k));
    return kvf_sample_dmul(p, two_k);
}

/* The unnormalised probability of a logit: exp((l - max) / T), in double
 * (kvf_sample_exp_hd). -inf: 0. */
static inline KVF_HD double kvf_sample_weight_hd(float logit, float max, double inv_t)
{
    return kvf_sample_exp_hd(kvf_sample_dmul(kvf_sample_dadd((double)logit, -(double)max), inv_t));
}

/* Whether min-p keeps a token: its weight (relative to the largest, which is 1) >= m. */
static inline KVF_HD int kvf_sample_min_p_keep_hd(double weight, float min_p)
{
    return weight >= (double)min_p;
}

/* The request's generator: splitmix64, one 64-bit draw per sampled token. */
static inline KVF_HD uint64_t kvf_sample_rng_next_hd(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* A draw as a double in [0, 1) (53 bits). */
static inline KVF_HD double kvf_sample_uniform_hd(uint64_t draw)
{
    return (double)(draw >> 11) * (1.0 / 9007199254740992.0);
}

/* The natural log-probability of a logit under log-softmax with max @a max and
 * sum of exp(l - max) @a sum. */
static inline KVF_HD float kvf_sample_logprob_hd(float logit, float max, double sum)
{
    return (float)(((double)logit - (double)max) - log(sum));
}


/* ---- the one summation order of a row (both samplers, every sum over the vocabulary) ----
 *
 * A row of V doubles is summed as KVF_SAMPLE_LANES lanes: lane t holds the ids t, t + LANES,
 * t + 2 LANES, ... < V, summed in ascending id from +0 (a token outside the set being summed
 * adds nothing); then a binary tree over the lanes in heap layout: node[LANES + t] = lane t,
 * node[n] = node[2n] + node[2n + 1] for n = LANES - 1 down to 1, node[1] the sum. The
 * inverse CDF follows the same order: the tree descended to a lane (left = lower lanes),
 * then that lane's ids in ascending order (kvf_sample_descend_hd, kvf_sample_cdf_step_hd):
 * an exact inverse CDF over a fixed permutation of the ids. The CUDA sampler runs one thread
 * per lane (a warp reads 32 consecutive logits: coalesced) and the tree level by level in
 * shared memory: each node is one addition of the same two values, so the bits are the
 * CPU's whatever the schedule.
 *
 * Sums of nonnegative terms in this order are monotone in the set summed (rounding is
 * monotone), which is what lets a sampler find top-p's cut by bisection.
 */
#define KVF_SAMPLE_LANES 512

/** Tree node @a n (1 <= n < LANES) from its children; node: [2 * LANES]. */
static inline KVF_HD void kvf_sample_tree_node_hd(double *node, int n)
{
    node[n] = kvf_sample_dadd(node[2 * n], node[2 * n + 1]);
}

/** The whole tree over the leaves node[LANES..2 LANES), serially; returns node[1]. */
static inline KVF_HD double kvf_sample_tree_hd(double *node)
{
    for (int n = KVF_SAMPLE_LANES - 1; n >= 1; --n) {
        kvf_sample_tree_node_hd(node, n);
    }
    return node[1];
}

/**
 * The lane holding the draw @a *u (in [0, node[1]]): from the root, right when u >= the
 * left child's sum and the right child has mass (then u -= left), else left. *u leaves as
 * the offset within the lane. Only nodes with mass are entered, so the lane has a kept token.
 */
static inline KVF_HD int kvf_sample_descend_hd(const double *node, double *u)
{
    int n = 1;

    while (n < KVF_SAMPLE_LANES) {
        double left = node[2 * n], right = node[2 * n + 1];
        if ((*u >= left) && (right > 0.0)) {
            *u = kvf_sample_dadd(*u, -left);
            n = 2 * n + 1;
        } else {
            n = 2 * n;
        }
    }
    return n - KVF_SAMPLE_LANES;
}

/**
 * One token of the lane's scan, in ascending id: @a acc += w; true when this token is the
 * pick (w > 0 and u < acc). A lane whose scan picks nothing (rounding) takes its last token
 * with w > 0.
 */
static inline KVF_HD int kvf_sample_cdf_step_hd(double *acc, double w, double u)
{
    if (!(w > 0.0)) {
        return 0;
    }
    *acc = kvf_sample_dadd(*acc, w);
    return u < *acc;
}

/** The draw scaled to the kept mass: uniform(draw) * sum. */
static inline KVF_HD double kvf_sample_target_hd(uint64_t draw, double sum)
{
    return kvf_sample_dmul(kvf_sample_uniform_hd(draw), sum);
}

/** top-p's test of a token whose higher-ranked kept tokens weigh @a before of @a total. */
static inline KVF_HD int kvf_sample_top_p_keep_hd(double before, double total, float top_p)
{
    return kvf_sample_ddiv(before, total) < (double)top_p;
}

/* ---- rank keys: the order "larger logit first, lower id first on ties" as integers ---- */

/** A logit as an unsigned key, larger for larger values; -0 and +0 map alike (they tie). */
static inline KVF_HD uint32_t kvf_sample_okey_hd(float l)
{
    uint32_t u;

    if (l == 0.0f) {
        l = 0.0f;
    }
    memcpy(&u, &l, sizeof(u));
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/** A token's rank key: larger means earlier in the order (logit, then lower id). */
static inline KVF_HD uint64_t kvf_sample_rkey_hd(float l, int32_t id)
{
    return ((uint64_t)kvf_sample_okey_hd(l) << 32) | (uint64_t)(0xffffffffu - (uint32_t)id);
}


/** The largest rank key of order key @a v: "ranked before it" = "logit above v". */
static inline KVF_HD uint64_t kvf_sample_vkey_hd(uint32_t v)
{
    return ((uint64_t)v << 32) | 0xffffffffu;
}

/** A token still kept after the device sampler's pruning passes (those set the rest -inf). */
static inline KVF_HD int kvf_sample_alive_hd(float l)
{
    return l > -INFINITY;
}

/* ---- what a pass keeps: the shared predicate of both samplers ------------------------- */

/* kvf_sample_pen_t.flags (kvf_sample.h) */
#define KVF_SAMPLE_PEN_SEEN  1   /* in the prompt or the output: penalised */
#define KVF_SAMPLE_PEN_MASK  2   /* -inf (EOS or a stop id below min_tokens, a bad word's end) */
#define KVF_SAMPLE_PEN_BIAS  4   /* logit_bias: the entry's bias added first */
#define KVF_SAMPLE_PEN_ALLOW 8   /* allowed_token_ids: kept when the row allows only these */

/**
 * A listed token's logit, in vLLM's order: logit_bias added, then the penalties when seen,
 * then -inf when masked. (A row that allows only its ALLOW entries starts every other
 * token at -inf: kvf_sample_row_t.allow_only.)
 */
static inline KVF_HD float kvf_sample_pen_apply_hd(float logit, int32_t count, int32_t flags,
                                                   float bias, float rep, float freq,
                                                   float pres)
{
    if (flags & KVF_SAMPLE_PEN_BIAS) {
#ifdef __CUDA_ARCH__
        logit = __fadd_rn(logit, bias);
#else
        logit += bias;
#endif
    }
    if (flags & KVF_SAMPLE_PEN_SEEN) {
        logit = kvf_sample_penalize_hd(logit, 1, count, rep, freq, pres);
    }
    return (flags & KVF_SAMPLE_PEN_MASK) ? -INFINITY : logit;
}

/** The filters in force during a pass; a token passes when its weight is kept by all. */
typedef struct kvf_sample_keep {
    float    max;     /* the (penalised) row's largest logit: its weight is 1 */
    double   inv_t;   /* 1 / temperature */
    float    min_p;   /* > 0: min-p on */
    uint32_t kth;     /* top-k: order key (kvf_sample_okey_hd) >= kth; 0: no cut */
    uint64_t cut;     /* top-p: rank key (kvf_sample_rkey_hd) >= cut; 0: no cut */
} kvf_sample_keep_t;

/** The weight of token @a id with logit @a l if every filter keeps it, else 0 (NaN: 0). */
static inline KVF_HD double kvf_sample_kept_hd(const kvf_sample_keep_t *k, float l, int32_t id)
{
    double w = kvf_sample_weight_hd(l, k->max, k->inv_t);

    if (!(w > 0.0) || ((k->min_p > 0.0f) && !kvf_sample_min_p_keep_hd(w, k->min_p))) {
        return 0.0;
    }
    if ((kvf_sample_okey_hd(l) < k->kth) || (kvf_sample_rkey_hd(l, id) < k->cut)) {
        return 0.0;
    }
    return w;
}

/**
 * Lane @a t's sum of the kept weights of row @a l (ids in ascending order), over the tokens
 * ranked strictly before rank key @a before when @a use_before (top-p's mass ahead of a cut).
 */
static inline KVF_HD double kvf_sample_lane_sum_hd(const float *l, int vocab, int t,
                                                   const kvf_sample_keep_t *k, int use_before,
                                                   uint64_t before)
{
    double acc = 0.0;

    for (int i = t; i < vocab; i += KVF_SAMPLE_LANES) {
        double w = kvf_sample_kept_hd(k, l[i], i);
        if ((w > 0.0) && (!use_before || (kvf_sample_rkey_hd(l[i], i) > before))) {
            acc = kvf_sample_dadd(acc, w);
        }
    }
    return acc;
}

#endif
