/*
 * kvf-decode's transfer path as a per-request state machine
 * (docs/ARCHITECTURE.md §5, docs/LEASE.md):
 *
 *   HANDSHAKE -> CLAIM -> [DELAY] -> GETS -> [DIGEST] -> RELEASE -> done
 *
 * handshake (cached per prefill engine, side-channel address and
 * incarnation), claim the lease (bind it to this decode, learn the time
 * left), post the GETs on every rank, wait for them to land, then one
 * release for all ranks whose answer verifies that the lease held
 * throughout; the caller commits the import on KVF_OK. Nothing here waits
 * on the network: kvf_dc_pull_advance() sends, polls and returns, so the
 * leader advances many pulls between engine steps and a stalled prefill
 * delays only its own requests (each phase is bounded by the transfer
 * timeout). A pull that fails or is abandoned after its claim force-closes
 * its reads and tells prefill at once with an abandoning release (status
 * not OK, every rank), so prefill frees the pages without waiting out the
 * lease.
 *
 * Thread model: the decode leader only (it owns every rank of the
 * connector). The pull borrows the transfer params and the block tables;
 * both must outlive it (until advance returns a final status or abandon).
 */
#ifndef KVF_DECODE_PULL_H
#define KVF_DECODE_PULL_H

#include "kvf_connector.h"
#include "kvf_engine.h"
#include "kvf_fault.h"
#include "kvf_handshake.h"
#include "kvf_serve_channel.h"
#include "kvf_status.h"

#include <stdbool.h>
#include <stdint.h>

#define KVF_DC_PULL_MAX_TP 64

/** What every pull of one decode instance shares: the connector and the counters. */
typedef struct kvf_dc_pull_ctx {
    const kvf_connector_ops_t *xops;
    kvf_connector_h            conn;
    int                        tp;                  /* decode ranks */
    int64_t                    xfer_timeout_ms;     /* bounds each phase */
    int64_t                    test_pull_delay_ms;  /* hidden: before the GETs */
    bool                       kv_digest;           /* --kv-digest on: releases carry digests */
    bool                       window_pull;         /* a model with a sliding layer: read
                                                     * its sliding layers only within the
                                                     * window (KVF_XFER_PLAN_FLAG_WINDOW) */
    uint64_t                   refusals;            /* handshakes refused */
    uint64_t                   peer_errors;
    uint64_t                   reads_prevented;     /* lease not valid: KV not read / not used */
    uint64_t                   abandoned;           /* abandoning releases sent */
    uint64_t                   digest_mismatches;   /* releases answered corrupt */
    uint64_t                   pulls_valid;         /* pulls whose release was answered valid */
    uint64_t                   bytes_valid;         /* their KV bytes read (every rank) */
    bool                       warned_no_source;    /* logged once: a prefill without a
                                                     * numerics class (TransferParams) */
#if KVF_FAULT_ENABLED
    char                       fault_last_rid[KVF_ENGINE_ID_MAX];   /* lease.claim=replay */
    uint64_t                   fault_last_nonce;
#endif
} kvf_dc_pull_ctx_t;

typedef enum {
    KVF_DC_PULL_HANDSHAKE = 0,
    KVF_DC_PULL_CLAIM,
    KVF_DC_PULL_DELAY,
    KVF_DC_PULL_GETS,
    KVF_DC_PULL_DIGEST,     /* --kv-digest on: one rank's landed KV hashed per advance */
    KVF_DC_PULL_RELEASE,
    KVF_DC_PULL_DONE,
} kvf_dc_pull_state_t;

/** What one pull measured (ms; 0 when not reached). */
typedef struct kvf_dc_pull_stats {
    double   handshake_ms;   /* start -> handshake done */
    double   transfer_ms;    /* GETs posted -> landed on every rank */
    double   posting_ms;     /* latest rank: start of the GETs -> every one posted */
    double   wire_ms;        /* latest rank: posted -> landed */
    uint64_t landed_ns;      /* latest rank's last GET landed (kvf_time_now_ns()); 0: never */
    uint64_t bytes;
    uint64_t descriptors;
    uint32_t reads;          /* prefill ranks read, summed over decode ranks */
    double   digest_ms;      /* hashing what landed (--kv-digest on), every rank */
} kvf_dc_pull_stats_t;

typedef struct kvf_dc_pull {
    kvf_dc_pull_state_t          state;
    const kvf_xfer_params_msg_t *xp;        /* borrowed */
    const kvf_req_blocks_t      *blocks;    /* borrowed: the import's block tables */
    int64_t                      skip_tokens;   /* decode's prefix cache hit: tokens already
                                                 * in the local blocks (neither read nor
                                                 * zeroed); set before the first advance */
    uint32_t                     plan_flags;    /* kvf_connector_pull_t.plan_flags (the
                                                 * window); set with skip_tokens */
    int64_t                      zeroed_tokens; /* the window: prompt tokens [skip_tokens,
                                                 * this) zeroed, not read; 0: none */
    bool                         no_reads;  /* nothing to read (a full hit of a model
                                             * without Mamba layers): claim and release
                                             * only, which settles prefill's lease */
    kvf_connector_peer_t         peer;      /* points into xp */
    char                         request_id[KVF_ENGINE_ID_MAX];
    uint64_t                     ticket;    /* side-channel operation in flight; 0: none */
    uint64_t                     start_ns;
    uint64_t                     phase_deadline_ns;
    uint64_t                     gets_ns;   /* GETs started */
    bool                         claimed;   /* a claim went out: a failure sends an abandon */
    bool                         replayed;  /* fault lease.claim=replay: this claim replays */
    kvf_connector_req_h          reqs[KVF_DC_PULL_MAX_TP];
    kvf_status_t                 final[KVF_DC_PULL_MAX_TP];
    kvf_dc_pull_stats_t          stats;
    kvf_kv_digest_t             *digests;   /* [num_digests] for the release; owned */
    int                          num_digests;
    int                          cap_digests;
    int                          digest_rank;  /* DIGEST: the next rank to hash */
    char                         err[512];  /* why, on a final status other than KVF_OK */
} kvf_dc_pull_t;

/**
 * Start pulling the state of request @a request_id, described by @a xp,
 * into @a blocks (from kvf_engine_import_begin()). Sends nothing yet.
 */
void kvf_dc_pull_begin(kvf_dc_pull_ctx_t *ctx, kvf_dc_pull_t *pull,
                       const kvf_xfer_params_msg_t *xp, const kvf_req_blocks_t *blocks,
                       const char *request_id);

/**
 * Advance @a pull as far as it goes without waiting.
 * @return KVF_INPROGRESS; KVF_OK (every byte landed and prefill answered the
 *         release "valid": commit); or the failure with pull->err:
 *         KVF_ERR_LEASE_EXPIRED (the lease did not hold, or too little was
 *         left), KVF_ERR_PARSE (prefill answered the KV digests "corrupt":
 *         the bytes differ from what it sent), KVF_ERR_REFUSED (incompatible), peer errors (timeouts
 *         included), KVF_ERR_INVALID_PARAM (params that do not fit).
 *         After a final status nothing is in flight.
 */
kvf_status_t kvf_dc_pull_advance(kvf_dc_pull_ctx_t *ctx, kvf_dc_pull_t *pull);

/**
 * After kvf_dc_pull_begin(): the tokens of engine request @a id that decode's prefix cache
 * served (kvf_engine_request_prefix_hit()) are not read; nothing is read at all when that is
 * the whole prompt of a model without Mamba layers (the lease is claimed and released). Says
 * in the log when prefill gave no numerics class (a whole pull, nothing kept). With
 * ctx->window_pull, a model with a sliding layer reads its sliding layers only in
 * [max(hit, window start), N) (kvf_xfer_window_first_block()) and its full layers in
 * [hit, N); the engine is told the blocks whose sliding slots were zeroed
 * (kvf_engine_import_zeroed()), so none of them is indexed.
 */
void kvf_dc_pull_prefix(kvf_dc_pull_ctx_t *ctx, kvf_dc_pull_t *pull, kvf_engine_h engine,
                        uint64_t id);

/** The pull's reads are on the wire, or its hashing is due (the leader should spin, not sleep). */
bool kvf_dc_pull_on_wire(const kvf_dc_pull_t *pull);

/**
 * Give up on an unfinished pull (an abort, a drain deadline): the
 * side-channel operation is cancelled, the GETs force-closed (none lands
 * after this returns), and prefill told to free the pages if it was claimed.
 */
void kvf_dc_pull_abandon(kvf_dc_pull_ctx_t *ctx, kvf_dc_pull_t *pull);

/**
 * Send a lease claim (a heartbeat of a waiting request) for the lease in
 * @a xp; poll it with ctx->xops->lease_poll. @return KVF_OK with *ticket_p.
 */
kvf_status_t kvf_dc_pull_heartbeat(kvf_dc_pull_ctx_t *ctx, const kvf_xfer_params_msg_t *xp,
                                   const char *request_id, uint64_t *ticket_p);

#endif
