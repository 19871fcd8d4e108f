/*
 * A Jinja subset for chat templates (kvf_proxy_jinja.h). Values are cJSON nodes
 * (a fresh, owned tree per evaluation; undefined is a node of type cJSON_Invalid);
 * the template is lexed into text / {{ expr }} / {% stmt %} pieces with Jinja's
 * whitespace rules (trim_blocks, lstrip_blocks, '-' markers), parsed into a tree
 * and run. What it knows: if/elif/else, for (one or two targets, loop.*, else),
 * set (names and namespace attributes), generation blocks (run as plain blocks);
 * expressions with literals, lists, dicts, attribute and item access, slices,
 * arithmetic, ~, comparisons, in, is-tests, and/or/not, the conditional
 * expression, filters and string/dict methods that the Llama 3, Qwen3 and
 * Nemotron-H templates use, namespace() and raise_exception(). Anything else is
 * refused by name (KVF_ERR_UNSUPPORTED), never rendered wrongly.
 *
 * Design: a tree walk over cJSON values. Rejected: linking a Jinja engine (none
 * well kept in C); compiling to bytecode (templates are a few kB, run once each).
 */
#include "kvf_proxy_jinja.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- errors and output ---------------------------------------------------------- */

typedef struct {
    char        *err;
    size_t       cap;
    kvf_status_t status;   /* first failure */
    char        *out;
    size_t       len, outcap;
    cJSON       *scope;    /* variables: an object; set writes here */
    const cJSON *globals;  /* the caller's variables */
    int          depth;
    cJSON       *loop_sets;  /* names set with 'set name' in the innermost for (Jinja scoping:
                              * they end with the loop); NULL outside loops */
} kvf_jx_t;

static void kvf_jx_fail(kvf_jx_t *x, kvf_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void kvf_jx_fail(kvf_jx_t *x, kvf_status_t st, const char *fmt, ...)
{
    va_list ap;

    if (x->status != KVF_OK) {
        return;
    }
    x->status = st;
    va_start(ap, fmt);
    vsnprintf(x->err, x->cap, fmt, ap);
    va_end(ap);
}

static void kvf_jx_emit(kvf_jx_t *x, const char *s, size_t n)
{
    if (x->len + n + 1 > x->outcap) {
        size_t cap = (x->outcap > 0) ? x->outcap : 256;
        char *o;
        while (cap < x->len + n + 1) {
            cap *= 2;
        }
        o = realloc(x->out, cap);
        if (o == NULL) {
            kvf_jx_fail(x, KVF_ERR_NO_MEMORY, "out of memory");
            return;
        }
        x->out = o;
        x->outcap = cap;
    }
    memcpy(x->out + x->len, s, n);
    x->len += n;
    x->out[x->len] = '\0';
}

/* ---- values ----------------------------------------------------------------------- */

static cJSON *kvf_v_undef(void)
{
    cJSON *v = cJSON_CreateNull();

    if (v != NULL) {
        v->type = cJSON_Invalid;
    }
    return v;
}

static bool kvf_v_is_undef(const cJSON *v)
{
    return (v == NULL) || ((v->type & 0xFF) == cJSON_Invalid);
}

static bool kvf_v_truthy(const cJSON *v)
{
    if (kvf_v_is_undef(v) || cJSON_IsNull(v) || cJSON_IsFalse(v)) {
        return false;
    }
    if (cJSON_IsNumber(v)) {
        return v->valuedouble != 0.0;
    }
    if (cJSON_IsString(v)) {
        return v->valuestring[0] != '\0';
    }
    if (cJSON_IsArray(v) || cJSON_IsObject(v)) {
        return v->child != NULL;
    }
    return true;
}

/* A growable string. */
typedef struct {
    char  *s;
    size_t n, cap;
} kvf_sb_t;

static void kvf_sb_add(kvf_sb_t *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t cap = (b->cap > 0) ? b->cap * 2 : 64;
        char *p;
        while (cap < b->n + n + 1) {
            cap *= 2;
        }
        p = realloc(b->s, cap);
        if (p == NULL) {
            return;
        }
        b->s = p;
        b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = '\0';
}

static void kvf_sb_str(kvf_sb_t *b, const char *s)
{
    kvf_sb_add(b, s, strlen(s));
}

static void kvf_num_text(double d, char *buf, size_t cap)
{
    if ((floor(d) == d) && (fabs(d) < 1e15)) {
        snprintf(buf, cap, "%.0f", d);
    } else {
        snprintf(buf, cap, "%.17g", d);
        /* Python's repr: the shortest that reads back */
        for (int p = 1; p <= 17; ++p) {
            char t[64];
            snprintf(t, sizeof(t), "%.*g", p, d);
            if (strtod(t, NULL) == d) {
                snprintf(buf, cap, "%s", t);
                break;
            }
        }
        if ((strchr(buf, '.') == NULL) && (strchr(buf, 'e') == NULL)) {
            size_t l = strlen(buf);
            snprintf(buf + l, cap - l, ".0");
        }
    }
}

/* Python's json.dumps(v, ensure_ascii=False, indent=indent) (indent < 0: none). */
static void kvf_json_dump(kvf_sb_t *b, const cJSON *v, int indent, int level)
{
    char num[64];

    if (cJSON_IsString(v)) {
        kvf_sb_add(b, "\"", 1);
        for (const unsigned char *p = (const unsigned char *)v->valuestring; *p; ++p) {
            char esc[8];
            switch (*p) {
            case '"': kvf_sb_str(b, "\\\""); break;
            case '\\': kvf_sb_str(b, "\\\\"); break;
            case '\n': kvf_sb_str(b, "\\n"); break;
            case '\r': kvf_sb_str(b, "\\r"); break;
            case '\t': kvf_sb_str(b, "\\t"); break;
            case '\b': kvf_sb_str(b, "\\b"); break;
            case '\f': kvf_sb_str(b, "\\f"); break;
            default:
                if (*p < 0x20) {
                    snprintf(esc, sizeof(esc), "\\u%04x", *p);
                    kvf_sb_str(b, esc);
                } else {
                    kvf_sb_add(b, (const char *)p, 1);
                }
            }
        }
        kvf_sb_add(b, "\"", 1);
    } else if (cJSON_IsNumber(v)) {
        kvf_num_text(v->valuedouble, num, sizeof(num));
        kvf_sb_str(b, num);
    } else if (cJSON_IsTrue(v)) {
        kvf_sb_str(b, "true");
    } else if (cJSON_IsFalse(v)) {
        kvf_sb_str(b, "false");
    } else if (cJSON_IsArray(v) || cJSON_IsObject(v)) {
        bool obj = cJSON_IsObject(v);
        const cJSON *c;
        bool first = true;

        kvf_sb_str(b, obj ? "{" : "[");
        if (v->child == NULL) {
            kvf_sb_str(b, obj ? "}" : "]");
            return;
        }
        cJSON_ArrayForEach(c, v) {
            if (!first) {
                kvf_sb_str(b, (indent >= 0) ? "," : ", ");
            }
            first = false;
            if (indent >= 0) {
                kvf_sb_str(b, "\n");
                for (int i = 0; i < indent * (level + 1); ++i) {
                    kvf_sb_str(b, " ");
                }
            }
            if (obj) {
                cJSON key;
                memset(&key, 0, sizeof(key));
                key.type = cJSON_String;
                key.valuestring = c->string;
                kvf_json_dump(b, &key, indent, level + 1);
                kvf_sb_str(b, ": ");
            }
            kvf_json_dump(b, c, indent, level + 1);
        }
        if (indent >= 0) {
            kvf_sb_str(b, "\n");
            for (int i = 0; i < indent * level; ++i) {
                kvf_sb_str(b, " ");
            }
        }
        kvf_sb_str(b, obj ? "}" : "]");
    } else {
        kvf_sb_str(b, "null");
    }
}

/* Python's str() of a value (repr for the items of lists and dicts). */
static void kvf_v_str(kvf_sb_t *b, const cJSON *v, bool repr)
{
    char num[64];

    if (kvf_v_is_undef(v)) {
        return;
    }
    if (cJSON_IsString(v)) {
        if (repr) {
            kvf_sb_str(b, "'");
            kvf_sb_str(b, v->valuestring);
            kvf_sb_str(b, "'");
        } else {
            kvf_sb_str(b, v->valuestring);
        }
    } else if (cJSON_IsNumber(v)) {
        kvf_num_text(v->valuedouble, num, sizeof(num));
        kvf_sb_str(b, num);
    } else if (cJSON_IsTrue(v)) {
        kvf_sb_str(b, "True");
    } else if (cJSON_IsFalse(v)) {
        kvf_sb_str(b, "False");
    } else if (cJSON_IsNull(v)) {
        kvf_sb_str(b, "None");
    } else {
        bool obj = cJSON_IsObject(v), first = true;
        const cJSON *c;

        kvf_sb_str(b, obj ? "{" : "[");
        cJSON_ArrayForEach(c, v) {
            if (!first) {
                kvf_sb_str(b, ", ");
            }
            first = false;
            if (obj) {
                kvf_sb_str(b, "'");
                kvf_sb_str(b, c->string);
                kvf_sb_str(b, "': ");
            }
            kvf_v_str(b, c, true);
        }
        kvf_sb_str(b, obj ? "}" : "]");
    }
}

static char *kvf_v_tostr(const cJSON *v)
{
    kvf_sb_t b = {0};

    kvf_sb_add(&b, "", 0);
    kvf_v_str(&b, v, false);
    return b.s;
}

static cJSON *kvf_v_take_str(char *s)
{
    cJSON *v = cJSON_CreateString((s != NULL) ? s : "");

    free(s);
    return v;
}

/* ---- lexer: template pieces --------------------------------------------------------- */

typedef enum { KVF_P_TEXT, KVF_P_EXPR, KVF_P_STMT } kvf_piece_kind_t;

typedef struct {
    kvf_piece_kind_t kind;
    const char      *s;     /* text, or the tag's inside */
    size_t           n;
    size_t           at;    /* offset in the template */
} kvf_piece_t;

typedef struct {
    kvf_piece_t *v;
    int          n, cap;
} kvf_pieces_t;

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
static kvf_status_t kvf_lex(const char *t, kvf_pieces_t *out, char *err, size_t cap)
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

/* ---- expression tokens ------------------------------------------------------------- */

typedef enum { KVF_T_END, KVF_T_NAME, KVF_T_NUM, KVF_T_STR, KVF_T_OP } kvf_tok_kind_t;

typedef struct {
    kvf_tok_kind_t kind;
    char          *text;   /* name, op, or the decoded string (owned) */
    double         num;
} kvf_tok_t;

typedef struct {
    kvf_tok_t *v;
    int        n, pos;
} kvf_toks_t;

static const char *const kvf_ops[] = {"//", "**", "==", "!=", "<=", ">=", "(", ")", "[", "]",
                                      "{", "}", ".", ",", ":", "|", "~", "+", "-", "*", "/",
                                      "%", "<", ">", "=", NULL};

static kvf_status_t kvf_tokenize(const char *s, size_t n, kvf_toks_t *out, char *err,
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
            i = (size_t)(end - s);
            tk.text = strdup("");
        } else if ((s[i] == '\'') || (s[i] == '"')) {
            char q = s[i++];
            kvf_sb_t b = {0};
            kvf_sb_add(&b, "", 0);
            while ((i < n) && (s[i] != q)) {
                char c = s[i];
                if ((c == '\\') && (i + 1 < n)) {
                    char e = s[++i];
                    c = (e == 'n') ? '\n' : (e == 't') ? '\t' : (e == 'r') ? '\r' : e;
                }
                kvf_sb_add(&b, &c, 1);
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

static void kvf_toks_free(kvf_toks_t *t)
{
    for (int i = 0; t->v && (i < t->n); ++i) {
        free(t->v[i].text);
    }
    free(t->v);
    t->v = NULL;
}

/* ---- expression tree --------------------------------------------------------------- */

typedef enum {
    KVF_E_LIT, KVF_E_NAME, KVF_E_LIST, KVF_E_DICT, KVF_E_ATTR, KVF_E_ITEM, KVF_E_SLICE,
    KVF_E_CALL, KVF_E_FILTER, KVF_E_TEST, KVF_E_BIN, KVF_E_NOT, KVF_E_NEG, KVF_E_AND,
    KVF_E_OR, KVF_E_COND, KVF_E_NONE_SLOT,
} kvf_ekind_t;

typedef struct kvf_expr kvf_expr_t;
struct kvf_expr {
    kvf_ekind_t  kind;
    char        *name;       /* NAME, ATTR, CALL (method or function), FILTER, TEST, BIN op */
    cJSON       *lit;        /* LIT */
    kvf_expr_t  *a, *b, *c;  /* operands; SLICE: a[b:c:d] with d in args[0] */
    kvf_expr_t **args;       /* LIST items, DICT k,v pairs, CALL/FILTER/TEST arguments */
    char       **kwnames;    /* per argument: keyword name or NULL */
    int          nargs;
    bool         negate;     /* TEST: is not; BIN "in": not in */
};

static void kvf_expr_free(kvf_expr_t *e)
{
    if (e == NULL) {
        return;
    }
    free(e->name);
    cJSON_Delete(e->lit);
    kvf_expr_free(e->a);
    kvf_expr_free(e->b);
    kvf_expr_free(e->c);
    for (int i = 0; i < e->nargs; ++i) {
        kvf_expr_free(e->args[i]);
        free(e->kwnames ? e->kwnames[i] : NULL);
    }
    free(e->args);
    free(e->kwnames);
    free(e);
}

typedef struct {
    kvf_toks_t  *t;
    char        *err;
    size_t       cap;
    kvf_status_t status;
} kvf_ps_t;

static kvf_expr_t *kvf_new(kvf_ekind_t k)
{
    kvf_expr_t *e = calloc(1, sizeof(*e));

    if (e != NULL) {
        e->kind = k;
    }
    return e;
}

static kvf_tok_t *kvf_peek(kvf_ps_t *p)
{
    return &p->t->v[p->t->pos];
}

static bool kvf_is_op(kvf_ps_t *p, const char *op)
{
    kvf_tok_t *t = kvf_peek(p);

    return (t->kind == KVF_T_OP) && (strcmp(t->text, op) == 0);
}

static bool kvf_is_name(kvf_ps_t *p, const char *name)
{
    kvf_tok_t *t = kvf_peek(p);

    return (t->kind == KVF_T_NAME) && (strcmp(t->text, name) == 0);
}

static void kvf_ps_fail(kvf_ps_t *p, kvf_status_t st, const char *what)
{
    kvf_tok_t *t = kvf_peek(p);

    if (p->status == KVF_OK) {
        p->status = st;
        snprintf(p->err, p->cap, "%s (at '%s')", what,
                 (t->kind == KVF_T_END) ? "end" : (t->text != NULL) ? t->text : "?");
    }
}

static bool kvf_expect_op(kvf_ps_t *p, const char *op)
{
    if (!kvf_is_op(p, op)) {
        char m[64];
        snprintf(m, sizeof(m), "expected '%s'", op);
        kvf_ps_fail(p, KVF_ERR_PARSE, m);
        return false;
    }
    p->t->pos++;
    return true;
}

static kvf_expr_t *kvf_parse_expr(kvf_ps_t *p);
static kvf_expr_t *kvf_parse_unary(kvf_ps_t *p);

static bool kvf_add_arg(kvf_expr_t *e, kvf_expr_t *a, char *kw)
{
    kvf_expr_t **v = realloc(e->args, (size_t)(e->nargs + 1) * sizeof(*v));
    char **k = realloc(e->kwnames, (size_t)(e->nargs + 1) * sizeof(*k));

    if (v != NULL) {
        e->args = v;
    }
    if (k != NULL) {
        e->kwnames = k;
    }
    if ((v == NULL) || (k == NULL) || (a == NULL)) {
        kvf_expr_free(a);
        free(kw);
        return false;
    }
    e->args[e->nargs] = a;
    e->kwnames[e->nargs] = kw;
    e->nargs++;
    return true;
}

/* (a, b, k=v) after the '(' is consumed. */
static bool kvf_parse_args(kvf_ps_t *p, kvf_expr_t *e)
{
    while (!kvf_is_op(p, ")")) {
        char *kw = NULL;
        kvf_tok_t *t = kvf_peek(p);
        if ((t->kind == KVF_T_NAME) && (p->t->v[p->t->pos + 1].kind == KVF_T_OP) &&
            (strcmp(p->t->v[p->t->pos + 1].text, "=") == 0)) {
            kw = strdup(t->text);
            p->t->pos += 2;
        }
        if (!kvf_add_arg(e, kvf_parse_expr(p), kw) || (p->status != KVF_OK)) {
            kvf_ps_fail(p, KVF_ERR_PARSE, "bad argument");
            return false;
        }
        if (!kvf_is_op(p, ",")) {
            break;
        }
        p->t->pos++;
    }
    return kvf_expect_op(p, ")");
}

static kvf_expr_t *kvf_parse_primary(kvf_ps_t *p)
{
    kvf_tok_t *t = kvf_peek(p);
    kvf_expr_t *e;

    if (t->kind == KVF_T_NUM) {
        p->t->pos++;
        e = kvf_new(KVF_E_LIT);
        if (e != NULL) {
            e->lit = cJSON_CreateNumber(t->num);
        }
        return e;
    }
    if (t->kind == KVF_T_STR) {
        kvf_sb_t b = {0};
        /* adjacent string literals concatenate */
        kvf_sb_add(&b, "", 0);
        while (kvf_peek(p)->kind == KVF_T_STR) {
            kvf_sb_str(&b, kvf_peek(p)->text);
            p->t->pos++;
        }
        e = kvf_new(KVF_E_LIT);
        if (e != NULL) {
            e->lit = cJSON_CreateString(b.s);
        }
        free(b.s);
        return e;
    }
    if (t->kind == KVF_T_NAME) {
        p->t->pos++;
        e = kvf_new(KVF_E_LIT);
        if (e == NULL) {
            return NULL;
        }
        if (!strcmp(t->text, "true") || !strcmp(t->text, "True")) {
            e->lit = cJSON_CreateTrue();
        } else if (!strcmp(t->text, "false") || !strcmp(t->text, "False")) {
            e->lit = cJSON_CreateFalse();
        } else if (!strcmp(t->text, "none") || !strcmp(t->text, "None")) {
            e->lit = cJSON_CreateNull();
        } else {
            e->kind = KVF_E_NAME;
            e->name = strdup(t->text);
        }
        return e;
    }
    if (kvf_is_op(p, "(")) {
        p->t->pos++;
        e = kvf_parse_expr(p);
        if (kvf_is_op(p, ",")) {
            kvf_ps_fail(p, KVF_ERR_UNSUPPORTED, "tuples are not supported");
        }
        kvf_expect_op(p, ")");
        return e;
    }
    if (kvf_is_op(p, "[") || kvf_is_op(p, "{")) {
        bool dict = kvf_is_op(p, "{");
        const char *close = dict ? "}" : "]";
        p->t->pos++;
        e = kvf_new(dict ? KVF_E_DICT : KVF_E_LIST);
        while ((e != NULL) && (p->status == KVF_OK) && !kvf_is_op(p, close)) {
            kvf_add_arg(e, kvf_parse_expr(p), NULL);
            if (dict) {
                kvf_expect_op(p, ":");
                kvf_add_arg(e, kvf_parse_expr(p), NULL);
            }
            if (!kvf_is_op(p, ",")) {
                break;
            }
            p->t->pos++;
        }
        kvf_expect_op(p, close);
        return e;
    }
    kvf_ps_fail(p, KVF_ERR_PARSE, "expected a value");
    return NULL;
}

static kvf_expr_t *kvf_parse_postfix(kvf_ps_t *p)
{
    kvf_expr_t *e = kvf_parse_primary(p);

    while ((e != NULL) && (p->status == KVF_OK)) {
        if (kvf_is_op(p, ".")) {
            kvf_expr_t *a = kvf_new(KVF_E_ATTR);
            p->t->pos++;
            if ((a == NULL) || (kvf_peek(p)->kind != KVF_T_NAME)) {
                kvf_expr_free(a);
                kvf_ps_fail(p, KVF_ERR_PARSE, "expected a name after '.'");
                break;
            }
            a->a = e;
            a->name = strdup(kvf_peek(p)->text);
            p->t->pos++;
            e = a;
        } else if (kvf_is_op(p, "[")) {
            kvf_expr_t *s = kvf_new(KVF_E_ITEM), *parts[3] = {NULL, NULL, NULL};
            int k = 0;
            bool slice = false;
            p->t->pos++;
            if (s == NULL) {
                break;
            }
            s->a = e;
            for (;;) {
                if (!kvf_is_op(p, ":") && !kvf_is_op(p, "]")) {
                    parts[k] = kvf_parse_expr(p);
                }
                if (kvf_is_op(p, ":") && (k < 2)) {
                    slice = true;
                    p->t->pos++;
                    ++k;
                    continue;
                }
                break;
            }
            kvf_expect_op(p, "]");
            if (slice) {
                s->kind = KVF_E_SLICE;
                s->b = parts[0];
                s->c = parts[1];
                kvf_add_arg(s, (parts[2] != NULL) ? parts[2] : kvf_new(KVF_E_NONE_SLOT), NULL);
            } else {
                s->b = parts[0];
            }
            e = s;
        } else if (kvf_is_op(p, "(")) {
            kvf_expr_t *c = kvf_new(KVF_E_CALL);
            p->t->pos++;
            if (c == NULL) {
                break;
            }
            c->a = e;
            kvf_parse_args(p, c);
            e = c;
        } else if (kvf_is_op(p, "|")) {
            kvf_expr_t *f = kvf_new(KVF_E_FILTER);
            p->t->pos++;
            if ((f == NULL) || (kvf_peek(p)->kind != KVF_T_NAME)) {
                kvf_expr_free(f);
                kvf_ps_fail(p, KVF_ERR_PARSE, "expected a filter name");
                break;
            }
            f->a = e;
            f->name = strdup(kvf_peek(p)->text);
            p->t->pos++;
            if (kvf_is_op(p, "(")) {
                p->t->pos++;
                kvf_parse_args(p, f);
            }
            e = f;
        } else {
            break;
        }
    }
    return e;
}

static kvf_expr_t *kvf_bin(const char *op, kvf_expr_t *a, kvf_expr_t *b)
{
    kvf_expr_t *e = kvf_new(KVF_E_BIN);

    if (e == NULL) {
        kvf_expr_free(a);
        kvf_expr_free(b);
        return NULL;
    }
    e->name = strdup(op);
    e->a = a;
    e->b = b;
    return e;
}

static kvf_expr_t *kvf_parse_pow(kvf_ps_t *p)
{
    kvf_expr_t *e = kvf_parse_postfix(p);

    if (kvf_is_op(p, "**")) {
        p->t->pos++;
        e = kvf_bin("**", e, kvf_parse_unary(p));
    }
    return e;
}

static kvf_expr_t *kvf_parse_unary(kvf_ps_t *p)
{
    if (kvf_is_op(p, "-")) {
        kvf_expr_t *e = kvf_new(KVF_E_NEG);
        p->t->pos++;
        if (e != NULL) {
            e->a = kvf_parse_unary(p);
        }
        return e;
    }
    if (kvf_is_op(p, "+")) {
        p->t->pos++;
        return kvf_parse_unary(p);
    }
    return kvf_parse_pow(p);
}

static kvf_expr_t *kvf_parse_mul(kvf_ps_t *p)
{
    kvf_expr_t *e = kvf_parse_unary(p);

    while (kvf_is_op(p, "*") || kvf_is_op(p, "/") || kvf_is_op(p, "//") || kvf_is_op(p, "%")) {
        char op[3];
        snprintf(op, sizeof(op), "%s", kvf_peek(p)->text);
        p->t->pos++;
        e = kvf_bin(op, e, kvf_parse_unary(p));
    }
    return e;
}

static kvf_expr_t *kvf_parse_add(kvf_ps_t *p)
{
    kvf_expr_t *e = kvf_parse_mul(p);

    while (kvf_is_op(p, "+") || kvf_is_op(p, "-")) {
        char op[2] = {kvf_peek(p)->text[0], 0};
        p->t->pos++;
        e = kvf_bin(op, e, kvf_parse_mul(p));
    }
    return e;
}

static kvf_expr_t *kvf_parse_concat(kvf_ps_t *p)
{
    kvf_expr_t *e = kvf_parse_add(p);

    while (kvf_is_op(p, "~")) {
        p->t->pos++;
        e = kvf_bin("~", e, kvf_parse_add(p));
    }
    return e;
}

static kvf_expr_t *kvf_parse_compare(kvf_ps_t *p)
{
    kvf_expr_t *e = kvf_parse_concat(p);
    static const char *const cmps[] = {"==", "!=", "<", ">", "<=", ">=", NULL};

    for (;;) {
        bool done = true;
        for (int i = 0; cmps[i] != NULL; ++i) {
            if (kvf_is_op(p, cmps[i])) {
                p->t->pos++;
                e = kvf_bin(cmps[i], e, kvf_parse_concat(p));
                done = false;
                break;
            }
        }
        if (!done) {
            continue;
        }
        if (kvf_is_name(p, "in") || (kvf_is_name(p, "not") &&
                                     (p->t->v[p->t->pos + 1].kind == KVF_T_NAME) &&
                                     !strcmp(p->t->v[p->t->pos + 1].text, "in"))) {
            bool neg = kvf_is_name(p, "not");
            p->t->pos += neg ? 2 : 1;
            e = kvf_bin("in", e, kvf_parse_concat(p));
            if (e != NULL) {
                e->negate = neg;
            }
            continue;
        }
        if (kvf_is_name(p, "is")) {
            kvf_expr_t *t = kvf_new(KVF_E_TEST);
            p->t->pos++;
            if (t == NULL) {
                break;
            }
            t->a = e;
            if (kvf_is_name(p, "not")) {
                t->negate = true;
                p->t->pos++;
            }
            if (kvf_peek(p)->kind != KVF_T_NAME) {
                kvf_expr_free(t);
                kvf_ps_fail(p, KVF_ERR_PARSE, "expected a test name after 'is'");
                return NULL;
            }
            t->name = strdup(kvf_peek(p)->text);
            p->t->pos++;
            if (kvf_is_op(p, "(")) {
                p->t->pos++;
                kvf_parse_args(p, t);
            } else if ((kvf_peek(p)->kind == KVF_T_STR) || (kvf_peek(p)->kind == KVF_T_NUM) ||
                       ((kvf_peek(p)->kind == KVF_T_NAME) && !kvf_is_name(p, "and") &&
                        !kvf_is_name(p, "or") && !kvf_is_name(p, "else") &&
                        !kvf_is_name(p, "if"))) {
                kvf_add_arg(t, kvf_parse_primary(p), NULL);   /* is equalto 'x' */
            }
            e = t;
            continue;
        }
        break;
    }
    return e;
}

static kvf_expr_t *kvf_parse_not(kvf_ps_t *p)
{
    if (kvf_is_name(p, "not")) {
        kvf_expr_t *e = kvf_new(KVF_E_NOT);
        p->t->pos++;
        if (e != NULL) {
            e->a = kvf_parse_not(p);
        }
        return e;
    }
    return kvf_parse_compare(p);
}

static kvf_expr_t *kvf_parse_and(kvf_ps_t *p)
{
    kvf_expr_t *e = kvf_parse_not(p);

    while (kvf_is_name(p, "and")) {
        kvf_expr_t *x = kvf_new(KVF_E_AND);
        p->t->pos++;
        if (x == NULL) {
            break;
        }
        x->a = e;
        x->b = kvf_parse_not(p);
        e = x;
    }
    return e;
}

static kvf_expr_t *kvf_parse_or(kvf_ps_t *p)
{
    kvf_expr_t *e = kvf_parse_and(p);

    while (kvf_is_name(p, "or")) {
        kvf_expr_t *x = kvf_new(KVF_E_OR);
        p->t->pos++;
        if (x == NULL) {
            break;
        }
        x->a = e;
        x->b = kvf_parse_and(p);
        e = x;
    }
    return e;
}

static kvf_expr_t *kvf_parse_expr(kvf_ps_t *p)
{
    kvf_expr_t *e = kvf_parse_or(p);

    if (kvf_is_name(p, "if")) {
        kvf_expr_t *c = kvf_new(KVF_E_COND);
        p->t->pos++;
        if (c == NULL) {
            return e;
        }
        c->a = e;             /* value when true */
        c->b = kvf_parse_or(p);   /* condition */
        if (kvf_is_name(p, "else")) {
            p->t->pos++;
            c->c = kvf_parse_expr(p);
        }
        e = c;
    }
    return e;
}

/* ---- evaluation ------------------------------------------------------------------ */

static cJSON *kvf_eval(kvf_jx_t *x, const kvf_expr_t *e);

static const cJSON *kvf_lookup(kvf_jx_t *x, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(x->scope, name);

    return (v != NULL) ? v : cJSON_GetObjectItemCaseSensitive(x->globals, name);
}

static cJSON *kvf_dup(const cJSON *v)
{
    return (v == NULL) ? kvf_v_undef() : cJSON_Duplicate(v, true);
}

static double kvf_num(const cJSON *v)
{
    return cJSON_IsNumber(v) ? v->valuedouble : cJSON_IsTrue(v) ? 1 : 0;
}

/* Python-style index into a list or string of length n; -1: out of range. */
static long kvf_index(double d, long n)
{
    long i = (long)d;

    if (i < 0) {
        i += n;
    }
    return ((i < 0) || (i >= n)) ? -1 : i;
}

static cJSON *kvf_item(kvf_jx_t *x, const cJSON *obj, const cJSON *key)
{
    if (cJSON_IsObject(obj) && cJSON_IsString(key)) {
        return kvf_dup(cJSON_GetObjectItemCaseSensitive(obj, key->valuestring));
    }
    if (cJSON_IsArray(obj) && cJSON_IsNumber(key)) {
        long i = kvf_index(key->valuedouble, cJSON_GetArraySize(obj));
        return (i < 0) ? kvf_v_undef() : kvf_dup(cJSON_GetArrayItem(obj, (int)i));
    }
    if (cJSON_IsString(obj) && cJSON_IsNumber(key)) {
        long i = kvf_index(key->valuedouble, (long)strlen(obj->valuestring));
        char c[2] = {(i >= 0) ? obj->valuestring[i] : 0, 0};
        return (i < 0) ? kvf_v_undef() : cJSON_CreateString(c);
    }
    (void)x;
    return kvf_v_undef();
}

static cJSON *kvf_slice(const cJSON *v, const cJSON *lo, const cJSON *hi, const cJSON *st)
{
    long n = cJSON_IsString(v) ? (long)strlen(v->valuestring) : cJSON_GetArraySize(v);
    long step = (cJSON_IsNumber(st)) ? (long)st->valuedouble : 1;
    long a, b;
    cJSON *out;
    kvf_sb_t sb = {0};

    if (step == 0) {
        return kvf_v_undef();
    }
    if (step > 0) {
        a = cJSON_IsNumber(lo) ? (long)lo->valuedouble : 0;
        b = cJSON_IsNumber(hi) ? (long)hi->valuedouble : n;
        a = (a < 0) ? ((a + n < 0) ? 0 : a + n) : ((a > n) ? n : a);
        b = (b < 0) ? ((b + n < 0) ? 0 : b + n) : ((b > n) ? n : b);
    } else {
        a = cJSON_IsNumber(lo) ? (long)lo->valuedouble : n - 1;
        b = cJSON_IsNumber(hi) ? (long)hi->valuedouble : -n - 1;
        a = (a < 0) ? ((a + n < 0) ? -1 : a + n) : ((a >= n) ? n - 1 : a);
        b = (b < 0) ? ((b + n < 0) ? -1 : b + n) : ((b >= n) ? n - 1 : b);
    }
    out = cJSON_IsString(v) ? NULL : cJSON_CreateArray();
    kvf_sb_add(&sb, "", 0);
    for (long i = a; (step > 0) ? (i < b) : (i > b); i += step) {
        if (cJSON_IsString(v)) {
            kvf_sb_add(&sb, v->valuestring + i, 1);
        } else if (out != NULL) {
            cJSON_AddItemToArray(out, cJSON_Duplicate(cJSON_GetArrayItem(v, (int)i), true));
        }
    }
    if (cJSON_IsString(v)) {
        return kvf_v_take_str(sb.s);
    }
    free(sb.s);
    return out;
}

static bool kvf_in(const cJSON *a, const cJSON *b)
{
    const cJSON *c;

    if (cJSON_IsString(b)) {
        return cJSON_IsString(a) && (strstr(b->valuestring, a->valuestring) != NULL);
    }
    if (cJSON_IsObject(b)) {
        return cJSON_IsString(a) && (cJSON_GetObjectItemCaseSensitive(b, a->valuestring) != NULL);
    }
    cJSON_ArrayForEach(c, b) {
        if (cJSON_Compare(a, c, true)) {
            return true;
        }
    }
    return false;
}

static cJSON *kvf_binop(kvf_jx_t *x, const char *op, const cJSON *a, const cJSON *b)
{
    if (!strcmp(op, "~")) {
        char *s1 = kvf_v_tostr(a), *s2 = kvf_v_tostr(b);
        kvf_sb_t sb = {0};
        kvf_sb_str(&sb, s1 ? s1 : "");
        kvf_sb_str(&sb, s2 ? s2 : "");
        free(s1);
        free(s2);
        return kvf_v_take_str(sb.s);
    }
    if (!strcmp(op, "==")) {
        return cJSON_CreateBool(cJSON_Compare(a, b, true) ||
                                (kvf_v_is_undef(a) && kvf_v_is_undef(b)));
    }
    if (!strcmp(op, "!=")) {
        return cJSON_CreateBool(!(cJSON_Compare(a, b, true) ||
                                  (kvf_v_is_undef(a) && kvf_v_is_undef(b))));
    }
    if (!strcmp(op, "+") && cJSON_IsString(a) && cJSON_IsString(b)) {
        kvf_sb_t sb = {0};
        kvf_sb_str(&sb, a->valuestring);
        kvf_sb_str(&sb, b->valuestring);
        return kvf_v_take_str(sb.s);
    }
    if (!strcmp(op, "+") && cJSON_IsArray(a) && cJSON_IsArray(b)) {
        cJSON *out = cJSON_Duplicate(a, true), *c;
        cJSON_ArrayForEach(c, b) {
            cJSON_AddItemToArray(out, cJSON_Duplicate(c, true));
        }
        return out;
    }
    if ((op[0] == '<') || (op[0] == '>')) {
        int c;
        if (cJSON_IsString(a) && cJSON_IsString(b)) {
            c = strcmp(a->valuestring, b->valuestring);
        } else if ((cJSON_IsNumber(a) || cJSON_IsBool(a)) &&
                   (cJSON_IsNumber(b) || cJSON_IsBool(b))) {
            double d = kvf_num(a) - kvf_num(b);
            c = (d < 0) ? -1 : (d > 0);
        } else {
            kvf_jx_fail(x, KVF_ERR_INVALID_PARAM, "'%s' between these types is not supported",
                        op);
            return kvf_v_undef();
        }
        return cJSON_CreateBool(!strcmp(op, "<") ? c < 0 : !strcmp(op, ">") ? c > 0 :
                                !strcmp(op, "<=") ? c <= 0 : c >= 0);
    }
    if ((cJSON_IsNumber(a) || cJSON_IsBool(a)) && (cJSON_IsNumber(b) || cJSON_IsBool(b))) {
        double p = kvf_num(a), q = kvf_num(b);
        if (((op[0] == '/') || (op[0] == '%')) && (q == 0)) {
            kvf_jx_fail(x, KVF_ERR_INVALID_PARAM, "division by zero");
            return kvf_v_undef();
        }
        return cJSON_CreateNumber(!strcmp(op, "+") ? p + q : !strcmp(op, "-") ? p - q :
                                  !strcmp(op, "*") ? p * q : !strcmp(op, "/") ? p / q :
                                  !strcmp(op, "//") ? floor(p / q) :
                                  !strcmp(op, "%") ? p - q * floor(p / q) : pow(p, q));
    }
    if (!strcmp(op, "*") && cJSON_IsString(a) && cJSON_IsNumber(b)) {
        kvf_sb_t sb = {0};
        kvf_sb_add(&sb, "", 0);
        for (int i = 0; i < (int)b->valuedouble; ++i) {
            kvf_sb_str(&sb, a->valuestring);
        }
        return kvf_v_take_str(sb.s);
    }
    kvf_jx_fail(x, KVF_ERR_INVALID_PARAM, "'%s' between these types is not supported", op);
    return kvf_v_undef();
}

/* An argument: positional @a pos or keyword @a kw; NULL when absent (evaluated, owned). */
static cJSON *kvf_arg(kvf_jx_t *x, const kvf_expr_t *e, int pos, const char *kw)
{
    int p = 0;

    for (int i = 0; i < e->nargs; ++i) {
        if ((e->kwnames[i] != NULL) ? ((kw != NULL) && !strcmp(e->kwnames[i], kw)) :
                                      (p++ == pos)) {
            return kvf_eval(x, e->args[i]);
        }
    }
    return NULL;
}

static const char *kvf_strip_set(const cJSON *chars)
{
    return cJSON_IsString(chars) ? chars->valuestring : " \t\n\r\f\v";
}

static cJSON *kvf_strip(const char *s, const char *set, bool left, bool right)
{
    size_t a = 0, b = strlen(s);

    while (left && (a < b) && strchr(set, s[a])) {
        ++a;
    }
    while (right && (b > a) && strchr(set, s[b - 1])) {
        --b;
    }
    {
        char *t = strndup(s + a, b - a);
        return kvf_v_take_str(t);
    }
}

static cJSON *kvf_replace(const char *s, const char *from, const char *to)
{
    kvf_sb_t sb = {0};
    size_t fl = strlen(from);

    kvf_sb_add(&sb, "", 0);
    if (fl == 0) {
        kvf_sb_str(&sb, s);
        return kvf_v_take_str(sb.s);
    }
    for (const char *p = s;;) {
        const char *h = strstr(p, from);
        if (h == NULL) {
            kvf_sb_str(&sb, p);
            break;
        }
        kvf_sb_add(&sb, p, (size_t)(h - p));
        kvf_sb_str(&sb, to);
        p = h + fl;
    }
    return kvf_v_take_str(sb.s);
}

static cJSON *kvf_split(const char *s, const cJSON *sep)
{
    cJSON *out = cJSON_CreateArray();

    if (cJSON_IsString(sep) && (sep->valuestring[0] != '\0')) {
        size_t l = strlen(sep->valuestring);
        for (const char *p = s;;) {
            const char *h = strstr(p, sep->valuestring);
            char *t = strndup(p, (h != NULL) ? (size_t)(h - p) : strlen(p));
            cJSON_AddItemToArray(out, kvf_v_take_str(t));
            if (h == NULL) {
                break;
            }
            p = h + l;
        }
    } else {
        const char *p = s;
        for (;;) {
            const char *a;
            while (*p && isspace((unsigned char)*p)) {
                ++p;
            }
            if (!*p) {
                break;
            }
            a = p;
            while (*p && !isspace((unsigned char)*p)) {
                ++p;
            }
            cJSON_AddItemToArray(out, kvf_v_take_str(strndup(a, (size_t)(p - a))));
        }
    }
    return out;
}

static cJSON *kvf_case(const char *s, int mode)   /* 0 lower, 1 upper, 2 capitalize, 3 title */
{
    char *t = strdup(s);
    bool start = true;

    for (size_t i = 0; t && t[i]; ++i) {
        unsigned char c = (unsigned char)t[i];
        if (mode == 0) {
            t[i] = (char)tolower(c);
        } else if (mode == 1) {
            t[i] = (char)toupper(c);
        } else if (mode == 2) {
            t[i] = (char)((i == 0) ? toupper(c) : tolower(c));
        } else {
            t[i] = (char)(start ? toupper(c) : tolower(c));
            start = !isalnum(c);
        }
    }
    return kvf_v_take_str(t);
}

/* obj.method(args) for strings and dicts. */
static cJSON *kvf_method(kvf_jx_t *x, const cJSON *obj, const char *m, const kvf_expr_t *call)
{
    cJSON *a0 = kvf_arg(x, call, 0, NULL), *a1 = kvf_arg(x, call, 1, NULL), *r = NULL;

    if (cJSON_IsString(obj)) {
        const char *s = obj->valuestring;
        if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip")) {
            r = kvf_strip(s, kvf_strip_set(a0), m[0] != 'r', m[0] != 'l');
        } else if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) {
            size_t n = strlen(s), k = cJSON_IsString(a0) ? strlen(a0->valuestring) : 0;
            bool ok = cJSON_IsString(a0) && (k <= n) &&
                      !strncmp((m[0] == 's') ? s : s + n - k, a0->valuestring, k);
            r = cJSON_CreateBool(ok);
        } else if (!strcmp(m, "split")) {
            r = kvf_split(s, a0);
        } else if (!strcmp(m, "replace") && cJSON_IsString(a0) && cJSON_IsString(a1)) {
            r = kvf_replace(s, a0->valuestring, a1->valuestring);
        } else if (!strcmp(m, "lower") || !strcmp(m, "upper") || !strcmp(m, "capitalize") ||
                   !strcmp(m, "title")) {
            r = kvf_case(s, !strcmp(m, "lower") ? 0 : !strcmp(m, "upper") ? 1 :
                         !strcmp(m, "capitalize") ? 2 : 3);
        }
    } else if (cJSON_IsObject(obj)) {
        if (!strcmp(m, "get")) {
            const cJSON *v = cJSON_IsString(a0) ?
                             cJSON_GetObjectItemCaseSensitive(obj, a0->valuestring) : NULL;
            r = (v != NULL) ? cJSON_Duplicate(v, true) :
                (a1 != NULL) ? cJSON_Duplicate(a1, true) : cJSON_CreateNull();
        } else if (!strcmp(m, "items") || !strcmp(m, "keys") || !strcmp(m, "values")) {
            const cJSON *c;
            r = cJSON_CreateArray();
            cJSON_ArrayForEach(c, obj) {
                if (m[0] == 'i') {
                    cJSON *pair = cJSON_CreateArray();
                    cJSON_AddItemToArray(pair, cJSON_CreateString(c->string));
                    cJSON_AddItemToArray(pair, cJSON_Duplicate(c, true));
                    cJSON_AddItemToArray(r, pair);
                } else {
                    cJSON_AddItemToArray(r, (m[0] == 'k') ? cJSON_CreateString(c->string) :
                                                            cJSON_Duplicate(c, true));
                }
            }
        }
    }
    cJSON_Delete(a0);
    cJSON_Delete(a1);
    if (r == NULL) {
        kvf_jx_fail(x, KVF_ERR_UNSUPPORTED, "method '%s' is not supported on this value", m);
        return kvf_v_undef();
    }
    return r;
}

static cJSON *kvf_call(kvf_jx_t *x, const kvf_expr_t *e)
{
    const kvf_expr_t *f = e->a;

    if (f->kind == KVF_E_ATTR) {
        cJSON *obj = kvf_eval(x, f->a), *r = kvf_method(x, obj, f->name, e);
        cJSON_Delete(obj);
        return r;
    }
    if ((f->kind == KVF_E_NAME) && !strcmp(f->name, "raise_exception")) {
        cJSON *m = kvf_arg(x, e, 0, NULL);
        kvf_jx_fail(x, KVF_ERR_INVALID_PARAM, "%s",
                    cJSON_IsString(m) ? m->valuestring : "raise_exception()");
        cJSON_Delete(m);
        return kvf_v_undef();
    }
    if ((f->kind == KVF_E_NAME) && !strcmp(f->name, "namespace")) {
        cJSON *ns = cJSON_CreateObject();
        for (int i = 0; i < e->nargs; ++i) {
            if (e->kwnames[i] != NULL) {
                cJSON_AddItemToObject(ns, e->kwnames[i], kvf_eval(x, e->args[i]));
            }
        }
        return ns;
    }
    if ((f->kind == KVF_E_NAME) && !strcmp(f->name, "range")) {
        cJSON *a = kvf_arg(x, e, 0, NULL), *b = kvf_arg(x, e, 1, NULL), *r = cJSON_CreateArray();
        double lo = (b != NULL) ? kvf_num(a) : 0, hi = (b != NULL) ? kvf_num(b) : kvf_num(a);
        for (double i = lo; (i < hi) && (i - lo < 100000); ++i) {
            cJSON_AddItemToArray(r, cJSON_CreateNumber(i));
        }
        cJSON_Delete(a);
        cJSON_Delete(b);
        return r;
    }
    kvf_jx_fail(x, KVF_ERR_UNSUPPORTED, "calling '%s' is not supported",
                (f->kind == KVF_E_NAME) ? f->name : "this value");
    return kvf_v_undef();
}

static bool kvf_test(kvf_jx_t *x, const kvf_expr_t *e, const cJSON *v)
{
    const char *t = e->name;
    bool r;

    if (!strcmp(t, "defined")) {
        r = !kvf_v_is_undef(v);
    } else if (!strcmp(t, "undefined")) {
        r = kvf_v_is_undef(v);
    } else if (!strcmp(t, "none")) {
        r = cJSON_IsNull(v);
    } else if (!strcmp(t, "string")) {
        r = cJSON_IsString(v);
    } else if (!strcmp(t, "number")) {
        r = cJSON_IsNumber(v);
    } else if (!strcmp(t, "integer")) {
        r = cJSON_IsNumber(v) && (floor(v->valuedouble) == v->valuedouble);
    } else if (!strcmp(t, "float")) {
        r = cJSON_IsNumber(v) && (floor(v->valuedouble) != v->valuedouble);
    } else if (!strcmp(t, "boolean")) {
        r = cJSON_IsBool(v);
    } else if (!strcmp(t, "true") || !strcmp(t, "false")) {
        r = (t[0] == 't') ? cJSON_IsTrue(v) : cJSON_IsFalse(v);
    } else if (!strcmp(t, "mapping")) {
        r = cJSON_IsObject(v);
    } else if (!strcmp(t, "sequence") || !strcmp(t, "iterable")) {
        r = cJSON_IsArray(v) || cJSON_IsString(v) || cJSON_IsObject(v);
    } else if (!strcmp(t, "equalto") || !strcmp(t, "eq") || !strcmp(t, "sameas")) {
        cJSON *o = kvf_arg(x, e, 0, NULL);
        r = cJSON_Compare(v, o, true);
        cJSON_Delete(o);
    } else if (!strcmp(t, "odd") || !strcmp(t, "even")) {
        long n = (long)kvf_num(v);
        r = ((n % 2) != 0) == (t[0] == 'o');
    } else {
        kvf_jx_fail(x, KVF_ERR_UNSUPPORTED, "test '%s' is not supported", t);
        return false;
    }
    return r != e->negate;
}

static cJSON *kvf_filter(kvf_jx_t *x, const kvf_expr_t *e)
{
    const char *f = e->name;
    cJSON *v = kvf_eval(x, e->a), *r = NULL;

    if (!strcmp(f, "trim")) {
        char *s = kvf_v_tostr(v);
        r = kvf_strip(s ? s : "", " \t\n\r\f\v", true, true);
        free(s);
    } else if (!strcmp(f, "length") || !strcmp(f, "count")) {
        r = cJSON_CreateNumber(cJSON_IsString(v) ? (double)strlen(v->valuestring) :
                               (double)cJSON_GetArraySize(v));
    } else if (!strcmp(f, "string")) {
        r = kvf_v_take_str(kvf_v_tostr(v));
    } else if (!strcmp(f, "safe") || !strcmp(f, "list")) {
        r = cJSON_Duplicate(v, true);
    } else if (!strcmp(f, "int")) {
        r = cJSON_CreateNumber(cJSON_IsString(v) ? trunc(atof(v->valuestring)) :
                               trunc(kvf_num(v)));
    } else if (!strcmp(f, "lower") || !strcmp(f, "upper") || !strcmp(f, "capitalize") ||
               !strcmp(f, "title")) {
        char *s = kvf_v_tostr(v);
        r = kvf_case(s ? s : "", !strcmp(f, "lower") ? 0 : !strcmp(f, "upper") ? 1 :
                     !strcmp(f, "capitalize") ? 2 : 3);
        free(s);
    } else if (!strcmp(f, "default") || !strcmp(f, "d")) {
        cJSON *d = kvf_arg(x, e, 0, NULL), *b = kvf_arg(x, e, 1, "boolean");
        bool use = kvf_v_is_undef(v) || ((b != NULL) && kvf_v_truthy(b) && !kvf_v_truthy(v));
        r = use ? ((d != NULL) ? cJSON_Duplicate(d, true) : cJSON_CreateString("")) :
                  cJSON_Duplicate(v, true);
        cJSON_Delete(d);
        cJSON_Delete(b);
    } else if (!strcmp(f, "first") || !strcmp(f, "last")) {
        int n = cJSON_GetArraySize(v);
        r = (n == 0) ? kvf_v_undef() :
            cJSON_Duplicate(cJSON_GetArrayItem(v, (f[0] == 'f') ? 0 : n - 1), true);
    } else if (!strcmp(f, "reverse")) {
        cJSON *step = cJSON_CreateNumber(-1);
        r = kvf_slice(v, NULL, NULL, step);
        cJSON_Delete(step);
    } else if (!strcmp(f, "join")) {
        cJSON *sep = kvf_arg(x, e, 0, NULL), *c;
        kvf_sb_t sb = {0};
        bool first = true;
        kvf_sb_add(&sb, "", 0);
        cJSON_ArrayForEach(c, v) {
            char *s = kvf_v_tostr(c);
            if (!first && cJSON_IsString(sep)) {
                kvf_sb_str(&sb, sep->valuestring);
            }
            first = false;
            kvf_sb_str(&sb, s ? s : "");
            free(s);
        }
        cJSON_Delete(sep);
        r = kvf_v_take_str(sb.s);
    } else if (!strcmp(f, "tojson")) {
        cJSON *ind = kvf_arg(x, e, 0, "indent");
        kvf_sb_t sb = {0};
        kvf_sb_add(&sb, "", 0);
        kvf_json_dump(&sb, v, cJSON_IsNumber(ind) ? (int)ind->valuedouble : -1, 0);
        cJSON_Delete(ind);
        r = kvf_v_take_str(sb.s);
    } else if (!strcmp(f, "replace")) {
        cJSON *a = kvf_arg(x, e, 0, NULL), *b = kvf_arg(x, e, 1, NULL);
        char *s = kvf_v_tostr(v);
        r = (cJSON_IsString(a) && cJSON_IsString(b)) ?
            kvf_replace(s ? s : "", a->valuestring, b->valuestring) : NULL;
        free(s);
        cJSON_Delete(a);
        cJSON_Delete(b);
    } else if (!strcmp(f, "items")) {
        kvf_expr_t call = {0};
        r = kvf_method(x, v, "items", &call);
    } else if (!strcmp(f, "select") || !strcmp(f, "reject") || !strcmp(f, "selectattr") ||
               !strcmp(f, "rejectattr") || !strcmp(f, "map")) {
        bool attr = (strstr(f, "attr") != NULL) || !strcmp(f, "map");
        bool keep_true = (f[0] == 's') || (f[0] == 'm');
        cJSON *a0 = kvf_arg(x, e, 0, NULL), *test = attr ? kvf_arg(x, e, 1, NULL) : a0;
        cJSON *aname = !strcmp(f, "map") ? kvf_arg(x, e, 0, "attribute") : a0;
        const cJSON *c;
        r = cJSON_CreateArray();
        cJSON_ArrayForEach(c, v) {
            const cJSON *item = c;
            if (attr && cJSON_IsString(aname)) {
                item = cJSON_GetObjectItemCaseSensitive(c, aname->valuestring);
            }
            if (!strcmp(f, "map")) {
                cJSON_AddItemToArray(r, kvf_dup(item));
                continue;
            }
            {
                kvf_expr_t t = {0};
                kvf_expr_t *args[1];
                char *kws[1] = {NULL};
                t.kind = KVF_E_TEST;
                t.name = cJSON_IsString(test) ? test->valuestring : (char *)"defined";
                if (!attr && (e->nargs > 1)) {
                    args[0] = e->args[1];
                    t.args = args;
                    t.kwnames = kws;
                    t.nargs = 1;
                } else if (attr && (e->nargs > 2)) {
                    args[0] = e->args[2];
                    t.args = args;
                    t.kwnames = kws;
                    t.nargs = 1;
                }
                if (!cJSON_IsString(test) && !attr) {
                    t.name = (char *)"truthy";
                }
                if (!strcmp(t.name, "truthy") ? kvf_v_truthy(item) == keep_true :
                    kvf_test(x, &t, item) == keep_true) {
                    cJSON_AddItemToArray(r, cJSON_Duplicate(c, true));
                }
            }
        }
        if (aname != a0) {
            cJSON_Delete(aname);
        }
        if (test != a0) {
            cJSON_Delete(test);
        }
        cJSON_Delete(a0);
    }
    cJSON_Delete(v);
    if (r == NULL) {
        kvf_jx_fail(x, KVF_ERR_UNSUPPORTED, "filter '%s' is not supported", f);
        return kvf_v_undef();
    }
    return r;
}

static cJSON *kvf_eval(kvf_jx_t *x, const kvf_expr_t *e)
{
    cJSON *a, *b, *r;

    if ((e == NULL) || (x->status != KVF_OK)) {
        return kvf_v_undef();
    }
    switch (e->kind) {
    case KVF_E_LIT:
        return cJSON_Duplicate(e->lit, true);
    case KVF_E_NONE_SLOT:
        return cJSON_CreateNull();
    case KVF_E_NAME:
        return kvf_dup(kvf_lookup(x, e->name));
    case KVF_E_LIST:
    case KVF_E_DICT:
        r = (e->kind == KVF_E_LIST) ? cJSON_CreateArray() : cJSON_CreateObject();
        for (int i = 0; i < e->nargs; ++i) {
            if (e->kind == KVF_E_LIST) {
                cJSON_AddItemToArray(r, kvf_eval(x, e->args[i]));
            } else {
                cJSON *k = kvf_eval(x, e->args[i++]);
                cJSON *v = (i < e->nargs) ? kvf_eval(x, e->args[i]) : kvf_v_undef();
                char *ks = kvf_v_tostr(k);
                cJSON_AddItemToObject(r, ks ? ks : "", v);
                free(ks);
                cJSON_Delete(k);
            }
        }
        return r;
    case KVF_E_ATTR:
        a = kvf_eval(x, e->a);
        r = cJSON_IsObject(a) ? kvf_dup(cJSON_GetObjectItemCaseSensitive(a, e->name)) :
                                kvf_v_undef();
        cJSON_Delete(a);
        return r;
    case KVF_E_ITEM:
        a = kvf_eval(x, e->a);
        b = kvf_eval(x, e->b);
        r = kvf_item(x, a, b);
        cJSON_Delete(a);
        cJSON_Delete(b);
        return r;
    case KVF_E_SLICE: {
        cJSON *lo = kvf_eval(x, e->b), *hi = kvf_eval(x, e->c), *st = kvf_eval(x, e->args[0]);
        a = kvf_eval(x, e->a);
        r = kvf_slice(a, lo, hi, st);
        cJSON_Delete(a);
        cJSON_Delete(lo);
        cJSON_Delete(hi);
        cJSON_Delete(st);
        return r;
    }
    case KVF_E_CALL:
        return kvf_call(x, e);
    case KVF_E_FILTER:
        return kvf_filter(x, e);
    case KVF_E_TEST:
        a = kvf_eval(x, e->a);
        r = cJSON_CreateBool(kvf_test(x, e, a));
        cJSON_Delete(a);
        return r;
    case KVF_E_BIN:
        a = kvf_eval(x, e->a);
        b = kvf_eval(x, e->b);
        if (!strcmp(e->name, "in")) {
            r = cJSON_CreateBool(kvf_in(a, b) != e->negate);
        } else {
            r = kvf_binop(x, e->name, a, b);
        }
        cJSON_Delete(a);
        cJSON_Delete(b);
        return r;
    case KVF_E_NOT:
        a = kvf_eval(x, e->a);
        r = cJSON_CreateBool(!kvf_v_truthy(a));
        cJSON_Delete(a);
        return r;
    case KVF_E_NEG:
        a = kvf_eval(x, e->a);
        r = cJSON_CreateNumber(-kvf_num(a));
        cJSON_Delete(a);
        return r;
    case KVF_E_AND:
    case KVF_E_OR:
        a = kvf_eval(x, e->a);
        if (kvf_v_truthy(a) == (e->kind == KVF_E_OR)) {
            return a;   /* Python's and/or return an operand */
        }
        cJSON_Delete(a);
        return kvf_eval(x, e->b);
    case KVF_E_COND:
        a = kvf_eval(x, e->b);
        r = kvf_v_truthy(a) ? kvf_eval(x, e->a) :
            (e->c != NULL) ? kvf_eval(x, e->c) : kvf_v_undef();
        cJSON_Delete(a);
        return r;
    }
    return kvf_v_undef();
}

/* ---- statements -------------------------------------------------------------------- */

typedef enum { KVF_S_TEXT, KVF_S_OUT, KVF_S_IF, KVF_S_FOR, KVF_S_SET, KVF_S_BLOCK } kvf_skind_t;

typedef struct kvf_node kvf_node_t;
typedef struct {
    kvf_node_t **v;
    int          n;
} kvf_body_t;

struct kvf_node {
    kvf_skind_t kind;
    const char *text;        /* TEXT */
    size_t      len;
    kvf_expr_t *expr;        /* OUT, SET value, FOR iterable, IF: conds[i] */
    kvf_expr_t **conds;      /* IF: one per branch (NULL: else) */
    kvf_body_t *branches;    /* IF: per branch; FOR: [0] body, [1] else */
    int         nbranch;
    char       *target[2];   /* FOR: loop names; SET: name[.attr] in target[0], target[1] */
    kvf_expr_t *filter;      /* FOR ... if cond */
};

static void kvf_body_free(kvf_body_t *b);

static void kvf_node_free(kvf_node_t *n)
{
    if (n == NULL) {
        return;
    }
    kvf_expr_free(n->expr);
    kvf_expr_free(n->filter);
    for (int i = 0; i < n->nbranch; ++i) {
        if (n->conds != NULL) {
            kvf_expr_free(n->conds[i]);
        }
        kvf_body_free(&n->branches[i]);
    }
    free(n->conds);
    free(n->branches);
    free(n->target[0]);
    free(n->target[1]);
    free(n);
}

static void kvf_body_free(kvf_body_t *b)
{
    for (int i = 0; i < b->n; ++i) {
        kvf_node_free(b->v[i]);
    }
    free(b->v);
    b->v = NULL;
    b->n = 0;
}

static bool kvf_body_push(kvf_body_t *b, kvf_node_t *n)
{
    kvf_node_t **v = realloc(b->v, (size_t)(b->n + 1) * sizeof(*v));

    if ((v == NULL) || (n == NULL)) {
        kvf_node_free(n);
        return false;
    }
    b->v = v;
    b->v[b->n++] = n;
    return true;
}

typedef struct {
    kvf_pieces_t *pc;
    int           i;
    char         *err;
    size_t        cap;
    kvf_status_t  status;
} kvf_sp_t;

/* The first word of a statement piece. */
static void kvf_stmt_word(const kvf_piece_t *p, char *w, size_t cap)
{
    size_t a = 0, b;

    while ((a < p->n) && isspace((unsigned char)p->s[a])) {
        ++a;
    }
    b = a;
    while ((b < p->n) && (isalnum((unsigned char)p->s[b]) || (p->s[b] == '_'))) {
        ++b;
    }
    snprintf(w, cap, "%.*s", (int)(b - a), p->s + a);
}

/* Tokens of a statement piece after its first word. */
static kvf_status_t kvf_stmt_toks(kvf_sp_t *sp, const kvf_piece_t *p, kvf_toks_t *t)
{
    kvf_status_t st = kvf_tokenize(p->s, p->n, t, sp->err, sp->cap);

    if (st == KVF_OK) {
        t->pos = 1;
    }
    return st;
}

static kvf_expr_t *kvf_stmt_expr(kvf_sp_t *sp, kvf_toks_t *t)
{
    kvf_ps_t ps = {t, sp->err, sp->cap, KVF_OK};
    kvf_expr_t *e = kvf_parse_expr(&ps);

    if ((ps.status == KVF_OK) && (kvf_peek(&ps)->kind != KVF_T_END)) {
        kvf_ps_fail(&ps, KVF_ERR_PARSE, "unexpected text after the expression");
    }
    if (ps.status != KVF_OK) {
        sp->status = ps.status;
        kvf_expr_free(e);
        return NULL;
    }
    return e;
}

static void kvf_sp_fail(kvf_sp_t *sp, kvf_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void kvf_sp_fail(kvf_sp_t *sp, kvf_status_t st, const char *fmt, ...)
{
    va_list ap;

    if (sp->status != KVF_OK) {
        return;
    }
    sp->status = st;
    va_start(ap, fmt);
    vsnprintf(sp->err, sp->cap, fmt, ap);
    va_end(ap);
}

/* Parse pieces into @a body until a statement whose first word is in @a stops; its word. */
static void kvf_parse_body(kvf_sp_t *sp, kvf_body_t *body, const char *const *stops,
                           char *stopped, size_t scap)
{
    stopped[0] = '\0';
    while ((sp->status == KVF_OK) && (sp->i < sp->pc->n)) {
        const kvf_piece_t *p = &sp->pc->v[sp->i];
        char w[32];
        kvf_node_t *n;

        if (p->kind == KVF_P_TEXT) {
            n = calloc(1, sizeof(*n));
            if (n != NULL) {
                n->kind = KVF_S_TEXT;
                n->text = p->s;
                n->len = p->n;
            }
            kvf_body_push(body, n);
            sp->i++;
            continue;
        }
        if (p->kind == KVF_P_EXPR) {
            kvf_toks_t t;
            n = calloc(1, sizeof(*n));
            if ((n == NULL) || (kvf_tokenize(p->s, p->n, &t, sp->err, sp->cap) != KVF_OK)) {
                free(n);
                kvf_sp_fail(sp, KVF_ERR_PARSE, "bad expression at offset %zu", p->at);
                return;
            }
            n->kind = KVF_S_OUT;
            n->expr = kvf_stmt_expr(sp, &t);
            kvf_toks_free(&t);
            kvf_body_push(body, n);
            sp->i++;
            continue;
        }
        kvf_stmt_word(p, w, sizeof(w));
        for (int k = 0; stops[k] != NULL; ++k) {
            if (!strcmp(w, stops[k])) {
                snprintf(stopped, scap, "%s", w);
                return;
            }
        }
        sp->i++;
        n = calloc(1, sizeof(*n));
        if (n == NULL) {
            sp->status = KVF_ERR_NO_MEMORY;
            return;
        }
        if (!strcmp(w, "if")) {
            static const char *const st[] = {"elif", "else", "endif", NULL};
            char end[32];
            kvf_toks_t t;
            n->kind = KVF_S_IF;
            n->conds = calloc(64, sizeof(*n->conds));
            n->branches = calloc(64, sizeof(*n->branches));
            if ((n->conds == NULL) || (n->branches == NULL) ||
                (kvf_stmt_toks(sp, p, &t) != KVF_OK)) {
                kvf_node_free(n);
                kvf_sp_fail(sp, KVF_ERR_NO_MEMORY, "out of memory");
                return;
            }
            n->conds[0] = kvf_stmt_expr(sp, &t);
            kvf_toks_free(&t);
            n->nbranch = 1;
            for (;;) {
                kvf_parse_body(sp, &n->branches[n->nbranch - 1], st, end, sizeof(end));
                if ((sp->status != KVF_OK) || (end[0] == '\0') || !strcmp(end, "endif")) {
                    break;
                }
                if (n->nbranch == 64) {
                    kvf_sp_fail(sp, KVF_ERR_UNSUPPORTED, "more than 63 elif branches");
                    break;
                }
                p = &sp->pc->v[sp->i++];
                if (!strcmp(end, "elif")) {
                    if (kvf_stmt_toks(sp, p, &t) != KVF_OK) {
                        break;
                    }
                    n->conds[n->nbranch] = kvf_stmt_expr(sp, &t);
                    kvf_toks_free(&t);
                }
                n->nbranch++;
            }
            if ((sp->status == KVF_OK) && strcmp(end, "endif")) {
                kvf_sp_fail(sp, KVF_ERR_PARSE, "'if' without 'endif'");
            }
            sp->i++;
        } else if (!strcmp(w, "for")) {
            static const char *const st[] = {"else", "endfor", NULL};
            char end[32];
            kvf_toks_t t;
            kvf_ps_t ps;
            n->kind = KVF_S_FOR;
            n->branches = calloc(2, sizeof(*n->branches));
            n->nbranch = 2;
            if ((n->branches == NULL) || (kvf_stmt_toks(sp, p, &t) != KVF_OK)) {
                kvf_node_free(n);
                kvf_sp_fail(sp, KVF_ERR_PARSE, "bad for");
                return;
            }
            ps = (kvf_ps_t){&t, sp->err, sp->cap, KVF_OK};
            for (int k = 0; k < 2; ++k) {
                if (kvf_peek(&ps)->kind != KVF_T_NAME) {
                    break;
                }
                n->target[k] = strdup(kvf_peek(&ps)->text);
                t.pos++;
                if (!kvf_is_op(&ps, ",")) {
                    break;
                }
                t.pos++;
            }
            if ((n->target[0] == NULL) || !kvf_is_name(&ps, "in")) {
                kvf_toks_free(&t);
                kvf_node_free(n);
                kvf_sp_fail(sp, KVF_ERR_PARSE, "'for' needs 'name in expression' (offset %zu)",
                            p->at);
                return;
            }
            t.pos++;
            n->expr = kvf_parse_or(&ps);
            if (kvf_is_name(&ps, "if")) {
                t.pos++;
                n->filter = kvf_parse_or(&ps);
            }
            if (kvf_is_name(&ps, "recursive") || (kvf_peek(&ps)->kind != KVF_T_END)) {
                kvf_ps_fail(&ps, KVF_ERR_UNSUPPORTED, "unsupported text in 'for'");
            }
            if (ps.status != KVF_OK) {
                sp->status = ps.status;
            }
            kvf_toks_free(&t);
            kvf_parse_body(sp, &n->branches[0], st, end, sizeof(end));
            if (!strcmp(end, "else")) {
                static const char *const st2[] = {"endfor", NULL};
                sp->i++;
                kvf_parse_body(sp, &n->branches[1], st2, end, sizeof(end));
            }
            if ((sp->status == KVF_OK) && strcmp(end, "endfor")) {
                kvf_sp_fail(sp, KVF_ERR_PARSE, "'for' without 'endfor'");
            }
            sp->i++;
        } else if (!strcmp(w, "set")) {
            kvf_toks_t t;
            kvf_ps_t ps;
            n->kind = KVF_S_SET;
            if (kvf_stmt_toks(sp, p, &t) != KVF_OK) {
                kvf_node_free(n);
                return;
            }
            ps = (kvf_ps_t){&t, sp->err, sp->cap, KVF_OK};
            if (kvf_peek(&ps)->kind == KVF_T_NAME) {
                n->target[0] = strdup(kvf_peek(&ps)->text);
                t.pos++;
                if (kvf_is_op(&ps, ".") && (t.v[t.pos + 1].kind == KVF_T_NAME)) {
                    n->target[1] = strdup(t.v[t.pos + 1].text);
                    t.pos += 2;
                }
            }
            if ((n->target[0] == NULL) || !kvf_is_op(&ps, "=")) {
                kvf_toks_free(&t);
                kvf_node_free(n);
                kvf_sp_fail(sp, KVF_ERR_UNSUPPORTED, "only 'set name = value' and 'set "
                            "ns.attr = value' are supported (offset %zu)", p->at);
                return;
            }
            t.pos++;
            n->expr = kvf_stmt_expr(sp, &t);
            kvf_toks_free(&t);
        } else if (!strcmp(w, "generation")) {
            static const char *const st[] = {"endgeneration", NULL};
            char end[32];
            n->kind = KVF_S_BLOCK;
            n->branches = calloc(1, sizeof(*n->branches));
            n->nbranch = 1;
            if (n->branches == NULL) {
                kvf_node_free(n);
                return;
            }
            kvf_parse_body(sp, &n->branches[0], st, end, sizeof(end));
            sp->i++;
        } else {
            kvf_node_free(n);
            kvf_sp_fail(sp, KVF_ERR_UNSUPPORTED, "statement '%s' is not supported (offset %zu)",
                        w, p->at);
            return;
        }
        kvf_body_push(body, n);
    }
}

static void kvf_run(kvf_jx_t *x, const kvf_body_t *b);

static void kvf_set_var(kvf_jx_t *x, const char *name, cJSON *v)
{
    if (cJSON_GetObjectItemCaseSensitive(x->scope, name) != NULL) {
        cJSON_ReplaceItemInObjectCaseSensitive(x->scope, name, v);
    } else {
        cJSON_AddItemToObject(x->scope, name, v);
    }
}

static void kvf_run_for(kvf_jx_t *x, const kvf_node_t *n)
{
    cJSON *seq = kvf_eval(x, n->expr), *items = cJSON_CreateArray(), *c;
    cJSON *before = cJSON_Duplicate(x->scope, true), *outer_sets = x->loop_sets;
    int len, i = 0;
    cJSON *saved[3] = {NULL, NULL, NULL};
    const char *names[3] = {n->target[0], n->target[1], "loop"};

    /* the items (dict: its keys, or (key, value) pairs for two targets), filtered */
    if (cJSON_IsObject(seq)) {
        cJSON_ArrayForEach(c, seq) {
            if (n->target[1] != NULL) {
                cJSON *pair = cJSON_CreateArray();
                cJSON_AddItemToArray(pair, cJSON_CreateString(c->string));
                cJSON_AddItemToArray(pair, cJSON_Duplicate(c, true));
                cJSON_AddItemToArray(items, pair);
            } else {
                cJSON_AddItemToArray(items, cJSON_CreateString(c->string));
            }
        }
    } else if (cJSON_IsString(seq)) {
        for (const char *p = seq->valuestring; *p; ++p) {
            char s[2] = {*p, 0};
            cJSON_AddItemToArray(items, cJSON_CreateString(s));
        }
    } else if (cJSON_IsArray(seq)) {
        cJSON_ArrayForEach(c, seq) {
            cJSON_AddItemToArray(items, cJSON_Duplicate(c, true));
        }
    } else if (!kvf_v_is_undef(seq) && !cJSON_IsNull(seq)) {
        kvf_jx_fail(x, KVF_ERR_INVALID_PARAM, "'for' over a value that is not iterable");
    }
    cJSON_Delete(seq);
    for (int k = 0; k < 3; ++k) {
        if (names[k] != NULL) {
            c = cJSON_DetachItemFromObjectCaseSensitive(x->scope, names[k]);
            saved[k] = c;
        }
    }
    if (n->filter != NULL) {
        cJSON *kept = cJSON_CreateArray();
        while ((items->child != NULL) && (x->status == KVF_OK)) {
            cJSON *it = cJSON_DetachItemViaPointer(items, items->child), *ok;
            kvf_set_var(x, n->target[0], cJSON_Duplicate(it, true));
            ok = kvf_eval(x, n->filter);
            if (kvf_v_truthy(ok)) {
                cJSON_AddItemToArray(kept, it);
            } else {
                cJSON_Delete(it);
            }
            cJSON_Delete(ok);
        }
        cJSON_Delete(items);
        items = kept;
    }
    len = cJSON_GetArraySize(items);
    x->loop_sets = cJSON_CreateObject();
    cJSON_ArrayForEach(c, items) {
        cJSON *loop = cJSON_CreateObject();
        if (x->status != KVF_OK) {
            cJSON_Delete(loop);
            break;
        }
        cJSON_AddNumberToObject(loop, "index0", i);
        cJSON_AddNumberToObject(loop, "index", i + 1);
        cJSON_AddNumberToObject(loop, "revindex0", len - i - 1);
        cJSON_AddNumberToObject(loop, "revindex", len - i);
        cJSON_AddBoolToObject(loop, "first", i == 0);
        cJSON_AddBoolToObject(loop, "last", i == len - 1);
        cJSON_AddNumberToObject(loop, "length", len);
        if (i > 0) {
            cJSON_AddItemToObject(loop, "previtem", cJSON_Duplicate(c->prev, true));
        }
        if (c->next != NULL) {
            cJSON_AddItemToObject(loop, "nextitem", cJSON_Duplicate(c->next, true));
        }
        kvf_set_var(x, "loop", loop);
        if (n->target[1] != NULL) {
            kvf_set_var(x, n->target[0], kvf_dup(cJSON_GetArrayItem(c, 0)));
            kvf_set_var(x, n->target[1], kvf_dup(cJSON_GetArrayItem(c, 1)));
        } else {
            kvf_set_var(x, n->target[0], cJSON_Duplicate(c, true));
        }
        kvf_run(x, &n->branches[0]);
        ++i;
    }
    cJSON_Delete(items);
    /* names set inside the loop end with it: back to their value before (namespaces,
     * changed through 'set ns.attr', keep their changes) */
    cJSON_ArrayForEach(c, x->loop_sets) {
        const cJSON *old = cJSON_GetObjectItemCaseSensitive(before, c->string);
        cJSON_DeleteItemFromObjectCaseSensitive(x->scope, c->string);
        if (old != NULL) {
            cJSON_AddItemToObject(x->scope, c->string, cJSON_Duplicate(old, true));
        }
    }
    cJSON_Delete(x->loop_sets);
    cJSON_Delete(before);
    x->loop_sets = outer_sets;
    /* the loop's names end with it too */
    for (int k = 0; k < 3; ++k) {
        if (names[k] != NULL) {
            cJSON_DeleteItemFromObjectCaseSensitive(x->scope, names[k]);
            if (saved[k] != NULL) {
                cJSON_AddItemToObject(x->scope, names[k], saved[k]);
            }
        }
    }
    if (len == 0) {
        kvf_run(x, &n->branches[1]);
    }
}

static void kvf_run(kvf_jx_t *x, const kvf_body_t *b)
{
    if (++x->depth > 64) {
        kvf_jx_fail(x, KVF_ERR_UNSUPPORTED, "nesting deeper than 64");
    }
    for (int i = 0; (i < b->n) && (x->status == KVF_OK); ++i) {
        const kvf_node_t *n = b->v[i];
        cJSON *v;

        switch (n->kind) {
        case KVF_S_TEXT:
            kvf_jx_emit(x, n->text, n->len);
            break;
        case KVF_S_OUT: {
            char *s;
            v = kvf_eval(x, n->expr);
            s = kvf_v_tostr(v);
            kvf_jx_emit(x, s ? s : "", s ? strlen(s) : 0);
            free(s);
            cJSON_Delete(v);
            break;
        }
        case KVF_S_IF:
            for (int k = 0; k < n->nbranch; ++k) {
                bool take = true;
                if (n->conds[k] != NULL) {
                    v = kvf_eval(x, n->conds[k]);
                    take = kvf_v_truthy(v);
                    cJSON_Delete(v);
                }
                if (take) {
                    kvf_run(x, &n->branches[k]);
                    break;
                }
            }
            break;
        case KVF_S_FOR:
            kvf_run_for(x, n);
            break;
        case KVF_S_SET:
            v = kvf_eval(x, n->expr);
            if (n->target[1] == NULL) {
                kvf_set_var(x, n->target[0], v);
                if ((x->loop_sets != NULL) &&
                    (cJSON_GetObjectItemCaseSensitive(x->loop_sets, n->target[0]) == NULL)) {
                    cJSON_AddTrueToObject(x->loop_sets, n->target[0]);
                }
            } else {
                cJSON *ns = cJSON_GetObjectItemCaseSensitive(x->scope, n->target[0]);
                if (!cJSON_IsObject(ns)) {
                    cJSON_Delete(v);
                    kvf_jx_fail(x, KVF_ERR_INVALID_PARAM, "'set %s.%s': not a namespace",
                                n->target[0], n->target[1]);
                    break;
                }
                if (cJSON_GetObjectItemCaseSensitive(ns, n->target[1]) != NULL) {
                    cJSON_ReplaceItemInObjectCaseSensitive(ns, n->target[1], v);
                } else {
                    cJSON_AddItemToObject(ns, n->target[1], v);
                }
            }
            break;
        case KVF_S_BLOCK:
            kvf_run(x, &n->branches[0]);
            break;
        }
    }
    x->depth--;
}

kvf_status_t kvf_proxy_jinja_render(const char *tmpl, const cJSON *vars, char **out_p,
                                    char *err, size_t cap)
{
    kvf_pieces_t pc = {0};
    kvf_body_t body = {0};
    kvf_sp_t sp = {&pc, 0, err, cap, KVF_OK};
    kvf_jx_t x;
    char stopped[32];
    static const char *const none[] = {NULL};
    kvf_status_t st;

    *out_p = NULL;
    err[0] = '\0';
    st = kvf_lex(tmpl, &pc, err, cap);
    if (st != KVF_OK) {
        free(pc.v);
        return st;
    }
    kvf_parse_body(&sp, &body, none, stopped, sizeof(stopped));
    if ((sp.status == KVF_OK) && (sp.i < pc.n)) {
        char w[32];
        kvf_stmt_word(&pc.v[sp.i], w, sizeof(w));
        kvf_sp_fail(&sp, KVF_ERR_PARSE, "unexpected '%s' at offset %zu", w, pc.v[sp.i].at);
    }
    if (sp.status != KVF_OK) {
        kvf_body_free(&body);
        free(pc.v);
        return sp.status;
    }
    memset(&x, 0, sizeof(x));
    x.err = err;
    x.cap = cap;
    x.status = KVF_OK;
    x.globals = vars;
    x.scope = cJSON_CreateObject();
    kvf_jx_emit(&x, "", 0);
    if (x.scope == NULL) {
        x.status = KVF_ERR_NO_MEMORY;
    } else {
        kvf_run(&x, &body);
    }
    cJSON_Delete(x.scope);
    kvf_body_free(&body);
    free(pc.v);
    if (x.status != KVF_OK) {
        free(x.out);
        return x.status;
    }
    *out_p = x.out;
    return KVF_OK;
}
