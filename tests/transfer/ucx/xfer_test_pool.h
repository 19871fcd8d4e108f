/*
 * Shared by the device-pool tests (test_xfer_device_pool.c,
 * test_xfer_mem_type.c): the tiny dense model's geometry, the UCX connector's
 * ops and a one-rank connector made for them. Static state: include it once,
 * from the test's .c file, and call xt_setup() from main().
 */
#ifndef XFER_TEST_POOL_H
#define XFER_TEST_POOL_H

#include "kvf_connector_ucx_int.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>
#include <cmocka.h>

static kvf_model_config_t cfg;
static kvf_cache_params_t params;
static const kvf_connector_ops_t *ops;

/* Load the model config and default cache params; non-zero when it cannot. */
static int xt_setup(void)
{
    if (kvf_model_config_load(KVF_SOURCE_DIR "/tests/data/models/tiny-dense.config.json",
                              &cfg) != KVF_OK) {
        return 1;
    }
    kvf_cache_params_default(&cfg, &params);
    ops = kvf_connector_ucx_ops();
    return 0;
}

/* Bytes of @a blocks blocks (slots pages each) of rank 0 of 1; *page_p: one page. */
static size_t xt_pool_bytes(int64_t blocks, size_t *page_p)
{
    kvf_rank_geometry_t g;
    kvf_cache_layout_t layout;
    assert_int_equal(kvf_cache_layout_build(&cfg, &layout), KVF_OK);
    assert_int_equal(kvf_rank_geometry_compute(&cfg, &params, 1, 0, &g), KVF_OK);
    if (page_p != NULL) {
        *page_p = g.page_size;
    }
    return (size_t)blocks * (size_t)layout.slots * g.page_size;
}

/* A one-rank connector @a id in @a role (prefill with its progress thread). */
static kvf_connector_h conn_make(const char *id, kvf_connector_role_t role)
{
    kvf_connector_config_t cc;
    kvf_connector_h conn;

    memset(&cc, 0, sizeof(cc));
    cc.field_mask = KVF_CONNECTOR_CONFIG_FIELD_TIMEOUT_MS;
    if (role == KVF_CONNECTOR_ROLE_PREFILL) {
        cc.field_mask |= KVF_CONNECTOR_CONFIG_FIELD_PROGRESS;
    }
    cc.engine_id = id;
    cc.role = role;
    cc.tp_size = 1;
    cc.cfg = &cfg;
    cc.timeout_ms = 5000;
    cc.progress_thread = true;
    assert_int_equal(ops->create(&cc, &conn), KVF_OK);
    return conn;
}

#endif
