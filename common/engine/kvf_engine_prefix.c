/*
 * The engine's side of the prefix cache (kvf_engine_prefix.h).
 *
 * Design:
 * - A checkpoint is whole pages, per rank: every Mamba group's pages of the
 *   request's state block, then every attention group's pages of the block
 *   the checkpoint's token count falls in (the partial block's KV; unused
 *   when it is a block boundary). Whole pages keep the copy one call per
 *   page on any device and any dtype; the Mamba padding costs a little
 *   memory. Rejected: checkpoints in pool blocks (states would crowd out KV,
 *   and a pool block is one layer's page, not a request's whole state).
 * - Only tokens computed as prompt tokens are cached on a hybrid model: the
 *   prompt scan clamps dt and the one-token step does not (as transformers),
 *   so a state or a later layer's KV over tokens decoded as outputs is not
 *   what a recompute, which sees them as prompt tokens of the next turn,
 *   gives. A model without Mamba layers caches outputs' blocks too.
 * - States are taken where a prompt chunk ends on the state grid; the
 *   scheduler ends chunks on the grid, and r->chunk_cut asks for one more cut
 *   at the last grid point of the prompt, the checkpoint the next turn of a
 *   conversation hits.
 * - Decode (imports, docs/PREFIX_CACHE.md §6): the same index, keyed by decode's own chain
 *   (its block size and grid give the unit), each block tagged with the numerics class of
 *   whoever computed it, so a hit is always the bits prefill would send. Rejected: agreeing
 *   on a hash unit with prefill in the handshake and looking up prefill's hashes (decode
 *   hashes the prompt it receives anyway, and the planner cuts runs per token, so no pair of
 *   block sizes needs a common unit); indexing pulled blocks under decode's own class (a
 *   4p2d decode's recompute or outputs differ from a TP-4 prefill's bits).
 */
#include "kvf_engine_prefix.h"
#include "kvf_prefix_cache.h"
#include "kvf_array.h"
#include "kvf_device.h"
#include "kvf_log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

typedef struct kvf_pfx_chain {   /* r->prefix */
    uint64_t          source;    /* who computed its KV (kvf_prefix_key_t.source) */
    kvf_block_hash_t  root;
    kvf_block_hash_t *uh;        /* h_1 .. h_n */
    int               n, cap;
} kvf_pfx_chain_t;

typedef struct kvf_pfx_copy {
    int     slot;
    bool    save;                /* pages -> checkpoint; else checkpoint -> pages */
    int32_t blocks[2 * KVF_MAX_KV_GROUPS];   /* Mamba groups' blocks, then attention groups'
                                              * (-1: no partial block) */
} kvf_pfx_copy_t;

struct kvf_engine_prefix {
    kvf_prefix_cache_h  pc;
    kvf_tp_runner_h     runner;
    kvf_block_manager_h bm;
    const kvf_cache_layout_t *layout;
    uint8_t             digest[16];
    int                 unit, block_size, grid;     /* grid 0: no Mamba layers */
    int                 slots;                      /* pages per block */
    int                 n_mamba, n_attn;
    int                 mamba_g[KVF_MAX_KV_GROUPS], attn_g[KVF_MAX_KV_GROUPS];
    int                 attn_win[KVF_MAX_KV_GROUPS];  /* per attention group: its window,
                                                       * 0 for a full group */
    bool                sliding;                    /* some attention group slides */
    int                 n_full;                     /* attention groups without a window */
    size_t              page_size, ckpt_bytes;
    int                 n_ckpt;
    void               *store[KVF_COMM_MAX_RANKS];  /* per rank, on its pool's device */
    kvf_pfx_copy_t     *copies;
    int                 n_copies, cap_copies;
    int32_t            *ids;                        /* one block of each attention group */
    uint64_t            numerics;                   /* kvf_engine_numerics_class() */
    kvf_engine_prefix_stats_t st;
};

static int kvf_gcd(int a, int b)
{
    while (b != 0) {
        int t = a % b;
        a = b;
        b = t;
    }
    return a;
}

typedef struct {
    kvf_engine_prefix_h ep;
    bool                alloc;   /* allocate the store; else free it */
} kvf_pfx_store_job_t;

static kvf_status_t kvf_pfx_store_rank(void *arg, int rank, kvf_page_pool_h pool)
{
    kvf_pfx_store_job_t *job = arg;
    kvf_engine_prefix_h ep = job->ep;
    const kvf_device_t *dev = kvf_page_pool_device(pool);

    if (!job->alloc) {
        if (ep->store[rank] != NULL) {
            kvf_device_free(dev, ep->store[rank]);
            ep->store[rank] = NULL;
        }
        return KVF_OK;
    }
    /* zeroed once: the budget is committed at start (resident memory does not grow as
     * checkpoints fill the slots) */
    if ((kvf_device_alloc(dev, (size_t)ep->n_ckpt * ep->ckpt_bytes, &ep->store[rank]) !=
         KVF_KERN_OK) ||
        (kvf_device_memset(dev, ep->store[rank], 0, (size_t)ep->n_ckpt * ep->ckpt_bytes) !=
         KVF_KERN_OK)) {
        kvf_error("prefix cache: rank %d: cannot allocate %zu bytes of state checkpoints", rank,
                  (size_t)ep->n_ckpt * ep->ckpt_bytes);
        return KVF_ERR_NO_MEMORY;
    }
    return KVF_OK;
}

kvf_status_t kvf_engine_prefix_create(const kvf_engine_prefix_params_t *params,
                                      const uint8_t digest[16], kvf_tp_runner_h runner,
                                      kvf_block_manager_h bm, kvf_engine_prefix_h *ep_p)
{
    const kvf_cache_layout_t *lay = kvf_tp_runner_layout(runner);
    kvf_prefix_cache_params_t pp = {0};
    size_t budget = params->state_bytes;
    kvf_pfx_store_job_t job;
    kvf_engine_prefix_h ep;
    kvf_status_t status;

    ep = calloc(1, sizeof(*ep));
    if (ep == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    ep->runner = runner;
    ep->bm = bm;
    ep->layout = lay;
    memcpy(ep->digest, digest, 16);
    ep->block_size = kvf_block_manager_block_size(bm);
    ep->slots = lay->slots;
    ep->page_size = kvf_tp_runner_geometry(runner, 0)->page_size;
    for (int g = 0; g < lay->num_groups; ++g) {
        if (lay->groups[g].kind == KVF_GROUP_MAMBA) {
            ep->mamba_g[ep->n_mamba++] = g;
        } else {
            ep->attn_win[ep->n_attn] = lay->groups[g].window;
            ep->sliding = ep->sliding || (lay->groups[g].window > 0);
            ep->n_full += (lay->groups[g].window <= 0);
            ep->attn_g[ep->n_attn++] = g;
        }
    }
    ep->grid = (ep->n_mamba > 0) ?
               ((params->state_grid > 0) ? params->state_grid : KVF_PREFIX_STATE_GRID_DEFAULT) : 0;
    ep->unit = (ep->grid > 0) ? kvf_gcd(ep->block_size, ep->grid) : ep->block_size;
    ep->numerics = kvf_engine_prefix_numerics(runner, ep->grid);
    ep->ckpt_bytes = (size_t)(ep->n_mamba + ep->n_attn) * (size_t)ep->slots * ep->page_size;
    ep->ids = malloc((size_t)(ep->n_attn > 0 ? ep->n_attn : 1) * sizeof(int32_t));
    if ((ep->ids == NULL) || (ep->n_attn == 0)) {
        status = (ep->ids == NULL) ? KVF_ERR_NO_MEMORY : KVF_ERR_UNSUPPORTED;
        kvf_error("prefix cache: %s", (ep->ids == NULL) ? "no memory" :
                  "a model without attention layers is not supported");
        free(ep->ids);
        free(ep);
        return status;
    }
    if ((ep->grid > 0) && (budget == 0)) {   /* the default: a few, committed at start */
        size_t fit = KVF_PREFIX_STATE_BYTES_DEFAULT / ep->ckpt_bytes;
        ep->n_ckpt = (fit < 1) ? 1 : (fit > KVF_PREFIX_STATE_CKPTS_DEFAULT) ?
                     KVF_PREFIX_STATE_CKPTS_DEFAULT : (int)fit;
    } else if (ep->grid > 0) {
        ep->n_ckpt = (int)((budget / ep->ckpt_bytes > 1u << 20) ? 1u << 20 :
                           budget / ep->ckpt_bytes);
        if (ep->n_ckpt < 1) {
            kvf_error("prefix cache: --prefix-state-bytes %zu holds no Mamba state checkpoint "
                      "of %zu bytes per rank (state grid %d tokens): give at least %zu",
                      budget, ep->ckpt_bytes, ep->grid, ep->ckpt_bytes);
            free(ep->ids);
            free(ep);
            return KVF_ERR_INVALID_PARAM;
        }
    }
    pp.unit = ep->unit;
    pp.block_size = ep->block_size;
    pp.n_attn_groups = ep->n_attn;
    pp.windows = ep->attn_win;
    pp.state_grid = ep->grid;
    pp.state_slots = ep->n_ckpt;
    pp.bm = bm;
    status = kvf_prefix_cache_create(&pp, &ep->pc);
    if (status == KVF_OK) {
        kvf_prefix_cache_set_event_fn(ep->pc, params->event_fn, params->event_ctx);
    }
    if ((status == KVF_OK) && (ep->n_ckpt > 0)) {
        job = (kvf_pfx_store_job_t){ep, true};
        status = kvf_tp_runner_run_on_ranks(runner, kvf_pfx_store_rank, &job);
    }
    if (status != KVF_OK) {
        kvf_engine_prefix_destroy(ep);
        return status;
    }
    ep->st.state_slots = ep->n_ckpt;
    ep->st.hash_unit = ep->unit;
    ep->st.state_bytes = (ep->grid > 0) ? ep->ckpt_bytes : 0;
    kvf_log(KVF_LOG_INFO, KVF_SUB_MODEL, "prefix cache: on, hash unit %d tokens, block %d, "
            "state grid %d, %d checkpoints of %zu bytes per rank", ep->unit, ep->block_size,
            ep->grid, ep->n_ckpt, ep->grid > 0 ? ep->ckpt_bytes : 0);
    *ep_p = ep;
    return KVF_OK;
}

void kvf_engine_prefix_destroy(kvf_engine_prefix_h ep)
{
    kvf_pfx_store_job_t job = {ep, false};

    if (ep == NULL) {
        return;
    }
    (void)kvf_tp_runner_run_on_ranks(ep->runner, kvf_pfx_store_rank, &job);
    kvf_prefix_cache_destroy(ep->pc);
    free(ep->copies);
    free(ep->ids);
    free(ep);
}

void kvf_engine_prefix_forget(kvf_request_t *r)
{
    kvf_pfx_chain_t *c = r->prefix;

    if (c != NULL) {
        free(c->uh);
        free(c);
        r->prefix = NULL;
    }
}

/* r's chain over its first @a n_units complete units (fewer if its tokens end first). */
static kvf_status_t kvf_pfx_key(kvf_engine_prefix_h ep, kvf_request_t *r, int n_units,
                                kvf_prefix_key_t *key)
{
    kvf_pfx_chain_t *c = r->prefix;

    if (c == NULL) {
        c = calloc(1, sizeof(*c));
        if ((c == NULL) ||
            (kvf_block_hash_root(ep->digest, r->salt, r->salt_len, &c->root) != KVF_OK)) {
            free(c);
            return KVF_ERR_NO_MEMORY;
        }
        c->source = ep->numerics;   /* computed here; an import says otherwise */
        r->prefix = c;
    }
    n_units = (n_units < r->num_tokens / ep->unit) ? n_units : r->num_tokens / ep->unit;
    if (n_units > c->n) {
        if (KVF_ARRAY_GROW(c->uh, c->cap, n_units, 16) != KVF_OK) {
            return KVF_ERR_NO_MEMORY;
        }
        for (int k = c->n; k < n_units; ++k) {
            c->uh[k] = kvf_block_hash_next((k == 0) ? c->root : c->uh[k - 1],
                                           r->tokens + (size_t)k * (size_t)ep->unit, ep->unit);
        }
        c->n = n_units;
    }
    *key = (kvf_prefix_key_t){.root = c->root, .salt = r->salt, .salt_len = r->salt_len,
                              .tokens = r->tokens, .unit_hash = c->uh, .n_units = n_units,
                              .source = c->source};
    return KVF_OK;
}

/* Tokens of r whose cache state may be kept (the header's rule). */
static int kvf_pfx_cacheable(const kvf_engine_prefix_h ep, const kvf_request_t *r, int computed)
{
    return ((ep->grid > 0) && (computed > r->prompt_len)) ? r->prompt_len : computed;
}

static kvf_status_t kvf_pfx_copy_rank(void *arg, int rank, kvf_page_pool_h pool)
{
    kvf_engine_prefix_h ep = arg;
    const kvf_device_t *dev = kvf_page_pool_device(pool);
    const kvf_copy_kind_t kind = (dev->kind == KVF_DEVICE_CUDA) ? KVF_COPY_D2D : KVF_COPY_H2H;

    for (int c = 0; c < ep->n_copies; ++c) {
        const kvf_pfx_copy_t *cp = &ep->copies[c];
        uint8_t *ck = (uint8_t *)ep->store[rank] + (size_t)cp->slot * ep->ckpt_bytes;
        const int ngroups = ep->n_mamba + ep->n_attn;
        for (int pg = 0; pg < ngroups; ++pg) {
            if (cp->blocks[pg] < 0) {
                continue;   /* no partial attention block at this checkpoint */
            }
            for (int s = 0; s < ep->slots; ++s) {
                uint8_t *page = kvf_page_pool_page(pool, cp->blocks[pg], s);
                uint8_t *mem = ck + ((size_t)pg * (size_t)ep->slots + (size_t)s) * ep->page_size;
                if (kvf_device_memcpy(dev, cp->save ? mem : page, cp->save ? page : mem,
                                      ep->page_size, kind) != KVF_KERN_OK) {
                    kvf_error("prefix cache: rank %d: checkpoint page copy failed", rank);
                    return KVF_ERR_CUDA;
                }
            }
        }
    }
    return KVF_OK;
}

/* Queue a copy between checkpoint @a slot and r's state block and the attention block
 * holding token t - 1 when t is inside a block. */
static kvf_status_t kvf_pfx_queue(kvf_engine_prefix_h ep, const kvf_request_t *r, int slot,
                                  int t, bool save)
{
    kvf_pfx_copy_t *cp;

    if (KVF_ARRAY_GROW(ep->copies, ep->cap_copies, ep->n_copies + 1, 8) != KVF_OK) {
        return KVF_ERR_NO_MEMORY;
    }
    cp = &ep->copies[ep->n_copies++];
    cp->slot = slot;
    cp->save = save;
    for (int i = 0; i < ep->n_mamba; ++i) {
        cp->blocks[i] = r->blocks.blocks[ep->mamba_g[i]][0];
    }
    for (int i = 0; i < ep->n_attn; ++i) {
        cp->blocks[ep->n_mamba + i] = (t % ep->block_size != 0) ?
                                      r->blocks.blocks[ep->attn_g[i]][t / ep->block_size] : -1;
    }
    return KVF_OK;
}

static kvf_status_t kvf_pfx_flush(kvf_engine_prefix_h ep)
{
    kvf_status_t status = KVF_OK;

    if (ep->n_copies > 0) {
        status = kvf_tp_runner_run_on_ranks(ep->runner, kvf_pfx_copy_rank, ep);
        ep->n_copies = 0;
    }
    return status;
}

/* ep->ids = block @a j of every attention group of @a r; -1 for a sliding group's block
 * that is the manager's zero block (given back) or, with @a n > 0, lies wholly before the
 * window of a query at @a n (block j < floor((n - W) / B)). */
static void kvf_pfx_block_ids(kvf_engine_prefix_h ep, const kvf_request_t *r, int j, int n)
{
    const int32_t zero = kvf_block_manager_zero_block(ep->bm);

    for (int a = 0; a < ep->n_attn; ++a) {
        const int w = ep->attn_win[a];
        int32_t b = r->blocks.blocks[ep->attn_g[a]][j];
        const bool freed = (zero >= 0) && (b == zero);
        if ((w > 0) && (freed || ((n > w) && (j < (n - w) / ep->block_size)))) {
            b = -1;
        }
        ep->ids[a] = b;
    }
}

/* Share and allocate r's hit of @a hit tokens; false when the pool cannot hold its own
 * blocks now (r holds nothing then). */
static bool kvf_pfx_take(kvf_engine_prefix_h ep, kvf_request_t *r, const kvf_prefix_hit_t *hit)
{
    if ((kvf_block_manager_share(ep->bm, &r->blocks, hit->ids, hit->n_blocks) != KVF_OK) ||
        (kvf_block_manager_allocate(ep->bm, &r->blocks, hit->tokens) != KVF_OK)) {
        (void)kvf_block_manager_free(ep->bm, &r->blocks);
        return false;
    }
    return true;
}

kvf_status_t kvf_engine_prefix_admit(kvf_engine_prefix_h ep, kvf_request_t *r)
{
    kvf_prefix_key_t key;
    kvf_prefix_hit_t hit;
    kvf_status_t status;
    int max_hit;

    if ((r->state != KVF_REQ_WAITING) || (r->num_computed != 0) || (r->blocks.num_groups != 0) ||
        r->prefix_off) {
        return KVF_OK;   /* prefix_off: an import computed elsewhere, recomputed here now */
    }
    /* the last token is always computed (its logits sample); a hybrid model's cache holds
     * prompt tokens only */
    max_hit = r->num_tokens - 1;
    if ((ep->grid > 0) && (max_hit > r->prompt_len)) {
        max_hit = r->prompt_len;
    }
    if (r->sampling.want_prompt_logprobs) {
        max_hit = 0;   /* every prompt position's logits are asked for (vLLM skips it too) */
    }
    status = kvf_pfx_key(ep, r, r->num_tokens / ep->unit, &key);
    if (status != KVF_OK) {
        return KVF_OK;   /* no memory for the chain: computed without the cache */
    }
    kvf_prefix_cache_lookup(ep->pc, &key, max_hit, &hit);
    if ((hit.tokens > 0) && !kvf_pfx_take(ep, r, &hit)) {
        return KVF_OK;   /* the pool is full now: asked (and counted) again next step */
    }
    if (hit.tokens > 0) {
        if (hit.state_slot >= 0) {
            kvf_page_pool_h pools[KVF_COMM_MAX_RANKS];
            const int tp = kvf_tp_runner_tp_size(ep->runner);
            for (int i = 0; i < tp; ++i) {
                pools[i] = kvf_tp_runner_pool(ep->runner, i);
            }
            /* the partial block is zeroed before the checkpoint lands in it, not after */
            status = kvf_block_manager_zero_fresh(ep->bm, pools, tp);
            if (status == KVF_OK) {
                status = kvf_pfx_queue(ep, r, hit.state_slot, hit.tokens, false);
            }
            if (status == KVF_OK) {
                status = kvf_pfx_flush(ep);
            }
            if (status != KVF_OK) {
                (void)kvf_block_manager_free(ep->bm, &r->blocks);
                return status;
            }
            ep->st.states_restored++;
            ep->st.hit_state_tokens += (uint64_t)hit.tokens;
        }
        ep->st.hit_attn_tokens += (uint64_t)hit.n_blocks * (uint64_t)ep->block_size;
        r->num_computed = hit.tokens;
    }
    r->prefix_hit = hit.tokens;
    if (!r->prefix_counted) {   /* vLLM's counters: the request's tokens, its cached ones */
        r->prefix_counted = true;
        ep->st.queries += (uint64_t)r->num_tokens;
        ep->st.hits += (uint64_t)hit.tokens;
    }
    r->chunk_cut = 0;
    if (ep->grid > 0) {
        int c = r->prompt_len / ep->grid * ep->grid;
        if ((c > r->num_computed) && (c < r->prompt_len) &&
            !kvf_prefix_cache_has_state(ep->pc, &key, c)) {
            r->chunk_cut = c;   /* the checkpoint a next turn would hit */
        }
    }
    return KVF_OK;
}

kvf_status_t kvf_engine_prefix_after_step(kvf_engine_prefix_h ep, const kvf_sched_entry_t *plan,
                                          int np)
{
    for (int i = 0; i < np; ++i) {
        kvf_request_t *r = plan[i].req;
        const int start = plan[i].start, end = start + plan[i].num_tokens;
        const int lim = kvf_pfx_cacheable(ep, r, end), B = ep->block_size;
        kvf_prefix_key_t key;

        if (r->prefix_off || (lim <= start) ||
            (kvf_pfx_key(ep, r, lim / ep->unit, &key) != KVF_OK)) {
            continue;
        }
        for (int j = start / B; (j + 1) * B <= lim; ++j) {
            kvf_pfx_block_ids(ep, r, j, 0);
            (void)kvf_prefix_cache_add_block(ep->pc, &key, j, ep->ids);   /* best effort */
        }
        if ((ep->grid > 0) && (end == lim) && (end % ep->grid == 0)) {
            int slot = kvf_prefix_cache_add_state(ep->pc, &key, end);
            if (slot >= 0) {
                kvf_status_t status = kvf_pfx_queue(ep, r, slot, end, true);
                if (status != KVF_OK) {
                    return status;
                }
                ep->st.states_saved++;
            }
        }
    }
    return kvf_pfx_flush(ep);
}

void kvf_engine_prefix_get_stats(kvf_engine_prefix_h ep, kvf_engine_prefix_stats_t *stats_p)
{
    kvf_prefix_cache_stats_t cs;

    kvf_prefix_cache_get_stats(ep->pc, &cs);
    *stats_p = ep->st;
    stats_p->states_evicted = cs.states_evicted;
    stats_p->blocks_evicted = cs.blocks_evicted;
    stats_p->cached_blocks = cs.cached_blocks;
    stats_p->states = cs.states;
}

/* ---- decode: imported requests (docs/PREFIX_CACHE.md §6) ------------------------------ */

uint64_t kvf_engine_prefix_numerics(kvf_tp_runner_h runner, int state_grid)
{
    static const char *const knobs[] = {"KVF_GPU_WEIGHTS", "KVF_GPU_GEMM", "KVF_GPU_ATTN",
                                        "KVF_MAMBA_SCAN"};
    const kvf_device_t *dev = kvf_page_pool_device(kvf_tp_runner_pool(runner, 0));
    char desc[512];
    /* the grid: a GPU's chunked Mamba2 scan rounds a narrow state on it */
    int n = snprintf(desc, sizeof(desc), "tp=%d device=%s grid=%d", kvf_tp_runner_tp_size(runner),
                     kvf_device_kind_name(dev->kind), state_grid);
    uint64_t h;

    /* the environment switches that change a GPU forward's bits (README: kernels) */
    for (size_t i = 0; (i < sizeof(knobs) / sizeof(knobs[0])) && (n < (int)sizeof(desc)); ++i) {
        const char *v = getenv(knobs[i]);
        n += snprintf(desc + n, sizeof(desc) - (size_t)n, " %s=%s", knobs[i], v ? v : "");
    }
    h = XXH3_64bits(desc, strlen(desc));
    return (h != 0) ? h : 1;   /* 0 stays "unknown" on the wire */
}

kvf_status_t kvf_engine_prefix_import(kvf_engine_prefix_h ep, kvf_request_t *r,
                                      uint64_t source)
{
    kvf_prefix_key_t key;
    kvf_prefix_hit_t hit = {0};

    r->prefix_counted = true;   /* counted here, once */
    r->prefix_off = true;
    r->prefix_hit = 0;
    ep->st.imports++;
    ep->st.queries += (uint64_t)r->prompt_len;
    if (source == 0) {
        ep->st.import_unknown_source++;   /* a prefill that does not say: a full pull */
        ep->st.pulled_tokens += (uint64_t)r->prompt_len;
        return KVF_OK;
    }
    if (kvf_pfx_key(ep, r, r->prompt_len / ep->unit, &key) != KVF_OK) {
        ep->st.pulled_tokens += (uint64_t)r->prompt_len;
        return KVF_OK;   /* no memory for the chain: a full pull, nothing kept */
    }
    ((kvf_pfx_chain_t *)r->prefix)->source = source;
    key.source = source;
    key.blocks_only = true;   /* the Mamba state always comes from prefill */
    kvf_prefix_cache_lookup(ep->pc, &key, r->prompt_len, &hit);
    if ((hit.n_blocks > 0) &&
        (kvf_block_manager_share(ep->bm, &r->blocks, hit.ids, hit.n_blocks) != KVF_OK)) {
        (void)kvf_block_manager_free(ep->bm, &r->blocks);
        hit.n_blocks = 0;
    }
    r->prefix_hit = hit.n_blocks * ep->block_size;
    /* its outputs' blocks are this engine's to index only when prefill's numerics are
     * this engine's: a decode step attends to the pulled KV */
    r->prefix_off = (source != ep->numerics);
    ep->st.hits += (uint64_t)r->prefix_hit;
    ep->st.hit_attn_tokens += (uint64_t)r->prefix_hit;
    ep->st.pulled_tokens += (uint64_t)(r->prompt_len - r->prefix_hit);
    return KVF_OK;
}

void kvf_engine_prefix_imported(kvf_engine_prefix_h ep, kvf_request_t *r)
{
    kvf_prefix_key_t key;
    const int B = ep->block_size;

    if ((r->prefix == NULL) || (kvf_pfx_key(ep, r, r->prompt_len / ep->unit, &key) != KVF_OK)) {
        return;   /* unknown source: nothing of it is kept */
    }
    if ((r->import_zeroed > r->prefix_hit) && !ep->sliding) {
        return;   /* zeroed blocks in a group without a window: none is content */
    }
    for (int a = 0; (ep->n_full == 0) && (a < ep->n_attn); ++a) {
        const int w = ep->attn_win[a];
        if ((r->prompt_len > w) && ((r->prompt_len - w) / B > r->prefix_hit / B)) {
            return;   /* every group slides and the first block after the hit holds no
                       * content: nothing after it would be reachable */
        }
    }
    /* a sliding group's blocks before the prompt's window are no content here whatever the
     * pull did (zeroed by a windowed pull, which zeroes nothing else; prefill's own may be
     * fresh zeros after its hit): indexed as -1 */
    for (int j = r->prefix_hit / B; (j + 1) * B <= r->prompt_len; ++j) {
        kvf_pfx_block_ids(ep, r, j, r->prompt_len);
        (void)kvf_prefix_cache_add_block(ep->pc, &key, j, ep->ids);   /* best effort */
    }
}
