/* Tokenizer fingerprint (kvf_tok_digest.h). */
#include "kvf_tok_digest.h"

#include <stdio.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

/* Mixed ASCII, digits, punctuation, spaces and multi-byte UTF-8: merges show. */
static const char kvf_tok_probe[] =
    "The ferry carries 3 u9 caches across the strait; prefill computes, decode pulls.\n"
    "  Zeilen \xc3\xa4\xc3\xb6\xc3\xbc \xe6\x97\xa5\xe6\x9c\xac 12345 (x+y)=z? don't {}[]";

static void kvf_tok_put_int(XXH3_state_t *st, int64_t v)
{
    unsigned char b[8];

    for (int i = 0; i < 8; ++i) {
        b[i] = (unsigned char)((uint64_t)v >> (8 * i));
    }
    XXH3_64bits_update(st, b, sizeof(b));
}

kvf_status_t kvf_tokenizer_digest(const kvf_tokenizer_t *tok, char *hex)
{
    size_t cap = kvf_tokenizer_max_token_bytes(tok) + 1;
    size_t probe_len = sizeof(kvf_tok_probe) - 1;
    int32_t *ids = malloc((probe_len + 2) * sizeof(*ids));
    char *buf = malloc(cap);
    XXH3_state_t *st = XXH3_createState();
    kvf_status_t status = KVF_ERR_NO_MEMORY;
    int n;

    if ((ids == NULL) || (buf == NULL) || (st == NULL)) {
        goto out_free;
    }
    XXH3_64bits_reset(st);
    kvf_tok_put_int(st, tok->vocab_size);
    kvf_tok_put_int(st, tok->bos_token_id);
    kvf_tok_put_int(st, tok->eos_token_id);
    for (int32_t id = 0; id < tok->vocab_size; ++id) {
        int len = kvf_tokenizer_token_bytes(tok, id, buf, cap);
        kvf_tok_put_int(st, kvf_tokenizer_is_special(tok, id) ? -1 - len : len);
        if (len > 0) {
            XXH3_64bits_update(st, buf, (size_t)len);
        }
    }
    n = kvf_tokenizer_encode(tok, kvf_tok_probe, probe_len, false, ids, (int)probe_len + 2);
    kvf_tok_put_int(st, n);
    for (int i = 0; i < n; ++i) {
        kvf_tok_put_int(st, ids[i]);
    }
    snprintf(hex, KVF_TOK_DIGEST_HEX + 1, "%016llx", (unsigned long long)XXH3_64bits_digest(st));
    status = KVF_OK;
out_free:
    XXH3_freeState(st);
    free(buf);
    free(ids);
    return status;
}

kvf_status_t kvf_tokenizer_digest_of_model(const char *model_path, char *hex)
{
    kvf_tok_config_t tc;
    kvf_tokenizer_t tok;
    char file[4096];
    struct stat st;
    kvf_status_t status;

    /* a model without tokenizer.json has no digest (the daemons take token ids):
     * not an error, so nothing is logged */
    snprintf(file, sizeof(file), "%s/tokenizer.json", model_path);
    if ((stat(model_path, &st) == 0) && S_ISDIR(st.st_mode) && (stat(file, &st) != 0)) {
        return KVF_ERR_NOT_FOUND;
    }
    status = kvf_tok_config_load(model_path, &tc);
    if (status != KVF_OK) {
        return status;
    }
    memset(&tok, 0, sizeof(tok));
    status = kvf_tokenizer_load(model_path, &tc, &tok);
    if (status != KVF_OK) {
        return status;
    }
    status = kvf_tokenizer_digest(&tok, hex);
    kvf_tokenizer_cleanup(&tok);
    return status;
}
