/*
 * The chat-template lexer (kvf_proxy_jinja_int.h): a template into text / {{ expr }} /
 * {% stmt %} pieces with Jinja's whitespace rules, and an expression or a statement's
 * inside into tokens (names, numbers, decoded string literals, operators).
 */
#include "kvf_proxy_jinja_int.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- template pieces ------------------------------------------------------------------ */

static bool kvf_pieces_push(kvf_pieces_t *p, kvf_piece_t pc)
{
    if (p->n == p->cap) {
        int cap = (p->cap > 0) ? 2 * p->cap : 64;
        kvf_piece_t *v = realloc(p->v, (size_t)cap * sizeof(*v));
        if (v == NULL) {
            return false;
        }
        p->v = v;
        p->cap = cap;
    }
    p->v[p->n++] = pc;
    return true;
}

/*
 * Split @a t into pieces. Whitespace: '-' after an opening / before a closing
 * delimiter strips all whitespace on that side; trim_blocks drops the first
 * newline after a block or comment tag; lstrip_blocks drops spaces and tabs from
 * the start of a line up to a block or comment tag ('+' keeps them).
 */
kvf_status_t kvf_jinja_lex(const char *t, kvf_pieces_t *out, char *err, size_t cap)
{
    size_t i = 0, n = strlen(t), text_start = 0;
    bool trim_next_nl = false, strip_next_ws = false;

    while (i <= n) {
        bool open = (i + 1 < n) && (t[i] == '{') &&
                    ((t[i + 1] == '{') || (t[i + 1] == '%') || (t[i + 1] == '#'));
        if ((i < n) && !open) {
            ++i;
            continue;
        }
        {
            /* the text before: apply the previous tag's right side and this tag's left side */
            size_t a = text_start, b = i;
            char kind = (i < n) ? t[i + 1] : 0;
            bool minus = open && (i + 2 < n) && (t[i + 2] == '-');
            bool plus = open && (i + 2 < n) && (t[i + 2] == '+');

            if (strip_next_ws) {
                while ((a < b) && isspace((unsigned char)t[a])) {
                    ++a;
                }
            } else if (trim_next_nl && (a < b) && (t[a] == '\n')) {
                ++a;
            } else if (trim_next_nl && (a + 1 < b) && (t[a] == '\r') && (t[a + 1] == '\n')) {
                a += 2;
            }
            if (minus) {
                while ((b > a) && isspace((unsigned char)t[b - 1])) {
                    --b;
                }
            } else if (open && !plus && ((kind == '%') || (kind == '#'))) {
                size_t c = b;
                while ((c > a) && ((t[c - 1] == ' ') || (t[c - 1] == '\t'))) {
                    --c;
                }
                if ((c == 0) || (t[c - 1] == '\n')) {
                    b = c;   /* only blanks between the line start and the tag */
                } else if (c == a && a == text_start && a > 0 && t[a - 1] == '\n') {
                    b = c;
                }
            }
            if ((b > a) && !kvf_pieces_push(out, (kvf_piece_t){KVF_P_TEXT, t + a, b - a, a})) {
                return KVF_ERR_NO_MEMORY;
            }
            if (!open) {
                break;
            }
            {
                const char *close = (kind == '{') ? "}}" : (kind == '%') ? "%}" : "#}";
                size_t s = i + 2 + ((minus || plus) ? 1 : 0), e = s;
                char q = 0;
                bool rminus;

                /* the closing delimiter, outside string literals */
                while (e + 1 < n) {
                    if (kind != '#') {
                        if (q != 0) {
                            if (t[e] == '\\') {
                                e += 2;
                                continue;
                            }
                            if (t[e] == q) {
                                q = 0;
                            }
                        } else if ((t[e] == '\'') || (t[e] == '"')) {
                            q = t[e];
                        }
                    }
                    if ((q == 0) && (t[e] == close[0]) && (t[e + 1] == close[1])) {
                        break;
                    }
                    ++e;
                }
                if (e + 1 >= n) {
                    snprintf(err, cap, "unclosed tag at offset %zu", i);
                    return KVF_ERR_PARSE;
                }
                rminus = (e > s) && (t[e - 1] == '-');
                if (kind != '#') {
                    kvf_piece_t pc = {(kind == '{') ? KVF_P_EXPR : KVF_P_STMT, t + s,
                                      e - s - (rminus ? 1 : 0), i};
                    if (!kvf_pieces_push(out, pc)) {
                        return KVF_ERR_NO_MEMORY;
                    }
                }
                strip_next_ws = rminus;
                trim_next_nl = (kind != '{');
                i = e + 2;
                text_start = i;
            }
        }
    }
    return KVF_OK;
}

/* ---- expression tokens ---------------------------------------------------------------- */

static const char *const kvf_ops[] = {"//", "**", "==", "!=", "<=", ">=", "(", ")", "[", "]",
                                      "{", "}", ".", ",", ":", "|", "~", "+", "-", "*", "/",
                                      "%", "<", ">", "=", NULL};

static kvf_status_t kvf_tokenize_in(const char *s, size_t n, kvf_toks_t *out, char *err,
                                    size_t cap);

kvf_status_t kvf_jinja_tokenize(const char *s, size_t n, kvf_toks_t *out, char *err,
                                 size_t cap)
{
    kvf_status_t st = kvf_tokenize_in(s, n, out, err, cap);

    if (st != KVF_OK) {   /* the caller has nothing to free */
        kvf_jinja_toks_free(out);
        out->n = 0;
    }
    return st;
}

static kvf_status_t kvf_tokenize_in(const char *s, size_t n, kvf_toks_t *out, char *err,
                                    size_t cap)
{
    size_t i = 0;
    int capn = 16;

    out->v = calloc((size_t)capn, sizeof(kvf_tok_t));
    out->n = out->pos = 0;
    if (out->v == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    for (;;) {
        kvf_tok_t tk = {KVF_T_END, NULL, 0};

        while ((i < n) && isspace((unsigned char)s[i])) {
            ++i;
        }
        if (out->n + 1 >= capn) {
            kvf_tok_t *v = realloc(out->v, (size_t)capn * 2 * sizeof(kvf_tok_t));
            if (v == NULL) {
                return KVF_ERR_NO_MEMORY;
            }
            out->v = v;
            capn *= 2;
        }
        if (i >= n) {
            out->v[out->n++] = tk;
            return KVF_OK;
        }
        if (isalpha((unsigned char)s[i]) || (s[i] == '_')) {
            size_t a = i;
            while ((i < n) && (isalnum((unsigned char)s[i]) || (s[i] == '_'))) {
                ++i;
            }
            tk.kind = KVF_T_NAME;
            tk.text = strndup(s + a, i - a);
        } else if (isdigit((unsigned char)s[i])) {
            char *end;
            tk.kind = KVF_T_NUM;
            tk.num = strtod(s + i, &end);
            /* "1." followed by a name is an attribute, not a float */
            if ((end > s + i) && (end[-1] == '.')) {
                --end;
            }
            /* "f": a float literal (Python prints 2.0, not 2) */
            tk.text = strdup((memchr(s + i, '.', (size_t)(end - s) - i) != NULL) ||
                             (memchr(s + i, 'e', (size_t)(end - s) - i) != NULL) ||
                             (memchr(s + i, 'E', (size_t)(end - s) - i) != NULL) ? "f" : "");
            i = (size_t)(end - s);
        } else if ((s[i] == '\'') || (s[i] == '"')) {
            char q = s[i++];
            kvf_sb_t b = {0};
            kvf_jinja_sb_add(&b, "", 0);
            while ((i < n) && (s[i] != q)) {
                char c = s[i];
                if ((c == '\\') && (i + 1 < n)) {
                    char e = s[++i];
                    c = (e == 'n') ? '\n' : (e == 't') ? '\t' : (e == 'r') ? '\r' : e;
                }
                kvf_jinja_sb_add(&b, &c, 1);
                ++i;
            }
            if (i >= n) {
                free(b.s);
                snprintf(err, cap, "unterminated string");
                return KVF_ERR_PARSE;
            }
            ++i;
            tk.kind = KVF_T_STR;
            tk.text = b.s;
        } else {
            for (int k = 0; kvf_ops[k] != NULL; ++k) {
                size_t l = strlen(kvf_ops[k]);
                if ((i + l <= n) && (strncmp(s + i, kvf_ops[k], l) == 0)) {
                    tk.kind = KVF_T_OP;
                    tk.text = strdup(kvf_ops[k]);
                    i += l;
                    break;
                }
            }
            if (tk.kind != KVF_T_OP) {
                snprintf(err, cap, "unexpected character '%c' in an expression", s[i]);
                return KVF_ERR_PARSE;
            }
        }
        if (tk.text == NULL) {
            return KVF_ERR_NO_MEMORY;
        }
        out->v[out->n++] = tk;
    }
}

void kvf_jinja_toks_free(kvf_toks_t *t)
{
    for (int i = 0; t->v && (i < t->n); ++i) {
        free(t->v[i].text);
    }
    free(t->v);
    t->v = NULL;
}
