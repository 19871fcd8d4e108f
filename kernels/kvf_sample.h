/*
 * Token sampling where the logits are: for each of @a rows rows of logits already on the
 * device, the sampled token id and, when asked, what its logprobs are made of, with vLLM's
 * sampling parameters (logit_bias, allowed_token_ids, bad_words' and min_tokens' masks,
 * penalties, temperature, min-p, top-k, top-p, logprobs: common/engine/kvf_sampler.h gives the semantics). Only the small per-row
 * results come back to the host; the [vocab] rows never do.
 *
 * Same tokens as common/engine's kvf_sampler_sample() for the same logits and draw, bit for
 * bit, by construction: every reduction over the vocabulary follows the one order of
 * kvf_sample_math.h (strided lanes + a fixed tree; maxima and counts are exact in
 * any order), the exponential is kvf_sample_exp_hd() (+ - * only), and the inverse CDF is
 * the descent of that tree. The log of the logprobs is taken on the host
 * (kvf_sample_res_logprob()), from the max and the sum the row returns, so no device libm
 * enters the numbers.
 *
 * Algorithm of one row (one CUDA block of KVF_SAMPLE_LANES threads; the CPU twin runs the
 * same steps with loops): penalised logits into a scratch row (a copy, or -inf everywhere
 * when the row allows only its listed tokens, plus the row's entries); argmax; greedy ends there. Else a pass keeps the tokens temperature and
 * min-p keep (weights exp((l - max) / T), recomputed where needed: no [vocab] doubles
 * stored) and prunes the rest to -inf in the scratch row, so later passes compute no
 * exponential for them. top-k: the k-th largest kept logit by bisection on its 32-bit order
 * key between the smallest kept and the largest (counts are exact), ties at it kept, the
 * rest pruned. top-p: the cut is the smallest rank key K such that the mass ranked strictly
 * before K, over the top-k set's mass, is below top_p (that mass is monotone in K): first
 * the order key by bisection, then, only when several kept tokens tie at it, the id part;
 * the rest pruned. Then the kept mass, the draw scaled to it, the tree descent to a lane
 * and that lane's scan. Passes over the row, at most: 1 + 32 (top-k) + 1 + 32 + 1 + 32
 * (top-p with a tie at the cut) + 1; typically far fewer (the bisections run over the
 * kept logits' range). Not measured on a GPU yet.
 *
 * Design: the sort that a serial sampler uses (kvf_sampler.c) becomes threshold searches:
 * a block cannot sort 131072 keys cheaply, but it can count and sum under a threshold, and
 * the rank of a token is a pure function of (logit, id), so "the tokens before this one"
 * is a key comparison. The per-row parameters, penalty entries and draws are uploaded in one
 * copy and the results downloaded in one (kvf_sample_batch.h).
 * Rejected: a radix select with per-bucket partial sums (fewer passes, but the masses would
 * be summed in another order than the CPU's, so the cut could differ by a rounding);
 * sampling on the host after copying the rows (8 MiB per step at vocab 131072, batch 16:
 * what this replaces); the exponential-race (Gumbel) draw (another distribution per seed than
 * the CPU's inverse CDF).
 */
#ifndef KVF_SAMPLE_H
#define KVF_SAMPLE_H

#include "kvf_device.h"
#include "kvf_sample_math.h"   /* KVF_SAMPLE_PEN_*, KVF_SAMPLE_GREEDY_EPS */

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVF_SAMPLE_MAX_TOP 20   /* top logprobs per row (KVF_SAMPLING_MAX_LOGPROBS) */

/** One row's parameters (already checked by kvf_sampling_check()). */
typedef struct kvf_sample_row {
    float    temperature;   /* below KVF_SAMPLE_GREEDY_EPS: greedy (argmax, no draw) */
    float    top_p;         /* in (0, 1): on; else off */
    int32_t  top_k;         /* > 0: on */
    float    min_p;         /* > 0: on */
    float    rep;           /* repetition penalty, 1: off (never 0) */
    float    freq, pres;    /* frequency and presence penalties */
    int32_t  want_logprobs; /* nonzero: fill the logprob fields of the result */
    int32_t  num_top;       /* top logprobs wanted, [0, KVF_SAMPLE_MAX_TOP] */
    int32_t  pen_start;     /* this row's entries: pen[pen_start .. pen_start + pen_count) */
    int32_t  pen_count;
    int32_t  allow_only;    /* nonzero: tokens without a KVF_SAMPLE_PEN_ALLOW entry get -inf */
    uint64_t draw;          /* the row's one 64-bit draw (kvf_sample_rng_next_hd) */
} kvf_sample_row_t;

/** A token of the request's history or masks; a row's entries have distinct ids. */
typedef struct kvf_sample_pen {
    int32_t id;             /* [0, vocab) */
    int32_t count;          /* occurrences among the outputs (frequency, presence) */
    int32_t flags;          /* KVF_SAMPLE_PEN_* (kvf_sample_math.h) */
    float   bias;           /* with KVF_SAMPLE_PEN_BIAS: added to the logit, finite */
} kvf_sample_pen_t;

/** One row's result. */
typedef struct kvf_sample_res {
    int32_t token;
    int32_t num_top;                          /* want_logprobs: entries below */
    float   token_logit;                      /* want_logprobs: the token's raw logit */
    float   max;                              /* want_logprobs: the raw row's max */
    double  sum;                              /* want_logprobs: sum of exp(raw - max) */
    int32_t top_ids[KVF_SAMPLE_MAX_TOP];      /* most likely first, lowest id on ties */
    float   top_logits[KVF_SAMPLE_MAX_TOP];   /* their raw logits */
} kvf_sample_res_t;

/**
 * Sample @a rows rows. Every pointer is memory of @a dev (host memory for the CPU).
 *
 * @param [in]  dev      NULL, the CPU or a CUDA device (enqueued on dev->stream).
 * @param [in]  logits   fp32 [rows][ldl], the raw logits (not modified).
 * @param [in]  rows     >= 0 (0: no-op). @param vocab >= 1, ldl >= vocab.
 * @param [in]  params   [rows]; @param pen the @a num_pen entries the rows point into
 *                       (NULL when num_pen is 0).
 * @param [out] scratch  fp32 [rows][vocab]: the penalised logits (contents undefined after).
 * @param [out] out      [rows].
 * @return KVF_KERN_OK; KVF_KERN_EINVAL (bad sizes, NULL, a parameter out of range, a
 *         penalty id outside the vocabulary: nothing written); KVF_KERN_ECUDA;
 *         KVF_KERN_EUNSUPPORTED (a CUDA device in a build without CUDA). The parameters
 *         are checked here on the CPU only; on a CUDA device they are device memory, checked
 *         on the host before the upload (kvf_sample_batch()).
 */
int kvf_sample_rows(const kvf_device_t *dev, const float *logits, int rows, int vocab, int ldl,
                    const kvf_sample_row_t *params, const kvf_sample_pen_t *pen, int num_pen,
                    float *scratch, kvf_sample_res_t *out);

/**
 * Check one row's parameters and its entries, within pen[0, num_pen), on the host (the
 * ranges of kvf_sample_row_t). @return KVF_KERN_OK or KVF_KERN_EINVAL.
 */
int kvf_sample_row_check(const kvf_sample_row_t *p, const kvf_sample_pen_t *pen, int num_pen,
                         int vocab);

/** The natural logprob of a raw logit of a row: (l - max) - log(sum), on the host. */
float kvf_sample_res_logprob(const kvf_sample_res_t *res, float logit);

#ifdef __cplusplus
}
#endif

#endif
