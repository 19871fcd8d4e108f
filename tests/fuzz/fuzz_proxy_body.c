/*
 * libFuzzer target: what kvf-proxy does with a /v1/completions body and
 * with the token ids a decode instance sends back. The body goes through
 * kvf_proxy_openai_parse() with the trained tiny hybrid model's byte-level
 * BPE tokenizer (models-trained/tiny-hybrid); the ids become completion
 * text through the tokenizer's streaming decoder in one piece and as a
 * stream split in two, and the answer is rendered as the JSON the
 * client gets (kvf_proxy_openai_response / _chunk / _error_json).
 *
 * Input: k = byte 0 % 65 completion ids as 4-byte little-endian int32
 * (any value: a buggy decode may send ids outside the vocabulary), then the
 * request body. Checked beyond "no crash, leak or UB": an accepted request
 * is in range (prompt 1..max ids inside the vocabulary, max_tokens within
 * the limit and the model length, temperature finite in [0, 100]); a
 * refused one gets 400/404/500 with a message that survives as the JSON
 * error's "message"; the completion text is valid UTF-8, the same streamed
 * or whole, and every JSON the proxy writes parses and carries that text.
 *
 * Seeds: tests/fuzz/corpus/fuzz_proxy_body (tests/fuzz/make_seeds.c).
 */
#include "kvf_tok_config.h"
#include "kvf_proxy_openai.h"
#include "kvf_tokenizer.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(cond)                                                                   \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            fprintf(stderr, "fuzz_proxy_body: invariant failed: %s (line %d)\n", #cond,   \
                    __LINE__);                                                             \
            abort();                                                                       \
        }                                                                                  \
    } while (0)

#define FUZZ_MAX_IDS 64

static kvf_tokenizer_t g_tok;
static kvf_proxy_openai_ctx_t g_ctx;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    kvf_tok_config_t tc;
    const char *model = KVF_SOURCE_DIR "/models-trained/tiny-hybrid";

    (void)argc;
    (void)argv;
    FUZZ_CHECK(kvf_tok_config_load(model, &tc) == KVF_OK);   /* as kvf-proxy reads it */
    FUZZ_CHECK(kvf_tokenizer_load(model, &tc, &g_tok) == KVF_OK);
    g_ctx.tok = &g_tok;
    g_ctx.tok_ready = true;
    g_ctx.model_name = "tiny";
    g_ctx.add_bos = true;
    g_ctx.max_prompt_tokens = 512;
    g_ctx.max_tokens_limit = 256;
    g_ctx.default_max_tokens = 16;
    g_ctx.max_model_len = tc.max_position_embeddings;
    return 0;
}

/* Strict UTF-8 (no overlongs, surrogates or code points past U+10FFFF), no NUL. */
static bool utf8_valid(const unsigned char *s, size_t n)
{
    size_t i = 0;

    while (i < n) {
        unsigned c = s[i];
        int k;
        uint32_t cp;

        if (c == 0) {
            return false;
        }
        if (c < 0x80) {
            i++;
            continue;
        }
        k = ((c & 0xe0) == 0xc0) ? 1 : ((c & 0xf0) == 0xe0) ? 2 : ((c & 0xf8) == 0xf0) ? 3 : -1;
        if ((k < 0) || (n - i <= (size_t)k)) {
            return false;
        }
        cp = c & (0x3fu >> k);
        for (int j = 1; j <= k; ++j) {
            if ((s[i + (size_t)j] & 0xc0) != 0x80) {
                return false;
            }
            cp = (cp << 6) | (s[i + (size_t)j] & 0x3f);
        }
        if (((k == 1) && (cp < 0x80)) || ((k == 2) && (cp < 0x800)) ||
            ((k == 3) && (cp < 0x10000)) || (cp > 0x10ffff) ||
            ((cp >= 0xd800) && (cp <= 0xdfff))) {
            return false;
        }
        i += (size_t)k + 1;
    }
    return true;
}

/* Completion text of ids[from, to) through @a st, as kvf-proxy builds it (the tokenizer's
 * streaming decoder; a NUL byte, which JSON text cannot carry raw, shown as '?'); malloc'd. */
static char *text_of(const int32_t *ids, int from, int to, kvf_tokenizer_stream_t *st, bool flush)
{
    size_t cap = kvf_tokenizer_stream_cap(&g_tok, to - from) + 3 * KVF_TOKENIZER_STREAM_PEND + 1;
    char *text = malloc(cap);
    size_t w;

    FUZZ_CHECK(text != NULL);
    w = kvf_tokenizer_stream_feed(&g_tok, st, ids + from, to - from, text, cap);
    if (flush) {
        w += kvf_tokenizer_stream_flush(st, text + w, cap - w);
    }
    FUZZ_CHECK(w < cap);
    for (size_t i = 0; i < w; ++i) {
        if (text[i] == '\0') {
            text[i] = '?';
        }
    }
    text[w] = '\0';
    return text;
}

/* @a json parses, and choices[0].text is @a text. Frees @a json. */
static void check_answer_json(char *json, const char *text)
{
    cJSON *root, *choices, *t;

    FUZZ_CHECK(json != NULL);
    root = cJSON_Parse(json);
    FUZZ_CHECK(root != NULL);
    choices = cJSON_GetObjectItemCaseSensitive(root, "choices");
    FUZZ_CHECK(cJSON_IsArray(choices) && (cJSON_GetArraySize(choices) == 1));
    t = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(choices, 0), "text");
    FUZZ_CHECK(cJSON_IsString(t) && (strcmp(t->valuestring, text) == 0));
    cJSON_Delete(root);
    free(json);
}

static void check_refusal(kvf_status_t st, int http, const char *param, const char *err)
{
    cJSON *root, *e, *m;
    char *json;

    FUZZ_CHECK((st == KVF_ERR_PARSE) || (st == KVF_ERR_INVALID_PARAM) ||
               (st == KVF_ERR_NOT_FOUND) || (st == KVF_ERR_OUT_OF_RANGE) ||
               (st == KVF_ERR_NO_MEMORY));
    FUZZ_CHECK((http == 400) || (http == 404) || (http == 500));
    FUZZ_CHECK(err[0] != '\0');
    json = kvf_proxy_openai_error_json(err, "invalid_request_error", param, http);
    FUZZ_CHECK(json != NULL);
    root = cJSON_Parse(json);
    FUZZ_CHECK(root != NULL);
    e = cJSON_GetObjectItemCaseSensitive(root, "error");
    m = cJSON_GetObjectItemCaseSensitive(e, "message");
    /* the message is whatever the proxy wrote, echoed request text included */
    FUZZ_CHECK(cJSON_IsString(m) && (strcmp(m->valuestring, err) == 0));
    cJSON_Delete(root);
    free(json);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int32_t ids[FUZZ_MAX_IDS];
    int k = 0, half;
    kvf_proxy_completion_req_t req;
    kvf_proxy_completion_t c;
    kvf_tokenizer_stream_t whole, stream;
    const char *param = NULL;
    char err[512] = "", *text, *a, *b, *joined;
    int http = 0;
    kvf_status_t st;

    if (size > 0) {
        k = data[0] % (FUZZ_MAX_IDS + 1);
        data++;
        size--;
    }
    for (int i = 0; i < k; ++i) {
        uint32_t v = 0;
        for (int j = 0; j < 4; ++j) {
            v |= (uint32_t)((size > 0) ? data[0] : 0) << (8 * j);
            if (size > 0) {
                data++;
                size--;
            }
        }
        ids[i] = (int32_t)v;
    }

    memset(&whole, 0, sizeof(whole));
    memset(&stream, 0, sizeof(stream));
    memset(&req, 0, sizeof(req));
    st = kvf_proxy_openai_parse(&g_ctx, (const char *)data, size, &req, &http, &param, err,
                                sizeof(err));
    if (st != KVF_OK) {
        check_refusal(st, http, param, err);
        return 0;
    }
    FUZZ_CHECK((req.num_prompts >= 1) && (req.n >= 1) &&
               (req.num_prompts * req.n <= KVF_PROXY_MAX_CHOICES));
    for (int p = 0; p < req.num_prompts; ++p) {
        FUZZ_CHECK((req.prompt_lens[p] >= 1) && (req.prompt_lens[p] <= g_ctx.max_prompt_tokens));
        for (int i = 0; i < req.prompt_lens[p]; ++i) {
            FUZZ_CHECK((req.prompts[p][i] >= 0) && (req.prompts[p][i] < g_tok.vocab_size));
        }
        FUZZ_CHECK((int64_t)req.prompt_lens[p] + req.max_tokens <= g_ctx.max_model_len);
    }
    FUZZ_CHECK((req.max_tokens >= 1) && (req.max_tokens <= g_ctx.max_tokens_limit));
    FUZZ_CHECK(req.min_tokens <= req.max_tokens);
    FUZZ_CHECK((req.top_p > 0.0f) && (req.top_p <= 1.0f) && (req.min_p >= 0.0f) &&
               (req.min_p <= 1.0f) && (req.repetition_penalty > 0.0f) &&
               (fabsf(req.presence_penalty) <= 2.0f) && (fabsf(req.frequency_penalty) <= 2.0f));
    FUZZ_CHECK(isfinite(req.temperature) && (req.temperature >= 0.0f) &&
               (req.temperature <= 100.0f));

    /* the answer: whole, and streamed in two chunks, must be the same valid text */
    text = text_of(ids, 0, k, &whole, true);
    FUZZ_CHECK(utf8_valid((const unsigned char *)text, strlen(text)));
    half = k / 2;
    a = text_of(ids, 0, half, &stream, false);
    b = text_of(ids, half, k, &stream, true);
    joined = malloc(strlen(a) + strlen(b) + 1);
    FUZZ_CHECK(joined != NULL);
    strcpy(joined, a);
    strcat(joined, b);
    FUZZ_CHECK(strcmp(joined, text) == 0);

    memset(&c, 0, sizeof(c));
    snprintf(c.id, sizeof(c.id), "cmpl-fuzz");
    c.created = 1700000000;
    c.tokens = ids;
    c.num_tokens = k;
    snprintf(c.finish_reason, sizeof(c.finish_reason), "length");
    c.prefill_instance = "tcp://127.0.0.1:5557";
    c.decode_instance = "tcp://127.0.0.1:5558";
    {
        kvf_proxy_choice_out_t ch;
        kvf_proxy_usage_t u = {req.num_prompt, k};

        memset(&ch, 0, sizeof(ch));
        ch.text = text;
        ch.ids = ids;
        ch.num_ids = k;
        ch.finish_reason = "length";
        ch.stop_token = -1;
        check_answer_json(kvf_proxy_openai_response(&g_ctx, &req, &c, &ch, 1, &u), text);
        ch.text = a;
        ch.num_ids = half;
        ch.finish_reason = NULL;
        check_answer_json(kvf_proxy_openai_chunk(&g_ctx, &req, &c, &ch, NULL), a);
    }
    free(joined);
    free(a);
    free(b);
    free(text);
    kvf_proxy_openai_req_cleanup(&req);
    return 0;
}
