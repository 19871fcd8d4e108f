/*
 * A decode request's start (kvf_decode_server_int.h): blocks, then its KV pull advanced
 * between engine steps, then commit (decoding starts), recompute or the error reply.
 */
#include "kvf_decode_server_int.h"

#include "kvf_fault.h"
#include "kvf_log.h"
#include "kvf_array.h"
#include "kvf_time.h"
#include "kvf_role.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Load failed: prefill the prompt and prefill's first token here instead. */
static kvf_status_t kvf_dc_recompute(kvf_decode_server_h srv, const Kvf__DecodeRequest *dr,
                                     int32_t first_token, const kvf_req_params_t *rp,
                                     kvf_dc_req_t *q)
{
    kvf_req_params_t p = *rp;
    int32_t *prompt = malloc((dr->n_prompt_tokens + 1) * sizeof(*prompt));
    kvf_status_t status;

    if (prompt == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    memcpy(prompt, dr->prompt_tokens, dr->n_prompt_tokens * sizeof(*prompt));
    prompt[dr->n_prompt_tokens] = first_token;
    p.prompt = prompt;
    p.prompt_len = (int)dr->n_prompt_tokens + 1;
    p.sampling.max_tokens = rp->sampling.max_tokens - 1;
    p.outputs_in_prompt = 1;   /* the first token is an output to penalties and min_tokens */
    status = kvf_engine_add_request(srv->engine, &p, &q->engine_req);
    free(prompt);
    q->stats.recomputed = 1;
    return status;
}

/* What the pull of request @a q measured, into its stats and timing; @a skip the tokens
 * decode's prefix cache held of the @a n prompt tokens. */
static void kvf_dc_pull_stats(kvf_dc_req_t *q, const kvf_dc_pull_stats_t *ps, int64_t skip,
                              int64_t n)
{
    q->stats.has_decode_cached_tokens = q->stats.has_pulled_tokens = 1;
    q->stats.decode_cached_tokens = (uint32_t)skip;
    q->stats.pulled_tokens = (uint32_t)(n - skip);
    q->stats.handshake_ms = ps->handshake_ms;
    q->stats.transfer_ms = ps->transfer_ms;
    q->stats.bytes = ps->bytes;
    q->stats.descriptors = ps->descriptors;
    q->stats.reads = ps->reads;
    q->timing.has_handshake_ms = 1;
    q->timing.handshake_ms = ps->handshake_ms;
    if (ps->landed_ns > 0) {
        q->timing.has_posting_ms = q->timing.has_wire_ms = 1;
        q->timing.posting_ms = ps->posting_ms;
        q->timing.wire_ms = ps->wire_ms;
        q->landed_ns = ps->landed_ns;
    }
}

/*
 * The pull of reqs[@a i] ended with @a status: commit the import (decoding
 * starts), recompute, or answer the error. May remove reqs[@a i].
 */
static void kvf_dc_pull_end(kvf_decode_server_h srv, int i, kvf_status_t status)
{
    kvf_dc_req_t *q = &srv->reqs[i];
    kvf_dc_import_t *imp = q->imp;
    const Kvf__DecodeRequest *dr = imp->msg->decode;
    const char *err = imp->pull.err;
    char msg[96];
    kvf_req_info_t info;

    kvf_dc_pull_stats(q, &imp->pull.stats, imp->pull.skip_tokens, (int64_t)imp->xp.num_tokens);
    if (status == KVF_OK) {
        status = kvf_engine_import_commit(srv->engine, q->engine_req, imp->xp.first_token);
        if (status != KVF_OK) {
            snprintf(msg, sizeof(msg), "first token %d rejected", imp->xp.first_token);
            err = msg;
        }
    }
    q->committed_ns = kvf_time_now_ns();
    if (q->landed_ns > 0) {
        q->timing.has_post_ops_ms = 1;
        q->timing.post_ops_ms = (double)(q->committed_ns - q->landed_ns) / 1e6;
    }
    if (status != KVF_OK) {
        kvf_engine_abort(srv->engine, q->engine_req);
        kvf_engine_release(srv->engine, q->engine_req);
        kvf_warn("request %s: %s", q->request_id, err);
        if (srv->recompute && (imp->rp.sampling.max_tokens > 1) &&
            (status != KVF_ERR_REFUSED) &&
            (kvf_dc_recompute(srv, dr, imp->xp.first_token, &imp->rp, q) == KVF_OK)) {
            kvf_dc_import_free(srv, q);
            return;   /* decoding continues from the local prefill */
        }
        kvf_serve_server_reply_error(srv->serve, &q->peer, q->request_id, status, err);
        kvf_dc_remove(srv, i);
        return;
    }
    kvf_dc_import_free(srv, q);
    /* EOS as first token, or max_tokens 1: finished at commit */
    if ((kvf_engine_request_info(srv->engine, q->engine_req, &info) == KVF_OK) &&
        (info.state == KVF_REQ_FINISHED)) {
        kvf_dc_reply_tokens(srv, q, NULL, 0, true, kvf_dc_finish_str(info.finish));
        kvf_engine_release(srv->engine, q->engine_req);
        kvf_dc_remove(srv, i);
    }
}

/* Advance every pull as far as it goes without waiting. @return pulls with reads on the wire. */
int kvf_dc_advance_pulls(kvf_decode_server_h srv)
{
    int on_wire = 0;

    /* backwards: a removal swaps the last (already advanced) request into i */
    for (int i = srv->num_reqs - 1; i >= 0; --i) {
        kvf_dc_import_t *imp = srv->reqs[i].imp;
        kvf_status_t status;

        if (imp == NULL) {
            continue;
        }
        status = kvf_dc_pull_advance(&srv->px, &imp->pull);
        if (srv->reqs[i].aborted && ((status != KVF_INPROGRESS) ||
                                     !kvf_dc_pull_on_wire(&imp->pull))) {
            kvf_dc_import_free(srv, &srv->reqs[i]);   /* nothing lands any more: abandoned */
            kvf_engine_abort(srv->engine, srv->reqs[i].engine_req);
            kvf_engine_release(srv->engine, srv->reqs[i].engine_req);
            kvf_dc_remove(srv, i);
        } else if (status != KVF_INPROGRESS) {
            kvf_dc_pull_end(srv, i, status);
        } else {
            on_wire += kvf_dc_pull_on_wire(&imp->pull);
        }
    }
    return on_wire;
}

/* The engine's parameters of @a dr (its prompt stays dr's). */
static void kvf_dc_req_params(kvf_decode_server_h srv, const Kvf__DecodeRequest *dr,
                              kvf_req_params_t *rp)
{
    char err[256];

    memset(rp, 0, sizeof(*rp));
    rp->prompt = dr->prompt_tokens;
    rp->prompt_len = (int)dr->n_prompt_tokens;
    rp->rng_skip = 1;   /* prefill sampled the first token from this seed */
    /* checked on arrival (kvf_dc_sampling_check) */
    (void)kvf_sampling_from_msg(dr->sampling, 16, kvf_engine_model_config(srv->engine)->vocab_size,
                                &rp->sampling, err, sizeof(err));
    rp->sampling.want_prompt_logprobs = false;   /* prefill reports them; a recompute here
                                                  * need not go one token per step */
    if (dr->has_cache_salt) {   /* length checked on arrival (kvf_decode_check.c) */
        rp->cache_salt = dr->cache_salt.data;
        rp->cache_salt_len = dr->cache_salt.len;
    }
}

/* The sampling parameters of a DecodeRequest, checked on arrival; KVF_OK or the refusal. */
kvf_status_t kvf_dc_sampling_check(kvf_decode_server_h srv, const Kvf__DecodeRequest *dr,
                                   char *err, size_t cap)
{
    kvf_sampling_t s;
    char msg[256];

    if (kvf_sampling_from_msg(dr->sampling, 16, kvf_engine_model_config(srv->engine)->vocab_size,
                              &s, msg, sizeof(msg)) != KVF_OK) {
        snprintf(err, cap, "sampling parameters: %s", msg);
        return KVF_ERR_INVALID_PARAM;
    }
    return KVF_OK;
}

/*
 * Allocate blocks for @a req and start its pull. @a xp is what
 * kvf_decode_request_check() decoded from it on arrival; on KVF_DC_STARTED
 * both @a req and @a xp were moved into the tracked request.
 */
kvf_dc_outcome_t kvf_dc_decode(kvf_decode_server_h srv, const kvf_serve_peer_t *peer,
                               Kvf__ServeRequest *req, uint64_t arrival_ns,
                               kvf_xfer_params_msg_t *xp)
{
    const Kvf__DecodeRequest *dr = req->decode;
    kvf_block_manager_h bm = kvf_engine_block_manager(srv->engine);
    const char *rid = (dr->request_id != NULL) ? dr->request_id : "";
    const kvf_req_blocks_t *blocks;
    kvf_req_blocks_t none;
    kvf_dc_import_t *imp;
    kvf_req_params_t rp;
    kvf_dc_req_t *q;
    char err[256];
    uint64_t id, t_alloc;
    kvf_status_t status;

    kvf_dc_req_params(srv, dr, &rp);
    rp.import_source = xp->prefix_source;   /* keys decode's own prefix cache */
    memset(&none, 0, sizeof(none));
    if (kvf_block_manager_blocks_needed(bm, &none, rp.prompt_len) >
        kvf_block_manager_num_blocks(bm)) {
        snprintf(err, sizeof(err), "prompt of %d tokens needs %d blocks, this decode instance"
                 " has %d (--num-blocks)", rp.prompt_len,
                 kvf_block_manager_blocks_needed(bm, &none, rp.prompt_len),
                 kvf_block_manager_num_blocks(bm));
        kvf_serve_server_reply_error(srv->serve, peer, rid, KVF_ERR_OUT_OF_RANGE, err);
        return KVF_DC_DONE;
    }
    if (!kvf_block_manager_can_allocate(bm, &none, rp.prompt_len)) {
        return KVF_DC_WAIT;   /* running requests will free blocks */
    }
    imp = calloc(1, sizeof(*imp));
    q = (imp != NULL) ? kvf_dc_track(srv) : NULL;
    if (q == NULL) {
        free(imp);
        kvf_serve_server_reply_error(srv->serve, peer, rid, KVF_ERR_NO_MEMORY, "out of memory");
        return KVF_DC_DONE;
    }
    snprintf(q->request_id, sizeof(q->request_id), "%s", rid);
    q->peer = *peer;
    q->stream = dr->has_stream && dr->stream;
    q->arrival_ns = arrival_ns;
    q->want_logprobs = rp.sampling.want_logprobs;
    q->logprobs = rp.sampling.logprobs;

    t_alloc = kvf_time_now_ns();
    status = kvf_engine_import_begin(srv->engine, &rp, &id, &blocks);
    if ((status == KVF_OK) && (kvf_role_pools_sync(srv->engine) != KVF_OK)) {
        /* a GPU pool: the fresh blocks' zeroing must be done before any GET can land */
        (void)kvf_engine_release(srv->engine, id);
        free(imp);
        kvf_dc_remove(srv, srv->num_reqs - 1);
        kvf_serve_server_reply_error(srv->serve, peer, rid, KVF_ERR_CUDA,
                                     "zeroing the request's fresh blocks on the device failed");
        return KVF_DC_DONE;
    }
    if (status != KVF_OK) {
        free(imp);
        kvf_dc_remove(srv, srv->num_reqs - 1);
        if (status == KVF_ERR_NO_RESOURCE) {
            return KVF_DC_WAIT;
        }
        kvf_serve_server_reply_error(srv->serve, peer, rid, status,
                                     "prompt rejected (token outside the vocabulary?)");
        return KVF_DC_DONE;
    }
    q->engine_req = id;
    q->timing.has_queue_ms = q->timing.has_alloc_ms = 1;
    q->timing.queue_ms = (double)(t_alloc - arrival_ns) / 1e6;
    q->timing.alloc_ms = (double)(kvf_time_now_ns() - t_alloc) / 1e6;
    imp->msg = req;
    imp->xp = *xp;
    memset(xp, 0, sizeof(*xp));   /* moved */
    imp->rp = rp;
    kvf_dc_pull_begin(&srv->px, &imp->pull, &imp->xp, blocks, rid);
    kvf_dc_pull_prefix(&srv->px, &imp->pull, srv->engine, id);
    q->imp = imp;
    srv->num_pulling++;
    return KVF_DC_STARTED;
}
