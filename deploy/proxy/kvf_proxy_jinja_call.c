/*
 * Chat-template calls (kvf_proxy_jinja_int.h): the global functions (namespace(), range(),
 * dict(), raise_exception(), strftime_now()), macros, and the methods of strings, dicts
 * and lists with Python's semantics. What is outside the subset fails the render by name.
 */
#include "kvf_proxy_jinja_int.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <locale.h>
#include <time.h>
#include <wctype.h>

static const char *kvf_strip_set(const cJSON *chars)
{
    return cJSON_IsString(chars) ? chars->valuestring : " \t\n\r\f\v";
}

cJSON *kvf_jinja_strip(const char *s, const char *set, bool left, bool right)
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
        return kvf_jinja_take_str(t);
    }
}

cJSON *kvf_jinja_replace(const char *s, const char *from, const char *to)
{
    kvf_sb_t sb = {0};
    size_t fl = strlen(from);

    kvf_jinja_sb_add(&sb, "", 0);
    if (fl == 0) {
        kvf_jinja_sb_str(&sb, s);
        return kvf_jinja_take_str(sb.s);
    }
    for (const char *p = s;;) {
        const char *h = strstr(p, from);
        if (h == NULL) {
            kvf_jinja_sb_str(&sb, p);
            break;
        }
        kvf_jinja_sb_add(&sb, p, (size_t)(h - p));
        kvf_jinja_sb_str(&sb, to);
        p = h + fl;
    }
    return kvf_jinja_take_str(sb.s);
}

static cJSON *kvf_split(const char *s, const cJSON *sep)
{
    cJSON *out = cJSON_CreateArray();

    if (cJSON_IsString(sep) && (sep->valuestring[0] != '\0')) {
        size_t l = strlen(sep->valuestring);
        for (const char *p = s;;) {
            const char *h = strstr(p, sep->valuestring);
            char *t = strndup(p, (h != NULL) ? (size_t)(h - p) : strlen(p));
            cJSON_AddItemToArray(out, kvf_jinja_take_str(t));
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
            cJSON_AddItemToArray(out, kvf_jinja_take_str(strndup(a, (size_t)(p - a))));
        }
    }
    return out;
}

/* The next code point of UTF-8 text at *p (advanced); an invalid byte reads as itself. */
static unsigned kvf_utf8_next(const unsigned char **p)
{
    const unsigned char *q = *p;
    int more = (*q >= 0xF0) ? 3 : (*q >= 0xE0) ? 2 : (*q >= 0xC0) ? 1 : 0;
    unsigned cp = *q & (0x7F >> more);

    for (int k = 0; k < more; ++k) {
        if ((q[k + 1] & 0xC0) != 0x80) {   /* truncated: the lead byte alone */
            *p = q + 1;
            return *q;
        }
        cp = (cp << 6) | (q[k + 1] & 0x3F);
    }
    *p = q + 1 + more;
    return cp;
}

static void kvf_utf8_put(kvf_sb_t *b, unsigned cp)
{
    char u[4];
    size_t n = (cp < 0x80) ? 1 : (cp < 0x800) ? 2 : (cp < 0x10000) ? 3 : 4;

    if (n == 1) {
        u[0] = (char)cp;
    } else {
        for (size_t k = n - 1; k > 0; --k) {
            u[k] = (char)(0x80 | (cp & 0x3F));
            cp >>= 6;
        }
        u[0] = (char)(((n == 2) ? 0xC0 : (n == 3) ? 0xE0 : 0xF0) | cp);
    }
    kvf_jinja_sb_add(b, u, n);
}

/* Python's case mappings over all of Unicode through the C.UTF-8 locale's tables (simple
 * mappings; 'ß'.upper() is "SS" as in Python). Without that locale: ASCII only. */
cJSON *kvf_jinja_case(const char *s, int mode)
{
    locale_t loc = newlocale(LC_CTYPE_MASK, "C.UTF-8", (locale_t)0);
    kvf_sb_t b = {0};
    bool start = true;

    kvf_jinja_sb_add(&b, "", 0);
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        unsigned c = kvf_utf8_next(&p), up, lo;
        bool upper;
        up = (loc != (locale_t)0) ? (unsigned)towupper_l((wint_t)c, loc) :
             (c < 0x80) ? (unsigned)toupper((int)c) : c;
        lo = (loc != (locale_t)0) ? (unsigned)towlower_l((wint_t)c, loc) :
             (c < 0x80) ? (unsigned)tolower((int)c) : c;
        upper = (mode == 1) || ((mode == 2) && start) || ((mode >= 3) && start);
        if (upper && (c == 0xDF)) {
            kvf_jinja_sb_str(&b, (mode == 1) ? "SS" : "Ss");
        } else if (upper && ((mode == 2) || (mode == 3)) && (((c >= 0x1C4) && (c <= 0x1CC)) ||
                                            ((c >= 0x1F1) && (c <= 0x1F3)))) {
            /* the digraphs' own title case (DŽ Dž dž: Dž) */
            kvf_utf8_put(&b, (c >= 0x1F1) ? 0x1F2 : 0x1C5 + 3 * ((c - 0x1C4) / 3));
        } else {
            kvf_utf8_put(&b, upper ? up : lo);
        }
        if (mode == 2) {
            start = false;
        } else if (mode == 3) {   /* str.title(): a word starts after a character without case */
            start = (up == c) && (lo == c);
        } else if (mode == 4) {   /* jinja2's |title: after -, a blank, ( { [ < */
            start = (c < 0x80) && ((strchr("-({[<", (int)c) != NULL) || isspace((int)c));
        }
    }
    if (loc != (locale_t)0) {
        freelocale(loc);
    }
    return kvf_jinja_take_str(b.s);
}

/* The methods of lists and dicts that change them. */
static bool kvf_mutates(const char *m)
{
    static const char *const names[] = {"append", "extend", "insert", "pop", "remove",
                                        "reverse", "sort", "clear", "popitem", "setdefault",
                                        "update", NULL};

    for (int i = 0; names[i] != NULL; ++i) {
        if (!strcmp(names[i], m)) {
            return true;
        }
    }
    return false;
}

/* Python's str.format() with {} / {0} / {name} fields and {{ }} escapes; a conversion or
 * a format spec is refused by name. */
static cJSON *kvf_str_format(kvf_jx_t *x, const char *s, const kvf_expr_t *call)
{
    kvf_sb_t sb = {0};
    int auto_i = 0;

    kvf_jinja_sb_add(&sb, "", 0);
    for (const char *p = s; *p && (x->status == KVF_OK); ++p) {
        const char *close;
        char field[64];
        cJSON *v;
        char *t;
        if (((p[0] == '{') && (p[1] == '{')) || ((p[0] == '}') && (p[1] == '}'))) {
            kvf_jinja_sb_add(&sb, p++, 1);
            continue;
        }
        if (p[0] != '{') {
            kvf_jinja_sb_add(&sb, p, 1);
            continue;
        }
        close = strchr(p, '}');
        if ((close == NULL) || ((size_t)(close - p) >= sizeof(field)) ||
            (strcspn(p + 1, ":!") < (size_t)(close - p - 1))) {
            kvf_jinja_fail(x, KVF_ERR_UNSUPPORTED, "str.format() with a format spec or a "
                           "conversion is not supported");
            break;
        }
        snprintf(field, sizeof(field), "%.*s", (int)(close - p - 1), p + 1);
        v = (field[0] == '\0') ? kvf_jinja_arg(x, call, auto_i++, NULL) :
            isdigit((unsigned char)field[0]) ? kvf_jinja_arg(x, call, atoi(field), NULL) :
            kvf_jinja_arg(x, call, -1, field);
        if (v == NULL) {
            kvf_jinja_fail(x, KVF_ERR_INVALID_PARAM, "str.format(): no argument for {%s}",
                           field);
            break;
        }
        t = kvf_jinja_tostr(v);
        kvf_jinja_sb_str(&sb, t ? t : "");
        free(t);
        cJSON_Delete(v);
        p = close;
    }
    return kvf_jinja_take_str(sb.s);
}

/* obj.method(args) for strings and dicts. */
cJSON *kvf_jinja_method(kvf_jx_t *x, const cJSON *obj, const char *m, const kvf_expr_t *call)
{
    cJSON *a0 = kvf_jinja_arg(x, call, 0, NULL), *a1 = kvf_jinja_arg(x, call, 1, NULL), *r = NULL;

    if (cJSON_IsString(obj)) {
        const char *s = obj->valuestring;
        if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip")) {
            r = kvf_jinja_strip(s, kvf_strip_set(a0), m[0] != 'r', m[0] != 'l');
        } else if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) {
            size_t n = strlen(s), k = cJSON_IsString(a0) ? strlen(a0->valuestring) : 0;
            bool ok = cJSON_IsString(a0) && (k <= n) &&
                      !strncmp((m[0] == 's') ? s : s + n - k, a0->valuestring, k);
            r = cJSON_CreateBool(ok);
        } else if (!strcmp(m, "split")) {
            r = kvf_split(s, a0);
        } else if (!strcmp(m, "replace") && cJSON_IsString(a0) && cJSON_IsString(a1)) {
            r = kvf_jinja_replace(s, a0->valuestring, a1->valuestring);
        } else if (!strcmp(m, "lower") || !strcmp(m, "upper") || !strcmp(m, "capitalize") ||
                   !strcmp(m, "title")) {
            r = kvf_jinja_case(s, !strcmp(m, "lower") ? 0 : !strcmp(m, "upper") ? 1 :
                         !strcmp(m, "capitalize") ? 2 : 3);
        }
    } else if (cJSON_IsObject(obj)) {
        if (!strcmp(m, "get")) {
            char buf[32];
            const char *k = kvf_jinja_key_text(a0, buf, sizeof(buf));
            const cJSON *v = (k != NULL) ? cJSON_GetObjectItemCaseSensitive(obj, k) : NULL;
            r = (v != NULL) ? cJSON_Duplicate(v, true) :
                (a1 != NULL) ? cJSON_Duplicate(a1, true) : cJSON_CreateNull();
        } else if (!strcmp(m, "items") || !strcmp(m, "keys") || !strcmp(m, "values")) {
            const cJSON *c;
            r = cJSON_CreateArray();
            cJSON_ArrayForEach(c, obj) {
                if (m[0] == 'i') {
                    cJSON *pair = cJSON_CreateArray();
                    pair->type |= KVF_JINJA_TUPLE;
                    cJSON_AddItemToArray(pair, kvf_jinja_key(c->string));
                    cJSON_AddItemToArray(pair, cJSON_Duplicate(c, true));
                    cJSON_AddItemToArray(r, pair);
                } else {
                    cJSON_AddItemToArray(r, (m[0] == 'k') ? kvf_jinja_key(c->string) :
                                                            cJSON_Duplicate(c, true));
                }
            }
        }
    }
    cJSON_Delete(a0);
    cJSON_Delete(a1);
    if ((r == NULL) && cJSON_IsString(obj) && !strcmp(m, "format")) {
        r = kvf_str_format(x, obj->valuestring, call);
    }
    if ((r == NULL) && (cJSON_IsArray(obj) || cJSON_IsObject(obj)) && kvf_mutates(m)) {
        /* transformers' sandbox is immutable: jinja2 refuses these, so the render fails */
        kvf_jinja_fail(x, KVF_ERR_INVALID_PARAM, "access to attribute '%s' of '%s' object is "
                       "unsafe.", m, cJSON_IsArray(obj) ? "list" : "dict");
        return kvf_jinja_undef();
    }
    if ((r == NULL) && (x->status == KVF_OK)) {
        const char *type = cJSON_IsString(obj) ? "str" : cJSON_IsArray(obj) ? "list" :
                           cJSON_IsObject(obj) ? "dict" : NULL;
        if ((obj != NULL) && (obj->type & KVF_JINJA_LOOP)) {   /* loop.cycle(), loop.changed() */
            kvf_jinja_fail(x, KVF_ERR_UNSUPPORTED, "loop.%s() is not supported", m);
        } else if ((type != NULL) && kvf_jinja_has(type, m)) {
            kvf_jinja_fail(x, KVF_ERR_UNSUPPORTED, "method '%s' is not supported", m);
        } else {   /* jinja2: an undefined attribute, called */
            kvf_jinja_fail(x, KVF_ERR_INVALID_PARAM, "'%s' has no method '%s'",
                           (type != NULL) ? type : "this value", m);
        }
    }
    if (r == NULL) {
        return kvf_jinja_undef();
    }
    return r;
}

cJSON *kvf_jinja_call(kvf_jx_t *x, const kvf_expr_t *e)
{
    const kvf_expr_t *f = e->a;

    if (f->kind == KVF_E_ATTR) {
        cJSON *obj = kvf_jinja_eval(x, f->a), *r = kvf_jinja_method(x, obj, f->name, e);
        if (cJSON_IsObject(obj) && cJSON_IsArray(r)) {   /* a view of the dict */
            r->type |= !strcmp(f->name, "items") ? KVF_JINJA_ITEMS :
                       !strcmp(f->name, "keys") ? KVF_JINJA_KEYS :
                       !strcmp(f->name, "values") ? KVF_JINJA_VALUES : 0;
        }
        cJSON_Delete(obj);
        return r;
    }
    if ((f->kind == KVF_E_NAME) && (kvf_jinja_macro(x, f->name) != NULL)) {
        return kvf_jinja_call_macro(x, kvf_jinja_macro(x, f->name), e);
    }
    if ((f->kind == KVF_E_NAME) && !strcmp(f->name, "strftime_now")) {
        cJSON *fmt = kvf_jinja_arg(x, e, 0, NULL);
        struct tm tm;
        char buf[256] = "";
        if (!cJSON_IsString(fmt)) {
            cJSON_Delete(fmt);
            kvf_jinja_fail(x, KVF_ERR_INVALID_PARAM, "strftime_now() needs a format string");
            return kvf_jinja_undef();
        }
        if ((localtime_r(&x->now, &tm) == NULL) ||
            ((strftime(buf, sizeof(buf), fmt->valuestring, &tm) == 0) &&
             (fmt->valuestring[0] != '\0'))) {
            kvf_jinja_fail(x, KVF_ERR_INVALID_PARAM, "strftime_now('%s') failed",
                           fmt->valuestring);
        }
        cJSON_Delete(fmt);
        return cJSON_CreateString(buf);
    }
    if ((f->kind == KVF_E_NAME) && !strcmp(f->name, "raise_exception")) {
        cJSON *m = kvf_jinja_arg(x, e, 0, NULL);
        kvf_jinja_fail(x, KVF_ERR_INVALID_PARAM, "%s",
                    cJSON_IsString(m) ? m->valuestring : "raise_exception()");
        cJSON_Delete(m);
        return kvf_jinja_undef();
    }
    if ((f->kind == KVF_E_NAME) && (!strcmp(f->name, "namespace") || !strcmp(f->name, "dict"))) {
        cJSON *ns = cJSON_CreateObject(), *ref;
        for (int i = 0; i < e->nargs; ++i) {
            if (e->kwnames[i] != NULL) {
                cJSON_AddItemToObject(ns, e->kwnames[i], kvf_jinja_eval(x, e->args[i]));
            } else {
                kvf_jinja_fail(x, KVF_ERR_UNSUPPORTED, "positional arguments of %s() are not "
                               "supported", f->name);
            }
        }
        if (f->name[0] == 'd') {
            return ns;
        }
        /* a namespace is a reference to its object (kvf_jinja_deref) */
        cJSON_AddItemToArray(x->namespaces, ns);
        ref = cJSON_CreateRaw("<Namespace>");
        if (ref != NULL) {
            ref->valueint = cJSON_GetArraySize(x->namespaces);
        }
        return ref;
    }
    if ((f->kind == KVF_E_NAME) && !strcmp(f->name, "range")) {   /* range([lo,] hi[, step]) */
        cJSON *a = kvf_jinja_arg(x, e, 0, NULL), *b = kvf_jinja_arg(x, e, 1, NULL);
        cJSON *c = kvf_jinja_arg(x, e, 2, NULL), *r = cJSON_CreateArray();
        double lo = (b != NULL) ? kvf_jinja_num(a) : 0, hi = (b != NULL) ? kvf_jinja_num(b) :
                    kvf_jinja_num(a), step = (c != NULL) ? kvf_jinja_num(c) : 1;
        if (step == 0) {
            kvf_jinja_fail(x, KVF_ERR_INVALID_PARAM, "range() arg 3 must not be zero");
        }
        for (double i = lo; (step != 0) && ((step > 0) ? (i < hi) : (i > hi)) &&
                            (fabs(i - lo) < 100000 * fabs(step)); i += step) {
            cJSON_AddItemToArray(r, cJSON_CreateNumber(i));
        }
        cJSON_Delete(a);
        cJSON_Delete(b);
        cJSON_Delete(c);
        return r;
    }
    kvf_jinja_fail(x, KVF_ERR_UNSUPPORTED, "calling '%s' is not supported",
                (f->kind == KVF_E_NAME) ? f->name : "this value");
    return kvf_jinja_undef();
}

