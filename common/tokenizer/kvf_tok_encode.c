/*
 * Tokenizer: encoding (added tokens, pre-tokenizer steps, merges by rank),
 * as kvf_tokenizer.c's opening comment describes.
 */
#include "kvf_tok_int.h"

#include "kvf_array.h"

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
    if (KVF_ARRAY_GROW(p->v, p->cap, p->n + 1, 16) != KVF_OK) {
        return false;
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
