/* kvf_zero_ranges_batch(): the split of a range (head bytes, 16-byte words,
 * tail bytes) at every alignment and length up to 80 bytes; the CPU path
 * zeroes exactly the ranges; argument errors; with a GPU, the CUDA kernel
 * gives the CPU's bytes for 600 ranges (three launches) of odd offsets and
 * lengths, zero-length ones among them, and a pool whose pages are whole
 * ranges. Without a GPU the CUDA case reports skipped. */
#include "kvf_zero_batch.h"
#include "kvf_kern_test.h"
#include "kvf_kern.h"

#include <stdlib.h>
#include <string.h>

static void test_split(void **state)
{
    (void)state;
    for (uintptr_t a = 0; a < 32; ++a) {
        for (size_t len = 0; len <= 80; ++len) {
            size_t h, w, t;
            kvf_zero_batch_split(0x1000 + a, len, &h, &w, &t);
            assert_int_equal(h + 16 * w + t, len);
            assert_true(h < 16);
            assert_true(t < 16);
            if (len >= h && w > 0) {
                assert_int_equal((0x1000 + a + h) % 16, 0);   /* words are aligned */
            }
            if (t > 0 || w > 0) {
                assert_int_equal(h, (16 - (a % 16)) % 16);    /* head up to the boundary */
            }
        }
    }
}

/* n ranges of a @a size-byte buffer: ascending, disjoint, odd offsets and lengths. */
static size_t make_ranges(size_t n, size_t size, size_t *off, size_t *len, unsigned seed)
{
    size_t at = 0, made = 0;
    for (size_t i = 0; (i < n) && (at < size); ++i) {
        seed = seed * 1103515245u + 12345u;
        size_t gap = (seed >> 8) % 37, l = (seed >> 16) % 301;
        if (i % 50 == 7) {
            l = 0;                                     /* empty ones are skipped */
        }
        if (at + gap + l > size) {
            break;
        }
        off[made] = at + gap;
        len[made] = l;
        at += gap + l;
        made++;
    }
    return made;
}

static void expect_zeroed(unsigned char *want, size_t size, const size_t *off, const size_t *len,
                          size_t n)
{
    memset(want, 0xab, size);
    for (size_t i = 0; i < n; ++i) {
        memset(want + off[i], 0, len[i]);
    }
}

static void test_cpu(void **state)
{
    enum { SIZE = 100000, N = 600 };
    unsigned char *buf = malloc(SIZE), *want = malloc(SIZE);
    size_t off[N], len[N], n;
    kvf_device_t cpu = kvf_device_cpu();

    (void)state;
    assert_non_null(buf);
    assert_non_null(want);
    n = make_ranges(N, SIZE, off, len, 7);
    assert_true(n > 2 * KVF_ZERO_BATCH_MAX);
    memset(buf, 0xab, SIZE);
    assert_int_equal(kvf_zero_ranges_batch(&cpu, buf, off, len, n), KVF_KERN_OK);
    expect_zeroed(want, SIZE, off, len, n);
    assert_memory_equal(buf, want, SIZE);
    assert_int_equal(kvf_zero_ranges_batch(NULL, buf, off, len, n), KVF_KERN_OK);   /* NULL: CPU */
    assert_int_equal(kvf_zero_ranges_batch(&cpu, NULL, off, len, 1), KVF_KERN_EINVAL);
    assert_int_equal(kvf_zero_ranges_batch(&cpu, buf, NULL, len, 1), KVF_KERN_EINVAL);
    assert_int_equal(kvf_zero_ranges_batch(&cpu, buf, off, NULL, 1), KVF_KERN_EINVAL);
    assert_int_equal(kvf_zero_ranges_batch(&cpu, NULL, NULL, NULL, 0), KVF_KERN_OK);
    free(buf);
    free(want);
}

static void test_cuda(void **state)
{
    enum { SIZE = 100000, N = 600, PAGE = 4096, PAGES = 64 };
    unsigned char *host = malloc(PAGE * PAGES), *want = malloc(PAGE * PAGES);
    size_t off[N], len[N], n;
    kvf_device_t dev;
    void *d = NULL;

    (void)state;
    assert_non_null(host);
    assert_non_null(want);
    if (!kvf_device_cuda_available()) {
#ifndef KVF_HAVE_CUDA
        kvf_device_t fake = {KVF_DEVICE_CUDA, 0, NULL};
        size_t o = 0, l = 1;
        assert_int_equal(kvf_zero_ranges_batch(&fake, host, &o, &l, 1), KVF_KERN_EUNSUPPORTED);
#endif
        free(host);
        free(want);
        skip();
    }
    assert_int_equal(kvf_device_init(KVF_DEVICE_CUDA, 0, &dev), KVF_KERN_OK);
    assert_int_equal(kvf_device_alloc(&dev, PAGE * PAGES, &d), KVF_KERN_OK);
    /* odd ranges, three launches */
    n = make_ranges(N, SIZE, off, len, 11);
    assert_true(n > 2 * KVF_ZERO_BATCH_MAX);
    assert_int_equal(kvf_device_memset(&dev, d, 0xab, SIZE), KVF_KERN_OK);
    assert_int_equal(kvf_zero_ranges_batch(&dev, d, off, len, n), KVF_KERN_OK);
    assert_int_equal(kvf_device_sync(&dev), KVF_KERN_OK);
    assert_int_equal(kvf_device_memcpy(&dev, host, d, SIZE, KVF_COPY_D2H), KVF_KERN_OK);
    expect_zeroed(want, SIZE, off, len, n);
    assert_memory_equal(host, want, SIZE);
    /* whole pages and partial tails, as a pull leaves them */
    n = 0;
    for (size_t p = 1; p < PAGES; p += 3) {
        off[n] = p * PAGE + ((p % 2) ? 1000 : 0);
        len[n] = PAGE - ((p % 2) ? 1000 : 0);
        n++;
    }
    assert_int_equal(kvf_device_memset(&dev, d, 0xab, PAGE * PAGES), KVF_KERN_OK);
    assert_int_equal(kvf_zero_ranges_batch(&dev, d, off, len, n), KVF_KERN_OK);
    assert_int_equal(kvf_device_sync(&dev), KVF_KERN_OK);
    assert_int_equal(kvf_device_memcpy(&dev, host, d, PAGE * PAGES, KVF_COPY_D2H), KVF_KERN_OK);
    expect_zeroed(want, PAGE * PAGES, off, len, n);
    assert_memory_equal(host, want, PAGE * PAGES);
    kvf_device_free(&dev, d);
    free(host);
    free(want);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split),
        cmocka_unit_test(test_cpu),
        cmocka_unit_test(test_cuda),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
