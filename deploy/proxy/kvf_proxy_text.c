/*
 * Streaming UTF-8 repair (RFC 3629 well-formed sequences: no overlongs, no
 * surrogates, nothing above U+10FFFF). Each maximal invalid prefix becomes
 * one U+FFFD, as the Unicode "substitution of maximal subparts" practice
 * and Python's errors="replace" do, so a client sees the same text whether
 * it streams or not.
 */
#include "kvf_proxy_text.h"

#include <stdbool.h>
#include <string.h>

static const unsigned char kvf_proxy_fffd[3] = {0xef, 0xbf, 0xbd};

/* Continuation bytes a lead byte needs and the allowed range of the second byte; -1: bad lead. */
static int kvf_proxy_utf8_lead(unsigned char c, unsigned char *lo, unsigned char *hi)
{
    *lo = 0x80;
    *hi = 0xbf;
    if ((c >= 0xc2) && (c <= 0xdf)) {
        return 1;
    }
    if (c == 0xe0) {
        *lo = 0xa0;
        return 2;
    }
    if (c == 0xed) {
        *hi = 0x9f;
        return 2;
    }
    if ((c >= 0xe1) && (c <= 0xef)) {
        return 2;
    }
    if (c == 0xf0) {
        *lo = 0x90;
        return 3;
    }
    if (c == 0xf4) {
        *hi = 0x8f;
        return 3;
    }
    if ((c >= 0xf1) && (c <= 0xf3)) {
        return 3;
    }
    return -1;
}

/* Bytes of a valid prefix of the sequence starting at @a s (length @a n, lead included). */
static int kvf_proxy_utf8_valid_prefix(const unsigned char *s, size_t n, int need,
                                       unsigned char lo, unsigned char hi)
{
    int ok = 1;

    for (int k = 1; (k <= need) && ((size_t)k < n); ++k) {
        unsigned char c = s[k];
        bool in = (k == 1) ? ((c >= lo) && (c <= hi)) : ((c >= 0x80) && (c <= 0xbf));
        if (!in) {
            break;
        }
        ok++;
    }
    return ok;
}

static size_t kvf_proxy_utf8_put(char *out, size_t w, size_t cap, const unsigned char *s,
                                 size_t n)
{
    if (w + n + 1 > cap) {
        return w;  /* cannot happen with KVF_PROXY_UTF8_CAP; drop rather than overflow */
    }
    memcpy(out + w, s, n);
    return w + n;
}

size_t kvf_proxy_utf8_feed(kvf_proxy_utf8_t *st, const char *in, size_t len, char *out,
                           size_t cap)
{
    unsigned char buf[4 + 256];
    size_t w = 0;
    size_t off = 0;

    if (cap == 0) {
        return 0;
    }
    /* Process in slices so the pending bytes can be prepended without allocating. */
    do {
        size_t take = len - off;
        size_t n, i = 0;

        if (take > 256) {
            take = 256;
        }
        memcpy(buf, st->pending, (size_t)st->num_pending);
        memcpy(buf + st->num_pending, in + off, take);
        n = (size_t)st->num_pending + take;
        st->num_pending = 0;
        off += take;

        while (i < n) {
            unsigned char c = buf[i], lo, hi;
            int need, valid;

            if ((c < 0x80) && (c != 0)) {
                w = kvf_proxy_utf8_put(out, w, cap, &c, 1);
                i++;
                continue;
            }
            need = (c == 0) ? -1 : kvf_proxy_utf8_lead(c, &lo, &hi);
            if (need < 0) {
                w = kvf_proxy_utf8_put(out, w, cap, kvf_proxy_fffd, 3);
                i++;
                continue;
            }
            valid = kvf_proxy_utf8_valid_prefix(buf + i, n - i, need, lo, hi);
            if (valid == need + 1) {
                w = kvf_proxy_utf8_put(out, w, cap, buf + i, (size_t)valid);
                i += (size_t)valid;
            } else if (i + (size_t)valid == n) {
                /* Truncated by the end of this input: hold it back. */
                memcpy(st->pending, buf + i, (size_t)valid);
                st->num_pending = valid;
                i = n;
            } else {
                w = kvf_proxy_utf8_put(out, w, cap, kvf_proxy_fffd, 3);
                i += (size_t)valid;
            }
        }
    } while (off < len);
    out[w] = '\0';
    return w;
}

size_t kvf_proxy_utf8_flush(kvf_proxy_utf8_t *st, char *out, size_t cap)
{
    size_t w = 0;

    if (cap == 0) {
        return 0;
    }
    if (st->num_pending > 0) {
        w = kvf_proxy_utf8_put(out, w, cap, kvf_proxy_fffd, 3);
        st->num_pending = 0;
    }
    out[w] = '\0';
    return w;
}
