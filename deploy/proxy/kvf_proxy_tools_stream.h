/*
 * Tool calls streamed as they are generated, in vLLM's chunk shapes (its tool parsers'
 * extract_tool_calls_streaming and serving_chat's last chunk):
 *   - a call's first delta once its name is whole:
 *       {"index": i, "id": "chatcmpl-tool-...", "type": "function", "function": {"name": n}}
 *     (no "arguments" key: vLLM drops unset fields; clients start them from "");
 *   - then deltas of its arguments as they grow: {"index": i, "function": {"arguments": s}};
 *   - parallel calls in order, index 0, 1, ...; the choice's last chunk carries what is left
 *     and finish_reason "tool_calls".
 * The arguments sent are always a prefix of what the finished output's parse gives
 * (kvf_proxy_tools_parse_output: Python's json.dumps of the parsed value), so the deltas
 * add up to the non-streamed answer: the model's JSON is read by a reader that stops where
 * its input ends, and every value is written in that form only once it is whole (a number,
 * true/false/null; a string character by character, an escape once complete).
 * The text before the first call's marker is content (kvf_proxy_tools_ready holds back what
 * could begin one); the markup itself is never sent as content, unless the finished output
 * does not parse as calls: then, as the non-streamed answer, its text is content and
 * finish_reason is the flow's (the call deltas already sent cannot be taken back).
 *
 * Design: the running text (its content part, less what a stop string or a reasoning marker
 * may still cut) is read again from its start at each step, and what was sent (per call:
 * its id, name and arguments) is kept, so a delta is the difference. Outputs are short (the
 * reading is linear in them), and no parser state can drift from the final parse.
 * Rejected: vLLM's own way (its partial-JSON parser's guess, the arguments' re-serialization
 * searched for the new token's text): a token whose text is not found is skipped, and the
 * deltas do not always add up to the final arguments.
 */
#ifndef KVF_PROXY_TOOLS_STREAM_H
#define KVF_PROXY_TOOLS_STREAM_H

#include "kvf_proxy_tools.h"

/** One call as it was sent. */
typedef struct {
    char   id[48];
    char  *name;   /* malloc'd */
    char  *args;   /* the arguments sent so far, malloc'd (NUL-terminated); NULL: none */
    size_t args_len;
} kvf_proxy_tool_sent_t;

/** What a choice's stream has sent of its calls (zeroed: nothing). */
typedef struct {
    kvf_proxy_tool_sent_t *calls;
    int                    num, cap;
} kvf_proxy_tool_stream_t;

/**
 * The next tool-call delta of a running output whose content so far is @a text (@a len
 * bytes, all of it settled: nothing a stop string may still cut).
 * @param [out] delta_p  a JSON array of one delta (a call's first, or its arguments' next
 *                       piece), recorded as sent; NULL: nothing new
 * @return KVF_OK; KVF_ERR_NO_MEMORY.
 */
kvf_status_t kvf_proxy_tools_stream_next(kvf_proxy_tool_stream_t *ts,
                                         kvf_proxy_tool_parser_t parser, bool parallel,
                                         const char *text, size_t len, cJSON **delta_p);

/**
 * The deltas that complete what was sent to the finished output's calls @a calls
 * (kvf_proxy_tools_parse_output's; NULL: none parsed): the arguments left of calls begun,
 * the calls not begun whole (id, type, name, arguments).
 * @param [out] deltas_p  a JSON array of deltas, NULL when there is none
 * @return KVF_OK; KVF_ERR_NO_MEMORY.
 */
kvf_status_t kvf_proxy_tools_stream_finish(kvf_proxy_tool_stream_t *ts, const cJSON *calls,
                                           cJSON **deltas_p);

/** Free what @a ts holds (it is zeroed). */
void kvf_proxy_tools_stream_free(kvf_proxy_tool_stream_t *ts);

#endif
