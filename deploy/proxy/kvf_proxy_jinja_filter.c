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

/* select, reject, selectattr, rejectattr and map over the items of @a v (owned result). */
static cJSON *kvf_filter_select(kvf_jx_t *x, const kvf_expr_t *e, const char *f,
                                const cJSON *v)
{
    bool attr = (strstr(f, "attr") != NULL) || !strcmp(f, "map");
    bool keep_true = (f[0] == 's') || (f[0] == 'm');
    cJSON *a0 = kvf_jinja_arg(x, e, 0, NULL), *test = attr ? kvf_jinja_arg(x, e, 1, NULL) : a0;
    cJSON *aname = !strcmp(f, "map") ? kvf_jinja_arg(x, e, 0, "attribute") : a0;
    const cJSON *c;
    cJSON *r = cJSON_CreateArray();

    cJSON_ArrayForEach(c, v) {
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
    return r;
}

cJSON *kvf_jinja_filter(kvf_jx_t *x, const kvf_expr_t *e)
{
    const char *f = e->name;
    cJSON *v = kvf_jinja_eval(x, e->a), *r = NULL;

    if (!strcmp(f, "trim")) {
        char *s = kvf_jinja_tostr(v);
        r = kvf_jinja_strip(s ? s : "", " \t\n\r\f\v", true, true);
        free(s);
    } else if (!strcmp(f, "length") || !strcmp(f, "count")) {
        r = cJSON_CreateNumber(cJSON_IsString(v) ? (double)strlen(v->valuestring) :
                               (double)cJSON_GetArraySize(v));
    } else if (!strcmp(f, "string")) {
        r = kvf_jinja_take_str(kvf_jinja_tostr(v));
    } else if (!strcmp(f, "safe") || !strcmp(f, "list")) {
        r = cJSON_Duplicate(v, true);
    } else if (!strcmp(f, "int")) {
        r = cJSON_CreateNumber(cJSON_IsString(v) ? trunc(atof(v->valuestring)) :
                               trunc(kvf_jinja_num(v)));
    } else if (!strcmp(f, "lower") || !strcmp(f, "upper") || !strcmp(f, "capitalize") ||
               !strcmp(f, "title")) {
        char *s = kvf_jinja_tostr(v);
        r = kvf_jinja_case(s ? s : "", !strcmp(f, "lower") ? 0 : !strcmp(f, "upper") ? 1 :
                     !strcmp(f, "capitalize") ? 2 : 3);
        free(s);
    } else if (!strcmp(f, "default") || !strcmp(f, "d")) {
        cJSON *d = kvf_jinja_arg(x, e, 0, NULL), *b = kvf_jinja_arg(x, e, 1, "boolean");
        bool use = kvf_jinja_is_undef(v) ||
                   ((b != NULL) && kvf_jinja_truthy(b) && !kvf_jinja_truthy(v));
        r = use ? ((d != NULL) ? cJSON_Duplicate(d, true) : cJSON_CreateString("")) :
                  cJSON_Duplicate(v, true);
        cJSON_Delete(d);
        cJSON_Delete(b);
    } else if (!strcmp(f, "first") || !strcmp(f, "last")) {
        int n = cJSON_GetArraySize(v);
        r = (n == 0) ? kvf_jinja_undef() :
            cJSON_Duplicate(cJSON_GetArrayItem(v, (f[0] == 'f') ? 0 : n - 1), true);
    } else if (!strcmp(f, "reverse")) {
        cJSON *step = cJSON_CreateNumber(-1);
        r = kvf_jinja_slice(v, NULL, NULL, step);
        cJSON_Delete(step);
    } else if (!strcmp(f, "join")) {
        cJSON *sep = kvf_jinja_arg(x, e, 0, NULL), *c;
        kvf_sb_t sb = {0};
        bool first = true;
        kvf_jinja_sb_add(&sb, "", 0);
        cJSON_ArrayForEach(c, v) {
            char *s = kvf_jinja_tostr(c);
            if (!first && cJSON_IsString(sep)) {
                kvf_jinja_sb_str(&sb, sep->valuestring);
            }
            first = false;
            kvf_jinja_sb_str(&sb, s ? s : "");
            free(s);
        }
        cJSON_Delete(sep);
        r = kvf_jinja_take_str(sb.s);
    } else if (!strcmp(f, "tojson")) {
        cJSON *ind = kvf_jinja_arg(x, e, 0, "indent");
        kvf_sb_t sb = {0};
        kvf_jinja_sb_add(&sb, "", 0);
        kvf_jinja_json_dump(&sb, v, cJSON_IsNumber(ind) ? (int)ind->valuedouble : -1, 0);
        cJSON_Delete(ind);
        r = kvf_jinja_take_str(sb.s);
    } else if (!strcmp(f, "replace")) {
        cJSON *a = kvf_jinja_arg(x, e, 0, NULL), *b = kvf_jinja_arg(x, e, 1, NULL);
        char *s = kvf_jinja_tostr(v);
        r = (cJSON_IsString(a) && cJSON_IsString(b)) ?
            kvf_jinja_replace(s ? s : "", a->valuestring, b->valuestring) : NULL;
        free(s);
        cJSON_Delete(a);
        cJSON_Delete(b);
    } else if (!strcmp(f, "items")) {
        kvf_expr_t call = {0};
        r = kvf_jinja_method(x, v, "items", &call);
    } else if (!strcmp(f, "select") || !strcmp(f, "reject") || !strcmp(f, "selectattr") ||
               !strcmp(f, "rejectattr") || !strcmp(f, "map")) {
        r = kvf_filter_select(x, e, f, v);
    }
    cJSON_Delete(v);
    if (r == NULL) {
        kvf_jinja_fail(x, KVF_ERR_UNSUPPORTED, "filter '%s' is not supported", f);
        return kvf_jinja_undef();
    }
    return r;
}

