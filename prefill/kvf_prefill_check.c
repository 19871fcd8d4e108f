/* Control-message checks of kvf-prefill (kvf_prefill_check.h). */
#include "kvf_prefill_check.h"
#include "kvf_block_hash.h"

#include <stdio.h>
#include <string.h>

kvf_status_t kvf_prefill_request_check(const Kvf__PrefillRequest *req, char *err, size_t len)
{
    const char *rid = (req->request_id != NULL) ? req->request_id : "";

    if ((rid[0] == '\0') || (strlen(rid) >= KVF_LEASE_ID_MAX)) {
        snprintf(err, len, "request_id must be 1..%d bytes", KVF_LEASE_ID_MAX - 1);
        return KVF_ERR_INVALID_PARAM;
    }
    if (req->n_prompt_tokens == 0) {
        snprintf(err, len, "empty prompt");
        return KVF_ERR_INVALID_PARAM;
    }
    if (req->has_cache_salt && ((req->cache_salt.len == 0) ||
                                (req->cache_salt.len > KVF_CACHE_SALT_MAX))) {
        snprintf(err, len, "cache_salt of %zu bytes: 1..%d", req->cache_salt.len,
                 KVF_CACHE_SALT_MAX);
        return KVF_ERR_INVALID_PARAM;
    }
    return KVF_OK;
}
