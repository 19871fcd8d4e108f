/*
 * kvf-proxy vLLM-equivalent series (kvf_proxy_export.c): the transfer
 * counters and the bytes-per-transfer histogram, rendered without a pool.
 * Expected lines are written out by hand from the bucket bounds (64 KiB,
 * 256 KiB, ..., 4 GiB) and the Prometheus text format.
 */
#include "kvf_proxy_export.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

static char *render(const char *model_name)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);

    assert_non_null(f);
    kvf_proxy_export_render(NULL, model_name, f);
    fclose(f);
    return buf;
}

static void test_transfer_series(void **state)
{
    char *t;

    (void)state;
    t = render("m");
    assert_non_null(strstr(t, "kvf_kv_transfers_total{model_name=\"m\"} 0\n"));
    assert_non_null(strstr(t, "kvf_kv_transfer_bytes_count{model_name=\"m\"} 0\n"));
    assert_non_null(strstr(t, "# TYPE kvf_kv_transfer_bytes histogram\n"));
    assert_non_null(strstr(t, "# TYPE kvf_num_requests_waiting gauge\n"));   /* no pool: no samples */
    assert_null(strstr(t, "kvf_num_requests_waiting{"));
    free(t);

    kvf_proxy_export_transfer(65536, false);          /* on the first bound: le="65536" */
    kvf_proxy_export_transfer(65537, false);          /* just above: le="262144" */
    kvf_proxy_export_transfer(5000000000ULL, false);  /* above 4 GiB: +Inf only */
    kvf_proxy_export_transfer(1000, true);            /* failed: counted, not in the histogram */
    t = render("m");
    assert_non_null(strstr(t, "kvf_kv_transfers_total{model_name=\"m\"} 4\n"));
    assert_non_null(strstr(t, "kvf_kv_failed_transfers_total{model_name=\"m\"} 1\n"));
    assert_non_null(strstr(t, "kvf_kv_transfer_bytes_bucket{model_name=\"m\",le=\"65536\"} 1\n"));
    assert_non_null(strstr(t, "kvf_kv_transfer_bytes_bucket{model_name=\"m\",le=\"262144\"} 2\n"));
    assert_non_null(strstr(t, "kvf_kv_transfer_bytes_bucket{model_name=\"m\",le=\"4294967296\"} 2\n"));
    assert_non_null(strstr(t, "kvf_kv_transfer_bytes_bucket{model_name=\"m\",le=\"+Inf\"} 3\n"));
    assert_non_null(strstr(t, "kvf_kv_transfer_bytes_sum{model_name=\"m\"} 5000131073\n"));
    assert_non_null(strstr(t, "kvf_kv_transfer_bytes_count{model_name=\"m\"} 3\n"));
    free(t);
}

static void test_label_escaped(void **state)
{
    char *t;

    (void)state;
    t = render("a\"b\\c\nd");
    assert_non_null(strstr(t, "kvf_kv_transfers_total{model_name=\"a\\\"b\\\\c\\nd\"} "));
    free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_transfer_series),
        cmocka_unit_test(test_label_escaped),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
