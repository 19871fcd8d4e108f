/*
 * The model's device plumbing without a GPU: kvf_model_device_open() parses
 * and refuses by value; a model asked onto a CUDA device that is not there
 * (no GPU here, or no CUDA built in) fails before its weights are read, at
 * TP 1 (rank 0's device cannot be made current) and TP 2 (rank 1's GPU
 * named), leaving no model and no leak (the ASan build checks); a CPU
 * device value is the CPU path: every rank and pool on the CPU.
 */
#include "kvf_model_test_util.h"
#include "kvf_model.h"
#include "kvf_tp_runner.h"

#include <string.h>

static void test_device_open_values(void **state)
{
    kvf_device_t dev = {KVF_DEVICE_CUDA, 7, NULL};
    (void)state;
    assert_int_equal(kvf_model_device_open("--device", "cpu", &dev), KVF_OK);
    assert_int_equal(dev.kind, KVF_DEVICE_CPU);
    assert_int_equal(dev.ordinal, 0);
    static const char *const bad[] = {"", "gpu", "cuda:", "cuda:x", "cuda:-1", "cuda:1x",
                                      "CUDA", "cpu:0", "cuda:99999999999"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); ++i) {
        assert_int_equal(kvf_model_device_open("--device", bad[i], &dev), KVF_ERR_INVALID_PARAM);
    }
    assert_int_equal(kvf_model_device_open("--device", NULL, &dev), KVF_ERR_INVALID_PARAM);
    if (!kvf_device_cuda_available()) {
        /* no GPU (or no CUDA built in): refused, nothing written */
        dev = kvf_device_cpu();
        assert_int_not_equal(kvf_model_device_open("--device", "cuda:0", &dev), KVF_OK);
        assert_int_equal(dev.kind, KVF_DEVICE_CPU);
    }
}

/* the CPU device value is the CPU path: every rank on the CPU, pools on the CPU */
static void test_cpu_device_is_cpu(void **state)
{
    char dir[256];
    kvf_device_t cpu = kvf_device_cpu();
    kvf_model_h m = NULL;
    kvf_tp_runner_h r = NULL;
    kvf_tp_runner_params_t rp = {0};
    (void)state;
    kvf_test_mkmodel("tiny-hybrid", 5, dir);
    assert_int_equal(kvf_model_load_device(dir, 2, &cpu, &m), KVF_OK);
    assert_int_equal(kvf_model_device(m)->kind, KVF_DEVICE_CPU);
    for (int i = 0; i < 2; ++i) {
        assert_int_equal(kvf_model_rank_device(m, i)->kind, KVF_DEVICE_CPU);
    }
    rp.model = m;
    rp.field_mask = KVF_TP_RUNNER_PARAM_FIELD_NUM_BLOCKS;
    rp.num_blocks = 8;
    assert_int_equal(kvf_tp_runner_create(&rp, &r), KVF_OK);
    for (int i = 0; i < 2; ++i) {
        assert_int_equal(kvf_page_pool_device(kvf_tp_runner_pool(r, i))->kind, KVF_DEVICE_CPU);
    }
    kvf_tp_runner_destroy(r);
    kvf_model_destroy(m);
    kvf_test_rmmodel(dir);
}

/* onto a CUDA device that cannot be used: an error, no model, nothing leaked (ASan) */
static void test_cuda_without_gpu_fails_clean(void **state)
{
    static const char *const models[] = {"tiny-hybrid", "tiny-moe", "tiny-qwen3"};
    const kvf_device_t cuda = {KVF_DEVICE_CUDA, 0, NULL};
    (void)state;
    if (kvf_device_cuda_available()) {
        skip();   /* a GPU: tests/gpu/run.sh compares the GPU run there */
    }
    for (size_t i = 0; i < sizeof(models) / sizeof(models[0]); ++i) {
        char dir[256];
        kvf_model_h m = NULL;
        kvf_test_mkmodel(models[i], 5, dir);
        for (int tp = 1; tp <= 2; ++tp) {
            kvf_status_t st = kvf_model_load_device(dir, tp, &cuda, &m);
            assert_int_not_equal(st, KVF_OK);
            assert_true((st == KVF_ERR_CUDA) || (st == KVF_ERR_UNSUPPORTED) ||
                        (st == KVF_ERR_NO_MEMORY));
            assert_null(m);
        }
        kvf_test_rmmodel(dir);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_device_open_values),
        cmocka_unit_test(test_cpu_device_is_cpu),
        cmocka_unit_test(test_cuda_without_gpu_fails_clean),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
