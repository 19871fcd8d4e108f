/*
 * OpenAI response JSON (kvf_proxy_openai.h): error objects, completion and chat completion
 * objects and stream chunks, the models list. Objects follow OpenAI's text_completion and
 * chat.completion shapes; kvferry adds kv_transfer (what moved between the instances), the
 * two instances that served the request and ttft_ms, which OpenAI clients ignore.
 */
#include "kvf_proxy_openai.h"
#include "kvf_proxy_message.h"
#include "kvf_proxy_sampling.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *kvf_proxy_print(cJSON *root)
{
    char *s = (root != NULL) ? cJSON_PrintUnformatted(root) : NULL;

    cJSON_Delete(root);
    return s;
}

/* vLLM's error type names by HTTP status. */
static const char *kvf_proxy_error_class(int code)
{
    switch (code) {
    case 400: return "BadRequestError";
    case 401: return "AuthenticationError";
    case 404: return "NotFoundError";
    case 405: return "MethodNotAllowed";
    case 413: return "RequestTooLarge";
    case 499: return "ClientDisconnected";
    case 502: return "BadGateway";
    case 503: return "ServiceUnavailableError";
    case 504: return "TimeoutError";
    default:  return (code >= 500) ? "InternalServerError" : "BadRequestError";
    }
}

static void kvf_proxy_error_fields(cJSON *o, const char *message, const char *type,
                                   const char *param, int code)
{
    cJSON_AddStringToObject(o, "message", message);
    cJSON_AddStringToObject(o, "type", type);
    if (param != NULL) {
        cJSON_AddStringToObject(o, "param", param);
    } else {
        cJSON_AddNullToObject(o, "param");
    }
    cJSON_AddNumberToObject(o, "code", code);
}

char *kvf_proxy_openai_error_json(const char *message, const char *type, const char *param,
                                  int code)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *e = cJSON_CreateObject();

    if ((root == NULL) || (e == NULL)) {
        cJSON_Delete(e);
        cJSON_Delete(root);
        return NULL;
    }
    /* vLLM's flat ErrorResponse, and OpenAI's nested "error" for clients that read it */
    cJSON_AddStringToObject(root, "object", "error");
    kvf_proxy_error_fields(root, message, kvf_proxy_error_class(code), param, code);
    kvf_proxy_error_fields(e, message, type, param, code);
    cJSON_AddItemToObject(root, "error", e);
    return kvf_proxy_print(root);
}

static void kvf_proxy_add_ids(cJSON *o, const char *name, const int32_t *ids, int n)
{
    cJSON *arr = cJSON_AddArrayToObject(o, name);

    for (int i = 0; (arr != NULL) && (i < n); ++i) {
        cJSON_AddItemToArray(arr, cJSON_CreateNumber(ids[i]));
    }
}

static void kvf_proxy_add_usage(cJSON *root, const kvf_proxy_usage_t *u)
{
    cJSON *o = cJSON_AddObjectToObject(root, "usage");

    if (o != NULL) {
        cJSON_AddNumberToObject(o, "prompt_tokens", u->prompt_tokens);
        cJSON_AddNumberToObject(o, "completion_tokens", u->completion_tokens);
        cJSON_AddNumberToObject(o, "total_tokens", u->prompt_tokens + u->completion_tokens);
    }
}

/* kv_transfer, instances, ttft: kvferry's tail of a choice's final object. */
static void kvf_proxy_add_summary(cJSON *root, const kvf_proxy_completion_req_t *req,
                                  const kvf_proxy_completion_t *c, int prompt_idx)
{
    if (c->kv.valid) {
        cJSON *kv = cJSON_AddObjectToObject(root, "kv_transfer");
        if (kv != NULL) {
            cJSON_AddNumberToObject(kv, "bytes", (double)c->kv.bytes);
            cJSON_AddNumberToObject(kv, "descriptors", (double)c->kv.descriptors);
            cJSON_AddNumberToObject(kv, "reads", c->kv.reads);
            cJSON_AddNumberToObject(kv, "handshake_ms", c->kv.handshake_ms);
            cJSON_AddNumberToObject(kv, "transfer_ms", c->kv.transfer_ms);
            cJSON_AddBoolToObject(kv, "recomputed", c->kv.recomputed);
            if (c->kv.has_tokens) {   /* decode's own prefix cache hit, and what it read */
                cJSON_AddNumberToObject(kv, "decode_cached_tokens", c->kv.decode_cached_tokens);
                cJSON_AddNumberToObject(kv, "pulled_tokens", c->kv.pulled_tokens);
            }
        }
    } else {
        cJSON_AddNullToObject(root, "kv_transfer");
    }
    if (c->prefill_instance != NULL) {
        cJSON_AddStringToObject(root, "prefill_instance", c->prefill_instance);
    }
    if (c->decode_instance != NULL) {
        cJSON_AddStringToObject(root, "decode_instance", c->decode_instance);
    }
    cJSON_AddNumberToObject(root, "ttft_ms", c->ttft_ms);
    cJSON_AddNumberToObject(root, "prefill_ms", c->prefill_ms);
    if (c->ttft_breakdown.valid) {
        const kvf_proxy_ttft_breakdown_t *bd = &c->ttft_breakdown;
        cJSON *o = cJSON_AddObjectToObject(root, "ttft_breakdown");
        char key[48];

        if (o != NULL) {
            cJSON_AddNumberToObject(o, "ttft_ms", bd->ttft_ms);
            cJSON_AddNumberToObject(o, "time_to_first_decode_token_ms", bd->first_decode_ms);
            for (int ph = 0; ph < KVF_PROXY_TTFT_PHASE_COUNT; ++ph) {
                snprintf(key, sizeof(key), "%s_ms", kvf_proxy_ttft_phase_name((kvf_proxy_ttft_phase_t)ph));
                cJSON_AddNumberToObject(o, key, bd->phase_ms[ph]);
            }
            cJSON_AddStringToObject(o, "tp_ranks", "max");
        }
    }
    if (req->return_token_ids && !req->chat) {
        kvf_proxy_add_ids(root, "prompt_token_ids", req->prompts[prompt_idx],
                          req->prompt_lens[prompt_idx]);
    }
}

/* The response's id: the client's (request_id, x-request-id) or the flow's. */
static void kvf_proxy_id(const kvf_proxy_completion_req_t *req, const kvf_proxy_completion_t *c,
                         char *id, size_t cap)
{
    if (req->response_id[0] != '\0') {
        snprintf(id, cap, "%s", req->response_id);
    } else if (req->chat) {
        snprintf(id, cap, "chat%s", c->id);   /* "chatcmpl-..." */
    } else {
        snprintf(id, cap, "%s", c->id);
    }
}

static cJSON *kvf_proxy_object(const kvf_proxy_openai_ctx_t *ctx,
                               const kvf_proxy_completion_req_t *req,
                               const kvf_proxy_completion_t *c, bool chunk, cJSON **choices_p)
{
    cJSON *root = cJSON_CreateObject();
    char id[128];

    if (root == NULL) {
        return NULL;
    }
    kvf_proxy_id(req, c, id, sizeof(id));
    cJSON_AddStringToObject(root, "id", id);
    cJSON_AddStringToObject(root, "object", !req->chat ? "text_completion" :
                            chunk ? "chat.completion.chunk" : "chat.completion");
    cJSON_AddNumberToObject(root, "created", (double)c->created);
    cJSON_AddStringToObject(root, "model", ctx->model_name);
    *choices_p = cJSON_AddArrayToObject(root, "choices");
    if (*choices_p == NULL) {
        cJSON_Delete(root);
        return NULL;
    }
    return root;
}

/* One token as text (special tokens: their text is skipped, so "" ). */
static void kvf_proxy_token_text(const kvf_proxy_openai_ctx_t *ctx, int32_t id, char *out,
                                 size_t cap)
{
    (void)kvf_tokenizer_decode(ctx->tok, &id, 1, out, cap);
}

/* Completions' logprobs: {text_offset, token_logprobs, tokens, top_logprobs}. */
static cJSON *kvf_proxy_logprobs_cmpl(const kvf_proxy_openai_ctx_t *ctx,
                                      const kvf_proxy_choice_out_t *ch)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *off = cJSON_AddArrayToObject(o, "text_offset");
    cJSON *lp = cJSON_AddArrayToObject(o, "token_logprobs");
    cJSON *toks = cJSON_AddArrayToObject(o, "tokens");
    cJSON *top = cJSON_AddArrayToObject(o, "top_logprobs");
    int at = ch->text_offset;
    char t[256];

    if ((off == NULL) || (lp == NULL) || (toks == NULL) || (top == NULL)) {
        cJSON_Delete(o);
        return NULL;
    }
    for (int i = 0; i < ch->num_ids; ++i) {
        cJSON *d = cJSON_CreateObject();

        kvf_proxy_token_text(ctx, ch->ids[i], t, sizeof(t));
        cJSON_AddItemToArray(off, cJSON_CreateNumber(at));
        at += (int)strlen(t);
        cJSON_AddItemToArray(lp, cJSON_CreateNumber(ch->token_logprobs[i]));
        cJSON_AddItemToArray(toks, cJSON_CreateString(t));
        for (int j = 0; (d != NULL) && (j < ch->per); ++j) {
            int32_t id = ch->top_ids[(size_t)i * (size_t)ch->per + (size_t)j];
            if (id < 0) {
                continue;
            }
            kvf_proxy_token_text(ctx, id, t, sizeof(t));
            if (cJSON_GetObjectItemCaseSensitive(d, t) == NULL) {   /* first (likelier) wins */
                cJSON_AddNumberToObject(d, t,
                                        ch->top_logprobs[(size_t)i * (size_t)ch->per + (size_t)j]);
            }
        }
        cJSON_AddItemToArray(top, d);
    }
    return o;
}

static cJSON *kvf_proxy_bytes(const char *t)
{
    cJSON *b = cJSON_CreateArray();

    for (const unsigned char *p = (const unsigned char *)t; (b != NULL) && (*p != 0); ++p) {
        cJSON_AddItemToArray(b, cJSON_CreateNumber(*p));
    }
    return b;
}

/* Chat's logprobs: {content: [{token, logprob, bytes, top_logprobs: [...]}]}. */
static cJSON *kvf_proxy_logprobs_chat(const kvf_proxy_openai_ctx_t *ctx,
                                      const kvf_proxy_choice_out_t *ch)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *content = cJSON_AddArrayToObject(o, "content");
    char t[256];

    if (content == NULL) {
        cJSON_Delete(o);
        return NULL;
    }
    for (int i = 0; i < ch->num_ids; ++i) {
        cJSON *e = cJSON_CreateObject(), *top;

        kvf_proxy_token_text(ctx, ch->ids[i], t, sizeof(t));
        cJSON_AddStringToObject(e, "token", t);
        cJSON_AddNumberToObject(e, "logprob", ch->token_logprobs[i]);
        cJSON_AddItemToObject(e, "bytes", kvf_proxy_bytes(t));
        top = cJSON_AddArrayToObject(e, "top_logprobs");
        for (int j = 0; (top != NULL) && (j < ch->per); ++j) {
            int32_t id = ch->top_ids[(size_t)i * (size_t)ch->per + (size_t)j];
            cJSON *x;
            if (id < 0) {
                continue;
            }
            x = cJSON_CreateObject();
            kvf_proxy_token_text(ctx, id, t, sizeof(t));
            cJSON_AddStringToObject(x, "token", t);
            cJSON_AddNumberToObject(x, "logprob",
                                    ch->top_logprobs[(size_t)i * (size_t)ch->per + (size_t)j]);
            cJSON_AddItemToObject(x, "bytes", kvf_proxy_bytes(t));
            cJSON_AddItemToArray(top, x);
        }
        cJSON_AddItemToArray(content, e);
    }
    return o;
}

/* One choice object: a completion's text, a chat message, or a chat delta. */
static cJSON *kvf_proxy_choice(const kvf_proxy_openai_ctx_t *ctx,
                               const kvf_proxy_completion_req_t *req,
                               const kvf_proxy_choice_out_t *ch, bool chunk)
{
    cJSON *o = cJSON_CreateObject();

    if (o == NULL) {
        return NULL;
    }
    cJSON_AddNumberToObject(o, "index", ch->index);
    if (!req->chat) {
        cJSON_AddStringToObject(o, "text", ch->text);
    } else {
        cJSON *m = cJSON_AddObjectToObject(o, chunk ? "delta" : "message");
        if (m != NULL) {
            if (!chunk || ch->first) {
                cJSON_AddStringToObject(m, "role", "assistant");
            }
            kvf_proxy_message_fill(m, req, ch, chunk);
        }
    }
    if (ch->token_logprobs != NULL) {
        cJSON *lp = req->chat ? kvf_proxy_logprobs_chat(ctx, ch) :
                                kvf_proxy_logprobs_cmpl(ctx, ch);
        if (lp != NULL) {
            cJSON_AddItemToObject(o, "logprobs", lp);
        }
    } else {
        cJSON_AddNullToObject(o, "logprobs");
    }
    if (ch->finish_reason != NULL) {
        cJSON_AddStringToObject(o, "finish_reason", ch->finish_reason);
    } else {
        cJSON_AddNullToObject(o, "finish_reason");
    }
    if (ch->stop_reason != NULL) {
        cJSON_AddStringToObject(o, "stop_reason", ch->stop_reason);
    } else if (ch->stop_token >= 0) {
        cJSON_AddNumberToObject(o, "stop_reason", ch->stop_token);
    } else {
        cJSON_AddNullToObject(o, "stop_reason");
    }
    if (req->return_token_ids) {
        kvf_proxy_add_ids(o, "token_ids", ch->ids, ch->num_ids);
    }
    if (req->want_prompt_logprobs && !req->chat && !chunk) {   /* chat: on the response */
        cJSON *pl = kvf_proxy_prompt_lp_json(ctx, ch);
        cJSON_AddItemToObject(o, "prompt_logprobs", (pl != NULL) ? pl : cJSON_CreateNull());
    }
    return o;
}

char *kvf_proxy_openai_chunk(const kvf_proxy_openai_ctx_t *ctx,
                             const kvf_proxy_completion_req_t *req,
                             const kvf_proxy_completion_t *c, const kvf_proxy_choice_out_t *ch,
                             const kvf_proxy_usage_t *usage)
{
    cJSON *choices, *choice;
    cJSON *root = kvf_proxy_object(ctx, req, c, true, &choices);

    if (root == NULL) {
        return NULL;
    }
    if (ch != NULL) {
        choice = kvf_proxy_choice(ctx, req, ch, true);
        if (choice == NULL) {
            cJSON_Delete(root);
            return NULL;
        }
        cJSON_AddItemToArray(choices, choice);
        if (ch->finish_reason != NULL) {
            kvf_proxy_add_summary(root, req, c, ch->index / req->n);
        } else {
            /* Which instances serve the stream, known from the first chunk on. */
            if (c->prefill_instance != NULL) {
                cJSON_AddStringToObject(root, "prefill_instance", c->prefill_instance);
            }
            if (c->decode_instance != NULL) {
                cJSON_AddStringToObject(root, "decode_instance", c->decode_instance);
            }
        }
    }
    if (usage != NULL) {
        kvf_proxy_add_usage(root, usage);
    }
    return kvf_proxy_print(root);
}

char *kvf_proxy_openai_response(const kvf_proxy_openai_ctx_t *ctx,
                                const kvf_proxy_completion_req_t *req,
                                const kvf_proxy_completion_t *c,
                                const kvf_proxy_choice_out_t *chs, int n,
                                const kvf_proxy_usage_t *usage)
{
    cJSON *choices;
    cJSON *root = kvf_proxy_object(ctx, req, c, false, &choices);

    if (root == NULL) {
        return NULL;
    }
    for (int i = 0; i < n; ++i) {
        cJSON *choice = kvf_proxy_choice(ctx, req, &chs[i], false);
        if (choice == NULL) {
            cJSON_Delete(root);
            return NULL;
        }
        cJSON_AddItemToArray(choices, choice);
    }
    if (req->want_prompt_logprobs && req->chat) {   /* vLLM's chat: one, on the response */
        cJSON *pl = (n > 0) ? kvf_proxy_prompt_lp_json(ctx, &chs[0]) : NULL;
        cJSON_AddItemToObject(root, "prompt_logprobs", (pl != NULL) ? pl : cJSON_CreateNull());
    }
    kvf_proxy_add_usage(root, usage);
    kvf_proxy_add_summary(root, req, c, 0);
    return kvf_proxy_print(root);
}

char *kvf_proxy_openai_models_json(const kvf_proxy_openai_ctx_t *ctx, int64_t created)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *data = cJSON_AddArrayToObject(root, "data");
    int n = (ctx->num_names > 0) ? ctx->num_names : 1;

    if (data == NULL) {
        cJSON_Delete(root);
        return NULL;
    }
    cJSON_AddStringToObject(root, "object", "list");
    /* one card per served name, all of the one model (vLLM lists them so) */
    for (int i = 0; i < n; ++i) {
        const char *name = (ctx->num_names > 0) ? ctx->names[i] : ctx->model_name;
        cJSON *m = cJSON_CreateObject();

        if (m == NULL) {
            cJSON_Delete(root);
            return NULL;
        }
        cJSON_AddStringToObject(m, "id", name);
        cJSON_AddStringToObject(m, "object", "model");
        cJSON_AddNumberToObject(m, "created", (double)created);
        cJSON_AddStringToObject(m, "owned_by", "kvferry");
        cJSON_AddStringToObject(m, "root", (ctx->root != NULL) ? ctx->root : name);
        cJSON_AddNullToObject(m, "parent");
        if (ctx->max_model_len > 0) {
            cJSON_AddNumberToObject(m, "max_model_len", ctx->max_model_len);
        } else {
            cJSON_AddNullToObject(m, "max_model_len");
        }
        cJSON_AddItemToObject(m, "permission", cJSON_CreateArray());
        cJSON_AddItemToArray(data, m);
    }
    return kvf_proxy_print(root);
}
