/* Shared setup for the page pool tests: tiny-hybrid geometry (2 KV heads of
 * 32, 8 Mamba heads of 32, state 16, 2 groups, conv 4; fp32 conv/SSM): TP1
 * A1 = 2 * 2 * 32 * elt, block 80 with bf16 KV, layout "M*M-M*M-" ->
 * slots 2, group 0 attention (layers 1, 5), groups 1, 2 Mamba. */
#ifndef KVF_POOL_TEST_H
#define KVF_POOL_TEST_H

#include "kvf_block_manager.h"
#include "kvf_geometry.h"
#include "kvf_page_pool.h"
#include "kvf_test_util.h"

#include <string.h>

typedef struct {
    kvf_model_config_t  cfg;
    kvf_cache_layout_t  layout;
    kvf_rank_geometry_t geom;
} kvf_pool_test_env_t;

/* kernel_block 0: the default MultipleOf(16) selection */
static inline void kvf_pool_test_env(kvf_pool_test_env_t *e, kvf_dtype_t kv_dtype,
                                     int kernel_block)
{
    kvf_cache_params_t p;

    kvf_test_load_model("tiny-hybrid", &e->cfg);
    assert_int_equal(kvf_cache_layout_build(&e->cfg, &e->layout), KVF_OK);
    kvf_cache_params_default(&e->cfg, &p);
    p.kv_dtype = kv_dtype;
    p.conv_dtype = KVF_DTYPE_FP32;
    p.ssm_dtype = KVF_DTYPE_FP32;
    if (kernel_block > 0) {
        memset(&p.kernel_sizes, 0, sizeof(p.kernel_sizes));
        p.kernel_sizes.num_exact = 1;
        p.kernel_sizes.exact[0] = kernel_block;
    }
    assert_int_equal(kvf_rank_geometry_compute(&e->cfg, &p, 1, 0, &e->geom), KVF_OK);
}

static inline kvf_block_manager_h kvf_pool_test_bm(const kvf_pool_test_env_t *e, int num_blocks)
{
    kvf_block_manager_params_t bp = {
        .field_mask = KVF_BLOCK_MANAGER_PARAM_FIELD_NUM_BLOCKS |
                      KVF_BLOCK_MANAGER_PARAM_FIELD_BLOCK_SIZE |
                      KVF_BLOCK_MANAGER_PARAM_FIELD_LAYOUT,
        .num_blocks = num_blocks,
        .block_size = e->geom.block_size,
        .layout = &e->layout,
    };
    kvf_block_manager_h bm = NULL;
    assert_int_equal(kvf_block_manager_create(&bp, &bm), KVF_OK);
    return bm;
}

static inline kvf_page_pool_h kvf_pool_test_pool(const kvf_pool_test_env_t *e, int num_blocks,
                                                 bool no_zero)
{
    kvf_page_pool_params_t pp;
    kvf_page_pool_h pool = NULL;

    kvf_page_pool_params_init(&e->geom, &e->layout, num_blocks, &pp);
    if (no_zero) {
        pp.field_mask |= KVF_PAGE_POOL_PARAM_FIELD_NO_ZERO;
        pp.disable_zeroing = true;
    }
    assert_int_equal(kvf_page_pool_create(&pp, &pool), KVF_OK);
    return pool;
}

#endif
