/*
 * Private to the UCX agent's files (kvf_ucx_agent.c: context, worker and
 * notifications; kvf_ucx_mem.c: regions and remote keys; kvf_ucx_peer.c:
 * endpoints; kvf_ucx_xfer.c: batched one-sided transfers). Nothing outside
 * transfer/ucx/kvf_ucx_*.c includes it: the handles stay opaque.
 */
#ifndef KVF_UCX_AGENT_INT_H
#define KVF_UCX_AGENT_INT_H

#include "kvf_ucx_agent.h"

#include <ucp/api/ucp.h>

#define KVF_UCX_AM_NOTIFY      0x4b56   /* active message id of notifications */
#define KVF_UCX_NOTIFY_MAX     4096     /* bytes per notification */
#define KVF_UCX_NOTIFY_RING    256      /* queued notifications */
#define KVF_UCX_MAX_PEERS      1024
#define KVF_UCX_ARM_MAX_ROUNDS 1024     /* progress rounds before arm gives up: busy */

/* What the UCX headers offer for memory types: ucp_mem_map's memory_type and
 * ucp_request_param_t's (both UCX 1.10), ucp_context_query's memory_types
 * (1.12). Without the query a UCX counts as reaching host memory only. */
#define KVF_UCX_HAS_MEM_TYPE_PARAMS (UCP_API_VERSION >= UCP_VERSION(1, 10))
#define KVF_UCX_HAS_MEM_TYPES_QUERY (UCP_API_VERSION >= UCP_VERSION(1, 12))
/* ucp_request_param_t's memh and UCP_OP_ATTR_FLAG_MULTI_SEND (both in 1.13's headers) */
#define KVF_UCX_HAS_OP_MEMH         (UCP_API_VERSION >= UCP_VERSION(1, 13))

typedef struct kvf_ucx_region {
    void    *addr;
    size_t   len;
    ucp_mem_h memh;
    kvf_ucx_access_t access;
    kvf_xfer_mem_type_t mem_type;   /* kvf_device_ptr_is_cuda() of addr at map */
} kvf_ucx_region_t;

typedef struct kvf_ucx_notify_slot {
    size_t  len;
    uint8_t data[KVF_UCX_NOTIFY_MAX];
} kvf_ucx_notify_slot_t;

struct kvf_ucx_agent {
    char             name[64];
    uint32_t         timeout_ms;
    bool             peer_err_mode;
    kvf_ucx_access_t access;        /* of the regions it maps */
    ucp_context_h    context;
    uint64_t         mem_types;     /* UCS_BIT(ucs_memory_type_t) this UCX reaches */
    ucp_worker_h     worker;
    int              num_regions;
    kvf_ucx_region_t regions[KVF_XFER_MAX_REGIONS];
    uint64_t         ops_posted;
    char             tls_env[128];
    char             device_cfg[160];  /* kvf_ucx_agent_device_config() */
    char             transports[640];
    kvf_ucx_peer_h   peers[KVF_UCX_MAX_PEERS];   /* connected, for destroy */
    int              num_peers;
    kvf_ucx_peer_h   parked[KVF_UCX_MAX_PEERS];  /* close timed out: callbacks may fire */
    int              num_parked;

    /* received notifications, FIFO */
    kvf_ucx_notify_slot_t *ring;
    unsigned         ring_head, ring_count;
    uint64_t         notify_dropped;
};

typedef struct kvf_ucx_remote_region {
    uint64_t  addr;
    uint64_t  len;
    ucp_rkey_h rkey;
    kvf_xfer_mem_type_t mem_type;   /* as the peer published it */
    const uint8_t *ptr;             /* the region mapped here (ucp_rkey_ptr: shared memory of
                                     * a peer on this node), read by memcpy; NULL: GETs */
} kvf_ucx_remote_region_t;

struct kvf_ucx_peer {
    kvf_ucx_agent_h         agent;
    ucp_ep_h                ep;
    kvf_status_t            status;       /* KVF_OK or first failure */
    bool                    closing;      /* in kvf_ucx_peer_destroy(): errors expected */
    void                   *close_req;    /* parked: the close request still in flight */
    int                     remote_rank;
    int                     num_regions;
    kvf_ucx_remote_region_t regions[KVF_XFER_MAX_REGIONS];
};

struct kvf_ucx_batch {
    kvf_ucx_peer_h peer;
    void          *flush_req;   /* NULL once completed */
    kvf_status_t   status;      /* KVF_INPROGRESS until the flush completes */
};

/*
 * The memory types this agent's UCX context reaches (ucp_context_query's
 * memory_types; host only when the query is missing or fails), into
 * agent->mem_types. Called once by kvf_ucx_agent_create() (kvf_ucx_mem.c).
 */
void kvf_ucx_mem_types_query(kvf_ucx_agent_h agent);

/* Free parked peers whose close request completed (kvf_ucx_peer.c). */
void kvf_ucx_reap_parked(kvf_ucx_agent_h agent);

#endif
