/*
 * Control-message checks of kvf-decode (kvf_decode_check.h). Every field a
 * peer or a stray client could have made up is checked here, before a
 * request may wait in line, so nothing malformed is ever kept.
 */
#include "kvf_decode_check.h"

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
    if ((dr->sampling != NULL) && dr->sampling->has_max_tokens &&
        ((dr->sampling->max_tokens < 1) || (dr->sampling->max_tokens > (uint32_t)INT32_MAX))) {
        snprintf(err, len, "max_tokens must be at least 1 (and fit an int), not %u",
                 dr->sampling->max_tokens);
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
    return KVF_OK;
}
