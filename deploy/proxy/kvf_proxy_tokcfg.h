/*
 * What the proxy reads from a checkpoint's tokenizer_config.json besides the
 * tokenizer: the chat template (a string, or a list of {name, template} whose
 * "default" entry is used, as transformers picks it) and the text of the BOS and
 * EOS tokens the template may print. A checkpoint without the file or without a
 * template serves completions only; chat requests are refused naming the field.
 */
#ifndef KVF_PROXY_TOKCFG_H
#define KVF_PROXY_TOKCFG_H

#include "kvf_status.h"

typedef struct kvf_proxy_tokcfg {
    char *chat_template;   /* malloc'd; NULL: none */
    char *bos_token;       /* malloc'd; NULL: none */
    char *eos_token;
    char *root;            /* realpath of the model folder (malloc'd); NULL: unknown */
} kvf_proxy_tokcfg_t;

/**
 * Read @a model_path's tokenizer_config.json (@a model_path: the model folder or its
 * config.json). A missing file is not an error (all fields NULL).
 * @return KVF_OK; KVF_ERR_PARSE for a file that is not JSON (logged with the path);
 *         KVF_ERR_NO_MEMORY.
 */
kvf_status_t kvf_proxy_tokcfg_load(const char *model_path, kvf_proxy_tokcfg_t *out);

/** Free what load allocated; safe on a zeroed struct. */
void kvf_proxy_tokcfg_cleanup(kvf_proxy_tokcfg_t *cfg);

#endif
