/* A chat answer's message beyond its text (kvf_proxy_message.h). */
#include "kvf_proxy_message.h"
#include "kvf_proxy_tools.h"

#include <stdio.h>

kvf_status_t kvf_proxy_message_parse(const kvf_proxy_openai_ctx_t *ctx, const cJSON *root,
                                     kvf_proxy_completion_req_t *req,
                                     kvf_proxy_chat_args_t *args, int *http_p,
                                     const char **param_p, char *err, size_t cap)
{
    const cJSON *inc = cJSON_GetObjectItemCaseSensitive(root, "include_reasoning");
    kvf_proxy_tool_parser_t parser = KVF_TOOL_PARSER_NONE;
    kvf_status_t st;

    st = kvf_proxy_tools_parse_request(root, (kvf_proxy_tool_parser_t)ctx->tool_parser,
                                       ctx->auto_tool_choice, args, &parser,
                                       &req->parallel_tool_calls, http_p, param_p, err, cap);
    if (st != KVF_OK) {
        return st;
    }
    req->tool_parser = (int)parser;
    req->reasoning = ctx->reasoning_parser;
    req->include_reasoning = true;
    if ((inc != NULL) && !cJSON_IsNull(inc)) {
        if (!cJSON_IsBool(inc)) {
            snprintf(err, cap, "'include_reasoning' must be a boolean");
            *http_p = 400;
            if (param_p != NULL) {
                *param_p = "include_reasoning";
            }
            return KVF_ERR_INVALID_PARAM;
        }
        req->include_reasoning = cJSON_IsTrue(inc);
    }
    return KVF_OK;
}

void kvf_proxy_message_fill(cJSON *m, const kvf_proxy_completion_req_t *req,
                            const kvf_proxy_choice_out_t *ch, bool chunk)
{
    bool thought = (ch->reasoning != NULL) && (ch->reasoning[0] != '\0');

    if ((req->reasoning != 0) && req->include_reasoning && (!chunk || thought)) {
        cJSON_AddItemToObject(m, "reasoning_content", thought ?
                              cJSON_CreateString(ch->reasoning) : cJSON_CreateNull());
    }
    if (ch->tool_calls != NULL) {
        kvf_proxy_tools_to_message(m, ch->text, ch->tool_calls, chunk);
    } else if (!chunk && (req->reasoning != 0) && (ch->text[0] == '\0')) {
        cJSON_AddNullToObject(m, "content");   /* all reasoning: null, as vLLM's */
    } else if (!chunk || (ch->text[0] != '\0') || ((ch->finish_reason == NULL) && !thought)) {
        cJSON_AddStringToObject(m, "content", ch->text);   /* a delta: only with news */
    }
}
