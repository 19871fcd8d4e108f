/*
 * UCX error domain (docs/CODE_RULES.md §5): map a ucs_status_t to
 * kvf_status_t (peer failures to the KVF_ERR_PEER_* range) and log a failed
 * call with ucs_status_string() where it is first seen.
 */
#ifndef KVF_UCX_CHECK_H
#define KVF_UCX_CHECK_H

#include "kvf_log.h"
#include "kvf_status.h"

#include <ucs/type/status.h>

/** Map a UCX status to kvf_status_t (peer failures to the KVF_ERR_PEER_* range). */
kvf_status_t kvf_ucx_status(ucs_status_t status);

/** Return the mapped status from the enclosing function when @a _call fails. */
#define KVF_UCX_CHECK(_call)                                                  \
    do {                                                                      \
        ucs_status_t _ucs = (_call);                                          \
        if (_ucs != UCS_OK) {                                                 \
            kvf_error("%s failed: %s", #_call, ucs_status_string(_ucs));      \
            return kvf_ucx_status(_ucs);                                      \
        }                                                                     \
    } while (0)

/** Set @a _status to the mapped status and jump to @a _label when @a _call fails. */
#define KVF_UCX_CHECK_GOTO(_call, _status, _label)                            \
    do {                                                                      \
        ucs_status_t _ucs = (_call);                                          \
        if (_ucs != UCS_OK) {                                                 \
            kvf_error("%s failed: %s", #_call, ucs_status_string(_ucs));      \
            (_status) = kvf_ucx_status(_ucs);                                 \
            goto _label;                                                      \
        }                                                                     \
    } while (0)

/** Log a failure of @a _call (debug level: teardown paths) and carry on. */
#define KVF_UCX_CHECK_IGNORE(_call)                                           \
    do {                                                                      \
        ucs_status_t _ucs = (_call);                                          \
        if (_ucs != UCS_OK) {                                                 \
            kvf_log(KVF_LOG_DEBUG, KVF_SUB_XFER, "%s failed (ignored): %s",   \
                    #_call, ucs_status_string(_ucs));                         \
        }                                                                     \
    } while (0)

#endif
