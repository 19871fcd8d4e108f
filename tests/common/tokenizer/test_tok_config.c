/*
 * kvf_tok_config_load: the four config.json fields kvf-proxy reads without the
 * engine (kvf_tok_config.h), each rule of the engine's reader and each refusal.
 * The agreement with the engine's reader on the tree's configs is
 * tests/common/runtime/test_tok_model.c.
 */
#include "kvf_tok_config.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

static char g_dir[256];

static int setup(void **state)
{
    (void)state;
    snprintf(g_dir, sizeof(g_dir), "/tmp/kvf_tok_config_XXXXXX");
    return (mkdtemp(g_dir) == NULL) ? -1 : 0;
}

static int teardown(void **state)
{
    char path[512];

    (void)state;
    snprintf(path, sizeof(path), "%s/config.json", g_dir);
    unlink(path);
    return rmdir(g_dir);
}

/* Write @json as g_dir/config.json and load it through the folder. */
static kvf_status_t load_text(const char *json, kvf_tok_config_t *tc)
{
    char path[512];
    FILE *f;

    snprintf(path, sizeof(path), "%s/config.json", g_dir);
    f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(fputs(json, f) >= 0, 1);
    assert_int_equal(fclose(f), 0);
    return kvf_tok_config_load(g_dir, tc);
}

static void test_reads_fields(void **state)
{
    kvf_tok_config_t tc;

    (void)state;
    assert_int_equal(load_text("{\"model_type\": \"anything\", \"vocab_size\": 1000, "
                               "\"bos_token_id\": 1, \"eos_token_id\": [7, 2], "
                               "\"max_position_embeddings\": 4096, \"hidden_size\": 3}", &tc),
                     KVF_OK);
    assert_int_equal(tc.vocab_size, 1000);
    assert_int_equal(tc.bos_token_id, 1);
    assert_int_equal(tc.eos_token_id, 7);          /* a list: its first entry */
    assert_int_equal(tc.max_position_embeddings, 4096);

    /* absent and null: -1 for the ids, 0 for the context */
    assert_int_equal(load_text("{\"vocab_size\": 300, \"bos_token_id\": null}", &tc), KVF_OK);
    assert_int_equal(tc.vocab_size, 300);
    assert_int_equal(tc.bos_token_id, -1);
    assert_int_equal(tc.eos_token_id, -1);
    assert_int_equal(tc.max_position_embeddings, 0);
}

static void test_file_path(void **state)
{
    char path[512];
    kvf_tok_config_t tc;

    (void)state;
    assert_int_equal(load_text("{\"vocab_size\": 512, \"eos_token_id\": 511}", &tc), KVF_OK);
    memset(&tc, 0, sizeof(tc));
    snprintf(path, sizeof(path), "%s/config.json", g_dir);
    assert_int_equal(kvf_tok_config_load(path, &tc), KVF_OK);   /* the file itself */
    assert_int_equal(tc.vocab_size, 512);
    assert_int_equal(tc.eos_token_id, 511);
}

static void test_refusals(void **state)
{
    static const struct {
        const char  *json;
        kvf_status_t want;
    } cases[] = {
        {"{\"bos_token_id\": 1}", KVF_ERR_INVALID_PARAM},                      /* no vocab */
        {"{\"vocab_size\": 0}", KVF_ERR_INVALID_PARAM},
        {"{\"vocab_size\": 12.5}", KVF_ERR_INVALID_PARAM},
        {"{\"vocab_size\": \"100\"}", KVF_ERR_INVALID_PARAM},
        {"{\"vocab_size\": 100, \"bos_token_id\": 100}", KVF_ERR_INVALID_PARAM},   /* outside */
        {"{\"vocab_size\": 100, \"eos_token_id\": [100]}", KVF_ERR_INVALID_PARAM},
        {"{\"vocab_size\": 100, \"eos_token_id\": -1}", KVF_ERR_INVALID_PARAM},
        {"{\"vocab_size\": 100, \"max_position_embeddings\": -4}", KVF_ERR_INVALID_PARAM},
        {"[1, 2]", KVF_ERR_INVALID_PARAM},
        {"{\"vocab_size\": 100,", KVF_ERR_PARSE},
    };
    kvf_tok_config_t tc;

    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); ++i) {
        memset(&tc, 0x5a, sizeof(tc));
        assert_int_equal(load_text(cases[i].json, &tc), cases[i].want);
        assert_int_equal(tc.vocab_size, 0x5a5a5a5a);     /* untouched on error */
    }
    assert_int_equal(kvf_tok_config_load("/nonexistent/model", &tc), KVF_ERR_IO);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reads_fields),
        cmocka_unit_test(test_file_path),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
