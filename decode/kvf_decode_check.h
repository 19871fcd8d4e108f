/*
 * What kvf-decode checks in a control message before it touches any state
 * (no engine, no I/O): the decode request's id, prompt, sampling and
 * transfer params (through the one decoder, kvf_xfer_params_decode()), and
 * a check_peer's engine, host and port. Split from the server so the fuzz
 * target (tests/fuzz/fuzz_serve_control.c) drives exactly this code.
 * Thread safety: pure functions of their arguments.
 */
#ifndef KVF_DECODE_CHECK_H
#define KVF_DECODE_CHECK_H

#include "kvf_handshake.h"
#include "kvf_serve.pb-c.h"
#include "kvf_status.h"

#include <stddef.h>

#define KVF_DC_ID_MAX 64   /* request id bytes incl. NUL */
/* Longest lease time left a peer may announce (ms): anything longer is refused. */
#define KVF_DC_MAX_LEASE_MS (24ull * 3600ull * 1000ull)

/**
 * A DecodeRequest as it arrived: request_id of 1..KVF_DC_ID_MAX-1 bytes, a
 * non-empty prompt, max_tokens >= 1 when given with prompt + max_tokens
 * within an int (overflow-safe), transfer params that decode and cover the
 * prompt, with a lease (nonce and 1..KVF_DC_MAX_LEASE_MS ms left) and the
 * prefill's incarnation (required: the handshake cache is keyed by it).
 * @param [out] xp  on KVF_OK the decoded params (kvf_xfer_params_msg_cleanup());
 *                  nothing to free otherwise.
 * @param [out] err why not, naming the field (always NUL-terminated).
 * @return KVF_OK or KVF_ERR_INVALID_PARAM.
 */
kvf_status_t kvf_decode_request_check(const Kvf__DecodeRequest *dr, kvf_xfer_params_msg_t *xp,
                                      char *err, size_t len);

/**
 * A CheckPeerRequest: engine_id and host non-empty and short enough, port
 * 1..65535, a non-zero incarnation (required: it keys the handshake cache).
 * @return KVF_OK or KVF_ERR_INVALID_PARAM with @a err.
 */
kvf_status_t kvf_decode_check_peer_check(const Kvf__CheckPeerRequest *cr, char *err,
                                         size_t len);

#endif
