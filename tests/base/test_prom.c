/*
 * kvf_prom: the one Prometheus text writer: numbers as Prometheus' Go client writes them
 * (shortest round trip, no exponent in [1e-4, 1e21)), escaped label values, samples and one
 * histogram renderer (cumulative buckets, +Inf, _sum, _count, bounds cut at le_max).
 */
#include "kvf_prom.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

static void test_numbers(void **state)
{
    static const struct {
        double      v;
        const char *text;
    } cases[] = {
        {0, "0"}, {1, "1"}, {-2.5, "-2.5"}, {0.005, "0.005"}, {0.0001, "0.0001"},
        {0.00025, "0.00025"}, {65536, "65536"}, {4294967296.0, "4294967296"},
        {1e20, "100000000000000000000"}, {1e21, "1e+21"}, {0.00001, "1e-05"},
        {0.1 + 0.2, "0.30000000000000004"}, {1.0 / 3.0, "0.3333333333333333"},
        {9007199254740993.0, "9007199254740992"}, {INFINITY, "+Inf"}, {-INFINITY, "-Inf"},
        {NAN, "NaN"},
    };
    char buf[KVF_PROM_NUM_MAX];

    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); ++i) {
        kvf_prom_num(cases[i].v, buf, sizeof(buf));
        if (strcmp(buf, cases[i].text) != 0) {
            fail_msg("%.17g: '%s', want '%s'", cases[i].v, buf, cases[i].text);
        }
        if (isfinite(cases[i].v)) {
            assert_true(strtod(buf, NULL) == cases[i].v);   /* reads back */
        }
    }
}

/* What @a fn wrote, NUL-terminated (the caller frees). */
static char *capture(void (*fn)(FILE *))
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);

    assert_non_null(f);
    fn(f);
    fclose(f);
    return buf;
}

static void write_samples(FILE *f)
{
    kvf_prom_label_t l[] = {{"model_name", "a \"q\"\\b\nc"}, {"role", NULL}};

    kvf_prom_head(f, "m_total", "counter", "Things.");
    kvf_prom_sample_u64(f, "m_total", l, 2, UINT64_MAX);
    kvf_prom_sample(f, "g", NULL, 0, 0.25);
    kvf_prom_scalar(f, "s", "gauge", "One.", 7);
}

static void test_samples(void **state)
{
    char *t = capture(write_samples);

    (void)state;
    assert_string_equal(t, "# HELP m_total Things.\n# TYPE m_total counter\n"
                           "m_total{model_name=\"a \\\"q\\\"\\\\b\\nc\",role=\"\"} "
                           "18446744073709551615\n"
                           "g 0.25\n"
                           "# HELP s One.\n# TYPE s gauge\ns 7\n");
    free(t);
}

static const double bounds[] = {1, 2, 5, 10};
static const uint64_t buckets[] = {3, 0, 2, 1, 4};   /* per bucket; [4]: above 10 */

static void write_hist(FILE *f)
{
    kvf_prom_label_t l = {"phase", "wire"};
    kvf_prom_hist_t h = {bounds, 4, buckets, 123.5, 10, 0};

    kvf_prom_histogram(f, "h", &l, 1, &h);
    h.le_max = 4;   /* 5 and 10 folded into +Inf */
    kvf_prom_histogram(f, "t", NULL, 0, &h);
}

static void test_histogram(void **state)
{
    char *t = capture(write_hist);

    (void)state;
    assert_string_equal(t, "h_bucket{phase=\"wire\",le=\"1\"} 3\n"
                           "h_bucket{phase=\"wire\",le=\"2\"} 3\n"
                           "h_bucket{phase=\"wire\",le=\"5\"} 5\n"
                           "h_bucket{phase=\"wire\",le=\"10\"} 6\n"
                           "h_bucket{phase=\"wire\",le=\"+Inf\"} 10\n"
                           "h_sum{phase=\"wire\"} 123.5\n"
                           "h_count{phase=\"wire\"} 10\n"
                           "t_bucket{le=\"1\"} 3\nt_bucket{le=\"2\"} 3\nt_bucket{le=\"+Inf\"} 10\n"
                           "t_sum 123.5\nt_count 10\n");
    free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_numbers),
        cmocka_unit_test(test_samples),
        cmocka_unit_test(test_histogram),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
