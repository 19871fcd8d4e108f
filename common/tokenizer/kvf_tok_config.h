/*
 * What a tokenizer and a text front end need of a model's config.json: the
 * vocabulary size, the BOS and EOS ids, and the context length. kvf-proxy
 * reads them here without the engine; the engine's full reader
 * (common/model/kvf_model_config.h) gives the same four values for every
 * config it accepts (kvf_tok_config_of_model() in common/runtime/kvf_tok_model.h;
 * tests/common/runtime/test_tok_model.c compares the two on every model of the tree).
 *
 * Design: the proxy turns text into ids and checks lengths; it needs these four
 * fields, not the architecture. Reading them here keeps kvf-proxy's link closure
 * free of kernels/, the engine and OpenBLAS (tests/layering/test_proxy_link.py).
 * Rejected: linking common/model for four fields (it stands on kernels/, which
 * link OpenBLAS and, in GPU builds, CUDA); a copy of the whole model-config
 * validation here (the daemons validate what they serve, and the proxy refuses
 * any daemon whose tokenizer digest differs from its own, kvf_tok_digest.h).
 *
 * Thread safety: pure functions.
 */
#ifndef KVF_TOK_CONFIG_H
#define KVF_TOK_CONFIG_H

#include "kvf_status.h"

typedef struct kvf_tok_config {
    int vocab_size;               /* > 0 */
    int bos_token_id;             /* [0, vocab_size), -1: none */
    int eos_token_id;             /* [0, vocab_size), -1: none; a list's first entry */
    int max_position_embeddings;  /* the model's context in tokens; 0: not given */
} kvf_tok_config_t;

/**
 * Read the four fields from the config.json of model folder @a path (or the
 * config.json file @a path) into @a out, with the rules of the engine's reader:
 * vocab_size a positive integer; bos_token_id, eos_token_id and
 * max_position_embeddings optional non-negative integers (null as absent; an
 * eos_token_id list gives its first entry); BOS and EOS inside the vocabulary.
 * Other fields are not looked at.
 *
 * @return KVF_OK; KVF_ERR_IO when the file is missing, unreadable or over 16 MiB
 *         (logged with the path); KVF_ERR_PARSE for malformed JSON;
 *         KVF_ERR_INVALID_PARAM for a field out of range or mistyped (logged
 *         "<file>: field '<name>' ..." with the value). On error *out is untouched.
 */
kvf_status_t kvf_tok_config_load(const char *path, kvf_tok_config_t *out);

#endif
