/* <think> ... </think> reasoning apart from the content (kvf_proxy_reasoning.h). */
#include "kvf_proxy_reasoning.h"

#include <string.h>

static const char kvf_think_open[] = "<think>", kvf_think_close[] = "</think>";

bool kvf_proxy_reasoning_from_name(const char *name, kvf_proxy_reasoning_t *out)
{
    if (strcmp(name, "deepseek_r1") == 0) {
        *out = KVF_REASONING_DEEPSEEK_R1;
    } else if (strcmp(name, "qwen3") == 0) {
        *out = KVF_REASONING_QWEN3;
    } else {
        return false;
    }
    return true;
}

/* The first occurrence of @a m in text[from, len), or len. */
static size_t kvf_find(const char *text, size_t from, size_t len, const char *m)
{
    size_t n = strlen(m);

    for (size_t i = from; i + n <= len; ++i) {
        if (memcmp(text + i, m, n) == 0) {
            return i;
        }
    }
    return len;
}

/* The longest tail of text[from, len) that begins @a m (shorter than it), or 0. */
static size_t kvf_tail(const char *text, size_t from, size_t len, const char *m)
{
    size_t n = strlen(m);

    for (size_t k = (n - 1 < len - from) ? n - 1 : len - from; k > 0; --k) {
        if (memcmp(text + len - k, m, k) == 0) {
            return k;
        }
    }
    return 0;
}

void kvf_proxy_reasoning_split(kvf_proxy_reasoning_t parser, const char *text, size_t len,
                               bool final, kvf_proxy_reasoning_span_t *sp)
{
    size_t open = strlen(kvf_think_open), start = 0, close;
    bool opened;

    *sp = (kvf_proxy_reasoning_span_t){0, 0, 0, len};
    if (parser == KVF_REASONING_NONE) {
        return;
    }
    if (!final && (len < open) && (memcmp(text, kvf_think_open, len) == 0)) {
        sp->hold = 0;   /* may still become <think> */
        return;
    }
    opened = (len >= open) && (memcmp(text, kvf_think_open, open) == 0);
    start = opened ? open : 0;
    if ((parser == KVF_REASONING_QWEN3) && !opened) {
        return;   /* no leading <think>: all content */
    }
    close = kvf_find(text, start, len, kvf_think_close);
    if (close < len) {   /* the block closed: content after it */
        *sp = (kvf_proxy_reasoning_span_t){start, close, close + strlen(kvf_think_close), len};
        return;
    }
    if (final && (parser == KVF_REASONING_QWEN3)) {
        return;   /* never closed: qwen3 reads it all as content */
    }
    sp->r_start = start;
    sp->hold = final ? len : len - kvf_tail(text, start, len, kvf_think_close);
    sp->r_end = sp->hold;
    sp->c_start = len;   /* no content yet (or ever, for a finished deepseek_r1) */
    if (final) {
        sp->r_end = len;
    }
}
