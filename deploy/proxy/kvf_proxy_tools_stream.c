/* Tool calls streamed as they are generated (kvf_proxy_tools_stream.h). */
#define _GNU_SOURCE   /* memmem */
#include "kvf_proxy_tools_stream.h"
#include "kvf_array.h"
#include "kvf_log.h"

#include <stdlib.h>
#include <string.h>

/* ---- a growing string --------------------------------------------------------------- */

typedef struct {
    char  *s;
    size_t len, cap;
    bool   oom;
} kvf_ts_buf_t;

/* Appends to @a b; a NULL @a b discards (a value read only to be skipped). */
static void kvf_ts_put(kvf_ts_buf_t *b, const char *s, size_t n)
{
    if ((b == NULL) || b->oom) {
        return;
    }
    if (KVF_ARRAY_GROW(b->s, b->cap, b->len + n + 1, 64) != KVF_OK) {
        b->oom = true;
        return;
    }
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = '\0';
}

/* One byte of a decoded string as json.dumps writes it. */
static void kvf_ts_char(kvf_ts_buf_t *b, unsigned char c)
{
    char esc[8];
    int n = kvf_proxy_json_char_py(c, esc);

    kvf_ts_put(b, esc, (size_t)n);
}

/* ---- a JSON reader that stops where its input ends ----------------------------------- */

typedef enum {
    KVF_TS_DONE = 0,   /* the value is whole */
    KVF_TS_MORE,       /* the input ended inside it */
    KVF_TS_BAD,        /* not JSON (as cJSON reads it) */
} kvf_ts_st_t;

typedef struct {
    const char *s;
    size_t      n, i;
} kvf_ts_rd_t;

/* Deeper than this is read as bad here (the final parse still decides). */
#define KVF_TS_MAX_DEPTH 128

static void kvf_ts_ws(kvf_ts_rd_t *r)
{
    while ((r->i < r->n) && ((r->s[r->i] == ' ') || (r->s[r->i] == '\n') ||
                             (r->s[r->i] == '\t') || (r->s[r->i] == '\r'))) {
        ++r->i;
    }
}

static int kvf_ts_hex4(const char *s, unsigned *v)
{
    *v = 0;
    for (int k = 0; k < 4; ++k) {
        char c = s[k];
        unsigned d = ((c >= '0') && (c <= '9')) ? (unsigned)(c - '0') :
                     ((c >= 'a') && (c <= 'f')) ? (unsigned)(c - 'a' + 10) :
                     ((c >= 'A') && (c <= 'F')) ? (unsigned)(c - 'A' + 10) : 16u;
        if (d > 15) {
            return -1;
        }
        *v = (*v << 4) | d;
    }
    return 0;
}

/* A \uXXXX escape (a surrogate pair: both) at r->s[r->i] into @a b as UTF-8. */
static kvf_ts_st_t kvf_ts_unicode(kvf_ts_rd_t *r, kvf_ts_buf_t *b)
{
    unsigned cp, lo;
    unsigned char u[4];
    int n;

    if (r->i + 6 > r->n) {
        return KVF_TS_MORE;
    }
    if (kvf_ts_hex4(r->s + r->i + 2, &cp) != 0) {
        return KVF_TS_BAD;
    }
    if ((cp >= 0xDC00) && (cp <= 0xDFFF)) {
        return KVF_TS_BAD;   /* a lone low surrogate: cJSON refuses it */
    }
    if ((cp >= 0xD800) && (cp <= 0xDBFF)) {
        if (r->i + 12 > r->n) {
            return KVF_TS_MORE;
        }
        if ((r->s[r->i + 6] != '\\') || (r->s[r->i + 7] != 'u') ||
            (kvf_ts_hex4(r->s + r->i + 8, &lo) != 0) || (lo < 0xDC00) || (lo > 0xDFFF)) {
            return KVF_TS_BAD;
        }
        cp = 0x10000 + (((cp & 0x3FF) << 10) | (lo & 0x3FF));
        r->i += 6;
    }
    if (cp == 0) {
        return KVF_TS_BAD;   /* cJSON's string would end there */
    }
    if (cp < 0x80) {
        u[0] = (unsigned char)cp;
        n = 1;
    } else if (cp < 0x800) {
        u[0] = (unsigned char)(0xC0 | (cp >> 6));
        u[1] = (unsigned char)(0x80 | (cp & 0x3F));
        n = 2;
    } else if (cp < 0x10000) {
        u[0] = (unsigned char)(0xE0 | (cp >> 12));
        u[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        u[2] = (unsigned char)(0x80 | (cp & 0x3F));
        n = 3;
    } else {
        u[0] = (unsigned char)(0xF0 | (cp >> 18));
        u[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
        u[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        u[3] = (unsigned char)(0x80 | (cp & 0x3F));
        n = 4;
    }
    for (int k = 0; k < n; ++k) {
        kvf_ts_char(b, u[k]);
    }
    r->i += 6;
    return KVF_TS_DONE;
}

/* A string at r->s[r->i] ('"'), written as json.dumps writes it, character by character. */
static kvf_ts_st_t kvf_ts_string(kvf_ts_rd_t *r, kvf_ts_buf_t *b)
{
    static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";

    kvf_ts_put(b, "\"", 1);
    ++r->i;
    while (r->i < r->n) {
        unsigned char c = (unsigned char)r->s[r->i];
        if (c == '"') {
            kvf_ts_put(b, "\"", 1);
            ++r->i;
            return KVF_TS_DONE;
        }
        if (c == '\\') {
            const char *e;
            kvf_ts_st_t st;
            if (r->i + 1 >= r->n) {
                return KVF_TS_MORE;
            }
            if (r->s[r->i + 1] == 'u') {
                st = kvf_ts_unicode(r, b);
                if (st != KVF_TS_DONE) {
                    return st;
                }
                continue;
            }
            e = (r->s[r->i + 1] != '\0') ? strchr(from, r->s[r->i + 1]) : NULL;
            if (e == NULL) {
                return KVF_TS_BAD;
            }
            kvf_ts_char(b, (unsigned char)to[e - from]);
            r->i += 2;
            continue;
        }
        if (c >= 0x80) {   /* a UTF-8 sequence goes out whole */
            size_t l = (c >= 0xF0) ? 4 : (c >= 0xE0) ? 3 : (c >= 0xC0) ? 2 : 1;
            if (r->i + l > r->n) {
                return KVF_TS_MORE;
            }
            kvf_ts_put(b, r->s + r->i, l);
            r->i += l;
            continue;
        }
        kvf_ts_char(b, c);
        ++r->i;
    }
    return KVF_TS_MORE;
}

/* A number: written once a character after it shows it whole. */
static kvf_ts_st_t kvf_ts_number(kvf_ts_rd_t *r, kvf_ts_buf_t *b)
{
    size_t j = r->i;
    char tok[64], out[40], *end;

    while ((j < r->n) && (r->s[j] != '\0') && (strchr("0123456789+-.eE", r->s[j]) != NULL)) {
        ++j;
    }
    if (j == r->n) {
        return KVF_TS_MORE;
    }
    if (j - r->i >= sizeof(tok)) {
        return KVF_TS_BAD;
    }
    memcpy(tok, r->s + r->i, j - r->i);
    tok[j - r->i] = '\0';
    kvf_proxy_json_num_py(strtod(tok, &end), out, sizeof(out));
    if (*end != '\0') {
        return KVF_TS_BAD;
    }
    kvf_ts_put(b, out, strlen(out));
    r->i = j;
    return KVF_TS_DONE;
}

static kvf_ts_st_t kvf_ts_value(kvf_ts_rd_t *r, kvf_ts_buf_t *b, int depth);

/* An object or array at r->s[r->i], its separators as json.dumps writes them. */
static kvf_ts_st_t kvf_ts_container(kvf_ts_rd_t *r, kvf_ts_buf_t *b, int depth)
{
    bool obj = (r->s[r->i] == '{');
    char close = obj ? '}' : ']';
    kvf_ts_st_t st;

    if (depth > KVF_TS_MAX_DEPTH) {
        return KVF_TS_BAD;
    }
    kvf_ts_put(b, obj ? "{" : "[", 1);
    ++r->i;
    kvf_ts_ws(r);
    if (r->i >= r->n) {
        return KVF_TS_MORE;
    }
    if (r->s[r->i] == close) {
        kvf_ts_put(b, &close, 1);
        ++r->i;
        return KVF_TS_DONE;
    }
    for (;;) {
        if (obj) {
            kvf_ts_ws(r);
            if (r->i >= r->n) {
                return KVF_TS_MORE;
            }
            if (r->s[r->i] != '"') {
                return KVF_TS_BAD;
            }
            st = kvf_ts_string(r, b);
            if (st != KVF_TS_DONE) {
                return st;
            }
            kvf_ts_ws(r);
            if (r->i >= r->n) {
                return KVF_TS_MORE;
            }
            if (r->s[r->i] != ':') {
                return KVF_TS_BAD;
            }
            kvf_ts_put(b, ": ", 2);
            ++r->i;
        }
        st = kvf_ts_value(r, b, depth);
        if (st != KVF_TS_DONE) {
            return st;
        }
        kvf_ts_ws(r);
        if (r->i >= r->n) {
            return KVF_TS_MORE;
        }
        if (r->s[r->i] == ',') {
            kvf_ts_put(b, ", ", 2);
            ++r->i;
            continue;
        }
        if (r->s[r->i] != close) {
            return KVF_TS_BAD;
        }
        kvf_ts_put(b, &close, 1);
        ++r->i;
        return KVF_TS_DONE;
    }
}

static kvf_ts_st_t kvf_ts_value(kvf_ts_rd_t *r, kvf_ts_buf_t *b, int depth)
{
    static const char *const lit[] = {"true", "false", "null"};
    char c;

    kvf_ts_ws(r);
    if (r->i >= r->n) {
        return KVF_TS_MORE;
    }
    c = r->s[r->i];
    if ((c == '{') || (c == '[')) {
        return kvf_ts_container(r, b, depth + 1);
    }
    if (c == '"') {
        return kvf_ts_string(r, b);
    }
    if ((c == '-') || ((c >= '0') && (c <= '9'))) {
        return kvf_ts_number(r, b);
    }
    for (size_t k = 0; k < sizeof(lit) / sizeof(lit[0]); ++k) {
        size_t l = strlen(lit[k]), have = (r->n - r->i < l) ? r->n - r->i : l;
        if (memcmp(r->s + r->i, lit[k], have) == 0) {
            if (have < l) {
                return KVF_TS_MORE;
            }
            kvf_ts_put(b, lit[k], l);
            r->i += l;
            return KVF_TS_DONE;
        }
    }
    return KVF_TS_BAD;
}

/* ---- the calls in a running output ---------------------------------------------------- */

typedef struct {
    char        *name;   /* whole, decoded (malloc'd); NULL: not yet */
    kvf_ts_buf_t args;   /* the arguments as far as they are known */
    bool         name_seen, args_seen;
} kvf_ts_call_t;

typedef struct {
    kvf_ts_call_t *calls;
    int            num, cap;
    bool           oom;
} kvf_ts_scan_t;

static kvf_ts_call_t *kvf_ts_new_call(kvf_ts_scan_t *sc)
{
    if (KVF_ARRAY_GROW(sc->calls, sc->cap, sc->num + 1, 4) != KVF_OK) {
        sc->oom = true;
        return NULL;
    }
    memset(&sc->calls[sc->num], 0, sizeof(sc->calls[0]));
    return &sc->calls[sc->num++];
}

/* A call's value of @a key: its name (a whole string), its arguments (the first
 * "arguments" or "parameters", as kvf_proxy_tools_parse_output takes them), or skipped. */
static kvf_ts_st_t kvf_ts_member(kvf_ts_rd_t *r, kvf_ts_call_t *c, const char *key)
{
    kvf_ts_buf_t nm = {0};
    kvf_ts_st_t st;

    if ((strcmp(key, "\"name\"") == 0) && !c->name_seen) {
        c->name_seen = true;
        kvf_ts_ws(r);
        if ((r->i >= r->n) || (r->s[r->i] != '"')) {
            return kvf_ts_value(r, NULL, 1);   /* not a string: never a call */
        }
        st = kvf_ts_string(r, &nm);
        if ((st == KVF_TS_DONE) && !nm.oom) {
            cJSON *v = cJSON_Parse(nm.s);   /* the written form back to its text */
            c->name = cJSON_IsString(v) ? strdup(v->valuestring) : NULL;
            cJSON_Delete(v);
        }
        free(nm.s);
        return st;
    }
    if (((strcmp(key, "\"arguments\"") == 0) || (strcmp(key, "\"parameters\"") == 0)) &&
        !c->args_seen) {
        c->args_seen = true;
        return kvf_ts_value(r, &c->args, 0);
    }
    return kvf_ts_value(r, NULL, 0);
}

/* A call object {"name": ..., "arguments": ...} at r->s[r->i] (after white space). */
static kvf_ts_st_t kvf_ts_call(kvf_ts_rd_t *r, kvf_ts_scan_t *sc)
{
    kvf_ts_call_t *c;

    kvf_ts_ws(r);
    if (r->i >= r->n) {
        return KVF_TS_MORE;
    }
    if (r->s[r->i] != '{') {
        return KVF_TS_BAD;
    }
    c = kvf_ts_new_call(sc);
    if (c == NULL) {
        return KVF_TS_BAD;
    }
    ++r->i;
    kvf_ts_ws(r);
    if ((r->i < r->n) && (r->s[r->i] == '}')) {
        ++r->i;
        return KVF_TS_DONE;   /* {}: no name, never a call */
    }
    for (;;) {
        kvf_ts_buf_t key = {0};
        kvf_ts_st_t st;
        kvf_ts_ws(r);
        if (r->i >= r->n) {
            return KVF_TS_MORE;
        }
        if (r->s[r->i] != '"') {
            return KVF_TS_BAD;
        }
        st = kvf_ts_string(r, &key);
        if ((st == KVF_TS_DONE) && !key.oom) {
            kvf_ts_ws(r);
            st = (r->i >= r->n) ? KVF_TS_MORE : (r->s[r->i] != ':') ? KVF_TS_BAD : KVF_TS_DONE;
            if (st == KVF_TS_DONE) {
                ++r->i;
                st = kvf_ts_member(r, c, key.s);
            }
        }
        free(key.s);
        if (st != KVF_TS_DONE) {
            return st;
        }
        kvf_ts_ws(r);
        if (r->i >= r->n) {
            return KVF_TS_MORE;
        }
        if (r->s[r->i] == '}') {
            ++r->i;
            return KVF_TS_DONE;
        }
        if (r->s[r->i] != ',') {
            return KVF_TS_BAD;
        }
        ++r->i;
    }
}

static const char *kvf_ts_find(const char *t, size_t from, size_t n, const char *m)
{
    return (from < n) ? memmem(t + from, n - from, m, strlen(m)) : NULL;
}

/* hermes: <tool_call>{...}</tool_call> blocks; the last may still be open. */
static void kvf_ts_hermes(const char *t, size_t n, bool parallel, kvf_ts_scan_t *sc)
{
    const char *open = kvf_proxy_tool_hermes_open, *close = kvf_proxy_tool_hermes_close;
    const char *at = kvf_ts_find(t, 0, n, open);

    while (at != NULL) {
        size_t body = (size_t)(at - t) + strlen(open);
        const char *end = kvf_ts_find(t, body, n, close);
        kvf_ts_rd_t r = {t + body, (end != NULL) ? (size_t)(end - t) - body : n - body, 0};
        if ((kvf_ts_call(&r, sc) != KVF_TS_DONE) || !parallel || (end == NULL)) {
            return;
        }
        at = kvf_ts_find(t, (size_t)(end - t) + strlen(close), n, open);
    }
}

/* llama3_json: the whole output {...}; {...}, after an optional <|python_tag|>. */
static void kvf_ts_llama3(const char *t, size_t n, bool parallel, kvf_ts_scan_t *sc)
{
    const char *tag = kvf_proxy_tool_llama_tag;
    kvf_ts_rd_t r = {t, n, 0};

    kvf_ts_ws(&r);
    if ((n - r.i >= strlen(tag)) && (memcmp(t + r.i, tag, strlen(tag)) == 0)) {
        r.i += strlen(tag);
    } else if ((r.i >= n) || (t[r.i] != '{')) {
        return;
    }
    while (kvf_ts_call(&r, sc) == KVF_TS_DONE) {
        kvf_ts_ws(&r);
        if (!parallel || (r.i >= r.n) || (t[r.i] != ';')) {
            return;
        }
        ++r.i;
    }
}

/* mistral: [TOOL_CALLS] then a list of calls, or one call. */
static void kvf_ts_mistral(const char *t, size_t n, bool parallel, kvf_ts_scan_t *sc)
{
    const char *tag = kvf_proxy_tool_mistral_tag, *at = kvf_ts_find(t, 0, n, tag);
    kvf_ts_rd_t r;

    if (at == NULL) {
        return;
    }
    r = (kvf_ts_rd_t){t, n, (size_t)(at - t) + strlen(tag)};
    kvf_ts_ws(&r);
    if ((r.i >= n) || (t[r.i] != '[')) {
        (void)kvf_ts_call(&r, sc);
        return;
    }
    ++r.i;
    while (kvf_ts_call(&r, sc) == KVF_TS_DONE) {
        kvf_ts_ws(&r);
        if (!parallel || (r.i >= r.n) || (t[r.i] != ',')) {
            return;
        }
        ++r.i;
    }
}

static void kvf_ts_scan_free(kvf_ts_scan_t *sc)
{
    for (int i = 0; i < sc->num; ++i) {
        free(sc->calls[i].name);
        free(sc->calls[i].args.s);
    }
    free(sc->calls);
}

/* ---- the deltas ------------------------------------------------------------------------- */

/* A delta {"index", "id" and "type" (with @a id), "function": {"name", "arguments"} (those
 * given)} appended to @a list; NULL: no memory. */
static cJSON *kvf_ts_delta(cJSON *list, int index, const char *id, const char *name,
                           const char *args)
{
    cJSON *d = cJSON_CreateObject(), *f;

    if ((d == NULL) || (list == NULL)) {
        cJSON_Delete(d);
        return NULL;
    }
    cJSON_AddItemToArray(list, d);
    cJSON_AddNumberToObject(d, "index", index);
    if (id != NULL) {
        cJSON_AddStringToObject(d, "id", id);
        cJSON_AddStringToObject(d, "type", "function");
    }
    f = cJSON_AddObjectToObject(d, "function");
    if (f == NULL) {
        return NULL;
    }
    if (name != NULL) {
        cJSON_AddStringToObject(f, "name", name);
    }
    if (args != NULL) {
        cJSON_AddStringToObject(f, "arguments", args);
    }
    return d;
}

static kvf_proxy_tool_sent_t *kvf_ts_sent_new(kvf_proxy_tool_stream_t *ts)
{
    if (KVF_ARRAY_GROW(ts->calls, ts->cap, ts->num + 1, 4) != KVF_OK) {
        return NULL;
    }
    memset(&ts->calls[ts->num], 0, sizeof(ts->calls[0]));
    return &ts->calls[ts->num];
}

/* What call @a i of the scan has that was not sent: a delta into @a list (recorded). */
static kvf_status_t kvf_ts_news(kvf_proxy_tool_stream_t *ts, kvf_proxy_tool_parser_t parser,
                                const kvf_ts_call_t *c, int i, cJSON *list, bool *sent_p)
{
    kvf_proxy_tool_sent_t *s;
    char *grown;

    *sent_p = false;
    if (i == ts->num) {   /* its first delta, once the name is whole */
        if (c->name == NULL) {
            return KVF_OK;
        }
        s = kvf_ts_sent_new(ts);
        if ((s == NULL) || ((s->name = strdup(c->name)) == NULL)) {
            return KVF_ERR_NO_MEMORY;
        }
        kvf_proxy_tool_id(parser, s->id, sizeof(s->id));
        ts->num++;
        *sent_p = true;
        return (kvf_ts_delta(list, i, s->id, s->name, NULL) != NULL) ? KVF_OK :
                                                                     KVF_ERR_NO_MEMORY;
    }
    s = &ts->calls[i];
    if ((c->args.len <= s->args_len) || c->args.oom) {
        return KVF_OK;
    }
    if ((s->args_len > 0) && (memcmp(s->args, c->args.s, s->args_len) != 0)) {
        return KVF_OK;   /* cannot happen: what was read is only ever extended */
    }
    grown = strdup(c->args.s);
    if ((grown == NULL) || (kvf_ts_delta(list, i, NULL, NULL, c->args.s + s->args_len) ==
                            NULL)) {
        free(grown);
        return KVF_ERR_NO_MEMORY;
    }
    free(s->args);
    s->args = grown;
    s->args_len = c->args.len;
    *sent_p = true;
    return KVF_OK;
}

kvf_status_t kvf_proxy_tools_stream_next(kvf_proxy_tool_stream_t *ts,
                                         kvf_proxy_tool_parser_t parser, bool parallel,
                                         const char *text, size_t len, cJSON **delta_p)
{
    kvf_ts_scan_t sc = {0};
    cJSON *list = cJSON_CreateArray();
    kvf_status_t st = (list != NULL) ? KVF_OK : KVF_ERR_NO_MEMORY;
    bool sent = false;

    *delta_p = NULL;
    switch (parser) {
    case KVF_TOOL_PARSER_HERMES:      kvf_ts_hermes(text, len, parallel, &sc); break;
    case KVF_TOOL_PARSER_LLAMA3_JSON: kvf_ts_llama3(text, len, parallel, &sc); break;
    case KVF_TOOL_PARSER_MISTRAL:     kvf_ts_mistral(text, len, parallel, &sc); break;
    default:                          break;
    }
    st = sc.oom ? KVF_ERR_NO_MEMORY : st;
    /* calls in order: a call's arguments are whole before the next call is read */
    for (int i = 0; (st == KVF_OK) && !sent && (i < sc.num) && (i <= ts->num); ++i) {
        st = kvf_ts_news(ts, parser, &sc.calls[i], i, list, &sent);
    }
    kvf_ts_scan_free(&sc);
    if ((st != KVF_OK) || !sent) {
        cJSON_Delete(list);
        return st;
    }
    *delta_p = list;
    return KVF_OK;
}

kvf_status_t kvf_proxy_tools_stream_finish(kvf_proxy_tool_stream_t *ts, const cJSON *calls,
                                           cJSON **deltas_p)
{
    cJSON *list;
    const cJSON *c;
    int i = 0;

    *deltas_p = NULL;
    if (calls == NULL) {
        return KVF_OK;
    }
    list = cJSON_CreateArray();
    cJSON_ArrayForEach(c, calls) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(c, "function");
        const char *name = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(f, "name"));
        const char *args = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(f,
                                                                                 "arguments"));
        const char *id = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(c, "id"));
        bool ok = true;
        if ((name == NULL) || (args == NULL) || (id == NULL)) {
            continue;
        }
        if (i >= ts->num) {
            ok = kvf_ts_delta(list, i, id, name, args) != NULL;
        } else if ((strcmp(name, ts->calls[i].name) != 0) ||
                   (strncmp(args, (ts->calls[i].args != NULL) ? ts->calls[i].args : "",
                            ts->calls[i].args_len) != 0)) {
            kvf_warn("tool call %d: the streamed name or arguments differ from the output's "
                     "parse (%s %s, sent %s %s)", i, name, args, ts->calls[i].name,
                     (ts->calls[i].args != NULL) ? ts->calls[i].args : "");
        } else if (args[ts->calls[i].args_len] != '\0') {
            ok = kvf_ts_delta(list, i, NULL, NULL, args + ts->calls[i].args_len) != NULL;
        }
        if (!ok) {
            cJSON_Delete(list);
            return KVF_ERR_NO_MEMORY;
        }
        ++i;
    }
    if ((list != NULL) && (list->child == NULL)) {
        cJSON_Delete(list);
        list = NULL;
    }
    *deltas_p = list;
    return KVF_OK;
}

void kvf_proxy_tools_stream_free(kvf_proxy_tool_stream_t *ts)
{
    for (int i = 0; i < ts->num; ++i) {
        free(ts->calls[i].name);
        free(ts->calls[i].args);
    }
    free(ts->calls);
    memset(ts, 0, sizeof(*ts));
}
