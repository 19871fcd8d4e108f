/*
 * kvf_json: checkpoint JSON in Python's dialect (bare Infinity, -Infinity and
 * NaN; transformers 5's {"__float__": ...}), strict JSON otherwise, and errors
 * that name the file, line, column and what was found.
 */
#include "kvf_json.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

/* kvf_json_parse() with stderr captured into @a log. */
static kvf_status_t parse_logged(const char *text, size_t len, cJSON **root_p, char *log,
                                 size_t log_len)
{
    char path[] = "/tmp/kvf-json-log-XXXXXX";
    int fd = mkstemp(path), saved = dup(STDERR_FILENO);
    kvf_status_t status;
    ssize_t n;

    assert_true((fd >= 0) && (saved >= 0));
    unlink(path);
    assert_true(dup2(fd, STDERR_FILENO) >= 0);
    status = kvf_json_parse(text, len, "cfg.json", root_p);
    assert_true(dup2(saved, STDERR_FILENO) >= 0);
    close(saved);
    n = pread(fd, log, log_len - 1, 0);
    close(fd);
    log[(n > 0) ? n : 0] = '\0';
    return status;
}

static double num_at(const cJSON *root, const char *key, int index)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, key);

    if (index >= 0) {
        it = cJSON_GetArrayItem(it, index);
    }
    assert_true(cJSON_IsNumber(it));
    return it->valuedouble;
}

static void test_python_literals(void **state)
{
    const char *text =
        "{\"time_step_limit\": [0.0, Infinity],\n"
        " \"low\": -Infinity, \"nan\": NaN,\n"
        " \"s\": \"Infinity NaN -Infinity\", \"k\": [NaN,Infinity ,-Infinity]}";
    cJSON *root = NULL;
    (void)state;

    assert_int_equal(kvf_json_parse(text, strlen(text), "cfg.json", &root), KVF_OK);
    assert_true(num_at(root, "time_step_limit", 0) == 0.0);
    assert_true(isinf(num_at(root, "time_step_limit", 1)) && (num_at(root, "time_step_limit", 1) > 0));
    assert_true(isinf(num_at(root, "low", -1)) && (num_at(root, "low", -1) < 0));
    assert_true(isnan(num_at(root, "nan", -1)));
    /* inside strings nothing is rewritten */
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(root, "s")->valuestring,
                        "Infinity NaN -Infinity");
    assert_true(isnan(num_at(root, "k", 0)));
    assert_true(num_at(root, "k", 1) > 1e308);
    assert_true(num_at(root, "k", 2) < -1e308);
    cJSON_Delete(root);
}

static void test_float_objects(void **state)
{
    /* transformers 5's form; an object that merely has the key stays an object */
    const char *text = "{\"a\": [0.0, {\"__float__\": \"Infinity\"}], \"b\": {\"__float__\": "
                       "\"NaN\"}, \"c\": {\"__float__\": \"-Infinity\"},"
                       " \"d\": {\"__float__\": \"1.5\"}, \"e\": {\"__float__\": \"NaN\", \"x\": 1}}";
    cJSON *root = NULL;
    (void)state;

    assert_int_equal(kvf_json_parse(text, strlen(text), NULL, &root), KVF_OK);
    assert_true(isinf(num_at(root, "a", 1)) && (num_at(root, "a", 1) > 0));
    assert_true(isnan(num_at(root, "b", -1)));
    assert_true(isinf(num_at(root, "c", -1)) && (num_at(root, "c", -1) < 0));
    assert_true(cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(root, "d")));
    assert_true(cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(root, "e")));
    cJSON_Delete(root);
}

/* The NaN marker is chosen absent from the file: a string that looks like one stays a string. */
static void test_marker_never_taken_from_the_file(void **state)
{
    const char *text = "{\"a\": \"kvf-nan-0\", \"b\": \"kvf-nan-1\", \"c\": NaN}";
    cJSON *root = NULL;
    (void)state;

    assert_int_equal(kvf_json_parse(text, strlen(text), NULL, &root), KVF_OK);
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(root, "a")->valuestring, "kvf-nan-0");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(root, "b")->valuestring, "kvf-nan-1");
    assert_true(isnan(num_at(root, "c", -1)));
    cJSON_Delete(root);
}

/* Nothing beyond JSON and the three literals: each case is refused at its line and column. */
static void test_refused_with_position(void **state)
{
    static const struct {
        const char *text, *where, *found;
    } cases[] = {
        {"{\n  \"a\": 1,\n  \"b\": [0.0, Infinit]\n}", "cfg.json:3:14:", "found 'Infinit]'"},
        {"{\"a\": 1Infinity}", "cfg.json:1:8:", "found 'Infinity}'"},
        {"{\"a\": Infinityx}", "cfg.json:1:7:", "found 'Infinityx}'"},
        {"{\"a\": inf}", "cfg.json:1:7:", "found 'inf}'"},
        {"{\"a\": - Infinity}", "cfg.json:1:7:", "found '- Infinity}'"},
        {"{\"a\": nan}", "cfg.json:1:7:", "found 'nan}'"},
        {"{\"a\": 1,}", "cfg.json:1:", NULL},   /* cJSON places this one a byte on */
        {"{\"a\": 1} x", "cfg.json:1:10:", "found 'x'"},
        /* a rewritten literal earlier on the line does not move the column */
        {"{\"a\": [Infinity, NaN, -Infinity, oops]}", "cfg.json:1:34:", "found 'oops]}'"},
        /* truncated: the end of the file */
        {"{\n  \"time_step_limit\": [0.0, Infinity", "cfg.json:2:", "found end of file"},
    };
    char log[512];
    (void)state;

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); ++i) {
        cJSON *root = (cJSON *)1;
        kvf_status_t st = parse_logged(cases[i].text, strlen(cases[i].text), &root, log,
                                       sizeof(log));
        if ((st != KVF_ERR_PARSE) || (root != NULL) || (strstr(log, cases[i].where) == NULL) ||
            ((cases[i].found != NULL) && (strstr(log, cases[i].found) == NULL))) {
            fail_msg("case %zu (%s): status %d, log '%s'", i, cases[i].text, (int)st, log);
        }
    }
}

/* A NUL byte inside the text ends nothing early: what follows it is still judged. */
static void test_nul_byte_refused(void **state)
{
    const char text[] = "{\"a\": 1}\0{\"b\": 2}";
    cJSON *root = NULL;
    char log[512];
    (void)state;

    assert_int_equal(parse_logged(text, sizeof(text) - 1, &root, log, sizeof(log)),
                     KVF_ERR_PARSE);
    assert_null(root);
    if (strstr(log, "cfg.json:1:9: not valid JSON: found '?{\"b\": 2}'") == NULL) {
        fail_msg("log '%s'", log);
    }
}

static void test_load_and_print_round_trip(void **state)
{
    char path[] = "/tmp/kvf-json-XXXXXX";
    const char *text = "{\"time_step_limit\": [0.0, Infinity], \"x\": NaN, \"y\": -Infinity,"
                       " \"z\": 2}";
    int fd = mkstemp(path);
    cJSON *root = NULL, *again = NULL;
    char *out;
    (void)state;

    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    assert_int_equal(kvf_json_load(path, 0, &root), KVF_OK);
    assert_int_equal(kvf_json_load(path, 8, &again), KVF_ERR_OUT_OF_RANGE);   /* too large */
    assert_null(again);
    unlink(path);
    assert_int_equal(kvf_json_load(path, 0, &again), KVF_ERR_NOT_FOUND);
    out = kvf_json_print(root);
    assert_non_null(out);
    /* Python's spelling, never cJSON's null */
    assert_non_null(strstr(out, "Infinity"));
    assert_non_null(strstr(out, "NaN"));
    assert_non_null(strstr(out, "-Infinity"));
    assert_null(strstr(out, "null"));
    assert_int_equal(kvf_json_parse(out, strlen(out), "printed", &again), KVF_OK);
    assert_true(isinf(num_at(again, "time_step_limit", 1)));
    assert_true(isnan(num_at(again, "x", -1)));
    assert_true(num_at(again, "y", -1) < -1e308);
    assert_true(num_at(again, "z", -1) == 2.0);
    free(out);
    cJSON_Delete(root);
    cJSON_Delete(again);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_python_literals),
        cmocka_unit_test(test_float_objects),
        cmocka_unit_test(test_marker_never_taken_from_the_file),
        cmocka_unit_test(test_refused_with_position),
        cmocka_unit_test(test_nul_byte_refused),
        cmocka_unit_test(test_load_and_print_round_trip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
