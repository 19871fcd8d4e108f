/*
 * The chat-template statement parser (kvf_proxy_jinja_int.h): template pieces into a
 * statement tree (if/elif/else, for/else, set, set blocks, macro, break/continue, filter
 * blocks, generation), the expressions in
 * them by kvf_proxy_jinja_parse.c. A statement outside the subset is refused by name
 * (KVF_ERR_UNSUPPORTED).
 */
#include "kvf_proxy_jinja_int.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void kvf_node_free(kvf_node_t *n)
{
    if (n == NULL) {
        return;
    }
    kvf_jinja_expr_free(n->expr);
    kvf_jinja_expr_free(n->filter);
    for (int i = 0; i < n->nbranch; ++i) {
        if (n->conds != NULL) {
            kvf_jinja_expr_free(n->conds[i]);
        }
        if (n->branches != NULL) {
            kvf_jinja_body_free(&n->branches[i]);
        }
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
    int           depth;   /* statements nested so far (KVF_JINJA_MAX_NEST) */
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
    kvf_ps_t ps = {t, sp->err, sp->cap, KVF_OK, 0};
    kvf_expr_t *e = kvf_jinja_parse_expr(&ps);

    if ((ps.status == KVF_OK) && (kvf_jinja_peek(&ps)->kind != KVF_T_END)) {
        kvf_jinja_ps_fail(&ps, KVF_ERR_PARSE, "unexpected text after the expression");
    }
    if (ps.status != KVF_OK) {
        sp->status = ps.status;
        kvf_jinja_expr_free(e);
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
    ps = (kvf_ps_t){&t, sp->err, sp->cap, KVF_OK, 0};
    for (int k = 0; k < 2; ++k) {
        if (kvf_jinja_peek(&ps)->kind != KVF_T_NAME) {
            break;
        }
        n->target[k] = strdup(kvf_jinja_peek(&ps)->text);
        t.pos++;
        if (!kvf_jinja_is_op(&ps, ",")) {
            break;
        }
        t.pos++;
    }
    if ((n->target[0] == NULL) || !kvf_jinja_is_name(&ps, "in")) {
        kvf_jinja_toks_free(&t);
        kvf_node_free(n);
        kvf_sp_fail(sp, KVF_ERR_PARSE, "'for' needs 'name in expression' (offset %zu)",
                    p->at);
        return false;
    }
    t.pos++;
    n->expr = kvf_jinja_parse_or(&ps);
    if (kvf_jinja_is_name(&ps, "if")) {
        t.pos++;
        n->filter = kvf_jinja_parse_or(&ps);
    }
    if (kvf_jinja_is_name(&ps, "recursive") || (kvf_jinja_peek(&ps)->kind != KVF_T_END)) {
        kvf_jinja_ps_fail(&ps, KVF_ERR_UNSUPPORTED, "unsupported text in 'for'");
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

/* The body of block @a n up to its end tag st[0] (the only stop word), into branches[0]; a
 * missing end tag fails naming @a tag. Always true (the node is kept; sp->status says). */
static bool kvf_parse_block_end(kvf_sp_t *sp, kvf_node_t *n, const char *const *st,
                                const char *tag, const kvf_piece_t *p)
{
    char end[32];

    kvf_parse_body(sp, &n->branches[0], st, end, sizeof(end));
    if ((sp->status == KVF_OK) && strcmp(end, st[0])) {
        kvf_sp_fail(sp, KVF_ERR_PARSE, "'%s' without '%s' (offset %zu)", tag, st[0], p->at);
    }
    sp->i++;
    return true;
}

/* {% set name = expr %}, {% set ns.attr = expr %} and {% set name %} ... {% endset %}. */
static bool kvf_parse_set(kvf_sp_t *sp, kvf_node_t *n, const kvf_piece_t *p)
{
    static const char *const st[] = {"endset", NULL};
    kvf_toks_t t;
    kvf_ps_t ps;

    n->kind = KVF_S_SET;
    if (kvf_stmt_toks(sp, p, &t) != KVF_OK) {
        kvf_node_free(n);
        return false;
    }
    ps = (kvf_ps_t){&t, sp->err, sp->cap, KVF_OK, 0};
    if (kvf_jinja_peek(&ps)->kind == KVF_T_NAME) {
        n->target[0] = strdup(kvf_jinja_peek(&ps)->text);
        t.pos++;
        if (kvf_jinja_is_op(&ps, ".") && (t.v[t.pos + 1].kind == KVF_T_NAME)) {
            n->target[1] = strdup(t.v[t.pos + 1].text);
            t.pos += 2;
        }
    }
    if ((n->target[0] != NULL) && (n->target[1] == NULL) &&
        (kvf_jinja_peek(&ps)->kind == KVF_T_END)) {
        /* the block form: the body's text is the value */
        kvf_jinja_toks_free(&t);
        n->branches = calloc(1, sizeof(*n->branches));
        n->nbranch = 1;
        if (n->branches == NULL) {
            kvf_node_free(n);
            kvf_sp_fail(sp, KVF_ERR_NO_MEMORY, "out of memory");
            return false;
        }
        return kvf_parse_block_end(sp, n, st, "set", p);
    }
    if ((n->target[0] == NULL) || !kvf_jinja_is_op(&ps, "=")) {
        kvf_jinja_toks_free(&t);
        kvf_node_free(n);
        kvf_sp_fail(sp, KVF_ERR_UNSUPPORTED, "this form of 'set' is not supported (only 'set "
                    "name = value', 'set ns.attr = value' and 'set name' blocks; offset %zu)",
                    p->at);
        return false;
    }
    t.pos++;
    n->expr = kvf_stmt_expr(sp, &t);
    kvf_jinja_toks_free(&t);
    return true;
}

/* {% macro name(a, b=default) %} ... {% endmacro %}: the parameters are the arguments of a
 * call node in n->expr (keyword name: the parameter; value: its default or NULL). */
static bool kvf_parse_macro(kvf_sp_t *sp, kvf_node_t *n, const kvf_piece_t *p)
{
    static const char *const st[] = {"endmacro", NULL};
    kvf_toks_t t;
    kvf_ps_t ps;

    n->kind = KVF_S_MACRO;
    n->branches = calloc(1, sizeof(*n->branches));
    n->nbranch = 1;
    n->expr = kvf_jinja_new(KVF_E_CALL);
    if ((n->branches == NULL) || (n->expr == NULL) || (kvf_stmt_toks(sp, p, &t) != KVF_OK)) {
        kvf_node_free(n);
        kvf_sp_fail(sp, KVF_ERR_NO_MEMORY, "out of memory");
        return false;
    }
    ps = (kvf_ps_t){&t, sp->err, sp->cap, KVF_OK, 0};
    if (kvf_jinja_peek(&ps)->kind == KVF_T_NAME) {
        n->target[0] = strdup(kvf_jinja_peek(&ps)->text);
        t.pos++;
    }
    if ((n->target[0] == NULL) || !kvf_jinja_is_op(&ps, "(")) {
        kvf_jinja_ps_fail(&ps, KVF_ERR_PARSE, "'macro' needs 'name(parameters)'");
    }
    t.pos++;
    while ((ps.status == KVF_OK) && !kvf_jinja_is_op(&ps, ")")) {
        kvf_expr_t *e = n->expr, **args;
        char **kw;
        if (kvf_jinja_peek(&ps)->kind != KVF_T_NAME) {
            kvf_jinja_ps_fail(&ps, KVF_ERR_PARSE, "expected a parameter name");
            break;
        }
        args = realloc(e->args, (size_t)(e->nargs + 1) * sizeof(*args));
        e->args = (args != NULL) ? args : e->args;
        kw = realloc(e->kwnames, (size_t)(e->nargs + 1) * sizeof(*kw));
        e->kwnames = (kw != NULL) ? kw : e->kwnames;
        if ((args == NULL) || (kw == NULL)) {
            kvf_jinja_ps_fail(&ps, KVF_ERR_NO_MEMORY, "out of memory");
            break;
        }
        e->kwnames[e->nargs] = strdup(kvf_jinja_peek(&ps)->text);
        e->args[e->nargs] = NULL;
        e->nargs++;
        t.pos++;
        if (kvf_jinja_is_op(&ps, "=")) {
            t.pos++;
            e->args[e->nargs - 1] = kvf_jinja_parse_expr(&ps);
        }
        if (!kvf_jinja_is_op(&ps, ",")) {
            break;
        }
        t.pos++;
    }
    if ((ps.status == KVF_OK) && (!kvf_jinja_is_op(&ps, ")") || (t.v[t.pos + 1].kind != KVF_T_END))) {
        kvf_jinja_ps_fail(&ps, KVF_ERR_PARSE, "expected ')' to end the macro's parameters");
    }
    kvf_jinja_toks_free(&t);
    if (ps.status != KVF_OK) {
        sp->status = ps.status;
        kvf_node_free(n);
        return false;
    }
    return kvf_parse_block_end(sp, n, st, "macro", p);
}

/* {% break %} and {% continue %} (the loopcontrols extension transformers enables). */
static bool kvf_parse_loopctl(kvf_sp_t *sp, kvf_node_t *n, const kvf_piece_t *p, const char *w)
{
    (void)sp;
    (void)p;
    n->kind = (w[0] == 'b') ? KVF_S_BREAK : KVF_S_CONTINUE;
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

/* {% filter f(args) | g %} ... {% endfilter %}: n->expr is the chain applied to the name
 * KVF_JINJA_BLOCK_VAR (a name no template can write), which holds the body's text. */
static bool kvf_parse_filter_block(kvf_sp_t *sp, kvf_node_t *n, const kvf_piece_t *p)
{
    static const char *const st[] = {"endfilter", NULL};
    kvf_toks_t t;
    kvf_tok_t *v;
    kvf_ps_t ps;

    n->kind = KVF_S_BLOCK;
    n->branches = calloc(1, sizeof(*n->branches));
    n->nbranch = 1;
    if ((n->branches == NULL) || (kvf_stmt_toks(sp, p, &t) != KVF_OK)) {
        kvf_node_free(n);
        kvf_sp_fail(sp, KVF_ERR_NO_MEMORY, "out of memory");
        return false;
    }
    /* "filter a | b" becomes " block" | a | b */
    v = realloc(t.v, (size_t)(t.n + 1) * sizeof(*v));
    if (v != NULL) {
        t.v = v;
        memmove(&t.v[2], &t.v[1], (size_t)(t.n - 1) * sizeof(*v));
        t.n++;
        t.v[1] = (kvf_tok_t){KVF_T_OP, strdup("|"), 0};
        free(t.v[0].text);
        t.v[0].text = strdup(KVF_JINJA_BLOCK_VAR);
    }
    if ((v == NULL) || (t.v[0].text == NULL) || (t.v[1].text == NULL)) {
        kvf_jinja_toks_free(&t);
        kvf_node_free(n);
        kvf_sp_fail(sp, KVF_ERR_NO_MEMORY, "out of memory");
        return false;
    }
    t.pos = 0;
    ps = (kvf_ps_t){&t, sp->err, sp->cap, KVF_OK, 0};
    n->expr = kvf_jinja_parse_expr(&ps);
    if ((ps.status == KVF_OK) && (kvf_jinja_peek(&ps)->kind != KVF_T_END)) {
        kvf_jinja_ps_fail(&ps, KVF_ERR_PARSE, "unexpected text after the filter");
    }
    kvf_jinja_toks_free(&t);
    if (ps.status != KVF_OK) {
        sp->status = ps.status;
        kvf_node_free(n);
        return false;
    }
    return kvf_parse_block_end(sp, n, st, "filter", p);
}

/* Any other statement: refused by name. */
static bool kvf_parse_unknown(kvf_sp_t *sp, kvf_node_t *n, const kvf_piece_t *p, const char *w)
{
    kvf_node_free(n);
    kvf_sp_fail(sp, KVF_ERR_UNSUPPORTED, "statement '%s' is not supported (offset %zu)", w,
                p->at);
    return false;
}

static void kvf_parse_body_in(kvf_sp_t *sp, kvf_body_t *body, const char *const *stops,
                              char *stopped, size_t scap);

/* Parse pieces into @a body until a statement whose first word is in @a stops; its word. */
static void kvf_parse_body(kvf_sp_t *sp, kvf_body_t *body, const char *const *stops,
                           char *stopped, size_t scap)
{
    stopped[0] = '\0';
    if (sp->depth >= KVF_JINJA_MAX_NEST) {
        kvf_sp_fail(sp, KVF_ERR_UNSUPPORTED, "statements nested deeper than %d are not "
                    "supported", KVF_JINJA_MAX_NEST);
        return;
    }
    sp->depth++;
    kvf_parse_body_in(sp, body, stops, stopped, scap);
    sp->depth--;
}

static void kvf_parse_body_in(kvf_sp_t *sp, kvf_body_t *body, const char *const *stops,
                              char *stopped, size_t scap)
{
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
              !strcmp(w, "macro") ? kvf_parse_macro(sp, n, p) :
              !strcmp(w, "filter") ? kvf_parse_filter_block(sp, n, p) :
              (!strcmp(w, "break") || !strcmp(w, "continue")) ? kvf_parse_loopctl(sp, n, p, w) :
              kvf_parse_unknown(sp, n, p, w))) {
            return;
        }
        kvf_body_push(body, n);
    }
}

kvf_status_t kvf_jinja_parse(const char *tmpl, kvf_body_t *body, char *err, size_t cap)
{
    kvf_pieces_t pc = {0};
    kvf_sp_t sp = {&pc, 0, err, cap, KVF_OK, 0};
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
