/*
 * Inside the planner: the pieces of an (engine, rank) pair (kvf_xfer_pieces_create()), for
 * kvf_xfer_tmpl.c, which turns them into the same-node gather's templates. Not for other
 * users.
 */
#ifndef KVF_XFER_PLAN_INT_H
#define KVF_XFER_PLAN_INT_H

#include "kvf_xfer_plan.h"

/*
 * One piece of a page to read: bytes from the local page start, from the
 * remote page start of prefill rank @a rank. Every layer slot of every Mamba
 * group reads the same pieces (only the two page offsets move), and so does
 * every whole attention block when both sides' block and kernel block sizes
 * are equal, so they are derived once per plan and emitted per page: 27
 * layers x 136 Mamba pieces of the 9B model's decode rank cost 136
 * derivations, not 3672.
 */
typedef struct kvf_xfer_piece {
    int      rank;
    uint64_t loff;
    uint64_t roff;
    uint64_t len;
    uint64_t pad;    /* of len, the page padding read after the data (kvf_xfer_mamba_pad) */
} kvf_xfer_piece_t;

struct kvf_xfer_pieces {
    const kvf_model_config_t *cfg;
    const kvf_cache_layout_t *layout;
    int                       local_tp, local_rank, remote_tp;
    bool                      coalesce;
    kvf_rank_geometry_t       local_geom;
    kvf_rank_geometry_t      *remote_geoms;                    /* [remote_tp], copies */
    int                       attn_src[KVF_MAX_KV_HEADS];
    int                       attn_src_head[KVF_MAX_KV_HEADS];
    bool                      attn_mapped;
    int                       attn_whole;
    kvf_xfer_piece_t         *attn, *mamba;
    size_t                    num_attn, num_mamba;
};

#endif
