/*
 * The decode server's own state and the functions its files share (private to decode/;
 * the public API is kvf_decode_server.h). The server is split along its concepts:
 *   kvf_decode_server.c  config, create/destroy, control requests, engine steps, drain,
 *                        health, the loop;
 *   kvf_decode_reqs.c    the table of tracked requests and their token replies;
 *   kvf_decode_admit.c   a request's start: blocks, its KV pull, commit or recompute;
 *   kvf_decode_wait.c    requests waiting for free blocks, and their lease heartbeats.
 * Leader thread only, like the server.
 */
#ifndef KVF_DECODE_SERVER_INT_H
#define KVF_DECODE_SERVER_INT_H

#include "kvf_decode_server.h"

#include "kvf_decode_check.h"
#include "kvf_decode_peer_check.h"
#include "kvf_decode_pull.h"

#include "kvf_drain.h"
#include "kvf_engine.h"
#include "kvf_handshake.h"
#include "kvf_sampling_msg.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint64_t         engine_req;
    char             request_id[KVF_DC_ID_MAX];
    kvf_serve_peer_t peer;
    bool             stream;
    int32_t         *tokens;       /* generated after the first token (non-stream replies) */
    int              num_tokens;
    int              cap_tokens;
    int              generated;    /* tokens decoded here (streamed or kept) */
    Kvf__TransferStats stats;
    /* TTFT breakdown (ServeTiming), sent with the first reply */
    Kvf__ServeTiming timing;
    bool             timing_sent;
    bool             aborted;      /* answered "abort"; its GETs still land (then it goes) */
    uint64_t         arrival_ns;   /* DecodeRequest received */
    uint64_t         landed_ns;    /* latest rank's last GET landed */
    uint64_t         committed_ns; /* import committed: decoding may start */
    struct kvf_dc_import *imp;     /* owned while the KV is pulled; NULL once decoding */
    bool             want_logprobs; /* SamplingParams.logprobs present */
    int              logprobs;      /* top logprobs per token */
    kvf_logprob_buf_t lp;          /* logprobs of the tokens not yet replied */
} kvf_dc_req_t;


/* A request whose KV is being pulled: what the pull and the commit need (a fixed address). */
typedef struct kvf_dc_import {
    kvf_dc_pull_t         pull;
    Kvf__ServeRequest    *msg;      /* the DecodeRequest (its prompt for a recompute) */
    kvf_xfer_params_msg_t xp;       /* its decoded transfer params */
    kvf_req_params_t      rp;       /* prompt points into msg */
} kvf_dc_import_t;

/* A decode request waiting for free blocks (the pool is busy, not too small). */
typedef struct {
    Kvf__ServeRequest *req;          /* owned */
    kvf_xfer_params_msg_t params;    /* req's transfer params, decoded once on arrival; owned */
    kvf_serve_peer_t   peer;
    uint64_t           deadline_ns;  /* give up one transfer timeout before the lease ends */
    uint64_t           beat_ns;      /* next heartbeat (lease claim) */
    uint64_t           beat_ticket;  /* heartbeat in flight; 0: none */
    uint64_t           arrival_ns;   /* when it was received */
} kvf_dc_waiting_t;

struct kvf_decode_server {
    kvf_decode_config_t        cfg;
    bool                       recompute;
    kvf_engine_h               engine;
    const kvf_connector_ops_t *xops;
    kvf_connector_h            conn;
    kvf_serve_server_h         serve;
    kvf_dc_req_t              *reqs;        /* pulling (pull != NULL) and decoding */
    int                        num_reqs;
    int                        cap_reqs;
    int                        num_pulling;
    kvf_dc_waiting_t          *waiting;     /* FIFO */
    int                        num_waiting;
    int                        cap_waiting;
    kvf_dc_checks_t            checks;      /* check_peer handshakes in flight */
    kvf_dc_pull_ctx_t          px;          /* the pulls' connector and counters */
    kvf_drain_t                drain;
    uint64_t                   broken_ms;   /* TP world broke then (kvf_role_broken_exit) */
};

typedef enum {
    KVF_DC_DONE = 0,      /* answered (an error): the caller frees the request message */
    KVF_DC_WAIT = 1,      /* no free blocks now: keep the message and retry later */
    KVF_DC_STARTED = 2,   /* the pull started: the message and the params were moved in */
} kvf_dc_outcome_t;

/* ---- kvf_decode_reqs.c ---------------------------------------------------- */

/** Abandon and free the pull of @a q, if any (nothing lands afterwards). */
void kvf_dc_import_free(kvf_decode_server_h srv, kvf_dc_req_t *q);

/** Free what @a q owns (its pull, tokens, logprobs); @a q itself stays in the table. */
void kvf_dc_req_cleanup(kvf_decode_server_h srv, kvf_dc_req_t *q);

/**
 * Reply @a n tokens of @a q (kept for a non-stream reply unless @a done), with the pull's
 * stats and the TTFT breakdown on its first reply. @a finish: vLLM's finish reason or NULL.
 */
void kvf_dc_reply_tokens(kvf_decode_server_h srv, kvf_dc_req_t *q, const int32_t *tokens,
                         int n, bool done, const char *finish);

/** vLLM's finish_reason text of @a r ("stop", "length", ...). */
const char *kvf_dc_finish_str(kvf_finish_reason_t r);

/** @return the index in srv->reqs of engine request @a engine_req, or -1. */
int kvf_dc_find(kvf_decode_server_h srv, uint64_t engine_req);

/** Clean up and drop reqs[@a i] (later entries move down). */
void kvf_dc_remove(kvf_decode_server_h srv, int i);

/** A new zeroed entry at the end of srv->reqs (stats and timing initialised); NULL: no memory. */
kvf_dc_req_t *kvf_dc_track(kvf_decode_server_h srv);

/* ---- kvf_decode_admit.c --------------------------------------------------- */

/** Advance every pull as far as it goes without waiting. @return pulls with reads on the wire. */
int kvf_dc_advance_pulls(kvf_decode_server_h srv);

/**
 * Check the sampling parameters of @a dr on arrival. @return KVF_OK, or
 * KVF_ERR_INVALID_PARAM with the refusal in @a err (@a cap bytes).
 */
kvf_status_t kvf_dc_sampling_check(kvf_decode_server_h srv, const Kvf__DecodeRequest *dr,
                                   char *err, size_t cap);

/**
 * Allocate blocks for @a req and start its pull. @a xp is what
 * kvf_decode_request_check() decoded from it on arrival; on KVF_DC_STARTED
 * both @a req and @a xp were moved into the tracked request.
 */
kvf_dc_outcome_t kvf_dc_decode(kvf_decode_server_h srv, const kvf_serve_peer_t *peer,
                               Kvf__ServeRequest *req, uint64_t arrival_ns,
                               kvf_xfer_params_msg_t *xp);

/* ---- kvf_decode_wait.c ---------------------------------------------------- */

/**
 * Keep @a req (and its decoded params @a xp, moved in) until blocks free up,
 * at most until shortly before prefill's lease ends.
 * The caller checked --max-queue. @return false when memory ran out (the caller
 * answers the error and still owns @a req and @a xp).
 */
bool kvf_dc_wait(kvf_decode_server_h srv, const kvf_serve_peer_t *peer,
                 Kvf__ServeRequest *req, uint64_t arrival_ns,
                 kvf_xfer_params_msg_t *xp);

/** Drop waiting[@a i]; its message and params are freed unless moved out (NULL / empty). */
void kvf_dc_unwait(kvf_decode_server_h srv, int i);

/** Heartbeat the waiting leases, start waiting requests in arrival order while blocks allow,
 *  expire the late ones. Never waits. */
void kvf_dc_admit_waiting(kvf_decode_server_h srv);

#endif /* KVF_DECODE_SERVER_INT_H */
