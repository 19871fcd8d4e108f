/* Which bytes each thread of the device layer's zeroing kernel writes (kernels/kvf_zero_math.h,
 * the kernel in kvf_device_cuda.cu): for random lists of ranges at every alignment, and grids
 * of several widths, every thread's loop is run here as the kernel runs it (range r by row
 * r, unit u = x, x + X, ...) and each byte written is counted: every byte of every range is
 * written exactly once, nothing outside a range is touched, and every 16-byte store is
 * aligned. Then the CPU twins of the same calls (kvf_zero_ranges, kvf_blocks_zero on the CPU
 * device) zero exactly the ranges; with a GPU, the CUDA kernel gives the CPU's bytes for the
 * same lists at a misaligned base and for pages of 96 and 4096 bytes (without a GPU that
 * case reports skipped). */
#include "kvf_zero_math.h"
#include "kvf_device.h"
#include "kvf_kern_test.h"
#include "kvf_kern.h"

#include <stdlib.h>
#include <string.h>

enum { BUF = 1 << 16 };

/* Run the kernel's loops for ranges [off[r], + len[r]) of a buffer at @a base (an address:
 * alignment matters, memory is not touched) with X threads along x; count writes per byte. */
static void simulate(uintptr_t base, const size_t *off, const size_t *len, size_t n, size_t X,
                     unsigned char *count)
{
    for (size_t r = 0; r < n; ++r) {
        uintptr_t p = base + off[r];
        size_t units = kvf_zero_units(p, len[r]);
        for (size_t x = 0; x < X; ++x) {
            for (size_t u = x; u < units; u += X) {
                size_t o;
                unsigned w = kvf_zero_unit(p, len[r], u, &o);
                assert_true((w == 1) || (w == 16));
                if (w == 16) {
                    assert_int_equal((p + o) % 16, 0);
                }
                assert_true(o + w <= len[r]);
                for (unsigned b = 0; b < w; ++b) {
                    count[off[r] + o + b]++;
                }
            }
        }
    }
}

/* Disjoint random ranges in [0, BUF): lengths 0..@a maxlen, random gaps. */
static size_t random_ranges(kvf_test_rng_t *rng, size_t *off, size_t *len, size_t cap,
                            size_t maxlen)
{
    size_t at = 0, n = 0;
    while (n < cap) {
        size_t gap = (size_t)kvf_test_rand(rng, 0.0f, 40.0f);
        size_t l = (size_t)kvf_test_rand(rng, 0.0f, (float)maxlen + 1.0f);
        if (at + gap + l > BUF) {
            break;
        }
        off[n] = at + gap;
        len[n] = l;
        at += gap + l;
        n++;
    }
    return n;
}

static void test_units_cover_exactly_once(void **state)
{
    enum { CAP = 400 };
    static const size_t grids[] = {1, 3, 16, 255, 256, 1024};
    size_t off[CAP], len[CAP];
    unsigned char *count = malloc(BUF), *want = malloc(BUF);
    kvf_test_rng_t rng = {0x243f6a8885a308d3ull};

    (void)state;
    assert_non_null(count);
    assert_non_null(want);
    for (int trial = 0; trial < 24; ++trial) {
        uintptr_t base = 0x10000 + (uintptr_t)(trial % 16);    /* every alignment mod 16 */
        size_t n = random_ranges(&rng, off, len, CAP, (trial % 3 == 0) ? 40 : 600);
        assert_true(n > 10);
        memset(want, 0, BUF);
        for (size_t r = 0; r < n; ++r) {
            memset(want + off[r], 1, len[r]);
        }
        for (size_t g = 0; g < sizeof(grids) / sizeof(grids[0]); ++g) {
            memset(count, 0, BUF);
            simulate(base, off, len, n, grids[g], count);
            assert_memory_equal(count, want, BUF);   /* once inside, never outside */
        }
    }
    /* the edges: empty, shorter than the head, exactly aligned words, one byte each side */
    static const size_t lens[] = {0, 1, 15, 16, 17, 31, 32, 33, 4096};
    for (uintptr_t a = 0; a < 16; ++a) {
        for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); ++i) {
            size_t o1 = 100, l1 = lens[i];
            memset(count, 0, BUF);
            simulate(0x20000 + a, &o1, &l1, 1, 7, count);
            for (size_t b = 0; b < BUF; ++b) {
                assert_int_equal(count[b], ((b >= o1) && (b < o1 + l1)) ? 1 : 0);
            }
            /* at most 15 head and 15 tail bytes: the rest are words */
            assert_true(kvf_zero_units(0x20000 + a + o1, l1) <= l1 / 16 + 30);
        }
    }
    free(count);
    free(want);
}

static void test_cpu_twins(void **state)
{
    enum { CAP = 300, PAGE = 96, PAGES = 64 };
    size_t off[CAP], len[CAP];
    unsigned char *buf = malloc(BUF), *want = malloc(BUF);
    kvf_test_rng_t rng = {0x13198a2e03707344ull};
    kvf_device_t cpu = kvf_device_cpu();
    int64_t ids[] = {3, 0, 63, 17, 17, 40};

    (void)state;
    assert_non_null(buf);
    assert_non_null(want);
    size_t n = random_ranges(&rng, off, len, CAP, 500);
    memset(buf, 0xab, BUF);
    memcpy(want, buf, BUF);
    for (size_t r = 0; r < n; ++r) {
        memset(want + off[r], 0, len[r]);
    }
    assert_int_equal(kvf_zero_ranges(&cpu, buf, off, len, n), KVF_KERN_OK);
    assert_memory_equal(buf, want, BUF);
    assert_int_equal(kvf_zero_ranges(&cpu, buf, off, len, 0), KVF_KERN_OK);
    assert_int_equal(kvf_zero_ranges(&cpu, buf, NULL, len, 1), KVF_KERN_EINVAL);
    /* pages: a duplicate id is harmless, the others untouched */
    memset(buf, 0xcd, PAGE * PAGES);
    memcpy(want, buf, PAGE * PAGES);
    for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); ++i) {
        memset(want + (size_t)ids[i] * PAGE, 0, PAGE);
    }
    assert_int_equal(kvf_blocks_zero(&cpu, buf, PAGE, ids, sizeof(ids) / sizeof(ids[0])),
                     KVF_KERN_OK);
    assert_memory_equal(buf, want, PAGE * PAGES);
    free(buf);
    free(want);
}

/* One list on the GPU and on the CPU twin, compared over the whole buffer. */
static void gpu_vs_cpu(const kvf_device_t *dev, unsigned char *d, unsigned char *h,
                       unsigned char *back, size_t shift, const size_t *off, const size_t *len,
                       size_t n, const int64_t *ids, size_t nids, size_t page)
{
    kvf_device_t cpu = kvf_device_cpu();

    memset(h, 0xab, BUF);
    assert_int_equal(kvf_device_memcpy(dev, d, h, BUF, KVF_COPY_H2D), KVF_KERN_OK);
    if (ids != NULL) {
        assert_int_equal(kvf_blocks_zero(dev, d + shift, page, ids, nids), KVF_KERN_OK);
        assert_int_equal(kvf_blocks_zero(&cpu, h + shift, page, ids, nids), KVF_KERN_OK);
    } else {
        assert_int_equal(kvf_zero_ranges(dev, d + shift, off, len, n), KVF_KERN_OK);
        assert_int_equal(kvf_zero_ranges(&cpu, h + shift, off, len, n), KVF_KERN_OK);
    }
    assert_int_equal(kvf_device_memcpy(dev, back, d, BUF, KVF_COPY_D2H), KVF_KERN_OK);
    assert_memory_equal(back, h, BUF);
}

static void test_cuda(void **state)
{
    enum { CAP = 300 };
    size_t off[CAP], len[CAP], n;
    unsigned char *h = malloc(BUF), *back = malloc(BUF), *d = NULL;
    kvf_test_rng_t rng = {0xa4093822299f31d0ull};
    int64_t ids[] = {5, 0, 9, 9, 2};
    kvf_device_t dev;

    (void)state;
    assert_non_null(h);
    assert_non_null(back);
    if (!kvf_device_cuda_available()) {
#ifndef KVF_HAVE_CUDA
        kvf_device_t fake = {KVF_DEVICE_CUDA, 0, NULL};
        size_t o = 0, l = 1;
        assert_int_equal(kvf_zero_ranges(&fake, h, &o, &l, 1), KVF_KERN_EUNSUPPORTED);
#endif
        free(h);
        free(back);
        skip();
    }
    assert_int_equal(kvf_device_init(KVF_DEVICE_CUDA, 0, &dev), KVF_KERN_OK);
    assert_int_equal(kvf_device_alloc(&dev, BUF, (void **)&d), KVF_KERN_OK);
    for (size_t shift = 0; shift < 4; ++shift) {   /* 16-byte aligned, then 1, 2, 3 past */
        n = random_ranges(&rng, off, len, CAP, 700);
        for (size_t r = 0; r < n; ++r) {
            len[r] = (off[r] + len[r] + shift > BUF) ? 0 : len[r];
        }
        gpu_vs_cpu(&dev, d, h, back, shift, off, len, n, NULL, 0, 0);
    }
    gpu_vs_cpu(&dev, d, h, back, 0, NULL, NULL, 0, ids, 5, 4096);
    gpu_vs_cpu(&dev, d, h, back, 3, NULL, NULL, 0, ids, 5, 96);
    kvf_device_free(&dev, d);
    free(h);
    free(back);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_units_cover_exactly_once),
        cmocka_unit_test(test_cpu_twins),
        cmocka_unit_test(test_cuda),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
