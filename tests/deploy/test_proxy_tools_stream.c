/*
 * Tool calls streamed as they are generated (deploy/proxy/kvf_proxy_tools_stream.h): each
 * model output is fed one byte more at a time (every token boundary there can be, markup and
 * escapes and UTF-8 split anywhere), the deltas are added up as a client does, and the sum
 * must be the finished output's parse (kvf_proxy_tools_parse_output) exactly: names, and
 * arguments as json.dumps writes them; a call's first delta (index, id, type, name, no
 * arguments) before its arguments, calls in index order, arguments in more than one delta,
 * the content never past the first marker. Malformed and cut-off calls: what was sent
 * stops where the JSON goes wrong and nothing completes it.
 */
#include "kvf_proxy_tools.h"
#include "kvf_proxy_tools_stream.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#define MAX_CALLS 4

typedef struct {
    int  headers;                  /* first deltas seen, in index order */
    char id[MAX_CALLS][64];
    char name[MAX_CALLS][64];
    char args[MAX_CALLS][1024];
    int  arg_deltas[MAX_CALLS];
} sum_t;

/* A client's sum of deltas @a list (checking their shapes). */
static void add_deltas(sum_t *s, const cJSON *list, bool last)
{
    const cJSON *d;

    cJSON_ArrayForEach(d, list) {
        const cJSON *f = cJSON_GetObjectItem(d, "function");
        const cJSON *id = cJSON_GetObjectItem(d, "id");
        const cJSON *name = cJSON_GetObjectItem(f, "name");
        const cJSON *args = cJSON_GetObjectItem(f, "arguments");
        int i = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(d, "index"));

        assert_true((i >= 0) && (i < MAX_CALLS));
        assert_non_null(f);
        if (id != NULL) {   /* a call's first delta: in index order, whole name */
            assert_int_equal(i, s->headers);
            assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(d, "type")),
                                "function");
            assert_true(cJSON_IsString(name) && (name->valuestring[0] != '\0'));
            snprintf(s->id[i], sizeof(s->id[i]), "%s", id->valuestring);
            snprintf(s->name[i], sizeof(s->name[i]), "%s", name->valuestring);
            s->headers++;
            if (!last) {
                assert_null(args);   /* vLLM's: the arguments follow */
            }
        } else {   /* an arguments piece: index and arguments only */
            assert_true(i < s->headers);
            assert_null(name);
            assert_null(cJSON_GetObjectItem(d, "type"));
            assert_true(cJSON_IsString(args) && (args->valuestring[0] != '\0'));
            s->arg_deltas[i]++;
        }
        if (args != NULL) {
            strncat(s->args[i], args->valuestring, sizeof(s->args[i]) - strlen(s->args[i]) - 1);
        }
    }
}

/* Streams @a text byte by byte; @return the parse's calls (or NULL) with @a s the sum. */
static cJSON *stream(kvf_proxy_tool_parser_t parser, bool parallel, const char *text,
                     sum_t *s)
{
    kvf_proxy_tool_stream_t ts = {0};
    size_t n = strlen(text), content_end = n;
    cJSON *calls = NULL, *rest = NULL;

    memset(s, 0, sizeof(*s));
    assert_int_equal(kvf_proxy_tools_parse_output(parser, parallel, text, n, &calls,
                                                  &content_end), KVF_OK);
    for (size_t len = 0; len <= n; ++len) {
        cJSON *d = NULL;
        int moved = 0;
        /* the content streamed stops before the first call's markup */
        if (calls != NULL) {
            assert_true(kvf_proxy_tools_ready(parser, text, len) <= content_end);
        }
        do {
            assert_int_equal(kvf_proxy_tools_stream_next(&ts, parser, parallel, text, len, &d),
                             KVF_OK);
            if (d != NULL) {
                assert_int_equal(cJSON_GetArraySize(d), 1);   /* one delta a chunk */
                add_deltas(s, d, false);
                cJSON_Delete(d);
                ++moved;
            }
        } while (d != NULL);
        assert_true(moved <= 2);   /* one byte: a name, or a piece of arguments, or both */
    }
    assert_int_equal(kvf_proxy_tools_stream_finish(&ts, calls, &rest), KVF_OK);
    add_deltas(s, rest, true);
    cJSON_Delete(rest);
    kvf_proxy_tools_stream_free(&ts);
    return calls;
}

/* The sum equals the parse, call by call. */
static void assert_sum_is_parse(const sum_t *s, const cJSON *calls)
{
    const cJSON *c;
    int i = 0;

    assert_non_null(calls);
    cJSON_ArrayForEach(c, calls) {
        const cJSON *f = cJSON_GetObjectItem(c, "function");
        assert_string_equal(s->name[i], cJSON_GetStringValue(cJSON_GetObjectItem(f, "name")));
        assert_string_equal(s->args[i],
                            cJSON_GetStringValue(cJSON_GetObjectItem(f, "arguments")));
        ++i;
    }
    assert_int_equal(s->headers, i);
}

static void test_stream_adds_up(void **state)
{
    static const struct {
        kvf_proxy_tool_parser_t parser;
        const char             *text;
        int                     calls;
    } cases[] = {
        {KVF_TOOL_PARSER_HERMES,
         "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
         "\"Z\\u00fcrich \xc3\xa9\", \"days\": 3, \"unit\": null, \"ok\": true, \"t\": -1.50e1,"
         " \"tags\": [\"a\", \"b\\\"c\\n\"], \"n\": {\"x\" :[1,2.5 , {}], \"e\": \"\\ud83d\\ude00"
         "\"}}}\n</tool_call>\n<tool_call>{\"name\":\"get_time\",\"arguments\":{\"tz\":\"CET\","
         "\"exact\":false}}</tool_call>", 2},
        {KVF_TOOL_PARSER_HERMES,
         "<tool_call>{\"arguments\": {\"q\": \"x y\"}, \"id\": [1, {\"k\": null}], \"name\": "
         "\"search\"}</tool_call>", 1},
        {KVF_TOOL_PARSER_HERMES, "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}}", 1},
        {KVF_TOOL_PARSER_LLAMA3_JSON,
         "<|python_tag|>{\"name\": \"a\", \"parameters\": {\"x\": 1e2, \"w\": \"\\t\"}}; "
         "{\"name\": \"b\", \"parameters\": {\"y\": [true, false]}}", 2},
        {KVF_TOOL_PARSER_MISTRAL,
         "Sure.[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {\"x\": [0.1, -0]}}, {\"name\": "
         "\"b\", \"arguments\": {}}]", 2},
        {KVF_TOOL_PARSER_MISTRAL, "[TOOL_CALLS]{\"name\": \"one\", \"arguments\": {\"s\": \"\"}}",
         1},
    };
    sum_t s;

    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); ++i) {
        cJSON *calls = stream(cases[i].parser, true, cases[i].text, &s);
        print_message("case %zu: %d calls, %d argument deltas in the first\n", i, s.headers,
                      s.arg_deltas[0]);
        assert_sum_is_parse(&s, calls);
        assert_int_equal(cJSON_GetArraySize(calls), cases[i].calls);
        if (i != 1) {   /* the arguments grew as they came (case 1: before the name) */
            assert_true(s.arg_deltas[0] > 1);
        }
        assert_string_not_equal(s.id[0], "");
        if (cases[i].calls > 1) {
            assert_string_not_equal(s.id[0], s.id[1]);
        }
        cJSON_Delete(calls);
    }
    /* parallel_tool_calls false: the first call only, streamed and parsed */
    {
        cJSON *calls = stream(KVF_TOOL_PARSER_HERMES, false, cases[0].text, &s);
        assert_sum_is_parse(&s, calls);
        assert_int_equal(s.headers, 1);
        cJSON_Delete(calls);
    }
}

static void test_stream_malformed(void **state)
{
    static const struct {
        const char *text;
        const char *sent_args;   /* what the stream sent before the JSON went wrong */
        const char *name;
    } cases[] = {
        /* invalid JSON: the stream stops at it; the parse finds no call */
        {"<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": tru}}</tool_call>", "{\"a\": ", "f"},
        {"<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1,}}</tool_call>", "{\"a\": 1, ",
         "f"},
        {"<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": \"\\x\"}}</tool_call>",
         "{\"a\": \"", "f"},
        /* cut off (max_tokens) inside the arguments */
        {"Hm.<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Os",
         "{\"city\": \"Os", "get_weather"},
        /* closed before its JSON is whole (the 1 was whole: '<' ended it) */
        {"<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": [1</tool_call>", "{\"a\": [1", "f"},
    };
    sum_t s;

    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); ++i) {
        cJSON *calls = stream(KVF_TOOL_PARSER_HERMES, true, cases[i].text, &s);
        assert_null(calls);   /* the non-streamed answer: all content */
        assert_int_equal(s.headers, 1);
        assert_string_equal(s.name[0], cases[i].name);
        assert_string_equal(s.args[0], cases[i].sent_args);
    }
    /* a name that is not whole never goes out */
    {
        cJSON *calls = stream(KVF_TOOL_PARSER_HERMES, true, "<tool_call>{\"name\": \"get_w", &s);
        assert_null(calls);
        assert_int_equal(s.headers, 0);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stream_adds_up),
        cmocka_unit_test(test_stream_malformed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
