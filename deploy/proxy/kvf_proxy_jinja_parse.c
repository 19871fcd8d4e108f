/*
 * The chat-template expression parser (kvf_proxy_jinja_int.h): tokens into expression trees
 * by recursive descent with jinja2's precedence (or < and < not < comparisons, in < ~ <
 * + - < * / // % < ** < unary - + < filters and is-tests < postfix . [] ()). A form outside the subset is
 * refused by name (KVF_ERR_UNSUPPORTED). The statements: kvf_proxy_jinja_stmt.c.
 */
#include "kvf_proxy_jinja_int.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- expressions ---------------------------------------------------------------------- */

void kvf_jinja_expr_free(kvf_expr_t *e)
{
    if (e == NULL) {
        return;
    }
    free(e->name);
    cJSON_Delete(e->lit);
    kvf_jinja_expr_free(e->a);
    kvf_jinja_expr_free(e->b);
    kvf_jinja_expr_free(e->c);
    for (int i = 0; i < e->nargs; ++i) {
        kvf_jinja_expr_free(e->args[i]);
        free(e->kwnames ? e->kwnames[i] : NULL);
    }
    free(e->args);
    free(e->kwnames);
    free(e);
}

kvf_expr_t *kvf_jinja_new(kvf_ekind_t k)
{
    kvf_expr_t *e = calloc(1, sizeof(*e));

    if (e != NULL) {
        e->kind = k;
    }
    return e;
}

kvf_tok_t *kvf_jinja_peek(kvf_ps_t *p)
{
    return &p->t->v[p->t->pos];
}

bool kvf_jinja_is_op(kvf_ps_t *p, const char *op)
{
    kvf_tok_t *t = kvf_jinja_peek(p);

    return (t->kind == KVF_T_OP) && (strcmp(t->text, op) == 0);
}

bool kvf_jinja_is_name(kvf_ps_t *p, const char *name)
{
    kvf_tok_t *t = kvf_jinja_peek(p);

    return (t->kind == KVF_T_NAME) && (strcmp(t->text, name) == 0);
}

void kvf_jinja_ps_fail(kvf_ps_t *p, kvf_status_t st, const char *what)
{
    kvf_tok_t *t = kvf_jinja_peek(p);

    if (p->status == KVF_OK) {
        p->status = st;
        snprintf(p->err, p->cap, "%s (at '%s')", what,
                 (t->kind == KVF_T_END) ? "end" : (t->text != NULL) ? t->text : "?");
    }
}

static bool kvf_expect_op(kvf_ps_t *p, const char *op)
{
    if (!kvf_jinja_is_op(p, op)) {
        char m[64];
        snprintf(m, sizeof(m), "expected '%s'", op);
        kvf_jinja_ps_fail(p, KVF_ERR_PARSE, m);
        return false;
    }
    p->t->pos++;
    return true;
}

static kvf_expr_t *kvf_parse_unary(kvf_ps_t *p);

bool kvf_jinja_add_arg(kvf_expr_t *e, kvf_expr_t *a, char *kw)
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
        kvf_jinja_expr_free(a);
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
    while (!kvf_jinja_is_op(p, ")")) {
        char *kw = NULL;
        kvf_tok_t *t = kvf_jinja_peek(p);
        if ((t->kind == KVF_T_NAME) && (p->t->v[p->t->pos + 1].kind == KVF_T_OP) &&
            (strcmp(p->t->v[p->t->pos + 1].text, "=") == 0)) {
            kw = strdup(t->text);
            p->t->pos += 2;
        }
        if (!kvf_jinja_add_arg(e, kvf_jinja_parse_expr(p), kw) || (p->status != KVF_OK)) {
            kvf_jinja_ps_fail(p, KVF_ERR_PARSE, "bad argument");
            return false;
        }
        if (!kvf_jinja_is_op(p, ",")) {
            break;
        }
        p->t->pos++;
    }
    return kvf_expect_op(p, ")");
}

static kvf_expr_t *kvf_parse_primary(kvf_ps_t *p)
{
    kvf_tok_t *t = kvf_jinja_peek(p);
    kvf_expr_t *e;

    if (t->kind == KVF_T_NUM) {
        p->t->pos++;
        e = kvf_jinja_new(KVF_E_LIT);
        if (e != NULL) {
            e->lit = cJSON_CreateNumber(t->num);
            if ((e->lit != NULL) && (t->text[0] == 'f')) {
                e->lit->type |= KVF_JINJA_FLOAT;
            }
        }
        return e;
    }
    if (t->kind == KVF_T_STR) {
        kvf_sb_t b = {0};
        /* adjacent string literals concatenate */
        kvf_jinja_sb_add(&b, "", 0);
        while (kvf_jinja_peek(p)->kind == KVF_T_STR) {
            kvf_jinja_sb_str(&b, kvf_jinja_peek(p)->text);
            p->t->pos++;
        }
        e = kvf_jinja_new(KVF_E_LIT);
        if (e != NULL) {
            e->lit = cJSON_CreateString(b.s);
        }
        free(b.s);
        return e;
    }
    if (t->kind == KVF_T_NAME) {
        p->t->pos++;
        e = kvf_jinja_new(KVF_E_LIT);
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
    if (kvf_jinja_is_op(p, "(")) {
        p->t->pos++;
        if (kvf_jinja_is_op(p, ")")) {   /* () */
            p->t->pos++;
            e = kvf_jinja_new(KVF_E_LIST);
            if (e != NULL) {
                e->negate = true;
            }
            return e;
        }
        e = kvf_jinja_parse_expr(p);
        if (kvf_jinja_is_op(p, ",")) {   /* a tuple: a list that prints as one */
            kvf_expr_t *tu = kvf_jinja_new(KVF_E_LIST);
            if (tu == NULL) {
                kvf_jinja_expr_free(e);
                return NULL;
            }
            tu->negate = true;
            kvf_jinja_add_arg(tu, e, NULL);
            while (kvf_jinja_is_op(p, ",") && (p->status == KVF_OK)) {
                p->t->pos++;
                if (kvf_jinja_is_op(p, ")")) {
                    break;
                }
                kvf_jinja_add_arg(tu, kvf_jinja_parse_expr(p), NULL);
            }
            e = tu;
        }
        kvf_expect_op(p, ")");
        return e;
    }
    if (kvf_jinja_is_op(p, "[") || kvf_jinja_is_op(p, "{")) {
        bool dict = kvf_jinja_is_op(p, "{");
        const char *close = dict ? "}" : "]";
        p->t->pos++;
        e = kvf_jinja_new(dict ? KVF_E_DICT : KVF_E_LIST);
        while ((e != NULL) && (p->status == KVF_OK) && !kvf_jinja_is_op(p, close)) {
            kvf_jinja_add_arg(e, kvf_jinja_parse_expr(p), NULL);
            if (dict) {
                kvf_expect_op(p, ":");
                kvf_jinja_add_arg(e, kvf_jinja_parse_expr(p), NULL);
            }
            if (!kvf_jinja_is_op(p, ",")) {
                break;
            }
            p->t->pos++;
        }
        kvf_expect_op(p, close);
        return e;
    }
    kvf_jinja_ps_fail(p, KVF_ERR_PARSE, "expected a value");
    return NULL;
}

static kvf_expr_t *kvf_parse_postfix(kvf_ps_t *p)
{
    kvf_expr_t *e = kvf_parse_primary(p);

    while ((e != NULL) && (p->status == KVF_OK)) {
        if (kvf_jinja_is_op(p, ".")) {
            kvf_expr_t *a = kvf_jinja_new(KVF_E_ATTR);
            p->t->pos++;
            if ((a == NULL) || (kvf_jinja_peek(p)->kind != KVF_T_NAME)) {
                kvf_jinja_expr_free(a);
                kvf_jinja_ps_fail(p, KVF_ERR_PARSE, "expected a name after '.'");
                break;
            }
            a->a = e;
            a->name = strdup(kvf_jinja_peek(p)->text);
            p->t->pos++;
            e = a;
        } else if (kvf_jinja_is_op(p, "[")) {
            kvf_expr_t *s = kvf_jinja_new(KVF_E_ITEM), *parts[3] = {NULL, NULL, NULL};
            int k = 0;
            bool slice = false;
            p->t->pos++;
            if (s == NULL) {
                break;
            }
            s->a = e;
            for (;;) {
                if (!kvf_jinja_is_op(p, ":") && !kvf_jinja_is_op(p, "]")) {
                    parts[k] = kvf_jinja_parse_expr(p);
                }
                if (kvf_jinja_is_op(p, ":") && (k < 2)) {
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
                kvf_jinja_add_arg(s, (parts[2] != NULL) ? parts[2] : kvf_jinja_new(KVF_E_NONE_SLOT), NULL);
            } else {
                s->b = parts[0];
            }
            e = s;
        } else if (kvf_jinja_is_op(p, "(")) {
            kvf_expr_t *c = kvf_jinja_new(KVF_E_CALL);
            p->t->pos++;
            if (c == NULL) {
                break;
            }
            c->a = e;
            kvf_parse_args(p, c);
            e = c;
        } else {
            break;
        }
    }
    return e;
}

static kvf_expr_t *kvf_bin(const char *op, kvf_expr_t *a, kvf_expr_t *b)
{
    kvf_expr_t *e = kvf_jinja_new(KVF_E_BIN);

    if (e == NULL) {
        kvf_jinja_expr_free(a);
        kvf_jinja_expr_free(b);
        return NULL;
    }
    e->name = strdup(op);
    e->a = a;
    e->b = b;
    return e;
}

/* One level deeper (false: too deep, the parse failed); kvf_shallower() on the way out. */
static bool kvf_deeper(kvf_ps_t *p)
{
    if (++p->depth > KVF_JINJA_MAX_NEST) {
        kvf_jinja_ps_fail(p, KVF_ERR_UNSUPPORTED, "expressions nested deeper than 100 are not "
                          "supported");
        p->depth--;
        return false;
    }
    return true;
}

static kvf_expr_t *kvf_shallower(kvf_ps_t *p, kvf_expr_t *e)
{
    p->depth--;
    return e;
}

/* The filters and tests after a value (jinja2's parse_filter_expr): x | f(args) is t ... */
static kvf_expr_t *kvf_parse_filters(kvf_ps_t *p, kvf_expr_t *e)
{
    while ((e != NULL) && (p->status == KVF_OK)) {
        if (kvf_jinja_is_op(p, "|")) {
            kvf_expr_t *f = kvf_jinja_new(KVF_E_FILTER);
            p->t->pos++;
            if ((f == NULL) || (kvf_jinja_peek(p)->kind != KVF_T_NAME)) {
                kvf_jinja_expr_free(f);
                kvf_jinja_ps_fail(p, KVF_ERR_PARSE, "expected a filter name");
                break;
            }
            f->a = e;
            f->name = strdup(kvf_jinja_peek(p)->text);
            p->t->pos++;
            if (kvf_jinja_is_op(p, "(")) {
                p->t->pos++;
                kvf_parse_args(p, f);
            }
            e = f;
            continue;
        }
        if (kvf_jinja_is_name(p, "is")) {
            kvf_expr_t *t = kvf_jinja_new(KVF_E_TEST);
            p->t->pos++;
            if (t == NULL) {
                break;
            }
            t->a = e;
            if (kvf_jinja_is_name(p, "not")) {
                t->negate = true;
                p->t->pos++;
            }
            if (kvf_jinja_peek(p)->kind != KVF_T_NAME) {
                kvf_jinja_expr_free(t);
                kvf_jinja_ps_fail(p, KVF_ERR_PARSE, "expected a test name after 'is'");
                return NULL;
            }
            t->name = strdup(kvf_jinja_peek(p)->text);
            p->t->pos++;
            if (kvf_jinja_is_op(p, "(")) {
                p->t->pos++;
                kvf_parse_args(p, t);
            } else if ((kvf_jinja_peek(p)->kind == KVF_T_STR) || (kvf_jinja_peek(p)->kind == KVF_T_NUM) ||
                       ((kvf_jinja_peek(p)->kind == KVF_T_NAME) && !kvf_jinja_is_name(p, "and") &&
                        !kvf_jinja_is_name(p, "or") && !kvf_jinja_is_name(p, "else") &&
                        !kvf_jinja_is_name(p, "if"))) {
                kvf_jinja_add_arg(t, kvf_parse_postfix(p), NULL);   /* is equalto 'x' */
            }
            e = t;
            continue;
        }
        break;
    }
    return e;
}

/* Unary minus / plus (binding tighter than ** and filters, as in jinja2: -2 ** 2 is 4,
 * -x | f is (-x) | f), then a value's postfix, filters and tests. */
static kvf_expr_t *kvf_parse_unary_in(kvf_ps_t *p, bool filters)
{
    kvf_expr_t *e;

    if (kvf_jinja_is_op(p, "-") || kvf_jinja_is_op(p, "+")) {
        bool neg = kvf_jinja_is_op(p, "-");
        p->t->pos++;
        e = neg ? kvf_jinja_new(KVF_E_NEG) : NULL;
        if (!kvf_deeper(p)) {
            return e;
        }
        if (neg && (e != NULL)) {
            e->a = kvf_shallower(p, kvf_parse_unary_in(p, false));
        } else if (!neg) {
            e = kvf_shallower(p, kvf_parse_unary_in(p, false));
        }
    } else {
        e = kvf_parse_postfix(p);
    }
    return filters ? kvf_parse_filters(p, e) : e;
}

static kvf_expr_t *kvf_parse_unary(kvf_ps_t *p)
{
    return kvf_deeper(p) ? kvf_shallower(p, kvf_parse_unary_in(p, true)) : NULL;
}

/* a ** b ** c, left to right as jinja2 does. */
static kvf_expr_t *kvf_parse_pow(kvf_ps_t *p)
{
    kvf_expr_t *e = kvf_parse_unary(p);

    while ((e != NULL) && kvf_jinja_is_op(p, "**") && (p->status == KVF_OK)) {
        p->t->pos++;
        e = kvf_bin("**", e, kvf_parse_unary(p));
    }
    return e;
}

static kvf_expr_t *kvf_parse_mul(kvf_ps_t *p)
{
    kvf_expr_t *e = kvf_parse_pow(p);

    while (kvf_jinja_is_op(p, "*") || kvf_jinja_is_op(p, "/") || kvf_jinja_is_op(p, "//") || kvf_jinja_is_op(p, "%")) {
        char op[3];
        snprintf(op, sizeof(op), "%s", kvf_jinja_peek(p)->text);
        p->t->pos++;
        e = kvf_bin(op, e, kvf_parse_pow(p));
    }
    return e;
}

static kvf_expr_t *kvf_parse_add(kvf_ps_t *p)
{
    kvf_expr_t *e = kvf_parse_mul(p);

    while (kvf_jinja_is_op(p, "+") || kvf_jinja_is_op(p, "-")) {
        char op[2] = {kvf_jinja_peek(p)->text[0], 0};
        p->t->pos++;
        e = kvf_bin(op, e, kvf_parse_mul(p));
    }
    return e;
}

static kvf_expr_t *kvf_parse_concat(kvf_ps_t *p)
{
    kvf_expr_t *e = kvf_parse_add(p);

    while (kvf_jinja_is_op(p, "~")) {
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
            if (kvf_jinja_is_op(p, cmps[i])) {
                p->t->pos++;
                e = kvf_bin(cmps[i], e, kvf_parse_concat(p));
                done = false;
                break;
            }
        }
        if (!done) {
            continue;
        }
        if (kvf_jinja_is_name(p, "in") || (kvf_jinja_is_name(p, "not") &&
                                     (p->t->v[p->t->pos + 1].kind == KVF_T_NAME) &&
                                     !strcmp(p->t->v[p->t->pos + 1].text, "in"))) {
            bool neg = kvf_jinja_is_name(p, "not");
            p->t->pos += neg ? 2 : 1;
            e = kvf_bin("in", e, kvf_parse_concat(p));
            if (e != NULL) {
                e->negate = neg;
            }
            continue;
        }
        break;
    }
    return e;
}

static kvf_expr_t *kvf_parse_not(kvf_ps_t *p)
{
    if (kvf_jinja_is_name(p, "not")) {
        kvf_expr_t *e = kvf_jinja_new(KVF_E_NOT);
        p->t->pos++;
        if ((e != NULL) && kvf_deeper(p)) {
            e->a = kvf_shallower(p, kvf_parse_not(p));
        }
        return e;
    }
    return kvf_parse_compare(p);
}

static kvf_expr_t *kvf_parse_and(kvf_ps_t *p)
{
    kvf_expr_t *e = kvf_parse_not(p);

    while (kvf_jinja_is_name(p, "and")) {
        kvf_expr_t *x = kvf_jinja_new(KVF_E_AND);
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

kvf_expr_t *kvf_jinja_parse_or(kvf_ps_t *p)
{
    kvf_expr_t *e = kvf_parse_and(p);

    while (kvf_jinja_is_name(p, "or")) {
        kvf_expr_t *x = kvf_jinja_new(KVF_E_OR);
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

static kvf_expr_t *kvf_parse_expr_in(kvf_ps_t *p);

kvf_expr_t *kvf_jinja_parse_expr(kvf_ps_t *p)
{
    return kvf_deeper(p) ? kvf_shallower(p, kvf_parse_expr_in(p)) : NULL;
}

static kvf_expr_t *kvf_parse_expr_in(kvf_ps_t *p)
{
    kvf_expr_t *e = kvf_jinja_parse_or(p);

    if (kvf_jinja_is_name(p, "if")) {
        kvf_expr_t *c = kvf_jinja_new(KVF_E_COND);
        p->t->pos++;
        if (c == NULL) {
            return e;
        }
        c->a = e;             /* value when true */
        c->b = kvf_jinja_parse_or(p);   /* condition */
        if (kvf_jinja_is_name(p, "else")) {
            p->t->pos++;
            c->c = kvf_jinja_parse_expr(p);
        }
        e = c;
    }
    return e;
}
