/*
 * Engine core of one instance (colocated, prefill or decode role): the model
 * runner with its TP ranks and page pools, the block manager, the
 * scheduler, and sampling.
 *
 * Usage, colocated:   add_request() ... step() until the request finishes.
 * Prefill daemon:     add_request() with prefill_only; step() until its
 *                     KVF_EVENT_PREFILLED event (first token sampled, blocks
 *                     held); read its block tables with request_blocks();
 *                     transfer; release() when decode is done with them.
 * Decode daemon:      import_begin() allocates (and zeroes) blocks for the
 *                     prompt; the transfer fills them (pools via
 *                     runner()); import_commit() seeds the first token;
 *                     step() continues decoding.
 *
 * Thread safety: none; one thread, the instance leader that called create,
 * calls everything (Debug and sanitizer builds check it and abort on a call
 * from another thread; kvf_contract.h). The exceptions are runner(),
 * block_manager() and model_config(), which return handles fixed at create
 * and may be called from any thread (e.g. a rank function of
 * run_on_ranks()). Rank threads run only inside step() and run_on_ranks();
 * between steps the pools may be read and written by the caller (transfers).
 */
#ifndef KVF_ENGINE_H
#define KVF_ENGINE_H

#include "kvf_block_hash.h"
#include "kvf_prefix_cache.h"
#include "kvf_scheduler.h"
#include "kvf_tp_runner.h"

typedef struct kvf_engine *kvf_engine_h;

enum kvf_engine_params_field {              /* append only, never renumber */
    KVF_ENGINE_PARAM_FIELD_NUM_BLOCKS       = KVF_BIT(0),  /* default 256 */
    KVF_ENGINE_PARAM_FIELD_CACHE            = KVF_BIT(1),  /* default kvf_cache_params_default() */
    KVF_ENGINE_PARAM_FIELD_MAX_BATCH_TOKENS = KVF_BIT(2),  /* default 512 */
    KVF_ENGINE_PARAM_FIELD_MAX_SEQS         = KVF_BIT(3),  /* default 64 */
    KVF_ENGINE_PARAM_FIELD_NO_ZERO          = KVF_BIT(4),  /* TEST ONLY */
    KVF_ENGINE_PARAM_FIELD_POOL_ALLOC       = KVF_BIT(5),  /* default: pools allocate on the CPU */
    KVF_ENGINE_PARAM_FIELD_DEVICE           = KVF_BIT(6),  /* default: the CPU */
    KVF_ENGINE_PARAM_FIELD_PREFIX           = KVF_BIT(7),  /* default: no prefix cache */
};
#define KVF_ENGINE_PARAM_FIELDS_KNOWN (KVF_BIT(8) - 1)

#define KVF_PREFIX_STATE_GRID_DEFAULT   64                  /* tokens */
/* state_bytes 0: this many checkpoints, but no more than the bytes below (at least one) */
#define KVF_PREFIX_STATE_CKPTS_DEFAULT  64
#define KVF_PREFIX_STATE_BYTES_DEFAULT  ((size_t)256 << 20) /* per rank */

/** The prefix cache (docs/PREFIX_CACHE.md). */
typedef struct kvf_engine_prefix_params {
    bool           enabled;
    int            state_grid;     /* tokens between Mamba state checkpoints (and the
                                    * scheduler's chunk grid), >= 1; 0: the default */
    size_t         state_bytes;    /* checkpoint memory per rank, on the pool's device,
                                    * committed (zeroed) at create; must hold one
                                    * checkpoint; 0: KVF_PREFIX_STATE_CKPTS_DEFAULT of them
                                    * within KVF_PREFIX_STATE_BYTES_DEFAULT, at least one */
    const uint8_t *digest;         /* 16 bytes of the weights digest (kvf_block_hash.h);
                                    * NULL: kvf_model_digest() of model_dir */
    kvf_prefix_event_fn event_fn;  /* blocks stored / removed / cleared (vLLM's KV events),
                                    * called on the engine's leader thread; NULL: none */
    void          *event_ctx;
} kvf_engine_prefix_params_t;

/** Prefix cache counters, tokens unless said (vLLM counts queries and hits in tokens). */
typedef struct kvf_engine_prefix_stats {
    uint64_t queries;           /* tokens of the requests looked up (each once) */
    uint64_t hits;              /* of those, tokens served from the cache */
    uint64_t hit_attn_tokens;   /* tokens whose KV came from shared cached blocks */
    uint64_t hit_state_tokens;  /* tokens covered by restored Mamba checkpoints */
    uint64_t states_restored;   /* checkpoints copied into a request */
    uint64_t states_saved;      /* checkpoints taken */
    uint64_t states_evicted;
    uint64_t blocks_evicted;    /* cached blocks reused for other work */
    int      cached_blocks;     /* prefixes with a cached block now */
    int      states;            /* checkpoints held now */
    int      state_slots;       /* checkpoints the budget holds */
    size_t   state_bytes;       /* one checkpoint, bytes per rank */
    /* decode (imports, kvf_engine_import_begin()): hits above are its local blocks */
    uint64_t imports;           /* requests imported with the cache on */
    uint64_t pulled_tokens;     /* of their prompt tokens, those whose KV is pulled */
    uint64_t import_unknown_source; /* imports whose source did not say its numerics: the
                                     * whole prompt pulled, nothing kept */
    int      hash_unit;         /* tokens per hash unit (docs/PREFIX_CACHE.md §2); 0: off */
} kvf_engine_prefix_stats_t;

typedef struct kvf_engine_params {
    uint64_t           field_mask;        /* first */
    const char        *model_dir;         /* required: config.json + model.safetensors */
    int                tp_size;           /* required, >= 1 */
    int                num_blocks;        /* blocks per rank pool */
    kvf_cache_params_t cache;
    int                max_batch_tokens;  /* tokens per step */
    int                max_seqs;          /* requests per step */
    bool               disable_zeroing;   /* TEST ONLY: fresh attention blocks not zeroed */
    bool               keep_window_blocks; /* TEST ONLY: a running request keeps the blocks
                                            * its sliding window left (default: given back,
                                            * docs/ARCHITECTURE.md §7) */
    kvf_pool_alloc_fn_t pool_alloc;       /* POOL_ALLOC: page-pool memory, as
                                           * kvf_tp_runner_params_t.pool_alloc */
    void               *pool_alloc_ctx;
    kvf_device_t        device;           /* DEVICE: weights, pools and kernels there
                                           * (kvf_model_load_device(); CUDA: rank r on
                                           * cuda:ordinal+r) */
    kvf_engine_prefix_params_t prefix;    /* PREFIX */
} kvf_engine_params_t;

/** A new request. The prompt is copied. */
typedef struct kvf_req_params {
    const int32_t  *prompt;
    int             prompt_len;     /* >= 1 */
    kvf_sampling_t  sampling;
    bool            prefill_only;   /* stop after the first token, keep the blocks */
    bool            record_logits;  /* keep the logits of every sampled token */
    int             rng_skip;       /* draws already made from this seed elsewhere (decode
                                     * after prefill sampled the first token: 1); >= 0 */
    int             outputs_in_prompt; /* the prompt's last tokens that were outputs (a
                                        * recompute after a failed pull: 1): sampling counts
                                        * them as outputs (penalties, min_tokens);
                                        * [0, prompt_len) */
    const uint8_t  *cache_salt;     /* only requests with the same salt share a prefix
                                     * (docs/PREFIX_CACHE.md §2); copied; NULL: none */
    size_t          cache_salt_len; /* <= KVF_CACHE_SALT_MAX */
    uint64_t        import_source;  /* import_begin() with the prefix cache on: the numerics
                                     * class (kvf_engine_numerics_class()) of the engine
                                     * whose KV is imported; 0: unknown (nothing reused) */
} kvf_req_params_t;

typedef enum {
    KVF_EVENT_TOKEN = 0,    /* a token was sampled (token valid) */
    KVF_EVENT_PREFILLED,    /* prefill-only request done; token is the first token */
    KVF_EVENT_FINISHED,     /* request finished (reason set; token valid if one was sampled now) */
} kvf_event_kind_t;

typedef struct kvf_engine_event {
    uint64_t            id;
    kvf_event_kind_t    kind;
    int32_t             token;     /* -1 when none */
    kvf_finish_reason_t reason;
    /* TOKEN and PREFILLED of a request with sampling.want_logprobs (kvf_sampler.h):
     * the token's logprob and the top num_top (most likely first); else 0 */
    float               logprob;
    int                 num_top;
    int32_t             top_ids[KVF_SAMPLING_MAX_LOGPROBS];
    float               top_logprobs[KVF_SAMPLING_MAX_LOGPROBS];
} kvf_engine_event_t;

/** Read-only view of a request; pointers valid until the next engine call. */
typedef struct kvf_req_info {
    kvf_req_state_t         state;
    kvf_finish_reason_t     finish;
    const int32_t          *tokens;       /* prompt then outputs */
    int                     prompt_len;
    int                     num_tokens;
    int                     num_computed;
    const float            *logits;       /* [num_logits][vocab] if recorded */
    int                     num_logits;
    const kvf_req_blocks_t *blocks;
    int                     preemptions;  /* times recomputed after losing its blocks */
    const kvf_prompt_logprobs_t *prompt_logprobs; /* sampling.want_prompt_logprobs: the
                                                   * prompt's, n of them so far */
} kvf_req_info_t;

/**
 * Load the model (sharded tp_size ways), build the rank pools and start the
 * rank threads. @return KVF_OK; model, geometry and pool errors (logged).
 */
kvf_status_t kvf_engine_create(const kvf_engine_params_t *params, kvf_engine_h *engine_p);

/** Abort everything, free all blocks, stop ranks. NULL is a no-op. */
void kvf_engine_destroy(kvf_engine_h engine);

/**
 * Admit a request (WAITING). @return KVF_OK and *id_p; KVF_ERR_INVALID_PARAM
 * for an empty prompt, a token outside the vocabulary or max_tokens < 1.
 */
kvf_status_t kvf_engine_add_request(kvf_engine_h engine, const kvf_req_params_t *params,
                                    uint64_t *id_p);

/**
 * One scheduler iteration: schedule, zero fresh blocks, run the forward on
 * all ranks, sample. Events (sampled tokens, prefilled, finished) are
 * written to @a events (capacity @a cap; at most max_seqs + finished ones
 * are produced per step: a cap of 2 * max_seqs never drops any).
 *
 * @return KVF_OK (also when there was nothing to run: *n_events = 0);
 *         a forward error (the step's requests are finished with
 *         KVF_FINISH_ERROR and their blocks freed).
 */
kvf_status_t kvf_engine_step(kvf_engine_h engine, kvf_engine_event_t *events, int cap,
                             int *n_events);

/** True while some request is WAITING or RUNNING. */
bool kvf_engine_has_work(kvf_engine_h engine);

/**
 * Finish @a id with KVF_FINISH_ABORT and free its blocks (any state).
 * @return KVF_OK; KVF_ERR_NOT_FOUND.
 */
kvf_status_t kvf_engine_abort(kvf_engine_h engine, uint64_t id);

/** Free the blocks (if any) and forget @a id. KVF_ERR_NOT_FOUND if unknown. */
kvf_status_t kvf_engine_release(kvf_engine_h engine, uint64_t id);

/** Fill @a info for @a id. KVF_ERR_NOT_FOUND if unknown. */
kvf_status_t kvf_engine_request_info(kvf_engine_h engine, uint64_t id, kvf_req_info_t *info);

/**
 * Convenience for a prefill worker serving one request at a time: add a
 * prefill-only request and step until it is PREFILLED. Other requests'
 * events during those steps are not reported.
 * @return KVF_OK with *id_p and *first_token_p; errors of add/step, or
 *         KVF_ERR_NO_RESOURCE when the pool can never hold the prompt.
 */
kvf_status_t kvf_engine_prefill(kvf_engine_h engine, const kvf_req_params_t *params,
                                uint64_t *id_p, int32_t *first_token_p);

/**
 * Start importing a request computed elsewhere: allocate blocks for
 * prompt_len tokens in every cache group and zero the fresh attention
 * blocks on every rank. The caller then fills the pages (KV of the prompt,
 * Mamba state after all prompt tokens) and calls import_commit().
 * With the prefix cache on and params->import_source set, the prompt's
 * first kvf_engine_request_prefix_hit() tokens are already there (shared
 * cached blocks, a multiple of the block size): the caller fills only the
 * KV of the tokens after them (and the Mamba state); commit indexes the
 * prompt's full blocks under that source (docs/PREFIX_CACHE.md §6).
 *
 * @param [out] blocks_p  Block tables (valid until commit/abort/release).
 * @return KVF_OK; KVF_ERR_NO_RESOURCE when blocks are short (nothing held);
 *         KVF_ERR_INVALID_PARAM as add_request().
 */
kvf_status_t kvf_engine_import_begin(kvf_engine_h engine, const kvf_req_params_t *params,
                                     uint64_t *id_p, const kvf_req_blocks_t **blocks_p);

/**
 * Between import_begin() and import_commit(): the caller zeroed the import's attention
 * blocks holding prompt tokens [prefix hit, @a tokens) instead of filling them (a
 * sliding-window pull reads only the window: kvf_xfer_window_first_block() times the block
 * size). A model with sliding groups (KVF_GROUP_SLIDING): those are the sliding groups'
 * blocks before the prompt's window, which commit indexes as -1 ("not cached") with the full
 * groups' blocks; a model without one: commit indexes none of the prompt's blocks (a later
 * request must never be served a zeroed block; the blocks after them would be unreachable).
 * @return KVF_OK; KVF_ERR_NOT_FOUND; KVF_ERR_INVALID_PARAM (not importing, or @a tokens
 *         outside [0, prompt_len]).
 */
kvf_status_t kvf_engine_import_zeroed(kvf_engine_h engine, uint64_t id, int64_t tokens);

/**
 * Seed the first token (sampled by prefill) and start decoding. The token
 * counts as the first output; the request finishes at once on EOS or when
 * max_tokens is 1. @return KVF_OK; KVF_ERR_NOT_FOUND; KVF_ERR_INVALID_PARAM
 * (not importing, or token out of range).
 */
kvf_status_t kvf_engine_import_commit(kvf_engine_h engine, uint64_t id, int32_t first_token);

/**
 * Run @a func on every TP rank's own thread (rank 0: the caller's), between
 * steps; see kvf_tp_runner_run_on_ranks(). For per-rank transfer work
 * (connector register_pool, start_pull, poll).
 */
kvf_status_t kvf_engine_run_on_ranks(kvf_engine_h engine, kvf_rank_func_t func, void *arg);

/** The runner: pools and geometry per rank, cache layout. */
kvf_tp_runner_h kvf_engine_runner(kvf_engine_h engine);

/** The block manager (free counts). */
kvf_block_manager_h kvf_engine_block_manager(kvf_engine_h engine);

/** The model configuration. */
const kvf_model_config_t *kvf_engine_model_config(kvf_engine_h engine);

/** Running totals: tokens fed in prefill chunks / decode steps, and their seconds. */
typedef struct kvf_engine_stats {
    uint64_t prefill_tokens;
    double   prefill_seconds;
    uint64_t decode_tokens;
    double   decode_seconds;
    uint64_t steps;
    uint64_t preemptions;
    uint64_t window_freed_blocks;   /* blocks given back as they left a sliding window */
} kvf_engine_stats_t;

void kvf_engine_get_stats(kvf_engine_h engine, kvf_engine_stats_t *stats_p);

/** Prefix cache counters; all zero when the cache is off. */
void kvf_engine_get_prefix_stats(kvf_engine_h engine, kvf_engine_prefix_stats_t *stats_p);

/**
 * The numerics class of this engine: equal for two engines whose forwards give the same bits
 * (same TP size, device kind, numerics switches; the weights are in the cache's keys). A
 * prefill sends it with its transfer params (TransferParams.prefix_source); never 0.
 */
uint64_t kvf_engine_numerics_class(kvf_engine_h engine);

/** Tokens of @a id served from the prefix cache by its last lookup (or its import); -1 if
 * unknown. */
int kvf_engine_request_prefix_hit(kvf_engine_h engine, uint64_t id);

#endif
