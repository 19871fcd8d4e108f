/*
 * kvf xfer-test: the content pattern prefill writes and decode verifies
 * (a pure function of layer, global head or channel, token and element).
 */
#include "kvf_xt_int.h"

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

void kvf_xt_poison(uint8_t *p, size_t len, uint16_t word)
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
uint64_t kvf_xt_prefill_fill(const xt_ctx_t *c, const xt_side_t *side,
                                const kvf_rank_geometry_t *g, uint8_t *pool)
{
    const kvf_cache_layout_t *l = c->layout;
    uint64_t n = 0;

    for (int gi = 0; gi < l->num_groups; ++gi) {
        const kvf_kv_group_t *grp = &l->groups[gi];
        for (int j = 0; j < grp->num_layers; ++j) {
            if (kvf_group_is_attention(grp->kind)) {
                for (int bi = 0; bi < side->num_ids[gi]; ++bi) {
                    n += xt_fill_attn(c, g, grp->layers[j], bi,
                                      pool + kvf_attn_slot_off(g, side->ids[gi][bi], j));
                }
            } else {
                int32_t b = side->ids[gi][side->num_ids[gi] - 1];
                n += xt_fill_mamba(c, g, grp->layers[j], pool + xt_page_off(g, l->slots, b, j));
            }
        }
    }
    return n;
}

/*
 * A Mamba page's padding is dead: it keeps decode's poison, or holds prefill's when the
 * planner read it to join a block's layer slots into one descriptor (kvf_xfer_plan.h,
 * pad_bytes); either whole, nothing else. Sets @a expect's pad to the one @a page holds.
 */
static void xt_mamba_pad_expect(const kvf_rank_geometry_t *g, const uint8_t *page,
                                uint8_t *expect)
{
    size_t m = g->mamba_bytes, pad = g->page_size - m;
    uint8_t *prefill = malloc(g->page_size);

    if ((pad == 0) || (prefill == NULL) || (memcmp(page + m, expect + m, pad) == 0)) {
        free(prefill);
        return;
    }
    kvf_xt_poison(prefill, g->page_size, XT_POISON_PREFILL);
    if (memcmp(page + m, prefill + m, pad) == 0) {
        memcpy(expect + m, prefill + m, pad);
    }
    free(prefill);
}

/* Zero layer slot @a j's share of the attention block at @a block (its page at layer-major,
 * each head's slot run at head-major). */
static void xt_attn_slot_zero(const kvf_rank_geometry_t *g, uint8_t *block, int j)
{
    if (g->kv_layout != KVF_KV_HEAD_MAJOR) {
        memset(block + kvf_attn_slot_off(g, 0, j), 0, g->page_size);
        return;
    }
    for (int h = 0; h < g->shard.kv_heads; ++h) {
        memset(block + kvf_attn_slot_off(g, 0, j) + (size_t)h * g->attn.head, 0, g->attn.slot);
    }
}

/* The bytes block @a b must hold (@a gi: the group owning it, -1: none; @a bi: its logical
 * index there) into @a expect (slots pages); @a have: the pool's block (Mamba pads). */
static uint64_t xt_block_expect(const xt_ctx_t *c, const kvf_rank_geometry_t *g, int gi,
                                int bi, const uint8_t *have, uint8_t *expect)
{
    const kvf_cache_layout_t *l = c->layout;
    uint64_t n = 0;

    kvf_xt_poison(expect, (size_t)l->slots * g->page_size, XT_POISON_DECODE);
    if (gi < 0) {
        return 0;
    }
    for (int j = 0; j < l->groups[gi].num_layers; ++j) {
        int layer = l->groups[gi].layers[j];
        if (kvf_group_is_attention(l->groups[gi].kind)) {
            xt_attn_slot_zero(g, expect, j);
            n += xt_fill_attn(c, g, layer, bi, expect + kvf_attn_slot_off(g, 0, j));
        } else {
            uint8_t *page = expect + (size_t)j * g->page_size;
            kvf_xt_poison(page, g->page_size, XT_POISON_DECODE);
            n += xt_fill_mamba(c, g, layer, page);
            xt_mamba_pad_expect(g, have + (size_t)j * g->page_size, page);
        }
    }
    return n;
}

/* Decode: compare every block of the pool with what it must hold. */
kvf_status_t kvf_xt_decode_verify(const xt_ctx_t *c, xt_rank_t *r)
{
    const kvf_cache_layout_t *l = c->layout;
    const kvf_rank_geometry_t *g = &c->dec.geom[r->rank];
    int64_t nb = c->dec.num_blocks;
    size_t bytes = (size_t)l->slots * g->page_size;
    int *owner = NULL;       /* [nb]: group index owning the block, -1 */
    int *obi = NULL;         /* logical block index in that group */
    uint8_t *expect = malloc(bytes);
    kvf_status_t status = KVF_OK;

    owner = malloc(sizeof(int) * (size_t)nb);
    obi = malloc(sizeof(int) * (size_t)nb);
    if ((expect == NULL) || (owner == NULL) || (obi == NULL)) {
        status = KVF_ERR_NO_MEMORY;
        goto out;
    }
    for (int64_t i = 0; i < nb; ++i) {
        owner[i] = -1;
    }
    for (int gi = 0; gi < l->num_groups; ++gi) {
        const kvf_kv_group_t *grp = &l->groups[gi];
        for (int bi = 0; bi < c->dec.num_ids[gi]; ++bi) {
            if ((grp->kind == KVF_GROUP_MAMBA) && (bi != c->dec.num_ids[gi] - 1)) {
                continue;
            }
            owner[c->dec.ids[gi][bi]] = gi;
            obi[c->dec.ids[gi][bi]] = bi;
        }
    }
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t *have = r->host + (size_t)b * bytes;   /* the pool, host-side */
        int gi = owner[b];

        r->elements_checked += xt_block_expect(c, g, gi, obi[b], have, expect);
        r->pages_checked += (uint64_t)l->slots;
        if (memcmp(have, expect, bytes) != 0) {
            size_t k = 0;
            while (have[k] == expect[k]) {
                k++;
            }
            snprintf(r->err, sizeof(r->err),
                     "decode rank %d: block %" PRId64 " (%s, %s) differs at byte %zu of %zu"
                     " (page %zu): got 0x%02x expected 0x%02x", r->rank, b,
                     (gi < 0) ? "outside the request" :
                     (kvf_group_is_attention(l->groups[gi].kind) ? "attention" : "mamba"),
                     kvf_kv_layout_name((int)g->kv_layout), k, bytes, k / g->page_size,
                     have[k], expect[k]);
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
