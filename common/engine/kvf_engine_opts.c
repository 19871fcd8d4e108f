/* The engine options' parsers (kvf_engine_opts.h). */
#include "kvf_engine_opts.h"
#include "kvf_engine.h"
#include "kvf_log.h"

#include <stdlib.h>
#include <string.h>

/* The table's text default and the engine's number must not drift apart. */
_Static_assert(KVF_PREFIX_STATE_GRID_DEFAULT == 64,
               "KVF_ENGINE_PREFIX_STATE_GRID_DEFAULT is \"64\": change both");

kvf_status_t kvf_engine_opts_dtype(const char *flag, const char *text, kvf_dtype_t dflt,
                                   bool computes, kvf_dtype_t *dtype_p)
{
    kvf_dtype_t dtype;

    if (kvf_config_dtype(flag, text, dflt, KVF_CONFIG_DTYPE_AUTO | KVF_CONFIG_DTYPE_FP8,
                         &dtype) != KVF_OK) {
        return KVF_ERR_INVALID_PARAM;
    }
    if (computes && (dtype == KVF_DTYPE_FP8)) {
        kvf_error("bad value '%s' for --%s: the engine does not compute in fp8 (fp32, bf16, "
                  "fp16 here; kvf plan and kvf xfer-test take fp8 to plan and move caches)",
                  text, flag);
        return KVF_ERR_INVALID_PARAM;
    }
    *dtype_p = dtype;
    return KVF_OK;
}

kvf_status_t kvf_engine_opts_block_sizes(int block_size, int exact_block_size)
{
    if (block_size < 1) {
        kvf_error("bad value %d for --block-size: the alignment unit, tokens, must be at "
                  "least 1", block_size);
        return KVF_ERR_INVALID_PARAM;
    }
    if (exact_block_size < 0) {
        kvf_error("bad value %d for --exact-block-size: tokens, must be positive (0: derive)",
                  exact_block_size);
        return KVF_ERR_INVALID_PARAM;
    }
    return KVF_OK;
}

kvf_status_t kvf_engine_opts_kv_layout(const char *text, kvf_kv_layout_t *layout_p)
{
    return kvf_kv_layout_parse(text, "--kv-layout", layout_p);
}
