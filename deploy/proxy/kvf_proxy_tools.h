/*
 * Tool calling in chat, as vLLM does it: the request's "tools" reach the chat template
 * (as the "tools" variable: {"type": "function", "function": {"name", "description",
 * "parameters"}} each), assistant messages' "tool_calls" (arguments parsed from their JSON
 * string, as vLLM hands them to templates) and tool messages' "tool_call_id" are rendered
 * by the template, and with tool_choice "auto" (the default when tools are given) the
 * model's text is parsed by the operator's --tool-call-parser (--enable-auto-tool-choice):
 *   hermes       <tool_call>{"name": ..., "arguments": {...}}</tool_call> blocks (Qwen,
 *                Hermes); the text before the first block is the content
 *   llama3_json  the whole output one or more {"name": ..., "parameters" | "arguments": ...}
 *                objects separated by ";" (optionally after <|python_tag|>); no content
 *   mistral      [TOOL_CALLS] then a JSON list of {"name", "arguments"}; the text before it
 *                is the content
 * A parse that fails returns the whole text as content (never an error). tool_choice
 * "none" renders the tools and parses nothing; "required" and a named function need
 * constrained decoding, which kvferry does not have: refused by name.
 * Streaming: text is streamed until a call may start (a tail that could begin the
 * parser's marker is held back, as stop strings are); then each call streams as vLLM's do,
 * its name once whole and its arguments as they grow (kvf_proxy_tools_stream.h), and the
 * choice's last chunk has finish_reason "tool_calls".
 * Arguments are re-serialized as Python's json.dumps writes them (", ", ": "), as vLLM's.
 */
#ifndef KVF_PROXY_TOOLS_H
#define KVF_PROXY_TOOLS_H

#include "kvf_proxy_chat_args.h"
#include "kvf_status.h"

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>

typedef enum {
    KVF_TOOL_PARSER_NONE = 0,
    KVF_TOOL_PARSER_HERMES,
    KVF_TOOL_PARSER_LLAMA3_JSON,
    KVF_TOOL_PARSER_MISTRAL,
} kvf_proxy_tool_parser_t;

/** The parser named @a name (vLLM's names); @return false when there is none of that name. */
bool kvf_proxy_tool_parser_from_name(const char *name, kvf_proxy_tool_parser_t *out);

/**
 * Parse "tools", "tool_choice" and "parallel_tool_calls" of a chat request: the tools
 * (checked) into @a args as the template's "tools"; the parser to run on the output
 * (NONE: tool_choice none or no tools) into @a parser_p.
 *
 * @param server_parser  --tool-call-parser (NONE: not set)
 * @param auto_ok        --enable-auto-tool-choice
 * @param [out] parallel_p  parallel_tool_calls (default true; false: the first call only)
 * @return KVF_OK; KVF_ERR_INVALID_PARAM (400 naming the field); KVF_ERR_NO_MEMORY.
 */
kvf_status_t kvf_proxy_tools_parse_request(const cJSON *root, kvf_proxy_tool_parser_t server_parser,
                                           bool auto_ok, kvf_proxy_chat_args_t *args,
                                           kvf_proxy_tool_parser_t *parser_p, bool *parallel_p,
                                           int *http_p, const char **param_p, char *err,
                                           size_t cap);

/**
 * A message's tool fields for the template: an assistant's "tool_calls" (each {id, type
 * "function", function {name, arguments: a JSON string}}; arguments parsed into an object)
 * or a tool message's "tool_call_id" (a string), copied into @a out.
 * @return KVF_OK; KVF_ERR_INVALID_PARAM (@a err names messages[i] and the field).
 */
kvf_status_t kvf_proxy_tools_message(const cJSON *m, const char *role, int i, cJSON *out,
                                     char *err, size_t cap);

/**
 * Parse a finished output @a text (@a len bytes) with @a parser.
 * @param [out] calls_p        the tool calls (a JSON array of {id, type, function {name,
 *                             arguments}}), NULL when the text holds none or does not parse
 * @param [out] content_end_p  with calls: the bytes of text that are content
 * @return KVF_OK (calls or not); KVF_ERR_NO_MEMORY.
 */
kvf_status_t kvf_proxy_tools_parse_output(kvf_proxy_tool_parser_t parser, bool parallel,
                                          const char *text, size_t len, cJSON **calls_p,
                                          size_t *content_end_p);

/** While an output is running: how much of its @a len bytes may be streamed as content
 *  (the text before a call's marker, less a tail that may begin one). */
size_t kvf_proxy_tools_ready(kvf_proxy_tool_parser_t parser, const char *text, size_t len);

/**
 * A chat message (or, @a chunk, a delta) with tool calls: "content" @a text (null when empty
 * in a message, left out of a delta), "tool_calls" @a calls copied (a message's: the parsed
 * calls; a delta's: tool-call deltas with their "index", kvf_proxy_tools_stream.h), added
 * to @a m.
 */
void kvf_proxy_tools_to_message(cJSON *m, const char *text, const cJSON *calls, bool chunk);

/** A JSON value as Python's json.dumps(ensure_ascii=False) writes it; malloc'd, NULL: no
 *  memory. */
char *kvf_proxy_json_dumps_py(const cJSON *v);

/** Byte @a c of a decoded string as json.dumps writes it (an escape, or the byte itself)
 *  into @a out [8]; @return the bytes written (1 to 6, not NUL-terminated). */
int kvf_proxy_json_char_py(unsigned char c, char *out);

/** A number as json.dumps writes cJSON's value @a v (an integral value as an integer,
 *  else the shortest repr of the float) into @a out [cap >= 40], NUL-terminated. */
void kvf_proxy_json_num_py(double v, char *out, size_t cap);

/** A new call id for @a parser's output (vLLM's: "chatcmpl-tool-" and 32 hex digits;
 *  mistral: 9 letters and digits) into @a id [cap >= 48]. */
void kvf_proxy_tool_id(kvf_proxy_tool_parser_t parser, char *id, size_t cap);

/** The parsers' markers. */
extern const char kvf_proxy_tool_hermes_open[], kvf_proxy_tool_hermes_close[];
extern const char kvf_proxy_tool_mistral_tag[], kvf_proxy_tool_llama_tag[];

#endif
