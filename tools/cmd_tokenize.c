/*
 * kvf tokenize: a model's tokenizer (tokenizer.json) from the command line.
 *
 *   kvf tokenize --model DIR --text "add 12+30="      ids, one line
 *   kvf tokenize --model DIR --decode "0 287 267"     text
 *   kvf tokenize --model DIR --hex-lines < FILE        one result per line
 *
 * --hex-lines reads lines of hex-encoded bytes (any bytes, invalid UTF-8
 * included) and prints per line: the ids, a tab, the hex of decode(ids), a
 * tab, the hex of the streamed decode (one id at a time, then flush), a tab,
 * and 1 when every streamed chunk was valid UTF-8. tests/common/runtime
 * compares this with Hugging Face tokenizers.
 */
#include "kvf_cmds.h"
#include "kvf_config.h"
#include "kvf_log.h"
#include "kvf_tok_config.h"
#include "kvf_tokenizer.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char model[KVF_CONFIG_STR_MAX];
    char text[KVF_CONFIG_STR_MAX];
    char decode[KVF_CONFIG_STR_MAX];
    bool hex_lines;
    bool bos;
} kvf_tokenize_opts_t;

static const kvf_config_field_t kvf_tokenize_table[] = {
    {"MODEL", "", "model folder (or its config.json) holding tokenizer.json",
     offsetof(kvf_tokenize_opts_t, model), KVF_CONFIG_TYPE_STRING, 0},
    {"TEXT", "", "text to encode; prints the ids",
     offsetof(kvf_tokenize_opts_t, text), KVF_CONFIG_TYPE_STRING, 0},
    {"DECODE", "", "space-separated ids to decode; prints the text",
     offsetof(kvf_tokenize_opts_t, decode), KVF_CONFIG_TYPE_STRING, 0},
    {"HEX_LINES", "n", "read hex-encoded byte strings from stdin, one per line (for tests)",
     offsetof(kvf_tokenize_opts_t, hex_lines), KVF_CONFIG_TYPE_BOOL, 0},
    {"BOS", "n", "prefix the model's BOS token when encoding",
     offsetof(kvf_tokenize_opts_t, bos), KVF_CONFIG_TYPE_BOOL, 0},
    {NULL, NULL, NULL, 0, 0, 0},
};

static bool kvf_utf8_valid(const char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned char c = (unsigned char)s[i];
        size_t need = (c < 0x80) ? 0 : ((c & 0xe0) == 0xc0) ? 1 : ((c & 0xf0) == 0xe0) ? 2 :
                      ((c & 0xf8) == 0xf0) ? 3 : 9;
        if (need == 9) {
            return false;
        }
        for (size_t k = 1; k <= need; ++k) {
            if ((i + k >= n) || (((unsigned char)s[i + k] & 0xc0) != 0x80)) {
                return false;
            }
        }
        i += need + 1;
    }
    return true;
}

static void kvf_print_hex(const char *s, size_t n)
{
    for (size_t i = 0; i < n; ++i) {
        printf("%02x", (unsigned char)s[i]);
    }
}

static int kvf_tokenize_hex_line(const kvf_tokenizer_t *tok, const char *line, bool bos)
{
    size_t n = strlen(line) / 2, cap = 3 * n + 8;
    char *bytes = malloc(n + 1), *text = NULL, *chunk = NULL, *streamed = NULL;
    int32_t *ids = malloc(cap * sizeof(int32_t));
    kvf_tokenizer_stream_t st = {{0}, 0, 0};
    size_t tcap, slen = 0, w, ccap;
    bool valid = true;
    int k, rc = 1;

    if ((bytes == NULL) || (ids == NULL)) {
        goto out;
    }
    for (size_t i = 0; i < n; ++i) {
        unsigned v;
        if (sscanf(line + 2 * i, "%2x", &v) != 1) {
            kvf_error("kvf tokenize: bad hex at column %zu", 2 * i);
            goto out;
        }
        bytes[i] = (char)v;
    }
    k = kvf_tokenizer_encode(tok, bytes, n, bos, ids, (int)cap);
    if (k < 0) {
        kvf_error("kvf tokenize: encoding failed");
        goto out;
    }
    tcap = kvf_tokenizer_stream_cap(tok, k) + 16;
    ccap = kvf_tokenizer_stream_cap(tok, 1) + 3 * KVF_TOKENIZER_STREAM_PEND + 16;
    text = malloc(tcap);
    streamed = malloc(tcap);
    chunk = malloc(ccap);
    if ((text == NULL) || (streamed == NULL) || (chunk == NULL)) {
        goto out;
    }
    for (int i = 0; i < k; ++i) {
        printf("%s%d", (i > 0) ? " " : "", ids[i]);
    }
    printf("\t");
    w = kvf_tokenizer_decode(tok, ids, k, text, tcap);
    kvf_print_hex(text, w);
    printf("\t");
    for (int i = 0; i <= k; ++i) {
        w = (i < k) ? kvf_tokenizer_stream_feed(tok, &st, ids + i, 1, chunk, ccap) :
                      kvf_tokenizer_stream_flush(&st, chunk, ccap);
        valid = valid && kvf_utf8_valid(chunk, w);
        memcpy(streamed + slen, chunk, w);
        slen += w;
    }
    kvf_print_hex(streamed, slen);
    printf("\t%d\n", valid ? 1 : 0);
    rc = 0;
out:
    free(bytes);
    free(ids);
    free(text);
    free(streamed);
    free(chunk);
    return rc;
}

int kvf_cmd_tokenize(int argc, char **argv)
{
    kvf_tokenize_opts_t o;
    kvf_tok_config_t cfg, *cfgp = NULL;
    kvf_tokenizer_t tok;
    bool done = false;
    int rc = 1;

    if (kvf_config_parse(kvf_tokenize_table, "kvf tokenize", argc, argv, &o, &done) != KVF_OK) {
        return 2;
    }
    if (done) {
        return 0;
    }
    if (o.model[0] == '\0') {
        kvf_error("kvf tokenize: --model is required");
        return 2;
    }
    if (kvf_tok_config_load(o.model, &cfg) == KVF_OK) {
        cfgp = &cfg;
    }
    if (kvf_tokenizer_load(o.model, cfgp, &tok) != KVF_OK) {
        return 1;
    }
    if (o.hex_lines) {
        char *line = NULL;
        size_t lcap = 0;
        ssize_t len;
        rc = 0;
        while ((rc == 0) && ((len = getline(&line, &lcap, stdin)) >= 0)) {
            while ((len > 0) && ((line[len - 1] == '\n') || (line[len - 1] == '\r'))) {
                line[--len] = '\0';
            }
            rc = kvf_tokenize_hex_line(&tok, line, o.bos);
        }
        free(line);
    } else if (o.decode[0] != '\0') {
        int32_t ids[KVF_CONFIG_STR_MAX];
        int n = 0;
        char *p = o.decode, *end;
        size_t cap;
        char *text;
        for (;;) {   /* ids separated by spaces or commas; anything else is refused */
            long v;
            while ((*p == ' ') || (*p == ',') || (*p == '\t')) {
                ++p;
            }
            if (*p == '\0') {
                break;
            }
            v = strtol(p, &end, 10);
            if ((end == p) || ((*end != '\0') && (*end != ' ') && (*end != ',') &&
                               (*end != '\t'))) {
                kvf_error("--decode: '%.*s' is not a token id", (int)strcspn(p, " ,\t"), p);
                kvf_tokenizer_cleanup(&tok);
                return 2;
            }
            if ((v < 0) || (v >= tok.vocab_size)) {
                kvf_error("--decode: %ld is not a token id in [0, %d)", v, tok.vocab_size);
                kvf_tokenizer_cleanup(&tok);
                return 2;
            }
            if (n == KVF_CONFIG_STR_MAX) {
                kvf_error("--decode: more than %d ids", KVF_CONFIG_STR_MAX);
                kvf_tokenizer_cleanup(&tok);
                return 2;
            }
            ids[n++] = (int32_t)v;
            p = end;
        }
        cap = kvf_tokenizer_stream_cap(&tok, n) + 16;
        text = malloc(cap);
        if (text != NULL) {
            size_t w = kvf_tokenizer_decode(&tok, ids, n, text, cap);
            fwrite(text, 1, w, stdout);
            printf("\n");
            rc = 0;
        }
        free(text);
    } else {
        size_t len = strlen(o.text);
        int32_t *ids = malloc((3 * len + 2) * sizeof(int32_t));
        int n = (ids != NULL) ? kvf_tokenizer_encode(&tok, o.text, len, o.bos, ids,
                                                     (int)(3 * len + 2)) : -1;
        for (int i = 0; i < n; ++i) {
            printf("%s%d", (i > 0) ? " " : "", ids[i]);
        }
        printf("\n");
        rc = (n >= 0) ? 0 : 1;
        free(ids);
    }
    kvf_tokenizer_cleanup(&tok);
    return rc;
}
