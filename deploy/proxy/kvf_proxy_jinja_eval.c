/*
 * Chat-template expressions evaluated (kvf_proxy_jinja_int.h): names (the template's
 * variables over the caller's), item and attribute access, slices, operators with Python's
 * semantics, is-tests and filters; calls and methods are in kvf_proxy_jinja_call.c. What is
 * outside the subset fails the render by name.
 */
#include "kvf_proxy_jinja_int.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kvf_jinja_fail(kvf_jx_t *x, kvf_status_t st, const char *fmt, ...)
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

/* The global functions (kvf_proxy_jinja_call.c): defined names, as in transformers. */
static const char *const kvf_builtins[] = {"raise_exception", "strftime_now", "namespace",
                                           "range", "dict", NULL};

/* A name: the scope's (a macro's parameters, then the template's own names), the caller's
 * variables, then the macros and global functions (a callable marker). */
static const cJSON *kvf_lookup(kvf_jx_t *x, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(x->scope, name);

    if ((v == NULL) && (x->scope != x->top)) {
        v = cJSON_GetObjectItemCaseSensitive(x->top, name);
    }
    if (v == NULL) {
        v = cJSON_GetObjectItemCaseSensitive(x->globals, name);
    }
    for (int i = 0; (v == NULL) && (kvf_builtins[i] != NULL); ++i) {
        if (!strcmp(kvf_builtins[i], name)) {
            v = x->callable;
        }
    }
    if ((v == NULL) && (kvf_jinja_macro(x, name) != NULL)) {
        v = x->callable;
    }
    return v;
}

cJSON *kvf_jinja_deref(const kvf_jx_t *x, const cJSON *v)
{
    if (cJSON_IsRaw(v) && (v->valueint > 0)) {
        cJSON *ns = cJSON_GetArrayItem(x->namespaces, v->valueint - 1);
        if (ns != NULL) {
            return ns;
        }
    }
    return (cJSON *)v;
}

cJSON *kvf_jinja_dup(const cJSON *v)
{
    return (v == NULL) ? kvf_jinja_undef() : cJSON_Duplicate(v, true);
}

double kvf_jinja_num(const cJSON *v)
{
    return cJSON_IsNumber(v) ? v->valuedouble : cJSON_IsTrue(v) ? 1 : 0;
}

long kvf_jinja_long(double d)
{
    return (d != d) ? 0 : (d > 1e15) ? (long)1e15 : (d < -1e15) ? (long)-1e15 : (long)d;
}

/* The byte offsets of the characters (code points) of UTF-8 text @a s, and one past the end
 * (malloc'd; NULL: no memory); their number in @a n. Python indexes strings by character. */
static size_t *kvf_chars(const char *s, long *n)
{
    size_t len = strlen(s), *o = malloc((len + 1) * sizeof(*o));
    long k = 0;

    for (size_t i = 0; (o != NULL) && (i < len); ++i) {
        if ((s[i] & 0xC0) != 0x80) {
            o[k++] = i;
        }
    }
    if (o != NULL) {
        o[k] = len;
    }
    *n = k;
    return o;
}

/* Python-style index into a list or string of length n; -1: out of range. */
static long kvf_index(double d, long n)
{
    long i = kvf_jinja_long(d);

    if (i < 0) {
        i += n;
    }
    return ((i < 0) || (i >= n)) ? -1 : i;
}

static cJSON *kvf_item(kvf_jx_t *x, const cJSON *obj, const cJSON *key)
{
    if (cJSON_IsObject(obj)) {
        char buf[32];
        const char *k = kvf_jinja_key_text(key, buf, sizeof(buf));
        return (k == NULL) ? kvf_jinja_undef() :
                             kvf_jinja_dup(cJSON_GetObjectItemCaseSensitive(obj, k));
    }
    if (cJSON_IsArray(obj) && cJSON_IsNumber(key)) {
        long i = kvf_index(key->valuedouble, cJSON_GetArraySize(obj));
        return (i < 0) ? kvf_jinja_undef() : kvf_jinja_dup(cJSON_GetArrayItem(obj, (int)i));
    }
    if (cJSON_IsString(obj) && cJSON_IsNumber(key)) {
        long n, i;
        size_t *o = kvf_chars(obj->valuestring, &n);
        cJSON *r;
        i = kvf_index(key->valuedouble, n);
        r = ((i < 0) || (o == NULL)) ? kvf_jinja_undef() :
            kvf_jinja_take_str(strndup(obj->valuestring + o[i], o[i + 1] - o[i]));
        free(o);
        return r;
    }
    (void)x;
    return kvf_jinja_undef();
}

cJSON *kvf_jinja_slice(const cJSON *v, const cJSON *lo, const cJSON *hi, const cJSON *st)
{
    long n = cJSON_GetArraySize(v);
    size_t *o = cJSON_IsString(v) ? kvf_chars(v->valuestring, &n) : NULL;
    long step = (cJSON_IsNumber(st)) ? kvf_jinja_long(st->valuedouble) : 1;
    long a, b;
    cJSON *out;
    kvf_sb_t sb = {0};

    if ((step == 0) || (cJSON_IsString(v) && (o == NULL))) {
        free(o);
        return kvf_jinja_undef();
    }
    if (step > 0) {
        a = cJSON_IsNumber(lo) ? kvf_jinja_long(lo->valuedouble) : 0;
        b = cJSON_IsNumber(hi) ? kvf_jinja_long(hi->valuedouble) : n;
        a = (a < 0) ? ((a + n < 0) ? 0 : a + n) : ((a > n) ? n : a);
        b = (b < 0) ? ((b + n < 0) ? 0 : b + n) : ((b > n) ? n : b);
    } else {
        a = cJSON_IsNumber(lo) ? kvf_jinja_long(lo->valuedouble) : n - 1;
        b = cJSON_IsNumber(hi) ? kvf_jinja_long(hi->valuedouble) : -n - 1;
        a = (a < 0) ? ((a + n < 0) ? -1 : a + n) : ((a >= n) ? n - 1 : a);
        b = (b < 0) ? ((b + n < 0) ? -1 : b + n) : ((b >= n) ? n - 1 : b);
    }
    out = cJSON_IsString(v) ? NULL : cJSON_CreateArray();
    kvf_jinja_sb_add(&sb, "", 0);
    for (long i = a; (step > 0) ? (i < b) : (i > b); i += step) {
        if (cJSON_IsString(v)) {
            kvf_jinja_sb_add(&sb, v->valuestring + o[i], o[i + 1] - o[i]);
        } else if (out != NULL) {
            cJSON_AddItemToArray(out, cJSON_Duplicate(cJSON_GetArrayItem(v, (int)i), true));
        }
    }
    free(o);
    if (cJSON_IsString(v)) {
        return kvf_jinja_take_str(sb.s);
    }
    free(sb.s);
    return out;
}

static bool kvf_numeric(const cJSON *v)
{
    return cJSON_IsNumber(v) || cJSON_IsBool(v);
}

/* Python's ordering of @a a and @a b into @a c (< 0, 0, > 0): strings by code point, numbers
 * and booleans by value, lists and tuples item by item; false: Python cannot order them. */
static bool kvf_order(const cJSON *a, const cJSON *b, int *c)
{
    if (cJSON_IsString(a) && cJSON_IsString(b)) {
        *c = strcmp(a->valuestring, b->valuestring);
        return true;
    }
    if (kvf_numeric(a) && kvf_numeric(b)) {
        double d = kvf_jinja_num(a) - kvf_jinja_num(b);
        *c = (d < 0) ? -1 : (d > 0);
        return true;
    }
    if (cJSON_IsArray(a) && cJSON_IsArray(b) && !((a->type | b->type) & KVF_JINJA_GEN) &&
        (((a->type ^ b->type) & KVF_JINJA_TUPLE) == 0)) {
        const cJSON *p = a->child, *q = b->child;
        for (; (p != NULL) && (q != NULL); p = p->next, q = q->next) {
            if (cJSON_Compare(p, q, true)) {
                continue;
            }
            return kvf_order(p, q, c);
        }
        *c = (p != NULL) - (q != NULL);
        return true;
    }
    return false;
}

/* Python's ==: numbers and booleans by value (True == 1), containers item by item. */
static bool kvf_equal(const cJSON *a, const cJSON *b)
{
    if (kvf_jinja_is_undef(a) || kvf_jinja_is_undef(b)) {
        return kvf_jinja_is_undef(a) && kvf_jinja_is_undef(b);
    }
    if (kvf_numeric(a) && kvf_numeric(b)) {
        return kvf_jinja_num(a) == kvf_jinja_num(b);
    }
    return cJSON_Compare(a, b, true);
}

static bool kvf_in(const cJSON *a, const cJSON *b)
{
    const cJSON *c;

    if (cJSON_IsString(b)) {
        return cJSON_IsString(a) && (strstr(b->valuestring, a->valuestring) != NULL);
    }
    if (cJSON_IsObject(b)) {
        char buf[32];
        const char *k = kvf_jinja_key_text(a, buf, sizeof(buf));
        return (k != NULL) && (cJSON_GetObjectItemCaseSensitive(b, k) != NULL);
    }
    cJSON_ArrayForEach(c, b) {
        if (kvf_equal(a, c)) {
            return true;
        }
    }
    return false;
}

/* str + str; Markup + str escapes the str, and so does str + Markup (jinja2's |safe). */
static cJSON *kvf_add_str(const cJSON *a, const cJSON *b)
{
    bool ma = (a->type & KVF_JINJA_MARKUP) != 0, mb = (b->type & KVF_JINJA_MARKUP) != 0;
    kvf_sb_t sb = {0};
    cJSON *r;

    kvf_jinja_sb_add(&sb, "", 0);
    if (mb && !ma) {
        kvf_jinja_html_escape(&sb, a->valuestring);
    } else {
        kvf_jinja_sb_str(&sb, a->valuestring);
    }
    if (ma && !mb) {
        kvf_jinja_html_escape(&sb, b->valuestring);
    } else {
        kvf_jinja_sb_str(&sb, b->valuestring);
    }
    r = kvf_jinja_take_str(sb.s);
    if ((r != NULL) && (ma || mb)) {
        r->type |= KVF_JINJA_MARKUP;
    }
    return r;
}

/* str * n, list * n, n * str, n * list: Python's repetition (n an int or a bool). */
static cJSON *kvf_repeat(kvf_jx_t *x, const cJSON *a, const cJSON *b)
{
    const cJSON *seq = (cJSON_IsString(a) || cJSON_IsArray(a)) ? a : b, *n = (seq == a) ? b : a;
    long k = kvf_jinja_long(kvf_jinja_num(n));
    size_t unit = cJSON_IsString(seq) ? strlen(seq->valuestring) :
                  (size_t)cJSON_GetArraySize(seq) * 64;
    cJSON *r;

    if ((!cJSON_IsNumber(n) && !cJSON_IsBool(n)) || (n->type & KVF_JINJA_FLOAT) ||
        (floor(kvf_jinja_num(n)) != kvf_jinja_num(n)) ||
        (seq->type & (KVF_JINJA_GEN | KVF_JINJA_VIEW))) {
        kvf_jinja_fail(x, KVF_ERR_INVALID_PARAM, "can't multiply sequence by non-int");
        return kvf_jinja_undef();
    }
    if ((k > 0) && (unit * (size_t)k > KVF_JINJA_MAX_TEXT)) {
        kvf_jinja_fail(x, KVF_ERR_INVALID_PARAM, "a value repeated past the render's bound");
        return kvf_jinja_undef();
    }
    if (cJSON_IsString(seq)) {
        kvf_sb_t sb = {0};
        kvf_jinja_sb_add(&sb, "", 0);
        for (long i = 0; i < k; ++i) {
            kvf_jinja_sb_str(&sb, seq->valuestring);
        }
        return kvf_jinja_take_str(sb.s);
    }
    r = cJSON_CreateArray();
    for (long i = 0; (i < k) && (r != NULL); ++i) {
        const cJSON *c;
        cJSON_ArrayForEach(c, seq) {
            cJSON_AddItemToArray(r, cJSON_Duplicate(c, true));
        }
    }
    if (r != NULL) {
        r->type |= seq->type & KVF_JINJA_TUPLE;
    }
    return r;
}

static cJSON *kvf_binop(kvf_jx_t *x, const char *op, const cJSON *a, const cJSON *b)
{
    if ((cJSON_IsString(a) && cJSON_IsString(b) &&
         (strlen(a->valuestring) + strlen(b->valuestring) > KVF_JINJA_MAX_TEXT)) ||
        (cJSON_IsArray(a) && cJSON_IsArray(b) &&
         (cJSON_GetArraySize(a) + cJSON_GetArraySize(b) > KVF_JINJA_MAX_TEXT / 64))) {
        kvf_jinja_fail(x, KVF_ERR_INVALID_PARAM, "a value grew past the render's bound");
        return kvf_jinja_undef();
    }
    if (kvf_jinja_is_function(a) || kvf_jinja_is_function(b) ||
        ((a != NULL) && (a->type & KVF_JINJA_GEN) && !strcmp(op, "~")) ||
        ((b != NULL) && (b->type & KVF_JINJA_GEN) && !strcmp(op, "~"))) {
        kvf_jinja_fail(x, KVF_ERR_UNSUPPORTED, "'%s' with a function, a method or a generator "
                       "is not supported", op);
        return kvf_jinja_undef();
    }
    if (!strcmp(op, "~")) {
        char *s1 = kvf_jinja_tostr(a), *s2 = kvf_jinja_tostr(b);
        kvf_sb_t sb = {0};
        kvf_jinja_sb_str(&sb, s1 ? s1 : "");
        kvf_jinja_sb_str(&sb, s2 ? s2 : "");
        free(s1);
        free(s2);
        return kvf_jinja_take_str(sb.s);
    }
    if (!strcmp(op, "==") || !strcmp(op, "!=")) {
        return cJSON_CreateBool(kvf_equal(a, b) == (op[0] == '='));
    }
    if (!strcmp(op, "+") && cJSON_IsString(a) && cJSON_IsString(b)) {
        return kvf_add_str(a, b);
    }
    if (!strcmp(op, "+") && cJSON_IsArray(a) && cJSON_IsArray(b) &&
        (((a->type ^ b->type) & KVF_JINJA_TUPLE) == 0) &&
        !((a->type | b->type) & (KVF_JINJA_GEN | KVF_JINJA_VIEW))) {   /* list + list */
        cJSON *out = cJSON_Duplicate(a, true), *c;
        cJSON_ArrayForEach(c, b) {
            cJSON_AddItemToArray(out, cJSON_Duplicate(c, true));
        }
        return out;
    }
    if ((op[0] == '<') || (op[0] == '>')) {
        int c;
        if (!kvf_order(a, b, &c)) {
            kvf_jinja_fail(x, KVF_ERR_INVALID_PARAM, "'%s' between these types is not supported",
                        op);
            return kvf_jinja_undef();
        }
        return cJSON_CreateBool(!strcmp(op, "<") ? c < 0 : !strcmp(op, ">") ? c > 0 :
                                !strcmp(op, "<=") ? c <= 0 : c >= 0);
    }
    if ((cJSON_IsNumber(a) || cJSON_IsBool(a)) && (cJSON_IsNumber(b) || cJSON_IsBool(b))) {
        double p = kvf_jinja_num(a), q = kvf_jinja_num(b);
        if (((op[0] == '/') || (op[0] == '%')) && (q == 0)) {
            kvf_jinja_fail(x, KVF_ERR_INVALID_PARAM, "division by zero");
            return kvf_jinja_undef();
        }
        cJSON *r = cJSON_CreateNumber(!strcmp(op, "+") ? p + q : !strcmp(op, "-") ? p - q :
                                      !strcmp(op, "*") ? p * q : !strcmp(op, "/") ? p / q :
                                      !strcmp(op, "//") ? floor(p / q) :
                                      !strcmp(op, "%") ? p - q * floor(p / q) : pow(p, q));
        /* Python: '/' and anything with a float give a float; int ** negative int too */
        if ((r != NULL) && (!strcmp(op, "/") || ((a->type | b->type) & KVF_JINJA_FLOAT) ||
                            (floor(p) != p) || (floor(q) != q) ||
                            (!strcmp(op, "**") && (q < 0)))) {
            r->type |= KVF_JINJA_FLOAT;
        }
        return r;
    }
    if (!strcmp(op, "%") && cJSON_IsString(a)) {
        kvf_jinja_fail(x, KVF_ERR_UNSUPPORTED, "'%%' string formatting is not supported");
        return kvf_jinja_undef();
    }
    if (!strcmp(op, "*") && (cJSON_IsString(a) || cJSON_IsArray(a) || cJSON_IsString(b) ||
                             cJSON_IsArray(b))) {
        return kvf_repeat(x, a, b);
    }
    kvf_jinja_fail(x, KVF_ERR_INVALID_PARAM, "'%s' between these types is not supported", op);
    return kvf_jinja_undef();
}

/* An argument: positional @a pos or keyword @a kw; NULL when absent (evaluated, owned). */
cJSON *kvf_jinja_arg(kvf_jx_t *x, const kvf_expr_t *e, int pos, const char *kw)
{
    int p = 0;

    for (int i = 0; i < e->nargs; ++i) {
        if ((e->kwnames[i] != NULL) ? ((kw != NULL) && !strcmp(e->kwnames[i], kw)) :
                                      (p++ == pos)) {
            return kvf_jinja_eval(x, e->args[i]);
        }
    }
    return NULL;
}

bool kvf_jinja_test(kvf_jx_t *x, const kvf_expr_t *e, const cJSON *v)
{
    const char *t = e->name;
    bool r;

    if (!strcmp(t, "defined")) {
        r = !kvf_jinja_is_undef(v);
    } else if (!strcmp(t, "undefined")) {
        r = kvf_jinja_is_undef(v);
    } else if (!strcmp(t, "none")) {
        r = cJSON_IsNull(v);
    } else if (!strcmp(t, "string")) {
        r = cJSON_IsString(v);
    } else if (!strcmp(t, "number")) {
        r = cJSON_IsNumber(v) || cJSON_IsBool(v);   /* Python: a bool is a number */
    } else if (!strcmp(t, "integer")) {   /* 4 / 2 is a float */
        r = cJSON_IsNumber(v) && !(v->type & KVF_JINJA_FLOAT) &&
            (floor(v->valuedouble) == v->valuedouble);
    } else if (!strcmp(t, "float")) {
        r = cJSON_IsNumber(v) && ((v->type & KVF_JINJA_FLOAT) ||
                                  (floor(v->valuedouble) != v->valuedouble));
    } else if (!strcmp(t, "boolean")) {
        r = cJSON_IsBool(v);
    } else if (!strcmp(t, "true") || !strcmp(t, "false")) {
        r = (t[0] == 't') ? cJSON_IsTrue(v) : cJSON_IsFalse(v);
    } else if (!strcmp(t, "mapping")) {
        r = cJSON_IsObject(v);
    } else if (!strcmp(t, "sequence") || !strcmp(t, "iterable")) {
        /* jinja2's Undefined iterates (empty) and has a length; a generator has none */
        r = cJSON_IsArray(v) || cJSON_IsString(v) || cJSON_IsObject(v) ||
            kvf_jinja_is_undef(v);
        if ((t[0] == 's') && (v != NULL) && (v->type & KVF_JINJA_GEN)) {
            r = false;
        }
    } else if (!strcmp(t, "equalto") || !strcmp(t, "eq") || !strcmp(t, "sameas")) {
        cJSON *o = kvf_jinja_arg(x, e, 0, NULL);
        /* sameas: Python's 'is' (for the values here: the same type and value) */
        r = (t[0] == 's') ? cJSON_Compare(v, o, true) : kvf_equal(v, o);
        cJSON_Delete(o);
    } else if ((!strcmp(t, "odd") || !strcmp(t, "even")) && !cJSON_IsNumber(v) &&
               !cJSON_IsBool(v)) {
        kvf_jinja_fail(x, KVF_ERR_INVALID_PARAM, "test '%s' of a value that is not a number", t);
        return false;
    } else if (!strcmp(t, "odd") || !strcmp(t, "even")) {   /* Python: v % 2 == 1 / == 0 */
        double d = kvf_jinja_num(v), m = d - 2 * floor(d / 2);
        r = (t[0] == 'o') ? (m == 1) : (m == 0);
    } else {
        if (kvf_jinja_has("test", t)) {
            kvf_jinja_fail(x, KVF_ERR_UNSUPPORTED, "test '%s' is not supported", t);
        } else {
            kvf_jinja_fail(x, KVF_ERR_INVALID_PARAM, "No test named '%s'.", t);
        }
        return false;
    }
    return r != e->negate;
}

/* a[lo:hi:step] (jinja2 slices with Python's own obj[a:b], not the sandbox's item access). */
static cJSON *kvf_eval_slice(kvf_jx_t *x, const kvf_expr_t *e)
{
    cJSON *lo = kvf_jinja_eval(x, e->b), *hi = kvf_jinja_eval(x, e->c);
    cJSON *st = kvf_jinja_eval(x, e->args[0]), *a = kvf_jinja_eval(x, e->a), *r;

    if ((!cJSON_IsArray(a) && !cJSON_IsString(a)) || (a->type & KVF_JINJA_GEN)) {
        kvf_jinja_fail(x, KVF_ERR_INVALID_PARAM, "a slice of a value that is not a list or "
                       "a string");
    }
    r = (x->status != KVF_OK) ? kvf_jinja_undef() : kvf_jinja_slice(a, lo, hi, st);
    if ((r != NULL) && (a != NULL) && (a->type & KVF_JINJA_TUPLE) && cJSON_IsArray(r)) {
        r->type |= KVF_JINJA_TUPLE;
    }
    cJSON_Delete(a);
    cJSON_Delete(lo);
    cJSON_Delete(hi);
    cJSON_Delete(st);
    return r;
}

/* A list, tuple or dict literal. */
static cJSON *kvf_eval_collection(kvf_jx_t *x, const kvf_expr_t *e)
{
    cJSON *r;

    r = (e->kind == KVF_E_LIST) ? cJSON_CreateArray() : cJSON_CreateObject();
    if ((r != NULL) && (e->kind == KVF_E_LIST) && e->negate) {
        r->type |= KVF_JINJA_TUPLE;
    }
    for (int i = 0; i < e->nargs; ++i) {
        if (e->kind == KVF_E_LIST) {
            cJSON_AddItemToArray(r, kvf_jinja_eval(x, e->args[i]));
        } else {
            cJSON *k = kvf_jinja_eval(x, e->args[i++]), *v;
            char buf[32];
            const char *ks = kvf_jinja_key_text(k, buf, sizeof(buf));
            if ((ks == NULL) && (x->status == KVF_OK)) {
                kvf_jinja_fail(x, KVF_ERR_UNSUPPORTED, "dict keys other than strings and "
                               "integers are not supported");
            }
            v = (i < e->nargs) ? kvf_jinja_eval(x, e->args[i]) : kvf_jinja_undef();
            if ((ks != NULL) && (cJSON_GetObjectItemCaseSensitive(r, ks) != NULL)) {
                cJSON_ReplaceItemInObjectCaseSensitive(r, ks, v);   /* the last wins */
            } else {
                cJSON_AddItemToObject(r, (ks != NULL) ? ks : "", v);
            }
            cJSON_Delete(k);
        }
    }
    return r;
}

cJSON *kvf_jinja_eval(kvf_jx_t *x, const kvf_expr_t *e)
{
    cJSON *a, *b, *r;

    if ((e == NULL) || (x->status != KVF_OK)) {
        return kvf_jinja_undef();
    }
    switch (e->kind) {
    case KVF_E_LIT:
        return cJSON_Duplicate(e->lit, true);
    case KVF_E_NONE_SLOT:
        return cJSON_CreateNull();
    case KVF_E_NAME:
        return kvf_jinja_dup(kvf_lookup(x, e->name));
    case KVF_E_LIST:
    case KVF_E_DICT:
        return kvf_eval_collection(x, e);
    case KVF_E_ATTR: {
        const cJSON *o;
        a = kvf_jinja_eval(x, e->a);
        o = kvf_jinja_deref(x, a);
        if (kvf_jinja_is_undef(a)) {
            kvf_jinja_fail(x, KVF_ERR_INVALID_PARAM, "'.%s' of an undefined value", e->name);
        }
        if ((cJSON_IsObject(a) && kvf_jinja_has("dict", e->name)) ||
            (cJSON_IsString(a) && kvf_jinja_has("str", e->name)) ||
            (cJSON_IsArray(a) && kvf_jinja_has("list", e->name))) {
            r = cJSON_Duplicate(x->callable, true);   /* jinja2: the method, not a key */
        } else {
            r = cJSON_IsObject(o) ? kvf_jinja_dup(cJSON_GetObjectItemCaseSensitive(o, e->name)) :
                                    kvf_jinja_undef();
        }
        cJSON_Delete(a);
        return r;
    }
    case KVF_E_ITEM:
        a = kvf_jinja_eval(x, e->a);
        b = kvf_jinja_eval(x, e->b);
        if (kvf_jinja_is_undef(a)) {
            kvf_jinja_fail(x, KVF_ERR_INVALID_PARAM, "'[...]' of an undefined value");
        }
        r = ((a != NULL) && (a->type & (KVF_JINJA_GEN | KVF_JINJA_VIEW))) ? kvf_jinja_undef() :
            kvf_item(x, kvf_jinja_deref(x, a), b);
        cJSON_Delete(a);
        cJSON_Delete(b);
        return r;
    case KVF_E_SLICE:
        return kvf_eval_slice(x, e);
    case KVF_E_CALL:
        return kvf_jinja_call(x, e);
    case KVF_E_FILTER:
        return kvf_jinja_filter(x, e);
    case KVF_E_TEST:
        a = kvf_jinja_eval(x, e->a);
        r = cJSON_CreateBool(kvf_jinja_test(x, e, a));
        cJSON_Delete(a);
        return r;
    case KVF_E_BIN:
        a = kvf_jinja_eval(x, e->a);
        b = kvf_jinja_eval(x, e->b);
        if (!strcmp(e->name, "in")) {
            if (cJSON_IsObject(b) && ((cJSON_IsArray(a) && !(a->type & KVF_JINJA_TUPLE)) ||
                                      cJSON_IsObject(a))) {
                kvf_jinja_fail(x, KVF_ERR_INVALID_PARAM, "unhashable type: '%s'",
                               cJSON_IsArray(a) ? "list" : "dict");
            } else if (cJSON_IsString(b) && !cJSON_IsString(a)) {
                kvf_jinja_fail(x, KVF_ERR_INVALID_PARAM, "'in <string>' requires string as "
                               "left operand");
            } else if (!kvf_jinja_is_undef(b) && !cJSON_IsString(b) && !cJSON_IsArray(b) &&
                       !cJSON_IsObject(b)) {
                kvf_jinja_fail(x, KVF_ERR_INVALID_PARAM, "argument of type '%s' is not "
                               "iterable", cJSON_IsNull(b) ? "NoneType" : "int");
            }
            r = cJSON_CreateBool(kvf_in(a, kvf_jinja_deref(x, b)) != e->negate);
        } else {
            r = kvf_binop(x, e->name, a, b);
        }
        cJSON_Delete(a);
        cJSON_Delete(b);
        return r;
    case KVF_E_NOT:
        a = kvf_jinja_eval(x, e->a);
        r = cJSON_CreateBool(!kvf_jinja_truthy(a));
        cJSON_Delete(a);
        return r;
    case KVF_E_NEG:
        a = kvf_jinja_eval(x, e->a);
        r = cJSON_CreateNumber(-kvf_jinja_num(a));
        if ((r != NULL) && (a != NULL) && (a->type & KVF_JINJA_FLOAT)) {
            r->type |= KVF_JINJA_FLOAT;
        }
        cJSON_Delete(a);
        return r;
    case KVF_E_AND:
    case KVF_E_OR:
        a = kvf_jinja_eval(x, e->a);
        if (kvf_jinja_truthy(a) == (e->kind == KVF_E_OR)) {
            return a;   /* Python's and/or return an operand */
        }
        cJSON_Delete(a);
        return kvf_jinja_eval(x, e->b);
    case KVF_E_COND:
        a = kvf_jinja_eval(x, e->b);
        r = kvf_jinja_truthy(a) ? kvf_jinja_eval(x, e->a) :
            (e->c != NULL) ? kvf_jinja_eval(x, e->c) : kvf_jinja_undef();
        cJSON_Delete(a);
        return r;
    }
    return kvf_jinja_undef();
}
