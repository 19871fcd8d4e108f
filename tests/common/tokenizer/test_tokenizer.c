/*
 * Tokenizer in C alone (the comparison with Hugging Face tokenizers is
 * tokenizer_compare.py): round trips on the bundled trained tokenizer,
 * streamed decode across UTF-8 boundaries (what the proxy sends as
 * server-sent events), and refusal of unsupported tokenizer.json fields.
 * Runs under ASan+UBSan in the test command's sanitizer pass.
 */
#include "kvf_tokenizer.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#define FFFD "\xef\xbf\xbd"

static const char *trained_tokenizer(void)
{
    return KVF_SOURCE_DIR "/models-trained/tiny-hybrid/tokenizer.json";
}

static kvf_tokenizer_t byte_tok(void)
{
    kvf_tok_config_t cfg;
    kvf_tokenizer_t tok;

    memset(&cfg, 0, sizeof(cfg));
    cfg.vocab_size = 260;
    cfg.bos_token_id = 256;
    cfg.eos_token_id = 257;
    assert_int_equal(kvf_tokenizer_init(&cfg, &tok), KVF_OK);
    return tok;
}

/*
 * Feed ids one at a time; returns the concatenation (malloc'd, NUL-terminated;
 * its length in *len_p when not NULL: a byte-0 token decodes to a NUL inside).
 */
static char *stream_all_len(const kvf_tokenizer_t *tok, const int32_t *ids, int n, size_t *len_p)
{
    kvf_tokenizer_stream_t st;
    size_t cap = kvf_tokenizer_stream_cap(tok, 1) + 3 * KVF_TOKENIZER_STREAM_PEND + 1;
    size_t total = 0, w;
    char *chunk = malloc(cap);
    char *all = malloc((size_t)(n + 1) * cap);

    assert_non_null(chunk);
    assert_non_null(all);
    memset(&st, 0, sizeof(st));
    for (int i = 0; i <= n; ++i) {
        w = (i < n) ? kvf_tokenizer_stream_feed(tok, &st, ids + i, 1, chunk, cap)
                    : kvf_tokenizer_stream_flush(&st, chunk, cap);
        assert_true(w < cap);
        memcpy(all + total, chunk, w);
        total += w;
    }
    all[total] = '\0';
    free(chunk);
    if (len_p != NULL) {
        *len_p = total;
    }
    return all;
}

static char *stream_all(const kvf_tokenizer_t *tok, const int32_t *ids, int n)
{
    return stream_all_len(tok, ids, n, NULL);
}

static void test_byte_stream_split_char(void **state)
{
    /* U+1F600 is F0 9F 98 80: three ids give nothing, the fourth the whole character. */
    kvf_tokenizer_t tok = byte_tok();
    const int32_t emoji[] = {0xf0, 0x9f, 0x98, 0x80};
    kvf_tokenizer_stream_t st;
    char out[512];

    (void)state;
    memset(&st, 0, sizeof(st));
    for (int i = 0; i < 3; ++i) {
        assert_int_equal(kvf_tokenizer_stream_feed(&tok, &st, emoji + i, 1, out, sizeof(out)), 0);
        assert_string_equal(out, "");
    }
    assert_int_equal(kvf_tokenizer_stream_feed(&tok, &st, emoji + 3, 1, out, sizeof(out)), 4);
    assert_string_equal(out, "\xf0\x9f\x98\x80");
    assert_int_equal(kvf_tokenizer_stream_flush(&st, out, sizeof(out)), 0);

    /* A held lead byte followed by 'A': U+FFFD, then 'A'. */
    {
        const int32_t ids[] = {0xc3, 'A'};
        char *s = stream_all(&tok, ids, 2);
        assert_string_equal(s, FFFD "A");
        free(s);
    }
    /* Truncated at the end: the flush releases one U+FFFD. */
    {
        const int32_t ids[] = {'x', 0xe2, 0x82};
        char *s = stream_all(&tok, ids, 3);
        assert_string_equal(s, "x" FFFD);
        free(s);
    }
    /* Special ids (BOS 256, EOS 257) are not text. */
    {
        const int32_t ids[] = {256, 'o', 'k', 257};
        char *s = stream_all(&tok, ids, 4);
        assert_string_equal(s, "ok");
        free(s);
    }
    kvf_tokenizer_cleanup(&tok);
}

static void test_bpe_round_trip(void **state)
{
    const char *texts[] = {
        "add 347+5821=6168", "rev c a t s = s t a c", "kv ab=47 cd=12 ? ab=47",
        "caf\xc3\xa9 \xf0\x9f\x98\x80 \xe6\x97\xa5\xe6\x9c\xac", "  two  spaces\nnew line\t",
    };
    kvf_tokenizer_t tok;
    int32_t ids[512];
    char out[2048];

    (void)state;
    assert_int_equal(kvf_tokenizer_load_file(trained_tokenizer(), NULL, &tok), KVF_OK);
    for (size_t t = 0; t < sizeof(texts) / sizeof(texts[0]); ++t) {
        int n = kvf_tokenizer_encode(&tok, texts[t], strlen(texts[t]), false, ids, 512);
        char *streamed;

        assert_true(n > 0);
        assert_true(n <= (int)strlen(texts[t]));       /* merges never make more ids than bytes */
        kvf_tokenizer_decode(&tok, ids, n, out, sizeof(out));
        assert_string_equal(out, texts[t]);
        streamed = stream_all(&tok, ids, n);
        assert_string_equal(streamed, texts[t]);
        free(streamed);
    }
    /* The ASCII task text merges: fewer ids than bytes. */
    assert_true(kvf_tokenizer_encode(&tok, texts[0], strlen(texts[0]), false, ids, 512) <
                (int)strlen(texts[0]));
    /* Too small an id buffer is an error, not a cut. */
    assert_int_equal(kvf_tokenizer_encode(&tok, texts[0], strlen(texts[0]), false, ids, 2), -1);
    kvf_tokenizer_cleanup(&tok);
}

static void test_bpe_stream_equals_decode_random(void **state)
{
    /* Random ids cut characters apart anywhere: streamed text always equals the whole decode. */
    kvf_tokenizer_t tok;
    unsigned seed = 12345;
    int32_t ids[64];
    char *whole = malloc(64 * 64 * 3 + 1);

    (void)state;
    assert_non_null(whole);
    assert_int_equal(kvf_tokenizer_load_file(trained_tokenizer(), NULL, &tok), KVF_OK);
    for (int round = 0; round < 200; ++round) {
        int n = 1 + (int)(rand_r(&seed) % 64);
        size_t wlen, slen;
        char *streamed;

        for (int i = 0; i < n; ++i) {
            ids[i] = (int32_t)(rand_r(&seed) % (unsigned)tok.vocab_size);
        }
        wlen = kvf_tokenizer_decode(&tok, ids, n, whole, 64 * 64 * 3 + 1);

        streamed = stream_all_len(&tok, ids, n, &slen);
        assert_int_equal(slen, wlen);
        assert_memory_equal(streamed, whole, wlen);
        free(streamed);
    }
    free(whole);
    kvf_tokenizer_cleanup(&tok);
}

static void test_refuses_unsupported(void **state)
{
    char path[] = "/tmp/kvf-tok-XXXXXX";
    int fd = mkstemp(path);
    const char *json = "{\"version\":\"1.0\",\"normalizer\":{\"type\":\"NFC\"},"
                       "\"pre_tokenizer\":null,\"post_processor\":null,\"decoder\":null,"
                       "\"added_tokens\":[],\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},"
                       "\"merges\":[]}}";
    kvf_tokenizer_t tok = {7, 1, 2, NULL};

    (void)state;
    assert_true(fd >= 0);
    assert_int_equal(write(fd, json, strlen(json)), (ssize_t)strlen(json));
    close(fd);
    assert_int_equal(kvf_tokenizer_load_file(path, NULL, &tok), KVF_ERR_UNSUPPORTED);
    assert_int_equal(tok.vocab_size, 7);                /* untouched on error */
    assert_null(tok.bpe);
    unlink(path);
    assert_int_equal(kvf_tokenizer_load_file("/nonexistent/tokenizer.json", NULL, &tok),
                     KVF_ERR_NOT_FOUND);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_byte_stream_split_char),
        cmocka_unit_test(test_bpe_round_trip),
        cmocka_unit_test(test_bpe_stream_equals_decode_random),
        cmocka_unit_test(test_refuses_unsupported),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
