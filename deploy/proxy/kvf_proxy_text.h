/*
 * Completion text for JSON: token bytes -> valid UTF-8. The byte-level
 * tokenizer can emit any byte, and a multi-byte character may be split
 * across stream chunks, so the streaming decoder holds back an incomplete
 * trailing sequence until the next chunk and replaces invalid bytes (and
 * NUL) with U+FFFD, as text decoders do with errors="replace".
 */
#ifndef KVF_PROXY_TEXT_H
#define KVF_PROXY_TEXT_H

#include <stddef.h>

typedef struct kvf_proxy_utf8 {
    unsigned char pending[4];   /* an incomplete sequence held back */
    int           num_pending;
} kvf_proxy_utf8_t;

/* Output bytes needed for @a len input bytes (worst case) plus the NUL. */
#define KVF_PROXY_UTF8_CAP(_len) (3 * ((_len) + 4) + 1)

/**
 * Feed @a len bytes; write valid UTF-8 to @a out (capacity @a cap, at least
 * KVF_PROXY_UTF8_CAP(len)), NUL-terminated. A trailing incomplete but so
 * far valid sequence stays pending in @a st.
 * @return bytes written, excluding the NUL.
 */
size_t kvf_proxy_utf8_feed(kvf_proxy_utf8_t *st, const char *in, size_t len, char *out,
                           size_t cap);

/** Emit U+FFFD for a pending incomplete sequence (end of text); same contract. */
size_t kvf_proxy_utf8_flush(kvf_proxy_utf8_t *st, char *out, size_t cap);

#endif
