/* Tool calling in chat: the request's tools, the messages' calls, the output's parsers
 * (kvf_proxy_tools.h). */
#include "kvf_proxy_tools.h"
#include "kvf_proxy_refuse.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

static const struct {
    const char             *name;
    kvf_proxy_tool_parser_t parser;
} kvf_tool_parsers[] = {
    {"hermes", KVF_TOOL_PARSER_HERMES},
    {"llama3_json", KVF_TOOL_PARSER_LLAMA3_JSON},
    {"mistral", KVF_TOOL_PARSER_MISTRAL},
};

bool kvf_proxy_tool_parser_from_name(const char *name, kvf_proxy_tool_parser_t *out)
{
    for (size_t i = 0; i < sizeof(kvf_tool_parsers) / sizeof(kvf_tool_parsers[0]); ++i) {
        if (strcmp(name, kvf_tool_parsers[i].name) == 0) {
            *out = kvf_tool_parsers[i].parser;
            return true;
        }
    }
    return false;
}

/* ---- Python's json.dumps ----------------------------------------------------------- */

typedef struct {
    char  *s;
    size_t len, cap;
    bool   oom;
} kvf_sbuf_t;

static void kvf_sb_put(kvf_sbuf_t *b, const char *s, size_t n)
{
    if (b->oom) {
        return;
    }
    if (b->len + n + 1 > b->cap) {
        size_t cap = (b->cap > 0) ? 2 * b->cap : 64;
        char *g;
        while (cap < b->len + n + 1) {
            cap *= 2;
        }
        g = realloc(b->s, cap);
        if (g == NULL) {
            b->oom = true;
            return;
        }
        b->s = g;
        b->cap = cap;
    }
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = '\0';
}

int kvf_proxy_json_char_py(unsigned char c, char *out)
{
    static const char from[] = "\"\\\n\r\t\b\f", to[] = "\"\\nrtbf";
    const char *e = (c != '\0') ? strchr(from, c) : NULL;

    if (e != NULL) {
        out[0] = '\\';
        out[1] = to[e - from];
        return 2;
    }
    if (c < 0x20) {
        snprintf(out, 8, "\\u%04x", c);
        return 6;
    }
    out[0] = (char)c;   /* ensure_ascii=False: UTF-8 as it is */
    return 1;
}

static void kvf_sb_str(kvf_sbuf_t *b, const char *s)
{
    char esc[8];

    kvf_sb_put(b, "\"", 1);
    for (; *s != '\0'; ++s) {
        kvf_sb_put(b, esc, (size_t)kvf_proxy_json_char_py((unsigned char)*s, esc));
    }
    kvf_sb_put(b, "\"", 1);
}

/* cJSON keeps no integer/float distinction: integral values print as integers; a float by
 * its shortest repr, as Python prints it. */
void kvf_proxy_json_num_py(double v, char *t, size_t cap)
{
    if (!isfinite(v)) {
        snprintf(t, cap, "%s", (v != v) ? "NaN" : (v > 0) ? "Infinity" : "-Infinity");
        return;
    }
    if ((floor(v) == v) && (fabs(v) < 9007199254740992.0)) {
        snprintf(t, cap, "%.0f", v);
        return;
    }
    for (int p = 1; p <= 17; ++p) {
        snprintf(t, cap, "%.*g", p, v);
        if (strtod(t, NULL) == v) {
            break;
        }
    }
    if ((strchr(t, '.') == NULL) && (strchr(t, 'e') == NULL) && (strchr(t, 'n') == NULL)) {
        strncat(t, ".0", cap - strlen(t) - 1);   /* Python writes a float with a point */
    }
}

static void kvf_sb_value(kvf_sbuf_t *b, const cJSON *v)
{
    const cJSON *c;
    bool first = true;

    if (cJSON_IsObject(v) || cJSON_IsArray(v)) {
        bool obj = cJSON_IsObject(v);
        kvf_sb_put(b, obj ? "{" : "[", 1);
        cJSON_ArrayForEach(c, v) {
            if (!first) {
                kvf_sb_put(b, ", ", 2);
            }
            first = false;
            if (obj) {
                kvf_sb_str(b, c->string);
                kvf_sb_put(b, ": ", 2);
            }
            kvf_sb_value(b, c);
        }
        kvf_sb_put(b, obj ? "}" : "]", 1);
    } else if (cJSON_IsString(v)) {
        kvf_sb_str(b, v->valuestring);
    } else if (cJSON_IsNumber(v)) {
        char t[40];
        kvf_proxy_json_num_py(v->valuedouble, t, sizeof(t));
        kvf_sb_put(b, t, strlen(t));
    } else if (cJSON_IsBool(v)) {
        kvf_sb_put(b, cJSON_IsTrue(v) ? "true" : "false", cJSON_IsTrue(v) ? 4 : 5);
    } else {
        kvf_sb_put(b, "null", 4);
    }
}

char *kvf_proxy_json_dumps_py(const cJSON *v)
{
    kvf_sbuf_t b = {0};

    kvf_sb_value(&b, v);
    if (b.oom) {
        free(b.s);
        return NULL;
    }
    return b.s;
}

/* ---- the request --------------------------------------------------------------------- */

/* One tool, checked, as the template sees it: {"type", "function": {name, description,
 * parameters}} (absent ones null, as vLLM's model_dump gives them). */
static cJSON *kvf_tool_norm(const cJSON *t, int i, char *err, size_t cap, bool *bad)
{
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type");
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
    const cJSON *desc = cJSON_GetObjectItemCaseSensitive(fn, "description");
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
    cJSON *o, *f;

    *bad = true;
    if (!cJSON_IsObject(t) || ((type != NULL) && (!cJSON_IsString(type) ||
                                                  (strcmp(type->valuestring, "function") != 0))) ||
        !cJSON_IsObject(fn) || !cJSON_IsString(name) || (name->valuestring[0] == '\0') ||
        ((desc != NULL) && !cJSON_IsNull(desc) && !cJSON_IsString(desc)) ||
        ((params != NULL) && !cJSON_IsNull(params) && !cJSON_IsObject(params))) {
        snprintf(err, cap, "'tools'[%d] must be {\"type\": \"function\", \"function\": {\"name\":"
                 " a non-empty string, \"description\": a string, \"parameters\": an object}}",
                 i);
        return NULL;
    }
    *bad = false;
    o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", "function");
    f = cJSON_AddObjectToObject(o, "function");
    if (f == NULL) {
        cJSON_Delete(o);
        return NULL;
    }
    cJSON_AddStringToObject(f, "name", name->valuestring);
    cJSON_AddItemToObject(f, "description", (desc != NULL) ? cJSON_Duplicate(desc, true) :
                                                            cJSON_CreateNull());
    cJSON_AddItemToObject(f, "parameters", (params != NULL) ? cJSON_Duplicate(params, true) :
                                                             cJSON_CreateNull());
    return o;
}

static kvf_status_t kvf_tools_choice(const cJSON *choice, bool have_tools,
                                     kvf_proxy_tool_parser_t server_parser, bool auto_ok,
                                     kvf_proxy_tool_parser_t *parser_p, int *http_p,
                                     const char **param_p, char *err, size_t cap)
{
    const char *c = cJSON_IsString(choice) ? choice->valuestring : NULL;

    *parser_p = KVF_TOOL_PARSER_NONE;
    if ((choice != NULL) && !have_tools) {
        return kvf_proxy_invalid(http_p, param_p, "tool_choice", err, cap, "'tool_choice' needs "
                                 "'tools'");
    }
    if (!have_tools || ((c != NULL) && (strcmp(c, "none") == 0))) {
        return KVF_OK;
    }
    if ((choice == NULL) || ((c != NULL) && (strcmp(c, "auto") == 0))) {
        if (!auto_ok || (server_parser == KVF_TOOL_PARSER_NONE)) {
            return kvf_proxy_invalid(http_p, param_p, "tool_choice", err, cap, "\"auto\" tool "
                                     "choice (the default with 'tools') needs kvf-proxy started "
                                     "with --enable-auto-tool-choice and --tool-call-parser; or "
                                     "send \"tool_choice\": \"none\"");
        }
        *parser_p = server_parser;
        return KVF_OK;
    }
    if ((c != NULL) && (strcmp(c, "required") == 0)) {
        return kvf_proxy_invalid(http_p, param_p, "tool_choice", err, cap, "'tool_choice' "
                                 "\"required\" needs constrained decoding, which kvferry does not "
                                 "have; use \"auto\"");
    }
    if (cJSON_IsObject(choice)) {
        return kvf_proxy_invalid(http_p, param_p, "tool_choice", err, cap, "a named 'tool_choice' "
                                 "needs constrained decoding, which kvferry does not have; use "
                                 "\"auto\"");
    }
    return kvf_proxy_invalid(http_p, param_p, "tool_choice", err, cap, "'tool_choice' must be "
                             "\"none\", \"auto\", \"required\" or a named function");
}

kvf_status_t kvf_proxy_tools_parse_request(const cJSON *root, kvf_proxy_tool_parser_t server_parser,
                                           bool auto_ok, kvf_proxy_chat_args_t *args,
                                           kvf_proxy_tool_parser_t *parser_p, bool *parallel_p,
                                           int *http_p, const char **param_p, char *err,
                                           size_t cap)
{
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(root, "tools"), *t;
    const cJSON *choice = cJSON_GetObjectItemCaseSensitive(root, "tool_choice");
    const cJSON *par = cJSON_GetObjectItemCaseSensitive(root, "parallel_tool_calls");
    cJSON *list;
    kvf_status_t st;
    int i = 0;

    tools = cJSON_IsNull(tools) ? NULL : tools;
    choice = cJSON_IsNull(choice) ? NULL : choice;
    *parallel_p = true;
    if ((par != NULL) && !cJSON_IsNull(par)) {
        if (!cJSON_IsBool(par)) {
            return kvf_proxy_invalid(http_p, param_p, "parallel_tool_calls", err, cap,
                                     "'parallel_tool_calls' must be a boolean");
        }
        *parallel_p = cJSON_IsTrue(par);
    }
    if ((tools != NULL) && !cJSON_IsArray(tools)) {
        return kvf_proxy_invalid(http_p, param_p, "tools", err, cap, "'tools' must be a list");
    }
    tools = ((tools != NULL) && (tools->child != NULL)) ? tools : NULL;
    st = kvf_tools_choice(choice, tools != NULL, server_parser, auto_ok, parser_p, http_p,
                          param_p, err, cap);
    if ((st != KVF_OK) || (tools == NULL)) {
        return st;
    }
    list = cJSON_CreateArray();
    cJSON_ArrayForEach(t, tools) {
        bool bad;
        cJSON *n = kvf_tool_norm(t, i++, err, cap, &bad);
        if (n == NULL) {
            cJSON_Delete(list);
            if (bad) {
                return kvf_proxy_invalid(http_p, param_p, "tools", NULL, 0, "%s", "");
            }
            return KVF_ERR_NO_MEMORY;
        }
        cJSON_AddItemToArray(list, n);
    }
    st = (list != NULL) ? kvf_proxy_chat_args_set(args, "tools", list) : KVF_ERR_NO_MEMORY;
    cJSON_Delete(list);
    return st;
}

/* ---- messages -------------------------------------------------------------------------- */

kvf_status_t kvf_proxy_tools_message(const cJSON *m, const char *role, int i, cJSON *out,
                                     char *err, size_t cap)
{
    const cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls"), *c;
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(m, "tool_call_id");
    cJSON *list;
    int k = 0;

    if ((id != NULL) && !cJSON_IsNull(id)) {
        if ((strcmp(role, "tool") != 0) || !cJSON_IsString(id)) {
            return kvf_proxy_invalid(NULL, NULL, NULL, err, cap, "'messages'[%d].tool_call_id must "
                                     "be a string, in a tool message", i);
        }
        cJSON_AddStringToObject(out, "tool_call_id", id->valuestring);
    }
    if ((calls == NULL) || cJSON_IsNull(calls)) {
        return KVF_OK;
    }
    if ((strcmp(role, "assistant") != 0) || !cJSON_IsArray(calls)) {
        return kvf_proxy_invalid(NULL, NULL, NULL, err, cap, "'messages'[%d].tool_calls must be a "
                                 "list, in an assistant message", i);
    }
    list = cJSON_AddArrayToObject(out, "tool_calls");
    cJSON_ArrayForEach(c, calls) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
        const cJSON *cid = cJSON_GetObjectItemCaseSensitive(c, "id");
        cJSON *o, *f, *parsed;

        parsed = cJSON_IsString(args) ? cJSON_Parse(args->valuestring) : NULL;
        if (!cJSON_IsString(name) || (parsed == NULL) ||
            ((cid != NULL) && !cJSON_IsNull(cid) && !cJSON_IsString(cid))) {
            cJSON_Delete(parsed);
            return kvf_proxy_invalid(NULL, NULL, NULL, err, cap, "'messages'[%d].tool_calls[%d] "
                                     "must be {\"id\", \"type\": \"function\", \"function\": "
                                     "{\"name\", \"arguments\": a JSON string}}", i, k);
        }
        o = cJSON_CreateObject();
        cJSON_AddItemToArray(list, o);
        if (cJSON_IsString(cid)) {
            cJSON_AddStringToObject(o, "id", cid->valuestring);
        }
        cJSON_AddStringToObject(o, "type", "function");
        f = cJSON_AddObjectToObject(o, "function");
        cJSON_AddStringToObject(f, "name", name->valuestring);
        cJSON_AddItemToObject(f, "arguments", parsed);   /* as vLLM: an object for templates */
        ++k;
    }
    return KVF_OK;
}

/* ---- the output ---------------------------------------------------------------------- */

void kvf_proxy_tool_id(kvf_proxy_tool_parser_t parser, char *id, size_t cap)
{
    static const char an[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    unsigned char r[16] = {0};

    if (getrandom(r, sizeof(r), 0) != (ssize_t)sizeof(r)) {
        for (size_t i = 0; i < sizeof(r); ++i) {
            r[i] = (unsigned char)rand();
        }
    }
    if (parser == KVF_TOOL_PARSER_MISTRAL) {
        for (int i = 0; i < 9; ++i) {
            id[i] = an[r[i] % (sizeof(an) - 1)];
        }
        id[9] = '\0';
        return;
    }
    snprintf(id, cap, "chatcmpl-tool-");
    for (size_t i = 0; i < sizeof(r); ++i) {
        snprintf(id + 14 + 2 * i, cap - 14 - 2 * i, "%02x", r[i]);
    }
}

/* One call {id, type, function {name, arguments}} from a parsed {"name", args} object;
 * false when it is not one. */
static bool kvf_tool_call_add(kvf_proxy_tool_parser_t parser, cJSON *calls, const cJSON *obj)
{
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(obj, "name"), *args = NULL, *k;
    const cJSON *members = cJSON_IsObject(obj) ? obj : NULL;
    cJSON *o, *f;
    char id[48], *text;

    /* the first of "arguments" and "parameters" (Llama 3's key) in the text: what a stream
     * began to send (kvf_proxy_tools_stream.h) before a later one could show up */
    cJSON_ArrayForEach(k, members) {
        if ((args == NULL) && (k->string != NULL) &&
            ((strcmp(k->string, "arguments") == 0) || (strcmp(k->string, "parameters") == 0))) {
            args = k;
        }
    }
    if (!cJSON_IsObject(obj) || !cJSON_IsString(name) || (args == NULL)) {
        return false;
    }
    text = kvf_proxy_json_dumps_py(args);
    o = cJSON_CreateObject();
    f = cJSON_AddObjectToObject(o, "function");
    if ((text == NULL) || (f == NULL)) {
        free(text);
        cJSON_Delete(o);
        return false;
    }
    kvf_proxy_tool_id(parser, id, sizeof(id));
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "type", "function");
    cJSON_AddStringToObject(f, "name", name->valuestring);
    cJSON_AddStringToObject(f, "arguments", text);
    free(text);
    cJSON_AddItemToArray(calls, o);
    return true;
}

const char kvf_proxy_tool_hermes_open[] = "<tool_call>";
const char kvf_proxy_tool_hermes_close[] = "</tool_call>";
const char kvf_proxy_tool_mistral_tag[] = "[TOOL_CALLS]";
const char kvf_proxy_tool_llama_tag[] = "<|python_tag|>";

/* hermes: every <tool_call>...</tool_call> block (the last may be unterminated). */
static bool kvf_parse_hermes(char *t, cJSON *calls, size_t *content_end)
{
    char *at = strstr(t, kvf_proxy_tool_hermes_open);

    if (at == NULL) {
        return false;
    }
    *content_end = (size_t)(at - t);
    while (at != NULL) {
        char *body = at + strlen(kvf_proxy_tool_hermes_open), *end = strstr(body, kvf_proxy_tool_hermes_close);
        char *next = (end != NULL) ? end + strlen(kvf_proxy_tool_hermes_close) : NULL;
        cJSON *obj;
        bool ok;
        if (end != NULL) {
            *end = '\0';
        }
        obj = cJSON_Parse(body);
        ok = kvf_tool_call_add(KVF_TOOL_PARSER_HERMES, calls, obj);
        cJSON_Delete(obj);
        if (!ok) {
            return false;
        }
        at = (next != NULL) ? strstr(next, kvf_proxy_tool_hermes_open) : NULL;
    }
    return true;
}

/* llama3_json: the whole output {...}; {...} (after an optional <|python_tag|>). */
static bool kvf_parse_llama3(char *t, cJSON *calls, size_t *content_end)
{
    const char *p = t;

    while ((*p == ' ') || (*p == '\n') || (*p == '\t') || (*p == '\r')) {
        ++p;
    }
    if (strncmp(p, kvf_proxy_tool_llama_tag, strlen(kvf_proxy_tool_llama_tag)) == 0) {
        p += strlen(kvf_proxy_tool_llama_tag);
    } else if (*p != '{') {
        return false;
    }
    *content_end = 0;
    for (;;) {
        const char *end = NULL;
        cJSON *obj = cJSON_ParseWithOpts(p, &end, false);
        bool ok = kvf_tool_call_add(KVF_TOOL_PARSER_LLAMA3_JSON, calls, obj);
        cJSON_Delete(obj);
        if (!ok) {
            return false;
        }
        p = end;
        while ((*p == ' ') || (*p == '\n') || (*p == '\t') || (*p == '\r')) {
            ++p;
        }
        if (*p == '\0') {
            return true;
        }
        if (*p != ';') {
            return false;
        }
        ++p;
    }
}

/* mistral: [TOOL_CALLS] then a JSON list of calls (or one call). */
static bool kvf_parse_mistral(char *t, cJSON *calls, size_t *content_end)
{
    char *at = strstr(t, kvf_proxy_tool_mistral_tag);
    cJSON *v, *it;
    bool ok = true;

    if (at == NULL) {
        return false;
    }
    *content_end = (size_t)(at - t);
    v = cJSON_Parse(at + strlen(kvf_proxy_tool_mistral_tag));
    if (cJSON_IsObject(v)) {
        ok = kvf_tool_call_add(KVF_TOOL_PARSER_MISTRAL, calls, v);
    } else if (cJSON_IsArray(v) && (v->child != NULL)) {
        cJSON_ArrayForEach(it, v) {
            ok = ok && kvf_tool_call_add(KVF_TOOL_PARSER_MISTRAL, calls, it);
        }
    } else {
        ok = false;
    }
    cJSON_Delete(v);
    return ok;
}

kvf_status_t kvf_proxy_tools_parse_output(kvf_proxy_tool_parser_t parser, bool parallel,
                                          const char *text, size_t len, cJSON **calls_p,
                                          size_t *content_end_p)
{
    char *t = strndup(text, len);
    cJSON *calls = cJSON_CreateArray();
    bool ok = false;

    *calls_p = NULL;
    if ((t == NULL) || (calls == NULL)) {
        free(t);
        cJSON_Delete(calls);
        return KVF_ERR_NO_MEMORY;
    }
    switch (parser) {
    case KVF_TOOL_PARSER_HERMES:      ok = kvf_parse_hermes(t, calls, content_end_p); break;
    case KVF_TOOL_PARSER_LLAMA3_JSON: ok = kvf_parse_llama3(t, calls, content_end_p); break;
    case KVF_TOOL_PARSER_MISTRAL:     ok = kvf_parse_mistral(t, calls, content_end_p); break;
    default:                          break;
    }
    free(t);
    if (!ok || (calls->child == NULL)) {   /* malformed: the whole text is content */
        cJSON_Delete(calls);
        return KVF_OK;
    }
    while (!parallel && (cJSON_GetArraySize(calls) > 1)) {
        cJSON_DeleteItemFromArray(calls, cJSON_GetArraySize(calls) - 1);
    }
    *calls_p = calls;
    return KVF_OK;
}

/* The longest tail of text[0, len) that begins @a marker, or 0. */
static size_t kvf_tools_tail(const char *text, size_t len, const char *marker)
{
    size_t m = strlen(marker);

    for (size_t k = (m - 1 < len) ? m - 1 : len; k > 0; --k) {
        if (memcmp(text + len - k, marker, k) == 0) {
            return k;
        }
    }
    return 0;
}

size_t kvf_proxy_tools_ready(kvf_proxy_tool_parser_t parser, const char *text, size_t len)
{
    const char *marker = (parser == KVF_TOOL_PARSER_HERMES) ? kvf_proxy_tool_hermes_open :
                         (parser == KVF_TOOL_PARSER_MISTRAL) ? kvf_proxy_tool_mistral_tag : NULL;
    const char *at;
    size_t lead = 0;

    if (parser == KVF_TOOL_PARSER_NONE) {
        return len;
    }
    if (parser == KVF_TOOL_PARSER_LLAMA3_JSON) {   /* a call is the whole output: hold it */
        while ((lead < len) && (strchr(" \n\t\r", text[lead]) != NULL)) {
            ++lead;
        }
        if ((lead == len) || (text[lead] == '{') ||
            (strncmp(text + lead, kvf_proxy_tool_llama_tag,
                     (len - lead < strlen(kvf_proxy_tool_llama_tag)) ? len - lead :
                                                            strlen(kvf_proxy_tool_llama_tag)) == 0)) {
            return 0;
        }
        return len;
    }
    at = strstr(text, marker);
    if ((at != NULL) && ((size_t)(at - text) < len)) {
        return (size_t)(at - text);
    }
    return len - kvf_tools_tail(text, len, marker);
}

void kvf_proxy_tools_to_message(cJSON *m, const char *text, const cJSON *calls, bool chunk)
{
    cJSON *list = cJSON_AddArrayToObject(m, "tool_calls");
    const cJSON *c;

    if (text[0] != '\0') {
        cJSON_AddStringToObject(m, "content", text);
    } else if (!chunk) {
        cJSON_AddNullToObject(m, "content");
    }
    cJSON_ArrayForEach(c, calls) {   /* a delta's are shaped already (with their index) */
        cJSON_AddItemToArray(list, cJSON_Duplicate(c, true));
    }
}
