/*
 * The subset of Jinja that chat templates use, run as transformers runs a template
 * for vLLM: trim_blocks and lstrip_blocks on, loopcontrols, undefined names render
 * as "", raise_exception() fails the render with its message, strftime_now(),
 * the immutable sandbox. Checked against Python's jinja2 on the project's own
 * templates (tests/deploy/test_chat_template.py) and on 70 real Hugging Face
 * templates (test_chat_template_real.py); what is outside it is refused by name
 * (deploy/README.md, "Chat templates").
 */
#ifndef KVF_PROXY_JINJA_H
#define KVF_PROXY_JINJA_H

#include "kvf_status.h"

#include <cjson/cJSON.h>
#include <stddef.h>
#include <time.h>

/**
 * Render @a tmpl with the variables of @a vars (a JSON object).
 *
 * @param [out] out_p  the text (malloc'd; the caller frees) on success
 * @param [out] err    on failure: what failed (syntax with its offset, an
 *                     unsupported construct by name, or raise_exception's text)
 * @return KVF_OK; KVF_ERR_PARSE (syntax); KVF_ERR_UNSUPPORTED (outside the subset);
 *         KVF_ERR_INVALID_PARAM (raise_exception, a type error); KVF_ERR_NO_MEMORY.
 */
kvf_status_t kvf_proxy_jinja_render(const char *tmpl, const cJSON *vars, char **out_p,
                                    char *err, size_t cap);

/**
 * kvf_proxy_jinja_render() with the clock of strftime_now() at @a now (seconds since the
 * epoch, formatted in local time as Python's datetime.now() is); the tests fix it so that a
 * date-dependent template renders the same text as the reference.
 */
kvf_status_t kvf_proxy_jinja_render_at(const char *tmpl, const cJSON *vars, time_t now,
                                       char **out_p, char *err, size_t cap);

#endif
