/* Config tables: defaults, environment, flags, units, unknown flags, fields never read
 * from the environment. */
#include "kvf_config.h"
#include "kvf_log.h"
#include "kvf_test_util.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* argv entries must be mutable char *: copy literals into static arrays */
#define ARG(_s) ((char *)(uintptr_t)(const char *)(_s))

typedef struct {
    char    addr[KVF_CONFIG_STR_MAX];
    int     tp;
    int64_t timeout_ms;
    size_t  pool;
    bool    zero;
    double  temp;
} cfg_t;

static const kvf_config_field_t table[] = {
    {"TEST_CFG_ADDR", "tcp://127.0.0.1:5557", "addr", offsetof(cfg_t, addr),
     KVF_CONFIG_TYPE_STRING, 0},
    {"TEST_CFG_TP", "1", "tp", offsetof(cfg_t, tp), KVF_CONFIG_TYPE_INT, 0},
    {"TEST_CFG_TIMEOUT", "30s", "t", offsetof(cfg_t, timeout_ms), KVF_CONFIG_TYPE_TIME, 0},
    {"TEST_CFG_POOL", "64m", "p", offsetof(cfg_t, pool), KVF_CONFIG_TYPE_SIZE, 0},
    {"TEST_CFG_ZERO", "yes", "z", offsetof(cfg_t, zero), KVF_CONFIG_TYPE_BOOL, 0},
    {"TEST_CFG_TEMP", "0.5", "x", offsetof(cfg_t, temp), KVF_CONFIG_TYPE_DOUBLE, 0},
    {NULL, NULL, NULL, 0, 0, 0},
};

static void test_precedence(void **state)
{
    cfg_t c;
    bool done;
    char a0[] = "--test-cfg-tp", a1[] = "4", a2[] = "--test-cfg-zero=no", a3[] = "--test-cfg-timeout", a4[] = "250ms";
    char *argv[] = {a0, a1, a2, a3, a4};
    (void)state;

    setenv("KVF_TEST_CFG_TP", "2", 1);
    setenv("KVF_TEST_CFG_POOL", "2k", 1);
    assert_int_equal(kvf_config_parse(table, "t", 5, argv, &c, &done), KVF_OK);
    assert_false(done);
    assert_string_equal(c.addr, "tcp://127.0.0.1:5557");
    assert_int_equal(c.tp, 4);               /* flag beats env */
    assert_int_equal(c.pool, 2048);          /* env beats default */
    assert_false(c.zero);
    assert_int_equal(c.timeout_ms, 250);
    assert_true(c.temp == 0.5);
    unsetenv("KVF_TEST_CFG_TP");
    unsetenv("KVF_TEST_CFG_POOL");
    assert_int_equal(kvf_config_parse(table, "t", 0, NULL, &c, &done), KVF_OK);
    assert_int_equal(c.timeout_ms, 30000);
    assert_int_equal(c.pool, 64u << 20);
}

/* A KVF_CONFIG_FLAG_NO_ENV field ignores KVF_<NAME> (even an unparsable value), a flag
 * still sets it, and --help shows no "env KVF_<NAME>" for it. */
static void test_no_env(void **state)
{
    static const kvf_config_field_t t2[] = {
        {"TEST_CFG_PORT", "8000", "port", offsetof(cfg_t, tp), KVF_CONFIG_TYPE_INT,
         KVF_CONFIG_FLAG_NO_ENV},
        {"TEST_CFG_POOL", "64m", "p", offsetof(cfg_t, pool), KVF_CONFIG_TYPE_SIZE, 0},
        {NULL, NULL, NULL, 0, 0, 0},
    };
    char a0[] = "--test-cfg-port", a1[] = "9", h0[] = "--help";
    char *argv[] = {a0, a1}, *help[] = {h0};
    char buf[1024] = {0};
    cfg_t c;
    bool done;
    FILE *out, *saved;
    (void)state;

    setenv("KVF_TEST_CFG_PORT", "not-a-port", 1);
    setenv("KVF_TEST_CFG_POOL", "2k", 1);
    assert_int_equal(kvf_config_parse(t2, "t", 0, NULL, &c, &done), KVF_OK);
    assert_int_equal(c.tp, 8000);            /* the default, not the environment */
    assert_int_equal(c.pool, 2048);          /* an ordinary field still reads it */
    assert_int_equal(kvf_config_parse(t2, "t", 2, argv, &c, &done), KVF_OK);
    assert_int_equal(c.tp, 9);
    out = tmpfile();
    assert_non_null(out);
    saved = stdout;
    stdout = out;
    assert_int_equal(kvf_config_parse(t2, "t", 1, help, &c, &done), KVF_OK);
    stdout = saved;
    assert_true(done);
    rewind(out);
    assert_true(fread(buf, 1, sizeof(buf) - 1, out) > 0);
    fclose(out);
    assert_non_null(strstr(buf, "--test-cfg-port"));
    assert_null(strstr(buf, "env KVF_TEST_CFG_PORT"));
    assert_non_null(strstr(buf, "env KVF_TEST_CFG_POOL"));
    unsetenv("KVF_TEST_CFG_PORT");
    unsetenv("KVF_TEST_CFG_POOL");
}

static void test_errors(void **state)
{
    cfg_t c;
    bool done;
    char *bad_flag[] = {ARG("--nope"), ARG("1")};
    char *bad_int[] = {ARG("--test-cfg-tp"), ARG("four")};
    char *no_val[] = {ARG("--test-cfg-tp")};
    char *bad_time[] = {ARG("--test-cfg-timeout"), ARG("5 parsecs")};
    char *positional[] = {ARG("stray")};
    (void)state;

    assert_int_equal(kvf_config_parse(table, "t", 2, bad_flag, &c, &done), KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_config_parse(table, "t", 2, bad_int, &c, &done), KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_config_parse(table, "t", 1, no_val, &c, &done), KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_config_parse(table, "t", 2, bad_time, &c, &done), KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_config_parse(table, "t", 1, positional, &c, &done),
                     KVF_ERR_INVALID_PARAM);
    setenv("KVF_TEST_CFG_ZERO", "maybe", 1);
    assert_int_equal(kvf_config_parse(table, "t", 0, NULL, &c, &done), KVF_ERR_INVALID_PARAM);
    unsetenv("KVF_TEST_CFG_ZERO");
}

/* The one dtype-flag parser: aliases, "auto" and fp8 only where allowed,
 * output untouched on error. */
static void test_dtype_flag(void **state)
{
    kvf_dtype_t d = KVF_DTYPE_FP32;
    (void)state;

    assert_int_equal(kvf_config_dtype("kv-dtype", "bf16", KVF_DTYPE_FP32, 0, &d), KVF_OK);
    assert_int_equal(d, KVF_DTYPE_BF16);
    assert_int_equal(kvf_config_dtype("kv-dtype", "half", KVF_DTYPE_FP32, 0, &d), KVF_OK);
    assert_int_equal(d, KVF_DTYPE_FP16);
    assert_int_equal(kvf_config_dtype("kv-dtype", "auto", KVF_DTYPE_FP32, 0, &d),
                     KVF_ERR_INVALID_PARAM);
    assert_int_equal(d, KVF_DTYPE_FP16);
    assert_int_equal(kvf_config_dtype("kv-dtype", "auto", KVF_DTYPE_FP32, KVF_CONFIG_DTYPE_AUTO,
                                      &d), KVF_OK);
    assert_int_equal(d, KVF_DTYPE_FP32);
    assert_int_equal(kvf_config_dtype("kv-dtype", "fp8", KVF_DTYPE_FP32, KVF_CONFIG_DTYPE_AUTO,
                                      &d), KVF_ERR_INVALID_PARAM);
    assert_int_equal(d, KVF_DTYPE_FP32);
    assert_int_equal(kvf_config_dtype("kv-dtype", "fp8", KVF_DTYPE_FP32, KVF_CONFIG_DTYPE_FP8,
                                      &d), KVF_OK);
    assert_int_equal(d, KVF_DTYPE_FP8);
    assert_int_equal(kvf_config_dtype("ssm-dtype", "int4", KVF_DTYPE_FP32,
                                      KVF_CONFIG_DTYPE_AUTO | KVF_CONFIG_DTYPE_FP8, &d),
                     KVF_ERR_INVALID_PARAM);
    assert_int_equal(d, KVF_DTYPE_FP8);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_precedence),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_no_env),
        cmocka_unit_test(test_dtype_flag),
    };
    kvf_log_init("test");
    return cmocka_run_group_tests(tests, NULL, NULL);
}
