/*
 * The input format of the stateful fuzz targets (fuzz_side_channel,
 * fuzz_serve_control): a script of records, each one op byte and its
 * operands, read until the input ends. make_seeds.c writes seeds with the
 * same helpers, so the committed scripts stay in step with this reader.
 *
 *   send       FUZZ_OP_SEND  len:u16le bytes[len]      one frame to the server
 *   send2      FUZZ_OP_SEND2 len:u16le bytes[len]      the same bytes as two frames
 *   add        FUZZ_OP_ADD   lease:u8  ttl:u16le       (side channel) lease a request
 *   tick       FUZZ_OP_TICK  ms:u16le                  the fuzz clock moves on
 *   abort      FUZZ_OP_ABORT lease:u8                  (side channel) the client went away
 *   collect    FUZZ_OP_COLLECT                         (side channel) free what may be freed
 * An op byte is taken modulo FUZZ_OP_COUNT; a truncated operand reads as zeros.
 */
#ifndef KVF_FUZZ_SCRIPT_H
#define KVF_FUZZ_SCRIPT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum {
    FUZZ_OP_SEND = 0,
    FUZZ_OP_SEND2,
    FUZZ_OP_ADD,
    FUZZ_OP_TICK,
    FUZZ_OP_ABORT,
    FUZZ_OP_COLLECT,
    FUZZ_OP_COUNT,
};

typedef struct fuzz_reader {
    const uint8_t *p;
    size_t         left;
} fuzz_reader_t;

static inline uint8_t fuzz_u8(fuzz_reader_t *r)
{
    if (r->left == 0) {
        return 0;
    }
    r->left--;
    return *r->p++;
}

static inline uint16_t fuzz_u16(fuzz_reader_t *r)
{
    uint16_t lo = fuzz_u8(r);
    return (uint16_t)(lo | ((uint16_t)fuzz_u8(r) << 8));
}

/* The next @a want bytes (fewer at the end of the input); *got_p says how many. */
static inline const uint8_t *fuzz_bytes(fuzz_reader_t *r, size_t want, size_t *got_p)
{
    const uint8_t *p = r->p;
    size_t n = (want < r->left) ? want : r->left;
    r->p += n;
    r->left -= n;
    *got_p = n;
    return p;
}

/* ---- writer (make_seeds.c) ---- */

typedef struct fuzz_writer {
    uint8_t buf[65536];
    size_t  len;
} fuzz_writer_t;

static inline void fuzz_w8(fuzz_writer_t *w, uint8_t v)
{
    if (w->len < sizeof(w->buf)) {
        w->buf[w->len++] = v;
    }
}

static inline void fuzz_w16(fuzz_writer_t *w, uint16_t v)
{
    fuzz_w8(w, (uint8_t)(v & 0xff));
    fuzz_w8(w, (uint8_t)(v >> 8));
}

static inline void fuzz_wsend(fuzz_writer_t *w, int op, const void *msg, size_t len)
{
    fuzz_w8(w, (uint8_t)op);
    fuzz_w16(w, (uint16_t)len);
    for (size_t i = 0; i < len; ++i) {
        fuzz_w8(w, ((const uint8_t *)msg)[i]);
    }
}

#endif
