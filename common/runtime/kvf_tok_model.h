/*
 * The tokenizer's view of a model the engine loaded: the four fields of
 * kvf_tok_config_t taken from the engine's kvf_model_config_t, which reads
 * them with the same rules as kvf_tok_config_load() (the proxy's reader;
 * tests/common/runtime/test_tok_model.c checks the two agree on every model
 * config of the tree).
 */
#ifndef KVF_TOK_MODEL_H
#define KVF_TOK_MODEL_H

#include "kvf_model_config.h"
#include "kvf_tok_config.h"

/** The tokenizer fields of @a mc (not NULL). */
static inline kvf_tok_config_t kvf_tok_config_of_model(const kvf_model_config_t *mc)
{
    kvf_tok_config_t tc;

    tc.vocab_size = mc->vocab_size;
    tc.bos_token_id = mc->bos_token_id;
    tc.eos_token_id = mc->eos_token_id;
    tc.max_position_embeddings = mc->max_position_embeddings;
    return tc;
}

#endif
