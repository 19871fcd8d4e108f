/*
 * Prefix cache index (kvf_prefix_cache.h).
 *
 * Design: entries in one array with a free list, found through a chained
 * hash table on the unit hash's low 64 bits; an entry matches only with its
 * parent index, its tokens and (a root) its salt equal, so the tree is exact
 * whatever the hash does. Block eviction is the block manager's (LRU of
 * free cached blocks, its callback lands in kvf_pc_evict_block); state slots
 * are few, so their LRU is a use counter and a scan at eviction.
 * Rejected: a flat map keyed by hash alone (vLLM's): a collision would serve
 * another prompt's KV.
 */
#include "kvf_prefix_cache.h"
#include "kvf_array.h"
#include "kvf_log.h"

#include <stdlib.h>
#include <string.h>

typedef struct kvf_pc_entry {
    kvf_block_hash_t hash;
    int32_t          parent;     /* entry index; -1: a root-level unit */
    int32_t          hnext;      /* hash chain; -1 ends */
    int32_t          children;
    int32_t          state;      /* checkpoint slot; -1 none */
    bool             used;
    bool             has_block;
    int32_t         *tokens;     /* [unit] */
    uint8_t         *salt;       /* root-level entries: the salt (salt_len bytes) */
    size_t           salt_len;
    int32_t         *ids;        /* [n_attn_groups] when has_block */
    uint64_t         source;     /* who computed the block (kvf_prefix_key_t.source) */
} kvf_pc_entry_t;

struct kvf_prefix_cache {
    kvf_prefix_cache_params_t p;
    kvf_pc_entry_t *e;
    int             num_e, cap_e;
    int32_t         free_e;        /* free entries, linked through hnext */
    int32_t        *buckets;       /* [nbuckets] */
    int             nbuckets;
    int32_t        *block_entry;   /* [pool blocks]: entry caching the block, -1 */
    int32_t        *slot_entry;    /* [state_slots]: entry of the checkpoint, -1 free */
    uint64_t       *slot_use;      /* [state_slots]: last use */
    uint64_t        use_clock;
    int32_t        *scratch;       /* [cap_scratch] hit ids */
    int             cap_scratch;
    int32_t        *path;          /* [cap_path] entries walked by a lookup */
    int             cap_path;
    kvf_prefix_cache_stats_t st;
    int            *win;           /* [n_attn_groups]: sliding window, 0 for a full group */
    int             n_full;        /* attention groups without a window */
    kvf_prefix_event_fn ev_fn;     /* kvf_prefix_cache_set_event_fn(); NULL: none */
    void           *ev_ctx;
};

static void kvf_pc_evict_block(void *ctx, int32_t block);

kvf_status_t kvf_prefix_cache_create(const kvf_prefix_cache_params_t *params,
                                     kvf_prefix_cache_h *pc_p)
{
    const kvf_prefix_cache_params_t *p = params;
    struct kvf_prefix_cache *pc;
    int nb;

    if ((p == NULL) || (pc_p == NULL) || (p->bm == NULL) || (p->unit < 1) ||
        (p->block_size < 1) || (p->block_size % p->unit != 0) || (p->n_attn_groups < 1) ||
        (p->state_grid < 0) || ((p->state_grid > 0) && (p->state_grid % p->unit != 0)) ||
        ((p->state_grid > 0) && (p->state_slots < 1))) {
        kvf_error("prefix cache: bad params (unit %d, block %d, grid %d, slots %d)",
                  p ? p->unit : 0, p ? p->block_size : 0, p ? p->state_grid : 0,
                  p ? p->state_slots : 0);
        return KVF_ERR_INVALID_PARAM;
    }
    pc = calloc(1, sizeof(*pc));
    if (pc == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    pc->p = *p;
    nb = kvf_block_manager_num_blocks(p->bm);
    pc->nbuckets = 1;
    while (pc->nbuckets < 2 * (nb + p->state_slots) * (p->block_size / p->unit)) {
        pc->nbuckets *= 2;   /* about two buckets per entry the pool and slots can keep */
    }
    pc->buckets = malloc((size_t)pc->nbuckets * sizeof(int32_t));
    pc->block_entry = malloc((size_t)nb * sizeof(int32_t));
    pc->slot_entry = malloc((size_t)(p->state_slots > 0 ? p->state_slots : 1) * sizeof(int32_t));
    pc->slot_use = calloc((size_t)(p->state_slots > 0 ? p->state_slots : 1), sizeof(uint64_t));
    pc->win = calloc((size_t)p->n_attn_groups, sizeof(int));
    if ((pc->buckets == NULL) || (pc->block_entry == NULL) || (pc->slot_entry == NULL) ||
        (pc->slot_use == NULL) || (pc->win == NULL)) {
        kvf_prefix_cache_destroy(pc);
        return KVF_ERR_NO_MEMORY;
    }
    memset(pc->buckets, 0xff, (size_t)pc->nbuckets * sizeof(int32_t));
    memset(pc->block_entry, 0xff, (size_t)nb * sizeof(int32_t));
    for (int s = 0; s < p->state_slots; ++s) {
        pc->slot_entry[s] = -1;
    }
    for (int a = 0; a < p->n_attn_groups; ++a) {
        pc->win[a] = (p->windows != NULL) ? p->windows[a] : 0;
        pc->n_full += (pc->win[a] <= 0);
    }
    pc->p.windows = pc->win;
    pc->free_e = -1;
    kvf_block_manager_set_evict(p->bm, kvf_pc_evict_block, pc);
    *pc_p = pc;
    return KVF_OK;
}

void kvf_prefix_cache_destroy(kvf_prefix_cache_h pc)
{
    if (pc == NULL) {
        return;
    }
    kvf_block_manager_set_evict(pc->p.bm, NULL, NULL);
    if (pc->ev_fn != NULL) {
        kvf_prefix_event_t ev = {.kind = KVF_PREFIX_EV_CLEARED};
        pc->ev_fn(pc->ev_ctx, &ev);
    }
    for (int i = 0; i < pc->num_e; ++i) {
        kvf_pc_entry_t *x = &pc->e[i];
        if (x->used && x->has_block) {
            for (int a = 0; a < pc->p.n_attn_groups; ++a) {
                if (x->ids[a] >= 0) {   /* -1: a sliding block not cached */
                    (void)kvf_block_manager_set_cached(pc->p.bm, x->ids[a], false);
                }
            }
        }
        free(x->tokens);
        free(x->salt);
        free(x->ids);
    }
    free(pc->e);
    free(pc->buckets);
    free(pc->block_entry);
    free(pc->slot_entry);
    free(pc->slot_use);
    free(pc->win);
    free(pc->scratch);
    free(pc->path);
    free(pc);
}

static int kvf_pc_bucket(const struct kvf_prefix_cache *pc, kvf_block_hash_t h)
{
    return (int)(h.lo & (uint64_t)(pc->nbuckets - 1));
}

/* Entry of unit k (1-based) of @a key under @a parent, or -1. */
static int32_t kvf_pc_find(const struct kvf_prefix_cache *pc, const kvf_prefix_key_t *key,
                           int k, int32_t parent)
{
    const kvf_block_hash_t h = key->unit_hash[k - 1];
    const int32_t *toks = key->tokens + (size_t)(k - 1) * (size_t)pc->p.unit;

    for (int32_t i = pc->buckets[kvf_pc_bucket(pc, h)]; i >= 0; i = pc->e[i].hnext) {
        const kvf_pc_entry_t *x = &pc->e[i];
        if ((x->hash.lo != h.lo) || (x->hash.hi != h.hi) || (x->parent != parent) ||
            (memcmp(x->tokens, toks, (size_t)pc->p.unit * sizeof(int32_t)) != 0)) {
            continue;
        }
        if ((parent < 0) &&
            ((x->salt_len != key->salt_len) ||
             ((x->salt_len > 0) && (memcmp(x->salt, key->salt, x->salt_len) != 0)))) {
            continue;   /* the same tokens under another salt: another tenant's chain */
        }
        return i;
    }
    return -1;
}

static void kvf_pc_unlink(struct kvf_prefix_cache *pc, int32_t idx)
{
    int32_t *pp = &pc->buckets[kvf_pc_bucket(pc, pc->e[idx].hash)];

    while (*pp != idx) {
        pp = &pc->e[*pp].hnext;
    }
    *pp = pc->e[idx].hnext;
}

/* Remove entries that cache nothing and have no children, from @a idx up. */
static void kvf_pc_prune(struct kvf_prefix_cache *pc, int32_t idx)
{
    while (idx >= 0) {
        kvf_pc_entry_t *x = &pc->e[idx];
        int32_t parent = x->parent;
        if (x->has_block || (x->state >= 0) || (x->children > 0)) {
            return;
        }
        kvf_pc_unlink(pc, idx);
        free(x->tokens);
        free(x->salt);
        free(x->ids);
        memset(x, 0, sizeof(*x));
        x->hnext = pc->free_e;
        pc->free_e = idx;
        --pc->st.entries;
        if (parent >= 0) {
            --pc->e[parent].children;
        }
        idx = parent;
    }
}

/* A new entry for unit k of @a key under @a parent; -1 without memory. */
static int32_t kvf_pc_new(struct kvf_prefix_cache *pc, const kvf_prefix_key_t *key, int k,
                          int32_t parent)
{
    const size_t tb = (size_t)pc->p.unit * sizeof(int32_t);
    kvf_pc_entry_t *x;
    int32_t idx;

    if (pc->free_e >= 0) {
        idx = pc->free_e;
        pc->free_e = pc->e[idx].hnext;
    } else {
        if (KVF_ARRAY_GROW(pc->e, pc->cap_e, pc->num_e + 1, 64) != KVF_OK) {
            return -1;
        }
        idx = pc->num_e++;
    }
    x = &pc->e[idx];
    memset(x, 0, sizeof(*x));
    x->tokens = malloc(tb);
    x->ids = malloc((size_t)pc->p.n_attn_groups * sizeof(int32_t));
    x->salt = ((parent < 0) && (key->salt_len > 0)) ? malloc(key->salt_len) : NULL;
    if ((x->tokens == NULL) || (x->ids == NULL) ||
        ((parent < 0) && (key->salt_len > 0) && (x->salt == NULL))) {
        free(x->tokens);
        free(x->ids);
        free(x->salt);
        memset(x, 0, sizeof(*x));
        x->hnext = pc->free_e;
        pc->free_e = idx;
        return -1;
    }
    memcpy(x->tokens, key->tokens + (size_t)(k - 1) * (size_t)pc->p.unit, tb);
    if (x->salt != NULL) {
        memcpy(x->salt, key->salt, key->salt_len);
        x->salt_len = key->salt_len;
    }
    x->used = true;
    x->hash = key->unit_hash[k - 1];
    x->parent = parent;
    x->state = -1;
    x->hnext = pc->buckets[kvf_pc_bucket(pc, x->hash)];
    pc->buckets[kvf_pc_bucket(pc, x->hash)] = idx;
    if (parent >= 0) {
        ++pc->e[parent].children;
    }
    ++pc->st.entries;
    return idx;
}

/* The entry of unit @a k of @a key, made with its missing ancestors; -1 without memory
 * (what was made is pruned again). */
static int32_t kvf_pc_path(struct kvf_prefix_cache *pc, const kvf_prefix_key_t *key, int k)
{
    int32_t idx = -1;

    for (int u = 1; u <= k; ++u) {
        int32_t next = kvf_pc_find(pc, key, u, idx);
        if (next < 0) {
            next = kvf_pc_new(pc, key, u, idx);
            if (next < 0) {
                kvf_pc_prune(pc, idx);
                return -1;
            }
        }
        idx = next;
    }
    return idx;
}

static kvf_status_t kvf_pc_grow_scratch(struct kvf_prefix_cache *pc, int n_units)
{
    if (KVF_ARRAY_GROW(pc->path, pc->cap_path, n_units + 1, 64) != KVF_OK) {
        return KVF_ERR_NO_MEMORY;
    }
    return KVF_ARRAY_GROW(pc->scratch, pc->cap_scratch,
                          (n_units + 1) * pc->p.n_attn_groups, 64);
}

/* Whether every sliding group caches the blocks a query at @a t attends: [floor(max(0,
 * t - W) / B), floor(t / B)), the entries of pc->path (walked up to t). The engine gives
 * back exactly the blocks before floor((computed - W) / B), so a request that computed t
 * tokens still holds these. */
static bool kvf_pc_window_ok(const struct kvf_prefix_cache *pc, int t)
{
    const int B = pc->p.block_size, per = B / pc->p.unit;

    for (int a = 0; a < pc->p.n_attn_groups; ++a) {
        const int first = (pc->win[a] > 0) ? ((t > pc->win[a]) ? (t - pc->win[a]) / B : 0) :
                          t / B;
        for (int j = first; j < t / B; ++j) {
            if (pc->e[pc->path[(j + 1) * per]].ids[a] < 0) {
                return false;
            }
        }
    }
    return true;
}

void kvf_prefix_cache_lookup(kvf_prefix_cache_h pc, const kvf_prefix_key_t *key, int max_tokens,
                             kvf_prefix_hit_t *hit)
{
    const int u = pc->p.unit, B = pc->p.block_size, G = key->blocks_only ? 0 : pc->p.state_grid;
    int kmax = max_tokens / u, blocks_ok = 0, best = 0, best_slot = -1;
    int32_t idx = -1;

    *hit = (kvf_prefix_hit_t){.state_slot = -1, .ids = pc->scratch};
    kmax = (kmax < key->n_units) ? kmax : key->n_units;
    if ((kmax < 1) || (kvf_pc_grow_scratch(pc, kmax) != KVF_OK)) {
        return;
    }
    for (int k = 1; k <= kmax; ++k) {
        const int t = k * u;
        idx = kvf_pc_find(pc, key, k, idx);
        if (idx < 0) {
            break;
        }
        pc->path[k] = idx;
        if ((t % B == 0) && (t / B == blocks_ok + 1) && pc->e[idx].has_block &&
            (pc->e[idx].source == key->source)) {
            ++blocks_ok;
        }
        if (t > (blocks_ok + 1) * B) {
            break;   /* past the cached blocks: no later unit can be served */
        }
        if ((G == 0) && (t % B == 0) && (t / B == blocks_ok) && kvf_pc_window_ok(pc, t)) {
            best = t;
        } else if ((G > 0) && (t % G == 0) && (pc->e[idx].state >= 0) && (t / B <= blocks_ok) &&
                   kvf_pc_window_ok(pc, t)) {
            best = t;
            best_slot = pc->e[idx].state;
        }
    }
    hit->tokens = best;
    hit->n_blocks = best / B;
    hit->state_slot = best_slot;
    hit->ids = pc->scratch;
    for (int j = 0; j < hit->n_blocks; ++j) {
        memcpy(pc->scratch + (size_t)j * (size_t)pc->p.n_attn_groups,
               pc->e[pc->path[(j + 1) * (B / u)]].ids,
               (size_t)pc->p.n_attn_groups * sizeof(int32_t));
    }
    if (best_slot >= 0) {
        pc->slot_use[best_slot] = ++pc->use_clock;
    }
}

kvf_status_t kvf_prefix_cache_add_block(kvf_prefix_cache_h pc, const kvf_prefix_key_t *key,
                                        int j, const int32_t *ids)
{
    const int k = (j + 1) * (pc->p.block_size / pc->p.unit);
    int32_t idx, *have;

    if ((j < 0) || (ids == NULL) || (k > key->n_units)) {
        return KVF_ERR_INVALID_PARAM;
    }
    for (int a = 0; a < pc->p.n_attn_groups; ++a) {
        if ((ids[a] < 0) && ((ids[a] != -1) || (pc->win[a] <= 0))) {
            return KVF_ERR_INVALID_PARAM;   /* only a sliding group's block may be missing */
        }
        if ((ids[a] < 0) && (pc->n_full == 0)) {
            return KVF_OK;   /* every group slides: an entry must hold a block of each */
        }
    }
    idx = kvf_pc_path(pc, key, k);
    if (idx < 0) {
        return KVF_ERR_NO_MEMORY;
    }
    have = pc->e[idx].ids;
    if (pc->e[idx].has_block) {
        /* computed twice (two requests at once): the first copy stays; a sliding block it
         * lacks is taken from the same numerics */
        for (int a = 0; (pc->e[idx].source == key->source) && (a < pc->p.n_attn_groups); ++a) {
            if ((have[a] < 0) && (ids[a] >= 0) && (pc->block_entry[ids[a]] < 0) &&
                (kvf_block_manager_set_cached(pc->p.bm, ids[a], true) == KVF_OK)) {
                have[a] = ids[a];
                pc->block_entry[ids[a]] = idx;
            }
        }
        return KVF_OK;
    }
    for (int a = 0; a < pc->p.n_attn_groups; ++a) {
        if (ids[a] < 0) {
            continue;
        }
        if ((pc->block_entry[ids[a]] >= 0) ||
            (kvf_block_manager_set_cached(pc->p.bm, ids[a], true) != KVF_OK)) {
            for (int b = 0; b < a; ++b) {
                if (ids[b] >= 0) {
                    (void)kvf_block_manager_set_cached(pc->p.bm, ids[b], false);
                    pc->block_entry[ids[b]] = -1;
                }
            }
            kvf_pc_prune(pc, idx);
            return KVF_ERR_INVALID_PARAM;   /* a block keyed under another prefix already */
        }
        pc->block_entry[ids[a]] = idx;
    }
    memcpy(pc->e[idx].ids, ids, (size_t)pc->p.n_attn_groups * sizeof(int32_t));
    pc->e[idx].has_block = true;
    pc->e[idx].source = key->source;
    ++pc->st.cached_blocks;
    if (pc->ev_fn != NULL) {
        const int per = pc->p.block_size / pc->p.unit;
        kvf_prefix_event_t ev = {
            .kind = KVF_PREFIX_EV_STORED, .hash = key->unit_hash[k - 1], .has_parent = (j > 0),
            .parent = (j > 0) ? key->unit_hash[k - per - 1] : (kvf_block_hash_t){0, 0},
            .tokens = key->tokens + (size_t)j * (size_t)pc->p.block_size,
            .block_size = pc->p.block_size};
        pc->ev_fn(pc->ev_ctx, &ev);
    }
    return KVF_OK;
}

static void kvf_pc_evict_block(void *ctx, int32_t block)
{
    struct kvf_prefix_cache *pc = ctx;
    int32_t idx = pc->block_entry[block];
    kvf_pc_entry_t *x;

    if (idx < 0) {
        return;
    }
    x = &pc->e[idx];
    for (int a = 0; (pc->n_full > 0) && (a < pc->p.n_attn_groups); ++a) {
        if ((pc->win[a] > 0) && (x->ids[a] == block)) {
            /* a sliding block: the entry still serves hits whose window starts after it */
            x->ids[a] = -1;
            pc->block_entry[block] = -1;
            ++pc->st.blocks_evicted;
            return;
        }
    }
    for (int a = 0; a < pc->p.n_attn_groups; ++a) {
        if (x->ids[a] < 0) {
            continue;
        }
        pc->block_entry[x->ids[a]] = -1;
        if (x->ids[a] != block) {   /* the other groups' blocks of that prefix are useless */
            (void)kvf_block_manager_set_cached(pc->p.bm, x->ids[a], false);
        }
    }
    x->has_block = false;
    --pc->st.cached_blocks;
    ++pc->st.blocks_evicted;
    if (pc->ev_fn != NULL) {
        kvf_prefix_event_t ev = {.kind = KVF_PREFIX_EV_REMOVED, .hash = x->hash};
        pc->ev_fn(pc->ev_ctx, &ev);
    }
    kvf_pc_prune(pc, idx);
}

bool kvf_prefix_cache_has_state(kvf_prefix_cache_h pc, const kvf_prefix_key_t *key, int t)
{
    int32_t idx = -1;

    if ((pc->p.state_grid == 0) || (t <= 0) || (t % pc->p.state_grid != 0) ||
        (t / pc->p.unit > key->n_units)) {
        return false;
    }
    for (int k = 1; k <= t / pc->p.unit; ++k) {
        idx = kvf_pc_find(pc, key, k, idx);
        if (idx < 0) {
            return false;   /* the chain stops before t */
        }
    }
    return pc->e[idx].state >= 0;
}

int kvf_prefix_cache_add_state(kvf_prefix_cache_h pc, const kvf_prefix_key_t *key, int t)
{
    int32_t idx, old, slot = -1;

    if ((pc->p.state_grid == 0) || (t <= 0) || (t % pc->p.state_grid != 0) ||
        (t / pc->p.unit > key->n_units)) {
        return -1;
    }
    idx = kvf_pc_path(pc, key, t / pc->p.unit);
    if (idx < 0) {
        return -1;
    }
    if (pc->e[idx].state >= 0) {
        pc->slot_use[pc->e[idx].state] = ++pc->use_clock;
        return -1;
    }
    for (int s = 0; s < pc->p.state_slots; ++s) {   /* a free slot, else the LRU one */
        if (pc->slot_entry[s] < 0) {
            slot = s;
            break;
        }
        if ((slot < 0) || (pc->slot_use[s] < pc->slot_use[slot])) {
            slot = s;
        }
    }
    old = pc->slot_entry[slot];
    /* idx holds the slot before the old entry is pruned: pruning climbs through ancestors,
     * and idx may be one of them */
    pc->e[idx].state = slot;
    pc->slot_entry[slot] = idx;
    pc->slot_use[slot] = ++pc->use_clock;
    if (old >= 0) {
        pc->e[old].state = -1;
        ++pc->st.states_evicted;
        kvf_pc_prune(pc, old);
    } else {
        ++pc->st.states;
    }
    return slot;
}

void kvf_prefix_cache_get_stats(kvf_prefix_cache_h pc, kvf_prefix_cache_stats_t *stats_p)
{
    *stats_p = pc->st;
}

void kvf_prefix_cache_set_event_fn(kvf_prefix_cache_h pc, kvf_prefix_event_fn fn, void *ctx)
{
    pc->ev_fn = fn;
    pc->ev_ctx = ctx;
}
