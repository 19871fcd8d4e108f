/*
 * kvf_status_t: one status type for the whole tree (after UCX status.h).
 * 0 is success, 1 "in progress", negatives are errors grouped by blast
 * radius so a caller can tell "retry on another peer" from "bug".
 *
 * NOTE: append only; never renumber (values cross process boundaries in
 * transfer notifications and serve replies). Retired values are not reused:
 * -43 was KVF_ERR_LEASE_EXPIRED while it sat in the peer-error range.
 */
#ifndef KVF_STATUS_H
#define KVF_STATUS_H

#define KVF_STATUS_MAP(_X)                                                   \
    _X(KVF_OK,                    0, "success")                              \
    _X(KVF_INPROGRESS,            1, "operation in progress")                \
    _X(KVF_ERR_NO_MEMORY,        -1, "out of memory")                        \
    _X(KVF_ERR_INVALID_PARAM,    -2, "invalid parameter")                    \
    _X(KVF_ERR_UNSUPPORTED,      -3, "unsupported")                          \
    _X(KVF_ERR_IO,               -4, "input/output error")                   \
    _X(KVF_ERR_CUDA,             -5, "cuda call failed")                     \
    _X(KVF_ERR_NOT_FOUND,        -6, "not found")                            \
    _X(KVF_ERR_PARSE,            -7, "malformed input")                      \
    _X(KVF_ERR_OUT_OF_RANGE,     -8, "value out of range")                   \
    _X(KVF_ERR_NO_RESOURCE,      -9, "no free resource")                     \
    _X(KVF_ERR_BUSY,            -10, "resource busy")                        \
    _X(KVF_ERR_CANCELED,        -11, "operation canceled")                   \
    _X(KVF_ERR_TIMED_OUT,       -12, "local wait timed out")                 \
    _X(KVF_ERR_UCX,             -20, "ucx call failed")                      \
    _X(KVF_ERR_ZMQ,             -21, "zeromq call failed")                   \
    _X(KVF_ERR_NCCL,            -22, "nccl call failed")                     \
    _X(KVF_ERR_REFUSED,         -30, "handshake refused")                    \
    _X(KVF_ERR_VERSION,         -31, "protocol version mismatch")            \
    _X(KVF_ERR_LEASE_EXPIRED,   -32, "prefill lease expired or refused")     \
    _X(KVF_ERR_PEER_RESET,      -40, "peer reset the connection")            \
    _X(KVF_ERR_PEER_TIMEOUT,    -41, "peer did not answer in time")          \
    _X(KVF_ERR_PEER_UNREACHABLE,-42, "peer unreachable")

typedef enum {
#define KVF_STATUS_ENUM(_name, _val, _str) _name = (_val),
    KVF_STATUS_MAP(KVF_STATUS_ENUM)
#undef KVF_STATUS_ENUM
} kvf_status_t;

/*
 * -12 KVF_ERR_TIMED_OUT: a local wait ran out (nothing arrived, a barrier);
 * no peer is to blame. -30..-39: the peer answered and said no (handshake
 * refused, version, the KV lease no longer holds); it is alive, and the same
 * request on it will not succeed. -40..-59: this peer is gone (reset, no answer
 * in time, unreachable); the request may be retried elsewhere.
 */
#define KVF_IS_PEER_ERROR(_s) (((_s) <= -40) && ((_s) >= -59))

/** Human-readable string for @a status; never NULL ("unknown status"). */
const char *kvf_status_str(kvf_status_t status);

#define KVF_BIT(_i) (1ull << (_i))

#endif
