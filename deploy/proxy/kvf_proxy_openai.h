/*
 * The OpenAI-compatible surface of kvf-proxy: /v1/completions request
 * parsing and validation, and the JSON of responses, stream chunks and
 * errors. Pure functions of their inputs (no I/O), so they are unit-tested
 * directly.
 *
 * Request fields: every field of vLLM's /v1/completions is either honoured
 * with vLLM's semantics and ranges or refused by name with 400 (the table is
 * kvf_proxy_fields.c's kvf_proxy_fields[] and README's "OpenAI API" section);
 * a key that is no field of vLLM's is refused by name too. Sampling runs in
 * the engine (common/engine/kvf_sampler.h); the proxy handles what is text:
 * stop strings (held back until they cannot start a stop string), echo,
 * several prompts and n choices (one flow each), logprobs' token strings.
 */
#ifndef KVF_PROXY_OPENAI_H
#define KVF_PROXY_OPENAI_H

#include "kvf_proxy_metrics.h"
#include "kvf_status.h"
#include "kvf_tokenizer.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kvf_proxy_openai_ctx {
    /* the tokenizer; a byte-id stand-in (for request checks only) until tok_ready: without
     * --model the proxy takes the daemons' (kvf_proxy_tokcheck.c), setting tok then
     * tok_ready once; completions are refused (503) while tok_ready is false */
    const kvf_tokenizer_t *_Atomic tok;
    const char *model_name;          /* the served model id */
    bool        add_bos;             /* prefix string prompts with BOS (when the model has one) */
    int         max_prompt_tokens;   /* longer prompts: 400 */
    uint32_t    max_tokens_limit;    /* larger max_tokens: 400 */
    uint32_t    default_max_tokens;
    int         max_model_len;       /* the model's max_position_embeddings: a prompt, or a
                                      * prompt plus max_tokens, longer gets 400; 0: no limit */
    _Atomic bool tok_ready;          /* see tok */
    const char *const *names;        /* --served-model-name: every name served (names[0] is
                                      * model_name); NULL: model_name alone */
    int         num_names;
    const char *root;                /* /v1/models "root": the model folder; NULL: the name */
    const char *chat_template;       /* tokenizer_config.json's; NULL: chat is refused */
    const char *bos_token;           /* its text, for the template ("" when none) */
    const char *eos_token;
    bool        priority_scheduling; /* --scheduling-policy priority: "priority" honoured */
    int         tool_parser;         /* --tool-call-parser (kvf_proxy_tool_parser_t; 0 none) */
    bool        auto_tool_choice;    /* --enable-auto-tool-choice */
    int         reasoning_parser;    /* --reasoning-parser (kvf_proxy_reasoning_t; 0 none) */
} kvf_proxy_openai_ctx_t;

#define KVF_PROXY_MAX_CHOICES 16     /* prompts x n per request */
#define KVF_PROXY_MAX_STOP     8     /* stop strings per request (each <= 256 bytes) */

typedef struct kvf_proxy_completion_req {
    int32_t *prompt_ids;             /* owned; kvf_proxy_openai_req_cleanup() frees */
    int      num_prompt;
    uint32_t max_tokens;             /* >= 1, includes the first token */
    float    temperature;
    bool     has_seed;
    uint64_t seed;
    int      cache_salt_len;       /* 0: none; else 1..256 bytes of cache_salt */
    char     cache_salt[257];      /* only same-salt requests share a cached prefix */
    bool     stream;
    bool     ignore_eos;
    bool     return_token_ids;
    /* vLLM's sampling fields (defaults: off); see kvf_sampler.h */
    float    top_p;                /* (0, 1], default 1 */
    int      top_k;                /* 0: off */
    float    min_p;
    float    presence_penalty;
    float    frequency_penalty;
    float    repetition_penalty;   /* default 1 */
    uint32_t min_tokens;
    int      num_stop_ids;
    int32_t  stop_token_ids[64];
    bool     want_logprobs;        /* "logprobs" given */
    int      logprobs;             /* top entries per token, [0, 20] */
    /* logit_bias, allowed_token_ids, bad_words (kvf_proxy_sampling.h); owned */
    int      num_bias;
    int32_t *bias_ids;
    float   *bias_values;
    int      num_allowed;
    int32_t *allowed_ids;
    int      num_bad_words;        /* token sequences */
    uint32_t *bad_ends;            /* word w: bad_tokens[bad_ends[w - 1], bad_ends[w]) */
    int      num_bad_tokens;
    int32_t *bad_tokens;
    int64_t  priority;             /* admission queue order, lower first (kvf_proxy_admit.h) */
    bool     want_prompt_logprobs; /* "prompt_logprobs" given: the prompt's, from prefill */
    int      prompt_logprobs;      /* top entries per prompt token, [0, 20] */
    int      tool_parser;          /* chat with tools, tool_choice auto: the output's parser
                                    * (kvf_proxy_tool_parser_t; 0: none) */
    bool     parallel_tool_calls;  /* false: the first call only */
    int      reasoning;            /* chat: the reasoning parser (kvf_proxy_reasoning_t) */
    bool     include_reasoning;    /* reasoning_content returned (default true) */
    /* text handled by the proxy */
    int      num_stop;
    char    *stop[KVF_PROXY_MAX_STOP];        /* owned */
    bool     include_stop_str_in_output;
    bool     echo;
    int      n;                    /* choices per prompt, >= 1 */
    int      best_of;              /* candidates per prompt, >= n (0: n); more than n: the n
                                    * of the highest cumulative logprob are returned */
    int      num_prompts;          /* >= 1; prompt i is prompts[i] (prompts[0] == prompt_ids) */
    int32_t *prompts[KVF_PROXY_MAX_CHOICES];  /* owned */
    int      prompt_lens[KVF_PROXY_MAX_CHOICES];
    bool     include_usage;        /* stream_options.include_usage */
    bool     continuous_usage;     /* stream_options.continuous_usage_stats */
    char     response_id[96];      /* "cmpl-<x-request-id>" when given; "" : the flow's id */
    bool     chat;                 /* chat.completion objects (kvf_proxy_chat.h) */
} kvf_proxy_completion_req_t;

/** Flows per prompt: best_of candidates when more than n, else n. */
static inline int kvf_proxy_req_per_prompt(const kvf_proxy_completion_req_t *req)
{
    return (req->best_of > req->n) ? req->best_of : req->n;
}

/** Transfer statistics of one request (TransferStats, as decode reported them). */
typedef struct kvf_proxy_kv_stats {
    bool     valid;
    uint64_t bytes;
    uint64_t descriptors;
    uint32_t reads;
    double   handshake_ms;
    double   transfer_ms;
    bool     recomputed;
    bool     has_tokens;             /* decode reported the two below (TransferStats 7, 8) */
    uint32_t decode_cached_tokens;   /* prompt tokens decode's prefix cache held */
    uint32_t pulled_tokens;          /* prompt tokens decode read from prefill */
} kvf_proxy_kv_stats_t;

/**
 * Where the time to the first decoded token went (kvf_proxy_ttft_phase_t order),
 * from the proxy's clock and the daemons' ServeTiming; max over TP ranks.
 * Rendered as "ttft_breakdown" in the final object.
 */
typedef struct kvf_proxy_ttft_breakdown {
    bool   valid;
    double ttft_ms;             /* the first token (from prefill) ready at the proxy */
    double first_decode_ms;     /* the first reply from decode at the proxy */
    double phase_ms[KVF_PROXY_TTFT_PHASE_COUNT];
} kvf_proxy_ttft_breakdown_t;

/** What the proxy knows about a completion so far. */
typedef struct kvf_proxy_completion {
    char                 id[48];          /* "cmpl-..." */
    int64_t              created;         /* unix seconds */
    int32_t             *tokens;          /* completion token ids; owned by the flow */
    int                  num_tokens;
    char                 finish_reason[16]; /* "" while running */
    kvf_proxy_kv_stats_t kv;
    const char          *prefill_instance;  /* endpoints; NULL when not chosen */
    const char          *decode_instance;
    double               ttft_ms;
    double               prefill_ms;
    kvf_proxy_ttft_breakdown_t ttft_breakdown;
    /* with want_logprobs: per token its logprob and top_per_token entries (owned by the
     * flow); num_logprobs == num_tokens when every reply carried them */
    float               *token_logprobs;
    int32_t             *top_ids;
    float               *top_logprobs;
    int                  num_logprobs;
    int                  cap_logprobs;
    /* with want_prompt_logprobs: prefill's, per prompt token from the second (owned) */
    float               *prompt_lp;
    int32_t             *prompt_rank;
    int32_t             *prompt_top_ids;      /* [num_prompt_lp][prompt_per] */
    float               *prompt_top_lp;
    int                  num_prompt_lp;
    int                  prompt_per;
} kvf_proxy_completion_t;

/**
 * Parse and validate a /v1/completions body.
 *
 * @param [out] req_p     Filled on success; clean up with kvf_proxy_openai_req_cleanup().
 * @param [out] http_p    On error: 400 (bad JSON, bad parameter, prompt too
 *                        long, a NUL character \u0000 anywhere in the text),
 *                        404 (unknown model) or 500 (no memory).
 * @param [out] param_p   On error: the offending field's name ("max_tokens",
 *                        "prompt", ...; a static string, or for an unknown key a
 *                        per-thread copy valid until this thread's next parse), NULL
 *                        when the error is not about one field. May be NULL.
 * @param [out] err       On error: a one-line message naming the field.
 * @return KVF_OK, KVF_ERR_PARSE (bad JSON), KVF_ERR_INVALID_PARAM, KVF_ERR_NOT_FOUND,
 *         KVF_ERR_OUT_OF_RANGE or KVF_ERR_NO_MEMORY.
 */
kvf_status_t kvf_proxy_openai_parse(const kvf_proxy_openai_ctx_t *ctx, const char *body,
                                    size_t len, kvf_proxy_completion_req_t *req_p, int *http_p,
                                    const char **param_p, char *err, size_t err_cap);

/** Free what kvf_proxy_openai_parse() allocated; safe on a zeroed struct. */
void kvf_proxy_openai_req_cleanup(kvf_proxy_completion_req_t *req);

/**
 * Parse and validate a /v1/chat/completions body (kvf_proxy_chat.h): the same
 * fields as completions where vLLM's chat has them, "messages" rendered with
 * the checkpoint's chat template into prompts[0]. Errors as kvf_proxy_openai_parse().
 */
kvf_status_t kvf_proxy_openai_parse_chat(const kvf_proxy_openai_ctx_t *ctx, const char *body,
                                         size_t len, kvf_proxy_completion_req_t *req_p,
                                         int *http_p, const char **param_p, char *err,
                                         size_t err_cap);

/**
 * vLLM's error body, {"object": "error", "message", "type", "param", "code"}, with
 * OpenAI's nested {"error": {...}} too, as a malloc'd string (NULL: no memory).
 * The flat "type" is vLLM's class name for @a code ("BadRequestError" for 400,
 * "NotFoundError", "ServiceUnavailableError", ...); the nested one is @a type
 * ("invalid_request_error", "server_error", "upstream_error", ...).
 * @a param: the offending request field, or NULL (JSON null).
 * @a code: the HTTP status, an integer as in vLLM's.
 */
char *kvf_proxy_openai_error_json(const char *message, const char *type, const char *param,
                                  int code);

/** Token counts of a response or a usage chunk. */
typedef struct kvf_proxy_usage {
    int prompt_tokens;
    int completion_tokens;
} kvf_proxy_usage_t;

/** One choice's piece of output: the whole of it in a response, a delta in a chunk. */
typedef struct kvf_proxy_choice_out {
    int            index;           /* prompt index x n + choice within the prompt */
    const char    *text;            /* NUL-terminated */
    const int32_t *ids;             /* its token ids (shown with return_token_ids) */
    int            num_ids;
    const float   *token_logprobs;  /* [num_ids]; NULL: "logprobs": null */
    const int32_t *top_ids;         /* [num_ids][per]; id -1: none */
    const float   *top_logprobs;
    int            per;
    int            text_offset;     /* bytes of the choice's text before this piece */
    const char    *finish_reason;   /* NULL: not finished (chunks) */
    const char    *stop_reason;     /* the stop string matched, or NULL */
    int            stop_token;      /* the stop token id that ended it, or -1 */
    bool           first;           /* chat chunks: the first delta carries the role */
    const struct cJSON *tool_calls; /* chat: the parsed calls (kvf_proxy_tools.h), or NULL */
    const char    *reasoning;       /* chat: the reasoning text of this piece, or NULL */
    const kvf_proxy_completion_t *flow_out; /* its flow's (prompt logprobs), or NULL */
    const int32_t *prompt_ids;      /* its prompt (prompt logprobs) */
    int            num_prompt;
} kvf_proxy_choice_out_t;

/**
 * One stream chunk: @a ch's piece (NULL: none, "choices": []), and @a usage when
 * not NULL. With @a ch finished, kvferry's summary of its flow @a c follows
 * (kv_transfer, instances, ttft_ms, prompt_token_ids with return_token_ids).
 * @return a malloc'd string; NULL: no memory.
 */
char *kvf_proxy_openai_chunk(const kvf_proxy_openai_ctx_t *ctx,
                             const kvf_proxy_completion_req_t *req,
                             const kvf_proxy_completion_t *c, const kvf_proxy_choice_out_t *ch,
                             const kvf_proxy_usage_t *usage);

/**
 * A whole response: @a n choices, usage, and kvferry's summary of @a c (the
 * first choice's flow). @return a malloc'd string; NULL: no memory.
 */
char *kvf_proxy_openai_response(const kvf_proxy_openai_ctx_t *ctx,
                                const kvf_proxy_completion_req_t *req,
                                const kvf_proxy_completion_t *c,
                                const kvf_proxy_choice_out_t *chs, int n,
                                const kvf_proxy_usage_t *usage);

/**
 * {"object": "list", "data": [{"id", "object", "created", "owned_by", "root",
 * "parent", "max_model_len", "permission"}, ...]}: one entry per served name (malloc'd).
 */
char *kvf_proxy_openai_models_json(const kvf_proxy_openai_ctx_t *ctx, int64_t created);

#endif
