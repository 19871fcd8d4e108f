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
 * tests/common/tokenizer/tokenizer_compare.py.
 */
#include "kvf_hash.h"
#include "kvf_tok_int.h"

/*
 * Parts: kvf_tok_load.c (tokenizer.json), kvf_tok_encode.c (encoding); this
 * file: the byte tokenizer, UTF-8, the two hash maps, decoding.
 */

/* ---- byte tokenizer ------------------------------------------------------------- */

kvf_status_t kvf_tokenizer_init(const kvf_tok_config_t *cfg, kvf_tokenizer_t *tok_p)
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
int kvf_utf8_seq(const unsigned char *p, size_t n, size_t *len_p)
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
size_t kvf_utf8_lossy(const unsigned char *p, size_t n, bool hold, char *out,
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

size_t kvf_utf8_encode(uint32_t cp, char *out)
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

static uint64_t kvf_hash_bytes(const char *s, size_t n)
{
    return kvf_hash64(s, n, 0);
}

kvf_status_t kvf_str_map_init(kvf_str_map_t *m, size_t n)
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
bool kvf_str_map_put(kvf_str_map_t *m, const char *key, size_t len, int32_t id)
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

int32_t kvf_str_map_get(const kvf_str_map_t *m, const char *key, size_t len)
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

uint64_t kvf_pair_key(int32_t l, int32_t r)
{
    return (((uint64_t)(uint32_t)l << 32) | (uint32_t)r) + 1;
}

size_t kvf_pair_hash(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return (size_t)k;
}

const kvf_pair_slot_t *kvf_pair_get(const kvf_pair_map_t *m, int32_t l, int32_t r)
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

uint32_t kvf_byte_cp[256];
int16_t  kvf_cp_byte[324];

void kvf_bytelevel_tables(void)
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

void kvf_bpe_free(kvf_bpe_t *b)
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
