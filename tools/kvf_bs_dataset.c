/*
 * kvf bench-serve's datasets from --dataset-path: custom JSONL, and vLLM's sharegpt,
 * sonnet and burstgpt with the rules `vllm bench serve` applies to them (its flags,
 * defaults and filters; the draws are this file's seeded generator, not Python's, so the
 * same --seed picks other prompts than vLLM does, by the same rules):
 *
 * - sharegpt: a JSON list of {"conversations": [{"value": ...}, ...]}; entries with fewer
 *   than two turns are dropped, the rest shuffled (--seed). In that order, the first turn
 *   is the prompt and the second turn's token count the output length (max_tokens), or
 *   --sharegpt-output-len; a conversation is kept when its prompt has 4..1024 tokens,
 *   prompt + output at most 2048, and the output at least 4 (unless fixed), until
 *   --num-prompts are kept. Counts include the tokenizer's special tokens (BOS), as
 *   vLLM's tokenizer(text).input_ids does.
 * - sonnet: a text file of lines (a poem). avg = mean tokens per line; base = "Pick as
 *   many lines as you can from these poem lines:\n" whose tokens, in the chat template
 *   as one user message, are the base offset; --sonnet-input-len must exceed it. Every
 *   prompt is the base, the first round((prefix_len - offset) / avg) lines (the shared
 *   prefix, --sonnet-prefix-len), then lines drawn with replacement up to
 *   round((input_len - offset) / avg) lines in all; a draw is kept when its chat-template
 *   form has at most --sonnet-input-len tokens. The prompt is sent without the template;
 *   max_tokens is --sonnet-output-len. Defaults 550, 150, 200.
 * - burstgpt: the BurstGPT trace CSV (columns "Model", "Request tokens", "Response
 *   tokens", found by name); rows of model GPT-4 with a positive response are sampled
 *   (without replacement while there are enough, else with); request i sends the token
 *   ids (i + j) mod span for j < its request tokens (vLLM decodes the same ramp of ids
 *   to text; here the ids go as they are, in [--token-lo, --token-hi)), max_tokens its
 *   response tokens. Rows without request tokens are dropped (no empty prompt is sent).
 *
 * With --num-prompts 0 (a --duration run) 1000 prompts are drawn. Request i uses prompt
 * i mod n: vLLM repeats prompts too when fewer pass its filter than were asked for.
 *
 * Design: token counts come from the server under test (POST /tokenize, which vLLM serves
 * as kvf-proxy does, with the chat template for "messages"), so the counts are the served
 * model's whatever --tokenizer names, and sonnet's chat template is the model's own.
 * Rejected: a tokenizer loaded here (tools/ would need the proxy's chat template renderer,
 * and a model folder on the client machine).
 */
#define _GNU_SOURCE
#include "kvf_bs_int.h"

#include "kvf_array.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KVF_BS_DS_DEFAULT_N 1000   /* prompts drawn when --num-prompts is 0 */
#define KVF_BS_DS_FILE_MAX (4ull << 30)

static const char *const kvf_bs_ds_names[] = {"custom", "sharegpt", "sonnet", "burstgpt"};

/* ---- seeded draws (splitmix64) ------------------------------------------------ */

typedef struct {
    uint64_t s;
} kvf_bs_ds_rng_t;

static uint64_t kvf_bs_ds_next(kvf_bs_ds_rng_t *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t kvf_bs_ds_below(kvf_bs_ds_rng_t *r, uint64_t n)
{
    return kvf_bs_ds_next(r) % n;
}

/* ---- items --------------------------------------------------------------------- */

void kvf_bs_dataset_free(kvf_bs_dataset_t *d)
{
    for (int i = 0; i < d->n; ++i) {
        cJSON_Delete(d->items[i].line);
    }
    free(d->items);
    memset(d, 0, sizeof(*d));
}

/* Append {"prompt": @a prompt} (taken) with @a max_tokens. 0, or -1 (out of memory). */
static int kvf_bs_ds_add(kvf_bs_dataset_t *d, cJSON *prompt, int max_tokens)
{
    cJSON *line = cJSON_CreateObject();

    if ((line == NULL) || (prompt == NULL) ||
        (KVF_ARRAY_GROW(d->items, d->cap, d->n + 1, 64) != KVF_OK)) {
        cJSON_Delete(line);
        cJSON_Delete(prompt);
        kvf_error("out of memory building the dataset (%d prompts)", d->n);
        return -1;
    }
    cJSON_AddItemToObject(line, "prompt", prompt);
    d->items[d->n].line = line;
    d->items[d->n].prompt = prompt;
    d->items[d->n].max_tokens = max_tokens;
    d->n++;
    return 0;
}

/* The whole of @a path, NUL-terminated (malloc'd); NULL with a logged line. */
static char *kvf_bs_ds_slurp(const char *name, const char *path, size_t *len_p)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    long size;

    if ((f == NULL) || (fseek(f, 0, SEEK_END) != 0) || ((size = ftell(f)) < 0) ||
        (fseek(f, 0, SEEK_SET) != 0)) {
        kvf_error("--dataset-name %s: cannot read --dataset-path %s: %m", name, path);
        goto out;
    }
    if ((unsigned long long)size > KVF_BS_DS_FILE_MAX) {
        kvf_error("--dataset-name %s: --dataset-path %s is over %llu bytes", name, path,
                  KVF_BS_DS_FILE_MAX);
        goto out;
    }
    buf = malloc((size_t)size + 1);
    if ((buf == NULL) || (fread(buf, 1, (size_t)size, f) != (size_t)size)) {
        kvf_error("--dataset-name %s: cannot read --dataset-path %s (%ld bytes): %m", name,
                  path, size);
        free(buf);
        buf = NULL;
        goto out;
    }
    buf[size] = '\0';
    *len_p = (size_t)size;
out:
    if (f != NULL) {
        fclose(f);
    }
    return buf;
}

/*
 * Tokens of @a text as the server counts them (POST /tokenize, special tokens added): as a
 * plain prompt, or with @a chat as one user message in the model's chat template with the
 * generation prompt. >= 0, or -1 with the server's error logged.
 */
static int kvf_bs_ds_count(const kvf_bs_params_t *p, const struct addrinfo *ai,
                           const char *name, const char *text, bool chat)
{
    cJSON *req = cJSON_CreateObject(), *resp = NULL;
    const cJSON *count, *msg;
    kvf_bs_result_t res = {0};
    char *body, *out = NULL;
    int code, n = -1;

    if (p->model[0] != '\0') {
        cJSON_AddStringToObject(req, "model", p->model);
    }
    if (chat) {
        cJSON *m = cJSON_CreateObject();

        cJSON_AddStringToObject(m, "role", "user");
        cJSON_AddStringToObject(m, "content", text);
        cJSON_AddItemToArray(cJSON_AddArrayToObject(req, "messages"), m);
        cJSON_AddBoolToObject(req, "add_generation_prompt", 1);
    } else {
        cJSON_AddStringToObject(req, "prompt", text);
    }
    cJSON_AddBoolToObject(req, "add_special_tokens", 1);
    body = cJSON_PrintUnformatted(req);
    cJSON_Delete(req);
    if (body == NULL) {
        kvf_error("out of memory counting tokens");
        return -1;
    }
    code = kvf_bs_http(p, ai, "POST", "/tokenize", body, &out, &res);
    free(body);
    resp = (out != NULL) ? cJSON_Parse(out) : NULL;
    count = cJSON_GetObjectItemCaseSensitive(resp, "count");
    msg = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(resp, "error"),
                                           "message");
    if (code < 0) {
        kvf_error("--dataset-name %s counts tokens with the server's POST /tokenize: http://%s:"
                  "%d failed (%s): %s", name, p->host, p->port, res.error_kind, res.error);
    } else if (code != 200) {
        kvf_error("--dataset-name %s counts tokens with the server's POST /tokenize%s: HTTP %d"
                  ": %s", name, chat ? " (chat template)" : "", code,
                  cJSON_IsString(msg) ? msg->valuestring : "(no error message)");
    } else if (!cJSON_IsNumber(count) || (count->valuedouble < 0)) {
        kvf_error("--dataset-name %s: POST /tokenize answered without a \"count\"", name);
    } else {
        n = (int)count->valuedouble;
    }
    cJSON_Delete(resp);
    free(out);
    return n;
}

static int kvf_bs_ds_want(const kvf_bs_params_t *p)
{
    return (p->num_requests > 0) ? p->num_requests : KVF_BS_DS_DEFAULT_N;
}

/* ---- custom ---------------------------------------------------------------------- */

/* JSONL: {"prompt": "text" | [ids], "max_tokens": n (optional)} per line. */
static int kvf_bs_ds_custom(const char *path, kvf_bs_dataset_t *d)
{
    FILE *f = fopen(path, "r");
    char *line = NULL;
    size_t cap = 0;
    int lineno = 0;

    if (f == NULL) {
        kvf_error("cannot open --dataset %s: %m", path);
        return -1;
    }
    while (getline(&line, &cap, f) >= 0) {
        cJSON *root, *prompt, *mt;

        ++lineno;
        if (strspn(line, " \t\r\n") == strlen(line)) {
            continue;
        }
        root = cJSON_Parse(line);
        prompt = cJSON_GetObjectItemCaseSensitive(root, "prompt");
        if ((prompt == NULL) || (!cJSON_IsString(prompt) && !cJSON_IsArray(prompt))) {
            kvf_error("--dataset %s line %d: needs a \"prompt\" (string or array of token ids)",
                      path, lineno);
            goto err;
        }
        mt = cJSON_GetObjectItemCaseSensitive(root, "max_tokens");
        if ((mt != NULL) && (!cJSON_IsNumber(mt) || (mt->valuedouble < 1))) {
            kvf_error("--dataset %s line %d: \"max_tokens\" must be an integer >= 1", path,
                      lineno);
            goto err;
        }
        if (KVF_ARRAY_GROW(d->items, d->cap, d->n + 1, 64) != KVF_OK) {
            kvf_error("out of memory reading --dataset %s (line %d)", path, lineno);
            goto err;
        }
        d->items[d->n].line = root;
        d->items[d->n].prompt = prompt;
        d->items[d->n].max_tokens = (mt != NULL) ? (int)mt->valuedouble : 0;
        d->n++;
        continue;
err:
        cJSON_Delete(root);
        free(line);
        fclose(f);
        return -1;
    }
    free(line);
    fclose(f);
    return 0;
}

/* ---- sharegpt -------------------------------------------------------------------- */

/* vLLM's filter of a (prompt, output) pair; @a fixed: the output length was given. */
static bool kvf_bs_ds_valid(int prompt_len, int output_len, bool fixed)
{
    return (prompt_len >= 4) && (fixed || (output_len >= 4)) && (prompt_len <= 1024) &&
           (prompt_len + output_len <= 2048);
}

static int kvf_bs_ds_sharegpt(const kvf_bs_params_t *p, const struct addrinfo *ai,
                              kvf_bs_dataset_t *d)
{
    const char *name = "sharegpt";
    kvf_bs_ds_rng_t rng = {p->seed ^ 0x5ba9e6f7ull};
    size_t len = 0;
    char *text = kvf_bs_ds_slurp(name, p->dataset, &len);
    cJSON *root = NULL, *entry, **conv = NULL;
    int n = 0, tried = 0, want = kvf_bs_ds_want(p), rc = -1;
    int *orig = NULL;

    if (text == NULL) {
        return -1;
    }
    root = cJSON_ParseWithLength(text, len);
    free(text);
    if (!cJSON_IsArray(root)) {
        kvf_error("--dataset-name sharegpt: --dataset-path %s is not a JSON list (vLLM's "
                  "ShareGPT layout: [{\"conversations\": [{\"from\": \"human\", \"value\": "
                  "...}, ...]}, ...])", p->dataset);
        goto out;
    }
    conv = calloc((size_t)cJSON_GetArraySize(root) + 1, sizeof(*conv));
    orig = calloc((size_t)cJSON_GetArraySize(root) + 1, sizeof(*orig));
    if ((conv == NULL) || (orig == NULL)) {
        kvf_error("out of memory reading --dataset-path %s", p->dataset);
        goto out;
    }
    {
        int i = 0;
        cJSON_ArrayForEach(entry, root) {      /* at least two turns, as vLLM keeps */
            cJSON *c = cJSON_GetObjectItemCaseSensitive(entry, "conversations");

            if (cJSON_IsArray(c) && (cJSON_GetArraySize(c) >= 2)) {
                orig[n] = i;
                conv[n++] = c;
            }
            ++i;
        }
    }
    for (int i = n - 1; i > 0; --i) {           /* shuffled with --seed */
        int j = (int)kvf_bs_ds_below(&rng, (uint64_t)i + 1);
        cJSON *t = conv[i];
        int o = orig[i];

        conv[i] = conv[j];
        conv[j] = t;
        orig[i] = orig[j];
        orig[j] = o;
    }
    for (int i = 0; (i < n) && (d->n < want); ++i) {
        const cJSON *q = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(conv[i], 0),
                                                          "value");
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(conv[i], 1),
                                                          "value");
        int plen, olen;

        if (!cJSON_IsString(q) || !cJSON_IsString(a)) {
            kvf_error("--dataset-name sharegpt: --dataset-path %s entry %d: the first two "
                      "turns need a string \"value\"", p->dataset, orig[i]);
            goto out;
        }
        ++tried;
        plen = kvf_bs_ds_count(p, ai, name, q->valuestring, false);
        olen = (p->sharegpt_output_len > 0) ? p->sharegpt_output_len :
               kvf_bs_ds_count(p, ai, name, a->valuestring, false);
        if ((plen < 0) || (olen < 0)) {
            goto out;
        }
        if (kvf_bs_ds_valid(plen, olen, p->sharegpt_output_len > 0) &&
            (kvf_bs_ds_add(d, cJSON_CreateString(q->valuestring), olen) != 0)) {
            goto out;
        }
    }
    if (d->n == 0) {
        kvf_error("--dataset-name sharegpt: none of the %d conversations with two turns in %s "
                  "passes vLLM's filter (prompt 4 to 1024 tokens, output at least 4, both at "
                  "most 2048)", n, p->dataset);
        goto out;
    }
    kvf_info("sharegpt %s: %d conversations with two turns, %d kept of the first %d tried%s",
             p->dataset, n, d->n, tried, (d->n < want) ? " (fewer than asked: repeated)" : "");
    rc = 0;
out:
    free(conv);
    free(orig);
    cJSON_Delete(root);
    return rc;
}

/* ---- sonnet ---------------------------------------------------------------------- */

#define KVF_BS_SONNET_BASE "Pick as many lines as you can from these poem lines:\n"

static int kvf_bs_ds_sonnet(const kvf_bs_params_t *p, const struct addrinfo *ai,
                            kvf_bs_dataset_t *d)
{
    const char *name = "sonnet";
    kvf_bs_ds_rng_t rng = {p->seed ^ 0x50aa3e7ull};
    size_t len = 0, plen_max = 0, prefix_bytes = 0;
    char *text = kvf_bs_ds_slurp(name, p->dataset, &len), **lines = NULL, *prompt = NULL;
    int nl = 0, offset, n_in, n_pre, want = kvf_bs_ds_want(p), tries = 0, rc = -1;
    double total = 0, avg;

    if (text == NULL) {
        return -1;
    }
    for (size_t i = 0; i < len; ++i) {        /* lines keep their newline, as readlines() */
        nl += (text[i] == '\n') || ((i + 1 == len) && (text[i] != '\n'));
    }
    lines = calloc((size_t)nl + 1, sizeof(*lines));
    if ((nl == 0) || (lines == NULL) || (strlen(text) != len)) {
        kvf_error("--dataset-name sonnet: --dataset-path %s %s", p->dataset,
                  (nl == 0) ? "has no line" : (lines == NULL) ? "(out of memory)" :
                  "holds a NUL byte: not a text file");
        goto out;
    }
    for (size_t i = 0, start = 0, k = 0; i < len; ++i) {
        if ((text[i] == '\n') || (i + 1 == len)) {
            lines[k] = strndup(text + start, i + 1 - start);
            if (lines[k++] == NULL) {
                kvf_error("out of memory reading --dataset-path %s", p->dataset);
                goto out;
            }
            start = i + 1;
        }
    }
    for (int i = 0; i < nl; ++i) {
        int c = kvf_bs_ds_count(p, ai, name, lines[i], false);

        if (c < 0) {
            goto out;
        }
        total += c;
        plen_max = (strlen(lines[i]) > plen_max) ? strlen(lines[i]) : plen_max;
    }
    avg = total / nl;
    offset = kvf_bs_ds_count(p, ai, name, KVF_BS_SONNET_BASE, true);
    if (offset < 0) {
        goto out;
    }
    if (p->sonnet_input_len <= offset) {
        kvf_error("bad value %d for --sonnet-input-len: must be more than the base prompt's %d "
                  "tokens (in the model's chat template)", p->sonnet_input_len, offset);
        goto out;
    }
    if (!(avg > 0)) {
        kvf_error("--dataset-name sonnet: the lines of %s have no tokens", p->dataset);
        goto out;
    }
    /* rint: round half to even, as Python's round() */
    n_in = (int)rint((p->sonnet_input_len - offset) / avg);
    n_pre = (int)rint((p->sonnet_prefix_len - offset) / avg);
    n_pre = (n_pre < 0) ? 0 : (n_pre > nl) ? nl : n_pre;
    for (int i = 0; i < n_pre; ++i) {
        prefix_bytes += strlen(lines[i]);
    }
    prompt = malloc(sizeof(KVF_BS_SONNET_BASE) + prefix_bytes +
                    (size_t)((n_in > n_pre) ? n_in - n_pre : 0) * plen_max);
    if (prompt == NULL) {
        kvf_error("out of memory building sonnet prompts");
        goto out;
    }
    /* vLLM draws until enough fit; bounded here, so a length nothing fits in ends */
    while ((d->n < want) && (tries < 10 * want + 100)) {
        size_t o = 0;
        int c;

        ++tries;
        memcpy(prompt, KVF_BS_SONNET_BASE, sizeof(KVF_BS_SONNET_BASE) - 1);
        o = sizeof(KVF_BS_SONNET_BASE) - 1;
        for (int i = 0; i < n_pre; ++i) {     /* the shared prefix: the first lines */
            memcpy(prompt + o, lines[i], strlen(lines[i]));
            o += strlen(lines[i]);
        }
        for (int i = n_pre; i < n_in; ++i) {  /* then lines drawn with replacement */
            const char *l = lines[kvf_bs_ds_below(&rng, (uint64_t)nl)];

            memcpy(prompt + o, l, strlen(l));
            o += strlen(l);
        }
        prompt[o] = '\0';
        c = kvf_bs_ds_count(p, ai, name, prompt, true);
        if (c < 0) {
            goto out;
        }
        if ((c <= p->sonnet_input_len) &&
            (kvf_bs_ds_add(d, cJSON_CreateString(prompt), p->sonnet_output_len) != 0)) {
            goto out;
        }
    }
    if (d->n < want) {
        kvf_error("--dataset-name sonnet: only %d of %d prompts of %d lines (%d shared) fit in "
                  "--sonnet-input-len %d tokens after %d draws (lines of %s average %.1f "
                  "tokens)", d->n, want, n_in, n_pre, p->sonnet_input_len, tries, p->dataset,
                  avg);
        goto out;
    }
    kvf_info("sonnet %s: %d lines of %.1f tokens on average; prompts of %d lines, the first %d "
             "shared, base prompt %d tokens", p->dataset, nl, avg, n_in, n_pre, offset);
    rc = 0;
out:
    for (int i = 0; (lines != NULL) && (i < nl); ++i) {
        free(lines[i]);
    }
    free(lines);
    free(prompt);
    free(text);
    return rc;
}

/* ---- burstgpt -------------------------------------------------------------------- */

/* Split CSV @a line in place at commas into @a f (at most @a cap), trimming blanks, CR
 * and surrounding quotes. The number of fields. */
static int kvf_bs_ds_csv(char *line, char **f, int cap)
{
    int n = 0;

    for (char *save = NULL, *t = strtok_r(line, ",", &save); (t != NULL) && (n < cap);
         t = strtok_r(NULL, ",", &save)) {
        size_t e;

        while ((*t == ' ') || (*t == '"')) {
            ++t;
        }
        e = strlen(t);
        while ((e > 0) && ((t[e - 1] == ' ') || (t[e - 1] == '"') || (t[e - 1] == '\r') ||
                           (t[e - 1] == '\n'))) {
            t[--e] = '\0';
        }
        f[n++] = t;
    }
    return n;
}

typedef struct {
    int in, out;
} kvf_bs_ds_row_t;

static int kvf_bs_ds_burstgpt(const kvf_bs_params_t *p, kvf_bs_dataset_t *d)
{
    static const char *const cols[3] = {"Model", "Request tokens", "Response tokens"};
    kvf_bs_ds_rng_t rng = {p->seed ^ 0xb0257ull};
    FILE *f = fopen(p->dataset, "r");
    char *line = NULL, *fld[32];
    size_t cap = 0;
    int at[3] = {-1, -1, -1}, nf, lineno = 1, nrows = 0, rcap = 0, no_prompt = 0;
    int want = kvf_bs_ds_want(p), span = p->token_hi - p->token_lo, rc = -1;
    kvf_bs_ds_row_t *rows = NULL;

    if (f == NULL) {
        kvf_error("--dataset-name burstgpt: cannot read --dataset-path %s: %m", p->dataset);
        return -1;
    }
    if (getline(&line, &cap, f) < 0) {
        kvf_error("--dataset-name burstgpt: --dataset-path %s is empty", p->dataset);
        goto out;
    }
    nf = kvf_bs_ds_csv(line, fld, 32);
    for (int c = 0; c < 3; ++c) {
        for (int i = 0; i < nf; ++i) {
            at[c] = (strcmp(fld[i], cols[c]) == 0) ? i : at[c];
        }
        if (at[c] < 0) {
            kvf_error("--dataset-name burstgpt: --dataset-path %s has no column \"%s\" in its "
                      "header line (BurstGPT's: Timestamp, Model, Request tokens, Response "
                      "tokens, Total tokens, Log Type)", p->dataset, cols[c]);
            goto out;
        }
    }
    while (getline(&line, &cap, f) >= 0) {
        char *end;
        double in, outn;

        ++lineno;
        if (strspn(line, " \t\r\n") == strlen(line)) {
            continue;
        }
        nf = kvf_bs_ds_csv(line, fld, 32);
        if ((nf <= at[0]) || (nf <= at[1]) || (nf <= at[2])) {
            kvf_error("--dataset-name burstgpt: --dataset-path %s line %d has %d fields, fewer "
                      "than its header", p->dataset, lineno, nf);
            goto out;
        }
        in = strtod(fld[at[1]], &end);
        if ((*end != '\0') || (fld[at[1]][0] == '\0')) {
            in = NAN;
        }
        outn = strtod(fld[at[2]], &end);
        if ((*end != '\0') || (fld[at[2]][0] == '\0') || isnan(in) || (in < 0) ||
            (in > 1e7) || (outn > 1e7)) {
            kvf_error("--dataset-name burstgpt: --dataset-path %s line %d: bad \"%s\" '%s' or "
                      "\"%s\" '%s' (token counts)", p->dataset, lineno, cols[1], fld[at[1]],
                      cols[2], fld[at[2]]);
            goto out;
        }
        if ((strcmp(fld[at[0]], "GPT-4") != 0) || !(outn > 0)) {
            continue;                          /* vLLM keeps GPT-4 rows that were answered */
        }
        if ((int)in < 1) {
            ++no_prompt;
            continue;
        }
        if (KVF_ARRAY_GROW(rows, rcap, nrows + 1, 1024) != KVF_OK) {
            kvf_error("out of memory reading --dataset-path %s (line %d)", p->dataset, lineno);
            goto out;
        }
        rows[nrows].in = (int)in;
        rows[nrows++].out = (int)outn;
    }
    if (nrows == 0) {
        kvf_error("--dataset-name burstgpt: --dataset-path %s has no row of model GPT-4 with "
                  "request and response tokens", p->dataset);
        goto out;
    }
    for (int i = 0; i < want; ++i) {
        kvf_bs_ds_row_t r;
        cJSON *ids;

        if (want <= nrows) {                   /* without replacement: a partial shuffle */
            int j = i + (int)kvf_bs_ds_below(&rng, (uint64_t)(nrows - i));

            r = rows[j];
            rows[j] = rows[i];
            rows[i] = r;
        } else {
            r = rows[kvf_bs_ds_below(&rng, (uint64_t)nrows)];
        }
        ids = cJSON_CreateArray();
        for (int j = 0; (ids != NULL) && (j < r.in); ++j) {
            cJSON_AddItemToArray(ids, cJSON_CreateNumber(p->token_lo + (i + j) % span));
        }
        if (kvf_bs_ds_add(d, ids, r.out) != 0) {
            goto out;
        }
    }
    kvf_info("burstgpt %s: %d GPT-4 rows with a response (%d without request tokens "
             "dropped), %d sampled %s replacement", p->dataset, nrows, no_prompt, want,
             (want <= nrows) ? "without" : "with");
    rc = 0;
out:
    free(rows);
    free(line);
    fclose(f);
    return rc;
}

int kvf_bs_dataset_open(const kvf_bs_params_t *p, const struct addrinfo *ai,
                        kvf_bs_dataset_t *d)
{
    int rc;

    memset(d, 0, sizeof(*d));
    switch (p->dataset_kind) {
    case KVF_BS_DS_SHAREGPT:
        rc = kvf_bs_ds_sharegpt(p, ai, d);
        break;
    case KVF_BS_DS_SONNET:
        rc = kvf_bs_ds_sonnet(p, ai, d);
        break;
    case KVF_BS_DS_BURSTGPT:
        rc = kvf_bs_ds_burstgpt(p, d);
        break;
    default:
        rc = kvf_bs_ds_custom(p->dataset, d);
        break;
    }
    if ((rc == 0) && (d->n == 0)) {
        kvf_error("--dataset-name %s: --dataset-path %s holds no prompt",
                  kvf_bs_ds_names[(p->dataset_kind >= 0) && (p->dataset_kind < 4) ?
                                  p->dataset_kind : 0], p->dataset);
        rc = -1;
    }
    if (rc != 0) {
        kvf_bs_dataset_free(d);
    }
    return rc;
}
