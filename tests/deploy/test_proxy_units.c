/*
 * kvf-proxy pure parts: OpenAI request validation, metrics text (streamed
 * text is the tokenizer's, tested in test_tokenizer). Expected values are
 * written out by hand from the OpenAI rules, not taken from program output.
 */
#include "kvf_proxy_metrics.h"
#include "kvf_proxy_openai.h"
#include "kvf_proxy_memtrim.h"
#include "kvf_proxy_admit.h"
#include "kvf_proxy_tools.h"
#include "kvf_proxy_reasoning.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

static kvf_tokenizer_t test_tok = {260, 256, 257, NULL};

static kvf_proxy_openai_ctx_t test_ctx(void)
{
    kvf_proxy_openai_ctx_t c;

    memset(&c, 0, sizeof(c));
    c.tok = &test_tok;
    c.model_name = "tiny";
    c.add_bos = true;
    c.max_prompt_tokens = 64;
    c.max_tokens_limit = 100;
    c.default_max_tokens = 16;
    c.tok_ready = true;
    return c;
}

static const char *last_param;   /* the field parse() last blamed (NULL: none) */

static int parse_len(const char *body, size_t len, kvf_proxy_completion_req_t *req, char *err)
{
    kvf_proxy_openai_ctx_t ctx = test_ctx();
    int http = 0;

    memset(req, 0, sizeof(*req));
    last_param = "unset";
    if (kvf_proxy_openai_parse(&ctx, body, len, req, &http, &last_param, err, 256) == KVF_OK) {
        return 200;
    }
    return http;
}

static int parse(const char *body, kvf_proxy_completion_req_t *req, char *err)
{
    return parse_len(body, strlen(body), req, err);
}

static void test_parse_ok(void **state)
{
    kvf_proxy_completion_req_t req;
    char err[256];

    (void)state;
    assert_int_equal(parse("{\"prompt\": \"hi\"}", &req, err), 200);
    assert_int_equal(req.num_prompt, 3);           /* BOS + 'h' + 'i' */
    assert_int_equal(req.prompt_ids[0], 256);
    assert_int_equal(req.prompt_ids[1], 'h');
    assert_int_equal(req.prompt_ids[2], 'i');
    assert_int_equal(req.max_tokens, 16);          /* the default */
    assert_true(req.temperature == 1.0f);
    assert_false(req.stream);
    assert_false(req.has_seed);
    kvf_proxy_openai_req_cleanup(&req);

    assert_int_equal(parse("{\"model\": \"tiny\", \"prompt\": [1, 2, 259], \"max_tokens\": 100,"
                           " \"temperature\": 0, \"seed\": 7, \"stream\": true,"
                           " \"ignore_eos\": true, \"n\": 1, \"stop\": null, \"user\": \"x\"}",
                           &req, err), 200);
    assert_int_equal(req.num_prompt, 3);           /* ids are taken as they are */
    assert_int_equal(req.prompt_ids[2], 259);
    assert_int_equal(req.max_tokens, 100);
    assert_true(req.temperature == 0.0f);
    assert_true(req.has_seed);
    assert_int_equal(req.seed, 7);
    assert_true(req.stream);
    assert_true(req.ignore_eos);
    kvf_proxy_openai_req_cleanup(&req);

    /* vLLM's fields, each read with its value */
    assert_int_equal(parse("{\"prompt\": [\"hi\", [5, 6]], \"n\": 3, \"top_p\": 0.5,"
                           " \"top_k\": 7, \"min_p\": 0.25, \"presence_penalty\": -1.5,"
                           " \"frequency_penalty\": 2, \"repetition_penalty\": 1.25,"
                           " \"min_tokens\": 4, \"stop\": [\"ab\", \"c\"],"
                           " \"stop_token_ids\": [9, 10], \"logprobs\": 3, \"seed\": -1,"
                           " \"include_stop_str_in_output\": true, \"stream\": true,"
                           " \"stream_options\": {\"include_usage\": true,"
                           " \"continuous_usage_stats\": true}, \"best_of\": 3,"
                           " \"skip_special_tokens\": true, \"logit_bias\": {},"
                           " \"request_id\": \"r1\", \"add_special_tokens\": false}",
                           &req, err), 200);
    assert_int_equal(req.num_bias + req.num_allowed + req.num_bad_words, 0);
    assert_int_equal(req.num_prompts, 2);
    assert_int_equal(req.prompt_lens[0], 2);        /* add_special_tokens false: no BOS */
    assert_int_equal(req.prompts[0][0], 'h');
    assert_int_equal(req.prompt_lens[1], 2);
    assert_int_equal(req.prompts[1][1], 6);
    assert_int_equal(req.n, 3);
    assert_true(req.top_p == 0.5f);
    assert_int_equal(req.top_k, 7);
    assert_true(req.min_p == 0.25f);
    assert_true(req.presence_penalty == -1.5f);
    assert_true(req.frequency_penalty == 2.0f);
    assert_true(req.repetition_penalty == 1.25f);
    assert_int_equal(req.min_tokens, 4);
    assert_int_equal(req.num_stop, 2);
    assert_string_equal(req.stop[0], "ab");
    assert_int_equal(req.num_stop_ids, 2);
    assert_int_equal(req.stop_token_ids[1], 10);
    assert_true(req.want_logprobs);
    assert_int_equal(req.logprobs, 3);
    assert_int_equal(req.seed, UINT64_MAX);         /* -1 as 64 bits */
    assert_true(req.include_stop_str_in_output);
    assert_true(req.include_usage);
    assert_true(req.continuous_usage);
    assert_string_equal(req.response_id, "cmpl-r1");
    kvf_proxy_openai_req_cleanup(&req);
    /* logit_bias (clamped; a repeated key keeps its last value), allowed_token_ids,
     * bad_words (as written; with a leading space only when as many tokens) */
    assert_int_equal(parse("{\"prompt\": \"hi\", \"logit_bias\": {\"5\": 150, \"7\": -1.5,"
                           " \"5\": -300}, \"allowed_token_ids\": [3, 4],"
                           " \"bad_words\": [\" ab\", \"c\"]}", &req, err), 200);
    assert_int_equal(req.num_bias, 2);
    assert_int_equal(req.bias_ids[0], 5);
    assert_true(req.bias_values[0] == -100.0f);
    assert_int_equal(req.bias_ids[1], 7);
    assert_true(req.bias_values[1] == -1.5f);
    assert_int_equal(req.num_allowed, 2);
    assert_int_equal(req.allowed_ids[1], 4);
    assert_int_equal(req.num_bad_words, 2);          /* "ab"; "c"; " ab", " c": longer */
    assert_int_equal(req.num_bad_tokens, 3);
    assert_int_equal(req.bad_ends[0], 2);
    assert_int_equal(req.bad_tokens[0], 'a');
    assert_int_equal(req.bad_tokens[2], 'c');
    kvf_proxy_openai_req_cleanup(&req);

    /* truncate_prompt_tokens keeps the last k */
    assert_int_equal(parse("{\"prompt\": [1, 2, 3, 4, 5], \"truncate_prompt_tokens\": 2}",
                           &req, err), 200);
    assert_int_equal(req.num_prompt, 2);
    assert_int_equal(req.prompt_ids[0], 4);
    kvf_proxy_openai_req_cleanup(&req);
}

/* NUL characters raw or escaped, other escapes, the 64-token prompt limit and invalid UTF-8. */
static void parse_escapes_and_sizes(void)
{
    kvf_proxy_completion_req_t req;
    char err[256], big[200];

    /* A raw NUL byte in the body is refused too, not cut short. */
    {
        static const char raw[] = "{\"prompt\": \"a\0b\"}";
        assert_int_equal(parse_len(raw, sizeof(raw) - 1, &req, err), 400);
    }
    assert_non_null(strstr(err, "NUL character"));
    /* An escaped backslash before "u0000" is the text \u0000, not a NUL. */
    assert_int_equal(parse("{\"prompt\": \"\\\\u0000\"}", &req, err), 200);
    assert_int_equal(req.num_prompt, 7);            /* BOS + the 6 bytes \u0000 */
    assert_int_equal(req.prompt_ids[1], '\\');
    assert_int_equal(req.prompt_ids[2], 'u');
    kvf_proxy_openai_req_cleanup(&req);
    /* Other escapes still decode: \u0041 is 'A'. */
    assert_int_equal(parse("{\"prompt\": \"\\u0041\"}", &req, err), 200);
    assert_int_equal(req.num_prompt, 2);
    assert_int_equal(req.prompt_ids[1], 'A');
    kvf_proxy_openai_req_cleanup(&req);
    /* 64 tokens max: BOS + 63 bytes fits, BOS + 64 does not. */
    snprintf(big, sizeof(big), "{\"prompt\": \"%063d\"}", 0);
    assert_int_equal(parse(big, &req, err), 200);
    assert_int_equal(req.num_prompt, 64);
    kvf_proxy_openai_req_cleanup(&req);
    snprintf(big, sizeof(big), "{\"prompt\": \"%064d\"}", 0);
    assert_int_equal(parse(big, &req, err), 400);
    /* invalid UTF-8 is not refused (a BPE tokenizer reads it as U+FFFD, three bytes:
     * tests/common/tokenizer/test_tokenizer.c; the byte tokenizer here keeps the byte) */
    assert_int_equal(parse("{\"prompt\": \"a\xff" "b\"}", &req, err), 200);
    assert_int_equal(req.num_prompt, 4);
    assert_int_equal(req.prompt_ids[2], 0xFF);
    kvf_proxy_openai_req_cleanup(&req);
}

static void test_parse_bad(void **state)
{
    static const struct {
        const char *body;
        int         http;
        const char *needle;
        const char *param;   /* the field the error names (NULL: none) */
    } cases[] = {
        {"{\"prompt\": \"hi\"", 400, "not valid JSON", NULL},
        {"[1, 2]", 400, "JSON object", NULL},
        {"{}", 400, "'prompt' is required", "prompt"},
        {"{\"prompt\": 5}", 400, "'prompt' must be", "prompt"},
        {"{\"prompt\": [\"a\", 5]}", 400, "'prompt'[1] must be a string", "prompt"},
        {"{\"prompt\": [[1], []]}", 400, "'prompt' is empty", "prompt"},
        {"{\"prompt\": [1, 260]}", 400, "'prompt'[1]", "prompt"},
        {"{\"prompt\": [1, -1]}", 400, "'prompt'[1]", "prompt"},
        {"{\"prompt\": []}", 400, "empty", "prompt"},
        {"{\"prompt\": \"hi\", \"max_tokens\": -1}", 400, "'max_tokens' = -1", "max_tokens"},
        {"{\"prompt\": \"hi\", \"max_tokens\": 0}", 400, "'max_tokens' = 0", "max_tokens"},
        {"{\"prompt\": \"hi\", \"max_tokens\": 101}", 400, "'max_tokens' = 101", "max_tokens"},
        {"{\"prompt\": \"hi\", \"max_tokens\": 1.5}", 400, "must be an integer", "max_tokens"},
        {"{\"prompt\": \"hi\", \"max_tokens\": \"8\"}", 400, "must be an integer", "max_tokens"},
        {"{\"prompt\": \"hi\", \"temperature\": -0.5}", 400, "'temperature' = -0.5",
         "temperature"},
        {"{\"prompt\": \"hi\", \"temperature\": \"hot\"}", 400, "'temperature' must be a number",
         "temperature"},
        {"{\"prompt\": \"hi\", \"seed\": 1.5}", 400, "'seed' must be an integer", "seed"},
        {"{\"prompt\": \"hi\", \"stream\": \"yes\"}", 400, "'stream' must be a boolean", "stream"},
        {"{\"prompt\": \"hi\", \"n\": 0}", 400, "'n' = 0 must be in [1, 16]", "n"},
        {"{\"prompt\": \"hi\", \"n\": 17}", 400, "'n' = 17", "n"},
        {"{\"prompt\": [\"a\", \"b\", \"c\"], \"n\": 6}", 400, "18 choices", "n"},
        {"{\"prompt\": \"hi\", \"stop\": 3}", 400, "'stop' must be", "stop"},
        {"{\"prompt\": \"hi\", \"stop\": [\"\"]}", 400, "'stop'[0]", "stop"},
        {"{\"prompt\": \"hi\", \"top_p\": 0}", 400, "'top_p' = 0 must be in (0, 1]", "top_p"},
        {"{\"prompt\": \"hi\", \"top_p\": 1.5}", 400, "'top_p' = 1.5", "top_p"},
        {"{\"prompt\": \"hi\", \"top_k\": -2}", 400, "'top_k' = -2", "top_k"},
        {"{\"prompt\": \"hi\", \"top_k\": 1.5}", 400, "'top_k' must be an integer", "top_k"},
        {"{\"prompt\": \"hi\", \"min_p\": 1.1}", 400, "'min_p' = 1.1", "min_p"},
        {"{\"prompt\": \"hi\", \"presence_penalty\": 2.5}", 400, "'presence_penalty'",
         "presence_penalty"},
        {"{\"prompt\": \"hi\", \"frequency_penalty\": -3}", 400, "'frequency_penalty'",
         "frequency_penalty"},
        {"{\"prompt\": \"hi\", \"repetition_penalty\": 0}", 400, "must be > 0",
         "repetition_penalty"},
        {"{\"prompt\": \"hi\", \"min_tokens\": 17}", 400, "'min_tokens' = 17", "min_tokens"},
        {"{\"prompt\": \"hi\", \"logprobs\": 21}", 400, "'logprobs' = 21", "logprobs"},
        {"{\"prompt\": \"hi\", \"logprobs\": 1, \"echo\": true}", 400, "ask 'prompt_logprobs'",
         "echo"},
        {"{\"prompt\": \"hi\", \"stop_token_ids\": [260]}", 400, "'stop_token_ids'[0]",
         "stop_token_ids"},
        {"{\"prompt\": \"hi\", \"stream_options\": {\"include_usage\": true}}", 400,
         "needs 'stream': true", "stream_options"},
        {"{\"prompt\": \"hi\", \"stream\": true, \"stream_options\": {\"x\": true}}", 400,
         "unknown key 'x'", "stream_options"},
        {"{\"prompt\": \"hi\", \"priority\": -1}", 400, "--scheduling-policy priority",
         "priority"},
        {"{\"prompt\": \"hi\", \"n\": 2, \"best_of\": 1}", 400, "from 'n' (2)", "best_of"},
        {"{\"prompt\": \"hi\", \"best_of\": 2, \"stream\": true}", 400, "cannot be streamed",
         "best_of"},
        {"{\"prompt\": \"hi\", \"prompt_logprobs\": 1, \"stream\": true}", 400,
         "not supported with 'stream'", "prompt_logprobs"},
        {"{\"prompt\": \"hi\", \"prompt_logprobs\": -1}", 400, "in [0, 20]",
         "prompt_logprobs"},
        {"{\"prompt\": [\"a\", \"b\"], \"best_of\": 9}", 400, "'best_of' = 9 is 18 choices",
         "best_of"},
        {"{\"prompt\": \"hi\", \"suffix\": \"x\"}", 400, "'suffix' is not supported",
         "suffix"},
        {"{\"prompt\": \"hi\", \"logit_bias\": {\"300\": 1}}", 400,
         "'logit_bias' key '300' must be a token id", "logit_bias"},
        {"{\"prompt\": \"hi\", \"logit_bias\": {\"5\": true}}", 400, "must be a number",
         "logit_bias"},
        {"{\"prompt\": \"hi\", \"logit_bias\": {\"5.0\": 1}}", 400, "key '5.0'", "logit_bias"},
        {"{\"prompt\": \"hi\", \"allowed_token_ids\": []}", 400, "non-empty",
         "allowed_token_ids"},
        {"{\"prompt\": \"hi\", \"allowed_token_ids\": [3, 260]}", 400,
         "'allowed_token_ids'[1]", "allowed_token_ids"},
        {"{\"prompt\": \"hi\", \"bad_words\": [\"ok\", 3]}", 400, "must be strings",
         "bad_words"},
        {"{\"prompt\": \"hi\", \"bad_words\": [\" \"]}", 400, "non-empty", "bad_words"},
        {"{\"prompt\": \"hi\", \"response_format\": {\"type\": \"json_object\"}}", 400,
         "'response_format'", "response_format"},
        {"{\"prompt\": \"hi\", \"use_beam_search\": true}", 400, "beam", "use_beam_search"},
        {"{\"prompt\": \"hi\", \"messages\": []}", 400, "unknown field 'messages'",
         "messages"},
        {"{\"prompt\": \"hi\", \"temprature\": 1}", 400, "unknown field 'temprature'",
         "temprature"},
        {"{\"prompt\": \"hi\", \"truncate_prompt_tokens\": 0}", 400, "-1 or at least 1",
         "truncate_prompt_tokens"},
        {"{\"prompt\": \"hi\", \"model\": \"gpt-4\"}", 404, "'gpt-4' does not exist", "model"},
        {"{\"prompt\": \"hi\", \"model\": 3}", 400, "'model' must be a string", "model"},
        /* A NUL inside a string would cut it short in cJSON ("a" instead of
         * "a\0bcd"): refused whatever the hex case or the field. */
        {"{\"prompt\": \"a\\u0000bcd\"}", 400, "NUL character", NULL},
        {"{\"prompt\": \"a\\u0000\"}", 400, "NUL character", NULL},
        {"{\"prompt\": \"\\U0000\"}", 400, "NUL character", NULL},
        {"{\"prompt\": \"hi\", \"user\": \"x\\u0000y\"}", 400, "NUL character", NULL},
        {"{\"prompt\": \"x\\\\\\u0000\"}", 400, "NUL character", NULL},  /* \\ then \u0000 */
    };
    kvf_proxy_completion_req_t req;
    char err[256];

    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); ++i) {
        err[0] = '\0';
        if (parse(cases[i].body, &req, err) != cases[i].http) {
            fail_msg("case %zu (%s): %s", i, cases[i].body, err);
        }
        if (strstr(err, cases[i].needle) == NULL) {
            fail_msg("case %zu: '%s' does not contain '%s'", i, err, cases[i].needle);
        }
        if (cases[i].param == NULL) {
            assert_null(last_param);
        } else if ((last_param == NULL) || (strcmp(last_param, cases[i].param) != 0)) {
            fail_msg("case %zu: param '%s', want '%s'", i, last_param ? last_param : "(null)",
                     cases[i].param);
        }
        assert_null(req.prompt_ids);
    }
    parse_escapes_and_sizes();
}

/* Limits of the model and trailing bytes: refused at once, naming the limit. */
static void test_parse_limits(void **state)
{
    kvf_proxy_openai_ctx_t ctx = test_ctx();
    kvf_proxy_completion_req_t req;
    const char *param = NULL;
    char err[256];
    int http = 0;
    const char *body;

    (void)state;
    ctx.max_model_len = 8;
    body = "{\"prompt\": \"abcdefghij\"}";   /* BOS + 10 bytes = 11 tokens */
    assert_int_not_equal(kvf_proxy_openai_parse(&ctx, body, strlen(body), &req, &http, &param,
                                                err, sizeof(err)), KVF_OK);
    assert_int_equal(http, 400);
    assert_string_equal(param, "prompt");
    assert_non_null(strstr(err, "max_position_embeddings (8)"));
    body = "{\"prompt\": \"abc\", \"max_tokens\": 5}";   /* 4 + 5 > 8 */
    assert_int_not_equal(kvf_proxy_openai_parse(&ctx, body, strlen(body), &req, &http, &param,
                                                err, sizeof(err)), KVF_OK);
    assert_string_equal(param, "max_tokens");
    assert_non_null(strstr(err, "plus 'max_tokens' (5)"));
    body = "{\"prompt\": \"abc\", \"max_tokens\": 4}";   /* exactly 8 */
    assert_int_equal(kvf_proxy_openai_parse(&ctx, body, strlen(body), &req, &http, &param,
                                            err, sizeof(err)), KVF_OK);
    kvf_proxy_openai_req_cleanup(&req);
    /* trailing bytes after the object */
    body = "{\"prompt\": \"abc\"} {}";
    assert_int_not_equal(kvf_proxy_openai_parse(&ctx, body, strlen(body), &req, &http, &param,
                                                err, sizeof(err)), KVF_OK);
    assert_int_equal(http, 400);
    assert_non_null(strstr(err, "2 bytes after its JSON value (at byte 18)"));
    body = "{\"prompt\": \"abc\", \"max_tokens\": 2}\r\n \t";
    assert_int_equal(kvf_proxy_openai_parse(&ctx, body, strlen(body), &req, &http, &param,
                                            err, sizeof(err)), KVF_OK);
    kvf_proxy_openai_req_cleanup(&req);
}

/* Chat: messages checked and rendered with the template; none: refused by name. */
static void test_parse_chat(void **state)
{
    kvf_proxy_openai_ctx_t ctx = test_ctx();
    kvf_proxy_completion_req_t req;
    const char *param = NULL;
    char err[256];
    int http = 0;
    const char *body = "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}],"
                       " \"max_completion_tokens\": 5, \"logprobs\": true, \"top_logprobs\": 2}";

    (void)state;
    memset(&req, 0, sizeof(req));
    assert_int_not_equal(kvf_proxy_openai_parse_chat(&ctx, body, strlen(body), &req, &http,
                                                     &param, err, sizeof(err)), KVF_OK);
    assert_int_equal(http, 400);
    assert_string_equal(param, "messages");
    assert_non_null(strstr(err, "no chat template"));
    ctx.chat_template = "{% for m in messages %}{{ m.role[0] }}{{ m.content }}{% endfor %}"
                        "{% if add_generation_prompt %}>{% endif %}";
    assert_int_equal(kvf_proxy_openai_parse_chat(&ctx, body, strlen(body), &req, &http, &param,
                                                 err, sizeof(err)), KVF_OK);
    assert_int_equal(req.num_prompt, 4);   /* "uhi>": no BOS (the template writes it) */
    assert_int_equal(req.prompt_ids[0], 'u');
    assert_int_equal(req.prompt_ids[3], '>');
    assert_int_equal(req.max_tokens, 5);
    assert_true(req.chat && req.want_logprobs);
    assert_int_equal(req.logprobs, 2);
    kvf_proxy_openai_req_cleanup(&req);
    {
        static const struct {
            const char *body, *needle, *param;
        } bad[] = {
            {"{\"messages\": []}", "non-empty list", "messages"},
            {"{\"messages\": [{\"role\": \"bot\", \"content\": \"x\"}]}", "'bot'", "messages"},
            {"{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\"}]}]}",
             "type 'image_url' is not supported", "messages"},
            {"{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\":"
             " \"x\"}, {\"type\": \"video_url\", \"video_url\": {\"url\": \"u\"}}]}]}",
             "type 'video_url' is not supported", "messages"},
            {"{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\"}]}]}",
             "only parts", "messages"},
            {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\", \"tool_calls\": []}]}",
             "tool_calls", "messages"},
            {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"prompt\": \"y\"}",
             "unknown field 'prompt'", "prompt"},
            {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"top_logprobs\": 2}",
             "needs 'logprobs'", "top_logprobs"},
            {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}],"
             " \"continue_final_message\": true}", "cannot both", "continue_final_message"},
            {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}],"
             " \"continue_final_message\": 1}", "must be a boolean", "continue_final_message"},
            {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}],"
             " \"include_reasoning\": 1}", "must be a boolean", "include_reasoning"},
            {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}],"
             " \"tool_choice\": \"auto\"}", "needs 'tools'", "tool_choice"},
            {"{\"messages\": [{\"role\": \"tool\", \"content\": \"x\","
             " \"tool_call_id\": 3}]}", "tool_call_id", "messages"},
            {"{\"messages\": [{\"role\": \"assistant\", \"content\": null, \"tool_calls\":"
             " [{\"id\": \"a\", \"function\": {\"name\": \"f\", \"arguments\": \"{\"}}]}]}",
             "tool_calls[0]", "messages"},
            {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}],"
             " \"documents\": [{\"title\": 3}]}", "values are strings", "documents"},
            {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}],"
             " \"chat_template_kwargs\": [1]}", "must be an object", "chat_template_kwargs"},
            {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}],"
             " \"chat_template_kwargs\": {\"messages\": []}}", "cannot set 'messages'",
             "chat_template_kwargs"},
        };
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); ++i) {
            memset(&req, 0, sizeof(req));
            assert_int_not_equal(kvf_proxy_openai_parse_chat(&ctx, bad[i].body,
                                                             strlen(bad[i].body), &req, &http,
                                                             &param, err, sizeof(err)), KVF_OK);
            if ((strstr(err, bad[i].needle) == NULL) || (param == NULL) ||
                (strcmp(param, bad[i].param) != 0)) {
                fail_msg("chat case %zu: '%s' (param %s)", i, err, param ? param : "null");
            }
        }
    }
}

/* Template arguments: chat_template_kwargs (overriding), documents,
 * continue_final_message (the rendering cut after the last message). */
static void test_chat_args(void **state)
{
    kvf_proxy_openai_ctx_t ctx = test_ctx();
    kvf_proxy_completion_req_t req;
    const char *param = NULL;
    char err[256];
    int http = 0;
    static const struct {
        const char *body, *want;
    } cases[] = {
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}],"
         " \"chat_template_kwargs\": {\"enable_thinking\": false}}", "uhi.>/nt"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}],"
         " \"chat_template_kwargs\": {\"add_generation_prompt\": false}}", "uhi."},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}],"
         " \"documents\": [{\"title\": \"T\", \"text\": \"D\"}]}", "[T:D]uhi.>"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"},"
         " {\"role\": \"assistant\", \"content\": \"The \"}], \"add_generation_prompt\": false,"
         " \"continue_final_message\": true}", "uhi.aThe "},   /* the "." after it cut */
    };

    (void)state;
    /* documents is None without the field (as transformers passes it), so it is guarded as
     * real templates guard it */
    ctx.chat_template = "{% if documents %}{% for d in documents %}[{{ d.title }}:"
                        "{{ d.text }}]{% endfor %}{% endif %}"
                        "{% for m in messages %}{{ m.role[0] }}{{ m.content }}.{% endfor %}"
                        "{% if add_generation_prompt %}>{% endif %}"
                        "{% if enable_thinking is defined and not enable_thinking %}/nt"
                        "{% endif %}";
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); ++i) {
        char got[64];
        memset(&req, 0, sizeof(req));
        if (kvf_proxy_openai_parse_chat(&ctx, cases[i].body, strlen(cases[i].body), &req, &http,
                                        &param, err, sizeof(err)) != KVF_OK) {
            fail_msg("args case %zu: %s", i, err);
        }
        for (int k = 0; k < req.num_prompt; ++k) {
            got[k] = (char)req.prompt_ids[k];
        }
        got[req.num_prompt] = '\0';
        if (strcmp(got, cases[i].want) != 0) {
            fail_msg("args case %zu: rendered '%s', want '%s'", i, got, cases[i].want);
        }
        kvf_proxy_openai_req_cleanup(&req);
    }
}

/* The tool-call parsers on fixed outputs: calls, content, malformed text as content. */
static void test_tool_parsers(void **state)
{
    static const struct {
        kvf_proxy_tool_parser_t parser;
        const char *text, *want;   /* want: "content|name(args);name(args)", NULL: none */
    } cases[] = {
        {KVF_TOOL_PARSER_HERMES, "Hi<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}}"
         "</tool_call>", "Hi|f({\"a\": 1})"},
        {KVF_TOOL_PARSER_HERMES, "<tool_call>{\"name\":\"f\",\"arguments\":{}}</tool_call>"
         "<tool_call>{\"name\":\"g\",\"arguments\":{\"t\":true,\"x\":[1.5,null]}}"
         "</tool_call>", "|f({});g({\"t\": true, \"x\": [1.5, null]})"},
        {KVF_TOOL_PARSER_HERMES, "<tool_call>{\"name\": \"f\", \"arguments\": {}}", "|f({})"},
        {KVF_TOOL_PARSER_HERMES, "<tool_call>", NULL},
        {KVF_TOOL_PARSER_HERMES, "<tool_call>{\"name\": 3}</tool_call>", NULL},
        {KVF_TOOL_PARSER_HERMES, "no call", NULL},
        {KVF_TOOL_PARSER_LLAMA3_JSON, " {\"name\": \"f\", \"parameters\": {\"b\": \"\u00e9\"}};"
         "{\"name\": \"g\", \"arguments\": {}}", "|f({\"b\": \"\xc3\xa9\"});g({})"},
        {KVF_TOOL_PARSER_LLAMA3_JSON, "<|python_tag|>{\"name\": \"f\", \"parameters\": {}}",
         "|f({})"},
        {KVF_TOOL_PARSER_LLAMA3_JSON, "Sure: {\"name\": \"f\"}", NULL},
        {KVF_TOOL_PARSER_MISTRAL, "ok[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"n\": -2}}]",
         "ok|f({\"n\": -2})"},
        {KVF_TOOL_PARSER_MISTRAL, "[TOOL_CALLS] nope", NULL},
    };

    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); ++i) {
        cJSON *calls = NULL, *c;
        size_t end = 12345;
        char got[512];
        int n;
        assert_int_equal(kvf_proxy_tools_parse_output(cases[i].parser, true, cases[i].text,
                                                      strlen(cases[i].text), &calls, &end),
                         KVF_OK);
        if (cases[i].want == NULL) {
            if (calls != NULL) {
                fail_msg("tool case %zu: calls from malformed text", i);
            }
            continue;
        }
        if (calls == NULL) {
            fail_msg("tool case %zu: no calls", i);
        }
        n = snprintf(got, sizeof(got), "%.*s|", (int)end, cases[i].text);
        cJSON_ArrayForEach(c, calls) {
            const cJSON *f = cJSON_GetObjectItem(c, "function");
            n += snprintf(got + n, sizeof(got) - (size_t)n, "%s%s(%s)", (c == calls->child) ? "" : ";",
                          cJSON_GetObjectItem(f, "name")->valuestring,
                          cJSON_GetObjectItem(f, "arguments")->valuestring);
        }
        if (strcmp(got, cases[i].want) != 0) {
            fail_msg("tool case %zu: got '%s', want '%s'", i, got, cases[i].want);
        }
        cJSON_Delete(calls);
    }
}

/* The reasoning split, finished and streaming (held tails), for both parsers. */
static void test_reasoning_split(void **state)
{
    static const struct {
        kvf_proxy_reasoning_t parser;
        const char *text;
        bool final;
        const char *reasoning, *content;   /* content NULL: none yet */
        size_t hold;
    } cases[] = {
        {KVF_REASONING_QWEN3, "<think>a b</think>ans", true, "a b", "ans", 21},
        {KVF_REASONING_QWEN3, "<think>a b", true, "", "<think>a b", 10},   /* unclosed */
        {KVF_REASONING_QWEN3, "<think>a b", false, "a b", NULL, 10},
        {KVF_REASONING_QWEN3, "<think>a</th", false, "a", NULL, 8},        /* tail held */
        {KVF_REASONING_QWEN3, "<thi", false, "", "<thi", 0},   /* may open: all held */
        {KVF_REASONING_QWEN3, "plain", true, "", "plain", 5},
        {KVF_REASONING_DEEPSEEK_R1, "a b</think>ans", true, "a b", "ans", 14},
        {KVF_REASONING_DEEPSEEK_R1, "<think>a</think>", true, "a", "", 16},
        {KVF_REASONING_DEEPSEEK_R1, "all thought", true, "all thought", NULL, 11},
        {KVF_REASONING_NONE, "<think>x</think>y", true, "", "<think>x</think>y", 17},
    };

    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); ++i) {
        kvf_proxy_reasoning_span_t sp;
        size_t len = strlen(cases[i].text);
        kvf_proxy_reasoning_split(cases[i].parser, cases[i].text, len, cases[i].final, &sp);
        if ((sp.r_end - sp.r_start != strlen(cases[i].reasoning)) ||
            (strncmp(cases[i].text + sp.r_start, cases[i].reasoning,
                     sp.r_end - sp.r_start) != 0) || (sp.hold != cases[i].hold) ||
            ((cases[i].content == NULL) ? (sp.c_start != len) :
             (strcmp(cases[i].text + sp.c_start, cases[i].content) != 0))) {
            fail_msg("reasoning case %zu: reasoning [%zu, %zu), content from %zu, hold %zu", i,
                     sp.r_start, sp.r_end, sp.c_start, sp.hold);
        }
    }
}

static void test_error_json(void **state)
{
    char *j;

    (void)state;
    /* vLLM's flat shape (integer code, class-name type) and OpenAI's nested error. */
    j = kvf_proxy_openai_error_json("'max_tokens' = 0 must be in [1, 100]",
                                    "invalid_request_error", "max_tokens", 400);
    assert_string_equal(j, "{\"object\":\"error\",\"message\":\"'max_tokens' = 0 must be in"
                           " [1, 100]\",\"type\":\"BadRequestError\",\"param\":\"max_tokens\","
                           "\"code\":400,\"error\":{\"message\":\"'max_tokens' = 0 must be in"
                           " [1, 100]\",\"type\":\"invalid_request_error\","
                           "\"param\":\"max_tokens\",\"code\":400}}");
    free(j);
    j = kvf_proxy_openai_error_json("no healthy decode instance", "server_error", NULL, 503);
    assert_string_equal(j, "{\"object\":\"error\",\"message\":\"no healthy decode instance\","
                           "\"type\":\"ServiceUnavailableError\",\"param\":null,\"code\":503,"
                           "\"error\":{\"message\":\"no healthy decode instance\","
                           "\"type\":\"server_error\",\"param\":null,\"code\":503}}");
    free(j);
}

static void test_metrics_text(void **state)
{
    kvf_proxy_metrics_h m;
    char *buf = NULL;
    size_t len = 0;
    FILE *f;

    (void)state;
    assert_int_equal(kvf_proxy_metrics_create(&m), KVF_OK);
    kvf_proxy_metrics_request(m, 200);
    kvf_proxy_metrics_request(m, 200);
    kvf_proxy_metrics_request(m, 503);
    kvf_proxy_metrics_add(m, KVF_PROXY_CTR_KV_BYTES, 4096);
    kvf_proxy_metrics_add(m, KVF_PROXY_CTR_KV_BYTES, 1024);
    /* TTFT bounds ... 0.05, 0.1, 0.25 ...: 0.07 lands in le=0.1, 0.3 in le=0.5. */
    kvf_proxy_metrics_observe(m, KVF_PROXY_HIST_TTFT, 0.07, 1);
    kvf_proxy_metrics_observe(m, KVF_PROXY_HIST_TTFT, 0.3, 2);
    f = open_memstream(&buf, &len);
    kvf_proxy_metrics_render(m, f);
    fclose(f);
    assert_non_null(strstr(buf, "kvf_proxy_requests_total{code=\"200\"} 2\n"));
    assert_non_null(strstr(buf, "kvf_proxy_requests_total{code=\"503\"} 1\n"));
    assert_non_null(strstr(buf, "kvf_proxy_kv_transfer_bytes_total 5120\n"));
    assert_non_null(strstr(buf, "# TYPE kvf_proxy_time_to_first_token_seconds histogram\n"));
    assert_non_null(strstr(buf, "kvf_proxy_time_to_first_token_seconds_bucket{le=\"0.05\"} 0\n"));
    assert_non_null(strstr(buf, "kvf_proxy_time_to_first_token_seconds_bucket{le=\"0.1\"} 1\n"));
    assert_non_null(strstr(buf, "kvf_proxy_time_to_first_token_seconds_bucket{le=\"0.25\"} 1\n"));
    assert_non_null(strstr(buf, "kvf_proxy_time_to_first_token_seconds_bucket{le=\"0.5\"} 3\n"));
    assert_non_null(strstr(buf, "kvf_proxy_time_to_first_token_seconds_bucket{le=\"+Inf\"} 3\n"));
    {
        /* the sum as the text format writes a double: every digit that reads it back */
        const char *sum = strstr(buf, "kvf_proxy_time_to_first_token_seconds_sum ");
        assert_non_null(sum);
        assert_true(fabs(strtod(strchr(sum, ' ') + 1, NULL) - 0.67) < 1e-12);
    }
    assert_non_null(strstr(buf, "kvf_proxy_time_to_first_token_seconds_count 3\n"));
    free(buf);
    kvf_proxy_metrics_destroy(m);
}

/* The heap is trimmed once a peak of >= 64 connections fell to a quarter, at most once a
 * second, and a steady load never trims. */
static int woken[8];

static void admit_notify(void *arg)
{
    woken[(int)(intptr_t)arg]++;
}

/* "priority" with --scheduling-policy priority; the queue serves lower priorities first,
 * arrival order within one, and wakes an entry put ahead of the head. */
static void test_priority(void **state)
{
    kvf_proxy_openai_ctx_t ctx = test_ctx();
    kvf_proxy_completion_req_t req;
    kvf_proxy_admit_entry_t e[6];
    static const int64_t prio[6] = {0, 5, 1, 5, -1, 1};
    static const int order[6] = {4, 0, 2, 5, 1, 3};
    kvf_proxy_admit_h q;
    int http = 0;
    char err[256];

    (void)state;
    ctx.priority_scheduling = true;
    memset(&req, 0, sizeof(req));
    const char *ok_body = "{\"prompt\": \"hi\", \"priority\": -3}";
    const char *bad_body = "{\"prompt\": \"hi\", \"priority\": 1.5}";

    assert_int_equal(kvf_proxy_openai_parse(&ctx, ok_body, strlen(ok_body), &req, &http, NULL,
                                            err, sizeof(err)), KVF_OK);
    assert_true(req.priority == -3);
    kvf_proxy_openai_req_cleanup(&req);
    memset(&req, 0, sizeof(req));
    assert_int_equal(kvf_proxy_openai_parse(&ctx, bad_body, strlen(bad_body), &req, &http,
                                            NULL, err, sizeof(err)), KVF_ERR_INVALID_PARAM);
    assert_non_null(strstr(err, "'priority' must be an integer"));
    kvf_proxy_openai_req_cleanup(&req);

    memset(e, 0, sizeof(e));
    memset(woken, 0, sizeof(woken));
    assert_int_equal(kvf_proxy_admit_create(1 << 20, &q), KVF_OK);
    for (int i = 0; i < 6; ++i) {
        assert_true(kvf_proxy_admit_enqueue(q, &e[i], 10, prio[i], admit_notify,
                                            (void *)(intptr_t)i));
    }
    assert_int_equal(woken[4], 1);   /* -1 passed the head (0): woken to try */
    assert_int_equal(woken[0] + woken[1] + woken[2] + woken[3] + woken[5], 0);
    for (int k = 0; k < 6; ++k) {
        assert_true(kvf_proxy_admit_is_head(q, &e[order[k]]));
        kvf_proxy_admit_remove(q, &e[order[k]]);
    }
    assert_int_equal(kvf_proxy_admit_stats(q).count, 0);
    kvf_proxy_admit_destroy(q);
}

static void test_memtrim_policy(void **state)
{
    kvf_proxy_memtrim_t t = {0};

    (void)state;
    for (unsigned n = 0; n <= 63; ++n) {
        assert_false(kvf_proxy_memtrim_due(&t, n, 1000));   /* a peak of 63: too small */
    }
    assert_false(kvf_proxy_memtrim_due(&t, 0, 1100));
    assert_false(kvf_proxy_memtrim_due(&t, 300, 2000));      /* a burst of 300 */
    assert_false(kvf_proxy_memtrim_due(&t, 76, 2100));       /* 76 > 300 / 4 = 75 */
    assert_true(kvf_proxy_memtrim_due(&t, 75, 2200));        /* fell to a quarter */
    assert_int_equal(t.peak, 75);
    assert_int_equal(t.trims, 1);
    assert_false(kvf_proxy_memtrim_due(&t, 400, 2300));      /* the next burst */
    assert_false(kvf_proxy_memtrim_due(&t, 10, 3100));       /* 900 ms after the trim */
    assert_true(kvf_proxy_memtrim_due(&t, 10, 3200));        /* a second after it */
    for (int64_t ms = 4000; ms < 20000; ms += 100) {         /* steady at 200: never */
        assert_false(kvf_proxy_memtrim_due(&t, 200, ms));
    }
    assert_int_equal(t.trims, 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_ok),
        cmocka_unit_test(test_parse_bad),   cmocka_unit_test(test_metrics_text),
        cmocka_unit_test(test_error_json),  cmocka_unit_test(test_parse_limits),
        cmocka_unit_test(test_parse_chat),  cmocka_unit_test(test_memtrim_policy),
        cmocka_unit_test(test_priority),    cmocka_unit_test(test_chat_args),
        cmocka_unit_test(test_tool_parsers), cmocka_unit_test(test_reasoning_split),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
