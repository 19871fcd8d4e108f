/*
 * Chat-template values (kvf_proxy_jinja_int.h): cJSON nodes, a fresh owned tree per
 * evaluation, undefined a node of type cJSON_Invalid. What Python would print: str() (repr
 * inside lists and dicts, True/False/None, the shortest float that reads back) and
 * json.dumps() for tojson.
 */
#include "kvf_proxy_jinja_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
void kvf_jinja_json_dump(kvf_sb_t *b, const cJSON *v, int indent, int level)
{
    char num[64];

    if (cJSON_IsString(v)) {
        kvf_jinja_sb_add(b, "\"", 1);
        for (const unsigned char *p = (const unsigned char *)v->valuestring; *p; ++p) {
            char esc[8];
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
                } else {
                    kvf_jinja_sb_add(b, (const char *)p, 1);
                }
            }
        }
        kvf_jinja_sb_add(b, "\"", 1);
    } else if (cJSON_IsNumber(v)) {
        kvf_num_text(v->valuedouble, num, sizeof(num));
        kvf_jinja_sb_str(b, num);
    } else if (cJSON_IsTrue(v)) {
        kvf_jinja_sb_str(b, "true");
    } else if (cJSON_IsFalse(v)) {
        kvf_jinja_sb_str(b, "false");
    } else if (cJSON_IsArray(v) || cJSON_IsObject(v)) {
        bool obj = cJSON_IsObject(v);
        const cJSON *c;
        bool first = true;

        kvf_jinja_sb_str(b, obj ? "{" : "[");
        if (v->child == NULL) {
            kvf_jinja_sb_str(b, obj ? "}" : "]");
            return;
        }
        cJSON_ArrayForEach(c, v) {
            if (!first) {
                kvf_jinja_sb_str(b, (indent >= 0) ? "," : ", ");
            }
            first = false;
            if (indent >= 0) {
                kvf_jinja_sb_str(b, "\n");
                for (int i = 0; i < indent * (level + 1); ++i) {
                    kvf_jinja_sb_str(b, " ");
                }
            }
            if (obj) {
                cJSON key;
                memset(&key, 0, sizeof(key));
                key.type = cJSON_String;
                key.valuestring = c->string;
                kvf_jinja_json_dump(b, &key, indent, level + 1);
                kvf_jinja_sb_str(b, ": ");
            }
            kvf_jinja_json_dump(b, c, indent, level + 1);
        }
        if (indent >= 0) {
            kvf_jinja_sb_str(b, "\n");
            for (int i = 0; i < indent * level; ++i) {
                kvf_jinja_sb_str(b, " ");
            }
        }
        kvf_jinja_sb_str(b, obj ? "}" : "]");
    } else {
        kvf_jinja_sb_str(b, "null");
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
        return;
    }
    if (cJSON_IsString(v)) {
        if (repr) {
            kvf_repr_str(b, v->valuestring);
        } else {
            kvf_jinja_sb_str(b, v->valuestring);
        }
    } else if (cJSON_IsNumber(v)) {
        kvf_num_text(v->valuedouble, num, sizeof(num));
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
                kvf_jinja_sb_str(b, "'");
                kvf_jinja_sb_str(b, c->string);
                kvf_jinja_sb_str(b, "': ");
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
