/*
 * Chat-template values (kvf_proxy_jinja_int.h): cJSON nodes, a fresh owned tree per
 * evaluation, undefined a node of type cJSON_Invalid. What Python would print: str() (repr
 * inside lists and dicts, True/False/None, the shortest float that reads back) and
 * json.dumps() for tojson.
 */
#include "kvf_proxy_jinja_int.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What jinja2 (with transformers' tojson) and Python have, by name: a name outside these
 * fails the render as it fails in jinja2; one inside that this subset lacks is refused by
 * name (kvf_jinja_has). */
static const char *const kvf_known[][2] = {
    {"filter", " abs attr batch capitalize center count d default dictsort e escape "
               "filesizeformat first float forceescape format groupby indent int items join "
               "last length list lower map max min pprint random reject rejectattr replace "
               "reverse round safe select selectattr slice sort string striptags sum title "
               "tojson trim truncate unique upper urlencode urlize wordcount wordwrap xmlattr "},
    {"test", " boolean callable defined divisibleby eq equalto escaped even false filter float "
             "ge greaterthan gt in integer iterable le lessthan lower lt mapping ne none number "
             "odd sameas sequence string test true undefined upper "},
    {"str", " capitalize casefold center count encode endswith expandtabs find format "
            "format_map index isalnum isalpha isascii isdecimal isdigit isidentifier islower "
            "isnumeric isprintable isspace istitle isupper join ljust lower lstrip maketrans "
            "partition removeprefix removesuffix replace rfind rindex rjust rpartition rsplit "
            "rstrip split splitlines startswith strip swapcase title translate upper zfill "},
    {"list", " append clear copy count extend index insert pop remove reverse sort "},
    {"dict", " clear copy fromkeys get items keys pop popitem setdefault update values "},
};

bool kvf_jinja_has(const char *kind, const char *name)
{
    char word[72];

    if ((strlen(name) > 64) || (strchr(name, ' ') != NULL)) {
        return false;
    }
    snprintf(word, sizeof(word), " %s ", name);
    for (size_t i = 0; i < sizeof(kvf_known) / sizeof(kvf_known[0]); ++i) {
        if (!strcmp(kvf_known[i][0], kind)) {
            return strstr(kvf_known[i][1], word) != NULL;
        }
    }
    return false;
}

cJSON *kvf_jinja_iter(const cJSON *v)
{
    cJSON *r;
    const cJSON *c;

    if (!kvf_jinja_is_undef(v) && !cJSON_IsArray(v) && !cJSON_IsString(v) && !cJSON_IsObject(v)) {
        return NULL;
    }
    r = cJSON_CreateArray();
    if (cJSON_IsString(v)) {
        for (const char *p = v->valuestring; *p;) {
            size_t k = 1;
            while ((p[k] & 0xC0) == 0x80) {
                ++k;
            }
            cJSON_AddItemToArray(r, kvf_jinja_take_str(strndup(p, k)));
            p += k;
        }
    } else if (cJSON_IsObject(v)) {
        cJSON_ArrayForEach(c, v) {
            cJSON_AddItemToArray(r, kvf_jinja_key(c->string));
        }
    } else if (cJSON_IsArray(v)) {
        cJSON_ArrayForEach(c, v) {
            cJSON_AddItemToArray(r, cJSON_Duplicate(c, true));
        }
    }
    return r;
}

bool kvf_jinja_is_function(const cJSON *v)
{
    return cJSON_IsRaw(v) && (v->valueint == 0);
}

cJSON *kvf_jinja_key(const char *k)
{
    return (k[0] == KVF_JINJA_INTKEY) ? cJSON_CreateNumber(strtod(k + 1, NULL)) :
                                        cJSON_CreateString(k);
}

const char *kvf_jinja_key_text(const cJSON *key, char *buf, size_t cap)
{
    if (cJSON_IsString(key)) {
        return key->valuestring;
    }
    if (cJSON_IsNumber(key) && (floor(key->valuedouble) == key->valuedouble) &&
        (fabs(key->valuedouble) < 1e15)) {
        snprintf(buf, cap, "%c%.0f", KVF_JINJA_INTKEY, key->valuedouble);
        return buf;
    }
    return NULL;
}

cJSON *kvf_jinja_undef(void)
{
    cJSON *v = cJSON_CreateNull();

    if (v != NULL) {
        v->type = cJSON_Invalid;
    }
    return v;
}

bool kvf_jinja_is_undef(const cJSON *v)
{
    return (v == NULL) || ((v->type & 0xFF) == cJSON_Invalid);
}

bool kvf_jinja_truthy(const cJSON *v)
{
    if (kvf_jinja_is_undef(v) || cJSON_IsNull(v) || cJSON_IsFalse(v)) {
        return false;
    }
    if (cJSON_IsNumber(v)) {
        return v->valuedouble != 0.0;
    }
    if (cJSON_IsString(v)) {
        return v->valuestring[0] != '\0';
    }
    if (cJSON_IsArray(v) && (v->type & KVF_JINJA_GEN)) {
        return true;   /* a generator is true, empty or not */
    }
    if (cJSON_IsArray(v) || cJSON_IsObject(v)) {
        return v->child != NULL;
    }
    return true;
}

void kvf_jinja_sb_add(kvf_sb_t *b, const char *s, size_t n)
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

void kvf_jinja_sb_str(kvf_sb_t *b, const char *s)
{
    kvf_jinja_sb_add(b, s, strlen(s));
}

/* Python's repr() of a number: an int's digits; a float's shortest digits that read back,
 * fixed between 1e-4 and 1e16, else with an exponent of at least two digits. */
static void kvf_num_text(const cJSON *v, char *buf, size_t cap)
{
    double d = v->valuedouble;
    char t[40], ds[24], *e;
    const char *sign;
    int p, exp, nd = 0;

    if (!(v->type & KVF_JINJA_FLOAT) && (floor(d) == d) && (fabs(d) < 1e15)) {
        snprintf(buf, cap, "%.0f", (d == 0) ? 0.0 : d);   /* an int has no -0 */
        return;
    }
    if ((d != d) || isinf(d)) {
        snprintf(buf, cap, "%s", (d != d) ? "nan" : (d > 0) ? "inf" : "-inf");
        return;
    }
    sign = signbit(d) ? "-" : "";   /* -0.0 too */
    for (p = 1; p <= 17; ++p) {
        snprintf(t, sizeof(t), "%.*e", p - 1, fabs(d));
        if (strtod(t, NULL) == fabs(d)) {
            break;
        }
    }
    e = strchr(t, 'e');
    exp = (e != NULL) ? atoi(e + 1) : 0;
    for (const char *c = t; (c < e) && (nd < (int)sizeof(ds) - 1); ++c) {
        if (isdigit((unsigned char)*c)) {
            ds[nd++] = *c;
        }
    }
    while ((nd > 1) && (ds[nd - 1] == '0')) {   /* %.*e may pad with zeros */
        --nd;
    }
    ds[nd] = '\0';
    if ((exp >= -4) && (exp < 16)) {
        if (exp < 0) {
            snprintf(buf, cap, "%s0.%.*s%s", sign, -exp - 1, "0000", ds);
        } else if (exp + 1 >= nd) {
            snprintf(buf, cap, "%s%s%.*s.0", sign, ds, exp + 1 - nd,
                     "0000000000000000");
        } else {
            snprintf(buf, cap, "%s%.*s.%s", sign, exp + 1, ds, ds + exp + 1);
        }
    } else {
        snprintf(buf, cap, "%s%c%s%se%c%02d", sign, ds[0], (nd > 1) ? "." : "",
                 ds + 1, (exp < 0) ? '-' : '+', abs(exp));
    }
}

/* One string as JSON; non-ASCII as \uXXXX (surrogate pairs above the BMP) when @a ascii. */
static void kvf_json_str(kvf_sb_t *b, const char *str, bool ascii)
{
    kvf_jinja_sb_add(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)str; *p; ++p) {
        char esc[16];
        switch (*p) {
        case '"': kvf_jinja_sb_str(b, "\\\""); break;
        case '\\': kvf_jinja_sb_str(b, "\\\\"); break;
        case '\n': kvf_jinja_sb_str(b, "\\n"); break;
        case '\r': kvf_jinja_sb_str(b, "\\r"); break;
        case '\t': kvf_jinja_sb_str(b, "\\t"); break;
        case '\b': kvf_jinja_sb_str(b, "\\b"); break;
        case '\f': kvf_jinja_sb_str(b, "\\f"); break;
        default:
            if (*p < 0x20) {
                snprintf(esc, sizeof(esc), "\\u%04x", *p);
                kvf_jinja_sb_str(b, esc);
            } else if (ascii && (*p >= 0x80)) {
                unsigned cp = 0;
                int more = (*p >= 0xF0) ? 3 : (*p >= 0xE0) ? 2 : (*p >= 0xC0) ? 1 : 0;
                cp = *p & (0x3F >> more);
                for (int k = 0; (k < more) && ((p[1] & 0xC0) == 0x80); ++k) {
                    cp = (cp << 6) | (*++p & 0x3F);
                }
                if (cp >= 0x10000) {
                    cp -= 0x10000;
                    snprintf(esc, sizeof(esc), "\\u%04x\\u%04x", 0xD800 + (cp >> 10),
                             0xDC00 + (cp & 0x3FF));
                } else {
                    snprintf(esc, sizeof(esc), "\\u%04x", cp);
                }
                kvf_jinja_sb_str(b, esc);
            } else {
                kvf_jinja_sb_add(b, (const char *)p, 1);
            }
        }
    }
    kvf_jinja_sb_add(b, "\"", 1);
}

static int kvf_key_cmp(const void *a, const void *b)
{
    return strcmp((*(const cJSON *const *)a)->string, (*(const cJSON *const *)b)->string);
}

/* Python's json.dumps(v, ensure_ascii=, indent=, separators=, sort_keys=) (kvf_json_opts_t). */
void kvf_jinja_json_dump(kvf_sb_t *b, const cJSON *v, const kvf_json_opts_t *o, int level)
{
    char num[64];

    if (cJSON_IsString(v)) {
        kvf_json_str(b, v->valuestring, o->ascii);
    } else if (cJSON_IsNumber(v)) {
        kvf_num_text(v, num, sizeof(num));
        kvf_jinja_sb_str(b, num);
    } else if (cJSON_IsTrue(v)) {
        kvf_jinja_sb_str(b, "true");
    } else if (cJSON_IsFalse(v)) {
        kvf_jinja_sb_str(b, "false");
    } else if (cJSON_IsArray(v) || cJSON_IsObject(v)) {
        bool obj = cJSON_IsObject(v);
        int n = cJSON_GetArraySize(v), i = 0;
        const cJSON **items = calloc((size_t)n + 1, sizeof(*items)), *c;

        kvf_jinja_sb_str(b, obj ? "{" : "[");
        if ((v->child == NULL) || (items == NULL)) {
            free(items);
            kvf_jinja_sb_str(b, obj ? "}" : "]");
            return;
        }
        cJSON_ArrayForEach(c, v) {
            items[i++] = c;
        }
        if (obj && o->sort_keys) {
            qsort(items, (size_t)n, sizeof(*items), kvf_key_cmp);
        }
        for (i = 0; i < n; ++i) {
            if (i > 0) {
                kvf_jinja_sb_str(b, o->item_sep);
            }
            if (o->indent >= 0) {
                kvf_jinja_sb_str(b, "\n");
                for (int k = 0; k < o->indent * (level + 1); ++k) {
                    kvf_jinja_sb_str(b, " ");
                }
            }
            if (obj) {
                kvf_json_str(b, items[i]->string + (items[i]->string[0] == KVF_JINJA_INTKEY),
                             o->ascii);
                kvf_jinja_sb_str(b, o->key_sep);
            }
            kvf_jinja_json_dump(b, items[i], o, level + 1);
        }
        free(items);
        if (o->indent >= 0) {
            kvf_jinja_sb_str(b, "\n");
            for (int k = 0; k < o->indent * level; ++k) {
                kvf_jinja_sb_str(b, " ");
            }
        }
        kvf_jinja_sb_str(b, obj ? "}" : "]");
    } else {
        kvf_jinja_sb_str(b, "null");
    }
}

void kvf_jinja_html_escape(kvf_sb_t *b, const char *s)
{
    for (; *s; ++s) {
        switch (*s) {
        case '&': kvf_jinja_sb_str(b, "&amp;"); break;
        case '<': kvf_jinja_sb_str(b, "&lt;"); break;
        case '>': kvf_jinja_sb_str(b, "&gt;"); break;
        case '"': kvf_jinja_sb_str(b, "&#34;"); break;
        case '\'': kvf_jinja_sb_str(b, "&#39;"); break;
        default: kvf_jinja_sb_add(b, s, 1);
        }
    }
}

/* Python's repr() of a string: single quotes unless it holds one and no double quote;
 * backslash, the quote, \n \r \t and the other control characters escaped. */
static void kvf_repr_str(kvf_sb_t *b, const char *s)
{
    char q = (strchr(s, '\'') != NULL) && (strchr(s, '"') == NULL) ? '"' : '\'';

    kvf_jinja_sb_add(b, &q, 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; ++p) {
        char esc[8];
        if ((*p == '\\') || (*p == (unsigned char)q)) {
            kvf_jinja_sb_add(b, "\\", 1);
            kvf_jinja_sb_add(b, (const char *)p, 1);
        } else if ((*p == '\n') || (*p == '\r') || (*p == '\t')) {
            kvf_jinja_sb_str(b, (*p == '\n') ? "\\n" : (*p == '\r') ? "\\r" : "\\t");
        } else if ((*p < 0x20) || (*p == 0x7f)) {
            snprintf(esc, sizeof(esc), "\\x%02x", *p);
            kvf_jinja_sb_str(b, esc);
        } else {
            kvf_jinja_sb_add(b, (const char *)p, 1);
        }
    }
    kvf_jinja_sb_add(b, &q, 1);
}

/* Python's str() of a value (repr for the items of lists and dicts). */
static void kvf_v_str(kvf_sb_t *b, const cJSON *v, bool repr)
{
    char num[64];

    if (kvf_jinja_is_undef(v)) {
        if (repr) {   /* an undefined item of a list */
            kvf_jinja_sb_str(b, "Undefined");
        }
        return;
    }
    if (cJSON_IsArray(v) && (v->type & KVF_JINJA_VIEW)) {
        cJSON plain = *v;
        plain.type &= ~KVF_JINJA_VIEW;
        kvf_jinja_sb_str(b, (v->type & KVF_JINJA_ITEMS) ? "dict_items(" :
                            (v->type & KVF_JINJA_KEYS) ? "dict_keys(" : "dict_values(");
        kvf_v_str(b, &plain, true);
        kvf_jinja_sb_str(b, ")");
        return;
    }
    if (cJSON_IsString(v)) {
        if (repr && (v->type & KVF_JINJA_MARKUP)) {
            kvf_jinja_sb_str(b, "Markup(");
            kvf_repr_str(b, v->valuestring);
            kvf_jinja_sb_str(b, ")");
        } else if (repr) {
            kvf_repr_str(b, v->valuestring);
        } else {
            kvf_jinja_sb_str(b, v->valuestring);
        }
    } else if (cJSON_IsNumber(v)) {
        kvf_num_text(v, num, sizeof(num));
        kvf_jinja_sb_str(b, num);
    } else if (cJSON_IsTrue(v)) {
        kvf_jinja_sb_str(b, "True");
    } else if (cJSON_IsFalse(v)) {
        kvf_jinja_sb_str(b, "False");
    } else if (cJSON_IsNull(v)) {
        kvf_jinja_sb_str(b, "None");
    } else {
        bool obj = cJSON_IsObject(v), first = true, tuple = (v->type & KVF_JINJA_TUPLE) != 0;
        const cJSON *c;

        if (cJSON_IsRaw(v)) {   /* a function or a namespace */
            kvf_jinja_sb_str(b, v->valuestring);
            return;
        }
        kvf_jinja_sb_str(b, obj ? "{" : tuple ? "(" : "[");
        cJSON_ArrayForEach(c, v) {
            if (!first) {
                kvf_jinja_sb_str(b, ", ");
            }
            first = false;
            if (obj) {
                if (c->string[0] == KVF_JINJA_INTKEY) {
                    kvf_jinja_sb_str(b, c->string + 1);
                } else {
                    kvf_repr_str(b, c->string);
                }
                kvf_jinja_sb_str(b, ": ");
            }
            kvf_v_str(b, c, true);
        }
        if (tuple && (v->child != NULL) && (v->child->next == NULL)) {
            kvf_jinja_sb_str(b, ",");
        }
        kvf_jinja_sb_str(b, obj ? "}" : tuple ? ")" : "]");
    }
}

char *kvf_jinja_tostr(const cJSON *v)
{
    kvf_sb_t b = {0};

    kvf_jinja_sb_add(&b, "", 0);
    kvf_v_str(&b, v, false);
    return b.s;
}

cJSON *kvf_jinja_take_str(char *s)
{
    cJSON *v = cJSON_CreateString((s != NULL) ? s : "");

    free(s);
    return v;
}
