/*
 * The one stride description of an attention cache block (CPU and CUDA), which every
 * address computation of an attention cache element uses: the kernels' K/V writes and
 * reads, the transfer planner and its gather templates, and the geometry's offsets.
 *
 * A block id b owns the `slots` pages [b * slots, (b + 1) * slots) of page_size bytes
 * whatever the layout (so a block holds a Mamba group's pages, one per slot, in another
 * request). Inside an attention block, with run = kernel_block_size * head_dim * elt (one
 * head's tokens of one kernel block of K or of V, always contiguous, token-major):
 *
 *   layer-major (KVF_KV_LAYER_MAJOR, the default, layout tag HND):
 *       [layer slot (page_size bytes)][kernel block][K|V][kv head][tokens][head_dim]
 *   head-major (KVF_KV_HEAD_MAJOR):
 *       [kv head][layer slot][kernel block][K|V][tokens][head_dim]
 *     so one KV head's data of every layer slot of the block is one contiguous range,
 *     and a contiguous head range (a TP source rank's share) is one range too.
 *
 * element(b, slot j, kernel block k, kv, head h, row t, dim d) =
 *     b * block + h * head + j * slot + k * kblock + kv * kv_stride + (t * head_dim + d) * elt
 *
 * Design / Rejected. Chosen: one set of byte strides for both layouts, so a kernel, the
 * planner and the tests compute an address the same way whatever the layout, and head-major
 * changes no loop (a run of kbs rows is contiguous in both). Rejected: a second set of
 * address helpers per layout (every path would branch, and the two could drift apart), and
 * a layout switch inside the kernels' inner loops (the strides are computed once per call).
 */
#ifndef KVF_KV_LAYOUT_H
#define KVF_KV_LAYOUT_H

#include "kvf_hd.h"

#include <stddef.h>
#include <stdint.h>

typedef enum kvf_kv_layout {
    KVF_KV_LAYER_MAJOR = 0,   /* a page per layer slot (today's layout; the default) */
    KVF_KV_HEAD_MAJOR  = 1,   /* a head's slots together (cross-layer, vLLM HND + layers) */
} kvf_kv_layout_t;

#define KVF_KV_LAYOUT_COUNT 2

/** Byte strides of an attention block (see above); token stride is head_dim * elt. */
typedef struct kvf_kv_strides {
    size_t block;    /* slots * page_size at both layouts */
    size_t head;
    size_t slot;
    size_t kblock;
    size_t kv;       /* K -> V */
} kvf_kv_strides_t;

/**
 * Strides of @a layout for a block of @a slots pages of @a page_size bytes, ppl kernel blocks
 * of @a kbs tokens, @a kv_heads heads of @a head_dim elements of @a elt bytes. The attention
 * bytes (slots * ppl * 2 * kv_heads * kbs * head_dim * elt) must fit the block; page_size may
 * exceed ppl kernel blocks (the rest of the block is never addressed). An unknown layout
 * gives the layer-major strides (callers validate the value by name first).
 */
static inline KVF_HD kvf_kv_strides_t kvf_kv_strides_make(int layout, int slots,
                                                          size_t page_size, int ppl,
                                                          int kv_heads, int kbs, int head_dim,
                                                          size_t elt)
{
    kvf_kv_strides_t s;
    size_t run = (size_t)kbs * (size_t)head_dim * elt;

    s.block = (size_t)slots * page_size;
    if (layout == (int)KVF_KV_HEAD_MAJOR) {
        s.kv = run;
        s.kblock = 2u * run;
        s.slot = (size_t)ppl * s.kblock;
        s.head = (size_t)slots * s.slot;
    } else {
        s.head = run;
        s.kv = (size_t)kv_heads * run;
        s.kblock = 2u * s.kv;
        s.slot = page_size;
    }
    return s;
}

/** Byte offset of (block b, layer slot j, kernel block k, K/V kv, head h, row 0, dim 0). */
static inline KVF_HD size_t kvf_kv_run_off(const kvf_kv_strides_t *s, size_t b, size_t j,
                                           size_t k, size_t kv, size_t h)
{
    return b * s->block + h * s->head + j * s->slot + k * s->kblock + kv * s->kv;
}

/**
 * Byte offset from the pool base of the run (kv, head h) of the kernel block holding token
 * @a pos of a request with @a block_table, layer slot @a slot; @a pos validated by the caller.
 */
static inline KVF_HD size_t kvf_kv_pos_run_off(const kvf_kv_strides_t *s,
                                               const int32_t *block_table, int block_size,
                                               int kbs, int slot, int pos, int kv, int h)
{
    int32_t b = block_table[pos / block_size];
    return kvf_kv_run_off(s, (size_t)b, (size_t)slot, (size_t)((pos % block_size) / kbs),
                          (size_t)kv, (size_t)h);
}

/** "layer-major" / "head-major"; "?" for another value. */
static inline const char *kvf_kv_layout_name(int layout)
{
    return (layout == (int)KVF_KV_LAYER_MAJOR) ? "layer-major" :
           (layout == (int)KVF_KV_HEAD_MAJOR) ? "head-major" : "?";
}

#endif
