/*
 * Tokenizer: loading a Hugging Face tokenizer.json (what is honoured, what is
 * refused by name: kvf_tokenizer.h).
 */
#include "kvf_tok_int.h"
#include "kvf_json.h"

/* GPT-2's pre-tokenizer split (ByteLevel with use_regex). */
static const char kvf_gpt2_regex[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* ---- loading ------------------------------------------------------------------------ */

#define KVF_TOK_REFUSE(_path, ...)                                                     \
    do {                                                                              \
        kvf_error("%s: " __VA_ARGS__);                                                \
        return KVF_ERR_UNSUPPORTED;                                                   \
    } while (0)

static const char *kvf_json_type(const cJSON *o)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "type");
    return cJSON_IsString(t) ? t->valuestring : "";
}

static bool kvf_json_true(const cJSON *o, const char *field)
{
    return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, field));
}

static kvf_status_t kvf_tok_compile(const char *path, const char *field, const char *pattern,
                                    bool literal, pcre2_code **re_p)
{
    int err;
    PCRE2_SIZE off;
    uint32_t opts = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, opts, &err, &off,
                                   NULL);

    if (re == NULL) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(err, msg, sizeof(msg));
        kvf_error("%s: %s regex does not compile at offset %zu: %s", path, field, (size_t)off,
                  (const char *)msg);
        return KVF_ERR_UNSUPPORTED;
    }
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);   /* optional speed-up */
    *re_p = re;
    return KVF_OK;
}

static kvf_status_t kvf_tok_pre_step(const char *path, kvf_bpe_t *b, const cJSON *p)
{
    const char *type = kvf_json_type(p);
    kvf_pre_step_t *s;
    kvf_status_t status;

    if (strcmp(type, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers");
        const cJSON *it;
        cJSON_ArrayForEach(it, list) {
            status = kvf_tok_pre_step(path, b, it);
            if (status != KVF_OK) {
                return status;
            }
        }
        return KVF_OK;
    }
    if (b->num_pre == KVF_TOK_MAX_PRE) {
        KVF_TOK_REFUSE(path, "pre_tokenizer has more than %d steps", path, KVF_TOK_MAX_PRE);
    }
    s = &b->pre[b->num_pre];
    memset(s, 0, sizeof(*s));
    if (strcmp(type, "ByteLevel") == 0) {
        const cJSON *ur = cJSON_GetObjectItemCaseSensitive(p, "use_regex");
        s->kind = KVF_PRE_BYTELEVEL;
        s->add_prefix_space = kvf_json_true(p, "add_prefix_space");
        if ((ur == NULL) || cJSON_IsTrue(ur)) {
            status = kvf_tok_compile(path, "pre_tokenizer ByteLevel", kvf_gpt2_regex, false,
                                     &s->re);
            if (status != KVF_OK) {
                return status;
            }
        }
        b->num_pre++;
        return KVF_OK;
    }
    if (strcmp(type, "Split") == 0) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(p, "pattern");
        const cJSON *rx = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
        const cJSON *str = cJSON_GetObjectItemCaseSensitive(pat, "String");
        const cJSON *beh = cJSON_GetObjectItemCaseSensitive(p, "behavior");
        const char *bs = cJSON_IsString(beh) ? beh->valuestring : "";

        if (kvf_json_true(p, "invert")) {
            KVF_TOK_REFUSE(path, "pre_tokenizer Split field invert true is not supported", path);
        }
        if (strcmp(bs, "Isolated") == 0) {
            s->behavior = KVF_SPLIT_ISOLATED;
        } else if (strcmp(bs, "Removed") == 0) {
            s->behavior = KVF_SPLIT_REMOVED;
        } else if (strcmp(bs, "MergedWithPrevious") == 0) {
            s->behavior = KVF_SPLIT_MERGED_PREV;
        } else if (strcmp(bs, "MergedWithNext") == 0) {
            s->behavior = KVF_SPLIT_MERGED_NEXT;
        } else {
            KVF_TOK_REFUSE(path, "pre_tokenizer Split field behavior '%s' is not supported "
                           "(Isolated, Removed, MergedWithPrevious, MergedWithNext are)", path, bs);
        }
        if (cJSON_IsString(rx)) {
            status = kvf_tok_compile(path, "pre_tokenizer Split pattern", rx->valuestring, false,
                                     &s->re);
        } else if (cJSON_IsString(str)) {
            status = kvf_tok_compile(path, "pre_tokenizer Split pattern", str->valuestring, true,
                                     &s->re);
        } else {
            KVF_TOK_REFUSE(path, "pre_tokenizer Split field pattern needs Regex or String", path);
        }
        if (status != KVF_OK) {
            return status;
        }
        s->kind = KVF_PRE_SPLIT;
        b->num_pre++;
        return KVF_OK;
    }
    KVF_TOK_REFUSE(path, "pre_tokenizer type '%s' is not supported (ByteLevel, Split, Sequence "
                   "are)", path, type);
}

static kvf_status_t kvf_tok_decoder(const char *path, kvf_bpe_t *b, const cJSON *d)
{
    const char *type = kvf_json_type(d);

    if (strcmp(type, "Sequence") == 0) {
        const cJSON *it;
        cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(d, "decoders")) {
            kvf_status_t status = kvf_tok_decoder(path, b, it);
            if (status != KVF_OK) {
                return status;
            }
        }
        return KVF_OK;
    }
    if (strcmp(type, "ByteLevel") == 0) {
        b->dec_bytelevel = true;
    } else if (strcmp(type, "ByteFallback") == 0) {
        b->dec_byte_fallback = true;
    } else if (strcmp(type, "Fuse") != 0) {
        KVF_TOK_REFUSE(path, "decoder type '%s' is not supported (ByteLevel, ByteFallback, "
                       "Fuse, Sequence are)", path, type);
    }
    return KVF_OK;
}

static kvf_status_t kvf_tok_set_token(const char *path, kvf_bpe_t *b, int32_t id, const char *s)
{
    if ((id < 0) || (id >= b->vocab_size)) {
        kvf_error("%s: token id %d out of range", path, id);
        return KVF_ERR_PARSE;
    }
    if (b->tokens[id] != NULL) {
        return KVF_OK;          /* an added token that is also in the vocab */
    }
    b->tokens[id] = strdup(s);
    if (b->tokens[id] == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    b->token_len[id] = (uint32_t)strlen(s);
    return KVF_OK;
}

static kvf_status_t kvf_tok_merges(const char *path, kvf_bpe_t *b, const cJSON *merges)
{
    int n = cJSON_GetArraySize(merges), rank = 0;
    size_t cap = 16;
    const cJSON *it;
    char buf[1024];

    while (cap < 2 * (size_t)n + 1) {
        cap <<= 1;
    }
    b->merges.slots = calloc(cap, sizeof(kvf_pair_slot_t));
    if (b->merges.slots == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    b->merges.mask = cap - 1;
    cJSON_ArrayForEach(it, merges) {
        const char *l, *r;
        size_t ll, rl;
        int32_t li, ri, mi;

        if (cJSON_IsString(it)) {
            const char *sp = strchr(it->valuestring, ' ');
            if ((sp == NULL) || (strchr(sp + 1, ' ') != NULL)) {
                kvf_error("%s: model.merges[%d] '%s' is not two tokens", path, rank,
                          it->valuestring);
                return KVF_ERR_PARSE;
            }
            l = it->valuestring;
            ll = (size_t)(sp - l);
            r = sp + 1;
            rl = strlen(r);
        } else if (cJSON_IsArray(it) && (cJSON_GetArraySize(it) == 2) &&
                   cJSON_IsString(cJSON_GetArrayItem(it, 0)) &&
                   cJSON_IsString(cJSON_GetArrayItem(it, 1))) {
            l = cJSON_GetArrayItem(it, 0)->valuestring;
            r = cJSON_GetArrayItem(it, 1)->valuestring;
            ll = strlen(l);
            rl = strlen(r);
        } else {
            kvf_error("%s: model.merges[%d] is neither \"a b\" nor [\"a\", \"b\"]", path, rank);
            return KVF_ERR_PARSE;
        }
        if (ll + rl >= sizeof(buf)) {
            kvf_error("%s: model.merges[%d] is longer than %zu bytes", path, rank, sizeof(buf));
            return KVF_ERR_PARSE;
        }
        memcpy(buf, l, ll);
        memcpy(buf + ll, r, rl);
        li = kvf_str_map_get(&b->vocab, l, ll);
        ri = kvf_str_map_get(&b->vocab, r, rl);
        mi = kvf_str_map_get(&b->vocab, buf, ll + rl);
        if ((li < 0) || (ri < 0) || (mi < 0)) {
            kvf_error("%s: model.merges[%d] names a token missing from model.vocab", path, rank);
            return KVF_ERR_PARSE;
        }
        {
            uint64_t k = kvf_pair_key(li, ri);
            size_t i = kvf_pair_hash(k) & b->merges.mask;
            while ((b->merges.slots[i].key != 0) && (b->merges.slots[i].key != k)) {
                i = (i + 1) & b->merges.mask;
            }
            if (b->merges.slots[i].key == 0) {     /* first rank wins, as in the library */
                b->merges.slots[i].key = k;
                b->merges.slots[i].rank = rank;
                b->merges.slots[i].merged = mi;
            }
        }
        rank++;
    }
    return KVF_OK;
}

/* What kvferry refuses of a tokenizer.json, by name: another model, normalizer or post-processor. */
static kvf_status_t kvf_tok_refusals(const char *path, const cJSON *root, const cJSON *model)
{
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    const cJSON *post = cJSON_GetObjectItemCaseSensitive(root, "post_processor");
    const char *f;

    if (!cJSON_IsObject(model) || (strcmp(kvf_json_type(model), "BPE") != 0)) {
        KVF_TOK_REFUSE(path, "model.type '%s' is not supported (BPE is)", path,
                       kvf_json_type(model));
    }
    if ((norm != NULL) && !cJSON_IsNull(norm)) {
        KVF_TOK_REFUSE(path, "normalizer type '%s' is not supported (null is)", path,
                       kvf_json_type(norm));
    }
    if ((post != NULL) && !cJSON_IsNull(post) && (strcmp(kvf_json_type(post), "ByteLevel") != 0)) {
        KVF_TOK_REFUSE(path, "post_processor type '%s' is not supported (null, ByteLevel are)",
                       path, kvf_json_type(post));
    }
    for (f = "dropout"; f != NULL; f = (strcmp(f, "dropout") == 0) ? "continuing_subword_prefix" :
         (strcmp(f, "continuing_subword_prefix") == 0) ? "end_of_word_suffix" : NULL) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(model, f);
        if ((v != NULL) && !cJSON_IsNull(v) &&
            !(cJSON_IsString(v) && (v->valuestring[0] == '\0'))) {
            KVF_TOK_REFUSE(path, "model.%s is set; it is not supported (null is)", path, f);
        }
    }
    return KVF_OK;
}

/* Check the ids of model.vocab and added_tokens; *@a max_id_p: the largest (-1: none). */
static kvf_status_t kvf_tok_scan_ids(const char *path, const cJSON *vocab, const cJSON *added,
                                     int32_t *max_id_p)
{
    const cJSON *it;
    const char *f;
    int32_t max_id = -1;

    cJSON_ArrayForEach(it, vocab) {
        if (!cJSON_IsNumber(it) || (it->valuedouble < 0) || (it->valuedouble > 1e8)) {
            kvf_error("%s: model.vocab['%s'] is not a token id", path, it->string);
            return KVF_ERR_PARSE;
        }
        max_id = (it->valueint > max_id) ? it->valueint : max_id;
    }
    cJSON_ArrayForEach(it, added) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "id");
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(it, "content");
        if (!cJSON_IsNumber(id) || (id->valuedouble < 0) || (id->valuedouble > 1e8) ||
            !cJSON_IsString(c) || (c->valuestring[0] == '\0')) {
            kvf_error("%s: added_tokens entry needs an id and a non-empty content", path);
            return KVF_ERR_PARSE;
        }
        for (f = "lstrip"; f != NULL; f = (strcmp(f, "lstrip") == 0) ? "rstrip" :
             (strcmp(f, "rstrip") == 0) ? "single_word" : NULL) {
            if (kvf_json_true(it, f)) {
                KVF_TOK_REFUSE(path, "added_tokens '%s' field %s true is not supported", path,
                               c->valuestring, f);
            }
        }
        max_id = (id->valueint > max_id) ? id->valueint : max_id;
    }
    *max_id_p = max_id;
    return KVF_OK;
}

/* The id tables of @a b (vocab_size set): token strings, the vocab map, the added tokens. */
static kvf_status_t kvf_tok_tables(const char *path, kvf_bpe_t *b, const cJSON *vocab,
                                   const cJSON *added)
{
    int n = cJSON_GetArraySize(added);
    const cJSON *it;
    kvf_status_t status;

    b->tokens = calloc((size_t)b->vocab_size, sizeof(char *));
    b->token_len = calloc((size_t)b->vocab_size, sizeof(uint32_t));
    b->added_of_id = malloc((size_t)b->vocab_size * sizeof(int32_t));
    b->added = calloc((size_t)(n > 0 ? n : 1), sizeof(kvf_added_t));
    if ((b->tokens == NULL) || (b->token_len == NULL) || (b->added_of_id == NULL) ||
        (b->added == NULL)) {
        return KVF_ERR_NO_MEMORY;
    }
    for (int32_t i = 0; i < b->vocab_size; ++i) {
        b->added_of_id[i] = -1;
    }
    cJSON_ArrayForEach(it, vocab) {
        status = kvf_tok_set_token(path, b, it->valueint, it->string);
        if (status != KVF_OK) {
            return status;
        }
    }
    status = kvf_str_map_init(&b->vocab, (size_t)cJSON_GetArraySize(vocab));
    if (status != KVF_OK) {
        return status;
    }
    cJSON_ArrayForEach(it, vocab) {
        const char *s = b->tokens[it->valueint];
        if (!kvf_str_map_put(&b->vocab, s, strlen(s), it->valueint)) {
            kvf_error("%s: model.vocab has '%s' twice", path, s);
            return KVF_ERR_PARSE;
        }
    }
    cJSON_ArrayForEach(it, added) {
        kvf_added_t *a = &b->added[b->num_added];
        const char *c = cJSON_GetObjectItemCaseSensitive(it, "content")->valuestring;
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(it, "normalized");

        a->id = cJSON_GetObjectItemCaseSensitive(it, "id")->valueint;
        a->content = strdup(c);
        if (a->content == NULL) {
            return KVF_ERR_NO_MEMORY;
        }
        a->len = strlen(c);
        a->special = kvf_json_true(it, "special");
        a->normalized = (nm == NULL) ? !a->special : cJSON_IsTrue(nm);
        b->added_of_id[a->id] = b->num_added++;
    }
    return KVF_OK;
}

static kvf_status_t kvf_tok_parse(const char *path, const cJSON *root, kvf_bpe_t *b)
{
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    const cJSON *dec = cJSON_GetObjectItemCaseSensitive(root, "decoder");
    const cJSON *unk = cJSON_GetObjectItemCaseSensitive(model, "unk_token");
    int32_t max_id = -1;
    kvf_status_t status;

    status = kvf_tok_refusals(path, root, model);
    if (status != KVF_OK) {
        return status;
    }
    if (!cJSON_IsObject(vocab) || !cJSON_IsArray(merges)) {
        kvf_error("%s: model.vocab (object) and model.merges (list) are required", path);
        return KVF_ERR_PARSE;
    }
    status = kvf_tok_scan_ids(path, vocab, added, &max_id);
    if (status != KVF_OK) {
        return status;
    }
    b->vocab_size = max_id + 1;
    status = kvf_tok_tables(path, b, vocab, added);
    if (status != KVF_OK) {
        return status;
    }
    status = kvf_tok_merges(path, b, merges);
    if (status != KVF_OK) {
        return status;
    }
    b->byte_fallback = kvf_json_true(model, "byte_fallback");
    b->ignore_merges = kvf_json_true(model, "ignore_merges");
    b->fuse_unk = kvf_json_true(model, "fuse_unk");
    b->unk_id = cJSON_IsString(unk) ?
                kvf_str_map_get(&b->vocab, unk->valuestring, strlen(unk->valuestring)) : -1;
    if (cJSON_IsString(unk) && (b->unk_id < 0)) {
        kvf_error("%s: model.unk_token '%s' is not in model.vocab", path, unk->valuestring);
        return KVF_ERR_PARSE;
    }
    if ((pre != NULL) && !cJSON_IsNull(pre)) {
        status = kvf_tok_pre_step(path, b, pre);
        if (status != KVF_OK) {
            return status;
        }
    }
    if ((dec == NULL) || cJSON_IsNull(dec)) {
        KVF_TOK_REFUSE(path, "decoder null is not supported (ByteLevel, ByteFallback are)", path);
    }
    status = kvf_tok_decoder(path, b, dec);
    if (status != KVF_OK) {
        return status;
    }
    for (int c = 0; c < 256; ++c) {
        char s[4];
        size_t l = kvf_utf8_encode(kvf_byte_cp[c], s);
        b->byte_ids[c] = kvf_str_map_get(&b->vocab, s, l);
    }
    for (int32_t i = 0; i < b->vocab_size; ++i) {
        size_t l = (b->added_of_id[i] >= 0) ? b->added[b->added_of_id[i]].len : b->token_len[i];
        b->max_token_bytes = (l > b->max_token_bytes) ? l : b->max_token_bytes;
    }
    return KVF_OK;
}

kvf_status_t kvf_tokenizer_load_file(const char *path, const kvf_tok_config_t *cfg,
                                     kvf_tokenizer_t *tok_p)
{
    static int tables_ready;
    cJSON *root;
    kvf_bpe_t *b;
    kvf_status_t status;

    if (!tables_ready) {
        kvf_bytelevel_tables();     /* idempotent, so a race is harmless */
        tables_ready = 1;
    }
    status = kvf_json_load(path, 0, &root);
    if (status != KVF_OK) {
        return status;
    }
    b = calloc(1, sizeof(*b));
    if (b == NULL) {
        cJSON_Delete(root);
        return KVF_ERR_NO_MEMORY;
    }
    status = kvf_tok_parse(path, root, b);
    cJSON_Delete(root);
    if (status != KVF_OK) {
        kvf_bpe_free(b);
        return status;
    }
    tok_p->bpe = b;
    tok_p->vocab_size = b->vocab_size;
    tok_p->bos_token_id = (cfg != NULL) ? cfg->bos_token_id : -1;
    tok_p->eos_token_id = (cfg != NULL) ? cfg->eos_token_id : -1;
    if ((cfg != NULL) && (cfg->vocab_size < b->vocab_size)) {
        kvf_error("%s: %d tokens but the model's vocab_size is %d", path, b->vocab_size,
                  cfg->vocab_size);
        kvf_bpe_free(b);
        tok_p->bpe = NULL;
        return KVF_ERR_INVALID_PARAM;
    }
    return KVF_OK;
}

kvf_status_t kvf_tokenizer_load(const char *model_path, const kvf_tok_config_t *cfg,
                                kvf_tokenizer_t *tok_p)
{
    char file[4096];
    struct stat st;
    const char *slash;

    if ((stat(model_path, &st) == 0) && S_ISDIR(st.st_mode)) {
        snprintf(file, sizeof(file), "%s/tokenizer.json", model_path);
    } else if ((slash = strrchr(model_path, '/')) != NULL) {
        snprintf(file, sizeof(file), "%.*s/tokenizer.json", (int)(slash - model_path), model_path);
    } else {
        snprintf(file, sizeof(file), "tokenizer.json");
    }
    if (stat(file, &st) != 0) {
        kvf_error("%s: not found: the model declares no tokenizer (a byte-level model "
                  "declares one too; `kvf mkmodel` writes it)", file);
        return KVF_ERR_NOT_FOUND;
    }
    return kvf_tokenizer_load_file(file, cfg, tok_p);
}

void kvf_tokenizer_cleanup(kvf_tokenizer_t *tok)
{
    kvf_bpe_free(tok->bpe);
    tok->bpe = NULL;
}
