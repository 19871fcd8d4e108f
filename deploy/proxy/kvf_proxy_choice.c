/* One choice's flow and text: decoding, stop strings, hold-back (kvf_proxy_choice.h). */
#include "kvf_proxy_choice.h"
#include "kvf_array.h"
#include "kvf_proxy_tools.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

kvf_status_t kvf_proxy_choice_init(kvf_proxy_choice_t *ch, const kvf_proxy_openai_ctx_t *ctx,
                                   const kvf_proxy_completion_req_t *req, int index)
{
    int per = kvf_proxy_req_per_prompt(req), j;

    memset(ch, 0, sizeof(*ch));
    ch->index = index;
    ch->prompt_idx = index / per;
    j = index % per;
    ch->stop_token = -1;
    ch->sub = *req;
    ch->show_logprobs = req->want_logprobs;
    ch->sub.want_logprobs = req->want_logprobs || (per > req->n);   /* best_of ranks by them */
    ch->sub.prompt_ids = req->prompts[ch->prompt_idx];
    ch->sub.num_prompt = req->prompt_lens[ch->prompt_idx];
    if (req->has_seed) {
        ch->sub.seed = req->seed + (uint64_t)j;
    }
    if (req->echo) {
        size_t cap = (size_t)ch->sub.num_prompt * 64 + 1;
        ch->echo = malloc(cap);
        if (ch->echo == NULL) {
            return KVF_ERR_NO_MEMORY;
        }
        (void)kvf_tokenizer_decode(ctx->tok, ch->sub.prompt_ids, ch->sub.num_prompt, ch->echo,
                                   cap);
    }
    return KVF_OK;
}

static bool kvf_proxy_choice_stop_id(const kvf_proxy_choice_t *ch, int32_t id)
{
    for (int i = 0; i < ch->sub.num_stop_ids; ++i) {
        if (ch->sub.stop_token_ids[i] == id) {
            return true;
        }
    }
    return false;
}

/* The earliest stop string in text[from, len): its position, or -1; *which the string. */
static long kvf_proxy_choice_find(const kvf_proxy_choice_t *ch, size_t from, int *which)
{
    long best = -1;

    for (int i = 0; i < ch->sub.num_stop; ++i) {
        const char *hit = strstr(ch->text + from, ch->sub.stop[i]);
        if ((hit != NULL) && ((best < 0) || (hit - ch->text < best))) {
            best = (long)(hit - ch->text);
            *which = i;
        }
    }
    return best;
}

static size_t kvf_proxy_choice_maxstop(const kvf_proxy_choice_t *ch)
{
    size_t m = 0;

    for (int i = 0; i < ch->sub.num_stop; ++i) {
        size_t l = strlen(ch->sub.stop[i]);
        m = (l > m) ? l : m;
    }
    return m;
}

static kvf_status_t kvf_proxy_choice_append(kvf_proxy_choice_t *ch, const char *s, size_t n)
{
    if (KVF_ARRAY_GROW(ch->text, ch->cap, ch->len + n + 1, 256) != KVF_OK) {
        return KVF_ERR_NO_MEMORY;
    }
    memcpy(ch->text + ch->len, s, n);
    ch->len += n;
    ch->text[ch->len] = '\0';
    return KVF_OK;
}

/* A decoded NUL would end the C string early: shown as U+FFFD (as the old relay did). */
static kvf_status_t kvf_proxy_choice_append_text(kvf_proxy_choice_t *ch, const char *s, size_t n)
{
    for (size_t i = 0; i < n; ++i) {
        kvf_status_t st = (s[i] == '\0') ? kvf_proxy_choice_append(ch, "\xef\xbf\xbd", 3) :
                                           kvf_proxy_choice_append(ch, s + i, 1);
        if (st != KVF_OK) {
            return st;
        }
    }
    return KVF_OK;
}

kvf_status_t kvf_proxy_choice_update(kvf_proxy_choice_t *ch, const kvf_proxy_openai_ctx_t *ctx)
{
    kvf_proxy_completion_t *o = &ch->flow.out;
    size_t maxstop = kvf_proxy_choice_maxstop(ch);
    char buf[4 * KVF_TOKENIZER_STREAM_PEND + 256];
    kvf_status_t st;

    while (!ch->stopped && (ch->decoded < o->num_tokens)) {
        int32_t id = o->tokens[ch->decoded];
        size_t before = ch->len, w;
        char *piece = buf;
        size_t cap = kvf_tokenizer_stream_cap(ctx->tok, 1);

        if (cap > sizeof(buf)) {
            piece = malloc(cap);
            if (piece == NULL) {
                return KVF_ERR_NO_MEMORY;
            }
        } else {
            cap = sizeof(buf);
        }
        w = kvf_tokenizer_stream_feed(ctx->tok, &ch->dec, &id, 1, piece, cap);
        st = kvf_proxy_choice_append_text(ch, piece, w);
        if (piece != buf) {
            free(piece);
        }
        if (st != KVF_OK) {
            return st;
        }
        if (KVF_ARRAY_GROW(ch->tok_end, ch->cap_tok_end, ch->decoded + 1, 64) != KVF_OK) {
            return KVF_ERR_NO_MEMORY;
        }
        ch->tok_end[ch->decoded++] = ch->len;
        if (kvf_proxy_choice_stop_id(ch, id)) {
            ch->stop_token = id;
        }
        /* vLLM looks for stop strings once min_tokens are out, in the new text and the
         * stop string's length before it */
        if ((ch->sub.num_stop > 0) && ((uint32_t)ch->decoded >= ch->sub.min_tokens)) {
            size_t from = (before + 1 > maxstop) ? before + 1 - maxstop : 0;
            int which = 0;
            long at = kvf_proxy_choice_find(ch, from, &which);
            if (at >= 0) {
                ch->stopped = true;
                ch->stop_reason = ch->sub.stop[which];
                ch->end = (size_t)at + (ch->sub.include_stop_str_in_output ?
                                        strlen(ch->sub.stop[which]) : 0);
                o->num_tokens = ch->decoded;   /* tokens after the stop's are not output */
                if (o->num_logprobs > o->num_tokens) {
                    o->num_logprobs = o->num_tokens;
                }
                kvf_proxy_flow_stop(&ch->flow, "stop");
            }
        }
    }
    if (!ch->stopped && (ch->flow.stage == KVF_PROXY_FLOW_OVER) && ch->flow.done &&
        !ch->flushed) {
        size_t w = kvf_tokenizer_stream_flush(&ch->dec, buf, sizeof(buf));
        ch->flushed = true;
        st = kvf_proxy_choice_append_text(ch, buf, w);
        if (st != KVF_OK) {
            return st;
        }
        ch->end = ch->len;
    }
    if ((ch->sub.tool_parser != 0) && !ch->tools_parsed && kvf_proxy_choice_over(ch)) {
        kvf_proxy_reasoning_span_t sp;
        size_t content_end = 0;
        kvf_proxy_choice_span(ch, &sp);   /* the tools are read from the content only */
        ch->tools_parsed = true;   /* calls found: the text before them is the content */
        ch->text_end = ch->end;
        if (sp.c_start < ch->end) {
            st = kvf_proxy_tools_parse_output((kvf_proxy_tool_parser_t)ch->sub.tool_parser,
                                              ch->sub.parallel_tool_calls,
                                              ch->text + sp.c_start, ch->end - sp.c_start,
                                              &ch->tool_calls, &content_end);
            ch->end = (ch->tool_calls != NULL) ? sp.c_start + content_end : ch->end;
        }
        return st;
    }
    return KVF_OK;
}

bool kvf_proxy_choice_over(const kvf_proxy_choice_t *ch)
{
    return ch->stopped || (ch->flow.done && ch->flushed);
}

/* The text no stop string nor reasoning marker may still change (the choice running), its
 * span in @a sp. */
static size_t kvf_proxy_choice_settled(const kvf_proxy_choice_t *ch,
                                       kvf_proxy_reasoning_span_t *sp)
{
    size_t hold = 0, ready;

    /* the longest tail that is the start of a stop string waits for the next tokens */
    for (int i = 0; i < ch->sub.num_stop; ++i) {
        size_t l = strlen(ch->sub.stop[i]);
        for (size_t k = (l - 1 < ch->len) ? l - 1 : ch->len; k > hold; --k) {
            if (memcmp(ch->text + ch->len - k, ch->sub.stop[i], k) == 0) {
                hold = k;
                break;
            }
        }
    }
    ready = ch->len - hold;
    kvf_proxy_choice_span(ch, sp);   /* nor a possible reasoning marker */
    return (sp->hold < ready) ? sp->hold : ready;
}

size_t kvf_proxy_choice_ready(const kvf_proxy_choice_t *ch)
{
    kvf_proxy_reasoning_span_t sp;
    size_t ready;

    if (kvf_proxy_choice_over(ch)) {
        return ch->end;
    }
    ready = kvf_proxy_choice_settled(ch, &sp);
    if (ready > sp.c_start) {   /* nor what may be a tool call in the content */
        ready = sp.c_start +
                kvf_proxy_tools_ready((kvf_proxy_tool_parser_t)ch->sub.tool_parser,
                                      ch->text + sp.c_start, ready - sp.c_start);
    }
    return ready;
}

kvf_status_t kvf_proxy_choice_tool_delta(kvf_proxy_choice_t *ch, size_t upto, bool last,
                                         cJSON **delta_p)
{
    kvf_proxy_reasoning_span_t sp;
    size_t settled;

    *delta_p = NULL;
    if (ch->sub.tool_parser == 0) {
        return KVF_OK;
    }
    if (last) {
        return kvf_proxy_tools_stream_finish(&ch->tools_sent, ch->tool_calls, delta_p);
    }
    if (kvf_proxy_choice_over(ch)) {   /* its tokens still going out one by one */
        kvf_proxy_choice_span(ch, &sp);
        settled = ch->text_end;
    } else {
        settled = kvf_proxy_choice_settled(ch, &sp);
    }
    settled = (upto < settled) ? upto : settled;
    if (settled <= sp.c_start) {
        return KVF_OK;
    }
    return kvf_proxy_tools_stream_next(&ch->tools_sent,
                                       (kvf_proxy_tool_parser_t)ch->sub.tool_parser,
                                       ch->sub.parallel_tool_calls, ch->text + sp.c_start,
                                       settled - sp.c_start, delta_p);
}

void kvf_proxy_choice_span(const kvf_proxy_choice_t *ch, kvf_proxy_reasoning_span_t *sp)
{
    size_t len = kvf_proxy_choice_over(ch) ? ch->end : ch->len;

    if ((ch->text == NULL) || (len == 0)) {
        *sp = (kvf_proxy_reasoning_span_t){0, 0, 0, 0};
        return;
    }
    kvf_proxy_reasoning_split((kvf_proxy_reasoning_t)ch->sub.reasoning, ch->text, len,
                              kvf_proxy_choice_over(ch), sp);
}

const char *kvf_proxy_choice_finish(const kvf_proxy_choice_t *ch)
{
    if (ch->tool_calls != NULL) {
        return "tool_calls";
    }
    if (ch->stopped) {
        return "stop";
    }
    return (ch->flow.out.finish_reason[0] != '\0') ? ch->flow.out.finish_reason : "length";
}

bool kvf_proxy_choice_ends_at(const kvf_proxy_choice_t *ch, const kvf_proxy_openai_ctx_t *ctx,
                              int n)
{
    int32_t id = ch->flow.out.tokens[n - 1];

    return ((uint32_t)n >= ch->sub.max_tokens) || kvf_proxy_choice_stop_id(ch, id) ||
           (!ch->sub.ignore_eos && (id == ctx->tok->eos_token_id));
}

int kvf_proxy_choice_tokens(const kvf_proxy_choice_t *ch)
{
    return ch->flow.out.num_tokens;
}

void kvf_proxy_choice_cleanup(kvf_proxy_choice_t *ch)
{
    if (ch->begun) {
        kvf_proxy_flow_finish(&ch->flow);
        ch->begun = false;
    }
    free(ch->text);
    ch->text = NULL;
    free(ch->echo);
    ch->echo = NULL;
    cJSON_Delete(ch->tool_calls);
    ch->tool_calls = NULL;
    kvf_proxy_tools_stream_free(&ch->tools_sent);
    free(ch->tok_end);
    ch->tok_end = NULL;
}

/* A candidate's cumulative logprob over its tokens; -inf without them all. */
static double kvf_proxy_choice_cum(const kvf_proxy_choice_t *ch)
{
    const kvf_proxy_completion_t *o = &ch->flow.out;
    int n = kvf_proxy_choice_tokens(ch);
    double sum = 0.0;

    if ((o->token_logprobs == NULL) || (o->num_logprobs < n)) {
        return -INFINITY;
    }
    for (int i = 0; i < n; ++i) {
        sum += (double)o->token_logprobs[i];
    }
    return sum;
}

void kvf_proxy_choice_best(const kvf_proxy_choice_t *cands, int per, int n, int *pick)
{
    double cum[KVF_PROXY_MAX_CHOICES];
    bool taken[KVF_PROXY_MAX_CHOICES] = {false};

    for (int i = 0; i < per; ++i) {
        cum[i] = kvf_proxy_choice_cum(&cands[i]);
    }
    for (int r = 0; r < n; ++r) {   /* selection: per <= 16 */
        int best = -1;
        for (int i = 0; i < per; ++i) {
            if (!taken[i] && ((best < 0) || (cum[i] > cum[best]))) {
                best = i;
            }
        }
        taken[best] = true;
        pick[r] = best;
    }
}
