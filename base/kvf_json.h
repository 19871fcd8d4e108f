/*
 * A checkpoint's JSON files (config.json, tokenizer.json, tokenizer_config.json,
 * the safetensors index) as the programs that write them write them.
 *
 * Python's json.dump writes a non-finite float as the bare literals Infinity,
 * -Infinity and NaN (allow_nan=True is its default, and transformers 4.x's
 * save_pretrained kept it): NVIDIA's Nemotron-H configs carry
 * "time_step_limit": [0.0, Infinity]. transformers 5 writes the same values as
 * {"__float__": "Infinity"}. Both mean a number; strict JSON (cJSON) has neither.
 *
 * Design: the text is parsed by cJSON after a pre-pass that rewrites the three
 * literals, outside strings and only as whole tokens, into forms cJSON reads
 * (1e999 overflows strtod to +inf; NaN becomes a string marker absent from the
 * file, turned back into a NaN number after the parse), so every other byte is
 * judged by cJSON itself and nothing else beyond JSON is accepted.
 * Rejected: a JSON parser of our own (cJSON is the tree's one JSON parser);
 * json5-style leniency (comments, trailing commas): Python never writes them.
 */
#ifndef KVF_JSON_H
#define KVF_JSON_H

#include "kvf_status.h"

#include <stddef.h>

#include <cjson/cJSON.h>

/**
 * Parse @a len bytes of @a text as a checkpoint JSON document: strict JSON plus
 * Python's Infinity / -Infinity / NaN literals, with whitespace alone after the
 * value. Objects of exactly one member "__float__" whose value is the string
 * "Infinity", "-Infinity" or "NaN" (transformers 5) become those numbers too.
 *
 * @param [in]  text    The document (need not be NUL-terminated); not kept.
 * @param [in]  len     Its length in bytes.
 * @param [in]  origin  Name for messages (a file path); NULL reads "JSON".
 * @param [out] root_p  The parsed tree, the caller's to cJSON_Delete; NULL on error.
 * @return KVF_OK; KVF_ERR_PARSE when the text is not such a document, with one
 *         log line "<origin>:<line>:<column>: not valid JSON: found '<text>'"
 *         (line and column 1-based, in bytes of the original text; "found end
 *         of file" for a truncated one); KVF_ERR_NO_MEMORY.
 */
kvf_status_t kvf_json_parse(const char *text, size_t len, const char *origin, cJSON **root_p);

/**
 * Read the file at @a path (at most @a max_bytes; 0 means 256 MiB) and parse it
 * with kvf_json_parse(), the path naming it in messages.
 *
 * @param [out] root_p  The parsed tree, the caller's to cJSON_Delete; NULL on error.
 * @return KVF_OK; KVF_ERR_NOT_FOUND (no such file) or KVF_ERR_IO, logged with the
 *         path and the system's reason; KVF_ERR_OUT_OF_RANGE when the file is
 *         larger than @a max_bytes; kvf_json_parse()'s errors.
 */
kvf_status_t kvf_json_load(const char *path, size_t max_bytes, cJSON **root_p);

/**
 * A checkpoint's config.json: @a path names the file or the folder holding it (then
 * "<path>/config.json"), loaded with kvf_json_load(); the file's name into @a file
 * (@a cap bytes) for messages. Errors: kvf_json_load()'s, with
 * KVF_ERR_NOT_FOUND and KVF_ERR_OUT_OF_RANGE as KVF_ERR_IO (callers tell "no config" from
 * "bad config" by IO against the parse errors).
 */
kvf_status_t kvf_json_load_config(const char *path, size_t max_bytes, char *file, size_t cap,
                                  cJSON **root_p);

/**
 * Print @a root as cJSON_Print() does, but with non-finite numbers written as
 * Python's literals (Infinity, -Infinity, NaN) where cJSON writes null, so a
 * config rewritten by kvferry keeps its meaning for transformers and for
 * kvf_json_parse(). Those number items of @a root are turned into raw items.
 *
 * @return The text, the caller's to free(); NULL when out of memory.
 */
char *kvf_json_print(cJSON *root);

#endif /* KVF_JSON_H */
