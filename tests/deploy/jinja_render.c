/*
 * Test driver: render a chat template with kvf_proxy_jinja_render().
 * Usage: jinja_render TEMPLATE_FILE < VARS_JSON; the text on stdout (exit 0) or
 * "error: ..." on stderr (exit 2). tests/deploy/test_chat_template.py compares it
 * with Python's jinja2.
 */
#include "kvf_proxy_jinja.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int main(int argc, char **argv)
{
    FILE *f = (argc == 2) ? fopen(argv[1], "rb") : NULL;
    char *tmpl = (f != NULL) ? slurp(f) : NULL, *vars_text = slurp(stdin), *out = NULL;
    cJSON *vars = (vars_text != NULL) ? cJSON_Parse(vars_text) : NULL;
    char err[512];
    int rc = 0;

    if (f != NULL) {
        fclose(f);
    }
    if ((tmpl == NULL) || (vars == NULL)) {
        fprintf(stderr, "usage: jinja_render TEMPLATE < VARS_JSON\n");
        rc = 1;
    } else if (kvf_proxy_jinja_render(tmpl, vars, &out, err, sizeof(err)) != KVF_OK) {
        fprintf(stderr, "error: %s\n", err);
        rc = 2;
    } else {
        fwrite(out, 1, strlen(out), stdout);
    }
    free(out);
    cJSON_Delete(vars);
    free(tmpl);
    free(vars_text);
    return rc;
}
