/*
 * The proxy's tokenizer against the daemons' (issue 26 item 2). Every health
 * reply names the model the instance serves (HealthReply.model_path,
 * model_digest, tokenizer_digest). An instance whose tokenizer fingerprint
 * differs from this proxy's is not routed to: text this proxy encodes would
 * be other ids there, and the answer silently wrong. A proxy started without
 * --model has no tokenizer: it adopts the first instance's model folder that
 * it can read here with the same fingerprint (a shared file system, the same
 * image), and until then refuses completions (503) instead of falling back
 * to byte ids.
 */
#include "kvf_proxy_pool_int.h"
#include "kvf_log.h"

#include <stdio.h>
#include <string.h>

bool kvf_proxy_tok_check_locked(struct kvf_proxy_pool *pool, kvf_proxy_instance_t *inst,
                                const Kvf__HealthReply *h, char *why, size_t cap)
{
    const char *digest = (h->tokenizer_digest != NULL) ? h->tokenizer_digest : "";
    const char *path = (h->model_path != NULL) ? h->model_path : "";

    if (digest[0] == '\0') {
        /* an instance that reports no tokenizer (an older daemon, a test double): nothing to
         * compare; a proxy without --model serves byte ids then, and says so */
        if ((pool->tok_digest[0] == '\0') && (pool->adopt != NULL) &&
            (pool->adopt(pool->adopt_ctx, NULL, NULL, why, cap) == KVF_OK)) {
            snprintf(pool->tok_digest, sizeof(pool->tok_digest), "%s", KVF_PROXY_TOK_BYTES);
            snprintf(pool->tok_source, sizeof(pool->tok_source), "byte ids: no --model, and "
                     "%.200s reports no tokenizer (an older daemon?)", inst->info.url);
            kvf_warn("no --model and instance %s reports no tokenizer: serving byte ids (text "
                     "is only right for a byte-level model; give --model)", inst->info.url);
        }
        return true;
    }
    if ((pool->tok_digest[0] == '\0') && (pool->adopt != NULL) && (path[0] != '\0') &&
        (strcmp(pool->tok_tried, path) != 0)) {
        char err[256];

        if (pool->adopt(pool->adopt_ctx, path, digest, err, sizeof(err)) == KVF_OK) {
            snprintf(pool->tok_digest, sizeof(pool->tok_digest), "%s", digest);
            snprintf(pool->tok_source, sizeof(pool->tok_source), "the daemons' model %s "
                     "(reported by %s)", path, inst->info.url);
            kvf_notice("no --model: serving text with the tokenizer of the daemons' model %s "
                       "(tokenizer %s, reported by %s)", path, digest, inst->info.url);
        } else {
            snprintf(pool->tok_tried, sizeof(pool->tok_tried), "%s", path);
            snprintf(pool->tok_source, sizeof(pool->tok_source), "none: no --model, and the "
                     "daemons' model %s cannot be used here: %s", path, err);
            kvf_error("no --model and the daemons' model %s cannot be used here (%s): "
                      "completions are refused until the proxy is given --model", path, err);
        }
    }
    if ((pool->tok_digest[0] != '\0') && (strcmp(pool->tok_digest, digest) != 0)) {
        snprintf(why, cap, "incompatible: its tokenizer %s (model %s) is not this proxy's %s",
                 digest, (path[0] != '\0') ? path : "?", pool->tok_digest);
        return false;
    }
    return true;
}
