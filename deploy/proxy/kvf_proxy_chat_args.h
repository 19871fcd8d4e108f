/*
 * The chat template's arguments beyond the messages, as vLLM passes them to
 * apply_chat_template: add_generation_prompt, continue_final_message (the rendering cut
 * after the last message's content, so the model continues it), documents (a list of
 * string maps, for RAG templates), tools (kvf_proxy_tools.h) and chat_template_kwargs
 * (every key a template variable, e.g. Qwen3's enable_thinking; applied last, so they
 * override the others as vLLM's do).
 */
#ifndef KVF_PROXY_CHAT_ARGS_H
#define KVF_PROXY_CHAT_ARGS_H

#include "kvf_status.h"

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct kvf_proxy_chat_args {
    bool   add_generation_prompt;   /* default true */
    bool   continue_final_message;  /* default false; not with add_generation_prompt */
    cJSON *vars;                    /* owned: the template variables besides messages,
                                     * bos_token and eos_token; NULL: none */
} kvf_proxy_chat_args_t;

/**
 * Parse add_generation_prompt, continue_final_message, documents and chat_template_kwargs
 * of @a root into @a args (zeroed by the caller; clean up with kvf_proxy_chat_args_cleanup()).
 *
 * @param [out] http_p, param_p, err  on error: 400 (or 500: memory) and the field's name
 * @return KVF_OK; KVF_ERR_INVALID_PARAM; KVF_ERR_NO_MEMORY.
 */
kvf_status_t kvf_proxy_chat_args_parse(const cJSON *root, kvf_proxy_chat_args_t *args,
                                       int *http_p, const char **param_p, char *err,
                                       size_t cap);

/** Set template variable @a name (a copy of @a value replaces one of that name).
 *  @return KVF_OK; KVF_ERR_NO_MEMORY. */
kvf_status_t kvf_proxy_chat_args_set(kvf_proxy_chat_args_t *args, const char *name,
                                     const cJSON *value);

/** Free what kvf_proxy_chat_args_parse() made; safe on a zeroed struct. */
void kvf_proxy_chat_args_cleanup(kvf_proxy_chat_args_t *args);

/**
 * continue_final_message: cut @a text (NUL-terminated, in place) after the last occurrence
 * of @a final (the last message's content), or else of @a final without its surrounding
 * white space (templates that strip), as transformers does.
 * @return false when neither occurs (the template dropped the message).
 */
bool kvf_proxy_chat_continue_cut(char *text, const char *final);

#endif
