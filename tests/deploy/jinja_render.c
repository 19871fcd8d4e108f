/*
 * Test driver: render a chat template with kvf_proxy_jinja_render_at().
 * Usage: jinja_render [--now EPOCH] TEMPLATE_FILE < VARS_JSON; the text on stdout (exit 0)
 * or "error: ..." on stderr (exit 2; exit 3 when the template is outside the subset).
 *        jinja_render --batch [--now EPOCH] TEMPLATE_FILE < [VARS_JSON, ...]: one render
 * per object; stdout is a JSON list of {"text": ...} or {"error": ..., "status": "parse" |
 * "unsupported" | "invalid" | "other"} (exit 0). strftime_now() reads EPOCH (default: now).
 * tests/deploy/test_chat_template.py and test_chat_template_real.py compare it with
 * Python's jinja2.
 */
#include "kvf_proxy_jinja.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static char *slurp(FILE *f)
{
    size_t n = 0, cap = 4096;
    char *b = malloc(cap);

    while (b != NULL) {
        size_t r = fread(b + n, 1, cap - n - 1, f);
        n += r;
        if (r == 0) {
            break;
        }
        if (n + 1 == cap) {
            char *g = realloc(b, cap * 2);
            if (g == NULL) {
                free(b);
                return NULL;
            }
            b = g;
            cap *= 2;
        }
    }
    if (b != NULL) {
        b[n] = '\0';
    }
    return b;
}

static const char *status_name(kvf_status_t st)
{
    return (st == KVF_ERR_PARSE) ? "parse" : (st == KVF_ERR_UNSUPPORTED) ? "unsupported" :
           (st == KVF_ERR_INVALID_PARAM) ? "invalid" : "other";
}

/* One render per object of the list @a all; the JSON list of results on stdout. */
static int render_batch(const char *tmpl, const cJSON *all, time_t now)
{
    cJSON *res = cJSON_CreateArray();
    const cJSON *vars;
    char *text;

    cJSON_ArrayForEach(vars, all) {
        cJSON *r = cJSON_CreateObject();
        char err[512], *out = NULL;
        kvf_status_t st = kvf_proxy_jinja_render_at(tmpl, vars, now, &out, err, sizeof(err));
        if (st == KVF_OK) {
            cJSON_AddStringToObject(r, "text", out);
        } else {
            cJSON_AddStringToObject(r, "error", err);
            cJSON_AddStringToObject(r, "status", status_name(st));
        }
        free(out);
        cJSON_AddItemToArray(res, r);
    }
    text = cJSON_PrintUnformatted(res);
    cJSON_Delete(res);
    if (text == NULL) {
        return 1;
    }
    fputs(text, stdout);
    free(text);
    return 0;
}

int main(int argc, char **argv)
{
    bool batch = false;
    time_t now = time(NULL);
    int i = 1;
    FILE *f;
    char *tmpl, *vars_text, *out = NULL;
    cJSON *vars;
    char err[512];
    int rc = 0;

    for (; (i < argc) && (argv[i][0] == '-') && (argv[i][1] == '-'); ++i) {
        if (!strcmp(argv[i], "--batch")) {
            batch = true;
        } else if (!strcmp(argv[i], "--now") && (i + 1 < argc)) {
            now = (time_t)strtoll(argv[++i], NULL, 10);
        } else {
            break;
        }
    }
    f = (i + 1 == argc) ? fopen(argv[i], "rb") : NULL;
    tmpl = (f != NULL) ? slurp(f) : NULL;
    vars_text = slurp(stdin);
    vars = (vars_text != NULL) ? cJSON_Parse(vars_text) : NULL;
    if (f != NULL) {
        fclose(f);
    }
    if ((tmpl == NULL) || (vars == NULL) || (batch && !cJSON_IsArray(vars))) {
        fprintf(stderr, "usage: jinja_render [--batch] [--now EPOCH] TEMPLATE < VARS_JSON\n");
        rc = 1;
    } else if (batch) {
        rc = render_batch(tmpl, vars, now);
    } else {
        kvf_status_t st = kvf_proxy_jinja_render_at(tmpl, vars, now, &out, err, sizeof(err));
        if (st != KVF_OK) {
            fprintf(stderr, "error: %s\n", err);
            rc = (st == KVF_ERR_UNSUPPORTED) ? 3 : 2;
        } else {
            fwrite(out, 1, strlen(out), stdout);
        }
    }
    free(out);
    cJSON_Delete(vars);
    free(tmpl);
    free(vars_text);
    return rc;
}
