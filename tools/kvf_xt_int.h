/*
 * Internal to kvf xfer-test and kvf bench (kvf_xfer_test.c and the kvf_xt_*.c
 * files it is split into): options, the per-side and per-rank state, and the
 * functions one part calls in another. kvf_xfer_test.c's opening comment
 * describes the design.
 */
#ifndef KVF_XT_INT_H
#define KVF_XT_INT_H

#include "kvf_config.h"
#include "kvf_connector.h"
#include "kvf_connector_ucx.h"
#include "kvf_device.h"
#include "kvf_gather.h"
#include "kvf_kern_status.h"
#include "kvf_handshake.h"
#include "kvf_layout.h"
#include "kvf_log.h"
#include "kvf_time.h"
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
    int     block_size;   /* BLOCK_SIZE: the user block size (alignment unit), both sides */
    char    kv_dtype[KVF_CONFIG_STR_MAX];
    char    prefill_kv_dtype[KVF_CONFIG_STR_MAX];
    char    kv_layout[KVF_CONFIG_STR_MAX];
    char    prefill_kv_layout[KVF_CONFIG_STR_MAX];
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
    bool    ucx_pools;   /* pool_alloc == "ucx" (and the pools are host memory) */
    char    device[KVF_CONFIG_STR_MAX];
    kvf_device_kind_t dev_kind;   /* --device: where both sides' pools live */
    int     dev_ordinal;
    bool    copy_limit;
    int     plan_reps;   /* --plan-reps: time the planner alone this many times */
    char    path[KVF_CONFIG_STR_MAX];   /* --path auto|ucx|ipc */
    kvf_connector_path_t path_kind;
} xt_opts_t;

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
                                       ucx_pools: the connector's, gone with it;
                                       --device cuda: device memory (kvf_device_alloc) */
    uint8_t         *host;          /* what the pattern is written to and verified in:
                                       the pool itself, or its host copy (device pools) */
    kvf_device_t     dev;           /* the pool's device (the CPU for host pools) */
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
    uint64_t         t_plan[XT_MAX_ITERS + 2];     /* ns of start_pull before its first post */
    uint64_t         t_cpu[XT_MAX_ITERS + 2];      /* thread CPU ns of start_pull */
    uint64_t         t_digest[XT_MAX_ITERS + 2];   /* ns hashing what landed (req_digests) */
    uint64_t         t_raw_start[XT_MAX_ITERS], t_raw_end[XT_MAX_ITERS];
    uint64_t         t_fail;
    char             transports[640];
    kvf_connector_path_t path;      /* what moved the last pull (req_stats) */
    char             path_why[192]; /* UCX: why not the same-node path */
    uint64_t         gather_ops;    /* same-node path: ops of the rank's gathers */
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


/* ---- kvf_xt_pattern.c ---- */

/* Fill @a len bytes with the 16-bit @a word (the last odd byte with its low half). */
void kvf_xt_poison(uint8_t *p, size_t len, uint16_t word);

/* Prefill: fill the request's pages (tokens < N, Mamba state); rest stays poisoned. */
uint64_t kvf_xt_prefill_fill(const xt_ctx_t *c, const xt_side_t *side, const kvf_rank_geometry_t *g,
                         uint8_t *pool);

/* Decode: compare every page of the pool with what it must hold. */
kvf_status_t kvf_xt_decode_verify(const xt_ctx_t *c, xt_rank_t *r);

/* ---- kvf_xt_ranks.c ---- */

/*
 * Geometry of every rank of one side, pool size and the request's block ids
 * (a seeded permutation, so ids are scattered and never contiguous by luck).
 */
kvf_status_t kvf_xt_side_init(xt_ctx_t *c, xt_side_t *side, bool prefill);

/* Free what kvf_xt_side_init allocated (safe on a zeroed side). */
void kvf_xt_side_cleanup(xt_side_t *side);

/* This process's connector for @a side (c->conn, c->xops). */
kvf_status_t kvf_xt_conn_create(xt_ctx_t *c, const xt_side_t *side);

/* Pool, pattern and registration of one rank (runs on the rank's thread). */
kvf_status_t kvf_xt_rank_setup(xt_rank_t *r);

/* Device pools: r->host -> the pool (push) or the pool -> r->host (pull); host pools: no-op. */
kvf_status_t kvf_xt_pool_push(xt_rank_t *r);
kvf_status_t kvf_xt_pool_pull(xt_rank_t *r);

/* Free one rank's pool after its connector is gone (connector-owned pools: nothing). */
void kvf_xt_pool_free(xt_rank_t *r);

/*
 * --device cuda[:N]: check in a throw-away child process (so neither side
 * inherits a CUDA runtime across fork) that CUDA device N can be used here.
 * Returns 0, or 1 after printing why not (no GPU, a build without CUDA).
 */
int kvf_xt_device_probe(const xt_ctx_t *c, const char *prog);

/*
 * One thread per rank of @a side running @a thread_fn on c->ranks[r] (ctx,
 * side and rank set), after initialising c->barrier for side->tp + 1 parties
 * (the ranks and the caller).
 */
void kvf_xt_start_ranks(xt_ctx_t *c, xt_side_t *side, void *(*thread_fn)(void *));

/* Drop the bench's raw agent of one rank (peers, region, agent). */
void kvf_xt_raw_teardown(xt_rank_t *r);

/* ---- kvf_xt_prefill.c ---- */

/* The prefill instance (child process). Returns the exit code. */
int kvf_xt_prefill_main(xt_ctx_t *c, int fd);

/* ---- kvf_xt_decode.c ---- */

/* bench: whether a raw GET (iteration p - 1) comes before pull p. */
bool kvf_xt_raw_before(const xt_ctx_t *c, int p);

/* Index of the pull timed as iteration @a it. */
int kvf_xt_timed_pull(const xt_ctx_t *c, int it);

/* One decode rank: setup, the barrier phases of kvf_xfer_test.c's run, pulls, verify. */
void *kvf_xt_decode_thread(void *arg);

/* Reap the prefill child within @a timeout_ms (then SIGKILL it). Returns its exit code. */
int kvf_xt_reap(pid_t pid, int timeout_ms);

/* Read one length-prefixed message from the prefill child. NULL on failure. */
uint8_t *kvf_xt_read_msg(int fd, int timeout_ms, uint32_t *len_p);

/* ---- kvf_xt_bench.c ---- */

/*
 * The plan of decode rank @a d, from the geometry both sides were given (the
 * connector plans the same from the handshake; this copy only feeds the
 * descriptor file and the memcpy reference, never a transfer).
 */
kvf_status_t kvf_xt_plan_rank(const xt_ctx_t *c, int d, kvf_xfer_plan_t **plan_p);
/* The same with the pair's pieces (kvf_xt_pieces_rank), as a connector's later pulls plan. */
kvf_status_t kvf_xt_plan_rank_with(const xt_ctx_t *c, int d, const kvf_xfer_pieces_t *pieces,
                                   kvf_xfer_plan_t **plan_p);
kvf_status_t kvf_xt_pieces_rank(const xt_ctx_t *c, int d, kvf_xfer_pieces_t **pieces_p);

/* Write the request's descriptor lists as JSON to --descs-out. 0 on success. */
int kvf_xt_write_descs(const xt_ctx_t *c, kvf_xfer_plan_t **plans);

/*
 * memcpy of every descriptor list, one thread per decode rank, between
 * buffers of the pools' sizes in this process: the copy limit of the
 * machine for this request. Returns the median ns, 0 on failure.
 */
uint64_t kvf_xt_copy_limit(const xt_ctx_t *c, kvf_xfer_plan_t **plans);

/*
 * Device pools: one device-to-device copy of @a bytes on --device, the same
 * iterations as the pulls: the device's copy rate for this request. Returns
 * the median ns, 0 on failure.
 */
uint64_t kvf_xt_device_copy_limit(const xt_ctx_t *c, uint64_t bytes);

/* Nanoseconds as milliseconds. */
static inline double xt_ms(uint64_t ns)
{
    return (double)ns / 1e6;
}

/* qsort order of uint64_t values. */
static inline int xt_cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

#endif
