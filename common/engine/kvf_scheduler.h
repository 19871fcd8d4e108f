/*
 * Continuous-batching scheduler: which requests run in the next step and
 * with how many tokens, and the blocks they need for it.
 *
 * A request is a token list (prompt, then sampled outputs) and a count of
 * tokens whose cache state is computed. Each step feeds a request its next
 * uncomputed tokens: a prefill chunk, or the one pending token of a
 * decoding request; when a step reaches the end of the known tokens the
 * engine samples the next one. Prefill and decode share one batch.
 *
 * Policy (vLLM-like, simplified): requests already running get their
 * decode token first, in arrival order; then the requests waiting for
 * prefill get, in arrival order, up to a quarter of the step budget each,
 * and what is left goes to those closest to done first. So a short prompt
 * is never stuck behind a long prompt's whole prefill, and under
 * saturation requests still finish roughly in arrival order. Blocks are
 * allocated in arrival order, stopping at the first request that does not
 * fit. When a
 * running request cannot get a block, the most recently arrived running
 * request is preempted (its blocks freed, its tokens recomputed later).
 */
#ifndef KVF_SCHEDULER_H
#define KVF_SCHEDULER_H

#include "kvf_block_manager.h"
#include "kvf_sampling_limits.h"

#include <stdbool.h>
#include <stdint.h>

typedef enum {
    KVF_REQ_WAITING = 0,   /* admitted, nothing computed (or preempted) */
    KVF_REQ_RUNNING,       /* has blocks; prefilling in chunks or decoding */
    KVF_REQ_PREFILLED,     /* prefill-only request done: blocks held, first token sampled */
    KVF_REQ_IMPORTING,     /* blocks allocated for an external fill, not yet committed */
    KVF_REQ_FINISHED,      /* done; blocks released */
} kvf_req_state_t;

typedef enum {
    KVF_FINISH_NONE = 0,
    KVF_FINISH_LENGTH,     /* max_tokens reached */
    KVF_FINISH_EOS,        /* sampled the EOS token */
    KVF_FINISH_ABORT,      /* kvf_engine_abort() */
    KVF_FINISH_ERROR,      /* a step failed */
} kvf_finish_reason_t;

/* KVF_SAMPLING_MAX_*: base/kvf_sampling_limits.h (the proxy checks the same limits) */

/**
 * Sampling of one request. temperature <= 0 is greedy (lowest id on ties).
 * The fields after ignore_eos (kvf_sampler.h: semantics, ranges) are off when zero,
 * so a zeroed struct with a temperature samples as before they existed.
 */
typedef struct kvf_sampling {
    float    temperature;
    uint64_t seed;         /* seeds the request's own RNG */
    int      max_tokens;   /* generated tokens including the first; >= 1 */
    bool     ignore_eos;
    float    top_p;               /* (0, 1]; 0: off (1) */
    int      top_k;               /* >= 1; <= 0: off */
    float    min_p;               /* [0, 1] */
    float    presence_penalty;    /* [-2, 2] */
    float    frequency_penalty;   /* [-2, 2] */
    float    repetition_penalty;  /* > 0; 0: off (1) */
    int      min_tokens;          /* [0, max_tokens]: EOS and stop ids masked before */
    int      num_stop_token_ids;  /* [0, KVF_SAMPLING_MAX_STOP_IDS] */
    int32_t  stop_token_ids[KVF_SAMPLING_MAX_STOP_IDS];  /* finish ("stop") when sampled */
    int      logprobs;            /* with want_logprobs: top logprobs per token,
                                   * [0, KVF_SAMPLING_MAX_LOGPROBS] */
    bool     want_logprobs;       /* report each sampled token's logprob */
    /* vLLM's logit_bias, allowed_token_ids and bad_words (kvf_sampler.h: the order) */
    int      num_logit_bias;      /* [0, KVF_SAMPLING_MAX_BIAS], distinct ids */
    int32_t  bias_ids[KVF_SAMPLING_MAX_BIAS];
    float    bias_values[KVF_SAMPLING_MAX_BIAS];     /* added to the logit, [-100, 100] */
    int      num_allowed;         /* > 0: only these ids may be sampled */
    int32_t  allowed_ids[KVF_SAMPLING_MAX_ALLOWED];
    int      num_bad_words;       /* sequences; word w is bad_tokens[bad_ends[w - 1],
                                   * bad_ends[w]) (bad_ends[-1] read as 0), >= 1 token */
    int      bad_ends[KVF_SAMPLING_MAX_BAD_WORDS];
    int32_t  bad_tokens[KVF_SAMPLING_MAX_BAD_TOKENS];
    /* vLLM's prompt_logprobs: each prompt token's logprob given those before it, with the
     * top prompt_logprobs; the prompt is then computed one token per step, so each
     * position's logits come back exactly as a whole-prompt forward computes them */
    bool     want_prompt_logprobs;
    int      prompt_logprobs;     /* [0, KVF_SAMPLING_MAX_LOGPROBS] */
} kvf_sampling_t;

/** A request's prompt logprobs (want_prompt_logprobs): entry i is of prompt token i + 1. */
typedef struct kvf_prompt_logprobs {
    int      n;             /* entries filled, <= prompt_len - 1 */
    int      per;           /* top entries per position (sampling.prompt_logprobs) */
    float   *logprob;       /* [prompt_len - 1], of the raw logits */
    int32_t *rank;          /* the token's rank: 1 + the tokens of a larger logit */
    int32_t *top_ids;       /* [prompt_len - 1][per], most likely first, lowest id on ties */
    float   *top_logprobs;
} kvf_prompt_logprobs_t;

typedef struct kvf_request {
    uint64_t            id;
    uint64_t            arrival;       /* admission order */
    kvf_req_state_t     state;
    kvf_finish_reason_t finish;

    int32_t            *tokens;        /* prompt then outputs */
    int                 num_tokens;
    int                 cap_tokens;
    int                 prompt_len;
    int                 num_computed;  /* tokens whose cache state is in the pages */

    kvf_sampling_t      sampling;
    uint64_t            rng;
    bool                prefill_only;
    bool                record_logits;
    float              *logits;        /* [num_outputs][vocab] when record_logits */
    int                 num_logits;

    kvf_req_blocks_t    blocks;
    int                 sched_tokens;  /* tokens in the current step, 0 = not scheduled */
    int                 preemptions;   /* times this request lost its blocks */
    int                 outputs_in_prompt; /* kvf_req_params_t's: outputs inside the prompt */

    /* prefix cache (docs/PREFIX_CACHE.md; common/engine/kvf_engine_prefix.h) */
    int                 chunk_cut;     /* a prompt chunk must end here (a state checkpoint
                                        * the cache wants); 0: none */
    uint8_t            *salt;          /* cache_salt, salt_len bytes (owned) */
    size_t              salt_len;
    void               *prefix;        /* the cache's per-request chain (kvf_engine_prefix.c) */
    int                 prefix_hit;    /* tokens the last lookup served from the cache */
    bool                prefix_counted;/* its query is in the totals */
    bool                prefix_off;    /* imported: neither looked up nor indexed */
    int                 import_zeroed; /* imported: prompt tokens [prefix_hit, this) were
                                        * zeroed, not pulled (a sliding-window pull): the
                                        * prompt's blocks are not indexed; 0: all pulled */
    kvf_prompt_logprobs_t plp;         /* sampling.want_prompt_logprobs: filled in prefill */
} kvf_request_t;

typedef struct kvf_scheduler_params {
    int max_batch_tokens;  /* token budget per step, >= 1 */
    int max_seqs;          /* requests per step, >= 1 */
    int state_grid;        /* tokens; > 0: a prompt chunk that does not reach the last known
                            * token ends on a multiple of it (one that would not reach the
                            * next multiple waits for a later step, unless max_batch_tokens
                            * is below the grid): the Mamba state grid, one value for the state checkpoints
                            * of the prefix cache and the scan's fixed chunk boundaries
                            * (docs/PREFIX_CACHE.md §1); 0: chunks end where the budget does */
} kvf_scheduler_params_t;

/** One scheduled entry: feed tokens [start, start + num_tokens) of req. */
typedef struct kvf_sched_entry {
    kvf_request_t *req;
    int            start;
    int            num_tokens;
    bool           samples;   /* the chunk reaches the last known token */
} kvf_sched_entry_t;

/**
 * Build the next step from @a reqs (n requests, any order; only WAITING and
 * RUNNING ones are considered), allocating blocks from @a bm. Preempted
 * requests go back to WAITING with num_computed = 0.
 *
 * @param [out] plan    Capacity params->max_seqs entries.
 * @param [out] n_plan  Entries written (0: nothing can run now).
 * @return KVF_OK; KVF_ERR_NO_MEMORY from block tables.
 */
kvf_status_t kvf_scheduler_schedule(const kvf_scheduler_params_t *params, kvf_block_manager_h bm,
                                    kvf_request_t **reqs, int n, kvf_sched_entry_t *plan,
                                    int *n_plan);

/**
 * Pick the next token from @a logits (vocab floats): argmax when greedy,
 * else a draw from softmax(logits / temperature) with the request's RNG
 * (advanced). Deterministic for a given seed and logits.
 */
int32_t kvf_sample_token(kvf_request_t *req, const float *logits, int vocab);

/**
 * Advance the request's RNG past the draw kvf_sample_token() makes for one
 * token (none when greedy). Used when another instance sampled that token
 * (disaggregated decode continues after prefill's first token), so a given
 * seed yields the same tokens in every layout.
 */
void kvf_sample_skip(kvf_request_t *req);

#endif
