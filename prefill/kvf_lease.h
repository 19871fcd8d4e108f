/*
 * Leases: a prefill instance keeps a finished prompt's blocks for the decode
 * instance that will pull them, until decode's release notification or the
 * lease's expiry, whichever comes first (DESIGN.md §9). Without a lease, a
 * decode that never comes would pin the blocks forever.
 *
 * The table maps request id -> (expiry, opaque owner pointer). It does no
 * freeing itself: release/expire hand the owner pointer back to the caller.
 * Thread safety: none; the leader thread owns it.
 */
#ifndef KVF_LEASE_H
#define KVF_LEASE_H

#include "kvf_status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kvf_lease_table *kvf_lease_table_h;

#define KVF_LEASE_ID_MAX 64   /* request id bytes incl. NUL */

/** Create an empty table. @return KVF_OK or KVF_ERR_NO_MEMORY. */
kvf_status_t kvf_lease_table_create(kvf_lease_table_h *table_p);

/** Destroy; owners still held are NOT released (drain with expire first). */
void kvf_lease_table_destroy(kvf_lease_table_h table);

/**
 * Hold @a owner under @a request_id until @a expiry_ms (any monotonic ms clock,
 * the same one passed to kvf_lease_table_expire()).
 * @return KVF_OK; KVF_ERR_INVALID_PARAM for an empty/too long id or an id
 *         already held (the existing lease is kept); KVF_ERR_NO_MEMORY.
 */
kvf_status_t kvf_lease_table_add(kvf_lease_table_h table, const char *request_id,
                                 uint64_t expiry_ms, void *owner);

/**
 * End the lease of @a request_id (decode released it, or an abort).
 * @return the owner pointer, or NULL when no such lease (already released or
 *         expired: a late or duplicate notification is harmless).
 */
void *kvf_lease_table_release(kvf_lease_table_h table, const char *request_id);

/**
 * Bring the expiry of @a request_id forward to @a expiry_ms if that is
 * earlier (never extends). For aborts: a decode may still be reading the
 * blocks, so they are freed after a grace period rather than at once.
 * @return true when such a lease exists.
 */
bool kvf_lease_table_shorten(kvf_lease_table_h table, const char *request_id,
                             uint64_t expiry_ms);

/**
 * Remove every lease with expiry_ms <= @a now_ms, writing their owners to
 * @a owners (up to @a cap; call again while it returns cap).
 * @return the number written.
 */
size_t kvf_lease_table_expire(kvf_lease_table_h table, uint64_t now_ms, void **owners,
                              size_t cap);

/** Leases held now. */
size_t kvf_lease_table_count(kvf_lease_table_h table);

/** Earliest expiry held, or UINT64_MAX when empty (for the poll timeout). */
uint64_t kvf_lease_table_next_expiry(kvf_lease_table_h table);

#endif
