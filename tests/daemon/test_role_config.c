/*
 * The test switch that disables fresh-block zeroing is a hidden row of the
 * role daemons' config table (TEST_NO_BLOCK_ZERO), not a raw getenv: it is
 * accepted by flag and by KVF_ variable, a bad value or a misspelt flag is
 * refused naming it, and --help / --print-config do not list it. Checked on
 * the shared rows (KVF_ROLE_CONFIG_FIELDS) and on both daemons' binaries. --device
 * values are accepted or refused by value (test_device_flag).
 */
#include "kvf_role.h"

#include "kvf_log.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <cmocka.h>

typedef struct {
    kvf_role_config_t role;
} cfg_t;

static const kvf_config_field_t table[] = {
    KVF_ROLE_CONFIG_FIELDS(cfg_t, "tcp://127.0.0.1:5557", "role-test"),
    {NULL, NULL, NULL, 0, 0, 0},
};

static kvf_status_t parse(int argc, const char **argv, cfg_t *c)
{
    bool exit_now = false;
    memset(c, 0, sizeof(*c));
    return kvf_config_parse(table, "role-test", argc, (char **)argv, c, &exit_now);
}

static void test_hidden_row(void **state)
{
    cfg_t c;
    const char *on[] = {"--test-no-block-zero"};
    const char *off[] = {"--test-no-block-zero=no"};
    const char *bad[] = {"--test-no-block-zero=maybe"};
    const char *typo[] = {"--test-no-block-zer"};
    char *text = NULL;
    size_t len = 0;
    FILE *f;

    (void)state;
    unsetenv("KVF_TEST_NO_BLOCK_ZERO");
    assert_int_equal(parse(0, NULL, &c), KVF_OK);
    assert_false(c.role.test_no_block_zero);          /* default: zeroing on */
    assert_int_equal(parse(1, on, &c), KVF_OK);
    assert_true(c.role.test_no_block_zero);
    assert_int_equal(parse(1, off, &c), KVF_OK);
    assert_false(c.role.test_no_block_zero);
    assert_int_equal(parse(1, bad, &c), KVF_ERR_INVALID_PARAM);
    assert_int_equal(parse(1, typo, &c), KVF_ERR_INVALID_PARAM);

    setenv("KVF_TEST_NO_BLOCK_ZERO", "yes", 1);
    assert_int_equal(parse(0, NULL, &c), KVF_OK);
    assert_true(c.role.test_no_block_zero);
    assert_int_equal(parse(1, off, &c), KVF_OK);      /* the flag wins over the variable */
    assert_false(c.role.test_no_block_zero);
    setenv("KVF_TEST_NO_BLOCK_ZERO", "maybe", 1);
    assert_int_equal(parse(0, NULL, &c), KVF_ERR_INVALID_PARAM);
    unsetenv("KVF_TEST_NO_BLOCK_ZERO");

    /* hidden: the effective config shows the others, not this one */
    assert_int_equal(parse(1, on, &c), KVF_OK);
    f = open_memstream(&text, &len);
    assert_non_null(f);
    kvf_config_print(table, &c, f);
    fclose(f);
    assert_non_null(strstr(text, "KVF_XFER_TIMEOUT="));
    assert_null(strstr(text, "NO_BLOCK_ZERO"));
    free(text);
}

/* Run "<bin> <args>" with stderr folded in; returns the exit code, *out the text. */
static int run(const char *cmd, char *out, size_t cap)
{
    FILE *p = popen(cmd, "r");
    size_t n;
    int rc;

    assert_non_null(p);
    n = fread(out, 1, cap - 1, p);
    out[n] = '\0';
    rc = pclose(p);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static void test_daemons(void **state)
{
    const char *bin = getenv("KVF_BIN");
    const char *daemons[] = {"kvf-prefill", "kvf-decode"};
    static char out[65536];
    char cmd[1024];

    (void)state;
    if (bin == NULL) {
        skip();
    }
    for (int i = 0; i < 2; ++i) {
        snprintf(cmd, sizeof(cmd), "env -u KVF_TEST_NO_BLOCK_ZERO %s/%s --test-no-block-zero "
                 "--print-config 2>&1", bin, daemons[i]);
#ifndef KVF_FAULT_INJECTION   /* a release build refuses the test-only switch by name */
        assert_int_equal(run(cmd, out, sizeof(out)), 2);
        assert_non_null(strstr(out, "--test-no-block-zero is a test-only switch"));
        continue;
#endif
        assert_int_equal(run(cmd, out, sizeof(out)), 0);
        assert_non_null(strstr(out, "KVF_XFER_TIMEOUT="));
        assert_null(strstr(out, "NO_BLOCK_ZERO"));
        snprintf(cmd, sizeof(cmd), "%s/%s --help 2>&1", bin, daemons[i]);
        assert_int_equal(run(cmd, out, sizeof(out)), 0);
        assert_null(strstr(out, "no-block-zero"));
        snprintf(cmd, sizeof(cmd), "%s/%s --test-no-block-zer --print-config 2>&1", bin,
                 daemons[i]);
        assert_int_equal(run(cmd, out, sizeof(out)), 2);
        assert_non_null(strstr(out, "unknown flag '--test-no-block-zer'"));
        snprintf(cmd, sizeof(cmd), "KVF_TEST_NO_BLOCK_ZERO=maybe %s/%s --print-config 2>&1",
                 bin, daemons[i]);
        assert_int_equal(run(cmd, out, sizeof(out)), 2);
        assert_non_null(strstr(out, "KVF_TEST_NO_BLOCK_ZERO"));
        assert_non_null(strstr(out, "maybe"));
    }
}

/* Two durations that contradict each other are refused; equal or longer pass. */
static void test_not_shorter(void **state)
{
    (void)state;
    assert_int_equal(kvf_role_check_not_shorter("--lease-timeout", 10000, "--xfer-timeout",
                                                10000, "x"), KVF_OK);
    assert_int_equal(kvf_role_check_not_shorter("--lease-timeout", 30000, "--xfer-timeout",
                                                10000, "x"), KVF_OK);
    assert_int_equal(kvf_role_check_not_shorter("--lease-timeout", 9999, "--xfer-timeout",
                                                10000, "x"), KVF_ERR_INVALID_PARAM);
}

/*
 * kvf-prefill refuses contradicting timeouts at start, by flag or by KVF_
 * variable, naming both values, before it loads a model (the model folder
 * given does not exist: a consistent config fails on that instead).
 * KVF_INSECURE=yes: no key set needed to get that far.
 */
static void test_daemon_contradictions(void **state)
{
    const char *bin = getenv("KVF_BIN");
    static const struct {
        const char *args, *want;
    } cases[] = {
        {"--lease-timeout 5s --xfer-timeout 10s",
         "--lease-timeout 5000 ms is shorter than --xfer-timeout 10000 ms: a lease would expire "
         "during a transfer"},
        {"--lease-timeout=2500ms",   /* against the default --xfer-timeout 10s */
         "--lease-timeout 2500 ms is shorter than --xfer-timeout 10000 ms"},
        {"--max-quarantine 5s --xfer-timeout 10s",
         "--max-quarantine 5000 ms is shorter than --xfer-timeout 10000 ms: a read still in "
         "flight could land in reused blocks"},
    };
    static char out[65536];
    char cmd[1024];

    (void)state;
    if (bin == NULL) {
        skip();
    }
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); ++i) {
        snprintf(cmd, sizeof(cmd), "KVF_INSECURE=yes %s/kvf-prefill --model /nonexistent-kvf-model "
                 "%s 2>&1", bin, cases[i].args);
        assert_int_equal(run(cmd, out, sizeof(out)), 1);
        if (strstr(out, cases[i].want) == NULL) {
            fail_msg("'%s' printed:\n%s\nnot: %s", cmd, out, cases[i].want);
        }
    }
    snprintf(cmd, sizeof(cmd), "KVF_INSECURE=yes KVF_LEASE_TIMEOUT=4s KVF_XFER_TIMEOUT=6s "
             "%s/kvf-prefill --model /nonexistent-kvf-model 2>&1", bin);
    assert_int_equal(run(cmd, out, sizeof(out)), 1);
    assert_non_null(strstr(out, "--lease-timeout 4000 ms is shorter than --xfer-timeout 6000 ms"));
    /* consistent: refused for the missing model, not for the timeouts */
    snprintf(cmd, sizeof(cmd), "KVF_INSECURE=yes %s/kvf-prefill --model /nonexistent-kvf-model "
             "--lease-timeout 3s --xfer-timeout 1s 2>&1", bin);
    assert_int_not_equal(run(cmd, out, sizeof(out)), 0);
    assert_null(strstr(out, "is shorter than"));
}

/* --device: cpu, cuda, cuda:N (N in 0..1023) accepted by flag and KVF_DEVICE; the rest refused */
static void test_device_flag(void **state)
{
    static const char *const good[] = {"cpu", "cuda", "cuda:0", "cuda:7", "cuda:1023"};
    static const char *const bad[] = {"gpu", "cuda:", "cuda:x", "cuda:-1", "cuda:1024",
                                      "cuda:1e3", "cuda 0", "CUDA", "cuda0", ""};
    cfg_t c;

    (void)state;
    unsetenv("KVF_DEVICE");
    {
        const char *none[] = {"--model", "m"};
        assert_int_equal(parse(2, none, &c), KVF_OK);
        assert_string_equal(c.role.device, "cpu");     /* the default */
    }
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); ++i) {
        const char *argv[] = {"--model", "m", "--device", good[i]};
        assert_int_equal(parse(4, argv, &c), KVF_OK);
        assert_string_equal(c.role.device, good[i]);
        assert_int_equal(kvf_role_check_flags(&c.role), KVF_OK);
    }
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); ++i) {
        const char *argv[] = {"--model", "m", "--device", bad[i]};
        kvf_status_t st = parse(4, argv, &c);
        if (st == KVF_OK) {
            st = kvf_role_check_flags(&c.role);
        }
        if (st != KVF_ERR_INVALID_PARAM) {
            fail_msg("--device '%s' accepted", bad[i]);
        }
    }
    setenv("KVF_DEVICE", "cuda:2", 1);
    {
        const char *argv[] = {"--model", "m"};
        assert_int_equal(parse(2, argv, &c), KVF_OK);
        assert_string_equal(c.role.device, "cuda:2");
    }
    setenv("KVF_DEVICE", "tpu", 1);
    {
        const char *argv[] = {"--model", "m"};
        assert_int_equal(parse(2, argv, &c), KVF_OK);
        assert_int_equal(kvf_role_check_flags(&c.role), KVF_ERR_INVALID_PARAM);
    }
    unsetenv("KVF_DEVICE");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hidden_row),
        cmocka_unit_test(test_daemons),
        cmocka_unit_test(test_not_shorter),
        cmocka_unit_test(test_daemon_contradictions),
        cmocka_unit_test(test_device_flag),
    };
    kvf_log_init("test");
    return cmocka_run_group_tests(tests, NULL, NULL);
}
