/*
 * Handshake and transfer messages in C form (docs/ARCHITECTURE.md §8), and their
 * protobuf encoding (proto/kvf_xfer.proto). Everything that arrives from a
 * peer goes through an unpack function here, which rejects truncated,
 * garbage or out-of-range input with KVF_ERR_PARSE before any other code
 * sees it; semantic compatibility is kvf_compat.h's job.
 *
 * Ownership: *_pack() return malloc'd buffers the caller free()s; unpacked
 * structs that own memory have a matching *_cleanup().
 */
#ifndef KVF_HANDSHAKE_H
#define KVF_HANDSHAKE_H

#include "kvf_fingerprint.h"
#include "kvf_geometry.h"
#include "kvf_status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* NOTE: bump when a message's meaning changes; update kvf_compat.c. */
#define KVF_XFER_PROTOCOL_VERSION 3   /* 2: leases claimed/released over the side channel;
                                       * 3: the model fingerprint is XXH3 (was FNV-1a) */

#define KVF_ENGINE_ID_MAX     64     /* bytes incl. NUL */
#define KVF_XFER_MAX_REGIONS  4
#define KVF_RKEY_MAX          2048   /* packed remote key bytes */
#define KVF_WORKER_ADDR_MAX   8192   /* UCX worker address bytes */
#define KVF_XFER_MAX_TP       1024
#define KVF_LAYOUT_TAG_HND    "HND"  /* [K|V][heads][tokens][head_dim] */
#define KVF_LAYOUT_TAG_DS     "DS"

/**
 * Where a region lives (XferRegion.memory_type). HOST is the zero value: a
 * peer that sends no memory type publishes host memory.
 */
typedef enum {
    KVF_XFER_MEM_HOST = 0,            /* host memory (UCS_MEMORY_TYPE_HOST) */
    KVF_XFER_MEM_CUDA = 1,            /* CUDA device memory (UCS_MEMORY_TYPE_CUDA) */
} kvf_xfer_mem_type_t;
#define KVF_XFER_MEM_TYPES 2          /* values below this are known; unpack refuses others */

/** "host", "cuda", or "unknown" for a value outside kvf_xfer_mem_type_t. */
const char *kvf_xfer_mem_type_name(kvf_xfer_mem_type_t type);

#define KVF_XFER_IPC_HANDLE_BYTES 64   /* cudaIpcMemHandle_t */
#define KVF_XFER_IPC_UUID_BYTES   16   /* a GPU's UUID */
#define KVF_XFER_NODE_MAX         64   /* node id bytes incl. NUL */

/**
 * A CUDA IPC share of a region (XferIpc): what a decode on the same node
 * maps instead of reading over UCX (transfer/ucx/kvf_connector_ipc.c).
 * Unpack accepts it only whole: a handle of exactly 64 bytes, a UUID of 16,
 * a node id of 1..63 printable characters, an offset.
 */
typedef struct kvf_xfer_ipc_meta {
    uint8_t  handle[KVF_XFER_IPC_HANDLE_BYTES];
    uint64_t offset;                  /* region start - allocation start, bytes */
    char     node[KVF_XFER_NODE_MAX]; /* the owner's node (boot id) */
    uint8_t  uuid[KVF_XFER_IPC_UUID_BYTES];   /* the GPU holding the region */
} kvf_xfer_ipc_meta_t;

/** One registered region as published. */
typedef struct kvf_xfer_region_meta {
    uint64_t addr;                    /* base address in the owner's process */
    uint64_t length;                  /* bytes */
    kvf_xfer_mem_type_t mem_type;     /* where those bytes live; HOST when unsaid */
    size_t   rkey_len;
    uint8_t  rkey[KVF_RKEY_MAX];      /* packed UCX remote key */
    bool     has_ipc;                 /* CUDA regions shared for the same-node path */
    kvf_xfer_ipc_meta_t ipc;
} kvf_xfer_region_meta_t;

/** What one TP rank publishes at handshake. */
typedef struct kvf_rank_meta {
    char              engine_id[KVF_ENGINE_ID_MAX];
    uint32_t          protocol_version;
    uint64_t          model_fingerprint;     /* kvf_model_config_fingerprint() */
    int               tp_rank;
    int               tp_size;
    int               block_size;            /* logical, tokens */
    int               kernel_block_size;     /* tokens */
    uint64_t          page_size;             /* bytes */
    int               slots;                 /* pages per block */
    int64_t           num_blocks;
    kvf_dtype_t       kv_dtype;
    kvf_dtype_t       conv_dtype;
    kvf_dtype_t       ssm_dtype;
    int               user_block_size;
    kvf_align_mode_t  align;
    char              layout_tag[8];         /* "HND" or "DS" */
    kvf_kv_layout_t   kv_layout;             /* attention block layout (0: layer-major) */
    int               num_regions;
    kvf_xfer_region_meta_t regions[KVF_XFER_MAX_REGIONS];
    size_t            worker_addr_len;
    uint8_t           worker_addr[KVF_WORKER_ADDR_MAX];
    uint64_t          incarnation;           /* random per process; 0 = not advertised */
    /* kvf_model_digest() of the model folder loaded, lowercase hex; "" = not
     * advertised (a process that loaded no folder, e.g. a tool) */
    char              model_digest[KVF_MODEL_DIGEST_HEX + 1];
    char              model_path[KVF_MODEL_PATH_MAX];   /* that folder; no control chars */
    /* the sliding window (kvf_rank_meta_set_window()): the largest layer window, 0
     * without a sliding layer; bit l % 8 of sliding_layers[l / 8] set when layer l slides */
    int               sliding_window;
    int               sliding_layers_len;    /* bytes of sliding_layers used; 0: none */
    uint8_t           sliding_layers[KVF_MAX_LAYERS / 8];
} kvf_rank_meta_t;

/** One reason a handshake was refused; see kvf_refusal_format(). local is the value of the
 * side that found it (the wire's Refusal.local), remote the other side's. */
typedef struct kvf_refusal {
    char field[48];
    char local[288];                  /* e.g. "<digest> (<model folder>)" */
    char remote[288];
    char why[192];
} kvf_refusal_t;

#define KVF_MAX_REFUSALS 16

/**
 * "handshake refused: <field> prefill=<v> decode=<v>: <why>" into @a buf
 * (always NUL-terminated, truncated to @a len): each value named by its role,
 * @a local_is_prefill saying which side found the refusal (prefill's side
 * channel: true; decode's compatibility check: false).
 */
void kvf_refusal_format(const kvf_refusal_t *refusal, bool local_is_prefill, char *buf,
                        size_t len);

/** What a lease operation asks (decode -> prefill, docs/ARCHITECTURE.md §9). */
typedef enum {
    KVF_LEASE_OP_CLAIM   = 1,   /* bind the lease to the requester, extend it; before any GET
                                 * and, as a heartbeat, while the request waits in line */
    KVF_LEASE_OP_RELEASE = 2,   /* one decode rank is done reading; answered valid/expired */
} kvf_lease_op_t;

/** Prefill's answer to a lease operation. */
typedef enum {
    KVF_LEASE_VALID   = 0,      /* the lease was held (and is, for a claim) */
    KVF_LEASE_EXPIRED = 1,      /* it expired or was aborted: the pages may hold other KV */
    KVF_LEASE_REFUSED = 2,      /* unknown lease, wrong nonce, another engine, a replay */
    KVF_LEASE_CORRUPT = 3,      /* release: held, but a KV digest differs: do not use the bytes */
} kvf_lease_verdict_t;

/** What one decode rank read from one prefill rank (a release with --kv-digest on). */
typedef struct kvf_kv_digest {
    int       decode_rank;
    int       prefill_rank;
    uint64_t  digest;        /* kvf_kv_digest_ranges() of the bytes as decode received them */
    size_t    num_ranges;
    uint64_t *ranges;        /* [2 * num_ranges]: prefill region offset, length; read order */
} kvf_kv_digest_t;

#define KVF_LEASE_MAX_DIGESTS 4096   /* per release */

/**
 * XXH3-64 of @a num_ranges byte ranges of @a base ([2i] offset, [2i+1]
 * length), in order: the one digest both sides compute.
 */
uint64_t kvf_kv_digest_ranges(const uint8_t *base, const uint64_t *ranges, size_t num_ranges);

typedef struct kvf_lease_msg {
    kvf_lease_op_t op;
    char           request_id[KVF_ENGINE_ID_MAX];
    uint64_t       nonce;                         /* TransferParams.nonce */
    int            decode_rank;                   /* release: in [0, decode_tp) */
    int            decode_tp;                     /* release: 1..KVF_XFER_MAX_TP */
    kvf_status_t   status;                        /* release: the rank's pull status */
    bool           all_ranks;                     /* release: covers every decode rank */
    bool           has_ids_digest;
    uint64_t       ids_digest;                    /* kvf_xfer_ids_digest() of the lists read */
    int            num_digests;                   /* release: KV digests (0: none sent) */
    kvf_kv_digest_t *digests;                     /* [num_digests]; the filler's memory, or
                                                   * kvf_handshake_request_cleanup() after unpack */
} kvf_lease_msg_t;

typedef struct kvf_lease_answer {
    kvf_lease_verdict_t verdict;
    uint64_t            ms_left;                  /* lease time left, ms (a duration) */
    char                why[192];                 /* "" when valid */
} kvf_lease_answer_t;

/**
 * Digest of a request's block-id lists (XXH3-64 over the group count, and
 * per group its length and ids, little-endian): what a lease operation
 * carries so prefill can refuse one for other blocks than it leased.
 */
uint64_t kvf_xfer_ids_digest(int32_t *const *ids, const int *num_ids, int num_groups);

/** Decode -> prefill: a metadata request, or (has_lease) a lease operation. */
typedef struct kvf_handshake_request {
    char     engine_id[KVF_ENGINE_ID_MAX];        /* requester */
    uint32_t protocol_version;
    char     want_engine_id[KVF_ENGINE_ID_MAX];   /* "" = any */
    uint32_t xfer_timeout_ms;                     /* requester's transfer timeout; 0 = unsaid */
    bool             has_lease;
    kvf_lease_msg_t  lease;
} kvf_handshake_request_t;

/** Prefill -> decode. ranks is owned (kvf_handshake_reply_cleanup()). */
typedef struct kvf_handshake_reply {
    bool             accepted;
    char             engine_id[KVF_ENGINE_ID_MAX];
    int              num_ranks;
    kvf_rank_meta_t *ranks;                       /* [num_ranks], index = tp_rank */
    int              num_refusals;
    kvf_refusal_t    refusals[KVF_MAX_REFUSALS];
    char             error[192];                  /* "" unless the request was bad */
} kvf_handshake_reply_t;

kvf_status_t kvf_handshake_request_pack(const kvf_handshake_request_t *req, uint8_t **buf_p,
                                        size_t *len_p);

/**
 * @return KVF_OK (a lease's digests are allocated: kvf_handshake_request_cleanup());
 *         KVF_ERR_PARSE for malformed input (logged at debug level), nothing to free.
 */
kvf_status_t kvf_handshake_request_unpack(const uint8_t *buf, size_t len,
                                          kvf_handshake_request_t *req_p);

/** Free what an unpacked request owns (a release's digests). */
void kvf_handshake_request_cleanup(kvf_handshake_request_t *req);

kvf_status_t kvf_handshake_reply_pack(const kvf_handshake_reply_t *reply, uint8_t **buf_p,
                                      size_t *len_p);

/**
 * Decode and validate a reply: every rank's required fields present, in
 * range (tp_rank < tp_size <= KVF_XFER_MAX_TP, dtypes known, sizes > 0,
 * regions <= KVF_XFER_MAX_REGIONS, key and address lengths within bounds,
 * a region's memory type below KVF_XFER_MEM_TYPES, absent = host),
 * one entry per rank 0..tp_size-1 (sorted into ranks[tp_rank]).
 *
 * @return KVF_OK and *reply_p filled (cleanup needed); KVF_ERR_PARSE with
 *         *reply_p left empty (no cleanup needed, but harmless); KVF_ERR_NO_MEMORY.
 */
kvf_status_t kvf_handshake_reply_unpack(const uint8_t *buf, size_t len,
                                        kvf_handshake_reply_t *reply_p);

/** Free what an unpacked or caller-built reply owns; the struct becomes empty. */
void kvf_handshake_reply_cleanup(kvf_handshake_reply_t *reply);

/** A lease answer as a HandshakeReply (accepted, no ranks, `lease` set). */
kvf_status_t kvf_lease_reply_pack(const char *engine_id, const kvf_lease_answer_t *answer,
                                  uint8_t **buf_p, size_t *len_p);

/**
 * Decode a lease answer; @a engine_id_p (KVF_ENGINE_ID_MAX bytes) gets the
 * answering engine. @return KVF_OK; KVF_ERR_PARSE for anything else (a
 * metadata reply, an unknown verdict, oversized strings).
 */
kvf_status_t kvf_lease_reply_unpack(const uint8_t *buf, size_t len, char *engine_id_p,
                                    kvf_lease_answer_t *answer_p);

/** Decode rank -> prefill rank release/acknowledgement. */
typedef struct kvf_xfer_notification {
    char         request_id[KVF_ENGINE_ID_MAX];
    int          rank;
    kvf_status_t status;
    char         engine_id[KVF_ENGINE_ID_MAX];
} kvf_xfer_notification_t;

kvf_status_t kvf_xfer_notification_pack(const kvf_xfer_notification_t *n, uint8_t **buf_p,
                                        size_t *len_p);
kvf_status_t kvf_xfer_notification_unpack(const uint8_t *buf, size_t len,
                                          kvf_xfer_notification_t *n_p);

/**
 * Transfer parameters (prefill -> decode, through the proxy): which engine
 * to handshake with, where its side channel listens, the request's block
 * ids per KV cache group, and what the lease and the first token are.
 * ids are owned (kvf_xfer_params_msg_cleanup()).
 */
typedef struct kvf_xfer_params_msg {
    char      engine_id[KVF_ENGINE_ID_MAX];      /* non-empty */
    char      host[64];                          /* side channel host, non-empty */
    int       port;                              /* side channel port, 1..65535 */
    int       num_groups;                        /* 1..KVF_MAX_KV_GROUPS */
    int32_t  *ids[KVF_MAX_KV_GROUPS];            /* [num_groups][num_ids[g]], each >= 0 */
    int       num_ids[KVF_MAX_KV_GROUPS];        /* <= KVF_XFER_MAX_IDS_PER_GROUP */
    int64_t   num_tokens;                        /* 1..2^40 */
    bool      has_lease_expiry;
    uint64_t  lease_expiry_ms;                   /* CLOCK_REALTIME ms; 0 when absent */
    int32_t   first_token;                       /* always present */
    char      request_id[KVF_ENGINE_ID_MAX];     /* may be empty */
    bool      has_incarnation;
    uint64_t  incarnation;                       /* the prefill process's; 0 when absent */
    bool      has_lease;                         /* lease_ms_left and nonce both present */
    uint64_t  lease_ms_left;                     /* lease time left when sent, ms (a duration) */
    uint64_t  nonce;                             /* per lease: claims/releases must echo it */
    uint64_t  prefix_source;                     /* prefill's numerics class; 0: unknown */
} kvf_xfer_params_msg_t;

#define KVF_XFER_MAX_IDS_PER_GROUP (1 << 20)

/** Pack @a p (has_* fields honoured) into a new buffer (*buf_p, free()). */
kvf_status_t kvf_xfer_params_msg_pack(const kvf_xfer_params_msg_t *p, uint8_t **buf_p,
                                      size_t *len_p);

struct Kvf__TransferParams;

/**
 * THE decoder of transfer parameters: every field a peer (or a proxy) could
 * have made up is checked here and nowhere else, then copied. Used by
 * kvf-decode on the TransferParams inside a DecodeRequest, by
 * kvf_xfer_params_msg_unpack() on a packed message (the tools), and by the
 * fuzz target through both.
 *
 * Checks, in this order (the first failing one is reported): engine id and
 * host present and short enough, port in 1..65535, first token present,
 * num_tokens in 1..2^40 (and == @a expect_tokens when that is > 0), 1..
 * KVF_MAX_KV_GROUPS groups, at most KVF_XFER_MAX_IDS_PER_GROUP ids per
 * group, every id >= 0, request id short enough.
 *
 * @param [in]  m              as protobuf-c unpacked it; NULL is refused.
 * @param [in]  expect_tokens  prompt length the caller holds; 0: any.
 * @param [out] p_p            filled on success only; owns the id copies.
 * @param [out] err            why not, "transfer params: ..." naming the
 *                             field and value; may be NULL.
 * @return KVF_OK; KVF_ERR_PARSE on any violation (nothing allocated);
 *         KVF_ERR_NO_MEMORY.
 */
kvf_status_t kvf_xfer_params_decode(const struct Kvf__TransferParams *m, int64_t expect_tokens,
                                    kvf_xfer_params_msg_t *p_p, char *err, size_t err_len);

/** Unpack a packed TransferParams and kvf_xfer_params_decode() it (no token expectation). */
kvf_status_t kvf_xfer_params_msg_unpack(const uint8_t *buf, size_t len,
                                        kvf_xfer_params_msg_t *p_p);
void kvf_xfer_params_msg_cleanup(kvf_xfer_params_msg_t *p);

#endif
