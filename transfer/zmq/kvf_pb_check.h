/*
 * protobuf-c error domain (docs/CODE_RULES.md §5). protobuf-c has one
 * failure a caller sees: <msg>__unpack() returns NULL for truncated or
 * malformed bytes (or when it runs out of memory). These macros unpack with
 * the default allocator, log the failure where it is first seen, and map it
 * to KVF_ERR_PARSE.
 *
 * The log is at debug level (subsystem proto): the bytes come from a peer,
 * and the caller knows whether a bad message is news to an operator (it then
 * logs its own warning naming the peer).
 *
 * Usage: KVF_PB_UNPACK_CHECK(kvf__handshake_request, m, len, buf) runs
 * m = kvf__handshake_request__unpack(NULL, len, buf); free m with
 * <msg>__free_unpacked(m, NULL).
 */
#ifndef KVF_PB_CHECK_H
#define KVF_PB_CHECK_H

#include "kvf_log.h"
#include "kvf_status.h"

#include <stddef.h>

#define KVF_PB_UNPACK_LOG(_msg, _len)                                         \
    kvf_log(KVF_LOG_DEBUG, KVF_SUB_PROTO, "%s: not a valid message (%zu bytes)", \
            #_msg, (size_t)(_len))

/** Unpack into @a _var; return KVF_ERR_PARSE from the enclosing function on failure. */
#define KVF_PB_UNPACK_CHECK(_msg, _var, _len, _buf)                           \
    do {                                                                      \
        (_var) = _msg##__unpack(NULL, (_len), (_buf));                        \
        if ((_var) == NULL) {                                                 \
            KVF_PB_UNPACK_LOG(_msg, _len);                                    \
            return KVF_ERR_PARSE;                                             \
        }                                                                     \
    } while (0)

/** Unpack into @a _var; on failure set @a _status to KVF_ERR_PARSE and jump to @a _label. */
#define KVF_PB_UNPACK_CHECK_GOTO(_msg, _var, _len, _buf, _status, _label)     \
    do {                                                                      \
        (_var) = _msg##__unpack(NULL, (_len), (_buf));                        \
        if ((_var) == NULL) {                                                 \
            KVF_PB_UNPACK_LOG(_msg, _len);                                    \
            (_status) = KVF_ERR_PARSE;                                        \
            goto _label;                                                      \
        }                                                                     \
    } while (0)

/** Unpack into @a _var and log a failure; the caller handles @a _var == NULL itself. */
#define KVF_PB_UNPACK_CHECK_IGNORE(_msg, _var, _len, _buf)                    \
    do {                                                                      \
        (_var) = _msg##__unpack(NULL, (_len), (_buf));                        \
        if ((_var) == NULL) {                                                 \
            KVF_PB_UNPACK_LOG(_msg, _len);                                    \
        }                                                                     \
    } while (0)

#endif
