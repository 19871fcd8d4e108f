/*
 * Chat-template filters (kvf_proxy_jinja_int.h) with jinja2's semantics as transformers
 * sets it up (tojson is json.dumps without ASCII escapes unless asked). What is outside the
 * subset fails the render by name.
 */
#include "kvf_proxy_jinja_int.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* select, reject, selectattr, rejectattr and map over the items of @a v (owned result). */
static cJSON *kvf_filter_select(kvf_jx_t *x, const kvf_expr_t *e, const char *f,
                                const cJSON *v)
{
    bool attr = (strstr(f, "attr") != NULL) || !strcmp(f, "map");
    bool keep_true = (f[0] == 's') || (f[0] == 'm');
    cJSON *a0 = kvf_jinja_arg(x, e, 0, NULL), *test = attr ? kvf_jinja_arg(x, e, 1, NULL) : a0;
    cJSON *aname = !strcmp(f, "map") ? kvf_jinja_arg(x, e, 0, "attribute") : a0;
    const cJSON *c;
    /* jinja2 iterates only a true value (select over None is empty), and lazily: a value it
     * cannot iterate fails only when the generator is used */
    cJSON *r = cJSON_CreateArray(), *all = kvf_jinja_truthy(v) ? kvf_jinja_iter(v) :
                                                                   cJSON_CreateArray();

    if (all == NULL) {
        kvf_jinja_fail(x, KVF_ERR_UNSUPPORTED, "'%s' over a value that is not iterable is not "
                       "supported", f);
    }
    cJSON_ArrayForEach(c, all) {
        const cJSON *item = c;
        if (attr && cJSON_IsString(aname)) {
            item = cJSON_GetObjectItemCaseSensitive(c, aname->valuestring);
        }
        if (!strcmp(f, "map")) {
            cJSON_AddItemToArray(r, kvf_jinja_dup(item));
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
            if (!strcmp(t.name, "truthy") ? kvf_jinja_truthy(item) == keep_true :
                kvf_jinja_test(x, &t, item) == keep_true) {
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
    cJSON_Delete(all);
    if (r != NULL) {
        r->type |= KVF_JINJA_GEN;   /* jinja2's select / map yield a generator */
    }
    return r;
}

/* Python's type name of @a v, for error messages. */
static const char *kvf_type_name(const cJSON *v)
{
    return cJSON_IsNull(v) ? "NoneType" : cJSON_IsBool(v) ? "bool" :
           cJSON_IsNumber(v) ? "int" : (v != NULL) && (v->type & KVF_JINJA_GEN) ? "generator" :
           cJSON_IsRaw(v) ? "function" : "object";
}

/* The number of characters (code points) of UTF-8 text @a s. */
static size_t kvf_utf8_len(const char *s)
{
    size_t n = 0;

    for (; *s; ++s) {
        n += ((*s & 0xC0) != 0x80);
    }
    return n;
}

/* tojson(ensure_ascii=False, indent=None, separators=None, sort_keys=False) as transformers
 * defines it (json.dumps); a generator or an undefined value is not JSON. */
static cJSON *kvf_filter_tojson(kvf_jx_t *x, const kvf_expr_t *e, const cJSON *v)
{
    cJSON *asc = kvf_jinja_arg(x, e, 0, "ensure_ascii"), *ind = kvf_jinja_arg(x, e, 1, "indent");
    cJSON *sep = kvf_jinja_arg(x, e, 2, "separators"), *srt = kvf_jinja_arg(x, e, 3, "sort_keys");
    kvf_json_opts_t o = {cJSON_IsNumber(ind) ? (int)kvf_jinja_long(fmin(ind->valuedouble, 65)) :
                         -1,
                         kvf_jinja_truthy(asc), kvf_jinja_truthy(srt), ", ", ": "};
    kvf_sb_t sb = {0};
    cJSON *r = NULL;

    if (o.indent > 64) {
        kvf_jinja_fail(x, KVF_ERR_UNSUPPORTED, "tojson with an indent over 64 is not supported");
    }
    if (o.indent >= 0) {
        o.item_sep = ",";
    }
    if (cJSON_IsArray(sep) && (cJSON_GetArraySize(sep) == 2) &&
        cJSON_IsString(cJSON_GetArrayItem(sep, 0)) && cJSON_IsString(cJSON_GetArrayItem(sep, 1))) {
        o.item_sep = cJSON_GetArrayItem(sep, 0)->valuestring;
        o.key_sep = cJSON_GetArrayItem(sep, 1)->valuestring;
    }
    if (kvf_jinja_is_undef(v) || cJSON_IsRaw(v) || (v->type & (KVF_JINJA_GEN | KVF_JINJA_VIEW))) {
        kvf_jinja_fail(x, KVF_ERR_INVALID_PARAM, "Object of type %s is not JSON serializable",
                       kvf_jinja_is_undef(v) ? "Undefined" :
                       (v->type & KVF_JINJA_VIEW) ? "dict_items" : kvf_type_name(v));
    } else {
        kvf_jinja_sb_add(&sb, "", 0);
        kvf_jinja_json_dump(&sb, v, &o, 0);
        r = kvf_jinja_take_str(sb.s);
    }
    cJSON_Delete(asc);
    cJSON_Delete(ind);
    cJSON_Delete(sep);
    cJSON_Delete(srt);
    return (r != NULL) ? r : kvf_jinja_undef();
}

/* int(default=0): Python's int() of the value, else int(float()) of it, else the default
 * (text that is not wholly a number, inf, nan, a list ...). */
static cJSON *kvf_filter_int(kvf_jx_t *x, const kvf_expr_t *e, const cJSON *v)
{
    cJSON *dflt = kvf_jinja_arg(x, e, 0, "default"), *r;
    double d = 0;
    bool ok = false;

    if (cJSON_IsString(v)) {
        const char *p = v->valuestring, *q;
        char *end;
        while (isspace((unsigned char)*p)) {
            ++p;
        }
        q = p + ((*p == '-') || (*p == '+'));
        d = strtod(p, &end);
        while (isspace((unsigned char)*end)) {
            ++end;
        }
        ok = (end != p) && (*end == '\0') && isfinite(d) &&
             !((q[0] == '0') && ((q[1] == 'x') || (q[1] == 'X')));   /* no hex in Python */
    } else if (cJSON_IsNumber(v) || cJSON_IsBool(v)) {
        d = kvf_jinja_num(v);
        ok = isfinite(d);
    } else if (kvf_jinja_is_undef(v)) {   /* int(Undefined) raises in jinja2 */
        kvf_jinja_fail(x, KVF_ERR_INVALID_PARAM, "|int of an undefined value");
    }
    r = ok ? cJSON_CreateNumber(trunc(d)) :
        (dflt != NULL) ? cJSON_Duplicate(dflt, true) : cJSON_CreateNumber(0);
    cJSON_Delete(dflt);
    return r;
}

/* Jinja's sort key comparison: strings case-insensitively unless @a cs, numbers by value. */
static int kvf_cmp(const cJSON *a, const cJSON *b, bool cs)
{
    if (cJSON_IsString(a) && cJSON_IsString(b)) {
        return cs ? strcmp(a->valuestring, b->valuestring) :
                    strcasecmp(a->valuestring, b->valuestring);
    }
    if ((cJSON_IsNumber(a) || cJSON_IsBool(a)) && (cJSON_IsNumber(b) || cJSON_IsBool(b))) {
        double p = kvf_jinja_num(a), q = kvf_jinja_num(b);
        return (p > q) - (p < q);
    }
    return 0;
}

static const cJSON *kvf_sort_key(const cJSON *item, const cJSON *attr);

/* Whether Python can order the keys of @a v's items (all strings, or all numbers and
 * booleans; one item needs no comparison); lists are refused by name. */
static bool kvf_orderable(kvf_jx_t *x, const cJSON *v, const cJSON *attr, bool dict)
{
    int strs = 0, nums = 0, other = 0, lists = 0, undefs = 0, n = 0;
    const cJSON *c;

    cJSON_ArrayForEach(c, v) {
        const cJSON *k = dict ? NULL : kvf_sort_key(c, attr);
        strs += dict ? 1 : cJSON_IsString(k);
        nums += !dict && (cJSON_IsNumber(k) || cJSON_IsBool(k));
        lists += !dict && cJSON_IsArray(k);
        other += !dict && !cJSON_IsString(k) && !cJSON_IsNumber(k) && !cJSON_IsBool(k) &&
                 !cJSON_IsArray(k);
        undefs += !dict && kvf_jinja_is_undef(k);
        ++n;
    }
    if ((n < 2) || (strs == n) || (nums == n) || (undefs == n)) {   /* jinja2 sorts undefined */
        return true;
    }
    kvf_jinja_fail(x, (lists > 0) && (other == 0) && (strs == 0) && (nums == 0) ?
                   KVF_ERR_UNSUPPORTED : KVF_ERR_INVALID_PARAM,
                   "ordering these values is not supported ('<' between their types)");
    return false;
}

/* The key of @a item to sort by: itself, its attribute @a attr, or (dictsort) its key. */
static const cJSON *kvf_sort_key(const cJSON *item, const cJSON *attr)
{
    return cJSON_IsString(attr) ? cJSON_GetObjectItemCaseSensitive(item, attr->valuestring) :
                                  item;
}

/* sort, dictsort, unique, min, max: a stable insertion sort (lists are short). */
static cJSON *kvf_filter_order(kvf_jx_t *x, const kvf_expr_t *e, const char *f, const cJSON *v)
{
    bool dict = !strcmp(f, "dictsort");
    cJSON *rev = kvf_jinja_arg(x, e, dict ? 2 : 0, "reverse"), *r = cJSON_CreateArray();
    cJSON *cs = kvf_jinja_arg(x, e, dict ? 0 : 1, "case_sensitive");
    cJSON *attr = kvf_jinja_arg(x, e, dict ? -1 : 2, "attribute"), *c;
    int n = cJSON_GetArraySize(v), m = 0;
    cJSON **items = calloc((size_t)n + 1, sizeof(*items));

    if ((dict && !cJSON_IsObject(v)) || (!dict && !cJSON_IsArray(v)) || (items == NULL)) {
        kvf_jinja_fail(x, KVF_ERR_UNSUPPORTED, "filter '%s' on this value is not supported", f);
        n = 0;
    }
    if (!strcmp(f, "min") || !strcmp(f, "max") || !strcmp(f, "unique")) {   /* attribute: 1st */
        cJSON_Delete(attr);
        attr = kvf_jinja_arg(x, e, -1, "attribute");
    }
    if ((n > 0) && strcmp(f, "unique") && !kvf_orderable(x, v, attr, dict)) {
        n = 0;
    }
    for (c = (n > 0) ? v->child : NULL; c != NULL; c = c->next) {
        cJSON *it = dict ? cJSON_CreateArray() : cJSON_Duplicate(c, true);
        int k = m;
        if (dict) {
            it->type |= KVF_JINJA_TUPLE;
            cJSON_AddItemToArray(it, kvf_jinja_key(c->string));
            cJSON_AddItemToArray(it, cJSON_Duplicate(c, true));
        }
        if (!strcmp(f, "unique")) {   /* a set of keys: strings without case, True == 1 */
            const cJSON *key = kvf_sort_key(it, attr);
            bool seen = false;
            if (cJSON_IsObject(key) || (cJSON_IsArray(key) && !(key->type & KVF_JINJA_TUPLE))) {
                kvf_jinja_fail(x, KVF_ERR_INVALID_PARAM, "unhashable type: '%s'",
                               cJSON_IsObject(key) ? "dict" : "list");
            }
            for (int j = 0; j < m; ++j) {
                const cJSON *kj = kvf_sort_key(items[j], attr);
                bool num = (cJSON_IsNumber(kj) || cJSON_IsBool(kj)) &&
                           (cJSON_IsNumber(key) || cJSON_IsBool(key));
                seen = seen || (cJSON_IsString(kj) && cJSON_IsString(key) ?
                                (kvf_cmp(kj, key, kvf_jinja_truthy(cs)) == 0) :
                                num ? (kvf_jinja_num(kj) == kvf_jinja_num(key)) :
                                cJSON_Compare(kj, key, true));
            }
            if (seen) {
                cJSON_Delete(it);
                continue;
            }
        } else {
            const cJSON *key = dict ? it->child : kvf_sort_key(it, attr);
            int sign = kvf_jinja_truthy(rev) ? -1 : 1;
            while ((k > 0) && (sign * kvf_cmp(dict ? items[k - 1]->child :
                                              kvf_sort_key(items[k - 1], attr), key,
                                              kvf_jinja_truthy(cs)) > 0)) {
                items[k] = items[k - 1];
                --k;
            }
        }
        items[k] = it;
        ++m;
    }
    if (!strcmp(f, "min") || !strcmp(f, "max")) {
        cJSON_Delete(r);
        r = (m == 0) ? kvf_jinja_undef() : cJSON_Duplicate(items[(f[1] == 'i') ? 0 : m - 1], true);
        for (int j = 0; j < m; ++j) {
            cJSON_Delete(items[j]);
        }
    } else {
        for (int j = 0; j < m; ++j) {
            cJSON_AddItemToArray(r, items[j]);
        }
    }
    free(items);
    cJSON_Delete(rev);
    cJSON_Delete(cs);
    cJSON_Delete(attr);
    return r;
}

/* indent(width=4, first=False, blank=False) as jinja2 3.1 does it (lines split on \n, \r\n
 * and \r; the text gets a newline first, so one trailing newline is not a line). */
static cJSON *kvf_filter_indent(kvf_jx_t *x, const kvf_expr_t *e, const cJSON *v)
{
    cJSON *w = kvf_jinja_arg(x, e, 0, "width"), *first = kvf_jinja_arg(x, e, 1, "first");
    cJSON *blank = kvf_jinja_arg(x, e, 2, "blank");
    char *s = kvf_jinja_tostr(v), *pad;
    kvf_sb_t sb = {0}, in = {0};
    bool line_start = true;

    if (!cJSON_IsString(v)) {   /* jinja2 adds a newline to it: a str only */
        kvf_jinja_fail(x, KVF_ERR_INVALID_PARAM, "indent of a value that is not a string");
    }

    kvf_jinja_sb_add(&in, "", 0);
    if (cJSON_IsString(w)) {
        kvf_jinja_sb_str(&in, w->valuestring);
    } else {
        long width = (w != NULL) ? kvf_jinja_long(fmin(kvf_jinja_num(w), 65)) : 4;
        if (width > 64) {
            kvf_jinja_fail(x, KVF_ERR_UNSUPPORTED, "indent wider than 64 is not supported");
        }
        for (long i = 0; i < width; ++i) {
            kvf_jinja_sb_str(&in, " ");
        }
    }
    pad = in.s;
    kvf_jinja_sb_add(&sb, "", 0);
    if (kvf_jinja_truthy(first)) {
        kvf_jinja_sb_str(&sb, pad);
    }
    for (const char *p = s ? s : ""; *p; ++p) {
        bool nl = (*p == '\n') || (*p == '\r');
        if (line_start && !nl && (p != s)) {
            kvf_jinja_sb_str(&sb, pad);
        } else if (line_start && nl && (p != s) && kvf_jinja_truthy(blank)) {
            kvf_jinja_sb_str(&sb, pad);
        }
        if ((p[0] == '\r') && (p[1] == '\n')) {
            ++p;
        }
        kvf_jinja_sb_add(&sb, nl ? "\n" : p, 1);
        line_start = nl;
    }
    free(s);
    free(pad);
    cJSON_Delete(w);
    cJSON_Delete(first);
    cJSON_Delete(blank);
    return kvf_jinja_take_str(sb.s);
}

/* map('filter', args...) over the items of @a v: each through the filter. */
static cJSON *kvf_filter_map(kvf_jx_t *x, const kvf_expr_t *e, const cJSON *v, const char *name)
{
    cJSON *r = cJSON_CreateArray(), *all = kvf_jinja_truthy(v) ? kvf_jinja_iter(v) :
                                                                   cJSON_CreateArray();
    const cJSON *c;

    if (all == NULL) {
        kvf_jinja_fail(x, KVF_ERR_UNSUPPORTED, "'map' over a value that is not iterable is not "
                       "supported");
    }
    cJSON_ArrayForEach(c, all) {
        kvf_expr_t lit = {0}, call = *e;
        lit.kind = KVF_E_LIT;
        lit.lit = (cJSON *)c;
        call.a = &lit;
        call.name = (char *)name;
        call.args = e->args + 1;
        call.kwnames = e->kwnames + 1;
        call.nargs = e->nargs - 1;
        cJSON_AddItemToArray(r, kvf_jinja_filter(x, &call));
    }
    cJSON_Delete(all);
    r->type |= KVF_JINJA_GEN;
    return r;
}

/* first, last, reverse and join: over a list, a string's characters or a dict's keys; NULL:
 * none of them. */
static cJSON *kvf_filter_seq(kvf_jx_t *x, const kvf_expr_t *e, const char *f, const cJSON *v)
{
    cJSON *r = NULL;

    if (!strcmp(f, "first") || !strcmp(f, "last")) {
        cJSON *all = kvf_jinja_iter(v);   /* a string's characters, a dict's keys */
        int n = cJSON_GetArraySize(all);
        if ((all == NULL) || ((f[0] == 'l') && (v->type & KVF_JINJA_GEN))) {
            kvf_jinja_fail(x, KVF_ERR_INVALID_PARAM, "'%s' of a value that is not %s", f,
                           (all == NULL) ? "iterable" : "reversible");
        }
        r = (n == 0) ? kvf_jinja_undef() :
            cJSON_Duplicate(cJSON_GetArrayItem(all, (f[0] == 'f') ? 0 : n - 1), true);
        cJSON_Delete(all);
    } else if (!strcmp(f, "reverse")) {
        cJSON *step = cJSON_CreateNumber(-1), *all = cJSON_IsString(v) ? NULL : kvf_jinja_iter(v);
        if (!cJSON_IsString(v) && (all == NULL)) {
            kvf_jinja_fail(x, KVF_ERR_INVALID_PARAM, "argument must be iterable");
        }
        r = kvf_jinja_slice(cJSON_IsString(v) ? v : all, NULL, NULL, step);
        if ((r != NULL) && !cJSON_IsString(v) && !(v->type & KVF_JINJA_GEN)) {
            r->type |= KVF_JINJA_GEN;   /* reversed(): an iterator; of a generator: a list */
        }
        cJSON_Delete(step);
        cJSON_Delete(all);
    } else if (!strcmp(f, "join")) {
        cJSON *sep = kvf_jinja_arg(x, e, 0, NULL), *c, *all = kvf_jinja_iter(v);
        kvf_sb_t sb = {0};
        bool first = true;
        kvf_jinja_sb_add(&sb, "", 0);
        if (all == NULL) {
            kvf_jinja_fail(x, KVF_ERR_INVALID_PARAM, "'join' over a value that is not iterable");
        }
        cJSON_ArrayForEach(c, all) {
            char *s = kvf_jinja_tostr(c);
            if (!first && cJSON_IsString(sep)) {
                kvf_jinja_sb_str(&sb, sep->valuestring);
            }
            first = false;
            kvf_jinja_sb_str(&sb, s ? s : "");
            free(s);
        }
        cJSON_Delete(sep);
        cJSON_Delete(all);
        r = kvf_jinja_take_str(sb.s);
    }
    return r;
}

/* The filters kvf_jinja_filter() does not know itself; NULL: none of them. */
static cJSON *kvf_filter_more(kvf_jx_t *x, const kvf_expr_t *e, const char *f, const cJSON *v)
{
    cJSON *seq = kvf_filter_seq(x, e, f, v);

    if (seq != NULL) {
        return seq;
    }
    if (!strcmp(f, "list")) {   /* a string's characters, a dict's keys, undefined: [] */
        cJSON *r = kvf_jinja_iter(v);
        if (r == NULL) {
            kvf_jinja_fail(x, KVF_ERR_INVALID_PARAM, "'%s' object is not iterable",
                           kvf_type_name(v));
        }
        return r;
    }
    if (!strcmp(f, "sort") || !strcmp(f, "dictsort") || !strcmp(f, "unique") ||
        !strcmp(f, "min") || !strcmp(f, "max")) {
        cJSON *r = kvf_filter_order(x, e, f, v);
        if ((r != NULL) && !strcmp(f, "unique")) {
            r->type |= KVF_JINJA_GEN;   /* jinja2's unique yields */
        }
        return r;
    }
    if (!strcmp(f, "indent")) {
        return kvf_filter_indent(x, e, v);
    }
    if (!strcmp(f, "map") && (e->nargs > 0) && (e->kwnames[0] == NULL)) {
        cJSON *name = kvf_jinja_arg(x, e, 0, NULL), *r = NULL;
        if (cJSON_IsString(name)) {
            r = kvf_filter_map(x, e, v, name->valuestring);
        }
        cJSON_Delete(name);
        return r;
    }
    return NULL;
}

cJSON *kvf_jinja_filter(kvf_jx_t *x, const kvf_expr_t *e)
{
    const char *f = e->name;
    cJSON *v = kvf_jinja_eval(x, e->a), *r = NULL;

    if ((kvf_jinja_is_function(v) || ((v != NULL) && (v->type & KVF_JINJA_GEN))) &&
        (!strcmp(f, "string") || !strcmp(f, "safe") || !strcmp(f, "e") || !strcmp(f, "escape") ||
         !strcmp(f, "trim") || !strcmp(f, "upper") || !strcmp(f, "lower") ||
         !strcmp(f, "title") || !strcmp(f, "capitalize") || !strcmp(f, "replace"))) {
        /* Python's text of a generator or a function holds its address */
        kvf_jinja_fail(x, KVF_ERR_UNSUPPORTED, "filter '%s' of a generator or a function is not "
                       "supported", f);
    }
    if (x->status != KVF_OK) {
        r = kvf_jinja_undef();
    } else if (!strcmp(f, "trim")) {
        char *s = kvf_jinja_tostr(v);
        r = kvf_jinja_strip(s ? s : "", " \t\n\r\f\v", true, true);
        free(s);
    } else if (!strcmp(f, "length") || !strcmp(f, "count")) {
        if (cJSON_IsString(v)) {
            r = cJSON_CreateNumber((double)kvf_utf8_len(v->valuestring));
        } else if ((cJSON_IsArray(v) || cJSON_IsObject(v)) && !(v->type & KVF_JINJA_GEN)) {
            r = cJSON_CreateNumber((double)cJSON_GetArraySize(v));
        } else if (kvf_jinja_is_undef(v)) {
            r = cJSON_CreateNumber(0);
        } else {
            kvf_jinja_fail(x, KVF_ERR_INVALID_PARAM, "object of type '%s' has no len()",
                           kvf_type_name(v));
            r = kvf_jinja_undef();
        }
    } else if (!strcmp(f, "string")) {
        r = kvf_jinja_take_str(kvf_jinja_tostr(v));
    } else if (!strcmp(f, "safe") || !strcmp(f, "escape") || !strcmp(f, "e")) {
        kvf_sb_t sb = {0};
        char *t = kvf_jinja_tostr(v);
        kvf_jinja_sb_add(&sb, "", 0);
        if ((f[0] == 's') || (cJSON_IsString(v) && (v->type & KVF_JINJA_MARKUP))) {
            kvf_jinja_sb_str(&sb, t ? t : "");
        } else {
            kvf_jinja_html_escape(&sb, t ? t : "");
        }
        free(t);
        r = kvf_jinja_take_str(sb.s);
        if (r != NULL) {
            r->type |= KVF_JINJA_MARKUP;
        }
    } else if (!strcmp(f, "int")) {
        r = kvf_filter_int(x, e, v);
    } else if (!strcmp(f, "lower") || !strcmp(f, "upper") || !strcmp(f, "capitalize") ||
               !strcmp(f, "title")) {
        char *s = kvf_jinja_tostr(v);
        r = kvf_jinja_case(s ? s : "", !strcmp(f, "lower") ? 0 : !strcmp(f, "upper") ? 1 :
                     !strcmp(f, "capitalize") ? 2 : 4);
        free(s);
    } else if (!strcmp(f, "default") || !strcmp(f, "d")) {
        cJSON *d = kvf_jinja_arg(x, e, 0, NULL), *b = kvf_jinja_arg(x, e, 1, "boolean");
        bool use = kvf_jinja_is_undef(v) ||
                   ((b != NULL) && kvf_jinja_truthy(b) && !kvf_jinja_truthy(v));
        r = use ? ((d != NULL) ? cJSON_Duplicate(d, true) : cJSON_CreateString("")) :
                  cJSON_Duplicate(v, true);
        cJSON_Delete(d);
        cJSON_Delete(b);
    } else if (!strcmp(f, "tojson")) {
        r = kvf_filter_tojson(x, e, v);
    } else if (!strcmp(f, "replace")) {
        cJSON *a = kvf_jinja_arg(x, e, 0, NULL), *b = kvf_jinja_arg(x, e, 1, NULL);
        char *s = kvf_jinja_tostr(v);
        r = (cJSON_IsString(a) && cJSON_IsString(b)) ?
            kvf_jinja_replace(s ? s : "", a->valuestring, b->valuestring) : NULL;
        free(s);
        cJSON_Delete(a);
        cJSON_Delete(b);
    } else if (!strcmp(f, "items")) {   /* an iterator of (key, value) pairs */
        kvf_expr_t call = {0};
        if (kvf_jinja_is_undef(v)) {
            r = cJSON_CreateArray();
        } else if (!cJSON_IsObject(kvf_jinja_deref(x, v)) || cJSON_IsRaw(v)) {
            /* jinja2 fails once the pairs are iterated, which is what templates do */
            kvf_jinja_fail(x, KVF_ERR_INVALID_PARAM, "Can only get item pairs from a mapping.");
            r = kvf_jinja_undef();
        } else {
            r = kvf_jinja_method(x, v, "items", &call);
        }
        if (r != NULL) {
            r->type |= KVF_JINJA_GEN;
        }
    } else if (!strcmp(f, "select") || !strcmp(f, "reject") || !strcmp(f, "selectattr") ||
               !strcmp(f, "rejectattr") ||
               (!strcmp(f, "map") && ((e->nargs == 0) || (e->kwnames[0] != NULL)))) {
        r = kvf_filter_select(x, e, f, v);
    }
    if (r == NULL) {
        r = kvf_filter_more(x, e, f, v);
    }
    cJSON_Delete(v);
    if (r == NULL) {
        if (kvf_jinja_has("filter", f)) {
            kvf_jinja_fail(x, KVF_ERR_UNSUPPORTED, "filter '%s' is not supported", f);
        } else {   /* jinja2 fails where it reaches a filter it does not have */
            kvf_jinja_fail(x, KVF_ERR_INVALID_PARAM, "No filter named '%s'.", f);
        }
        return kvf_jinja_undef();
    }
    return r;
}

