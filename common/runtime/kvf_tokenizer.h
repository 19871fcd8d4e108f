/*
 * Byte-level tokenizer for the tiny test models: token ids 0..255 are the
 * bytes of the UTF-8 text; ids >= 256 are special (BOS, EOS, ...), taken
 * from the model config, and are never produced by encoding text.
 */
#ifndef KVF_TOKENIZER_H
#define KVF_TOKENIZER_H

#include "kvf_model_config.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kvf_tokenizer {
    int vocab_size;
    int bos_token_id;   /* -1: none */
    int eos_token_id;   /* -1: none */
} kvf_tokenizer_t;

/**
 * Byte tokenizer for @a cfg. KVF_ERR_UNSUPPORTED when vocab_size < 256 (the
 * model cannot represent every byte).
 */
kvf_status_t kvf_tokenizer_init(const kvf_model_config_t *cfg, kvf_tokenizer_t *tok_p);

/**
 * Encode @a len bytes of @a text into @a ids (capacity @a cap), prefixed with
 * BOS when @a add_bos and the model has one.
 * @return number of ids written, or -1 when @a cap is too small.
 */
int kvf_tokenizer_encode(const kvf_tokenizer_t *tok, const char *text, size_t len, bool add_bos,
                         int32_t *ids, int cap);

/**
 * Decode @a n ids into @a out (capacity @a cap bytes, NUL-terminated),
 * skipping special ids (>= 256) and ids outside [0, vocab).
 * @return bytes written, excluding the NUL.
 */
size_t kvf_tokenizer_decode(const kvf_tokenizer_t *tok, const int32_t *ids, int n, char *out,
                            size_t cap);

/** True when @a id is a special token (BOS, EOS or any id >= 256). */
bool kvf_tokenizer_is_special(const kvf_tokenizer_t *tok, int32_t id);

#endif
