/*
 * A Jinja subset for chat templates (kvf_proxy_jinja.h). Values are cJSON nodes
 * (a fresh, owned tree per evaluation; undefined is a node of type cJSON_Invalid);
 * the template is lexed into text / {{ expr }} / {% stmt %} pieces with Jinja's
 * whitespace rules (trim_blocks, lstrip_blocks, '-' markers), parsed into a tree
 * and run. What it knows: if/elif/else, for (one or two targets, loop.*, else,
 * break/continue), set (names, namespace attributes, blocks), macros, filter
 * blocks, generation blocks (run as plain blocks); expressions with literals,
 * tuples, lists, dicts, attribute and item access, slices, arithmetic, ~,
 * comparisons, in, is-tests, and/or/not, the conditional expression, the filters
 * and string/dict methods that the real templates use (deploy/README.md, "Chat
 * templates"), namespace(), dict(), range(), strftime_now() and raise_exception().
 * Anything else is refused by name (KVF_ERR_UNSUPPORTED), never rendered wrongly.
 *
 * The code: kvf_proxy_jinja_lex.c (pieces, tokens), kvf_proxy_jinja_parse.c (expression
 * trees), kvf_proxy_jinja_stmt.c (statement trees), kvf_proxy_jinja_value.c (values),
 * kvf_proxy_jinja_eval.c (expressions), kvf_proxy_jinja_filter.c (filters),
 * kvf_proxy_jinja_call.c (calls, macros, methods); this file runs the statements and
 * macro bodies.
 *
 * Design: a tree walk over cJSON values. Rejected: linking a Jinja engine (none
 * well kept in C); compiling to bytecode (templates are a few kB, run once each).
 */
#include "kvf_proxy_jinja.h"
#include "kvf_proxy_jinja_int.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static void kvf_jx_emit(kvf_jx_t *x, const char *s, size_t n)
{
    if (x->len + n > KVF_JINJA_MAX_TEXT) {
        kvf_jinja_fail(x, KVF_ERR_INVALID_PARAM, "the template's text grew past %d MiB",
                       KVF_JINJA_MAX_TEXT >> 20);
        return;
    }
    if (x->len + n + 1 > x->outcap) {
        size_t cap = (x->outcap > 0) ? x->outcap : 256;
        char *o;
        while (cap < x->len + n + 1) {
            cap *= 2;
        }
        o = realloc(x->out, cap);
        if (o == NULL) {
            kvf_jinja_fail(x, KVF_ERR_NO_MEMORY, "out of memory");
            return;
        }
        x->out = o;
        x->outcap = cap;
    }
    memcpy(x->out + x->len, s, n);
    x->len += n;
    x->out[x->len] = '\0';
}

static void kvf_run(kvf_jx_t *x, const kvf_body_t *b);

/* The text body @a b renders (owned), in the current scope. */
static char *kvf_capture(kvf_jx_t *x, const kvf_body_t *b)
{
    char *saved = x->out, *text;
    size_t len = x->len, cap = x->outcap;

    x->out = NULL;
    x->len = x->outcap = 0;
    kvf_jx_emit(x, "", 0);
    kvf_run(x, b);
    text = x->out;
    x->out = saved;
    x->len = len;
    x->outcap = cap;
    return text;
}

const kvf_node_t *kvf_jinja_macro(const kvf_jx_t *x, const char *name)
{
    for (int i = x->nmacros - 1; i >= 0; --i) {
        if (!strcmp(x->macros[i]->target[0], name)) {
            return x->macros[i];
        }
    }
    return NULL;
}

static void kvf_define_macro(kvf_jx_t *x, const kvf_node_t *n)
{
    if (x->nmacros == (int)(sizeof(x->macros) / sizeof(x->macros[0]))) {
        kvf_jinja_fail(x, KVF_ERR_UNSUPPORTED, "more than 64 macro definitions are not supported");
        return;
    }
    x->macros[x->nmacros++] = n;
}

/* Bind the arguments of @a call to the parameters of @a m in @a scope (Python's rules: the
 * positional ones in order, then by keyword; extra ones in varargs / kwargs). */
static void kvf_bind_args(kvf_jx_t *x, const kvf_node_t *m, const kvf_expr_t *call,
                          cJSON *scope)
{
    const kvf_expr_t *sig = m->expr;
    cJSON *varargs = cJSON_CreateArray(), *kwargs = cJSON_CreateObject();
    int npos = 0;

    for (int i = 0; i < call->nargs; ++i) {
        cJSON *v = kvf_jinja_eval(x, call->args[i]);
        const char *name = call->kwnames[i];
        if (name == NULL) {
            name = (npos < sig->nargs) ? sig->kwnames[npos] : NULL;
            npos++;
        } else {
            int k = 0;
            while ((k < sig->nargs) && strcmp(sig->kwnames[k], name)) {
                ++k;
            }
            if (k == sig->nargs) {
                cJSON_AddItemToObject(kwargs, name, v);
                continue;
            }
        }
        if (name == NULL) {
            cJSON_AddItemToArray(varargs, v);
        } else if (cJSON_GetObjectItemCaseSensitive(scope, name) != NULL) {
            cJSON_Delete(v);
            kvf_jinja_fail(x, KVF_ERR_INVALID_PARAM, "macro '%s' got multiple values for "
                           "argument '%s'", m->target[0], name);
        } else {
            cJSON_AddItemToObject(scope, name, v);
        }
    }
    cJSON_AddItemToObject(scope, "varargs", varargs);
    cJSON_AddItemToObject(scope, "kwargs", kwargs);
}

cJSON *kvf_jinja_call_macro(kvf_jx_t *x, const kvf_node_t *m, const kvf_expr_t *call)
{
    cJSON *scope = cJSON_CreateObject(), *saved_scope = x->scope, *saved_sets = x->loop_sets;
    int saved_ctl = x->loopctl;
    char *text;

    if (scope == NULL) {
        kvf_jinja_fail(x, KVF_ERR_NO_MEMORY, "out of memory");
        return kvf_jinja_undef();
    }
    kvf_bind_args(x, m, call, scope);
    x->scope = scope;
    /* the defaults, evaluated in the macro's scope (they may read the parameters before) */
    for (int k = 0; k < m->expr->nargs; ++k) {
        if (cJSON_GetObjectItemCaseSensitive(scope, m->expr->kwnames[k]) == NULL) {
            cJSON_AddItemToObject(scope, m->expr->kwnames[k],
                                  (m->expr->args[k] != NULL) ?
                                  kvf_jinja_eval(x, m->expr->args[k]) : kvf_jinja_undef());
        }
    }
    x->loop_sets = NULL;
    x->loopctl = 0;
    text = kvf_capture(x, &m->branches[0]);
    x->scope = saved_scope;
    x->loop_sets = saved_sets;
    x->loopctl = saved_ctl;
    cJSON_Delete(scope);
    return kvf_jinja_take_str(text);
}

static void kvf_set_var(kvf_jx_t *x, const char *name, cJSON *v)
{
    if (cJSON_GetObjectItemCaseSensitive(x->scope, name) != NULL) {
        cJSON_ReplaceItemInObjectCaseSensitive(x->scope, name, v);
    } else {
        cJSON_AddItemToObject(x->scope, name, v);
    }
}

/* The items 'for' runs over (@a items): a list's, a string's characters, a dict's keys or
 * (key, value) pairs for two targets. */
static void kvf_for_items(kvf_jx_t *x, const kvf_node_t *n, const cJSON *seq, cJSON *items)
{
    const cJSON *c;

    if (cJSON_IsObject(seq)) {
        cJSON_ArrayForEach(c, seq) {
            if (n->target[1] != NULL) {
                cJSON *pair = cJSON_CreateArray();
                cJSON_AddItemToArray(pair, kvf_jinja_key(c->string));
                cJSON_AddItemToArray(pair, cJSON_Duplicate(c, true));
                cJSON_AddItemToArray(items, pair);
            } else {
                cJSON_AddItemToArray(items, kvf_jinja_key(c->string));
            }
        }
    } else if (cJSON_IsString(seq)) {
        for (const char *p = seq->valuestring; *p;) {   /* by characters, as Python */
            size_t k = 1;
            while ((p[k] & 0xC0) == 0x80) {
                ++k;
            }
            cJSON_AddItemToArray(items, kvf_jinja_take_str(strndup(p, k)));
            p += k;
        }
    } else if (cJSON_IsArray(seq)) {
        cJSON_ArrayForEach(c, seq) {
            cJSON_AddItemToArray(items, cJSON_Duplicate(c, true));
        }
    } else if (!kvf_jinja_is_undef(seq)) {
        kvf_jinja_fail(x, KVF_ERR_INVALID_PARAM, "'for' over a value that is not iterable (%s)",
                       cJSON_IsNull(seq) ? "None" : "a number, a boolean or a function");
    }
}

static void kvf_run_for(kvf_jx_t *x, const kvf_node_t *n)
{
    cJSON *seq = kvf_jinja_eval(x, n->expr), *items = cJSON_CreateArray(), *c;
    cJSON *before = cJSON_Duplicate(x->scope, true), *outer_sets = x->loop_sets;
    int len, i = 0;
    cJSON *saved[3] = {NULL, NULL, NULL};
    const char *names[3] = {n->target[0], n->target[1], "loop"};

    kvf_for_items(x, n, seq, items);
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
            ok = kvf_jinja_eval(x, n->filter);
            if (kvf_jinja_truthy(ok)) {
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
        cJSON_AddNumberToObject(loop, "depth", 1);    /* no recursive loops here */
        cJSON_AddNumberToObject(loop, "depth0", 0);
        loop->type |= KVF_JINJA_LOOP;                 /* its methods are refused by name */
        if (i > 0) {
            cJSON_AddItemToObject(loop, "previtem", cJSON_Duplicate(c->prev, true));
        }
        if (c->next != NULL) {
            cJSON_AddItemToObject(loop, "nextitem", cJSON_Duplicate(c->next, true));
        }
        kvf_set_var(x, "loop", loop);
        if (n->target[1] != NULL) {
            kvf_set_var(x, n->target[0], kvf_jinja_dup(cJSON_GetArrayItem(c, 0)));
            kvf_set_var(x, n->target[1], kvf_jinja_dup(cJSON_GetArrayItem(c, 1)));
        } else {
            kvf_set_var(x, n->target[0], cJSON_Duplicate(c, true));
        }
        if (++x->steps > KVF_JINJA_MAX_STEPS) {   /* an empty body's iterations count too */
            kvf_jinja_fail(x, KVF_ERR_INVALID_PARAM, "the template ran more than %d "
                           "statements", KVF_JINJA_MAX_STEPS);
        }
        kvf_run(x, &n->branches[0]);
        ++i;
        if (x->loopctl == 1) {
            x->loopctl = 0;
            break;
        }
        x->loopctl = 0;
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
        kvf_jinja_fail(x, KVF_ERR_UNSUPPORTED, "nesting deeper than 64");
    }
    for (int i = 0; (i < b->n) && (x->status == KVF_OK) && (x->loopctl == 0); ++i) {
        const kvf_node_t *n = b->v[i];
        cJSON *v;

        if (++x->steps > KVF_JINJA_MAX_STEPS) {   /* nested loops over long ranges */
            kvf_jinja_fail(x, KVF_ERR_INVALID_PARAM, "the template ran more than %d "
                           "statements", KVF_JINJA_MAX_STEPS);
            break;
        }
        switch (n->kind) {
        case KVF_S_TEXT:
            kvf_jx_emit(x, n->text, n->len);
            break;
        case KVF_S_OUT: {
            char *s;
            v = kvf_jinja_eval(x, n->expr);
            if (kvf_jinja_is_function(v) ||
                ((v != NULL) && (v->type & (KVF_JINJA_GEN | KVF_JINJA_LOOP)))) {
                /* Python prints its address */
                kvf_jinja_fail(x, KVF_ERR_UNSUPPORTED, "printing a function, a method, a "
                               "generator or a loop object is not supported");
            }
            s = kvf_jinja_tostr(v);
            kvf_jx_emit(x, s ? s : "", s ? strlen(s) : 0);
            free(s);
            cJSON_Delete(v);
            break;
        }
        case KVF_S_IF:
            for (int k = 0; k < n->nbranch; ++k) {
                bool take = true;
                if (n->conds[k] != NULL) {
                    v = kvf_jinja_eval(x, n->conds[k]);
                    take = kvf_jinja_truthy(v);
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
        case KVF_S_MACRO:
            kvf_define_macro(x, n);
            break;
        case KVF_S_BREAK:
        case KVF_S_CONTINUE:
            x->loopctl = (n->kind == KVF_S_BREAK) ? 1 : 2;
            break;
        case KVF_S_SET:
            v = (n->expr != NULL) ? kvf_jinja_eval(x, n->expr) :
                kvf_jinja_take_str(kvf_capture(x, &n->branches[0]));
            if (n->target[1] == NULL) {
                kvf_set_var(x, n->target[0], v);
                if ((x->loop_sets != NULL) &&
                    (cJSON_GetObjectItemCaseSensitive(x->loop_sets, n->target[0]) == NULL)) {
                    cJSON_AddTrueToObject(x->loop_sets, n->target[0]);
                }
            } else {
                cJSON *ns = cJSON_GetObjectItemCaseSensitive(x->scope, n->target[0]);
                if (ns == NULL) {
                    ns = cJSON_GetObjectItemCaseSensitive(x->top, n->target[0]);
                }
                if (ns == NULL) {
                    ns = cJSON_GetObjectItemCaseSensitive(x->globals, n->target[0]);
                }
                ns = cJSON_IsRaw(ns) ? kvf_jinja_deref(x, ns) : NULL;
                if (!cJSON_IsObject(ns)) {
                    cJSON_Delete(v);
                    kvf_jinja_fail(x, KVF_ERR_INVALID_PARAM, "'set %s.%s': not a namespace",
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
            if (n->expr == NULL) {   /* generation */
                kvf_run(x, &n->branches[0]);
            } else {                 /* filter: the body's text through n->expr */
                char *s;
                kvf_set_var(x, KVF_JINJA_BLOCK_VAR,
                            kvf_jinja_take_str(kvf_capture(x, &n->branches[0])));
                v = kvf_jinja_eval(x, n->expr);
                cJSON_DeleteItemFromObjectCaseSensitive(x->scope, KVF_JINJA_BLOCK_VAR);
                s = kvf_jinja_tostr(v);
                kvf_jx_emit(x, s ? s : "", s ? strlen(s) : 0);
                free(s);
                cJSON_Delete(v);
            }
            break;
        }
    }
    x->depth--;
}

kvf_status_t kvf_proxy_jinja_render(const char *tmpl, const cJSON *vars, char **out_p,
                                    char *err, size_t cap)
{
    return kvf_proxy_jinja_render_at(tmpl, vars, time(NULL), out_p, err, cap);
}

kvf_status_t kvf_proxy_jinja_render_at(const char *tmpl, const cJSON *vars, time_t now,
                                       char **out_p, char *err, size_t cap)
{
    kvf_body_t body = {0};
    kvf_jx_t x;

    *out_p = NULL;
    err[0] = '\0';
    x.status = kvf_jinja_parse(tmpl, &body, err, cap);
    if (x.status != KVF_OK) {
        kvf_jinja_body_free(&body);
        return x.status;
    }
    memset(&x, 0, sizeof(x));
    x.err = err;
    x.cap = cap;
    x.status = KVF_OK;
    x.globals = vars;
    x.now = now;
    x.scope = cJSON_CreateObject();
    x.top = x.scope;
    x.callable = cJSON_CreateRaw("<function>");
    x.namespaces = cJSON_CreateArray();
    kvf_jx_emit(&x, "", 0);
    if ((x.scope == NULL) || (x.callable == NULL) || (x.namespaces == NULL)) {
        x.status = KVF_ERR_NO_MEMORY;
    } else {
        kvf_run(&x, &body);
    }
    cJSON_Delete(x.scope);
    cJSON_Delete(x.callable);
    cJSON_Delete(x.namespaces);
    kvf_jinja_body_free(&body);
    if (x.status != KVF_OK) {
        free(x.out);
        return x.status;
    }
    *out_p = x.out;
    return KVF_OK;
}
