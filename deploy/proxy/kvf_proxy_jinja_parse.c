/*
 * The chat-template parser (kvf_proxy_jinja_int.h): tokens into expression trees by
 * recursive descent with Jinja's precedence (or < and < not < comparisons, in, is < ~ <
 * + - < * / // % < unary - < ** < postfix . [] () |filter), and template pieces into a
 * statement tree (if/elif/else, for/else, set, generation). A statement or form outside the
 * subset is refused by name (KVF_ERR_UNSUPPORTED).
 */
#include "kvf_proxy_jinja_int.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- expressions ---------------------------------------------------------------------- */

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
        kvf_jinja_sb_add(&b, "", 0);
        while (kvf_peek(p)->kind == KVF_T_STR) {
            kvf_jinja_sb_str(&b, kvf_peek(p)->text);
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

/* ---- statements ----------------------------------------------------------------------- */

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
        kvf_jinja_body_free(&n->branches[i]);
    }
    free(n->conds);
    free(n->branches);
    free(n->target[0]);
    free(n->target[1]);
    free(n);
}

void kvf_jinja_body_free(kvf_body_t *b)
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
    kvf_status_t st = kvf_jinja_tokenize(p->s, p->n, t, sp->err, sp->cap);

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

/* The statement parsers: each fills @a n from piece @a p (consumed) and what follows up to its
 * end tag; false: @a n was freed and the parse stops (sp->status says why). */
static void kvf_parse_body(kvf_sp_t *sp, kvf_body_t *body, const char *const *stops,
                           char *stopped, size_t scap);

/* {% if %} ... {% elif %} ... {% else %} ... {% endif %}. */
static bool kvf_parse_if(kvf_sp_t *sp, kvf_node_t *n, const kvf_piece_t *p)
{
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
        return false;
    }
    n->conds[0] = kvf_stmt_expr(sp, &t);
    kvf_jinja_toks_free(&t);
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
            kvf_jinja_toks_free(&t);
        }
        n->nbranch++;
    }
    if ((sp->status == KVF_OK) && strcmp(end, "endif")) {
        kvf_sp_fail(sp, KVF_ERR_PARSE, "'if' without 'endif'");
    }
    sp->i++;
    return true;
}

/* {% for a[, b] in expr [if cond] %} ... {% else %} ... {% endfor %}. */
static bool kvf_parse_for(kvf_sp_t *sp, kvf_node_t *n, const kvf_piece_t *p)
{
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
        return false;
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
        kvf_jinja_toks_free(&t);
        kvf_node_free(n);
        kvf_sp_fail(sp, KVF_ERR_PARSE, "'for' needs 'name in expression' (offset %zu)",
                    p->at);
        return false;
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
    kvf_jinja_toks_free(&t);
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
    return true;
}

/* {% set name = expr %} and {% set ns.attr = expr %}. */
static bool kvf_parse_set(kvf_sp_t *sp, kvf_node_t *n, const kvf_piece_t *p)
{
    kvf_toks_t t;
    kvf_ps_t ps;

    n->kind = KVF_S_SET;
    if (kvf_stmt_toks(sp, p, &t) != KVF_OK) {
        kvf_node_free(n);
        return false;
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
        kvf_jinja_toks_free(&t);
        kvf_node_free(n);
        kvf_sp_fail(sp, KVF_ERR_UNSUPPORTED, "only 'set name = value' and 'set "
                    "ns.attr = value' are supported (offset %zu)", p->at);
        return false;
    }
    t.pos++;
    n->expr = kvf_stmt_expr(sp, &t);
    kvf_jinja_toks_free(&t);
    return true;
}

/* {% generation %} ... {% endgeneration %} (run as a plain block). */
static bool kvf_parse_generation(kvf_sp_t *sp, kvf_node_t *n, const kvf_piece_t *p)
{
    static const char *const st[] = {"endgeneration", NULL};
    char end[32];

    (void)p;   /* the tag takes no arguments; what follows its word is not read */
    n->kind = KVF_S_BLOCK;
    n->branches = calloc(1, sizeof(*n->branches));
    n->nbranch = 1;
    if (n->branches == NULL) {
        kvf_node_free(n);
        return false;
    }
    kvf_parse_body(sp, &n->branches[0], st, end, sizeof(end));
    sp->i++;
    return true;
}

/* Any other statement: refused by name. */
static bool kvf_parse_unknown(kvf_sp_t *sp, kvf_node_t *n, const kvf_piece_t *p, const char *w)
{
    kvf_node_free(n);
    kvf_sp_fail(sp, KVF_ERR_UNSUPPORTED, "statement '%s' is not supported (offset %zu)", w,
                p->at);
    return false;
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
            if ((n == NULL) || (kvf_jinja_tokenize(p->s, p->n, &t, sp->err, sp->cap) != KVF_OK)) {
                free(n);
                kvf_sp_fail(sp, KVF_ERR_PARSE, "bad expression at offset %zu", p->at);
                return;
            }
            n->kind = KVF_S_OUT;
            n->expr = kvf_stmt_expr(sp, &t);
            kvf_jinja_toks_free(&t);
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
        if (!(!strcmp(w, "if") ? kvf_parse_if(sp, n, p) :
              !strcmp(w, "for") ? kvf_parse_for(sp, n, p) :
              !strcmp(w, "set") ? kvf_parse_set(sp, n, p) :
              !strcmp(w, "generation") ? kvf_parse_generation(sp, n, p) :
              kvf_parse_unknown(sp, n, p, w))) {
            return;
        }
        kvf_body_push(body, n);
    }
}

kvf_status_t kvf_jinja_parse(const char *tmpl, kvf_body_t *body, char *err, size_t cap)
{
    kvf_pieces_t pc = {0};
    kvf_sp_t sp = {&pc, 0, err, cap, KVF_OK};
    char stopped[32];
    static const char *const none[] = {NULL};
    kvf_status_t st = kvf_jinja_lex(tmpl, &pc, err, cap);

    if (st != KVF_OK) {
        free(pc.v);
        return st;
    }
    kvf_parse_body(&sp, body, none, stopped, sizeof(stopped));
    if ((sp.status == KVF_OK) && (sp.i < pc.n)) {
        char w[32];
        kvf_stmt_word(&pc.v[sp.i], w, sizeof(w));
        kvf_sp_fail(&sp, KVF_ERR_PARSE, "unexpected '%s' at offset %zu", w, pc.v[sp.i].at);
    }
    free(pc.v);
    return sp.status;
}
