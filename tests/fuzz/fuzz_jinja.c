/*
 * libFuzzer target: kvf-proxy's chat template renderer (deploy/proxy/kvf_proxy_jinja*.c)
 * on any template and any variables. A template comes from the model's folder and the
 * messages from a client, so neither may crash, hang or exhaust the proxy.
 *
 * Input: the template, then optionally a NUL byte and the variables as JSON (an object;
 * otherwise a fixed conversation with a system prompt, a tool call and its result, tools
 * and add_generation_prompt). Checked beyond "no crash, leak or UB": a render answers
 * KVF_OK with text or one of the documented errors with a message; the same input renders
 * the same text twice (a request's prompt must not depend on anything else).
 *
 * Seeds: tests/fuzz/corpus/fuzz_jinja (the project's own templates of
 * tests/data/chat_templates and a few constructs the real templates use).
 */
#include "kvf_proxy_jinja.h"

#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(cond)                                                                   \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            fprintf(stderr, "fuzz_jinja: invariant failed: %s (line %d)\n", #cond,        \
                    __LINE__);                                                             \
            abort();                                                                       \
        }                                                                                  \
    } while (0)

static const char *const fuzz_default_vars =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"be brief\"},"
    " {\"role\": \"user\", \"content\": \"weather in Paris?\"},"
    " {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"id\": \"c1\","
    " \"type\": \"function\", \"function\": {\"name\": \"get_weather\","
    " \"arguments\": {\"city\": \"Paris\"}}}]},"
    " {\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": \"21\"}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\","
    " \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}}}}],"
    " \"documents\": null, \"add_generation_prompt\": true, \"bos_token\": \"<s>\","
    " \"eos_token\": \"</s>\"}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    size_t tn = (nul != NULL) ? (size_t)(nul - data) : size;
    char *tmpl = malloc(tn + 1), *out1 = NULL, *out2 = NULL;
    cJSON *vars = NULL;
    char err1[256], err2[256];
    kvf_status_t st1, st2;

    FUZZ_CHECK(tmpl != NULL);
    memcpy(tmpl, data, tn);
    tmpl[tn] = '\0';
    if (nul != NULL) {
        vars = cJSON_ParseWithLength((const char *)nul + 1, size - tn - 1);
    }
    if (!cJSON_IsObject(vars)) {
        cJSON_Delete(vars);
        vars = cJSON_Parse(fuzz_default_vars);
    }
    FUZZ_CHECK(vars != NULL);
    st1 = kvf_proxy_jinja_render_at(tmpl, vars, 1721995200, &out1, err1, sizeof(err1));
    st2 = kvf_proxy_jinja_render_at(tmpl, vars, 1721995200, &out2, err2, sizeof(err2));
    FUZZ_CHECK(st1 == st2);
    if (st1 == KVF_OK) {
        FUZZ_CHECK((out1 != NULL) && (out2 != NULL) && (strcmp(out1, out2) == 0));
    } else {
        FUZZ_CHECK((st1 == KVF_ERR_PARSE) || (st1 == KVF_ERR_UNSUPPORTED) ||
                   (st1 == KVF_ERR_INVALID_PARAM) || (st1 == KVF_ERR_NO_MEMORY));
        FUZZ_CHECK((out1 == NULL) && (err1[0] != '\0') && (strcmp(err1, err2) == 0));
    }
    free(out1);
    free(out2);
    free(tmpl);
    cJSON_Delete(vars);
    return 0;
}
