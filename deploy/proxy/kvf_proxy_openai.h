/*
 * The OpenAI-compatible surface of kvf-proxy: /v1/completions request
 * parsing and validation, and the JSON of responses, stream chunks and
 * errors. Pure functions of their inputs (no I/O), so they are unit-tested
 * directly.
 *
 * Request fields: model (string, optional, must match the served name),
 * prompt (string, or an array of token ids), max_tokens (integer >= 1,
 * default 16), temperature (number >= 0, default 1), seed (integer >= 0),
 * stream (bool), n (only 1), and the extensions ignore_eos (bool) and
 * return_token_ids (bool: add prompt and completion token ids). Fields
 * kvferry cannot honour (stop, logprobs, echo, best_of > 1, suffix) are
 * refused rather than ignored. Unknown fields are ignored.
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
} kvf_proxy_openai_ctx_t;

typedef struct kvf_proxy_completion_req {
    int32_t *prompt_ids;             /* owned; kvf_proxy_openai_req_cleanup() frees */
    int      num_prompt;
    uint32_t max_tokens;             /* >= 1, includes the first token */
    float    temperature;
    bool     has_seed;
    uint64_t seed;
    bool     stream;
    bool     ignore_eos;
    bool     return_token_ids;
} kvf_proxy_completion_req_t;

/** Transfer statistics of one request (TransferStats, as decode reported them). */
typedef struct kvf_proxy_kv_stats {
    bool     valid;
    uint64_t bytes;
    uint64_t descriptors;
    uint32_t reads;
    double   handshake_ms;
    double   transfer_ms;
    bool     recomputed;
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
} kvf_proxy_completion_t;

/**
 * Parse and validate a /v1/completions body.
 *
 * @param [out] req_p     Filled on success; clean up with kvf_proxy_openai_req_cleanup().
 * @param [out] http_p    On error: 400 (bad JSON, bad parameter, prompt too
 *                        long, a NUL character \u0000 anywhere in the text),
 *                        404 (unknown model) or 500 (no memory).
 * @param [out] param_p   On error: the offending field's name ("max_tokens",
 *                        "prompt", ...; a static string), NULL when the error is
 *                        not about one field. May be NULL.
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
 * {"error": {"message", "type", "param", "code"}} as a malloc'd string.
 * @a type: "invalid_request_error", "server_error", "upstream_error", ...
 * @a param: the offending request field, or NULL (JSON null).
 * @a code: the HTTP status, written as a string ("400") as OpenAI's code is a string.
 */
char *kvf_proxy_openai_error_json(const char *message, const char *type, const char *param,
                                  int code);

/** The text_completion object of a finished request (malloc'd string; NULL: no memory). */
char *kvf_proxy_openai_completion_json(const kvf_proxy_openai_ctx_t *ctx,
                                       const kvf_proxy_completion_req_t *req,
                                       const kvf_proxy_completion_t *c,
                                       const char *text);

/**
 * One stream chunk (a text_completion object with a text delta). @a ids /
 * @a num_ids are the delta's token ids (shown with return_token_ids). When
 * @a final, finish_reason, usage, kv_transfer and the instances are added.
 */
char *kvf_proxy_openai_chunk_json(const kvf_proxy_openai_ctx_t *ctx,
                                  const kvf_proxy_completion_req_t *req,
                                  const kvf_proxy_completion_t *c, const char *text,
                                  const int32_t *ids, int num_ids, bool final);

/** {"object": "list", "data": [{"id": model, ...}]} (malloc'd). */
char *kvf_proxy_openai_models_json(const kvf_proxy_openai_ctx_t *ctx, int64_t created);

#endif
