/*
 * Reasoning in chat (kvf-proxy --reasoning-parser, vLLM's flag): a model that thinks in
 * <think> ... </think> before answering has that text returned apart, as
 * message.reasoning_content (delta.reasoning_content when streaming), and only the rest as
 * content (which the tool parser, if any, then reads). The parsers, as vLLM's of the same
 * names behave:
 *   deepseek_r1  the output is reasoning up to </think> (a leading <think> dropped), as the
 *                template opens the block in the prompt; no </think>: all of it reasoning
 *   qwen3        reasoning only between a leading <think> and </think>; a finished output
 *                without both is all content
 * Streaming: a tail that may begin a marker is held back until it is known.
 * include_reasoning false drops the reasoning from the answer.
 */
#ifndef KVF_PROXY_REASONING_H
#define KVF_PROXY_REASONING_H

#include <stdbool.h>
#include <stddef.h>

typedef enum {
    KVF_REASONING_NONE = 0,
    KVF_REASONING_DEEPSEEK_R1,
    KVF_REASONING_QWEN3,
} kvf_proxy_reasoning_t;

/** Where an output's parts are: reasoning text[r_start, r_end), content from c_start; text
 *  before @a hold is known (the rest may still become a marker). */
typedef struct kvf_proxy_reasoning_span {
    size_t r_start, r_end;
    size_t c_start;
    size_t hold;
} kvf_proxy_reasoning_span_t;

/** The parser named @a name; @return false when there is none of that name. */
bool kvf_proxy_reasoning_from_name(const char *name, kvf_proxy_reasoning_t *out);

/**
 * Split @a text (@a len bytes) by @a parser; @a final: the output is complete. NONE gives
 * no reasoning, content from 0, nothing held.
 */
void kvf_proxy_reasoning_split(kvf_proxy_reasoning_t parser, const char *text, size_t len,
                               bool final, kvf_proxy_reasoning_span_t *sp);

#endif
