/*
 * Prefix cache index of one instance (docs/PREFIX_CACHE.md): which attention
 * blocks and which Mamba state checkpoints hold which token prefix. It moves
 * no bytes: the engine copies checkpoint pages (common/engine), the block
 * manager keeps the cached blocks (refcounts, LRU of free cached blocks,
 * eviction callback into this index).
 *
 * Entries form a tree: one entry per hash unit of `unit` tokens, holding the
 * unit's token ids, its parent entry (a root entry its request's cache_salt)
 * and what is cached at its end: the ids of one block of every attention
 * group (when the unit ends a block) and/or a state checkpoint slot (when it
 * ends on the state grid). Lookup by the 128-bit hash of kvf_block_hash.h,
 * then comparison of tokens and parent, so a hash collision is a miss.
 * An entry lives while it caches something or has children.
 *
 * State checkpoints have their own slots (the engine's memory budget), kept
 * least recently used first; blocks are evicted by the block manager when
 * the pool needs them.
 *
 * Thread safety: none; the engine's leader thread only.
 */
#ifndef KVF_PREFIX_CACHE_H
#define KVF_PREFIX_CACHE_H

#include "kvf_block_hash.h"
#include "kvf_block_manager.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct kvf_prefix_cache *kvf_prefix_cache_h;

typedef struct kvf_prefix_cache_params {
    int                 unit;           /* tokens per hash unit, > 0, divides block_size and
                                         * state_grid */
    int                 block_size;     /* logical block, tokens */
    int                 n_attn_groups;  /* attention groups: ids per cached block, >= 1 */
    const int          *windows;        /* [n_attn_groups]: each attention group's sliding
                                         * window (KVF_GROUP_SLIDING), 0 for a full group;
                                         * NULL: every group full. Copied. */
    int                 state_grid;     /* tokens between checkpoints; 0: no states (a model
                                         * without Mamba layers) */
    int                 state_slots;    /* checkpoints held, >= 1 when state_grid > 0 */
    kvf_block_manager_h bm;             /* keeps the cached blocks; not owned; its eviction
                                         * callback is set to this index */
} kvf_prefix_cache_params_t;

/** One request's chain: its tokens and the hashes of their complete units. */
typedef struct kvf_prefix_key {
    kvf_block_hash_t        root;       /* h_0 (kvf_block_hash_root) */
    const uint8_t          *salt;       /* cache_salt, salt_len bytes */
    size_t                  salt_len;
    const int32_t          *tokens;     /* at least n_units * unit */
    const kvf_block_hash_t *unit_hash;  /* [n_units]: h_1 .. h_n */
    int                     n_units;
    uint64_t                source;     /* who computed the KV (the numerics class of the
                                         * engine, kvf_engine_numerics_class()): a block is
                                         * served only to a key of the same source, and
                                         * add_block records it; 0 is a source too */
    bool                    blocks_only;/* lookup: ignore the checkpoints, the longest run
                                         * of cached blocks (decode pulls the state) */
} kvf_prefix_key_t;

typedef struct kvf_prefix_hit {
    int            tokens;      /* t, the prefix served; 0 = miss */
    int            n_blocks;    /* full attention blocks below t: floor(t / block_size) */
    const int32_t *ids;         /* [n_blocks][n_attn_groups]; valid until the next call; -1
                                 * for a sliding group's block before t's window that is
                                 * not cached (kvf_block_manager_share() gives a fresh one) */
    int            state_slot;  /* the checkpoint at t; -1 without states */
} kvf_prefix_hit_t;

typedef struct kvf_prefix_cache_stats {
    int entries;        /* tree entries */
    int cached_blocks;  /* entries holding a block (each n_attn_groups pool blocks) */
    int states;         /* slots holding a checkpoint */
    uint64_t states_evicted, blocks_evicted;
} kvf_prefix_cache_stats_t;

/**
 * @return KVF_OK and *pc_p; KVF_ERR_INVALID_PARAM (sizes, unit not dividing
 *         block_size or state_grid, no slots for a grid); KVF_ERR_NO_MEMORY.
 */
kvf_status_t kvf_prefix_cache_create(const kvf_prefix_cache_params_t *params,
                                     kvf_prefix_cache_h *pc_p);

/** Un-cache every block (free cached ones go to the free list) and free the index. NULL: no-op. */
void kvf_prefix_cache_destroy(kvf_prefix_cache_h pc);

/**
 * The longest prefix of @a key every group can serve, at most @a max_tokens
 * tokens (docs/PREFIX_CACHE.md §1): without states (or key->blocks_only),
 * whole cached blocks of key->source from the start; with states, the
 * longest checkpoint t whose blocks below floor(t / block_size) are all
 * cached, of key->source. A sliding group (params.windows) needs only its
 * blocks [floor(max(0, t - W) / block_size), t / block_size), the ones a query
 * at t attends (vLLM's sliding-window hit rule). A used checkpoint becomes the most
 * recently used. Never fails: a miss is hit->tokens == 0.
 */
void kvf_prefix_cache_lookup(kvf_prefix_cache_h pc, const kvf_prefix_key_t *key, int max_tokens,
                             kvf_prefix_hit_t *hit);

/**
 * Block @a j of @a key (tokens [j B, (j+1) B), all computed) is in pool
 * blocks @a ids (one per attention group): index it and mark the blocks
 * cached as computed by key->source, unless that prefix already has a block
 * (then nothing changes: the first copy stays, whatever its source, except
 * that a sliding group's block it lacks is taken from @a ids when the source
 * is the same). A sliding group's id may be -1 (its block left the window or
 * holds no content): the block is indexed without it, unless the model has no
 * full attention group (then nothing is indexed). Evicting a sliding group's
 * block drops only that id; evicting a full group's drops the entry.
 * key->n_units must cover (j+1) B tokens.
 * @return KVF_OK; KVF_ERR_INVALID_PARAM; KVF_ERR_NO_MEMORY (nothing indexed).
 */
kvf_status_t kvf_prefix_cache_add_block(kvf_prefix_cache_h pc, const kvf_prefix_key_t *key,
                                        int j, const int32_t *ids);

/**
 * The state after @a t tokens of @a key (t > 0 on the grid) is computed:
 * the slot to copy it into (least recently used slot evicted if none is
 * free), or -1 when that checkpoint exists already, states are off, or
 * memory ran out. The caller copies before the next lookup.
 */
int kvf_prefix_cache_add_state(kvf_prefix_cache_h pc, const kvf_prefix_key_t *key, int t);

/** Whether the checkpoint at @a t of @a key exists. */
bool kvf_prefix_cache_has_state(kvf_prefix_cache_h pc, const kvf_prefix_key_t *key, int t);

void kvf_prefix_cache_get_stats(kvf_prefix_cache_h pc, kvf_prefix_cache_stats_t *stats_p);

/* ---- events (vLLM's KV events: daemon/kvf_kv_events.h publishes them) ---- */

typedef enum {
    KVF_PREFIX_EV_STORED = 0,   /* a full block was indexed under a prefix */
    KVF_PREFIX_EV_REMOVED,      /* a cached block was evicted */
    KVF_PREFIX_EV_CLEARED,      /* every block was dropped (the index is destroyed) */
} kvf_prefix_event_kind_t;

/** One event; pointers are valid during the callback only. */
typedef struct kvf_prefix_event {
    kvf_prefix_event_kind_t kind;
    kvf_block_hash_t        hash;        /* STORED, REMOVED: the block's key h_{(j+1)B/u} */
    bool                    has_parent;  /* STORED: false for a prompt's first block */
    kvf_block_hash_t        parent;      /* STORED: the previous block's key */
    const int32_t          *tokens;      /* STORED: the block's block_size token ids */
    int                     block_size;  /* STORED */
} kvf_prefix_event_t;

typedef void (*kvf_prefix_event_fn)(void *ctx, const kvf_prefix_event_t *ev);

/**
 * Have @a fn(@a ctx, event) called, on the caller's thread, whenever a block
 * is indexed (add_block), evicted, or all are dropped (destroy). @a fn NULL: none.
 */
void kvf_prefix_cache_set_event_fn(kvf_prefix_cache_h pc, kvf_prefix_event_fn fn, void *ctx);

#endif
