/*
 * Checkpoints as transformers writes them: a model spread over several
 * safetensors shards with model.safetensors.index.json computes exactly
 * what the one-file checkpoint computes; a bf16 checkpoint's weights stay
 * bf16 in memory (resident about its file size, not twice it) and still
 * compute in fp32; a stale or incomplete index is refused naming the tensor.
 */
#include "kvf_model_test_util.h"
#include "kvf_mkmodel.h"
#include "kvf_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define GEN 6

static void kvf_mk(const char *name, kvf_dtype_t dtype, int shards, char *dir)
{
    char cfg[1024];
    snprintf(dir, 256, "/tmp/kvf-ckpt-XXXXXX");
    assert_non_null(mkdtemp(dir));
    snprintf(cfg, sizeof(cfg), "%s/tests/data/models/%s.config.json", KVF_SOURCE_DIR, name);
    assert_int_equal(kvf_mkmodel_write_sharded(cfg, dir, 7, dtype, shards), KVF_OK);
}

static void kvf_run(const char *dir, int tp, int32_t *toks, float *lg)
{
    kvf_test_engine_opts_t o = kvf_test_engine_defaults();
    int32_t prompt[64];
    int n = kvf_test_prompt("Sharded checkpoints load alike", prompt, 64);
    kvf_engine_h eng;

    o.tp = tp;
    eng = kvf_test_engine(dir, &o);
    kvf_test_greedy(eng, prompt, n, GEN, toks, lg);
    kvf_engine_destroy(eng);
}

static void test_sharded_equals_single(void **state)
{
    static const char *const models[] = {"tiny-moe", "tiny-llama"};
    (void)state;

    for (size_t m = 0; m < sizeof(models) / sizeof(models[0]); ++m) {
        char one[256], many[256], p[512];
        int32_t t1[GEN], t2[GEN];
        float *l1 = malloc(GEN * 260 * sizeof(float)), *l2 = malloc(GEN * 260 * sizeof(float));
        assert_true((l1 != NULL) && (l2 != NULL));
        kvf_mk(models[m], KVF_DTYPE_FP32, 1, one);
        kvf_mk(models[m], KVF_DTYPE_FP32, 5, many);
        snprintf(p, sizeof(p), "%s/model.safetensors.index.json", many);
        assert_int_equal(access(p, R_OK), 0);
        snprintf(p, sizeof(p), "%s/model-00005-of-00005.safetensors", many);
        assert_int_equal(access(p, R_OK), 0);
        snprintf(p, sizeof(p), "%s/model.safetensors", many);
        assert_int_not_equal(access(p, R_OK), 0);
        kvf_run(one, 2, t1, l1);
        kvf_run(many, 2, t2, l2);
        assert_memory_equal(t1, t2, sizeof(t1));
        assert_memory_equal(l1, l2, GEN * 260 * sizeof(float));   /* same weights, same math */
        free(l1);
        free(l2);
        kvf_test_rmmodel(one);
        kvf_test_rmmodel(many);
    }
}

static void test_bf16_resident_size(void **state)
{
    static const char *const models[] = {"tiny-hybrid", "tiny-moe", "tiny-qwen3"};
    (void)state;

    for (size_t m = 0; m < sizeof(models) / sizeof(models[0]); ++m) {
        char d16[256], d32[256];
        kvf_model_h a, b;
        int32_t t16[GEN], t32[GEN];
        float *l16 = malloc(GEN * 260 * sizeof(float)), *l32 = malloc(GEN * 260 * sizeof(float));
        double ratio, worst = 0;

        assert_true((l16 != NULL) && (l32 != NULL));
        kvf_mk(models[m], KVF_DTYPE_BF16, 2, d16);
        kvf_mk(models[m], KVF_DTYPE_FP32, 1, d32);
        assert_int_equal(kvf_model_load(d16, 1, &a), KVF_OK);
        assert_int_equal(kvf_model_load(d32, 1, &b), KVF_OK);
        ratio = (double)kvf_model_weight_bytes(a) / (double)kvf_model_file_bytes(a);
        print_message("%s bf16: weights %zu B held, files %zu B (ratio %.3f); fp32 %zu B\n",
                      models[m], kvf_model_weight_bytes(a), kvf_model_file_bytes(a), ratio,
                      kvf_model_weight_bytes(b));
        assert_int_equal(kvf_model_num_files(a), 2);
        assert_true((ratio > 0.97) && (ratio < 1.05));   /* fp32 norms/biases: a few % */
        assert_true(kvf_model_weight_bytes(b) > 19 * kvf_model_weight_bytes(a) / 10);
        kvf_model_destroy(a);
        kvf_model_destroy(b);
        /* bf16 weights compute: same tokens as the fp32 copy of the rounded values is
         * not asserted (different weights), but the logits stay finite and close */
        kvf_run(d16, 2, t16, l16);
        kvf_run(d32, 2, t32, l32);
        for (int i = 0; i < 260; ++i) {
            assert_false(isnan(l16[i]));
            worst = fmax(worst, fabs((double)l16[i] - (double)l32[i]));
        }
        print_message("%s: first-step logits bf16 vs fp32 weights max diff %.3g\n", models[m],
                      worst);
        assert_true(worst < 0.5);
        free(l16);
        free(l32);
        kvf_test_rmmodel(d16);
        kvf_test_rmmodel(d32);
    }
}

/* Rewrite @a dir/config.json's "tie_word_embeddings": false as true. */
static void kvf_set_tied(const char *dir)
{
    char path[512], text[8192], *at;
    FILE *f;
    size_t n;

    snprintf(path, sizeof(path), "%s/config.json", dir);
    f = fopen(path, "rb");
    assert_non_null(f);
    n = fread(text, 1, sizeof(text) - 1, f);
    fclose(f);
    text[n] = '\0';
    at = strstr(text, "\"tie_word_embeddings\"");
    assert_non_null(at);
    at = strstr(at, "false");
    assert_non_null(at);
    memcpy(at, "true ", 5);   /* same length: JSON allows the space */
    f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, n, f), n);
    fclose(f);
}

/* tie_word_embeddings true with an lm_head.weight in the file (llama, qwen3): the
 * stored head is used, as transformers 5 does, so the logits equal the untied
 * model's bit for bit (tying would give the embeddings' logits instead). */
static void test_tied_with_stored_head(void **state)
{
    static const char *const models[] = {"tiny-llama", "tiny-qwen3"};
    (void)state;

    for (size_t m = 0; m < sizeof(models) / sizeof(models[0]); ++m) {
        char dir[256];
        int32_t t1[GEN], t2[GEN];
        float *l1 = malloc(GEN * 260 * sizeof(float)), *l2 = malloc(GEN * 260 * sizeof(float));
        kvf_model_h mod;

        assert_true((l1 != NULL) && (l2 != NULL));
        kvf_mk(models[m], KVF_DTYPE_FP32, 1, dir);
        kvf_run(dir, 1, t1, l1);
        kvf_set_tied(dir);
        assert_int_equal(kvf_model_load(dir, 1, &mod), KVF_OK);
        assert_true(kvf_model_get_config(mod)->tie_word_embeddings);
        assert_false(kvf_model_get_config(mod)->lm_head_tied);
        kvf_model_destroy(mod);
        kvf_run(dir, 1, t2, l2);
        assert_memory_equal(t1, t2, sizeof(t1));
        assert_memory_equal(l1, l2, GEN * 260 * sizeof(float));
        free(l1);
        free(l2);
        kvf_test_rmmodel(dir);
    }
}

static void test_bad_index(void **state)
{
    char dir[256], p[512];
    kvf_model_h m = NULL;
    FILE *f;
    (void)state;

    kvf_mk("tiny-llama", KVF_DTYPE_FP32, 3, dir);
    /* a shard gone */
    snprintf(p, sizeof(p), "%s/model-00002-of-00003.safetensors", dir);
    assert_int_equal(unlink(p), 0);
    assert_int_not_equal(kvf_model_load(dir, 1, &m), KVF_OK);
    /* an index naming a tensor its shard does not hold */
    snprintf(p, sizeof(p), "%s/model.safetensors.index.json", dir);
    f = fopen(p, "w");
    assert_non_null(f);
    fputs("{\"weight_map\": {\"model.norm.weight\": \"model-00001-of-00003.safetensors\","
          " \"no.such.tensor\": \"model-00001-of-00003.safetensors\"}}", f);
    fclose(f);
    assert_int_equal(kvf_model_load(dir, 1, &m), KVF_ERR_PARSE);
    /* an index escaping the folder */
    f = fopen(p, "w");
    assert_non_null(f);
    fputs("{\"weight_map\": {\"model.norm.weight\": \"../x.safetensors\"}}", f);
    fclose(f);
    assert_int_equal(kvf_model_load(dir, 1, &m), KVF_ERR_PARSE);
    assert_null(m);
    kvf_test_rmmodel(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sharded_equals_single),
        cmocka_unit_test(test_bf16_resident_size),
        cmocka_unit_test(test_bad_index),
        cmocka_unit_test(test_tied_with_stored_head),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
