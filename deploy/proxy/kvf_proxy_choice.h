/*
 * One choice of a completion: its flow (a prompt through prefill and decode)
 * and its text. The text is decoded token by token; stop strings are searched
 * in it as vLLM does (from the token where min_tokens is reached on, each new
 * piece together with the stop string's length before it), and what could
 * still be the start of a stop string is held back, so a stream never shows
 * text that a later token turns into a stop. A stop string found ends the flow
 * at once (kvf_proxy_flow_stop()) and cuts the text before it (or after it,
 * with include_stop_str_in_output).
 *
 * Pure state plus the flow: no I/O of its own; kvf_proxy_sse.c drives it.
 */
#ifndef KVF_PROXY_CHOICE_H
#define KVF_PROXY_CHOICE_H

#include "kvf_proxy_flow.h"
#include "kvf_proxy_openai.h"
#include "kvf_proxy_reasoning.h"
#include "kvf_proxy_tools_stream.h"

typedef struct kvf_proxy_choice {
    int                        index;       /* prompt x per prompt + j (per prompt: n, or
                                             * best_of candidates) */
    int                        prompt_idx;
    kvf_proxy_completion_req_t sub;         /* the request's copy: this prompt, this seed */
    kvf_proxy_flow_t           flow;
    bool                       begun;       /* flow begun (finish it) */
    kvf_tokenizer_stream_t     dec;
    char                      *text;        /* everything decoded so far (NUL-terminated) */
    size_t                     len, cap;
    int                        decoded;     /* tokens fed to the decoder */
    size_t                    *tok_end;     /* [decoded]: the text's length after each */
    int                        cap_tok_end;
    size_t                     end;         /* text kept once stopped: the cut */
    bool                       stopped;     /* a stop string ended it */
    const char                *stop_reason; /* the stop string (req's), or NULL */
    int                        stop_token;  /* the stop token id that ended it, or -1 */
    bool                       flushed;     /* decoder flushed (flow over) */
    /* streaming */
    size_t                     sent;        /* text bytes sent */
    int                        ids_sent;    /* tokens sent */
    bool                       first_sent;
    bool                       final_sent;
    char                      *echo;        /* the prompt's text (echo), owned; NULL: none */
    bool                       show_logprobs; /* the client asked (a best_of candidate's are
                                               * asked for its ranking only) */
    bool                       tools_parsed;  /* the output went through its tool parser */
    struct cJSON              *tool_calls;    /* the calls it held (owned), or NULL */
    kvf_proxy_tool_stream_t    tools_sent;    /* streaming: the call deltas sent */
    size_t                     text_end;      /* the text's end before the tool parse cut
                                               * it at the calls */
} kvf_proxy_choice_t;

/**
 * Set up @a ch as choice @a index of @a req (prompt index / n, seed + j when the
 * request has a seed, as vLLM seeds n > 1 choices), with the prompt's text when
 * echo is on. @return KVF_OK; KVF_ERR_NO_MEMORY.
 */
kvf_status_t kvf_proxy_choice_init(kvf_proxy_choice_t *ch, const kvf_proxy_openai_ctx_t *ctx,
                                   const kvf_proxy_completion_req_t *req, int index);

/**
 * Decode the tokens the flow has appended since the last call; search the stop
 * strings; on a match stop the flow. When the flow is over the decoder is
 * flushed. @return KVF_OK; KVF_ERR_NO_MEMORY.
 */
kvf_status_t kvf_proxy_choice_update(kvf_proxy_choice_t *ch, const kvf_proxy_openai_ctx_t *ctx);

/** Whether the choice is over: its flow finished (normally or by a stop string). */
bool kvf_proxy_choice_over(const kvf_proxy_choice_t *ch);

/** Where the choice's reasoning and content are in its text so far (kvf_proxy_reasoning.h;
 *  final once over). */
void kvf_proxy_choice_span(const kvf_proxy_choice_t *ch, kvf_proxy_reasoning_span_t *sp);

/** Bytes of the text that may be shown now: all when over, else less what is held back. */
size_t kvf_proxy_choice_ready(const kvf_proxy_choice_t *ch);

/**
 * Streaming with a tool parser: the next tool-call delta of the choice (its calls' names and
 * arguments as far as the first @a upto bytes of its settled content hold them:
 * kvf_proxy_tools_stream.h), or, @a last (its final chunk, the choice over), what completes
 * the calls sent to the parsed ones.
 * @param upto  a text length: the tokens sent so far (one chunk per token), or SIZE_MAX
 * @param [out] delta_p  a JSON array of deltas (owned by the caller), NULL: nothing to send
 * @return KVF_OK; KVF_ERR_NO_MEMORY.
 */
kvf_status_t kvf_proxy_choice_tool_delta(kvf_proxy_choice_t *ch, size_t upto, bool last,
                                         struct cJSON **delta_p);

/** The finish_reason of an over choice ("stop", "length", ...). */
const char *kvf_proxy_choice_finish(const kvf_proxy_choice_t *ch);

/** Tokens of the choice (the flow's, cut after a stop string's token). */
int kvf_proxy_choice_tokens(const kvf_proxy_choice_t *ch);

/** Whether token @a n (1-based) of the output is known to be its last (max_tokens, EOS
 *  unless ignore_eos, a stop token id) before the flow says so. */
bool kvf_proxy_choice_ends_at(const kvf_proxy_choice_t *ch, const kvf_proxy_openai_ctx_t *ctx,
                              int n);

/** Finish the flow (if begun) and free the text. */
void kvf_proxy_choice_cleanup(kvf_proxy_choice_t *ch);

/**
 * best_of: the @a n of @a per candidates @a cands (one prompt's, finished, their logprobs
 * collected) with the highest cumulative logprob, best first (the lower index on ties, a
 * candidate without logprobs last), as candidate positions into @a pick [n].
 */
void kvf_proxy_choice_best(const kvf_proxy_choice_t *cands, int per, int n, int *pick);

#endif
