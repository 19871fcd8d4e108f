/*
 * /v1/chat/completions' messages: checked as vLLM checks them (roles system,
 * developer, user, assistant, tool; content a string, or a list of
 * {"type": "text", "text"} parts, which are joined), then rendered with the
 * checkpoint's chat template (tokenizer_config.json "chat_template", run by
 * kvf_proxy_jinja.h) the way transformers' apply_chat_template renders it:
 * messages, add_generation_prompt, bos_token and eos_token in the context, and the
 * request's template arguments (kvf_proxy_chat_args.h).
 */
#ifndef KVF_PROXY_CHAT_H
#define KVF_PROXY_CHAT_H

#include "kvf_proxy_chat_args.h"
#include "kvf_proxy_openai.h"

#include <cjson/cJSON.h>

/**
 * Render @a messages (a JSON array) with ctx->chat_template and the arguments @a args
 * (kvf_proxy_chat_args.h; continue_final_message cuts the text after the last message).
 *
 * @param [out] text_p  the prompt text (malloc'd, the caller frees)
 * @param [out] param_p the field an error is about ("messages"; static)
 * @param [out] err     on failure: one line naming the message and the field
 * @return KVF_OK; KVF_ERR_INVALID_PARAM (bad messages, a template error, or a
 *         model without a chat template, named so); KVF_ERR_NO_MEMORY.
 */
kvf_status_t kvf_proxy_chat_render(const kvf_proxy_openai_ctx_t *ctx, const cJSON *messages,
                                   const kvf_proxy_chat_args_t *args, char **text_p,
                                   const char **param_p, char *err, size_t cap);

#endif
