/*
 * Helpers for the model tests: synthetic checkpoints in a temporary folder,
 * engines with chosen cache dtypes, greedy runs that keep the logits, and
 * an independent reference forward (kvf_ref_forward) written straight from
 * the Hugging Face NemotronH semantics with dense, non-paged loops in
 * double precision, sharing no code with the engine except the
 * safetensors reader.
 */
#ifndef KVF_MODEL_TEST_UTIL_H
#define KVF_MODEL_TEST_UTIL_H

#include "kvf_engine.h"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stdint.h>
#include <cmocka.h>

/** Write tests/data/models/<name>.config.json as a seeded fp32 checkpoint
 *  into a fresh temporary folder; the path is written to @a dir (>= 256 B). */
void kvf_test_mkmodel(const char *name, uint64_t seed, char *dir);

/** rm -r of a folder made by kvf_test_mkmodel(). */
void kvf_test_rmmodel(const char *dir);

typedef struct kvf_test_engine_opts {
    int         tp;
    kvf_dtype_t kv_dtype, ssm_dtype, conv_dtype;
    int         block_size;        /* 0: TP-stable rule */
    int         num_blocks;        /* 0: 256 */
    int         max_batch_tokens;  /* 0: 512 */
    int         max_seqs;          /* 0: 64 */
    bool        no_zero;
    int         kernel_block;      /* 0: MultipleOf(16); else the only kernel block size */
    kvf_kv_layout_t kv_layout;     /* attention block layout; 0: layer-major */
    kvf_pool_alloc_fn_t pool_alloc; /* NULL: pools allocate themselves */
    void       *pool_alloc_ctx;
} kvf_test_engine_opts_t;

/** Defaults: tp 1, all fp32, derived block size. */
kvf_test_engine_opts_t kvf_test_engine_defaults(void);

/** Create an engine or fail the test. */
kvf_engine_h kvf_test_engine(const char *dir, const kvf_test_engine_opts_t *o);

/**
 * Greedy-generate @a max_tokens from @a prompt (ignore EOS), alone in the
 * engine. Tokens go to @a out_tokens (max_tokens), the logits of each
 * sampled token to @a out_logits ([max_tokens][vocab]) when not NULL.
 */
void kvf_test_greedy(kvf_engine_h eng, const int32_t *prompt, int n, int max_tokens,
                     int32_t *out_tokens, float *out_logits);

/** Byte prompt with BOS, as kvf generate builds it; returns the length. */
int kvf_test_prompt(const char *text, int32_t *ids, int cap);

/**
 * Reference forward over the whole sequence; logits of the last position
 * into @a logits (vocab floats). Fails the test on load errors.
 */
void kvf_ref_forward(const char *dir, const int32_t *tokens, int n, float *logits);

/** max_i |a_i - b_i| / max(1, max_i |b_i|). */
double kvf_test_rel_diff(const float *a, const float *b, int n);

#endif
