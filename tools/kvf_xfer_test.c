/*
 * kvf xfer-test and kvf bench: a real prefill -> decode KV pull between two
 * processes, through the KV connector the daemons use (kvf_connector.h:
 * register_pool, serve, handshake, start_pull, poll, notify_release,
 * poll_release), with the whole control path of docs/ARCHITECTURE.md §3 except the
 * proxy (a pipe from the prefill child carries the packed transfer params,
 * which the decode side reads with the same decoder kvf-decode uses).
 *
 * Design. The decode process forks the prefill instance before touching UCX
 * or ZeroMQ (nothing to inherit). Each side creates one connector and runs
 * one thread per TP rank, each registering a host pool of num_blocks *
 * slots * page_size bytes. Prefill poisons its pool with one NaN pattern and
 * writes, into the request's pages only, values that are a pure function of
 * (layer, global KV head or conv channel or SSM head, token, element), so
 * replicated heads hold identical bytes and any misplaced byte shows. Decode
 * poisons its pool with another NaN pattern, handshakes, pulls on every
 * rank (the connector plans, posts, zeroes tails and sends the releases;
 * prefill ranks wait for them with poll_release and exit once all their
 * readers have released), then rebuilds the expected content of EVERY page
 * of its pool (pattern, zeroed tail, untouched Mamba padding, untouched
 * unrelated pages) and compares bytes.
 *
 * Fault flags (hidden) make the prefill advertise a wrong protocol version,
 * fingerprint or region length (it then serves its connector's metadata,
 * altered, on a side channel of its own: a lying peer is not a daemon), send
 * an out-of-range block id, or get killed by decode after the first window
 * of GETs, so refusal and robustness tests drive the same connector code as
 * the happy path.
 *
 * The bench times the pull through the connector and, as a reference, a
 * raw GET of the same bytes as one contiguous range per prefill rank read,
 * on a second, bare UCX agent per rank (the only UCX calls made here, and
 * never on the KV path).
 */
#include "kvf_xfer_tools.h"

#include "kvf_config.h"
#include "kvf_connector.h"
#include "kvf_connector_ucx.h"
#include "kvf_handshake.h"
#include "kvf_layout.h"
#include "kvf_log.h"
#include "kvf_tp_map.h"
#include "kvf_side_channel.h"
#include "kvf_ucx_agent.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define XT_POISON_PREFILL 0x7fc1u   /* NaN as bf16 and fp16; NaN fp32 as a pair */
#define XT_POISON_DECODE  0xffc3u
#define XT_MAX_ITERS      64

typedef struct xt_opts {
    char    model[KVF_CONFIG_STR_MAX];
    char    layout[KVF_CONFIG_STR_MAX];
    int     tokens;
    int     prefill_block_size;
    int     decode_block_size;
    char    prefill_kernel_sizes[KVF_CONFIG_STR_MAX];
    char    decode_kernel_sizes[KVF_CONFIG_STR_MAX];
    int     user_block_size;
    char    kv_dtype[KVF_CONFIG_STR_MAX];
    char    prefill_kv_dtype[KVF_CONFIG_STR_MAX];
    char    ssm_dtype[KVF_CONFIG_STR_MAX];
    char    prefill_ssm_dtype[KVF_CONFIG_STR_MAX];
    char    conv_dtype[KVF_CONFIG_STR_MAX];
    char    prefill_conv_dtype[KVF_CONFIG_STR_MAX];
    int     spare_blocks;
    int64_t timeout_ms;
    int     batch_descs;
    bool    no_coalesce;
    bool    verify;
    int     iters;
    /* hidden fault injection */
    int     fault_version;
    bool    fault_fingerprint;
    bool    fault_region_len;
    bool    fault_block_id;
    bool    fault_kill_prefill;
    /* bench only */
    char    descs_out[KVF_CONFIG_STR_MAX];
    char    pool_alloc[KVF_CONFIG_STR_MAX];
    bool    ucx_pools;   /* pool_alloc == "ucx" */
    bool    copy_limit;
} xt_opts_t;

#define XT_FIELD(_n, _d, _h, _f, _t, _fl) {_n, _d, _h, offsetof(xt_opts_t, _f), _t, _fl}
#define XT_COMMON_FIELDS                                                                      \
    XT_FIELD("PREFILL_BLOCK_SIZE", "0", "prefill logical block size (0: derive)",            \
             prefill_block_size, KVF_CONFIG_TYPE_INT, 0),                                     \
    XT_FIELD("DECODE_BLOCK_SIZE", "0", "decode logical block size (0: derive)",              \
             decode_block_size, KVF_CONFIG_TYPE_INT, 0),                                      \
    XT_FIELD("PREFILL_KERNEL_SIZES", "MultipleOf(16)",                                        \
             "kernel block sizes the prefill attention kernel accepts", prefill_kernel_sizes, \
             KVF_CONFIG_TYPE_STRING, 0),                                                      \
    XT_FIELD("DECODE_KERNEL_SIZES", "MultipleOf(16)",                                         \
             "kernel block sizes the decode attention kernel accepts", decode_kernel_sizes,   \
             KVF_CONFIG_TYPE_STRING, 0),                                                      \
    XT_FIELD("USER_BLOCK_SIZE", "16", "alignment unit hint (both sides)", user_block_size,   \
             KVF_CONFIG_TYPE_INT, 0),                                                         \
    XT_FIELD("KV_DTYPE", "bf16", "decode KV cache dtype", kv_dtype, KVF_CONFIG_TYPE_STRING, 0), \
    XT_FIELD("PREFILL_KV_DTYPE", "same", "prefill KV cache dtype (same: as decode)",         \
             prefill_kv_dtype, KVF_CONFIG_TYPE_STRING, 0),                                    \
    XT_FIELD("SSM_DTYPE", "auto", "decode SSM state dtype (auto: the model's)", ssm_dtype,   \
             KVF_CONFIG_TYPE_STRING, 0),                                                      \
    XT_FIELD("PREFILL_SSM_DTYPE", "same", "prefill SSM state dtype", prefill_ssm_dtype,      \
             KVF_CONFIG_TYPE_STRING, 0),                                                      \
    XT_FIELD("CONV_DTYPE", "auto", "decode conv state dtype (auto: the model's)", conv_dtype, \
             KVF_CONFIG_TYPE_STRING, 0),                                                      \
    XT_FIELD("PREFILL_CONV_DTYPE", "same", "prefill conv state dtype", prefill_conv_dtype,   \
             KVF_CONFIG_TYPE_STRING, 0),                                                      \
    XT_FIELD("SPARE_BLOCKS", "3", "pool blocks beyond the request, per side", spare_blocks,  \
             KVF_CONFIG_TYPE_INT, 0),                                                         \
    XT_FIELD("TIMEOUT", "5s", "bound on every wait (handshake, transfer, release)",          \
             timeout_ms, KVF_CONFIG_TYPE_TIME, 0),                                            \
    XT_FIELD("BATCH_DESCS", "0", "GETs in flight per prefill rank read (0: all at once)",    \
             batch_descs, KVF_CONFIG_TYPE_INT, 0),                                            \
    XT_FIELD("POOL_ALLOC", "ucx", "pool memory: ucx (the connector allocates it: shared "   \
             "memory a local peer reads by a copy; the daemons' default) or heap "          \
             "(aligned_alloc)", \
             pool_alloc, KVF_CONFIG_TYPE_STRING, 0),                                         \
    XT_FIELD("NO_COALESCE", "no", "one descriptor per run (planner debugging)", no_coalesce, \
             KVF_CONFIG_TYPE_BOOL, 0),                                                        \
    XT_FIELD("FAULT_VERSION", "0", "prefill advertises this protocol version", fault_version, \
             KVF_CONFIG_TYPE_INT, KVF_CONFIG_FLAG_HIDDEN),                                    \
    XT_FIELD("FAULT_FINGERPRINT", "no", "prefill advertises a different model fingerprint",  \
             fault_fingerprint, KVF_CONFIG_TYPE_BOOL, KVF_CONFIG_FLAG_HIDDEN),                \
    XT_FIELD("FAULT_REGION_LEN", "no", "prefill advertises a region one page too long",      \
             fault_region_len, KVF_CONFIG_TYPE_BOOL, KVF_CONFIG_FLAG_HIDDEN),                 \
    XT_FIELD("FAULT_BLOCK_ID", "no", "prefill sends an out-of-range block id",               \
             fault_block_id, KVF_CONFIG_TYPE_BOOL, KVF_CONFIG_FLAG_HIDDEN),                   \
    XT_FIELD("FAULT_KILL_PREFILL", "no", "decode kills the prefill after the first batch",   \
             fault_kill_prefill, KVF_CONFIG_TYPE_BOOL, KVF_CONFIG_FLAG_HIDDEN)

static const kvf_config_field_t xt_test_table[] = {
    XT_FIELD("MODEL", "", "model config.json, or a folder holding one", model,
             KVF_CONFIG_TYPE_STRING, 0),
    XT_FIELD("LAYOUT", "1p1d", "P/D layout XpYd: prefill TP X, decode TP Y", layout,
             KVF_CONFIG_TYPE_STRING, 0),
    XT_COMMON_FIELDS,
    XT_FIELD("TOKENS", "200", "prompt tokens of the request", tokens, KVF_CONFIG_TYPE_INT, 0),
    XT_FIELD("VERIFY", "yes", "verify every byte of the decode pool", verify,
             KVF_CONFIG_TYPE_BOOL, 0),
    XT_FIELD("ITERS", "1", "transfers to time", iters, KVF_CONFIG_TYPE_INT,
             KVF_CONFIG_FLAG_HIDDEN),
    {NULL, NULL, NULL, 0, 0, 0},
};

static const kvf_config_field_t xt_bench_table[] = {
    XT_FIELD("MODEL", "", "model config.json (default: nemotron-nano-9b-v2 from "
             "$KVF_SHARED_MODELS or tests/data/models)", model, KVF_CONFIG_TYPE_STRING, 0),
    XT_FIELD("LAYOUT", "4p2d", "P/D layout XpYd: prefill TP X, decode TP Y", layout,
             KVF_CONFIG_TYPE_STRING, 0),
    XT_COMMON_FIELDS,
    XT_FIELD("TOKENS", "8192", "prompt tokens of the request", tokens, KVF_CONFIG_TYPE_INT, 0),
    XT_FIELD("VERIFY", "no", "verify every byte after the first pull", verify,
             KVF_CONFIG_TYPE_BOOL, 0),
    XT_FIELD("ITERS", "5", "timed pulls (the median is reported)", iters, KVF_CONFIG_TYPE_INT,
             0),
    XT_FIELD("DESCS_OUT", "", "write the request's descriptor lists (JSON) to this file",
             descs_out, KVF_CONFIG_TYPE_STRING, 0),
    XT_FIELD("COPY_LIMIT", "yes", "also time memcpy of the same descriptor lists, one thread "
             "per decode rank (this machine's copy limit)", copy_limit, KVF_CONFIG_TYPE_BOOL, 0),
    {NULL, NULL, NULL, 0, 0, 0},
};

/* ---------------------------------------------------------------------- */

typedef struct xt_ctx xt_ctx_t;

typedef struct xt_side {
    bool                 prefill;
    int                  tp;
    kvf_cache_params_t   params;
    kvf_rank_geometry_t *geom;                       /* [tp] */
    int64_t              num_blocks;                 /* per rank */
    int32_t             *ids[KVF_MAX_KV_GROUPS];     /* the request's blocks per group */
    int                  num_ids[KVF_MAX_KV_GROUPS];
    char                 engine_id[KVF_ENGINE_ID_MAX];
} xt_side_t;

typedef struct xt_rank {
    xt_ctx_t        *ctx;
    xt_side_t       *side;
    int              rank;
    pthread_t        thread;
    uint8_t         *pool;          /* heap: freed after the connector is destroyed;
                                       ucx_pools: the connector's, gone with it */
    size_t           pool_len;

    /* the raw reference (bench only): a bare agent with the pool registered again */
    kvf_ucx_agent_h  raw_agent;
    int              raw_region;
    kvf_rank_meta_t  raw_meta;
    kvf_ucx_peer_h   raw_peers[KVF_XFER_MAX_TP];

    /* results */
    kvf_status_t     status;
    kvf_status_t     start_status;  /* what start_pull returned */
    char             err[256];
    uint64_t         ops_posted;    /* GET descriptors handed to the connector, + raw GETs */
    uint64_t         bytes, zero_bytes, raw_bytes;
    size_t           descs;
    int              reads;
    uint64_t         pages_checked, elements_checked;
    uint64_t         t_start[XT_MAX_ITERS + 2], t_post[XT_MAX_ITERS + 2];   /* per pull */
    uint64_t         t_end[XT_MAX_ITERS + 2];
    uint64_t         t_raw_start[XT_MAX_ITERS], t_raw_end[XT_MAX_ITERS];
    uint64_t         t_fail;
    char             transports[640];
} xt_rank_t;

struct xt_ctx {
    xt_opts_t                  o;
    bool                       bench;
    kvf_model_config_t         cfg;
    kvf_cache_layout_t        *layout;
    kvf_layout_t               lay;
    xt_side_t                  pre, dec;
    xt_rank_t                 *ranks;           /* [tp] of this process's side */
    const kvf_connector_ops_t *xops;
    kvf_connector_h            conn;
    int                        npulls;          /* pulls of the one request */
    pthread_barrier_t          barrier;
    int                        go;              /* decode: 1 after a good handshake */
    kvf_xfer_params_msg_t      pm;              /* decode: as decoded from the pipe */
    kvf_handshake_reply_t      raw;             /* decode: prefill's raw agents (bench) */
    pid_t                      child;
    uint64_t                   t_kill;
};

/* ---- pattern ---------------------------------------------------------- */

static uint64_t xt_mix(uint64_t h, uint64_t v)
{
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h ^= h >> 31;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 29;
    return h;
}

/* Nonzero, exactly representable in fp32/bf16/fp16: +-(1..240)/8. */
static float xt_value(uint32_t kind, uint32_t layer, uint32_t idx, uint64_t token, uint32_t elt)
{
    uint64_t h = xt_mix(xt_mix(xt_mix(xt_mix(xt_mix(0x6b7666ull, kind), layer), idx), token),
                        elt);
    float v = (float)((h % 240) + 1) / 8.0f;
    return (h >> 63) ? -v : v;
}

static void xt_poison(uint8_t *p, size_t len, uint16_t word)
{
    size_t i;
    for (i = 0; i + 1 < len; i += 2) {
        memcpy(p + i, &word, 2);
    }
    if (i < len) {
        p[i] = (uint8_t)word;
    }
}

/*
 * Write the expected content of one page: attention (group kind attention,
 * logical block index bi of the request) or Mamba state. @a page must
 * already hold the background (poison, or zeros for decode attention pages).
 */
static uint64_t xt_fill_attn(const xt_ctx_t *c, const kvf_rank_geometry_t *g, int layer,
                             int64_t bi, uint8_t *page)
{
    const kvf_model_config_t *cfg = &c->cfg;
    int64_t t0 = bi * g->block_size;
    uint64_t n = 0;

    for (int tok = 0; tok < g->block_size; ++tok) {
        int64_t t = t0 + tok;
        if (t >= c->o.tokens) {
            break;
        }
        for (int kv = 0; kv < 2; ++kv) {
            for (int h = 0; h < g->shard.kv_heads; ++h) {
                int gh = g->shard.kv_head_start + h;
                for (int d = 0; d < cfg->head_dim; ++d) {
                    size_t off = kvf_attn_offset(g, cfg, tok, kv, h, d);
                    kvf_dtype_store(page + off, g->kv_dtype, 0,
                                    xt_value((uint32_t)kv, (uint32_t)layer, (uint32_t)gh,
                                             (uint64_t)t, (uint32_t)d));
                    n++;
                }
            }
        }
    }
    return n;
}

static uint64_t xt_fill_mamba(const xt_ctx_t *c, const kvf_rank_geometry_t *g, int layer,
                              uint8_t *page)
{
    const kvf_model_config_t *cfg = &c->cfg;
    const kvf_shard_t *s = &g->shard;
    uint64_t n = 0;

    for (int ch = 0; ch < s->conv_dim; ++ch) {
        int part, global;
        if (ch < s->conv_x_channels) {
            part = 0;
            global = s->conv_x_start + ch;
        } else if (ch < s->conv_x_channels + s->conv_bc_channels) {
            part = 1;
            global = s->group_start * cfg->ssm_state_size + (ch - s->conv_x_channels);
        } else {
            part = 2;
            global = s->group_start * cfg->ssm_state_size +
                     (ch - s->conv_x_channels - s->conv_bc_channels);
        }
        for (int j = 0; j < cfg->conv_kernel - 1; ++j) {
            kvf_dtype_store(page + kvf_conv_offset(g, cfg, ch, j), g->conv_dtype, 0,
                            xt_value(2u + (uint32_t)part, (uint32_t)layer, (uint32_t)global,
                                     (uint64_t)c->o.tokens, (uint32_t)j));
            n++;
        }
    }
    for (int h = 0; h < s->mamba_heads; ++h) {
        int gh = s->mamba_head_start + h;
        for (int p = 0; p < cfg->mamba_head_dim; ++p) {
            for (int k = 0; k < cfg->ssm_state_size; ++k) {
                kvf_dtype_store(page + kvf_ssm_offset(g, cfg, h, p, k), g->ssm_dtype, 0,
                                xt_value(5u, (uint32_t)layer, (uint32_t)gh, (uint64_t)c->o.tokens,
                                         (uint32_t)(p * cfg->ssm_state_size + k)));
                n++;
            }
        }
    }
    return n;
}

static size_t xt_page_off(const kvf_rank_geometry_t *g, int slots, int32_t block, int slot)
{
    return ((size_t)block * (size_t)slots + (size_t)slot) * g->page_size;
}

/* Prefill: fill the request's pages (tokens < N, Mamba state); rest stays poisoned. */
static uint64_t xt_prefill_fill(const xt_ctx_t *c, const xt_side_t *side,
                                const kvf_rank_geometry_t *g, uint8_t *pool)
{
    const kvf_cache_layout_t *l = c->layout;
    uint64_t n = 0;

    for (int gi = 0; gi < l->num_groups; ++gi) {
        const kvf_kv_group_t *grp = &l->groups[gi];
        for (int j = 0; j < grp->num_layers; ++j) {
            if (grp->kind == KVF_GROUP_ATTENTION) {
                for (int bi = 0; bi < side->num_ids[gi]; ++bi) {
                    n += xt_fill_attn(c, g, grp->layers[j], bi,
                                      pool + xt_page_off(g, l->slots, side->ids[gi][bi], j));
                }
            } else {
                int32_t b = side->ids[gi][side->num_ids[gi] - 1];
                n += xt_fill_mamba(c, g, grp->layers[j], pool + xt_page_off(g, l->slots, b, j));
            }
        }
    }
    return n;
}

/* Decode: compare every page of the pool with what it must hold. */
static kvf_status_t xt_decode_verify(const xt_ctx_t *c, xt_rank_t *r)
{
    const kvf_cache_layout_t *l = c->layout;
    const kvf_rank_geometry_t *g = &c->dec.geom[r->rank];
    int64_t nb = c->dec.num_blocks;
    int *owner = NULL;       /* [nb * slots]: group index owning the page, -1 */
    int *obi = NULL;         /* logical block index in that group */
    uint8_t *expect = malloc(g->page_size);
    kvf_status_t status = KVF_OK;

    owner = malloc(sizeof(int) * (size_t)nb * (size_t)l->slots);
    obi = malloc(sizeof(int) * (size_t)nb * (size_t)l->slots);
    if ((expect == NULL) || (owner == NULL) || (obi == NULL)) {
        status = KVF_ERR_NO_MEMORY;
        goto out;
    }
    for (int64_t i = 0; i < nb * l->slots; ++i) {
        owner[i] = -1;
    }
    for (int gi = 0; gi < l->num_groups; ++gi) {
        const kvf_kv_group_t *grp = &l->groups[gi];
        for (int bi = 0; bi < c->dec.num_ids[gi]; ++bi) {
            if ((grp->kind == KVF_GROUP_MAMBA) && (bi != c->dec.num_ids[gi] - 1)) {
                continue;
            }
            for (int j = 0; j < grp->num_layers; ++j) {
                int64_t pi = (int64_t)c->dec.ids[gi][bi] * l->slots + j;
                owner[pi] = gi;
                obi[pi] = bi;
            }
        }
    }
    for (int64_t pi = 0; pi < nb * l->slots; ++pi) {
        const uint8_t *page = r->pool + (size_t)pi * g->page_size;
        int gi = owner[pi];
        int slot = (int)(pi % l->slots);

        if (gi < 0) {
            xt_poison(expect, g->page_size, XT_POISON_DECODE);
        } else if (l->groups[gi].kind == KVF_GROUP_ATTENTION) {
            memset(expect, 0, g->page_size);
            r->elements_checked += xt_fill_attn(c, g, l->groups[gi].layers[slot], obi[pi],
                                                expect);
        } else {
            xt_poison(expect, g->page_size, XT_POISON_DECODE);
            r->elements_checked += xt_fill_mamba(c, g, l->groups[gi].layers[slot], expect);
        }
        r->pages_checked++;
        if (memcmp(page, expect, g->page_size) != 0) {
            size_t k = 0;
            while (page[k] == expect[k]) {
                k++;
            }
            snprintf(r->err, sizeof(r->err),
                     "decode rank %d: page (block %" PRId64 ", slot %d, %s) differs at byte "
                     "%zu of %zu: got 0x%02x expected 0x%02x", r->rank, pi / l->slots, slot,
                     (gi < 0) ? "outside the request" :
                     ((l->groups[gi].kind == KVF_GROUP_ATTENTION) ? "attention" : "mamba"),
                     k, g->page_size, page[k], expect[k]);
            status = KVF_ERR_INVALID_PARAM;
            goto out;
        }
    }
out:
    free(obi);
    free(owner);
    free(expect);
    return status;
}

/* ---- setup shared by both sides ---------------------------------------- */

/* "same" (the prefill side's default) reads like "auto": the other side's dtype */
static int xt_dtype(const char *flag, const char *text, kvf_dtype_t same, kvf_dtype_t *out)
{
    if (strcmp(text, "same") == 0) {
        text = "auto";
    }
    return (kvf_config_dtype(flag, text, same, KVF_CONFIG_DTYPE_AUTO | KVF_CONFIG_DTYPE_FP8,
                             out) == KVF_OK) ? 0 : -1;
}

static uint64_t xt_rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/*
 * Geometry of every rank of one side, pool size and the request's block ids
 * (a seeded permutation, so ids are scattered and never contiguous by luck).
 */
static kvf_status_t xt_side_init(xt_ctx_t *c, xt_side_t *side, bool prefill)
{
    const kvf_cache_layout_t *l = c->layout;
    int64_t need = 0, covered;
    int32_t *perm;
    uint64_t rng = prefill ? 0x1234567ull : 0x7654321ull;
    int64_t k = 0;
    kvf_status_t status;

    side->prefill = prefill;
    side->tp = prefill ? c->lay.prefill_tp : c->lay.decode_tp;
    snprintf(side->engine_id, sizeof(side->engine_id), "%s-%d",
             prefill ? "prefill" : "decode", (int)getpid());
    side->geom = calloc((size_t)side->tp, sizeof(*side->geom));
    if (side->geom == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    for (int r = 0; r < side->tp; ++r) {
        status = kvf_rank_geometry_compute(&c->cfg, &side->params, side->tp, r, &side->geom[r]);
        if (status != KVF_OK) {
            kvf_error("%s rank %d: no valid geometry: %s", prefill ? "prefill" : "decode", r,
                      kvf_status_str(status));
            return status;
        }
    }
    /* decode allocates room for the first generated token too */
    covered = prefill ? c->o.tokens : (int64_t)c->o.tokens + 1;
    for (int gi = 0; gi < l->num_groups; ++gi) {
        side->num_ids[gi] = (l->groups[gi].kind == KVF_GROUP_ATTENTION) ?
            (int)((covered + side->geom[0].block_size - 1) / side->geom[0].block_size) : 1;
        need += side->num_ids[gi];
    }
    side->num_blocks = need + c->o.spare_blocks;
    perm = malloc(sizeof(*perm) * (size_t)side->num_blocks);
    if (perm == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    for (int64_t i = 0; i < side->num_blocks; ++i) {
        perm[i] = (int32_t)i;
    }
    for (int64_t i = side->num_blocks - 1; i > 0; --i) {
        int64_t j = (int64_t)(xt_rng_next(&rng) % (uint64_t)(i + 1));
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int gi = 0; gi < l->num_groups; ++gi) {
        side->ids[gi] = malloc(sizeof(int32_t) * (size_t)side->num_ids[gi]);
        if (side->ids[gi] == NULL) {
            free(perm);
            return KVF_ERR_NO_MEMORY;
        }
        for (int i = 0; i < side->num_ids[gi]; ++i) {
            side->ids[gi][i] = perm[k++];
        }
    }
    free(perm);
    return KVF_OK;
}

static void xt_side_cleanup(xt_side_t *side)
{
    for (int gi = 0; gi < KVF_MAX_KV_GROUPS; ++gi) {
        free(side->ids[gi]);
    }
    free(side->geom);
}

/* Agent + pool + metadata of one rank (runs on the rank's thread). */
/* ---- connector and ranks (both sides) ----------------------------------- */

static kvf_status_t xt_conn_create(xt_ctx_t *c, const xt_side_t *side)
{
    kvf_connector_config_t cc;
    kvf_status_t status;

    c->xops = kvf_connector_ucx_ops();
    status = kvf_connector_ops_check(c->xops);
    if (status != KVF_OK) {
        return status;
    }
    memset(&cc, 0, sizeof(cc));
    cc.field_mask = KVF_CONNECTOR_CONFIG_FIELD_TIMEOUT_MS |
                    KVF_CONNECTOR_CONFIG_FIELD_BATCH_DESCS |
                    KVF_CONNECTOR_CONFIG_FIELD_PLAN_FLAGS;
    cc.engine_id = side->engine_id;
    cc.role = side->prefill ? KVF_CONNECTOR_ROLE_PREFILL : KVF_CONNECTOR_ROLE_DECODE;
    cc.tp_size = side->tp;
    cc.cfg = &c->cfg;
    cc.timeout_ms = (uint32_t)c->o.timeout_ms;
    cc.batch_descs = (uint32_t)c->o.batch_descs;
    cc.plan_flags = c->o.no_coalesce ? KVF_XFER_PLAN_FLAG_NO_COALESCE : 0;
    return c->xops->create(&cc, &c->conn);
}

/* The raw reference's bare agent: the same pool registered a second time. */
static kvf_status_t xt_raw_setup(xt_rank_t *r)
{
    xt_ctx_t *c = r->ctx;
    kvf_ucx_agent_params_t ap;
    kvf_rank_meta_t *m = &r->raw_meta;
    char name[64];
    kvf_status_t status;

    snprintf(name, sizeof(name), "%s rank %d raw", r->side->prefill ? "prefill" : "decode",
             r->rank);
    memset(&ap, 0, sizeof(ap));
    ap.field_mask = KVF_UCX_AGENT_PARAM_FIELD_NAME | KVF_UCX_AGENT_PARAM_FIELD_TIMEOUT_MS;
    ap.name = name;
    ap.timeout_ms = (uint32_t)c->o.timeout_ms;
    status = kvf_ucx_agent_create(&ap, &r->raw_agent);
    if (status == KVF_OK) {
        status = kvf_ucx_agent_mem_register(r->raw_agent, r->pool, r->pool_len, &r->raw_region);
    }
    if (status != KVF_OK) {
        return status;
    }
    memset(m, 0, sizeof(*m));
    snprintf(m->engine_id, sizeof(m->engine_id), "%s", r->side->engine_id);
    m->protocol_version = KVF_XFER_PROTOCOL_VERSION;
    m->tp_rank = r->rank;
    m->tp_size = r->side->tp;
    m->block_size = m->kernel_block_size = 16;
    m->page_size = r->pool_len;
    m->slots = 1;
    m->num_blocks = 1;
    snprintf(m->layout_tag, sizeof(m->layout_tag), "%s", KVF_LAYOUT_TAG_HND);
    m->num_regions = 1;
    status = kvf_ucx_agent_region_meta(r->raw_agent, r->raw_region, &m->regions[0]);
    if (status == KVF_OK) {
        status = kvf_ucx_agent_worker_address(r->raw_agent, m->worker_addr,
                                              sizeof(m->worker_addr), &m->worker_addr_len);
    }
    return status;
}

/* Pool, pattern and registration of one rank (runs on the rank's thread). */
static kvf_status_t xt_rank_setup(xt_rank_t *r)
{
    xt_ctx_t *c = r->ctx;
    xt_side_t *side = r->side;
    const kvf_rank_geometry_t *g = &side->geom[r->rank];
    kvf_connector_pool_t cp;
    kvf_status_t status;

    r->pool_len = (size_t)side->num_blocks * (size_t)c->layout->slots * g->page_size;
    memset(&cp, 0, sizeof(cp));
    cp.tp_rank = r->rank;
    cp.len = r->pool_len;
    cp.num_blocks = side->num_blocks;
    cp.params = side->params;
    if (c->o.ucx_pools) {
        void *base = NULL;
        status = c->xops->alloc_pool(c->conn, &cp, &base);
        r->pool = base;
    } else {
        r->pool = aligned_alloc(4096, (r->pool_len + 4095) & ~(size_t)4095);
        if (r->pool == NULL) {
            return KVF_ERR_NO_MEMORY;
        }
        cp.base = r->pool;
        status = c->xops->register_pool(c->conn, &cp);
    }
    if (status != KVF_OK) {
        snprintf(r->err, sizeof(r->err), "%s rank %d: %s failed: %s",
                 side->prefill ? "prefill" : "decode", r->rank,
                 c->o.ucx_pools ? "alloc_pool" : "register_pool", kvf_status_str(status));
        return status;
    }
    /* registered before it is written: the connector may own the memory */
    xt_poison(r->pool, r->pool_len, side->prefill ? XT_POISON_PREFILL : XT_POISON_DECODE);
    if (side->prefill) {
        xt_prefill_fill(c, side, g, r->pool);
    }
    return c->bench ? xt_raw_setup(r) : KVF_OK;
}

static void xt_raw_teardown(xt_rank_t *r)
{
    if (r->raw_agent != NULL) {
        kvf_ucx_agent_destroy(r->raw_agent);   /* closes its peers, deregisters */
        r->raw_agent = NULL;
    }
}

/* ---- prefill ---------------------------------------------------------- */

/* Decode ranks that read prefill rank @a p (each sends one release per pull). */
static int xt_expected_releases(const xt_ctx_t *c, int p)
{
    int ranks[KVF_XFER_MAX_TP], n, count = 0;

    for (int d = 0; d < c->lay.decode_tp; ++d) {
        if (kvf_tp_source_ranks(&c->cfg, c->lay.prefill_tp, c->lay.decode_tp, d, ranks, &n) !=
            KVF_OK) {
            continue;
        }
        for (int i = 0; i < n; ++i) {
            count += (ranks[i] == p);
        }
    }
    return count;
}

#define XT_NAP_NS 50000L   /* after KVF_CONNECTOR_SPIN_NS idle: nap this long between polls */

static void *xt_prefill_thread(void *arg)
{
    xt_rank_t *r = arg;
    xt_ctx_t *c = r->ctx;
    int expected, got = 0;
    uint64_t deadline, last_work;
    pid_t parent = getppid();

    r->status = xt_rank_setup(r);
    pthread_barrier_wait(&c->barrier);           /* registered */
    pthread_barrier_wait(&c->barrier);           /* side channel up */
    if (r->status != KVF_OK) {
        goto out;
    }
    expected = xt_expected_releases(c, r->rank) * c->npulls;
    /* bench runs several pulls; give it time in proportion */
    deadline = kvf_ucx_now_ns() + (uint64_t)c->o.timeout_ms * 1000000ull *
               (uint64_t)(2 + c->npulls);
    last_work = kvf_ucx_now_ns();
    while (got < expected) {
        char rid[KVF_ENGINE_ID_MAX];
        int drank;
        kvf_status_t st;
        /* the raw agent needs progress too (GETs without a one-sided transport) */
        kvf_status_t s = c->xops->poll_release(c->conn, r->rank, c->bench ? 0 : 100, rid,
                                               sizeof(rid), &drank, &st);
        bool raw_work = (r->raw_agent != NULL) && (kvf_ucx_agent_progress(r->raw_agent) > 0);
        uint64_t now = kvf_ucx_now_ns();

        /*
         * The daemons' progress policy (transfer/ucx/kvf_connector_ucx.c): spin while
         * there was work in the last 5 ms, then sleep. A GET from a UCX-mapped pool
         * gives this side no work at all, and spinning prefill ranks would take the
         * cores the decode ranks copy with (2-core hosts: half the bandwidth).
         */
        if ((s == KVF_OK) || (s == KVF_INPROGRESS) || raw_work) {
            last_work = now;
        } else if (now - last_work < KVF_CONNECTOR_SPIN_NS) {
            sched_yield();
        } else {
            struct timespec nap = {.tv_sec = 0, .tv_nsec = XT_NAP_NS};
            nanosleep(&nap, NULL);
        }
        if (s == KVF_OK) {
            if (st != KVF_OK) {
                snprintf(r->err, sizeof(r->err), "prefill rank %d: decode rank %d reported "
                         "failure: %s", r->rank, drank, kvf_status_str(st));
                r->status = KVF_ERR_CANCELED;
                goto out;
            }
            got++;
        } else if ((kvf_ucx_now_ns() > deadline) || (getppid() != parent)) {
            snprintf(r->err, sizeof(r->err), "prefill rank %d: %d of %d releases before "
                     "giving up", r->rank, got, expected);
            r->status = KVF_ERR_LEASE_EXPIRED;
            goto out;
        }
    }
out:
    xt_raw_teardown(r);
    return NULL;
}

static int xt_write_all(int fd, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            return -1;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static int xt_write_msg(int fd, const uint8_t *buf, size_t len)
{
    uint32_t len32 = (uint32_t)len;
    return (xt_write_all(fd, &len32, sizeof(len32)) != 0) ||
           ((len32 > 0) && (xt_write_all(fd, buf, len) != 0));
}

/*
 * A lying prefill (fault flags): what the connector serves, fetched back as
 * a decode would, altered, and served again on a side channel of the tool's
 * own, whose port goes into the transfer params.
 */
static kvf_status_t xt_serve_altered(xt_ctx_t *c, kvf_side_channel_server_h *server_p,
                                     int *port_p)
{
    kvf_side_channel_client_h client = NULL;
    const kvf_handshake_reply_t *reply;
    kvf_side_channel_params_t sp;
    kvf_rank_meta_t *metas = NULL;
    int port = 0;
    kvf_status_t status;

    status = c->xops->serve(c->conn, &port);
    if (status == KVF_OK) {
        status = kvf_side_channel_client_create("xfer-test-liar", (uint32_t)c->o.timeout_ms,
                                                &client);
    }
    if (status == KVF_OK) {
        status = kvf_side_channel_fetch(client, c->pre.engine_id, "127.0.0.1", port, &reply);
    }
    if ((status == KVF_OK) && (reply->num_ranks != c->pre.tp)) {
        status = KVF_ERR_PARSE;
    }
    if (status == KVF_OK) {
        metas = calloc((size_t)c->pre.tp, sizeof(*metas));
        status = (metas == NULL) ? KVF_ERR_NO_MEMORY : KVF_OK;
    }
    for (int r = 0; (status == KVF_OK) && (r < c->pre.tp); ++r) {
        metas[r] = reply->ranks[r];
        if (c->o.fault_version != 0) {
            metas[r].protocol_version = (uint32_t)c->o.fault_version;
        }
        if (c->o.fault_fingerprint) {
            metas[r].model_fingerprint ^= 0x5a5a5a5a00000001ull;
        }
        if (c->o.fault_region_len) {
            metas[r].regions[0].length += c->pre.geom[r].page_size;
        }
    }
    if (status == KVF_OK) {
        memset(&sp, 0, sizeof(sp));
        sp.engine_id = c->pre.engine_id;
        sp.ranks = metas;
        sp.num_ranks = c->pre.tp;
        status = kvf_side_channel_server_start(&sp, server_p);
    }
    if (status == KVF_OK) {
        *port_p = kvf_side_channel_server_port(*server_p);
    }
    free(metas);
    kvf_side_channel_client_destroy(client);
    return status;
}

/* The prefill instance (child process). Returns the exit code. */
static int xt_prefill_main(xt_ctx_t *c, int fd)
{
    kvf_side_channel_server_h lying = NULL;
    kvf_xfer_params_msg_t pm;
    kvf_handshake_reply_t raw;
    uint8_t *buf = NULL, *rbuf = NULL;
    size_t len = 0, rlen = 0;
    int rc = 1, ok = 1, port = 0;

    kvf_log_init("prefill");
    c->ranks = calloc((size_t)c->pre.tp, sizeof(*c->ranks));
    if ((c->ranks == NULL) || (xt_conn_create(c, &c->pre) != KVF_OK)) {
        return 1;
    }
    pthread_barrier_init(&c->barrier, NULL, (unsigned)c->pre.tp + 1);
    for (int r = 0; r < c->pre.tp; ++r) {
        c->ranks[r].ctx = c;
        c->ranks[r].side = &c->pre;
        c->ranks[r].rank = r;
        pthread_create(&c->ranks[r].thread, NULL, xt_prefill_thread, &c->ranks[r]);
    }
    pthread_barrier_wait(&c->barrier);
    for (int r = 0; r < c->pre.tp; ++r) {
        if (c->ranks[r].status != KVF_OK) {
            kvf_error("prefill rank %d setup failed: %s", r, kvf_status_str(c->ranks[r].status));
            ok = 0;
        }
    }
    if (ok) {
        bool lie = (c->o.fault_version != 0) || c->o.fault_fingerprint || c->o.fault_region_len;
        ok = ((lie ? xt_serve_altered(c, &lying, &port) : c->xops->serve(c->conn, &port)) ==
              KVF_OK);
    }
    if (ok) {
        memset(&pm, 0, sizeof(pm));
        snprintf(pm.engine_id, sizeof(pm.engine_id), "%s", c->pre.engine_id);
        snprintf(pm.host, sizeof(pm.host), "127.0.0.1");
        snprintf(pm.request_id, sizeof(pm.request_id), "req-0");
        pm.port = port;
        pm.num_groups = c->layout->num_groups;
        for (int gi = 0; gi < pm.num_groups; ++gi) {
            pm.ids[gi] = c->pre.ids[gi];
            pm.num_ids[gi] = c->pre.num_ids[gi];
        }
        pm.num_tokens = c->o.tokens;
        pm.has_lease_expiry = true;
        pm.lease_expiry_ms = (uint64_t)time(NULL) * 1000u + (uint64_t)c->o.timeout_ms * 2u;
        pm.first_token = 42;
        pm.has_incarnation = true;
        pm.incarnation = c->xops->incarnation(c->conn);
        if (c->o.fault_block_id) {
            pm.ids[0][pm.num_ids[0] - 1] = (int32_t)c->pre.num_blocks;
        }
        ok = (kvf_xfer_params_msg_pack(&pm, &buf, &len) == KVF_OK);
    }
    if (ok && c->bench) {
        /* the raw reference's addresses and keys ride the same pipe */
        kvf_rank_meta_t *metas = calloc((size_t)c->pre.tp, sizeof(*metas));
        ok = (metas != NULL);
        for (int r = 0; ok && (r < c->pre.tp); ++r) {
            metas[r] = c->ranks[r].raw_meta;
        }
        memset(&raw, 0, sizeof(raw));
        raw.accepted = true;
        snprintf(raw.engine_id, sizeof(raw.engine_id), "%s", c->pre.engine_id);
        raw.num_ranks = c->pre.tp;
        raw.ranks = metas;
        ok = ok && (kvf_handshake_reply_pack(&raw, &rbuf, &rlen) == KVF_OK);
        free(metas);
    }
    (void)(xt_write_msg(fd, buf, ok ? len : 0) ||
           (ok && c->bench && xt_write_msg(fd, rbuf, rlen)));
    close(fd);
    free(buf);
    free(rbuf);
    pthread_barrier_wait(&c->barrier);
    rc = ok ? 0 : 1;
    for (int r = 0; r < c->pre.tp; ++r) {
        pthread_join(c->ranks[r].thread, NULL);
        if (c->ranks[r].status != KVF_OK) {
            if (c->ranks[r].err[0] != '\0') {
                kvf_error("%s", c->ranks[r].err);
            }
            rc = 1;
        }
    }
    kvf_side_channel_server_stop(lying);
    c->xops->destroy(c->conn);
    for (int r = 0; (r < c->pre.tp) && !c->o.ucx_pools; ++r) {
        free(c->ranks[r].pool);
    }
    pthread_barrier_destroy(&c->barrier);
    return rc;
}

/* ---- decode ----------------------------------------------------------- */

/* One pull of the request through the connector, timed into slot @a it. Sets r->status. */
static void xt_decode_pull(xt_rank_t *r, int it, bool *killed)
{
    xt_ctx_t *c = r->ctx;
    const kvf_xfer_params_msg_t *pm = &c->pm;
    kvf_connector_pull_t pull;
    kvf_connector_stats_t st;
    kvf_connector_req_h req = NULL;
    kvf_status_t status, rs;

    memset(&pull, 0, sizeof(pull));
    pull.engine_id = pm->engine_id;
    pull.request_id = pm->request_id;
    pull.num_tokens = pm->num_tokens;
    pull.num_groups = pm->num_groups;
    for (int gi = 0; gi < pm->num_groups; ++gi) {
        pull.remote_ids[gi] = pm->ids[gi];
        pull.num_remote_ids[gi] = pm->num_ids[gi];
        pull.local_ids[gi] = c->dec.ids[gi];
        pull.num_local_ids[gi] = c->dec.num_ids[gi];
    }
    r->t_start[it] = kvf_ucx_now_ns();
    status = c->xops->start_pull(c->conn, r->rank, &pull, &req);
    r->t_post[it] = kvf_ucx_now_ns();
    if (status != KVF_OK) {
        r->start_status = status;
        r->t_end[it] = r->t_post[it];
        snprintf(r->err, sizeof(r->err), "decode rank %d: start_pull refused: %s", r->rank,
                 kvf_status_str(status));
        r->status = status;
        return;
    }
    if (c->xops->req_stats(c->conn, r->rank, req, &st) == KVF_OK) {
        r->bytes = st.bytes;
        r->descs = st.descriptors;
        r->zero_bytes = st.zero_bytes;
        r->reads = st.remote_ranks;
        r->ops_posted += st.descriptors;
    }
    do {
        status = c->xops->poll(c->conn, r->rank, req);
        if (c->o.fault_kill_prefill && (r->rank == 0) && !*killed) {
            c->t_kill = kvf_ucx_now_ns();
            kill(c->child, SIGKILL);
            *killed = true;
            kvf_info("decode rank 0: killed the prefill (pid %d) after the first window",
                     (int)c->child);
        }
    } while (status == KVF_INPROGRESS);
    r->t_end[it] = kvf_ucx_now_ns();
    rs = c->xops->notify_release(c->conn, r->rank, req);   /* frees req */
    if (status != KVF_OK) {
        r->t_fail = r->t_end[it];
        snprintf(r->err, sizeof(r->err), "decode rank %d: transfer failed: %s (%d)", r->rank,
                 kvf_status_str(status), (int)status);
        r->status = status;
    } else if (rs != KVF_OK) {
        r->t_fail = kvf_ucx_now_ns();
        snprintf(r->err, sizeof(r->err), "decode rank %d: release to prefill failed: %s",
                 r->rank, kvf_status_str(rs));
        r->status = rs;
    }
}

/* Raw reference: this rank's bytes as one contiguous GET per prefill rank it reads. */
static void xt_decode_raw(xt_rank_t *r, int it)
{
    xt_ctx_t *c = r->ctx;
    kvf_ucx_batch_h batches[KVF_XFER_MAX_TP] = {NULL};
    int src[KVF_XFER_MAX_TP], nsrc = 0;
    kvf_status_t status;

    status = kvf_tp_source_ranks(&c->cfg, c->pre.tp, c->dec.tp, r->rank, src, &nsrc);
    for (int i = 0; (i < nsrc) && (status == KVF_OK); ++i) {
        if (r->raw_peers[src[i]] == NULL) {
            status = kvf_ucx_peer_connect(r->raw_agent, &c->raw.ranks[src[i]],
                                          &r->raw_peers[src[i]]);
        }
    }
    r->t_raw_start[it] = kvf_ucx_now_ns();
    r->raw_bytes = 0;
    for (int i = 0; (i < nsrc) && (status == KVF_OK); ++i) {
        uint64_t share = r->bytes / (uint64_t)nsrc;
        kvf_xfer_desc_t d = {0, 0, share};
        status = kvf_ucx_xfer_post(r->raw_agent, r->raw_peers[src[i]], KVF_UCX_OP_GET,
                                   r->raw_region, 0, &d, 1, &batches[i]);
        r->raw_bytes += share;
        r->ops_posted += (status == KVF_OK);
    }
    for (int i = 0; i < nsrc; ++i) {
        if (batches[i] != NULL) {
            kvf_status_t s = kvf_ucx_batch_wait(batches[i], (uint32_t)c->o.timeout_ms);
            status = (status == KVF_OK) ? s : status;
            kvf_ucx_batch_release(batches[i]);
        }
    }
    r->t_raw_end[it] = kvf_ucx_now_ns();
    if (status != KVF_OK) {
        snprintf(r->err, sizeof(r->err), "decode rank %d: raw GET failed: %s", r->rank,
                 kvf_status_str(status));
        r->status = status;
    }
    snprintf(r->transports, sizeof(r->transports), "%s", kvf_ucx_agent_transports(r->raw_agent));
}

/* bench: whether a raw GET (iteration p - 1) comes before pull p. */
static bool xt_raw_before(const xt_ctx_t *c, int p)
{
    return c->bench && (p >= 1) && (p <= c->o.iters);
}

/* Index of the pull timed as iteration @a it. */
static int xt_timed_pull(const xt_ctx_t *c, int it)
{
    return c->bench ? it + 1 : it;
}

static void *xt_decode_thread(void *arg)
{
    xt_rank_t *r = arg;
    xt_ctx_t *c = r->ctx;
    bool killed = false;

    r->status = xt_rank_setup(r);
    pthread_barrier_wait(&c->barrier);           /* registered */
    pthread_barrier_wait(&c->barrier);           /* handshake verdict */
    if ((r->status != KVF_OK) || !c->go) {
        goto out;                                /* main skips the pull barriers too */
    }
    /*
     * bench: pull 0 warms up (endpoints connect), then each timed iteration
     * is a raw GET and a pull, so the last thing prefill serves is a pull and
     * its release ends it; with --verify one more pull into a poisoned pool.
     */
    for (int p = 0; p < c->npulls; ++p) {
        bool last_verify = c->bench && c->o.verify && (p == c->npulls - 1);
        /* every rank passes every barrier, failed or not, so none can hang */
        if (xt_raw_before(c, p)) {
            pthread_barrier_wait(&c->barrier);
            if (r->status == KVF_OK) {
                xt_decode_raw(r, p - 1);
            }
        }
        pthread_barrier_wait(&c->barrier);
        if ((r->status == KVF_OK) && last_verify) {
            /* the raw GETs overwrote the pool: poison it again, pull once more, verify */
            xt_poison(r->pool, r->pool_len, XT_POISON_DECODE);
        }
        if (r->status == KVF_OK) {
            xt_decode_pull(r, p, &killed);
        }
    }
    if ((r->status == KVF_OK) && c->o.verify) {
        r->status = xt_decode_verify(c, r);
    }
out:
    xt_raw_teardown(r);
    return NULL;
}

static int xt_read_all(int fd, void *buf, size_t len, int timeout_ms)
{
    uint8_t *p = buf;
    uint64_t deadline = kvf_ucx_now_ns() + (uint64_t)timeout_ms * 1000000ull;

    while (len > 0) {
        struct pollfd pfd = {fd, POLLIN, 0};
        int64_t left = (int64_t)(deadline - kvf_ucx_now_ns()) / 1000000;
        ssize_t n;

        if ((left <= 0) || (poll(&pfd, 1, (int)left) <= 0)) {
            return -1;
        }
        n = read(fd, p, len);
        if (n <= 0) {
            if ((n < 0) && (errno == EINTR)) {
                continue;
            }
            return -1;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Reap the prefill child within @a timeout_ms (then SIGKILL it). Returns its exit code. */
static int xt_reap(pid_t pid, int timeout_ms)
{
    uint64_t deadline = kvf_ucx_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    int wstatus;

    for (;;) {
        pid_t w = waitpid(pid, &wstatus, WNOHANG);
        if (w == pid) {
            return WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);
        }
        if ((w < 0) && (errno != EINTR)) {
            return -1;
        }
        if (kvf_ucx_now_ns() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &wstatus, 0);
            return -1;
        }
        struct timespec ts = {0, 2000000};   /* poll interval, bounded by the deadline */
        nanosleep(&ts, NULL);
    }
}

static double xt_ms(uint64_t ns)
{
    return (double)ns / 1e6;
}

static int xt_cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}
/* ---- copy limit and descriptor export (bench) --------------------------- */

/*
 * The plan of decode rank @a d, from the geometry both sides were given (the
 * connector plans the same from the handshake; this copy only feeds the
 * descriptor file and the memcpy reference, never a transfer).
 */
static kvf_status_t xt_plan_rank(const xt_ctx_t *c, int d, kvf_xfer_plan_t **plan_p)
{
    kvf_xfer_group_blocks_t groups[KVF_MAX_KV_GROUPS];
    int64_t nb[KVF_XFER_MAX_TP];
    kvf_xfer_plan_params_t pp;

    for (int r = 0; r < c->pre.tp; ++r) {
        nb[r] = c->pre.num_blocks;
    }
    memset(&pp, 0, sizeof(pp));
    pp.field_mask = c->o.no_coalesce ? KVF_XFER_PLAN_PARAM_FIELD_FLAGS : 0;
    pp.flags = c->o.no_coalesce ? KVF_XFER_PLAN_FLAG_NO_COALESCE : 0;
    pp.cfg = &c->cfg;
    pp.layout = c->layout;
    pp.local_tp = c->dec.tp;
    pp.local_rank = d;
    pp.local_geom = &c->dec.geom[d];
    pp.local_num_blocks = c->dec.num_blocks;
    pp.remote_tp = c->pre.tp;
    pp.remote_geoms = c->pre.geom;
    pp.remote_num_blocks = nb;
    pp.num_groups = c->pm.num_groups;
    for (int gi = 0; gi < pp.num_groups; ++gi) {
        groups[gi].local_ids = c->dec.ids[gi];
        groups[gi].num_local = c->dec.num_ids[gi];
        groups[gi].remote_ids = c->pm.ids[gi];
        groups[gi].num_remote = c->pm.num_ids[gi];
    }
    pp.groups = groups;
    pp.num_tokens = c->o.tokens;
    return kvf_xfer_plan_create(&pp, plan_p);
}

static size_t xt_pool_bytes(const xt_ctx_t *c, const xt_side_t *side, int r)
{
    return (size_t)side->num_blocks * (size_t)c->layout->slots * side->geom[r].page_size;
}

static int xt_write_descs(const xt_ctx_t *c, kvf_xfer_plan_t **plans)
{
    FILE *f = fopen(c->o.descs_out, "w");
    if (f == NULL) {
        kvf_error("cannot write --descs-out %s: %m", c->o.descs_out);
        return -1;
    }
    fprintf(f, "{\"model\": \"%s\", \"layout\": \"%dp%dd\", \"tokens\": %d,\n",
            c->o.model, c->pre.tp, c->dec.tp, c->o.tokens);
    fprintf(f, " \"prefill_pool_bytes\": [");
    for (int r = 0; r < c->pre.tp; ++r) {
        fprintf(f, "%s%zu", r ? ", " : "", xt_pool_bytes(c, &c->pre, r));
    }
    fprintf(f, "],\n \"decode_pool_bytes\": [");
    for (int r = 0; r < c->dec.tp; ++r) {
        fprintf(f, "%s%zu", r ? ", " : "", xt_pool_bytes(c, &c->dec, r));
    }
    fprintf(f, "],\n \"reads\": [");
    for (int d = 0, first = 1; d < c->dec.tp; ++d) {
        for (int i = 0; i < plans[d]->num_ranks; ++i, first = 0) {
            const kvf_xfer_rank_plan_t *rp = &plans[d]->ranks[i];
            fprintf(f, "%s\n  {\"decode_rank\": %d, \"prefill_rank\": %d, \"bytes\": %" PRIu64
                    ", \"descs\": [", first ? "" : ",", d, rp->remote_rank, rp->bytes);
            for (size_t k = 0; k < rp->num_descs; ++k) {
                fprintf(f, "%s[%" PRIu64 ", %" PRIu64 ", %" PRIu64 "]", k ? ", " : "",
                        rp->descs[k].local_off, rp->descs[k].remote_off, rp->descs[k].len);
            }
            fprintf(f, "]}");
        }
    }
    fprintf(f, "\n ]}\n");
    return (fclose(f) == 0) ? 0 : -1;
}

typedef struct {
    const xt_ctx_t        *c;
    const kvf_xfer_plan_t *plan;
    uint8_t              **src;      /* [P] prefill pools (copies) */
    uint8_t               *dst;      /* this decode rank's pool (a copy) */
    pthread_barrier_t     *barrier;
    uint64_t               t0[XT_MAX_ITERS], t1[XT_MAX_ITERS];
} xt_copy_t;

static void *xt_copy_thread(void *arg)
{
    xt_copy_t *x = arg;

    for (int it = -1; it < x->c->o.iters; ++it) {   /* -1: warm-up, like the pulls' */
        pthread_barrier_wait(x->barrier);
        uint64_t t0 = kvf_ucx_now_ns();
        for (int i = 0; i < x->plan->num_ranks; ++i) {
            const kvf_xfer_rank_plan_t *rp = &x->plan->ranks[i];
            for (size_t k = 0; k < rp->num_descs; ++k) {
                memcpy(x->dst + rp->descs[k].local_off,
                       x->src[rp->remote_rank] + rp->descs[k].remote_off, rp->descs[k].len);
            }
        }
        if (it >= 0) {
            x->t0[it] = t0;
            x->t1[it] = kvf_ucx_now_ns();
        }
    }
    return NULL;
}

/*
 * memcpy of every descriptor list, one thread per decode rank, between
 * buffers of the pools' sizes in this process: the copy limit of the
 * machine for this request. Returns the median ns, 0 on failure.
 */
static uint64_t xt_copy_limit(const xt_ctx_t *c, kvf_xfer_plan_t **plans)
{
    uint8_t *src[KVF_XFER_MAX_TP] = {NULL};
    xt_copy_t x[KVF_XFER_MAX_TP];
    pthread_t th[KVF_XFER_MAX_TP];
    pthread_barrier_t barrier;
    uint64_t t[XT_MAX_ITERS], med = 0;
    int ok = 1;

    memset(x, 0, sizeof(x));
    for (int r = 0; r < c->pre.tp; ++r) {
        src[r] = malloc(xt_pool_bytes(c, &c->pre, r));
        ok = ok && (src[r] != NULL);
        if (src[r] != NULL) {
            memset(src[r], 0x5a, xt_pool_bytes(c, &c->pre, r));   /* fault the pages in */
        }
    }
    for (int d = 0; d < c->dec.tp; ++d) {
        x[d].dst = malloc(xt_pool_bytes(c, &c->dec, d));
        ok = ok && (x[d].dst != NULL);
        if (x[d].dst != NULL) {
            /* not 0: malloc + memset(0) may become calloc, leaving the pages unfaulted */
            memset(x[d].dst, 0xa5, xt_pool_bytes(c, &c->dec, d));
        }
    }
    if (ok) {
        pthread_barrier_init(&barrier, NULL, (unsigned)c->dec.tp);
        for (int d = 0; d < c->dec.tp; ++d) {
            x[d].c = c;
            x[d].plan = plans[d];
            x[d].src = src;
            x[d].barrier = &barrier;
            pthread_create(&th[d], NULL, xt_copy_thread, &x[d]);
        }
        for (int d = 0; d < c->dec.tp; ++d) {
            pthread_join(th[d], NULL);
        }
        pthread_barrier_destroy(&barrier);
        for (int it = 0; it < c->o.iters; ++it) {
            uint64_t s = UINT64_MAX, e = 0;
            for (int d = 0; d < c->dec.tp; ++d) {
                s = (x[d].t0[it] < s) ? x[d].t0[it] : s;
                e = (x[d].t1[it] > e) ? x[d].t1[it] : e;
            }
            t[it] = (e > s) ? e - s : 1;
        }
        qsort(t, (size_t)c->o.iters, sizeof(t[0]), xt_cmp_u64);
        med = t[c->o.iters / 2];
    }
    for (int r = 0; r < c->pre.tp; ++r) {
        free(src[r]);
    }
    for (int d = 0; d < c->dec.tp; ++d) {
        free(x[d].dst);
    }
    return med;
}

/* Read one length-prefixed message from the prefill child. NULL on failure. */
static uint8_t *xt_read_msg(int fd, int timeout_ms, uint32_t *len_p)
{
    uint32_t len32 = 0;
    uint8_t *buf;

    if ((xt_read_all(fd, &len32, sizeof(len32), timeout_ms) != 0) || (len32 == 0) ||
        (len32 > (64u << 20))) {
        return NULL;
    }
    buf = malloc(len32);
    if ((buf != NULL) && (xt_read_all(fd, buf, len32, timeout_ms) != 0)) {
        free(buf);
        return NULL;
    }
    *len_p = len32;
    return buf;
}

/* Handshake through the connector. Returns 1 when the transfer may go. */
static int xt_decode_handshake(xt_ctx_t *c, double *hs_ms)
{
    char why[512];
    uint64_t t0 = kvf_ucx_now_ns();
    kvf_status_t status;

    status = c->xops->handshake(c->conn, c->pm.engine_id, c->pm.host, c->pm.port, why,
                                sizeof(why));
    *hs_ms = xt_ms(kvf_ucx_now_ns() - t0);
    if (status == KVF_ERR_REFUSED) {
        printf("%s\n", (why[0] != '\0') ? why : "handshake refused");
        return 0;
    }
    if (status != KVF_OK) {
        printf("xfer-test: %s\n", (why[0] != '\0') ? why : kvf_status_str(status));
        return 0;
    }
    return 1;
}

/* Why the connector refused the pull: name the block id that lies outside the prefill pool. */
static void xt_explain_refusal(const xt_ctx_t *c, kvf_status_t status)
{
    for (int gi = 0; gi < c->pm.num_groups; ++gi) {
        for (int i = 0; i < c->pm.num_ids[gi]; ++i) {
            if ((int64_t)c->pm.ids[gi][i] >= c->pre.num_blocks) {
                printf("xfer-test: transfer refused: block id %d of group %d is out of range "
                       "[0, %" PRId64 ") of the prefill pool\n", c->pm.ids[gi][i], gi,
                       c->pre.num_blocks);
                return;
            }
        }
    }
    printf("xfer-test: transfer refused by the connector: %s\n", kvf_status_str(status));
}

static int xt_run(xt_ctx_t *c)
{
    int pfd[2], rc = 1, child_rc;
    uint8_t *buf = NULL;
    uint32_t len32 = 0;
    double hs_ms = 0;
    uint64_t total_bytes = 0, total_zero = 0, total_pages = 0, total_elts = 0, ops = 0;
    uint64_t raw_bytes = 0;
    size_t total_descs = 0;
    int reads = 0;
    bool have_params = false, have_raw = false, refused = false;
    kvf_status_t refusal = KVF_OK;

    if (pipe(pfd) != 0) {
        kvf_error("pipe failed: %m");
        return 1;
    }
    fflush(NULL);
    c->child = fork();
    if (c->child < 0) {
        kvf_error("fork failed: %m");
        return 1;
    }
    if (c->child == 0) {
        close(pfd[0]);
        _exit(xt_prefill_main(c, pfd[1]));
    }
    close(pfd[1]);

    c->ranks = calloc((size_t)c->dec.tp, sizeof(*c->ranks));
    if ((c->ranks == NULL) || (xt_conn_create(c, &c->dec) != KVF_OK)) {
        c->go = 0;
        goto out_reap;
    }
    pthread_barrier_init(&c->barrier, NULL, (unsigned)c->dec.tp + 1);
    for (int r = 0; r < c->dec.tp; ++r) {
        c->ranks[r].ctx = c;
        c->ranks[r].side = &c->dec;
        c->ranks[r].rank = r;
        pthread_create(&c->ranks[r].thread, NULL, xt_decode_thread, &c->ranks[r]);
    }
    pthread_barrier_wait(&c->barrier);          /* decode pools registered */

    c->go = 1;
    for (int r = 0; r < c->dec.tp; ++r) {
        if (c->ranks[r].status != KVF_OK) {
            printf("xfer-test: decode rank %d setup failed: %s\n", r,
                   kvf_status_str(c->ranks[r].status));
            c->go = 0;
        }
    }
    /* the proxy's role: carry the transfer params from prefill to decode */
    if (c->go && ((buf = xt_read_msg(pfd[0], (int)c->o.timeout_ms * 4, &len32)) == NULL)) {
        printf("xfer-test: prefill did not come up within %d ms\n", (int)c->o.timeout_ms * 4);
        c->go = 0;
    }
    if (c->go) {
        /* the decoder kvf-decode uses on the params inside a DecodeRequest */
        if (kvf_xfer_params_msg_unpack(buf, len32, &c->pm) != KVF_OK) {
            printf("xfer-test: malformed transfer params from prefill\n");
            c->go = 0;
        } else {
            have_params = true;
        }
    }
    if (c->go && c->bench) {
        free(buf);
        buf = xt_read_msg(pfd[0], (int)c->o.timeout_ms, &len32);
        if ((buf == NULL) || (kvf_handshake_reply_unpack(buf, len32, &c->raw) != KVF_OK) ||
            (c->raw.num_ranks != c->pre.tp)) {
            printf("xfer-test: malformed raw-reference metadata from prefill\n");
            c->go = 0;
        } else {
            have_raw = true;
        }
    }
    if (c->go) {
        c->go = xt_decode_handshake(c, &hs_ms);
    }
    pthread_barrier_wait(&c->barrier);          /* verdict published */
    if (c->go) {
        for (int p = 0; p < c->npulls; ++p) {
            if (xt_raw_before(c, p)) {
                pthread_barrier_wait(&c->barrier);  /* raw */
            }
            pthread_barrier_wait(&c->barrier);      /* pull */
        }
    }
    for (int r = 0; r < c->dec.tp; ++r) {
        pthread_join(c->ranks[r].thread, NULL);
    }
    pthread_barrier_destroy(&c->barrier);

    rc = c->go ? 0 : 1;
    for (int r = 0; r < c->dec.tp; ++r) {
        xt_rank_t *x = &c->ranks[r];
        ops += x->ops_posted;
        if ((x->start_status == KVF_ERR_OUT_OF_RANGE) ||
            (x->start_status == KVF_ERR_INVALID_PARAM)) {
            refused = true;
            refusal = x->start_status;
        }
        if (x->status != KVF_OK) {
            printf("xfer-test: FAILED: %s\n", (x->err[0] != '\0') ? x->err :
                   kvf_status_str(x->status));
            if ((c->t_kill != 0) && (x->t_fail != 0)) {
                printf("xfer-test: peer error on decode rank %d %.1f ms after the prefill was "
                       "killed\n", r, xt_ms(x->t_fail - c->t_kill));
            }
            rc = 1;
        }
        total_bytes += x->bytes;
        total_zero += x->zero_bytes;
        total_descs += x->descs;
        total_pages += x->pages_checked;
        total_elts += x->elements_checked;
        raw_bytes += x->raw_bytes;
        reads += x->reads;
    }
    if (refused) {
        xt_explain_refusal(c, refusal);
    }
    if (c->go && !refused) {
        int n = c->bench ? c->o.iters : 1;
        uint64_t kv[XT_MAX_ITERS], raw[XT_MAX_ITERS], post[XT_MAX_ITERS];

        for (int it = 0; it < n; ++it) {
            uint64_t s = UINT64_MAX, e = 0, rs = UINT64_MAX, re = 0, p = 0;
            int k = xt_timed_pull(c, it);
            for (int r = 0; r < c->dec.tp; ++r) {
                const xt_rank_t *x = &c->ranks[r];
                s = (x->t_start[k] < s) ? x->t_start[k] : s;
                e = (x->t_end[k] > e) ? x->t_end[k] : e;
                p = (x->t_post[k] - x->t_start[k] > p) ? x->t_post[k] - x->t_start[k] : p;
                rs = (x->t_raw_start[it] < rs) ? x->t_raw_start[it] : rs;
                re = (x->t_raw_end[it] > re) ? x->t_raw_end[it] : re;
            }
            kv[it] = (e > s) ? e - s : 1;
            raw[it] = (re > rs) ? re - rs : 1;
            post[it] = p;
        }
        qsort(kv, (size_t)n, sizeof(kv[0]), xt_cmp_u64);
        qsort(raw, (size_t)n, sizeof(raw[0]), xt_cmp_u64);
        qsort(post, (size_t)n, sizeof(post[0]), xt_cmp_u64);
        if (c->ranks[0].transports[0] != '\0') {   /* same UCX config as the connector's */
            printf("transports: %s\n", c->ranks[0].transports);
        }
        printf("handshake: %.2f ms (%d prefill ranks, compatible)\n", hs_ms, c->pre.tp);
        printf("transfer: %" PRIu64 " bytes, %zu descriptors (GET operations), %d reads "
               "(prefill->decode rank pairs), zeroed %" PRIu64 " bytes\n", total_bytes,
               total_descs, reads, total_zero);
        printf("transfer time: %.3f ms, %.2f GB/s%s (connector: start_pull to poll done)\n",
               xt_ms(kv[n / 2]), (double)total_bytes / (double)kv[n / 2],
               c->bench ? " (median)" : "");
        printf("plan+post time: %.3f ms (start_pull, slowest rank%s)\n", xt_ms(post[n / 2]),
               c->bench ? ", median" : "");
        if (c->bench) {
            double kv_gbs = (double)total_bytes / (double)kv[n / 2];
            double raw_gbs = (double)raw_bytes / (double)raw[n / 2];
            printf("raw contiguous GET: %" PRIu64 " bytes in %.3f ms, %.2f GB/s (median)\n",
                   raw_bytes, xt_ms(raw[n / 2]), raw_gbs);
            printf("ratio kv/raw: %.3f\n", kv_gbs / raw_gbs);
            printf("descriptors per request: %zu total, %.1f per read, %.0f bytes average\n",
                   total_descs, (double)total_descs / (reads ? reads : 1),
                   (double)total_bytes / (double)(total_descs ? total_descs : 1));
        }
        if (c->bench && (rc == 0) && ((c->o.descs_out[0] != '\0') || c->o.copy_limit)) {
            kvf_xfer_plan_t *plans[KVF_XFER_MAX_TP] = {NULL};
            int planned = 1;
            for (int d = 0; d < c->dec.tp; ++d) {
                planned = planned && (xt_plan_rank(c, d, &plans[d]) == KVF_OK);
            }
            if (!planned) {
                printf("bench: planning the descriptor lists for export failed\n");
                rc = 1;
            } else {
                if ((c->o.descs_out[0] != '\0') && (xt_write_descs(c, plans) != 0)) {
                    rc = 1;
                } else if (c->o.descs_out[0] != '\0') {
                    printf("descriptor lists: written to %s\n", c->o.descs_out);
                }
                if (c->o.copy_limit) {
                    uint64_t ns = xt_copy_limit(c, plans);
                    double kv_gbs = (double)total_bytes / (double)kv[n / 2];
                    if (ns > 0) {
                        printf("copy limit (memcpy of the same descriptors, %d threads): "
                               "%.3f ms, %.2f GB/s (median); kv/copy %.3f\n", c->dec.tp,
                               xt_ms(ns), (double)total_bytes / (double)ns,
                               kv_gbs / ((double)total_bytes / (double)ns));
                    }
                }
            }
            for (int d = 0; d < c->dec.tp; ++d) {
                kvf_xfer_plan_destroy(plans[d]);
            }
        }
        if (c->o.verify && (rc == 0)) {
            printf("verify: ok (%" PRIu64 " elements in %" PRIu64 " pages; zeroed tails and "
                   "untouched pages intact)\n", total_elts, total_pages);
        }
    }
    printf("rdma operations posted: %" PRIu64 "\n", ops);

out_reap:
    if (!c->go || (rc != 0)) {
        kill(c->child, SIGTERM);
    }
    child_rc = xt_reap(c->child, (int)c->o.timeout_ms * 2);
    if (c->go && (rc == 0) && (child_rc != 0)) {
        printf("xfer-test: FAILED: prefill exited with %d\n", child_rc);
        rc = 1;
    }
    if (c->conn != NULL) {
        c->xops->destroy(c->conn);
        c->conn = NULL;
    }
    for (int r = 0; (c->ranks != NULL) && (r < c->dec.tp) && !c->o.ucx_pools; ++r) {
        free(c->ranks[r].pool);
    }
    close(pfd[0]);
    free(buf);
    if (have_params) {
        kvf_xfer_params_msg_cleanup(&c->pm);
    }
    if (have_raw) {
        kvf_handshake_reply_cleanup(&c->raw);
    }
    printf("%s: %s\n", c->bench ? "bench" : "xfer-test", (rc == 0) ? "PASS" : "FAIL");
    return rc;
}

static int xt_main(int argc, char **argv, bool bench)
{
    xt_ctx_t *c = calloc(1, sizeof(*c));
    const char *prog = bench ? "kvf bench" : "kvf xfer-test";
    bool exit_now = false;
    kvf_dtype_t d;
    int rc = 2;

    if (c == NULL) {
        return 1;
    }
    c->bench = bench;
    if (kvf_config_parse(bench ? xt_bench_table : xt_test_table, prog, argc, argv, &c->o,
                         &exit_now) != KVF_OK) {
        goto out;
    }
    if (exit_now) {
        rc = 0;
        goto out;
    }
    if ((c->o.model[0] == '\0') && bench) {
        const char *dir = getenv("KVF_SHARED_MODELS");
        snprintf(c->o.model, sizeof(c->o.model), "%s/nemotron-nano-9b-v2.config.json",
                 (dir != NULL) ? dir : "tests/data/models");
    }
    if (c->o.model[0] == '\0') {
        kvf_error("%s: --model is required", prog);
        goto out;
    }
    if ((c->o.tokens < 1) || (c->o.iters < 1) || (c->o.iters > XT_MAX_ITERS) ||
        (c->o.spare_blocks < 0) || (c->o.timeout_ms < 1) || (c->o.batch_descs < 0)) {
        kvf_error("%s: --tokens, --iters (<= %d), --timeout must be positive", prog,
                  XT_MAX_ITERS);
        goto out;
    }
    if ((strcmp(c->o.pool_alloc, "heap") != 0) && (strcmp(c->o.pool_alloc, "ucx") != 0)) {
        kvf_error("%s: --pool-alloc must be heap or ucx, not '%s'", prog, c->o.pool_alloc);
        goto out;
    }
    c->o.ucx_pools = (strcmp(c->o.pool_alloc, "ucx") == 0);
    if (c->o.fault_kill_prefill && (c->o.batch_descs == 0)) {
        c->o.batch_descs = 1;   /* "mid-transfer" needs more than one batch */
    }
    if ((kvf_layout_parse(c->o.layout, &c->lay) != KVF_OK) ||
        (c->lay.prefill_tp > KVF_XFER_MAX_TP) || (c->lay.decode_tp > KVF_XFER_MAX_TP)) {
        goto out;
    }
    rc = 1;
    if (kvf_model_config_load(c->o.model, &c->cfg) != KVF_OK) {
        goto out;
    }
    c->layout = malloc(sizeof(*c->layout));
    if ((c->layout == NULL) || (kvf_cache_layout_build(&c->cfg, c->layout) != KVF_OK)) {
        goto out;
    }
    rc = 2;
    /* decode params first; prefill defaults to the same */
    kvf_cache_params_default(&c->cfg, &c->dec.params);
    c->dec.params.user_block_size = c->o.user_block_size;
    c->dec.params.block_size = c->o.decode_block_size;
    if ((xt_dtype("kv-dtype", c->o.kv_dtype, c->dec.params.kv_dtype, &c->dec.params.kv_dtype) != 0) ||
        (xt_dtype("ssm-dtype", c->o.ssm_dtype, c->dec.params.ssm_dtype, &c->dec.params.ssm_dtype) != 0) ||
        (xt_dtype("conv-dtype", c->o.conv_dtype, c->dec.params.conv_dtype, &c->dec.params.conv_dtype) != 0) ||
        (kvf_kernel_sizes_parse(c->o.decode_kernel_sizes, &c->dec.params.kernel_sizes) != KVF_OK)) {
        goto out;
    }
    c->pre.params = c->dec.params;
    c->pre.params.block_size = c->o.prefill_block_size;
    d = c->dec.params.kv_dtype;
    if ((xt_dtype("prefill-kv-dtype", c->o.prefill_kv_dtype, d, &c->pre.params.kv_dtype) != 0) ||
        (xt_dtype("prefill-ssm-dtype", c->o.prefill_ssm_dtype, c->dec.params.ssm_dtype,
                  &c->pre.params.ssm_dtype) != 0) ||
        (xt_dtype("prefill-conv-dtype", c->o.prefill_conv_dtype, c->dec.params.conv_dtype,
                  &c->pre.params.conv_dtype) != 0) ||
        (kvf_kernel_sizes_parse(c->o.prefill_kernel_sizes, &c->pre.params.kernel_sizes) != KVF_OK)) {
        goto out;
    }
    rc = 1;
    if ((xt_side_init(c, &c->pre, true) != KVF_OK) || (xt_side_init(c, &c->dec, false) != KVF_OK)) {
        goto out;
    }
    printf("%s: %s layout %dp%dd, %d tokens\n"
           "  prefill: block %d kernel %d, kv/conv/ssm %s/%s/%s, pool %" PRId64 " blocks x %d "
           "slots x %zu B\n"
           "  decode:  block %d kernel %d, kv/conv/ssm %s/%s/%s, pool %" PRId64 " blocks x %d "
           "slots x %zu B\n", prog, c->o.model, c->lay.prefill_tp, c->lay.decode_tp,
           c->o.tokens, c->pre.geom[0].block_size, c->pre.geom[0].kernel_block_size,
           kvf_dtype_name(c->pre.params.kv_dtype), kvf_dtype_name(c->pre.params.conv_dtype),
           kvf_dtype_name(c->pre.params.ssm_dtype), c->pre.num_blocks, c->layout->slots,
           c->pre.geom[0].page_size, c->dec.geom[0].block_size,
           c->dec.geom[0].kernel_block_size, kvf_dtype_name(c->dec.params.kv_dtype),
           kvf_dtype_name(c->dec.params.conv_dtype), kvf_dtype_name(c->dec.params.ssm_dtype),
           c->dec.num_blocks, c->layout->slots, c->dec.geom[0].page_size);
    c->npulls = bench ? 1 + c->o.iters + (c->o.verify ? 1 : 0) : 1;
    rc = xt_run(c);
out:
    if (c->layout != NULL) {
        free(c->layout);
    }
    xt_side_cleanup(&c->pre);
    xt_side_cleanup(&c->dec);
    free(c->ranks);
    free(c);
    return rc;
}

int kvf_cmd_xfer_test(int argc, char **argv)
{
    return xt_main(argc, argv, false);
}

int kvf_cmd_bench(int argc, char **argv)
{
    return xt_main(argc, argv, true);
}
