/*
 * Byte-level tokenizer. Real models need their tokenizer.json (BPE); the
 * engine core only ever moves ids, so this is enough for the bundled tiny
 * models and keeps the build free of a tokenizer library.
 */
#include "kvf_tokenizer.h"
#include "kvf_log.h"

kvf_status_t kvf_tokenizer_init(const kvf_model_config_t *cfg, kvf_tokenizer_t *tok_p)
{
    if (cfg->vocab_size < 256) {
        kvf_error("vocab_size %d is too small for the byte tokenizer (needs >= 256)",
                  cfg->vocab_size);
        return KVF_ERR_UNSUPPORTED;
    }
    tok_p->vocab_size = cfg->vocab_size;
    tok_p->bos_token_id = cfg->bos_token_id;
    tok_p->eos_token_id = cfg->eos_token_id;
    return KVF_OK;
}

int kvf_tokenizer_encode(const kvf_tokenizer_t *tok, const char *text, size_t len, bool add_bos,
                         int32_t *ids, int cap)
{
    int n = 0;
    bool bos = add_bos && (tok->bos_token_id >= 0);

    if ((size_t)cap < len + (bos ? 1u : 0u)) {
        return -1;
    }
    if (bos) {
        ids[n++] = tok->bos_token_id;
    }
    for (size_t i = 0; i < len; ++i) {
        ids[n++] = (unsigned char)text[i];
    }
    return n;
}

bool kvf_tokenizer_is_special(const kvf_tokenizer_t *tok, int32_t id)
{
    return (id >= 256) || (id == tok->bos_token_id) || (id == tok->eos_token_id);
}

size_t kvf_tokenizer_decode(const kvf_tokenizer_t *tok, const int32_t *ids, int n, char *out,
                            size_t cap)
{
    size_t w = 0;

    if (cap == 0) {
        return 0;
    }
    for (int i = 0; (i < n) && (w + 1 < cap); ++i) {
        if ((ids[i] < 0) || (ids[i] >= tok->vocab_size) || kvf_tokenizer_is_special(tok, ids[i])) {
            continue;
        }
        out[w++] = (char)ids[i];
    }
    out[w] = '\0';
    return w;
}
