/*
 * Checkpoint JSON in Python's dialect (see kvf_json.h for why and how).
 */
#include "kvf_json.h"
#include "kvf_array.h"
#include "kvf_log.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define KVF_JSON_MAX_DEFAULT ((size_t)256 << 20)

/* One rewrite of the pre-pass: bytes [at, at + new_len) of the rewritten text
 * stand for [orig, orig + old_len) of the original. */
typedef struct {
    size_t at, new_len, orig, old_len;
} kvf_json_edit_t;

typedef struct {
    char            *out;       /* the rewritten text, NUL-terminated */
    size_t           len, cap;
    kvf_json_edit_t *edits;
    int              nedits, edits_cap;
    char             nan_mark[32];
} kvf_json_pass_t;

static kvf_status_t kvf_json_put(kvf_json_pass_t *p, const char *s, size_t n)
{
    if (KVF_ARRAY_GROW(p->out, p->cap, p->len + n + 1, 4096) != KVF_OK) {
        return KVF_ERR_NO_MEMORY;
    }
    memcpy(p->out + p->len, s, n);
    p->len += n;
    p->out[p->len] = '\0';
    return KVF_OK;
}

/* A token ends at whitespace, a separator or the end: "Infinityx" is no literal. */
static bool kvf_json_token_ends(const char *text, size_t len, size_t i)
{
    return (i == len) || (strchr(" \t\r\n,]}", text[i]) != NULL);
}

static bool kvf_json_has(const char *text, size_t len, const char *s)
{
    const size_t n = strlen(s);

    for (size_t i = 0; i + n <= len; ++i) {
        if (memcmp(text + i, s, n) == 0) {
            return true;
        }
    }
    return false;
}

/* The literal at text[i] (one of the three), its replacement, and its length; 0 if none. */
static size_t kvf_json_literal(const kvf_json_pass_t *p, const char *text, size_t len,
                               size_t i, const char **repl_p)
{
    static const struct { const char *lit, *repl; } lits[] = {
        {"-Infinity", "-1e999"}, {"Infinity", "1e999"}, {"NaN", NULL},
    };

    for (size_t k = 0; k < sizeof(lits) / sizeof(lits[0]); ++k) {
        const size_t n = strlen(lits[k].lit);
        if ((len - i >= n) && (memcmp(text + i, lits[k].lit, n) == 0) &&
            kvf_json_token_ends(text, len, i + n)) {
            *repl_p = (lits[k].repl != NULL) ? lits[k].repl : p->nan_mark;
            return n;
        }
    }
    return 0;
}

/* Copy @a text to p->out with the literals outside strings rewritten. */
static kvf_status_t kvf_json_rewrite(kvf_json_pass_t *p, const char *text, size_t len)
{
    bool in_str = false;
    char prev = ',';         /* the last byte outside strings that is not whitespace */
    size_t i = 0, run = 0;   /* run: start of the bytes not copied yet */

    /* a marker string the file does not contain, so no value of its own can be taken for it */
    for (unsigned k = 0;; ++k) {
        snprintf(p->nan_mark, sizeof(p->nan_mark), "\"kvf-nan-%u\"", k);
        if (!kvf_json_has(text, len, p->nan_mark + 1 /* without the quote */)) {
            break;
        }
    }
    while (i < len) {
        const char c = text[i];
        const char *repl = NULL;
        size_t n = 0;

        if (in_str) {
            in_str = (c != '"');
            i += ((c == '\\') && (i + 1 < len)) ? 2 : 1;
            continue;
        }
        if (c == '"') {
            in_str = true;
            prev = c;
            ++i;
            continue;
        }
        /* a literal starts a value: after ':', ',', '[' or at the document's start */
        if ((strchr("-IN", c) != NULL) && (strchr(":,[", prev) != NULL) &&
            ((n = kvf_json_literal(p, text, len, i, &repl)) > 0)) {
            if ((kvf_json_put(p, text + run, i - run) != KVF_OK) ||
                (KVF_ARRAY_GROW(p->edits, p->edits_cap, p->nedits + 1, 8) != KVF_OK)) {
                return KVF_ERR_NO_MEMORY;
            }
            p->edits[p->nedits++] = (kvf_json_edit_t){
                .at = p->len, .new_len = strlen(repl), .orig = i, .old_len = n};
            if (kvf_json_put(p, repl, strlen(repl)) != KVF_OK) {
                return KVF_ERR_NO_MEMORY;
            }
            i += n;
            run = i;
            prev = '0';
            continue;
        }
        if (!isspace((unsigned char)c)) {
            prev = c;
        }
        ++i;
    }
    return kvf_json_put(p, text + run, len - run);
}

/* The original offset of rewritten offset @a pos. */
static size_t kvf_json_orig_offset(const kvf_json_pass_t *p, size_t pos)
{
    size_t shift_new = 0, shift_old = 0;

    for (int k = 0; k < p->nedits; ++k) {
        const kvf_json_edit_t *e = &p->edits[k];
        if (pos < e->at) {
            break;
        }
        if (pos < e->at + e->new_len) {
            return e->orig;     /* inside a rewritten literal: its start */
        }
        shift_new += e->new_len;
        shift_old += e->old_len;
    }
    return pos - shift_new + shift_old;
}

static void kvf_json_report(const char *origin, const char *text, size_t len, size_t off)
{
    int line = 1, col = 1;
    char found[40];
    size_t n = 0;

    for (size_t i = 0; (i < off) && (i < len); ++i) {
        if (text[i] == '\n') {
            ++line;
            col = 1;
        } else {
            ++col;
        }
    }
    while ((off < len) && isspace((unsigned char)text[off])) {
        ++off;  /* cJSON stops before the whitespace ahead of the bad token */
    }
    for (size_t i = off; (i < len) && (n < 24) && (text[i] != '\n'); ++i) {
        found[n++] = isprint((unsigned char)text[i]) ? text[i] : '?';
    }
    found[n] = '\0';
    if (off >= len) {
        /* what comes last, since cJSON places some errors one byte on */
        size_t from = len, m = 0;
        while ((from > 0) && (len - from < 16) && (text[from - 1] != '\n')) {
            --from;
        }
        for (size_t i = from; i < len; ++i) {
            found[m++] = isprint((unsigned char)text[i]) ? text[i] : '?';
        }
        found[m] = '\0';
        kvf_error("%s:%d:%d: not valid JSON: found end of file after '%s'", origin, line, col,
                  found);
    } else {
        kvf_error("%s:%d:%d: not valid JSON: found '%s'", origin, line, col, found);
    }
}

/* NaN markers back to numbers, {"__float__": "..."} objects to numbers. */
static void kvf_json_restore(cJSON *item, const char *nan_mark)
{
    for (cJSON *c = item->child; c != NULL; c = c->next) {
        kvf_json_restore(c, nan_mark);
        if (cJSON_IsString(c) && (strncmp(c->valuestring, nan_mark + 1, strlen(nan_mark) - 2) ==
                                  0) && (strlen(c->valuestring) == strlen(nan_mark) - 2)) {
            cJSON_free(c->valuestring);
            c->valuestring = NULL;
            c->type = cJSON_Number;
            c->valuedouble = NAN;
            c->valueint = 0;
        } else if (cJSON_IsObject(c) && (c->child != NULL) && (c->child->next == NULL) &&
                   (strcmp(c->child->string, "__float__") == 0) && cJSON_IsString(c->child)) {
            const char *v = c->child->valuestring;
            const bool pinf = (strcmp(v, "Infinity") == 0), ninf = (strcmp(v, "-Infinity") == 0);
            if (pinf || ninf || (strcmp(v, "NaN") == 0)) {
                cJSON_Delete(c->child);
                c->child = NULL;
                c->type = cJSON_Number;
                c->valuedouble = pinf ? INFINITY : ninf ? -INFINITY : NAN;
                c->valueint = pinf ? INT_MAX : ninf ? INT_MIN : 0;   /* as cJSON clamps */
            }
        }
    }
}

kvf_status_t kvf_json_parse(const char *text, size_t len, const char *origin, cJSON **root_p)
{
    kvf_json_pass_t p;
    const char *end = NULL, *nul;
    cJSON *root;

    *root_p = NULL;
    origin = (origin != NULL) ? origin : "JSON";
    memset(&p, 0, sizeof(p));
    if (kvf_json_rewrite(&p, text, len) != KVF_OK) {
        free(p.out);
        free(p.edits);
        return KVF_ERR_NO_MEMORY;
    }
    /* require_null_terminated: nothing but whitespace may follow the value */
    root = cJSON_ParseWithLengthOpts(p.out, p.len + 1, &end, true);
    nul = memchr(p.out, '\0', p.len);
    if ((root == NULL) || (nul != NULL)) {
        /* a NUL byte inside the text ends cJSON's reading there: what follows is no JSON */
        size_t pos = (end != NULL) ? (size_t)(end - p.out) : 0;
        pos = ((nul != NULL) && ((size_t)(nul - p.out) < pos)) ? (size_t)(nul - p.out) : pos;
        cJSON_Delete(root);
        root = NULL;
        kvf_json_report(origin, text, len, kvf_json_orig_offset(&p, pos));
    } else {
        /* the root itself may be a bare literal or a __float__ object: wrap to restore it */
        cJSON holder = {0};
        holder.type = cJSON_Array;
        holder.child = root;
        kvf_json_restore(&holder, p.nan_mark);
        root = holder.child;
    }
    free(p.out);
    free(p.edits);
    if (root == NULL) {
        return KVF_ERR_PARSE;
    }
    *root_p = root;
    return KVF_OK;
}

kvf_status_t kvf_json_load(const char *path, size_t max_bytes, cJSON **root_p)
{
    FILE *f;
    struct stat st;
    char *text;
    kvf_status_t status;

    *root_p = NULL;
    max_bytes = (max_bytes == 0) ? KVF_JSON_MAX_DEFAULT : max_bytes;
    f = fopen(path, "rb");
    if (f == NULL) {
        kvf_error("%s: cannot open: %m", path);
        return (errno == ENOENT) ? KVF_ERR_NOT_FOUND : KVF_ERR_IO;
    }
    if ((fstat(fileno(f), &st) != 0) || !S_ISREG(st.st_mode)) {
        kvf_error("%s: not a regular file", path);
        fclose(f);
        return KVF_ERR_IO;
    }
    if ((size_t)st.st_size > max_bytes) {
        kvf_error("%s: %lld bytes, more than the %zu this file may have", path,
                  (long long)st.st_size, max_bytes);
        fclose(f);
        return KVF_ERR_OUT_OF_RANGE;
    }
    text = malloc((size_t)st.st_size + 1);
    if (text == NULL) {
        fclose(f);
        return KVF_ERR_NO_MEMORY;
    }
    if (fread(text, 1, (size_t)st.st_size, f) != (size_t)st.st_size) {
        kvf_error("%s: short read: %m", path);
        free(text);
        fclose(f);
        return KVF_ERR_IO;
    }
    fclose(f);
    text[st.st_size] = '\0';
    status = kvf_json_parse(text, (size_t)st.st_size, path, root_p);
    free(text);
    return status;
}

/* Non-finite numbers to raw items holding Python's spelling of them. */
static bool kvf_json_raw_nonfinite(cJSON *item)
{
    for (cJSON *c = item->child; c != NULL; c = c->next) {
        if (!kvf_json_raw_nonfinite(c)) {
            return false;
        }
        if (cJSON_IsNumber(c) && !isfinite(c->valuedouble)) {
            const char *lit = isnan(c->valuedouble) ? "NaN" :
                              (c->valuedouble > 0) ? "Infinity" : "-Infinity";
            char *raw = malloc(strlen(lit) + 1);
            if (raw == NULL) {
                return false;
            }
            strcpy(raw, lit);
            c->type = cJSON_Raw;
            c->valuestring = raw;
        }
    }
    return true;
}

char *kvf_json_print(cJSON *root)
{
    cJSON holder = {0};
    char *out;

    holder.type = cJSON_Array;
    holder.child = root;
    if (!kvf_json_raw_nonfinite(&holder)) {
        return NULL;
    }
    out = cJSON_Print(holder.child);
    return out;
}

kvf_status_t kvf_json_load_config(const char *path, size_t max_bytes, char *file, size_t cap,
                                  cJSON **root_p)
{
    struct stat st;
    kvf_status_t status;

    if ((stat(path, &st) == 0) && S_ISDIR(st.st_mode)) {
        snprintf(file, cap, "%s/config.json", path);
    } else {
        snprintf(file, cap, "%s", path);
    }
    status = kvf_json_load(file, max_bytes, root_p);
    return ((status == KVF_ERR_NOT_FOUND) || (status == KVF_ERR_OUT_OF_RANGE)) ? KVF_ERR_IO :
           status;
}
