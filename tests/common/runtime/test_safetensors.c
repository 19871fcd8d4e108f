/*
 * safetensors writer/reader round trip (F32 and BF16), row-range loads,
 * the errors for missing and mis-shaped tensors, the byte tokenizer, and
 * mkmodel determinism and tensor names.
 */
#include "kvf_model_test_util.h"
#include "kvf_mkmodel.h"
#include "kvf_safetensors.h"
#include "kvf_tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void test_round_trip(void **state)
{
    char path[] = "/tmp/kvf-st-XXXXXX";
    const int64_t s2[2] = {3, 4}, s1[1] = {5}, bad[2] = {4, 3};
    float a[12], b[5], out[12];
    kvf_st_writer_h w;
    kvf_st_file_h f;
    int fd = mkstemp(path);

    (void)state;
    assert_true(fd >= 0);
    close(fd);
    for (int i = 0; i < 12; ++i) {
        a[i] = (float)i * 0.5f - 2.0f;
    }
    for (int i = 0; i < 5; ++i) {
        b[i] = 1.0f + (float)i / 3.0f;   /* not exact in bf16 */
    }
    assert_int_equal(kvf_st_writer_create(&w), KVF_OK);
    assert_int_equal(kvf_st_writer_add(w, "a.weight", 2, s2, a, KVF_DTYPE_FP32), KVF_OK);
    assert_int_equal(kvf_st_writer_add(w, "b", 1, s1, b, KVF_DTYPE_BF16), KVF_OK);
    assert_int_equal(kvf_st_writer_add(w, "b", 1, s1, b, KVF_DTYPE_BF16), KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_st_writer_finish(w, path), KVF_OK);

    assert_int_equal(kvf_st_open(path, &f), KVF_OK);
    assert_int_equal(kvf_st_count(f), 2);
    assert_string_equal(kvf_st_find(f, "b")->dtype_name, "BF16");
    assert_int_equal(kvf_st_load_f32(f, "a.weight", 2, s2, out), KVF_OK);
    assert_memory_equal(out, a, sizeof(a));
    assert_int_equal(kvf_st_load_rows_f32(f, "a.weight", 2, s2, 1, 2, out), KVF_OK);
    assert_memory_equal(out, a + 4, 8 * sizeof(float));
    assert_int_equal(kvf_st_load_rows_f32(f, "a.weight", 2, s2, 2, 2, out), KVF_ERR_OUT_OF_RANGE);
    assert_int_equal(kvf_st_load_f32(f, "b", 1, s1, out), KVF_OK);
    for (int i = 0; i < 5; ++i) {
        assert_true(out[i] == kvf_bf16_to_fp32(kvf_fp32_to_bf16(b[i])));
    }
    assert_true(out[1] != b[1]);   /* really stored as bf16 */
    assert_int_equal(kvf_st_load_f32(f, "missing", 1, s1, out), KVF_ERR_NOT_FOUND);
    assert_int_equal(kvf_st_load_f32(f, "a.weight", 2, bad, out), KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_st_load_f32(f, "a.weight", 1, s1, out), KVF_ERR_INVALID_PARAM);
    kvf_st_close(f);
    unlink(path);
}

static void test_corrupt_header(void **state)
{
    char path[] = "/tmp/kvf-st-XXXXXX";
    kvf_st_file_h f;
    int fd = mkstemp(path);
    FILE *fp;
    const char *hdr = "{\"x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}";
    uint64_t len = strlen(hdr);

    (void)state;
    assert_true(fd >= 0);
    close(fd);
    fp = fopen(path, "wb");
    assert_non_null(fp);
    fwrite(&len, 8, 1, fp);          /* little-endian host */
    fwrite(hdr, 1, len, fp);
    fwrite("\0\0\0\0\0\0\0\0", 1, 8, fp);   /* only 8 of the 16 data bytes */
    fclose(fp);
    assert_int_equal(kvf_st_open(path, &f), KVF_ERR_PARSE);
    unlink(path);
}

static void test_tokenizer(void **state)
{
    kvf_tok_config_t cfg = {0};
    kvf_tokenizer_t tok;
    int32_t ids[16];
    char out[16];

    (void)state;
    cfg.vocab_size = 260;
    cfg.bos_token_id = 256;
    cfg.eos_token_id = 257;
    assert_int_equal(kvf_tokenizer_init(&cfg, &tok), KVF_OK);
    assert_int_equal(kvf_tokenizer_encode(&tok, "hi\xff", 3, true, ids, 16), 4);
    assert_int_equal(ids[0], 256);
    assert_int_equal(ids[1], 'h');
    assert_int_equal(ids[3], 255);
    assert_int_equal(kvf_tokenizer_encode(&tok, "hi", 2, true, ids, 2), -1);
    ids[4] = 257;
    assert_int_equal(kvf_tokenizer_decode(&tok, ids, 5, out, sizeof(out)), 3);
    assert_string_equal(out, "hi\xff");
    cfg.vocab_size = 100;
    assert_int_equal(kvf_tokenizer_init(&cfg, &tok), KVF_ERR_UNSUPPORTED);
}

static void test_mkmodel_names_and_determinism(void **state)
{
    char d1[256], d2[256], p1[512], p2[512];
    kvf_st_file_h f;
    FILE *a, *b;
    int ca, cb;
    long n = 0;

    (void)state;
    kvf_test_mkmodel("tiny-hybrid", 42, d1);
    kvf_test_mkmodel("tiny-hybrid", 42, d2);
    snprintf(p1, sizeof(p1), "%s/model.safetensors", d1);
    snprintf(p2, sizeof(p2), "%s/model.safetensors", d2);
    a = fopen(p1, "rb");
    b = fopen(p2, "rb");
    assert_non_null(a);
    assert_non_null(b);
    do {
        ca = fgetc(a);
        cb = fgetc(b);
        assert_int_equal(ca, cb);
        ++n;
    } while (ca != EOF);
    fclose(a);
    fclose(b);
    assert_true(n > 1000000);

    /* HF NemotronH names and shapes (modeling_nemotron_h.py) */
    assert_int_equal(kvf_st_open(p1, &f), KVF_OK);
    {
        const kvf_st_tensor_info_t *t = kvf_st_find(f, "backbone.layers.0.mixer.in_proj.weight");
        assert_non_null(t);
        /* z (256) + xBC (256 + 2*2*16 = 320) + dt (8) = 584 rows of hidden 256 */
        assert_int_equal(t->shape[0], 584);
        assert_int_equal(t->shape[1], 256);
        t = kvf_st_find(f, "backbone.layers.0.mixer.conv1d.weight");
        assert_non_null(t);
        assert_int_equal(t->ndim, 3);
        assert_int_equal(t->shape[0], 320);
        assert_int_equal(t->shape[1], 1);
        assert_int_equal(t->shape[2], 4);
        t = kvf_st_find(f, "backbone.layers.1.mixer.k_proj.weight");
        assert_non_null(t);
        assert_int_equal(t->shape[0], 64);
        assert_non_null(kvf_st_find(f, "backbone.layers.3.mixer.down_proj.weight"));
        assert_non_null(kvf_st_find(f, "backbone.layers.2.mixer.A_log"));
        assert_non_null(kvf_st_find(f, "backbone.norm_f.weight"));
        assert_non_null(kvf_st_find(f, "lm_head.weight"));
        assert_null(kvf_st_find(f, "backbone.layers.1.mixer.in_proj.weight"));
        /* 1 + 8 norms + 4 Mamba * 8 + 2 attention * 4 + 2 MLP * 2 + norm_f + lm_head */
        assert_int_equal(kvf_st_count(f), 1 + 8 + 32 + 8 + 4 + 2);
    }
    kvf_st_close(f);
    kvf_test_rmmodel(d1);
    kvf_test_rmmodel(d2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_corrupt_header),
        cmocka_unit_test(test_tokenizer),
        cmocka_unit_test(test_mkmodel_names_and_determinism),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
