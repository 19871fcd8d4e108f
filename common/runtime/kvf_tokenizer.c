/*
 * Tokenizers: the plain byte tokenizer and the byte-level BPE of a Hugging
 * Face tokenizer.json.
 *
 * Design. Encoding follows the tokenizers library step for step, so ids agree
 * token for token: (1) input bytes become valid UTF-8 (each maximal invalid
 * subsequence -> U+FFFD, as Python's decode(errors="replace") and Rust's
 * from_utf8_lossy do); (2) added tokens are cut out of the raw text, first
 * those with normalized=false, then the others, leftmost-longest; (3) each
 * remaining segment goes through the pre-tokenizer steps (PCRE2 in UTF+UCP
 * mode for the Unicode classes of the Split regex; ByteLevel maps each byte
 * to its printable stand-in, GPT-2's bytes_to_unicode); (4) each piece is
 * merged by rank: repeatedly the adjacent pair of lowest rank, leftmost on
 * ties, which is what the library's priority queue yields. Decoding maps
 * tokens back to bytes (ByteLevel inverse, <0xNN> byte fallback) and added
 * tokens to their content verbatim; invalid UTF-8 in the result becomes
 * U+FFFD, and the streaming variant holds back the bytes of a character that
 * is not complete yet.
 *
 * Rejected: a trie over the vocab for a greedy longest match (that is
 * WordPiece, not BPE; ids would differ); a priority queue for merges (pieces
 * are short after pre-tokenization, so the quadratic scan is cheaper and
 * obviously equal to the library's order).
 *
 * NOTE: a tokenizer.json field this file starts to honour must leave the
 * refusal list in kvf_tokenizer.h and gain a case in
 * tests/common/runtime/tokenizer_compare.py.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "kvf_tokenizer.h"
#include "kvf_log.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---- byte tokenizer ------------------------------------------------------------- */

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
    tok_p->bpe = NULL;
    return KVF_OK;
}

/* ---- UTF-8 ------------------------------------------------------------------------ */

/*
 * One UTF-8 sequence at p (n > 0 bytes available). Returns 1 for a valid
 * character of *len_p bytes, 0 for an invalid maximal subpart of *len_p bytes
 * (one U+FFFD), -1 when the bytes are a valid but incomplete prefix that runs
 * to the end of the input (*len_p = n).
 */
static int kvf_utf8_seq(const unsigned char *p, size_t n, size_t *len_p)
{
    unsigned char b = p[0];
    unsigned char lo = 0x80, hi = 0xbf;
    size_t need, i;

    if (b < 0x80) {
        *len_p = 1;
        return 1;
    }
    if ((b >= 0xc2) && (b <= 0xdf)) {
        need = 1;
    } else if ((b >= 0xe0) && (b <= 0xef)) {
        need = 2;
        lo = (b == 0xe0) ? 0xa0 : 0x80;
        hi = (b == 0xed) ? 0x9f : 0xbf;
    } else if ((b >= 0xf0) && (b <= 0xf4)) {
        need = 3;
        lo = (b == 0xf0) ? 0x90 : 0x80;
        hi = (b == 0xf4) ? 0x8f : 0xbf;
    } else {
        *len_p = 1;
        return 0;
    }
    for (i = 1; i <= need; ++i) {
        if (i >= n) {
            *len_p = n;
            return -1;
        }
        if ((p[i] < lo) || (p[i] > hi)) {
            *len_p = i;
            return 0;
        }
        lo = 0x80;
        hi = 0xbf;
    }
    *len_p = need + 1;
    return 1;
}

static const char kvf_utf8_replacement[] = "\xef\xbf\xbd";

/*
 * Lossy copy of [p, p+n) into out (capacity >= 3n+1). When hold is set, an
 * incomplete trailing sequence is not written and its length is returned in
 * *held_p. Returns bytes written (no NUL).
 */
static size_t kvf_utf8_lossy(const unsigned char *p, size_t n, bool hold, char *out,
                             size_t *held_p)
{
    size_t i = 0, w = 0, len;
    int r;

    *held_p = 0;
    while (i < n) {
        r = kvf_utf8_seq(p + i, n - i, &len);
        if (r == 1) {
            memcpy(out + w, p + i, len);
            w += len;
        } else if ((r < 0) && hold) {
            *held_p = len;
            break;
        } else {
            memcpy(out + w, kvf_utf8_replacement, 3);
            w += 3;
        }
        i += len;
    }
    return w;
}

static size_t kvf_utf8_encode(uint32_t cp, char *out)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xc0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    out[0] = (char)(0xe0 | (cp >> 12));
    out[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
    out[2] = (char)(0x80 | (cp & 0x3f));
    return 3;
}

/* ---- string -> id map (open addressing) ------------------------------------------ */

typedef struct {
    const char *key;     /* points into kvf_bpe_t.tokens; NULL: empty slot */
    uint32_t    len;
    int32_t     id;
} kvf_str_slot_t;

typedef struct {
    kvf_str_slot_t *slots;
    size_t          mask;
} kvf_str_map_t;

static uint64_t kvf_hash_bytes(const char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; ++i) {
        h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    }
    return h ^ (h >> 29);
}

static kvf_status_t kvf_str_map_init(kvf_str_map_t *m, size_t n)
{
    size_t cap = 16;
    while (cap < 2 * n + 1) {
        cap <<= 1;
    }
    m->slots = calloc(cap, sizeof(*m->slots));
    m->mask = cap - 1;
    return (m->slots == NULL) ? KVF_ERR_NO_MEMORY : KVF_OK;
}

/* Insert; returns false when the key is already present. */
static bool kvf_str_map_put(kvf_str_map_t *m, const char *key, size_t len, int32_t id)
{
    size_t i = kvf_hash_bytes(key, len) & m->mask;
    while (m->slots[i].key != NULL) {
        if ((m->slots[i].len == len) && (memcmp(m->slots[i].key, key, len) == 0)) {
            return false;
        }
        i = (i + 1) & m->mask;
    }
    m->slots[i].key = key;
    m->slots[i].len = (uint32_t)len;
    m->slots[i].id = id;
    return true;
}

static int32_t kvf_str_map_get(const kvf_str_map_t *m, const char *key, size_t len)
{
    size_t i = kvf_hash_bytes(key, len) & m->mask;
    while (m->slots[i].key != NULL) {
        if ((m->slots[i].len == len) && (memcmp(m->slots[i].key, key, len) == 0)) {
            return m->slots[i].id;
        }
        i = (i + 1) & m->mask;
    }
    return -1;
}

/* ---- (left, right) -> merge map --------------------------------------------------- */

typedef struct {
    uint64_t key;        /* (left << 32 | right) + 1; 0: empty */
    int32_t  rank;
    int32_t  merged;
} kvf_pair_slot_t;

typedef struct {
    kvf_pair_slot_t *slots;
    size_t           mask;
} kvf_pair_map_t;

static uint64_t kvf_pair_key(int32_t l, int32_t r)
{
    return (((uint64_t)(uint32_t)l << 32) | (uint32_t)r) + 1;
}

static size_t kvf_pair_hash(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return (size_t)k;
}

static const kvf_pair_slot_t *kvf_pair_get(const kvf_pair_map_t *m, int32_t l, int32_t r)
{
    uint64_t k = kvf_pair_key(l, r);
    size_t i = kvf_pair_hash(k) & m->mask;
    while (m->slots[i].key != 0) {
        if (m->slots[i].key == k) {
            return &m->slots[i];
        }
        i = (i + 1) & m->mask;
    }
    return NULL;
}

/* ---- the loaded tokenizer --------------------------------------------------------- */

typedef enum {
    KVF_PRE_SPLIT = 1,
    KVF_PRE_BYTELEVEL,
} kvf_pre_kind_t;

typedef enum {
    KVF_SPLIT_ISOLATED = 1,
    KVF_SPLIT_REMOVED,
    KVF_SPLIT_MERGED_PREV,
    KVF_SPLIT_MERGED_NEXT,
} kvf_split_behavior_t;

typedef struct {
    kvf_pre_kind_t       kind;
    pcre2_code          *re;             /* Split, or ByteLevel with use_regex */
    kvf_split_behavior_t behavior;
    bool                 add_prefix_space;
} kvf_pre_step_t;

#define KVF_TOK_MAX_PRE 8

typedef struct {
    char   *content;
    size_t  len;
    int32_t id;
    bool    special;
    bool    normalized;
} kvf_added_t;

struct kvf_bpe {
    int32_t         vocab_size;       /* max id + 1 over vocab and added tokens */
    char          **tokens;           /* [vocab_size]: vocab string (NUL-terminated) or NULL */
    uint32_t       *token_len;
    kvf_str_map_t   vocab;
    kvf_pair_map_t  merges;
    kvf_added_t    *added;
    int             num_added;
    int32_t        *added_of_id;      /* [vocab_size]: index in added or -1 */
    kvf_pre_step_t  pre[KVF_TOK_MAX_PRE];
    int             num_pre;
    bool            byte_fallback;
    bool            ignore_merges;
    bool            fuse_unk;
    int32_t         unk_id;           /* -1: none */
    bool            dec_bytelevel;
    bool            dec_byte_fallback;
    int32_t         byte_ids[256];    /* ByteLevel: id of each byte's stand-in, -1 none */
    size_t          max_token_bytes;
};

/* GPT-2 bytes_to_unicode: printable bytes stand for themselves, the rest for 256 + n. */
static uint32_t kvf_byte_cp[256];
static int16_t  kvf_cp_byte[324];

static void kvf_bytelevel_tables(void)
{
    uint32_t n = 0;
    for (int b = 0; b < 256; ++b) {
        bool printable = ((b >= '!') && (b <= '~')) || ((b >= 0xa1) && (b <= 0xac)) ||
                         (b >= 0xae);
        kvf_byte_cp[b] = printable ? (uint32_t)b : 256 + n++;
    }
    for (int i = 0; i < 324; ++i) {
        kvf_cp_byte[i] = -1;
    }
    for (int b = 0; b < 256; ++b) {
        kvf_cp_byte[kvf_byte_cp[b]] = (int16_t)b;
    }
}

static const char kvf_gpt2_regex[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static void kvf_bpe_free(kvf_bpe_t *b)
{
    if (b == NULL) {
        return;
    }
    for (int i = 0; i < b->num_pre; ++i) {
        pcre2_code_free(b->pre[i].re);
    }
    if (b->tokens != NULL) {
        for (int32_t i = 0; i < b->vocab_size; ++i) {
            free(b->tokens[i]);
        }
    }
    for (int i = 0; i < b->num_added; ++i) {
        free(b->added[i].content);
    }
    free(b->tokens);
    free(b->token_len);
    free(b->vocab.slots);
    free(b->merges.slots);
    free(b->added);
    free(b->added_of_id);
    free(b);
}

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

static kvf_status_t kvf_tok_parse(const char *path, const cJSON *root, kvf_bpe_t *b)
{
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    const cJSON *post = cJSON_GetObjectItemCaseSensitive(root, "post_processor");
    const cJSON *dec = cJSON_GetObjectItemCaseSensitive(root, "decoder");
    const cJSON *unk = cJSON_GetObjectItemCaseSensitive(model, "unk_token");
    const cJSON *it;
    const char *f;
    int32_t max_id = -1;
    kvf_status_t status;
    int n;

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
    if (!cJSON_IsObject(vocab) || !cJSON_IsArray(merges)) {
        kvf_error("%s: model.vocab (object) and model.merges (list) are required", path);
        return KVF_ERR_PARSE;
    }
    cJSON_ArrayForEach(it, vocab) {
        if (!cJSON_IsNumber(it) || (it->valuedouble < 0) || (it->valuedouble > 1e8)) {
            kvf_error("%s: model.vocab['%s'] is not a token id", path, it->string);
            return KVF_ERR_PARSE;
        }
        max_id = (it->valueint > max_id) ? it->valueint : max_id;
    }
    n = cJSON_GetArraySize(added);
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
    b->vocab_size = max_id + 1;
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

kvf_status_t kvf_tokenizer_load_file(const char *path, const kvf_model_config_t *cfg,
                                     kvf_tokenizer_t *tok_p)
{
    static int tables_ready;
    FILE *f;
    long size;
    char *text;
    cJSON *root;
    kvf_bpe_t *b;
    kvf_status_t status;

    if (!tables_ready) {
        kvf_bytelevel_tables();     /* idempotent, so a race is harmless */
        tables_ready = 1;
    }
    f = fopen(path, "rb");
    if (f == NULL) {
        kvf_error("%s: cannot open: %m", path);
        return (errno == ENOENT) ? KVF_ERR_NOT_FOUND : KVF_ERR_IO;
    }
    if ((fseek(f, 0, SEEK_END) != 0) || ((size = ftell(f)) < 0) || (fseek(f, 0, SEEK_SET) != 0)) {
        fclose(f);
        kvf_error("%s: cannot read: %m", path);
        return KVF_ERR_IO;
    }
    text = malloc((size_t)size + 1);
    if (text == NULL) {
        fclose(f);
        return KVF_ERR_NO_MEMORY;
    }
    if (fread(text, 1, (size_t)size, f) != (size_t)size) {
        free(text);
        fclose(f);
        kvf_error("%s: short read", path);
        return KVF_ERR_IO;
    }
    fclose(f);
    text[size] = '\0';
    root = cJSON_Parse(text);
    free(text);
    if (root == NULL) {
        kvf_error("%s: not valid JSON", path);
        return KVF_ERR_PARSE;
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

kvf_status_t kvf_tokenizer_load(const char *model_path, const kvf_model_config_t *cfg,
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

/* ---- encoding ------------------------------------------------------------------------ */

typedef struct {
    char  *s;
    size_t len;
} kvf_piece_t;

typedef struct {
    kvf_piece_t *v;
    size_t       n, cap;
} kvf_pieces_t;

static bool kvf_pieces_push(kvf_pieces_t *p, const char *s, size_t len)
{
    if (len == 0) {
        return true;
    }
    if (p->n == p->cap) {
        size_t cap = p->cap ? 2 * p->cap : 16;
        kvf_piece_t *v = realloc(p->v, cap * sizeof(*v));
        if (v == NULL) {
            return false;
        }
        p->v = v;
        p->cap = cap;
    }
    p->v[p->n].s = malloc(len + 1);
    if (p->v[p->n].s == NULL) {
        return false;
    }
    memcpy(p->v[p->n].s, s, len);
    p->v[p->n].s[len] = '\0';
    p->v[p->n].len = len;
    p->n++;
    return true;
}

static void kvf_pieces_free(kvf_pieces_t *p)
{
    for (size_t i = 0; i < p->n; ++i) {
        free(p->v[i].s);
    }
    free(p->v);
    p->v = NULL;
    p->n = p->cap = 0;
}

/* Regex split of one piece into out, as the library's Split with @a beh. */
static bool kvf_split_piece(pcre2_code *re, kvf_split_behavior_t beh, const kvf_piece_t *in,
                            kvf_pieces_t *out)
{
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    size_t pos = 0, gap = 0, pend_start = 0;
    bool ok = (md != NULL), have_pend = false;

    while (ok && (pos <= in->len)) {
        int rc = pcre2_match(re, (PCRE2_SPTR)in->s, in->len, pos, PCRE2_NO_UTF_CHECK, md, NULL);
        PCRE2_SIZE *ov;
        size_t ms, me;

        if (rc < 0) {
            break;
        }
        ov = pcre2_get_ovector_pointer(md);
        ms = ov[0];
        me = ov[1];
        if (me == ms) {                  /* empty match: step one character */
            size_t l = 1;
            if (ms >= in->len) {
                break;
            }
            (void)kvf_utf8_seq((const unsigned char *)in->s + ms, in->len - ms, &l);
            pos = ms + l;
            continue;
        }
        switch (beh) {
        case KVF_SPLIT_ISOLATED:
            ok = kvf_pieces_push(out, in->s + gap, ms - gap) &&
                 kvf_pieces_push(out, in->s + ms, me - ms);
            break;
        case KVF_SPLIT_REMOVED:
            ok = kvf_pieces_push(out, in->s + gap, ms - gap);
            break;
        case KVF_SPLIT_MERGED_PREV:
            ok = kvf_pieces_push(out, in->s + gap, me - gap);
            break;
        case KVF_SPLIT_MERGED_NEXT:
            if (have_pend) {
                ok = kvf_pieces_push(out, in->s + pend_start, ms - pend_start);
            } else {
                ok = kvf_pieces_push(out, in->s, ms);
            }
            pend_start = ms;
            have_pend = true;
            break;
        }
        gap = me;
        pos = me;
    }
    if (ok) {
        if (beh == KVF_SPLIT_MERGED_NEXT && have_pend) {
            ok = kvf_pieces_push(out, in->s + pend_start, in->len - pend_start);
        } else if (beh != KVF_SPLIT_MERGED_NEXT || !have_pend) {
            ok = kvf_pieces_push(out, in->s + gap, in->len - gap);
        }
    }
    pcre2_match_data_free(md);
    return ok;
}

/* ByteLevel: each byte of a piece to its stand-in character. */
static bool kvf_bytelevel_map(const kvf_piece_t *in, kvf_pieces_t *out)
{
    char *m = malloc(2 * in->len + 1);
    size_t w = 0;
    bool ok;

    if (m == NULL) {
        return false;
    }
    for (size_t i = 0; i < in->len; ++i) {
        w += kvf_utf8_encode(kvf_byte_cp[(unsigned char)in->s[i]], m + w);
    }
    ok = kvf_pieces_push(out, m, w);
    free(m);
    return ok;
}

/* ByteLevel on one piece, as the library does it: prefix space, regex, byte map. */
static bool kvf_bytelevel_piece(const kvf_pre_step_t *st, const kvf_piece_t *in,
                                kvf_pieces_t *out)
{
    kvf_pieces_t tmp = {0};
    kvf_piece_t pre = *in;
    char *buf = NULL;
    bool ok = true;

    if (st->add_prefix_space && (in->s[0] != ' ')) {
        buf = malloc(in->len + 2);
        if (buf == NULL) {
            return false;
        }
        buf[0] = ' ';
        memcpy(buf + 1, in->s, in->len);
        buf[in->len + 1] = '\0';
        pre.s = buf;
        pre.len = in->len + 1;
    }
    if (st->re != NULL) {
        ok = kvf_split_piece(st->re, KVF_SPLIT_ISOLATED, &pre, &tmp);
        for (size_t k = 0; ok && (k < tmp.n); ++k) {
            ok = kvf_bytelevel_map(&tmp.v[k], out);
        }
        kvf_pieces_free(&tmp);
    } else {
        ok = kvf_bytelevel_map(&pre, out);
    }
    free(buf);
    return ok;
}

typedef struct {
    int32_t *ids;
    int      n, cap;
    bool     overflow;
} kvf_ids_t;

static void kvf_ids_push(kvf_ids_t *o, int32_t id)
{
    if (o->n < o->cap) {
        o->ids[o->n++] = id;
    } else {
        o->overflow = true;
    }
}

/* Merge one pre-tokenized piece by rank and append its ids. */
static bool kvf_bpe_piece(const kvf_bpe_t *b, const kvf_piece_t *pc, kvf_ids_t *out)
{
    int32_t *sym;
    size_t ns = 0, i = 0, l;
    bool last_unk = false;

    if (b->ignore_merges) {
        int32_t id = kvf_str_map_get(&b->vocab, pc->s, pc->len);
        if (id >= 0) {
            kvf_ids_push(out, id);
            return true;
        }
    }
    sym = malloc(4 * pc->len * sizeof(int32_t) + sizeof(int32_t));
    if (sym == NULL) {
        return false;
    }
    while (i < pc->len) {
        int32_t id;
        (void)kvf_utf8_seq((const unsigned char *)pc->s + i, pc->len - i, &l);
        id = kvf_str_map_get(&b->vocab, pc->s + i, l);
        if (id >= 0) {
            sym[ns++] = id;
            last_unk = false;
        } else {
            bool done = false;
            if (b->byte_fallback) {
                int32_t bid[4];
                size_t k;
                for (k = 0; k < l; ++k) {
                    char name[8];
                    snprintf(name, sizeof(name), "<0x%02X>", (unsigned char)pc->s[i + k]);
                    bid[k] = kvf_str_map_get(&b->vocab, name, 6);
                    if (bid[k] < 0) {
                        break;
                    }
                }
                if (k == l) {
                    for (k = 0; k < l; ++k) {
                        sym[ns++] = bid[k];
                    }
                    done = true;
                    last_unk = false;
                }
            }
            if (!done && (b->unk_id >= 0)) {
                if (!(b->fuse_unk && last_unk)) {
                    sym[ns++] = b->unk_id;
                }
                last_unk = true;
            }
        }
        i += l;
    }
    for (;;) {
        int32_t best_rank = INT32_MAX, best_merged = -1;
        size_t best = 0;
        for (size_t k = 0; k + 1 < ns; ++k) {
            const kvf_pair_slot_t *m = kvf_pair_get(&b->merges, sym[k], sym[k + 1]);
            if ((m != NULL) && (m->rank < best_rank)) {
                best_rank = m->rank;
                best_merged = m->merged;
                best = k;
            }
        }
        if (best_merged < 0) {
            break;
        }
        sym[best] = best_merged;
        memmove(sym + best + 1, sym + best + 2, (ns - best - 2) * sizeof(int32_t));
        ns--;
    }
    for (size_t k = 0; k < ns; ++k) {
        kvf_ids_push(out, sym[k]);
    }
    free(sym);
    return true;
}

/* Pre-tokenize and merge one segment that holds no added token. */
static bool kvf_bpe_segment(const kvf_bpe_t *b, const char *s, size_t len, kvf_ids_t *out)
{
    kvf_pieces_t cur = {0}, next = {0};
    bool ok = kvf_pieces_push(&cur, s, len);

    for (int st = 0; ok && (st < b->num_pre); ++st) {
        const kvf_pre_step_t *step = &b->pre[st];
        for (size_t i = 0; ok && (i < cur.n); ++i) {
            if (step->kind == KVF_PRE_SPLIT) {
                ok = kvf_split_piece(step->re, step->behavior, &cur.v[i], &next);
            } else {
                ok = kvf_bytelevel_piece(step, &cur.v[i], &next);
            }
        }
        kvf_pieces_free(&cur);
        cur = next;
        memset(&next, 0, sizeof(next));
    }
    for (size_t i = 0; ok && (i < cur.n); ++i) {
        ok = kvf_bpe_piece(b, &cur.v[i], out);
    }
    kvf_pieces_free(&cur);
    return ok;
}

/* Leftmost-longest added token (of the given normalized class) in [s, s+len). */
static bool kvf_added_find(const kvf_bpe_t *b, bool normalized, const char *s, size_t len,
                           size_t *at_p, int *which_p)
{
    for (size_t i = 0; i < len; ++i) {
        int best = -1;
        size_t best_len = 0;
        for (int k = 0; k < b->num_added; ++k) {
            const kvf_added_t *a = &b->added[k];
            if ((a->normalized == normalized) && (a->len <= len - i) && (a->len > best_len) &&
                (a->content[0] == s[i]) && (memcmp(a->content, s + i, a->len) == 0)) {
                best = k;
                best_len = a->len;
            }
        }
        if (best >= 0) {
            *at_p = i;
            *which_p = best;
            return true;
        }
    }
    return false;
}

/* Cut normalized added tokens out of a segment, then BPE the rest. */
static bool kvf_bpe_normalized_pass(const kvf_bpe_t *b, const char *s, size_t len, kvf_ids_t *out)
{
    size_t at;
    int which;
    bool ok = true;

    while (ok && (len > 0) && kvf_added_find(b, true, s, len, &at, &which)) {
        ok = kvf_bpe_segment(b, s, at, out);
        kvf_ids_push(out, b->added[which].id);
        s += at + b->added[which].len;
        len -= at + b->added[which].len;
    }
    return ok && ((len == 0) || kvf_bpe_segment(b, s, len, out));
}

static int kvf_bpe_encode(const kvf_bpe_t *b, const char *text, size_t len, kvf_ids_t *out)
{
    char *valid = malloc(3 * len + 1);
    size_t held, vlen, at;
    const char *s;
    int which;
    bool ok = true;

    if (valid == NULL) {
        return -1;
    }
    vlen = kvf_utf8_lossy((const unsigned char *)text, len, false, valid, &held);
    s = valid;
    while (ok && (vlen > 0) && kvf_added_find(b, false, s, vlen, &at, &which)) {
        ok = kvf_bpe_normalized_pass(b, s, at, out);
        kvf_ids_push(out, b->added[which].id);
        s += at + b->added[which].len;
        vlen -= at + b->added[which].len;
    }
    ok = ok && ((vlen == 0) || kvf_bpe_normalized_pass(b, s, vlen, out));
    free(valid);
    return (ok && !out->overflow) ? out->n : -1;
}

int kvf_tokenizer_encode(const kvf_tokenizer_t *tok, const char *text, size_t len, bool add_bos,
                         int32_t *ids, int cap)
{
    int n = 0;
    bool bos = add_bos && (tok->bos_token_id >= 0);

    if (tok->bpe != NULL) {
        kvf_ids_t out = {ids, 0, cap, false};
        if (bos) {
            kvf_ids_push(&out, tok->bos_token_id);
        }
        return kvf_bpe_encode(tok->bpe, text, len, &out);
    }
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

/* ---- decoding ------------------------------------------------------------------------ */

bool kvf_tokenizer_is_special(const kvf_tokenizer_t *tok, int32_t id)
{
    if ((id == tok->bos_token_id) || (id == tok->eos_token_id)) {
        return true;
    }
    if (tok->bpe == NULL) {
        return id >= 256;
    }
    return (id >= 0) && (id < tok->bpe->vocab_size) && (tok->bpe->added_of_id[id] >= 0) &&
           tok->bpe->added[tok->bpe->added_of_id[id]].special;
}

size_t kvf_tokenizer_max_token_bytes(const kvf_tokenizer_t *tok)
{
    return (tok->bpe != NULL) ? tok->bpe->max_token_bytes : 1;
}

int kvf_tokenizer_token_bytes(const kvf_tokenizer_t *tok, int32_t id, char *buf, size_t cap)
{
    const kvf_bpe_t *b = tok->bpe;
    const char *s;
    size_t len, w = 0, i = 0, l;

    if ((id < 0) || (id >= tok->vocab_size) || kvf_tokenizer_is_special(tok, id)) {
        return 0;
    }
    if (b == NULL) {
        if (cap < 1) {
            return -1;
        }
        buf[0] = (char)id;
        return 1;
    }
    if (b->added_of_id[id] >= 0) {         /* through the decoder like any token */
        s = b->added[b->added_of_id[id]].content;
        len = b->added[b->added_of_id[id]].len;
    } else {
        s = b->tokens[id];
        if (s == NULL) {
            return 0;
        }
        len = b->token_len[id];
    }
    if (b->dec_byte_fallback && (len == 6) && (memcmp(s, "<0x", 3) == 0) && (s[5] == '>')) {
        unsigned v;
        if (sscanf(s + 3, "%2X", &v) == 1) {
            if (cap < 1) {
                return -1;
            }
            buf[0] = (char)v;
            return 1;
        }
    }
    if (b->dec_bytelevel) {
        /* Every character must be a byte stand-in; otherwise the token's own bytes. */
        while (i < len) {
            uint32_t cp = 0;
            (void)kvf_utf8_seq((const unsigned char *)s + i, len - i, &l);
            if (l == 1) {
                cp = (unsigned char)s[i];
            } else if (l == 2) {
                cp = ((uint32_t)(s[i] & 0x1f) << 6) | (s[i + 1] & 0x3f);
            } else {
                cp = 0xffff;
            }
            if ((cp >= 324) || (kvf_cp_byte[cp] < 0)) {
                break;
            }
            if (w >= cap) {
                return -1;
            }
            buf[w++] = (char)kvf_cp_byte[cp];
            i += l;
        }
        if (i == len) {
            return (int)w;
        }
    }
    if (cap < len) {
        return -1;
    }
    memcpy(buf, s, len);
    return (int)len;
}

size_t kvf_tokenizer_stream_cap(const kvf_tokenizer_t *tok, int n)
{
    return 3 * ((size_t)(n > 0 ? n : 0) * kvf_tokenizer_max_token_bytes(tok) +
                KVF_TOKENIZER_STREAM_PEND) + 1;
}

/* The byte of a <0xNN> token when the decoder has ByteFallback, else -1. */
static int kvf_fallback_byte(const kvf_tokenizer_t *tok, int32_t id)
{
    const kvf_bpe_t *b = tok->bpe;
    const char *s;
    unsigned v;

    if ((b == NULL) || !b->dec_byte_fallback || (id < 0) || (id >= b->vocab_size) ||
        (b->added_of_id[id] >= 0) || ((s = b->tokens[id]) == NULL) || (b->token_len[id] != 6) ||
        (memcmp(s, "<0x", 3) != 0) || (s[5] != '>') || (sscanf(s + 3, "%2X", &v) != 1)) {
        return -1;
    }
    return (int)v;
}

/*
 * A run of byte-fallback tokens decodes as the library's ByteFallback does:
 * its bytes when they are valid UTF-8 as a whole, else one U+FFFD per token.
 */
static size_t kvf_stream_end_run(kvf_tokenizer_stream_t *s, char *out)
{
    size_t i = 0, len, w = 0;
    bool valid = true;

    while (valid && (i < (size_t)s->npend)) {
        valid = (kvf_utf8_seq(s->pend + i, (size_t)s->npend - i, &len) == 1);
        i += len;
    }
    if (valid) {
        memcpy(out, s->pend, (size_t)s->npend);
        w = (size_t)s->npend;
    } else {
        for (int k = 0; k < s->nrun; ++k) {
            memcpy(out + w, kvf_utf8_replacement, 3);
            w += 3;
        }
    }
    s->npend = s->nrun = 0;
    return w;
}

/*
 * A run that fills the buffer: its complete characters go out now, an
 * incomplete last one stays; an invalid byte ends the run as invalid.
 */
static size_t kvf_stream_cut_run(kvf_tokenizer_stream_t *s, char *out)
{
    size_t i = 0, len;
    int r = 1;

    while ((i < (size_t)s->npend) &&
           ((r = kvf_utf8_seq(s->pend + i, (size_t)s->npend - i, &len)) == 1)) {
        i += len;
    }
    if (r == 0) {
        return kvf_stream_end_run(s, out);
    }
    memcpy(out, s->pend, i);
    memmove(s->pend, s->pend + i, (size_t)s->npend - i);
    s->npend -= (int)i;
    s->nrun = s->npend;
    return i;
}

size_t kvf_tokenizer_stream_feed(const kvf_tokenizer_t *tok, kvf_tokenizer_stream_t *s,
                                 const int32_t *ids, int n, char *out, size_t cap)
{
    size_t mx = kvf_tokenizer_max_token_bytes(tok);
    size_t rawcap = mx + KVF_TOKENIZER_STREAM_PEND, w = 0, held, len;
    unsigned char *raw;

    if (cap < kvf_tokenizer_stream_cap(tok, n)) {
        if (cap > 0) {
            out[0] = '\0';
        }
        return 0;
    }
    raw = malloc(rawcap);
    if (raw == NULL) {
        out[0] = '\0';
        return 0;
    }
    for (int i = 0; i < n; ++i) {
        int fb = kvf_fallback_byte(tok, ids[i]), k;

        if ((ids[i] < 0) || (ids[i] >= tok->vocab_size) || kvf_tokenizer_is_special(tok, ids[i])) {
            continue;      /* dropped before decoding, so a byte-fallback run goes on */
        }
        if (fb >= 0) {
            if ((s->nrun == 0) && (s->npend > 0)) {      /* a held partial character */
                w += kvf_utf8_lossy(s->pend, (size_t)s->npend, false, out + w, &held);
                s->npend = 0;
            }
            if (s->npend == KVF_TOKENIZER_STREAM_PEND) {
                w += kvf_stream_cut_run(s, out + w);    /* overlong run: decide now */
            }
            s->pend[s->npend++] = (unsigned char)fb;
            s->nrun++;
            continue;
        }
        if (s->nrun > 0) {
            w += kvf_stream_end_run(s, out + w);
        }
        memcpy(raw, s->pend, (size_t)s->npend);
        len = (size_t)s->npend;
        k = kvf_tokenizer_token_bytes(tok, ids[i], (char *)raw + len, rawcap - len);
        len += (k > 0) ? (size_t)k : 0;
        w += kvf_utf8_lossy(raw, len, true, out + w, &held);
        memcpy(s->pend, raw + len - held, held);
        s->npend = (int)held;
    }
    out[w] = '\0';
    free(raw);
    return w;
}

size_t kvf_tokenizer_stream_flush(kvf_tokenizer_stream_t *s, char *out, size_t cap)
{
    size_t held, w;

    if (cap < 3 * KVF_TOKENIZER_STREAM_PEND + 1) {
        return 0;
    }
    if (s->nrun > 0) {
        w = kvf_stream_end_run(s, out);
    } else {
        w = kvf_utf8_lossy(s->pend, (size_t)s->npend, false, out, &held);
    }
    s->npend = s->nrun = 0;
    out[w] = '\0';
    return w;
}

size_t kvf_tokenizer_decode(const kvf_tokenizer_t *tok, const int32_t *ids, int n, char *out,
                            size_t cap)
{
    kvf_tokenizer_stream_t st = {{0}, 0, 0};
    size_t need, w;
    char *tmp;

    if (cap == 0) {
        return 0;
    }
    if (tok->bpe == NULL) {
        w = 0;
        for (int i = 0; (i < n) && (w + 1 < cap); ++i) {
            if ((ids[i] < 0) || (ids[i] >= tok->vocab_size) ||
                kvf_tokenizer_is_special(tok, ids[i])) {
                continue;
            }
            out[w++] = (char)ids[i];
        }
        out[w] = '\0';
        return w;
    }
    need = kvf_tokenizer_stream_cap(tok, n) + 3 * KVF_TOKENIZER_STREAM_PEND + 1;
    tmp = malloc(need);
    if (tmp == NULL) {
        out[0] = '\0';
        return 0;
    }
    w = kvf_tokenizer_stream_feed(tok, &st, ids, n, tmp, need);
    w += kvf_tokenizer_stream_flush(&st, tmp + w, need - w);
    if (w >= cap) {
        w = cap - 1;
        while ((w > 0) && (((unsigned char)tmp[w] & 0xc0) == 0x80)) {
            w--;                      /* do not cut a character in half */
        }
    }
    memcpy(out, tmp, w);
    out[w] = '\0';
    free(tmp);
    return w;
}
