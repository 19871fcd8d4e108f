/*
 * Control-message checks of kvf-decode (kvf_decode_check.h). Every field a
 * peer or a stray client could have made up is checked here, before a
 * request may wait in line, so nothing malformed is ever kept.
 */
#include "kvf_decode_check.h"
#include "kvf_block_hash.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

kvf_status_t kvf_decode_request_check(const Kvf__DecodeRequest *dr, kvf_xfer_params_msg_t *xp,
                                      char *err, size_t len)
{
    const char *rid = dr->request_id;

    if ((rid == NULL) || (rid[0] == '\0') || (strlen(rid) >= KVF_DC_ID_MAX)) {
        snprintf(err, len, "decode request needs a request_id of 1..%d bytes", KVF_DC_ID_MAX - 1);
        return KVF_ERR_INVALID_PARAM;
    }
    if (dr->n_prompt_tokens == 0) {
        snprintf(err, len, "decode request has an empty prompt");
        return KVF_ERR_INVALID_PARAM;
    }
    if (dr->n_prompt_tokens > (size_t)INT32_MAX) {
        snprintf(err, len, "decode request prompt of %zu tokens is longer than %d",
                 dr->n_prompt_tokens, INT32_MAX);
        return KVF_ERR_INVALID_PARAM;
    }
    if ((dr->sampling != NULL) && dr->sampling->has_max_tokens &&
        ((dr->sampling->max_tokens < 1) ||
         ((uint64_t)dr->sampling->max_tokens + dr->n_prompt_tokens > (uint64_t)INT32_MAX))) {
        snprintf(err, len, "max_tokens must be at least 1 and max_tokens + prompt length must"
                 " fit an int: max_tokens %u, prompt %zu tokens", dr->sampling->max_tokens,
                 dr->n_prompt_tokens);
        return KVF_ERR_INVALID_PARAM;
    }
    if (dr->has_cache_salt && ((dr->cache_salt.len == 0) ||
                               (dr->cache_salt.len > KVF_CACHE_SALT_MAX))) {
        snprintf(err, len, "decode request cache_salt of %zu bytes: 1..%d", dr->cache_salt.len,
                 KVF_CACHE_SALT_MAX);
        return KVF_ERR_INVALID_PARAM;
    }
    if (kvf_xfer_params_decode(dr->params, (int64_t)dr->n_prompt_tokens, xp, err, len) !=
        KVF_OK) {
        return KVF_ERR_INVALID_PARAM;
    }
    if (!xp->has_lease) {
        kvf_xfer_params_msg_cleanup(xp);
        snprintf(err, len, "transfer params carry no lease nonce and time left (a prefill"
                 " of an older protocol?)");
        return KVF_ERR_INVALID_PARAM;
    }
    if ((xp->lease_ms_left == 0) || (xp->lease_ms_left > KVF_DC_MAX_LEASE_MS)) {
        snprintf(err, len, "transfer params: lease_ms_left %llu is outside 1..%llu",
                 (unsigned long long)xp->lease_ms_left, (unsigned long long)KVF_DC_MAX_LEASE_MS);
        kvf_xfer_params_msg_cleanup(xp);
        return KVF_ERR_INVALID_PARAM;
    }
    if (!xp->has_incarnation || (xp->incarnation == 0)) {
        kvf_xfer_params_msg_cleanup(xp);
        snprintf(err, len, "transfer params: incarnation missing (required: it names the"
                 " prefill process whose keys and addresses the pull may use)");
        return KVF_ERR_INVALID_PARAM;
    }
    return KVF_OK;
}

kvf_status_t kvf_decode_check_peer_check(const Kvf__CheckPeerRequest *cr, char *err,
                                         size_t len)
{
    if ((cr->engine_id == NULL) || (cr->engine_id[0] == '\0') || (cr->host == NULL) ||
        (cr->host[0] == '\0') || !cr->has_port || (cr->port == 0) || (cr->port > 65535)) {
        snprintf(err, len, "check_peer needs engine_id, host and port");
        return KVF_ERR_INVALID_PARAM;
    }
    if ((strlen(cr->engine_id) >= KVF_ENGINE_ID_MAX) || (strlen(cr->host) >= 64)) {
        snprintf(err, len, "check_peer: engine_id (%zu bytes) or host (%zu bytes) too long",
                 strlen(cr->engine_id), strlen(cr->host));
        return KVF_ERR_INVALID_PARAM;
    }
    if (!cr->has_incarnation || (cr->incarnation == 0)) {
        snprintf(err, len, "check_peer: incarnation missing (required: it keys the handshake"
                 " cache with engine id and address)");
        return KVF_ERR_INVALID_PARAM;
    }
    return KVF_OK;
}
