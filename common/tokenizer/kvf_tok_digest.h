/*
 * Tokenizer fingerprint: what the proxy compares with the daemons' (their
 * health replies carry it, proto HealthReply.tokenizer_digest) so that a
 * proxy never turns text into the ids of another vocabulary (issue 26
 * item 2: a proxy without --model answered '\x01' for '3 u9').
 *
 * XXH3-64 over what the tokenizer does, not over file bytes (a JSON
 * reformatted the same way gives the same digest): the vocabulary size,
 * BOS and EOS ids, for every id its raw bytes and whether it is special,
 * and the ids of a fixed probe text encoded without BOS (which catches
 * merge rules that differ over the same vocabulary, for the text probed).
 * Not cryptographic: it catches mistakes, not an adversary.
 */
#ifndef KVF_TOK_DIGEST_H
#define KVF_TOK_DIGEST_H

#include "kvf_tokenizer.h"

#define KVF_TOK_DIGEST_HEX 16     /* hex digits of an XXH3-64 digest */

/**
 * Fingerprint of @a tok into @a hex (KVF_TOK_DIGEST_HEX + 1 bytes: lowercase
 * hex, NUL-terminated). @return KVF_OK; KVF_ERR_NO_MEMORY.
 */
kvf_status_t kvf_tokenizer_digest(const kvf_tokenizer_t *tok, char *hex);

/**
 * Load the tokenizer of model folder (or config.json) @a model_path as
 * kvf-proxy does (kvf_tok_config_load + kvf_tokenizer_load) and put its
 * fingerprint in @a hex. @return KVF_OK; KVF_ERR_NOT_FOUND, not logged, for
 * a model folder without tokenizer.json; config and tokenizer load errors
 * (logged by the loaders).
 */
kvf_status_t kvf_tokenizer_digest_of_model(const char *model_path, char *hex);

#endif
