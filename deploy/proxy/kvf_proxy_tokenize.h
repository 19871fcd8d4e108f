/*
 * vLLM's side endpoints of the OpenAI server: /tokenize (a prompt, or chat
 * messages rendered with the chat template, to token ids), /detokenize (ids to
 * text) and /version. Pure functions of the request body, unit-tested directly.
 */
#ifndef KVF_PROXY_TOKENIZE_H
#define KVF_PROXY_TOKENIZE_H

#include "kvf_proxy_openai.h"

/**
 * POST /tokenize: {"prompt": str, "add_special_tokens": bool = true} or
 * {"messages": [...], "add_generation_prompt": bool = true, "add_special_tokens":
 * bool = false}, optional "model" and "return_token_strs" -> {"count", "max_model_len",
 * "tokens", "token_strs"}. On error *http_p, *param_p (static) and @a err are set.
 * @return the JSON (malloc'd) or NULL on error.
 */
char *kvf_proxy_tokenize_json(const kvf_proxy_openai_ctx_t *ctx, const char *body, size_t len,
                              int *http_p, const char **param_p, char *err, size_t cap);

/** POST /detokenize: {"tokens": [ids], "model"?} -> {"prompt": text}; errors as above. */
char *kvf_proxy_detokenize_json(const kvf_proxy_openai_ctx_t *ctx, const char *body,
                                size_t len, int *http_p, const char **param_p, char *err,
                                size_t cap);

/** GET /version: {"version": "<kvferry version>"} (malloc'd). */
char *kvf_proxy_version_json(void);

#endif
