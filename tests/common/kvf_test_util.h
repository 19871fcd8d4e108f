/* Small helpers shared by the C unit tests. */
#ifndef KVF_TEST_UTIL_H
#define KVF_TEST_UTIL_H

#include "kvf_model_config.h"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdio.h>
#include <cmocka.h>

/* Load tests/data/models/<name>.config.json or fail the test. */
static inline void kvf_test_load_model(const char *name, kvf_model_config_t *cfg)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/tests/data/models/%s.config.json", KVF_SOURCE_DIR, name);
    assert_int_equal(kvf_model_config_load(path, cfg), KVF_OK);
}

#endif
