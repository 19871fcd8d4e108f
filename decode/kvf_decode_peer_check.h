/*
 * kvf-decode's answer to a CheckPeerRequest (the proxy asks, at pool start
 * and whenever a prefill restarts, whether this instance can pull from a
 * prefill engine): the handshake a request would run, under the same cache
 * key (engine id, side-channel address, incarnation), sent at once and
 * answered when it ends. Like the pulls, nothing here waits on the network:
 * kvf_dc_checks_poll() runs each loop iteration. Leader thread only.
 */
#ifndef KVF_DECODE_PEER_CHECK_H
#define KVF_DECODE_PEER_CHECK_H

#include "kvf_decode_check.h"
#include "kvf_decode_pull.h"

#define KVF_DC_MAX_CHECKS 64   /* check_peer handshakes in flight */

/* A check_peer handshake in flight. */
typedef struct kvf_dc_check {
    kvf_serve_peer_t peer;
    char             request_id[KVF_DC_ID_MAX];
    char             engine_id[KVF_ENGINE_ID_MAX];
    char             host[64];
    int              port;
    uint64_t         incarnation;
    uint64_t         ticket;         /* 0: another handshake of this key is in flight */
    uint64_t         deadline_ns;
} kvf_dc_check_t;

typedef struct kvf_dc_checks {
    kvf_dc_check_t checks[KVF_DC_MAX_CHECKS];
    int            num;
} kvf_dc_checks_t;

/**
 * Check @a cr (kvf_decode_check_peer_check()) and start its handshake;
 * answered on @a serve at once when it is cached, refused or failed, else
 * by kvf_dc_checks_poll(). Refusals are counted in ctx->refusals.
 */
void kvf_dc_checks_add(kvf_dc_pull_ctx_t *ctx, kvf_dc_checks_t *checks, kvf_serve_server_h serve,
                       const kvf_serve_peer_t *peer, const Kvf__CheckPeerRequest *cr);

/** Poll the checks in flight; answer the ones that ended. Never waits. */
void kvf_dc_checks_poll(kvf_dc_pull_ctx_t *ctx, kvf_dc_checks_t *checks,
                        kvf_serve_server_h serve);

#endif
