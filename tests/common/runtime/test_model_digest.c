/*
 * Model digest (kvf_fingerprint.h): what it covers, its exact format, and
 * its cache file — reused while every covered file's size and mtime match,
 * recomputed when a file changes, is added or removed, or the cache is
 * damaged; a cache that cannot be written is no error.
 *
 * Also a benchmark (not run by ctest):
 *   test_model_digest --bench DIR...        time of each folder's digest,
 *                                           computed (no cache) and cached
 *   test_model_digest --bench-gib N         the same for a synthetic folder
 *                                           holding an N GiB model.safetensors
 */
#define XXH_STATIC_LINKING_ONLY
#include "kvf_fingerprint.h"

#include "kvf_log.h"
#include "kvf_time.h"

#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#include <cmocka.h>

static char dir[256];

static void put_file(const char *name, const void *data, size_t len)
{
    char path[512];
    FILE *f;

    snprintf(path, sizeof(path), "%s/%s", dir, name);
    f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}

/* Set a file's mtime to @a sec seconds (a coarse clock cannot hide a change then). */
static void set_mtime(const char *name, time_t sec)
{
    char path[512];
    struct timespec ts[2] = {{sec, 0}, {sec, 0}};

    snprintf(path, sizeof(path), "%s/%s", dir, name);
    assert_int_equal(utimensat(AT_FDCWD, path, ts, 0), 0);
}

static void rm_rf(const char *d)
{
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", d);
    assert_int_equal(system(cmd), 0);
}

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof(dir), "/tmp/kvf-digest-XXXXXX");
    assert_non_null(mkdtemp(dir));
    put_file("config.json", "{\"model_type\": \"llama\"}", 23);
    put_file("tokenizer.json", "{\"model\": {}}", 13);
    put_file("model.safetensors", "WEIGHTS-0123456789", 18);
    put_file("README.md", "not covered", 11);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    rm_rf(dir);
    return 0;
}

/* The format, computed here independently: name, NUL, size LE64, bytes; names sorted. */
static void expected_hex(char *hex)
{
    static const struct { const char *name, *data; size_t len; } files[] = {
        {"config.json", "{\"model_type\": \"llama\"}", 23},
        {"model.safetensors", "WEIGHTS-0123456789", 18},
        {"tokenizer.json", "{\"model\": {}}", 13},
    };
    XXH3_state_t st;
    XXH128_canonical_t c;

    XXH3_128bits_reset(&st);
    for (size_t i = 0; i < 3; ++i) {
        uint8_t le[8];
        for (int b = 0; b < 8; ++b) {
            le[b] = (uint8_t)((uint64_t)files[i].len >> (8 * b));
        }
        XXH3_128bits_update(&st, files[i].name, strlen(files[i].name) + 1);
        XXH3_128bits_update(&st, le, 8);
        XXH3_128bits_update(&st, files[i].data, files[i].len);
    }
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(&st));
    for (int i = 0; i < 16; ++i) {
        snprintf(hex + 2 * i, 3, "%02x", c.digest[i]);
    }
}

static void test_format_and_cache(void **state)
{
    kvf_model_digest_t a, b, c;
    char expect[KVF_MODEL_DIGEST_HEX + 1], cache[512];
    struct stat st;

    (void)state;
    expected_hex(expect);
    assert_int_equal(kvf_model_digest(dir, 0, &a), KVF_OK);
    assert_string_equal(a.hex, expect);
    assert_false(a.from_cache);
    assert_true(a.cache_written);
    assert_int_equal(a.num_files, 3);              /* README.md is not covered */
    assert_int_equal(a.bytes, 23 + 13 + 18);
    assert_non_null(strstr(a.path, "/kvf-digest-"));
    snprintf(cache, sizeof(cache), "%s/%s", dir, KVF_MODEL_DIGEST_FILE);
    assert_int_equal(stat(cache, &st), 0);

    /* reused while sizes and mtimes match, whatever else changes in the folder */
    put_file("README.md", "changed, still not covered", 26);
    assert_int_equal(kvf_model_digest(dir, 0, &b), KVF_OK);
    assert_true(b.from_cache);
    assert_string_equal(b.hex, a.hex);

    /* the weights change (a new mtime): recomputed, a new digest, cached again */
    put_file("model.safetensors", "WEIGHTS-9876543210", 18);
    set_mtime("model.safetensors", 1000000000);
    assert_int_equal(kvf_model_digest(dir, 0, &c), KVF_OK);
    assert_false(c.from_cache);
    assert_true(c.cache_written);
    assert_string_not_equal(c.hex, a.hex);
    assert_int_equal(kvf_model_digest(dir, 0, &b), KVF_OK);
    assert_true(b.from_cache);
    assert_string_equal(b.hex, c.hex);

    /* same size and mtime but other bytes: the cache is trusted (what it keys on) ... */
    put_file("model.safetensors", "WEIGHTS-0123456789", 18);
    set_mtime("model.safetensors", 1000000000);
    assert_int_equal(kvf_model_digest(dir, 0, &b), KVF_OK);
    assert_true(b.from_cache);
    assert_string_equal(b.hex, c.hex);
    /* ... and NO_CACHE reads the bytes: the original digest again, cache untouched */
    assert_int_equal(kvf_model_digest(dir, KVF_MODEL_DIGEST_NO_CACHE, &b), KVF_OK);
    assert_false(b.from_cache);
    assert_false(b.cache_written);
    assert_string_equal(b.hex, expect);
    assert_int_equal(kvf_model_digest(dir, 0, &b), KVF_OK);
    assert_true(b.from_cache);
    assert_string_equal(b.hex, c.hex);

    /* the tokenizer changes size: recomputed */
    put_file("tokenizer.json", "{\"model\": {\"x\": 1}}", 19);
    assert_int_equal(kvf_model_digest(dir, 0, &b), KVF_OK);
    assert_false(b.from_cache);
    assert_string_not_equal(b.hex, c.hex);

    /* a shard added, then removed: recomputed both times, back to the same digest */
    put_file("model-00002-of-00002.safetensors", "MORE", 4);
    assert_int_equal(kvf_model_digest(dir, 0, &c), KVF_OK);
    assert_false(c.from_cache);
    assert_int_equal(c.num_files, 4);
    assert_string_not_equal(c.hex, b.hex);
    {
        char p[512];
        snprintf(p, sizeof(p), "%s/model-00002-of-00002.safetensors", dir);
        assert_int_equal(unlink(p), 0);
    }
    assert_int_equal(kvf_model_digest(dir, 0, &c), KVF_OK);
    assert_false(c.from_cache);
    assert_string_equal(c.hex, b.hex);
}

static void test_damaged_or_unwritable_cache(void **state)
{
    kvf_model_digest_t a, b;
    char cache[512];

    (void)state;
    assert_int_equal(kvf_model_digest(dir, 0, &a), KVF_OK);
    snprintf(cache, sizeof(cache), "%s/%s", dir, KVF_MODEL_DIGEST_FILE);
    /* garbage, and a well-formed cache holding a forged digest for other files */
    put_file(KVF_MODEL_DIGEST_FILE, "{not json", 9);
    assert_int_equal(kvf_model_digest(dir, 0, &b), KVF_OK);
    assert_false(b.from_cache);
    assert_string_equal(b.hex, a.hex);
    {
        const char *forged = "{\"algorithm\":\"xxh3-128\",\"digest\":"
                             "\"00000000000000000000000000000000\",\"files\":[]}";
        put_file(KVF_MODEL_DIGEST_FILE, forged, strlen(forged));
    }
    assert_int_equal(kvf_model_digest(dir, 0, &b), KVF_OK);
    assert_false(b.from_cache);
    assert_string_equal(b.hex, a.hex);
    /* the cache path cannot be written (a folder is in the way): computed each time */
    assert_int_equal(unlink(cache), 0);
    assert_int_equal(mkdir(cache, 0755), 0);
    for (int i = 0; i < 2; ++i) {
        assert_int_equal(kvf_model_digest(dir, 0, &b), KVF_OK);
        assert_false(b.from_cache);
        assert_false(b.cache_written);
        assert_string_equal(b.hex, a.hex);
    }
    assert_int_equal(rmdir(cache), 0);
}

static void test_refusals(void **state)
{
    kvf_model_digest_t d;
    char p[512];

    (void)state;
    assert_int_equal(kvf_model_digest("/nonexistent/kvf-model", 0, &d), KVF_ERR_NOT_FOUND);
    snprintf(p, sizeof(p), "%s/config.json", dir);
    assert_int_equal(unlink(p), 0);
    assert_int_equal(kvf_model_digest(dir, 0, &d), KVF_ERR_NOT_FOUND);   /* no config */
    put_file("config.json", "{\"model_type\": \"llama\"}", 23);
    snprintf(p, sizeof(p), "%s/model.safetensors", dir);
    assert_int_equal(unlink(p), 0);
    assert_int_equal(kvf_model_digest(dir, 0, &d), KVF_ERR_NOT_FOUND);   /* no weights */
    assert_int_equal(kvf_model_digest(NULL, 0, &d), KVF_ERR_INVALID_PARAM);
}

/* ---- benchmark ------------------------------------------------------------ */

static void bench_one(const char *d)
{
    kvf_model_digest_t a, b;

    if ((kvf_model_digest(d, KVF_MODEL_DIGEST_NO_CACHE, &a) != KVF_OK) ||
        (kvf_model_digest(d, 0, &b) != KVF_OK) || (kvf_model_digest(d, 0, &b) != KVF_OK)) {
        printf("%s: digest failed\n", d);
        return;
    }
    printf("%s: %d files, %.1f MiB: computed %.3f s (%.2f GiB/s), cached %.6f s (%s) -> %s\n",
           a.path, a.num_files, (double)a.bytes / (1 << 20), a.seconds,
           (double)a.bytes / (1 << 30) / (a.seconds > 0 ? a.seconds : 1e-9), b.seconds,
           b.from_cache ? "from the cache file" : "not writable: computed", a.hex);
}

static int bench_gib(int gib)
{
    static uint8_t block[1 << 20];
    char path[512];
    FILE *f;

    snprintf(dir, sizeof(dir), "/tmp/kvf-digest-bench-XXXXXX");
    if (mkdtemp(dir) == NULL) {
        return 1;
    }
    put_file("config.json", "{}", 2);
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    f = fopen(path, "wb");
    for (size_t i = 0; i < sizeof(block); ++i) {
        block[i] = (uint8_t)(i * 2654435761u >> 13);
    }
    for (int i = 0; (f != NULL) && (i < gib * 1024); ++i) {
        block[0] = (uint8_t)i;
        if (fwrite(block, 1, sizeof(block), f) != sizeof(block)) {
            break;
        }
    }
    if ((f == NULL) || (fclose(f) != 0)) {
        return 1;
    }
    bench_one(dir);   /* the file was just written: it is in the page cache */
    rm_rf(dir);
    return 0;
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_format_and_cache, setup, teardown),
        cmocka_unit_test_setup_teardown(test_damaged_or_unwritable_cache, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refusals, setup, teardown),
    };

    kvf_log_init("test");
    if ((argc >= 3) && (strcmp(argv[1], "--bench-gib") == 0)) {
        return bench_gib(atoi(argv[2]));
    }
    if ((argc >= 3) && (strcmp(argv[1], "--bench") == 0)) {
        for (int i = 2; i < argc; ++i) {
            bench_one(argv[i]);
        }
        return 0;
    }
    return cmocka_run_group_tests(tests, NULL, NULL);
}
