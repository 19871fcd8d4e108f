/*
 * What kvf-prefill checks in a control message before it touches any state
 * (no engine, no I/O). Split from the server so the fuzz target
 * (tests/fuzz/fuzz_serve_control.c) drives exactly this code; the engine
 * then refuses tokens outside the vocabulary. Pure functions.
 */
#ifndef KVF_PREFILL_CHECK_H
#define KVF_PREFILL_CHECK_H

#include "kvf_lease.h"
#include "kvf_serve.pb-c.h"
#include "kvf_status.h"

#include <stddef.h>

/**
 * A PrefillRequest as it arrived: request_id of 1..KVF_LEASE_ID_MAX-1 bytes
 * (it names the lease), a non-empty prompt.
 * @param [out] err why not, naming the field (always NUL-terminated).
 * @return KVF_OK or KVF_ERR_INVALID_PARAM.
 */
kvf_status_t kvf_prefill_request_check(const Kvf__PrefillRequest *req, char *err, size_t len);

#endif
