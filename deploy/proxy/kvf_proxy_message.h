/*
 * The assistant message of a chat answer beyond its text: the request's agent fields
 * (tools, tool_choice, parallel_tool_calls: kvf_proxy_tools.h; include_reasoning with
 * --reasoning-parser: kvf_proxy_reasoning.h) and the message (or delta) they shape:
 * reasoning_content, content, tool_calls, as vLLM writes them.
 */
#ifndef KVF_PROXY_MESSAGE_H
#define KVF_PROXY_MESSAGE_H

#include "kvf_proxy_chat_args.h"
#include "kvf_proxy_openai.h"

#include <cjson/cJSON.h>

/**
 * Parse tools, tool_choice, parallel_tool_calls and include_reasoning of a chat request:
 * the tools into @a args (the template's), the output's parsers into @a req.
 * @return KVF_OK; KVF_ERR_INVALID_PARAM (400 naming the field); KVF_ERR_NO_MEMORY.
 */
kvf_status_t kvf_proxy_message_parse(const kvf_proxy_openai_ctx_t *ctx, const cJSON *root,
                                     kvf_proxy_completion_req_t *req,
                                     kvf_proxy_chat_args_t *args, int *http_p,
                                     const char **param_p, char *err, size_t cap);

/** Fill chat message (or, @a chunk, delta) @a m of piece @a ch: reasoning_content, content,
 *  tool_calls (the role is the caller's). */
void kvf_proxy_message_fill(cJSON *m, const kvf_proxy_completion_req_t *req,
                            const kvf_proxy_choice_out_t *ch, bool chunk);

#endif
