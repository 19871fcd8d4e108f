/*
 * kvf-proxy reads a model's tokenizer fields with kvf_tok_config_load (no engine);
 * the engine reads them with kvf_model_config_load. For every model config of the
 * tree that the engine accepts, the two give the same vocab_size, BOS, EOS and
 * context (kvf_tok_config_of_model), and the tokenizer digest the daemons publish
 * (kvf_tokenizer_digest_of_model) equals the one computed from the engine's fields.
 */
#include "kvf_tok_digest.h"
#include "kvf_tok_model.h"

#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

/* Compare both readers on @path; @return 1 when the engine accepts it. */
static int compare_one(const char *path)
{
    kvf_model_config_t mc;
    kvf_tok_config_t tc, want;

    if (kvf_model_config_load(path, &mc) != KVF_OK) {
        return 0;
    }
    assert_int_equal(kvf_tok_config_load(path, &tc), KVF_OK);
    want = kvf_tok_config_of_model(&mc);
    if (memcmp(&tc, &want, sizeof(tc)) != 0) {
        fail_msg("%s: proxy reads vocab %d bos %d eos %d ctx %d, engine %d %d %d %d", path,
                 tc.vocab_size, tc.bos_token_id, tc.eos_token_id, tc.max_position_embeddings,
                 want.vocab_size, want.bos_token_id, want.eos_token_id,
                 want.max_position_embeddings);
    }
    return 1;
}

static void test_readers_agree(void **state)
{
    char path[1024];
    struct dirent *e;
    DIR *d;
    int n = 0;

    (void)state;
    d = opendir(KVF_SOURCE_DIR "/tests/data/models");
    assert_non_null(d);
    while ((e = readdir(d)) != NULL) {
        if (strstr(e->d_name, ".config.json") != NULL) {
            snprintf(path, sizeof(path), "%s/tests/data/models/%s", KVF_SOURCE_DIR, e->d_name);
            n += compare_one(path);
        }
    }
    closedir(d);
    /* the checkpoints transformers saved, the multimodal qwen3_5 / qwen3_5_moe among them
     * (their fields in text_config) */
    d = opendir(KVF_SOURCE_DIR "/tests/data/families");
    assert_non_null(d);
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] != '.') {
            snprintf(path, sizeof(path), "%s/tests/data/families/%s", KVF_SOURCE_DIR,
                     e->d_name);
            n += compare_one(path);
        }
    }
    closedir(d);
    n += compare_one(KVF_SOURCE_DIR "/models-trained/tiny-hybrid");
    n += compare_one(KVF_SOURCE_DIR "/models-trained/tiny-dense");
    print_message("tokenizer fields equal on %d model configs\n", n);
    assert_true(n >= 25);
}

static void test_digest_same_as_engine_fields(void **state)
{
    const char *dir = KVF_SOURCE_DIR "/models-trained/tiny-hybrid";
    char a[KVF_TOK_DIGEST_HEX + 1], b[KVF_TOK_DIGEST_HEX + 1];
    kvf_model_config_t mc;
    kvf_tok_config_t tc;
    kvf_tokenizer_t tok;

    (void)state;
    assert_int_equal(kvf_tokenizer_digest_of_model(dir, a), KVF_OK);
    assert_int_equal(kvf_model_config_load(dir, &mc), KVF_OK);
    tc = kvf_tok_config_of_model(&mc);
    assert_int_equal(kvf_tokenizer_load(dir, &tc, &tok), KVF_OK);
    assert_int_equal(kvf_tokenizer_digest(&tok, b), KVF_OK);
    kvf_tokenizer_cleanup(&tok);
    assert_string_equal(a, b);
    assert_int_equal(strlen(a), KVF_TOK_DIGEST_HEX);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_readers_agree),
        cmocka_unit_test(test_digest_same_as_engine_fields),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
