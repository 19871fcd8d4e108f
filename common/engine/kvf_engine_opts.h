/*
 * The engine options: one definition of each (name, hence --flag and KVF_<NAME>; default;
 * help; type) for the role daemons (daemon/kvf_role.h) and every kvf command that takes
 * them (generate, bench-model, plan). A command's config table (kvf_config.h) lists the
 * rows it takes with KVF_ENGINE_OPT(NAME, struct type, member prefix); the member names are
 * the ones below, so `kvf-prefill --help`, `kvf generate --help` and `kvf plan --help` print
 * the same line for each (tests/tools/test_engine_opts.sh holds them to it).
 *
 * BLOCK_SIZE is one thing everywhere: the user block size, the alignment unit of the
 * derived logical block size; EXACT_BLOCK_SIZE (commands that take it) sets the size itself.
 * The dtypes are parsed by kvf_engine_opts_dtype() alone: fp8 is taken by every command
 * and refused by name where the engine would compute in it (the daemons, generate,
 * bench-model); kvf plan plans with it.
 *
 * Design: row macros over a member prefix (`role.` for the daemons' kvf_role_config_t,
 * empty for a command's flat options), like KVF_ROLE_CONFIG_FIELDS. Rejected: one
 * kvf_engine_opts_t embedded in every config struct (the daemons read role.tp and
 * role.num_blocks in many places, prefill/ and decode/ would all change for no gain in
 * what a user sees); a table built at run time (the config tables are static const).
 */
#ifndef KVF_ENGINE_OPTS_H
#define KVF_ENGINE_OPTS_H

#include "kvf_config.h"
#include "kvf_dtype.h"
#include "kvf_geometry.h"
#include "kvf_status.h"

#include <stdbool.h>
#include <stddef.h>

/* The defaults, as the tables write them (kvf tune sizes pools by NUM_BLOCKS). */
#define KVF_ENGINE_TP_DEFAULT                 "1"
#define KVF_ENGINE_KV_DTYPE_DEFAULT           "bf16"
#define KVF_ENGINE_BLOCK_SIZE_DEFAULT         "16"
#define KVF_ENGINE_NUM_BLOCKS_DEFAULT         "256"
#define KVF_ENGINE_MAX_BATCH_TOKENS_DEFAULT   "512"
#define KVF_ENGINE_PREFIX_STATE_GRID_DEFAULT  "64"   /* = KVF_PREFIX_STATE_GRID_DEFAULT */

#define KVF_EOPT_ROW(_name, _dflt, _help, _type, _member, _ctype)                              \
    {#_name, _dflt, _help, offsetof(_type, _member), KVF_CONFIG_TYPE_##_ctype, 0}

/** The config-table row of engine option @a _name for struct @a _type whose fields are
 *  @a _pfx<member> (e.g. `role.` or nothing). */
#define KVF_ENGINE_OPT(_name, _type, _pfx) KVF_EOPT_##_name(_type, _pfx)

/* ---- the table: one row per option ------------------------------------------------------ */

#define KVF_EOPT_MODEL(_t, _p)                                                                \
    KVF_EOPT_ROW(MODEL, "", "model folder (config.json + model.safetensors)", _t, _p model,    \
                 STRING)
#define KVF_EOPT_TP(_t, _p)                                                                   \
    KVF_EOPT_ROW(TP, KVF_ENGINE_TP_DEFAULT, "tensor-parallel ranks of this instance (one "    \
                 "thread each; on GPUs one device each)", _t, _p tp, INT)
#define KVF_EOPT_KV_DTYPE(_t, _p)                                                             \
    KVF_EOPT_ROW(KV_DTYPE, KVF_ENGINE_KV_DTYPE_DEFAULT, "attention KV cache dtype: fp32, "    \
                 "bf16, fp16, fp8, auto (bf16); the same on both sides of a pool; fp8 is for "  \
                 "planning (kvf plan, kvf xfer-test): the engine's attention does not compute " \
                 "in it, so the daemons, kvf generate and kvf bench-model refuse it",           \
                 _t, _p kv_dtype, STRING)
#define KVF_EOPT_SSM_DTYPE(_t, _p)                                                            \
    KVF_EOPT_ROW(SSM_DTYPE, "auto", "Mamba SSM state dtype (auto: the model's "               \
                 "mamba_ssm_cache_dtype)", _t, _p ssm_dtype, STRING)
#define KVF_EOPT_CONV_DTYPE(_t, _p)                                                           \
    KVF_EOPT_ROW(CONV_DTYPE, "auto", "Mamba conv state dtype (auto: the model's dtype)", _t,  \
                 _p conv_dtype, STRING)
#define KVF_EOPT_BLOCK_SIZE(_t, _p)                                                           \
    KVF_EOPT_ROW(BLOCK_SIZE, KVF_ENGINE_BLOCK_SIZE_DEFAULT, "user block size N, tokens: the "  \
                 "alignment unit; the logical block size is derived, the smallest multiple of " \
                 "max(16, N) that holds a rank's Mamba state (dense models: N itself); "        \
                 "--exact-block-size, where a command takes it, sets the size instead",         \
                 _t, _p block_size, INT)
#define KVF_EOPT_KV_LAYOUT(_t, _p)                                                            \
    KVF_EOPT_ROW(KV_LAYOUT, "layer-major", "attention KV block layout: layer-major (a page "   \
                 "per layer slot) or head-major (a KV head's every layer slot together, so a " \
                 "pull at unequal TP reads a block of a source rank as one descriptor; "        \
                 "docs/ARCHITECTURE.md §7); the two sides of a pair may differ",               \
                 _t, _p kv_layout, STRING)
#define KVF_EOPT_EXACT_BLOCK_SIZE(_t, _p)                                                     \
    KVF_EOPT_ROW(EXACT_BLOCK_SIZE, "0", "this logical block size, tokens, instead of the "     \
                 "derived one; refused when too small for a rank's Mamba state (0: derive)",   \
                 _t, _p exact_block_size, INT)
#define KVF_EOPT_NUM_BLOCKS(_t, _p)                                                           \
    KVF_EOPT_ROW(NUM_BLOCKS, KVF_ENGINE_NUM_BLOCKS_DEFAULT, "blocks in each rank's page pool", \
                 _t, _p num_blocks, INT)
#define KVF_EOPT_MAX_BATCH_TOKENS(_t, _p)                                                     \
    KVF_EOPT_ROW(MAX_BATCH_TOKENS, KVF_ENGINE_MAX_BATCH_TOKENS_DEFAULT, "tokens per engine "   \
                 "step (the prefill chunk budget)", _t, _p max_batch_tokens, INT)
#define KVF_EOPT_DEVICE(_t, _p)                                                               \
    KVF_EOPT_ROW(DEVICE, "cpu", "where weights, KV pages and Mamba state live and the "       \
                 "forward runs: cpu, cuda or cuda:N (rank r on cuda:N+r, NCCL between ranks; "  \
                 "the daemons register the pools with UCX as CUDA memory and --pool-alloc "     \
                 "does not apply; two instances may share a GPU; what has run on a GPU: "       \
                 "README's GPU section)", _t, _p device, STRING)
#define KVF_EOPT_PREFIX_CACHING(_t, _p)                                                       \
    KVF_EOPT_ROW(PREFIX_CACHING, "on", "prefix cache (docs/PREFIX_CACHE.md): a prompt whose "  \
                 "start this instance computed before reuses its KV blocks and Mamba state "    \
                 "(on, as vLLM; off)", _t, _p prefix_caching, BOOL)
#define KVF_EOPT_PREFIX_STATE_BYTES(_t, _p)                                                   \
    KVF_EOPT_ROW(PREFIX_STATE_BYTES, "0", "memory per rank for the prefix cache's Mamba "      \
                 "state checkpoints, apart from the page pool, committed at start (must hold " \
                 "one; 0: 64 checkpoints within 256 MiB, at least one)", _t,                   \
                 _p prefix_state_bytes, SIZE)
#define KVF_EOPT_PREFIX_STATE_GRID(_t, _p)                                                    \
    KVF_EOPT_ROW(PREFIX_STATE_GRID, KVF_ENGINE_PREFIX_STATE_GRID_DEFAULT, "tokens between "    \
                 "Mamba state checkpoints; prompt chunks end on this grid (models with Mamba " \
                 "layers)", _t, _p prefix_state_grid, INT)

/**
 * The one parser of the dtype options (--kv-dtype, --ssm-dtype, --conv-dtype): fp32, bf16,
 * fp16 and their aliases, fp8, and "auto" for @a dflt. With @a computes (the command runs
 * the engine on it), fp8 is refused naming the flag, the value and why.
 *
 * @param [in]  flag     the flag without dashes, for the error ("kv-dtype")
 * @param [out] dtype_p  set on success only
 * @return KVF_OK; KVF_ERR_INVALID_PARAM, one line logged ("bad value 'x' for --kv-dtype
 *         (fp32, bf16, fp16, fp8)", or the fp8 refusal naming why).
 */
kvf_status_t kvf_engine_opts_dtype(const char *flag, const char *text, kvf_dtype_t dflt,
                                   bool computes, kvf_dtype_t *dtype_p);

/**
 * Check the block size options: @a block_size (BLOCK_SIZE) >= 1 and @a exact_block_size
 * (EXACT_BLOCK_SIZE; pass 0 where a command has none) >= 0.
 * @return KVF_OK; KVF_ERR_INVALID_PARAM, one line logged naming the flag and the value.
 */
kvf_status_t kvf_engine_opts_block_sizes(int block_size, int exact_block_size);

/**
 * The one parser of --kv-layout: "layer-major" or "head-major".
 * @return KVF_OK; KVF_ERR_INVALID_PARAM, one line logged naming the flag and the value.
 */
kvf_status_t kvf_engine_opts_kv_layout(const char *text, kvf_kv_layout_t *layout_p);

#endif /* KVF_ENGINE_OPTS_H */
