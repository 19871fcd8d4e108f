/* Device layer: CPU alloc/memset/copy, block zeroing of a page list, range
 * zeroing, argument errors; the CUDA path when a GPU is present. */
#include "kvf_device.h"
#include "kvf_norm.h"
#include "kvf_kern_test.h"
#include "kvf_kern.h"
#include "kvf_kern_status.h"
#include "kvf_nccl.h"

#include <stdlib.h>
#include <string.h>

static void test_cpu_basics(void **state)
{
    kvf_device_t dev;
    void *p = NULL;
    unsigned char host[300];
    (void)state;

    assert_int_equal(kvf_device_init(KVF_DEVICE_CPU, 0, &dev), KVF_KERN_OK);
    assert_int_equal(dev.kind, KVF_DEVICE_CPU);
    assert_int_equal(kvf_device_init(KVF_DEVICE_CPU, 1, &dev), KVF_KERN_EINVAL);
    assert_string_equal(kvf_device_kind_name(KVF_DEVICE_CUDA), "cuda");
    assert_int_equal(kvf_device_alloc(&dev, 0, &p), KVF_KERN_EINVAL);
    assert_int_equal(kvf_device_alloc(&dev, 300, &p), KVF_KERN_OK);
    assert_true(((uintptr_t)p % 256) == 0);
    assert_int_equal(kvf_device_memset(&dev, p, 0xab, 300), KVF_KERN_OK);
    assert_int_equal(kvf_device_memcpy(NULL, host, p, 300, KVF_COPY_D2H), KVF_KERN_OK);
    for (int i = 0; i < 300; ++i) {
        assert_int_equal(host[i], 0xab);
    }
    assert_int_equal(kvf_device_memcpy(&dev, host, NULL, 3, KVF_COPY_D2H), KVF_KERN_EINVAL);
    assert_int_equal(kvf_device_sync(&dev), KVF_KERN_OK);
    assert_int_equal(kvf_device_bind(&dev), KVF_KERN_OK);
    kvf_device_free(&dev, p);
    kvf_device_free(&dev, NULL);
    assert_string_equal(kvf_kern_strerror(KVF_KERN_EINVAL), "invalid argument");
}

/* Zero pages {1, 4, 4, 6} of an 8-page pool; all other pages keep their bytes. */
static void check_blocks_zero(const kvf_device_t *dev)
{
    const size_t page = 96, pages = 8;
    const int64_t ids[] = {1, 4, 4, 6};
    unsigned char *host = malloc(page * pages);
    void *base = NULL;

    assert_non_null(host);
    assert_int_equal(kvf_device_alloc(dev, page * pages, &base), KVF_KERN_OK);
    assert_int_equal(kvf_device_memset(dev, base, 0xff, page * pages), KVF_KERN_OK);
    assert_int_equal(kvf_blocks_zero(dev, base, page, ids, 4), KVF_KERN_OK);
    assert_int_equal(kvf_blocks_zero(dev, base, page, ids, 0), KVF_KERN_OK);
    assert_int_equal(kvf_device_sync(dev), KVF_KERN_OK);
    assert_int_equal(kvf_device_memcpy(dev, host, base, page * pages, KVF_COPY_D2H), KVF_KERN_OK);
    for (size_t p = 0; p < pages; ++p) {
        int expect = (p == 1 || p == 4 || p == 6) ? 0 : 0xff;
        for (size_t b = 0; b < page; ++b) {
            assert_int_equal(host[p * page + b], expect);
        }
    }
    /* ranges: [10, 13) and [500, 510) */
    {
        const size_t offs[] = {10, 500, 700}, lens[] = {3, 10, 0};
        assert_int_equal(kvf_device_memset(dev, base, 0x11, page * pages), KVF_KERN_OK);
        assert_int_equal(kvf_zero_ranges(dev, base, offs, lens, 3), KVF_KERN_OK);
        assert_int_equal(kvf_device_memcpy(dev, host, base, page * pages, KVF_COPY_D2H),
                         KVF_KERN_OK);
        for (size_t b = 0; b < page * pages; ++b) {
            int zero = (b >= 10 && b < 13) || (b >= 500 && b < 510);
            assert_int_equal(host[b], zero ? 0 : 0x11);
        }
    }
    {
        const int64_t bad[] = {2, -1};
        assert_int_equal(kvf_blocks_zero(dev, base, page, bad, 2), KVF_KERN_EINVAL);
        assert_int_equal(kvf_blocks_zero(dev, NULL, page, ids, 1), KVF_KERN_EINVAL);
        assert_int_equal(kvf_blocks_zero(dev, base, 0, ids, 1), KVF_KERN_EINVAL);
    }
    kvf_device_free(dev, base);
    free(host);
}

static void test_cpu_blocks_zero(void **state)
{
    kvf_device_t dev = kvf_device_cpu();
    (void)state;
    check_blocks_zero(&dev);
    check_blocks_zero(NULL);
}

/* streams, pointer kinds and the NCCL wrapper's argument checks: what runs without a GPU */
static void test_streams_nccl_args(void **state)
{
    kvf_device_t cpu = kvf_device_cpu(), own;
    kvf_nccl_id_t id;
    kvf_nccl_comm_h comm = NULL;
    float host[4] = {0};
    (void)state;

    assert_int_equal(kvf_device_stream_create(&cpu, &own), KVF_KERN_OK);
    assert_int_equal(own.kind, KVF_DEVICE_CPU);
    assert_null(own.stream);
    kvf_device_stream_destroy(&own);
    assert_int_equal(kvf_device_stream_create(NULL, NULL), KVF_KERN_EINVAL);
    assert_false(kvf_device_ptr_is_cuda(host));     /* host memory, with or without CUDA */
    assert_false(kvf_device_ptr_is_cuda(NULL));

    memset(&id, 0, sizeof(id));
    if (!kvf_nccl_available()) {
        assert_int_equal(kvf_nccl_comm_init(&cpu, &id, 1, 0, 1000, &comm), KVF_KERN_EUNSUPPORTED);
        assert_int_equal(kvf_nccl_id_make(&id), KVF_KERN_EUNSUPPORTED);
    } else {
        /* refused before NCCL is touched: a CPU device, bad rank, bad deadline */
        assert_int_equal(kvf_nccl_comm_init(&cpu, &id, 1, 0, 1000, &comm), KVF_KERN_EINVAL);
        kvf_device_t cuda = {KVF_DEVICE_CUDA, 0, NULL};
        assert_int_equal(kvf_nccl_comm_init(&cuda, &id, 2, 2, 1000, &comm), KVF_KERN_EINVAL);
        assert_int_equal(kvf_nccl_comm_init(&cuda, &id, 2, 0, 0, &comm), KVF_KERN_EINVAL);
        assert_int_equal(kvf_nccl_id_make(NULL), KVF_KERN_EINVAL);
        assert_int_equal(kvf_nccl_all_reduce_sum(NULL, host, host, 4), KVF_KERN_EINVAL);
        assert_int_equal(kvf_nccl_all_gather(NULL, host, host, 4), KVF_KERN_EINVAL);
    }
    assert_null(comm);
    assert_true(kvf_nccl_comm_broken(NULL));
    kvf_nccl_comm_destroy(NULL);
    /* the new codes and their status mapping */
    assert_string_equal(kvf_kern_strerror(KVF_KERN_ENCCL), "nccl call failed");
    assert_string_equal(kvf_kern_strerror(KVF_KERN_ETIMEDOUT), "device wait timed out");
    assert_int_equal(kvf_status_from_kern(KVF_KERN_ENCCL), KVF_ERR_NCCL);
    assert_int_equal(kvf_status_from_kern(KVF_KERN_ETIMEDOUT), KVF_ERR_TIMED_OUT);
}

static void test_cuda(void **state)
{
    kvf_device_t dev;
    (void)state;

    if (!kvf_device_cuda_available()) {
        int err = kvf_device_init(KVF_DEVICE_CUDA, 0, &dev);
        assert_true(err == KVF_KERN_EUNSUPPORTED || err == KVF_KERN_ECUDA);
        skip();
    }
    assert_int_equal(kvf_device_init(KVF_DEVICE_CUDA, 0, &dev), KVF_KERN_OK);
    check_blocks_zero(&dev);

    /* RMSNorm on the device equals the CPU version (rows x 300) */
    {
        enum { R = 5, D = 300 };
        kvf_test_rng_t rng = {8};
        float x[R * D], w[D], cpu[R * D], gpu[R * D];
        void *dx, *dw, *dy;
        kvf_test_fill(&rng, x, R * D, -2, 2);
        kvf_test_fill(&rng, w, D, 0.5f, 1.5f);
        assert_int_equal(kvf_rmsnorm(NULL, x, w, cpu, R, D, 1e-5f), KVF_KERN_OK);
        assert_int_equal(kvf_device_alloc(&dev, sizeof(x), &dx), KVF_KERN_OK);
        assert_int_equal(kvf_device_alloc(&dev, sizeof(w), &dw), KVF_KERN_OK);
        assert_int_equal(kvf_device_alloc(&dev, sizeof(x), &dy), KVF_KERN_OK);
        assert_int_equal(kvf_device_memcpy(&dev, dx, x, sizeof(x), KVF_COPY_H2D), KVF_KERN_OK);
        assert_int_equal(kvf_device_memcpy(&dev, dw, w, sizeof(w), KVF_COPY_H2D), KVF_KERN_OK);
        assert_int_equal(kvf_rmsnorm(&dev, dx, dw, dy, R, D, 1e-5f), KVF_KERN_OK);
        assert_int_equal(kvf_device_sync(&dev), KVF_KERN_OK);
        assert_int_equal(kvf_device_memcpy(&dev, gpu, dy, sizeof(x), KVF_COPY_D2H), KVF_KERN_OK);
        kvf_test_assert_close_f(gpu, cpu, R * D, 1e-5, 1e-5, "cuda rmsnorm");
        kvf_device_free(&dev, dx);
        kvf_device_free(&dev, dw);
        kvf_device_free(&dev, dy);
    }
    /* every other kernel against its CPU twin: tests/gpu/gpu_vs_cpu.c */
}

static char report_call[256];
static char report_error[256];
static int report_count;

static void record_report(const char *call, const char *error)
{
    snprintf(report_call, sizeof(report_call), "%s", call);
    snprintf(report_error, sizeof(report_error), "%s", error);
    report_count++;
}

/* A failed CUDA call is reported once, where it fails, with the call and
 * cudaGetErrorString(), and mapped to KVF_KERN_ENOMEM / KVF_KERN_ECUDA. */
static void test_cuda_error_report(void **state)
{
    kvf_device_t dev;
    void *p = NULL;
    (void)state;

    report_count = 0;
    kvf_kern_report("x()", "logged");             /* default reporter: the log, not ours */
    kvf_kern_set_report_func(record_report);
    kvf_kern_report("y(1)", "boom");
    assert_int_equal(report_count, 1);
    assert_string_equal(report_call, "y(1)");
    assert_string_equal(report_error, "boom");
    if (!kvf_device_cuda_available()) {
        kvf_kern_set_report_func(NULL);
        skip();
    }
    assert_int_equal(kvf_device_init(KVF_DEVICE_CUDA, 0, &dev), KVF_KERN_OK);
    report_count = 0;
    /* 1 PiB: no device has it */
    assert_int_equal(kvf_device_alloc(&dev, (size_t)1 << 50, &p), KVF_KERN_ENOMEM);
    assert_null(p);
    assert_int_equal(report_count, 1);
    assert_string_equal(report_call, "cudaMalloc(&ptr, bytes)");
    assert_non_null(strstr(report_error, "memory"));
    /* the error was cleared: the next call is clean */
    assert_int_equal(kvf_device_alloc(&dev, 4096, &p), KVF_KERN_OK);
    kvf_device_free(&dev, p);
    assert_int_equal(report_count, 1);
    kvf_kern_set_report_func(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_basics),
        cmocka_unit_test(test_cpu_blocks_zero),
        cmocka_unit_test(test_streams_nccl_args),
        cmocka_unit_test(test_cuda),
        cmocka_unit_test(test_cuda_error_report),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
