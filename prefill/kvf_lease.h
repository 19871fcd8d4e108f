/*
 * Leases: a prefill instance keeps a finished prompt's blocks for the decode
 * instance that will pull them (docs/ARCHITECTURE.md §9). A read counts only if the
 * lease held from the first GET to the last, so the table answers every
 * lease operation decode sends with a verdict:
 *
 *   claim    (before any GET; again as a heartbeat while the request waits
 *             in decode's queue): binds the lease to the claiming decode
 *             engine and extends it to now + ttl; valid with the time left,
 *             or expired / refused.
 *   release  (after the GETs: one for every decode rank at once, or one per
 *             rank): valid when the lease was still held, expired
 *             otherwise. Once every decode rank of the first release's
 *             decode_tp has released, the blocks go back. A release whose
 *             status is not OK (the pull failed or was abandoned; decode
 *             force-closed its reads first) gives the blocks back at once,
 *             even from quarantine: nobody reads them any more.
 *
 * Only the decode that was given the lease can end it: a claim or release
 * must carry the lease's nonce (random, sent in the transfer params), the
 * digest of the leased block lists (once bound: kvf_lease_table_bind_ids)
 * and come from the engine that claimed it (the authenticated peer). An
 * unknown lease, a wrong nonce, another owner or other block lists all get
 * the same answer (no oracle for which requests exist) and are counted; a
 * rank that already released is refused as a replay.
 *
 * An expired or aborted lease is not freed at once: a read may still be in
 * flight, so its blocks wait in quarantine for the caller's quarantine
 * period (no shorter than the peers' transfer timeout). Ended leases stay
 * as tombstones for a while, so a late release is answered "expired" (or a
 * replayed one "refused") instead of "unknown".
 *
 * The table does no freeing itself: kvf_lease_table_collect() hands owner
 * pointers back. Thread safety: every function may be called from any
 * thread (one internal mutex): the side-channel thread answers lease
 * operations while the leader thread adds, aborts and collects.
 * Times are in ms of one monotonic clock chosen by the caller.
 */
#ifndef KVF_LEASE_H
#define KVF_LEASE_H

#include "kvf_handshake.h"
#include "kvf_status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kvf_lease_table *kvf_lease_table_h;

#define KVF_LEASE_ID_MAX       64      /* request id bytes incl. NUL */
#define KVF_LEASE_TOMBSTONE_MS 60000   /* how long an ended lease is remembered */

/** Counters since create. */
typedef struct kvf_lease_stats {
    uint64_t released;             /* leases every decode rank released in time */
    uint64_t expired;              /* leases that ran out before the last release */
    uint64_t aborted;              /* leases ended by an abort */
    uint64_t refused;              /* lease operations refused (wrong nonce, engine, replay...) */
    uint64_t expired_answers;      /* claims/releases answered "expired": reads not trusted */
    uint64_t quarantined_blocks;   /* blocks that went through quarantine */
    uint64_t quarantined_now;      /* blocks in quarantine now */
    uint64_t abandoned;            /* leases a failed or abandoned pull gave back early */
    uint64_t quarantine_cut_blocks;/* quarantined blocks an abandoning release freed before
                                    * their quarantine ended (an abort came first) */
} kvf_lease_stats_t;

/** Create an empty table. @return KVF_OK or KVF_ERR_NO_MEMORY. */
kvf_status_t kvf_lease_table_create(kvf_lease_table_h *table_p);

/** Destroy; owners still held are NOT handed back. NULL ok. */
void kvf_lease_table_destroy(kvf_lease_table_h table);

/**
 * Hold @a owner (non-NULL) under @a request_id with @a nonce until
 * @a now_ms + @a ttl_ms. @a num_blocks is what the owner holds (quarantine
 * accounting only). A tombstone of the same id is replaced.
 * @return KVF_OK; KVF_ERR_INVALID_PARAM for an empty/too long id or an id
 *         still held (the existing lease is kept); KVF_ERR_NO_MEMORY.
 */
kvf_status_t kvf_lease_table_add(kvf_lease_table_h table, const char *request_id,
                                 uint64_t nonce, uint64_t now_ms, uint64_t ttl_ms,
                                 int num_blocks, void *owner);

/**
 * Bind held lease @a request_id to the block lists whose
 * kvf_xfer_ids_digest() is @a ids_digest: from now on claims and releases
 * without that digest are refused. @return KVF_OK; KVF_ERR_NOT_FOUND.
 */
kvf_status_t kvf_lease_table_bind_ids(kvf_lease_table_h table, const char *request_id,
                                      uint64_t ids_digest);

/**
 * Claim or extend (heartbeat) a lease for decode engine @a engine: binds an
 * unbound lease to it, and extends a held one to @a now_ms + @a ttl_ms
 * (never shortens). Fills @a answer (verdict, ms_left, why).
 */
void kvf_lease_table_claim(kvf_lease_table_h table, const char *request_id, uint64_t nonce,
                           const char *engine, uint64_t now_ms, uint64_t ttl_ms,
                           kvf_lease_answer_t *answer);

/**
 * Decode rank @a decode_rank of @a decode_tp ranks (1..KVF_XFER_MAX_TP) is
 * done reading. Fills @a answer: valid when the lease was held (the read
 * counts), expired when it had run out or was aborted, refused otherwise.
 * The last expected rank of a held lease makes its blocks collectable.
 */
void kvf_lease_table_release(kvf_lease_table_h table, const char *request_id, uint64_t nonce,
                             const char *engine, int decode_rank, int decode_tp,
                             uint64_t now_ms, kvf_lease_answer_t *answer);

/**
 * Answer one lease operation as it came off the wire (claim or release by
 * decode engine @a requester, with its ids digest, all_ranks and status);
 * claims extend to @a now_ms + @a ttl_ms.
 */
void kvf_lease_table_answer(kvf_lease_table_h table, const char *requester,
                            const kvf_lease_msg_t *msg, uint64_t now_ms, uint64_t ttl_ms,
                            kvf_lease_answer_t *answer);

/**
 * How long expired and aborted leases' blocks wait before reuse, counted
 * from when the lease stopped being valid was noticed; default 0. Applies
 * to leases entering quarantine from now on.
 */
void kvf_lease_table_set_quarantine(kvf_lease_table_h table, uint64_t quarantine_ms);

/**
 * End a held lease early (the client went away): from now on it answers
 * expired, and its blocks wait out the quarantine from @a now_ms.
 * @return true when a held lease was aborted.
 */
bool kvf_lease_table_abort(kvf_lease_table_h table, const char *request_id, uint64_t now_ms);

/**
 * Leader: move held leases past their expiry into quarantine, and hand
 * back the owners whose blocks
 * may be reused now (fully released, or quarantine over) into @a owners (up
 * to @a cap; call again while it returns cap). Drops old tombstones.
 * @param [out] expired_p  Leases that expired in this call (may be NULL).
 * @return the number of owners written.
 */
size_t kvf_lease_table_collect(kvf_lease_table_h table, uint64_t now_ms, void **owners,
                               size_t cap, size_t *expired_p);

/** Leases held now (claimable: not released, expired or aborted). */
size_t kvf_lease_table_count(kvf_lease_table_h table);

/** Leases whose blocks are not yet back (held, quarantined or fully released, uncollected). */
size_t kvf_lease_table_pinned(kvf_lease_table_h table);

/** Earliest time collect() has work (expiry, quarantine end), UINT64_MAX when none. */
uint64_t kvf_lease_table_next_event(kvf_lease_table_h table);

void kvf_lease_table_stats(kvf_lease_table_h table, kvf_lease_stats_t *stats_p);

#endif
