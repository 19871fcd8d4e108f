/*
 * UCX agent: context + worker per rank, registered regions, peers, batched
 * one-sided transfers and notifications.
 *
 * Design:
 * - One batch = N ucp_get_nbx/ucp_put_nbx without callbacks (their requests
 *   are released at once; UCX keeps driving them) followed by one
 *   ucp_ep_flush_nbx whose callback marks the batch done. One completion per
 *   batch, no per-descriptor bookkeeping, and the flush fails if any
 *   operation before it failed (peer error mode). Rejected: a callback and
 *   counter per descriptor (NIXL does this) — 10^5 callbacks per request for
 *   a KV pull of a long prompt, for no extra information.
 * - Dead peers: endpoints are created with UCP_ERR_HANDLING_MODE_PEER; the
 *   error callback records a KVF_ERR_PEER_* status on the peer and every
 *   wait loop checks it, so a reset surfaces on the next progress call. A
 *   peer that is simply silent is caught by the timeout of each wait; UCX's
 *   own keepalive (20 s) is far too slow for §9's "about a second".
 * - Peer error mode disables shared-memory transports unless
 *   UCX_POSIX_ERROR_HANDLING / UCX_SYSV_ERROR_HANDLING are set; we set them
 *   (once per process, before ucp_config_read) unless the user did.
 * - Notifications arrive in a worker callback and are copied into a small
 *   ring; they are tiny, so eager protocol is forced on send.
 * - Every wait loop checks its deadline on every iteration, not only when
 *   progress found nothing to do: a worker kept busy by other traffic (a
 *   stream of notifications, another peer's transfers) must not stretch a
 *   wait past its timeout.
 * - A close that times out parks the peer instead of freeing it: the
 *   endpoint's error callback (arg = the peer) and the close request may
 *   still fire. A parked peer is freed once its close request completed
 *   (checked by kvf_ucx_agent_progress() and each destroy), or after the
 *   worker itself is gone (agent destroy). Rejected: freeing at once (a
 *   use-after-free when the peer later resets) and waiting without bound
 *   (a stuck peer would wedge the caller).
 */
#include "kvf_ucx_agent.h"
#include "kvf_time.h"

#include "kvf_fault.h"
#include "kvf_log.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <ucp/api/ucp.h>

#define KVF_UCX_AM_NOTIFY      0x4b56   /* active message id of notifications */
#define KVF_UCX_NOTIFY_MAX     4096     /* bytes per notification */
#define KVF_UCX_NOTIFY_RING    256      /* queued notifications */
#define KVF_UCX_MAX_PEERS      1024
#define KVF_UCX_ARM_MAX_ROUNDS 1024     /* progress rounds before arm gives up: busy */

typedef struct kvf_ucx_region {
    void    *addr;
    size_t   len;
    ucp_mem_h memh;
} kvf_ucx_region_t;

typedef struct kvf_ucx_notify_slot {
    size_t  len;
    uint8_t data[KVF_UCX_NOTIFY_MAX];
} kvf_ucx_notify_slot_t;

struct kvf_ucx_agent {
    char             name[64];
    uint32_t         timeout_ms;
    bool             peer_err_mode;
    ucp_context_h    context;
    ucp_worker_h     worker;
    int              num_regions;
    kvf_ucx_region_t regions[KVF_XFER_MAX_REGIONS];
    uint64_t         ops_posted;
    char             tls_env[128];
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

/* -------------------------------------------------------------------- */

uint64_t kvf_ucx_now_ns(void)
{
    return kvf_time_now_ns();
}

kvf_status_t kvf_ucx_status(ucs_status_t status)
{
    switch (status) {
    case UCS_OK:
        return KVF_OK;
    case UCS_INPROGRESS:
        return KVF_INPROGRESS;
    case UCS_ERR_NO_MEMORY:
        return KVF_ERR_NO_MEMORY;
    case UCS_ERR_INVALID_PARAM:
        return KVF_ERR_INVALID_PARAM;
    case UCS_ERR_UNSUPPORTED:
        return KVF_ERR_UNSUPPORTED;
    case UCS_ERR_CANCELED:
        return KVF_ERR_CANCELED;
    case UCS_ERR_NO_RESOURCE:
        return KVF_ERR_NO_RESOURCE;
    case UCS_ERR_TIMED_OUT:
    case UCS_ERR_ENDPOINT_TIMEOUT:
        return KVF_ERR_PEER_TIMEOUT;
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_NO_DEVICE:
        return KVF_ERR_PEER_UNREACHABLE;
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_REJECTED:
    case UCS_ERR_IO_ERROR:
    case UCS_ERR_SHMEM_SEGMENT:
        return KVF_ERR_PEER_RESET;
    default:
        return KVF_ERR_UCX;
    }
}

static pthread_once_t kvf_ucx_env_once = PTHREAD_ONCE_INIT;

static void kvf_ucx_env_init(void)
{
    const char *tls = getenv("UCX_TLS");

    /* Only when shared-memory transports may be used: otherwise UCX warns
     * about unused variables (e.g. UCX_TLS=tcp,self). An exclusion list
     * ("^...") or "all"/"sm"/"shm" may include them. */
    if ((tls != NULL) && (tls[0] != '^') && (strstr(tls, "all") == NULL) &&
        (strstr(tls, "sm") == NULL) && (strstr(tls, "posix") == NULL) &&
        (strstr(tls, "sysv") == NULL)) {
        return;
    }
    /* overwrite = 0: an operator's explicit choice wins */
    setenv("UCX_POSIX_ERROR_HANDLING", "y", 0);
    setenv("UCX_SYSV_ERROR_HANDLING", "y", 0);
}

static ucs_status_t kvf_ucx_am_cb(void *arg, const void *header, size_t header_length,
                                  void *data, size_t length, const ucp_am_recv_param_t *param)
{
    kvf_ucx_agent_h agent = arg;
    kvf_ucx_notify_slot_t *slot;

    (void)header;
    (void)header_length;
    if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) || (length > KVF_UCX_NOTIFY_MAX) ||
        (agent->ring_count == KVF_UCX_NOTIFY_RING)) {
        /* not ours (we force eager and bound the size) or queue full */
        agent->notify_dropped++;
        kvf_warn("%s: dropped a notification of %zu bytes", agent->name, length);
        return UCS_OK;
    }
    slot = &agent->ring[(agent->ring_head + agent->ring_count) % KVF_UCX_NOTIFY_RING];
    slot->len = length;
    memcpy(slot->data, data, length);
    agent->ring_count++;
    return UCS_OK;
}

kvf_status_t kvf_ucx_agent_create(const kvf_ucx_agent_params_t *params,
                                  kvf_ucx_agent_h *agent_p)
{
    ucp_params_t ucp_params;
    ucp_worker_params_t wparams;
    ucp_am_handler_param_t am;
    ucp_config_t *config;
    kvf_ucx_agent_h agent;
    kvf_status_t status;
    const char *tls;

    if ((params != NULL) && (params->field_mask & ~KVF_UCX_AGENT_PARAM_FIELDS_KNOWN)) {
        kvf_error("unknown ucx agent params bits 0x%llx",
                  (unsigned long long)(params->field_mask & ~KVF_UCX_AGENT_PARAM_FIELDS_KNOWN));
        return KVF_ERR_INVALID_PARAM;
    }
    agent = calloc(1, sizeof(*agent));
    if (agent == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    agent->ring = calloc(KVF_UCX_NOTIFY_RING, sizeof(*agent->ring));
    if (agent->ring == NULL) {
        status = KVF_ERR_NO_MEMORY;
        goto err_free_agent;
    }
    snprintf(agent->name, sizeof(agent->name), "%s",
             ((params != NULL) && (params->field_mask & KVF_UCX_AGENT_PARAM_FIELD_NAME) &&
              (params->name != NULL)) ? params->name : "ucx agent");
    agent->timeout_ms = ((params != NULL) &&
                         (params->field_mask & KVF_UCX_AGENT_PARAM_FIELD_TIMEOUT_MS)) ?
                        params->timeout_ms : 2000;
    agent->peer_err_mode = ((params != NULL) &&
                            (params->field_mask & KVF_UCX_AGENT_PARAM_FIELD_ERR_MODE)) ?
                           params->peer_err_mode : true;
    if (agent->peer_err_mode) {
        pthread_once(&kvf_ucx_env_once, kvf_ucx_env_init);
    }

    KVF_UCX_CHECK_GOTO(ucp_config_read(NULL, NULL, &config), status, err_free_ring);
    memset(&ucp_params, 0, sizeof(ucp_params));
    ucp_params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
    /* WAKEUP: an idle owner can sleep in poll() on the worker's event fd
     * instead of spinning on progress (kvf_ucx_agent_arm()) */
    ucp_params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
    ucp_params.name = agent->name;
    status = kvf_ucx_status(ucp_init(&ucp_params, config, &agent->context));
    ucp_config_release(config);
    if (status != KVF_OK) {
        kvf_error("%s: ucp_init failed: %s", agent->name, kvf_status_str(status));
        goto err_free_ring;
    }

    memset(&wparams, 0, sizeof(wparams));
    wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wparams.thread_mode = UCS_THREAD_MODE_SINGLE;
    KVF_UCX_CHECK_GOTO(ucp_worker_create(agent->context, &wparams, &agent->worker), status,
                       err_cleanup_context);

    memset(&am, 0, sizeof(am));
    am.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                    UCP_AM_HANDLER_PARAM_FIELD_ARG;
    am.id = KVF_UCX_AM_NOTIFY;
    am.cb = kvf_ucx_am_cb;
    am.arg = agent;
    KVF_UCX_CHECK_GOTO(ucp_worker_set_am_recv_handler(agent->worker, &am), status,
                       err_destroy_worker);

    tls = getenv("UCX_TLS");
    snprintf(agent->tls_env, sizeof(agent->tls_env), "%s", (tls != NULL) ? tls : "all");
    snprintf(agent->transports, sizeof(agent->transports), "UCX_TLS=%s; ep lanes: none",
             agent->tls_env);
    kvf_log(KVF_LOG_INFO, KVF_SUB_XFER, "%s: ucx %s, UCX_TLS=%s, peer error mode %s, "
            "posix/sysv error handling %s/%s", agent->name, ucp_get_version_string(),
            agent->tls_env, agent->peer_err_mode ? "on" : "off",
            getenv("UCX_POSIX_ERROR_HANDLING") ? getenv("UCX_POSIX_ERROR_HANDLING") : "n",
            getenv("UCX_SYSV_ERROR_HANDLING") ? getenv("UCX_SYSV_ERROR_HANDLING") : "n");
    *agent_p = agent;
    return KVF_OK;

err_destroy_worker:
    ucp_worker_destroy(agent->worker);
err_cleanup_context:
    ucp_cleanup(agent->context);
err_free_ring:
    free(agent->ring);
err_free_agent:
    free(agent);
    return status;
}

void kvf_ucx_agent_destroy(kvf_ucx_agent_h agent)
{
    if (agent == NULL) {
        return;
    }
    while (agent->num_peers > 0) {
        kvf_ucx_peer_destroy(agent->peers[agent->num_peers - 1]);
    }
    for (int i = 0; i < agent->num_parked; ++i) {
        /* no callback of a freed request runs; the endpoint's error callback
         * may until the worker is destroyed, so the peers outlive it */
        ucp_request_free(agent->parked[i]->close_req);
        agent->parked[i]->close_req = NULL;
    }
    for (int i = agent->num_regions - 1; i >= 0; --i) {
        KVF_UCX_CHECK_IGNORE(ucp_mem_unmap(agent->context, agent->regions[i].memh));
    }
    ucp_worker_destroy(agent->worker);
    for (int i = 0; i < agent->num_parked; ++i) {
        free(agent->parked[i]);
    }
    ucp_cleanup(agent->context);
    free(agent->ring);
    free(agent);
}

/*
 * Map @a len bytes as the agent's next region: @a addr given (register), or
 * NULL with UCP_MEM_MAP_ALLOCATE (UCX allocates; the address is queried
 * back). *addr_p receives the region's address.
 */
static kvf_status_t kvf_ucx_agent_map(kvf_ucx_agent_h agent, void *addr, size_t len,
                                      void **addr_p, int *region_p)
{
    ucp_mem_map_params_t mp;
    ucp_mem_attr_t attr;
    kvf_ucx_region_t *r;

    if (agent->num_regions == KVF_XFER_MAX_REGIONS) {
        kvf_error("%s: more than %d registered regions", agent->name, KVF_XFER_MAX_REGIONS);
        return KVF_ERR_NO_RESOURCE;
    }
    r = &agent->regions[agent->num_regions];
    memset(&mp, 0, sizeof(mp));
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    mp.address = addr;
    mp.length = len;
    if (addr == NULL) {
        mp.field_mask |= UCP_MEM_MAP_PARAM_FIELD_FLAGS;
        mp.flags = UCP_MEM_MAP_ALLOCATE;
    }
    KVF_UCX_CHECK(ucp_mem_map(agent->context, &mp, &r->memh));
    if (addr == NULL) {
        memset(&attr, 0, sizeof(attr));
        attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
        if ((ucp_mem_query(r->memh, &attr) != UCS_OK) || (attr.address == NULL) ||
            (attr.length < len)) {
            KVF_UCX_CHECK_IGNORE(ucp_mem_unmap(agent->context, r->memh));
            kvf_error("%s: UCX allocated no usable %zu-byte region", agent->name, len);
            return KVF_ERR_NO_MEMORY;
        }
        addr = attr.address;
    }
    r->addr = addr;
    r->len = len;
    *addr_p = addr;
    *region_p = agent->num_regions++;
    return KVF_OK;
}

kvf_status_t kvf_ucx_agent_mem_register(kvf_ucx_agent_h agent, void *addr, size_t len,
                                        int *region_p)
{
    void *mapped;

    if ((addr == NULL) || (len == 0)) {
        return KVF_ERR_INVALID_PARAM;
    }
    return kvf_ucx_agent_map(agent, addr, len, &mapped, region_p);
}

kvf_status_t kvf_ucx_agent_mem_alloc(kvf_ucx_agent_h agent, size_t len, void **addr_p,
                                     int *region_p)
{
    if ((len == 0) || (addr_p == NULL) || (region_p == NULL)) {
        return KVF_ERR_INVALID_PARAM;
    }
    return kvf_ucx_agent_map(agent, NULL, len, addr_p, region_p);
}

/* 0: not yet known whether this UCX packs keys the way the walk expects;
 * 1: our own key walked cleanly (full check); -1: it did not (length only). */
static atomic_int kvf_ucx_rkey_layout_known;

/* Walk a packed key as ucp_rkey_pack() lays it out; see kvf_ucx_rkey_check(). */
static kvf_status_t kvf_ucx_rkey_walk(const uint8_t *k, size_t len, char *why, size_t why_len)
{
    uint64_t md_map;
    size_t off = sizeof(md_map) + 1;

    if (len < off) {
        snprintf(why, why_len, "%zu bytes, shorter than its %zu-byte header", len, off);
        return KVF_ERR_PARSE;
    }
    memcpy(&md_map, k, sizeof(md_map));
    if (md_map == 0) {
        snprintf(why, why_len, "names no memory domain");
        return KVF_ERR_PARSE;
    }
    if (k[sizeof(md_map)] >= UCS_MEMORY_TYPE_LAST) {
        snprintf(why, why_len, "memory type %u is not one UCX knows", k[sizeof(md_map)]);
        return KVF_ERR_PARSE;
    }
    for (int md = 0; md < 64; ++md) {
        if (((md_map >> md) & 1u) == 0) {
            continue;
        }
        if ((off >= len) || (k[off] > len - off - 1)) {
            snprintf(why, why_len, "the key of memory domain %d runs past its %zu bytes", md,
                     len);
            return KVF_ERR_PARSE;
        }
        off += 1 + (size_t)k[off];
    }
    if ((off < len) && ((len - off - 1) % 3 != 0)) {   /* sys_dev + distance records */
        snprintf(why, why_len, "%zu trailing bytes are no device-distance records", len - off);
        return KVF_ERR_PARSE;
    }
    return KVF_OK;
}

kvf_status_t kvf_ucx_rkey_check(const uint8_t *rkey, size_t len, char *why, size_t why_len)
{
    if ((rkey == NULL) || (len < 1) || (len > KVF_RKEY_MAX)) {
        snprintf(why, why_len, "length %zu is outside 1..%d", len, KVF_RKEY_MAX);
        return KVF_ERR_PARSE;
    }
    if (atomic_load(&kvf_ucx_rkey_layout_known) <= 0) {
        return KVF_OK;
    }
    return kvf_ucx_rkey_walk(rkey, len, why, why_len);
}

kvf_status_t kvf_ucx_agent_region_meta(kvf_ucx_agent_h agent, int region,
                                       kvf_xfer_region_meta_t *meta_p)
{
    char why[128];
    void *rkey_buf;
    size_t rkey_len;

    if ((region < 0) || (region >= agent->num_regions)) {
        return KVF_ERR_INVALID_PARAM;
    }
    KVF_UCX_CHECK(ucp_rkey_pack(agent->context, agent->regions[region].memh, &rkey_buf,
                                &rkey_len));
    if (rkey_len > KVF_RKEY_MAX) {
        kvf_error("%s: packed rkey of %zu bytes exceeds %d", agent->name, rkey_len,
                  KVF_RKEY_MAX);
        ucp_rkey_buffer_release(rkey_buf);
        return KVF_ERR_NO_RESOURCE;
    }
    if (atomic_load(&kvf_ucx_rkey_layout_known) == 0) {
        /* learn whether peers' keys can be walked: ours must walk first */
        if (kvf_ucx_rkey_walk(rkey_buf, rkey_len, why, sizeof(why)) == KVF_OK) {
            atomic_store(&kvf_ucx_rkey_layout_known, 1);
        } else {
            atomic_store(&kvf_ucx_rkey_layout_known, -1);
            kvf_warn("%s: this UCX packs remote keys in an unknown layout (%s): peers' keys"
                     " get a length check only", agent->name, why);
        }
    }
    meta_p->addr = (uint64_t)(uintptr_t)agent->regions[region].addr;
    meta_p->length = agent->regions[region].len;
    meta_p->rkey_len = rkey_len;
    memcpy(meta_p->rkey, rkey_buf, rkey_len);
    ucp_rkey_buffer_release(rkey_buf);
    return KVF_OK;
}

kvf_status_t kvf_ucx_agent_worker_address(kvf_ucx_agent_h agent, uint8_t *buf, size_t cap,
                                          size_t *len_p)
{
    ucp_address_t *addr;
    size_t len;

    KVF_UCX_CHECK(ucp_worker_get_address(agent->worker, &addr, &len));
    if (len > cap) {
        ucp_worker_release_address(agent->worker, addr);
        kvf_error("%s: worker address of %zu bytes exceeds %zu", agent->name, len, cap);
        return KVF_ERR_NO_RESOURCE;
    }
    memcpy(buf, addr, len);
    *len_p = len;
    ucp_worker_release_address(agent->worker, addr);
    return KVF_OK;
}

const char *kvf_ucx_agent_transports(kvf_ucx_agent_h agent)
{
    return agent->transports;
}

/* Free parked peers whose close request completed: no callback can reach them now. */
static void kvf_ucx_reap_parked(kvf_ucx_agent_h agent)
{
    for (int i = 0; i < agent->num_parked;) {
        kvf_ucx_peer_h peer = agent->parked[i];
        if (ucp_request_check_status(peer->close_req) == UCS_INPROGRESS) {
            ++i;
            continue;
        }
        ucp_request_free(peer->close_req);
        kvf_log(KVF_LOG_DEBUG, KVF_SUB_XFER, "%s: parked endpoint to rank %d closed",
                agent->name, peer->remote_rank);
        free(peer);
        agent->parked[i] = agent->parked[--agent->num_parked];
    }
}

unsigned kvf_ucx_agent_progress(kvf_ucx_agent_h agent)
{
    unsigned n = ucp_worker_progress(agent->worker);

    if (agent->num_parked > 0) {
        kvf_ucx_reap_parked(agent);
    }
    return n;
}

int kvf_ucx_agent_num_parked(kvf_ucx_agent_h agent)
{
    return agent->num_parked;
}

kvf_status_t kvf_ucx_agent_event_fd(kvf_ucx_agent_h agent, int *fd_p)
{
    return kvf_ucx_status(ucp_worker_get_efd(agent->worker, fd_p));
}

kvf_status_t kvf_ucx_agent_arm(kvf_ucx_agent_h agent)
{
    ucs_status_t s;

    if (agent->ring_count > 0) {
        return KVF_ERR_BUSY;            /* notifications are waiting to be read */
    }
    for (int i = 0; ucp_worker_progress(agent->worker) != 0; ++i) {
        if (i == KVF_UCX_ARM_MAX_ROUNDS) {
            return KVF_ERR_BUSY;        /* still busy: the caller must not sleep */
        }
    }
    s = ucp_worker_arm(agent->worker);
    if (s == UCS_ERR_BUSY) {
        return KVF_ERR_BUSY;
    }
    return (agent->ring_count > 0) ? KVF_ERR_BUSY : kvf_ucx_status(s);
}

uint64_t kvf_ucx_agent_ops_posted(kvf_ucx_agent_h agent)
{
    return agent->ops_posted;
}

/* -------------------------------------------------------------------- */

static void kvf_ucx_ep_err_cb(void *arg, ucp_ep_h ep, ucs_status_t ucs)
{
    kvf_ucx_peer_h peer = arg;
    kvf_status_t status = kvf_ucx_status(ucs);

    (void)ep;
    if (!KVF_IS_PEER_ERROR(status)) {
        status = KVF_ERR_PEER_RESET;
    }
    if (peer->status == KVF_OK) {
        peer->status = status;
    }
    /* a peer that exits first makes our close fail; that is not news */
    kvf_log(peer->closing ? KVF_LOG_DEBUG : KVF_LOG_WARN, KVF_SUB_XFER,
            "%s: peer rank %d failed: %s (%s)", peer->agent->name, peer->remote_rank,
            ucs_status_string(ucs), kvf_status_str(status));
}

/*
 * Summarize ucp_ep_print_info(): keep the "tl" names of the lanes, e.g.
 * "#                lane[0]:  1:cma/memory.0 md[1]  ..." -> "cma/memory".
 */
static void kvf_ucx_record_lanes(kvf_ucx_agent_h agent, ucp_ep_h ep)
{
    char *text = NULL, *line, *save = NULL, lanes[400] = "";
    size_t text_len = 0, used = 0;
    FILE *f = open_memstream(&text, &text_len);

    if (f == NULL) {
        return;
    }
    ucp_ep_print_info(ep, f);
    fclose(f);
    for (line = strtok_r(text, "\n", &save); line != NULL; line = strtok_r(NULL, "\n", &save)) {
        char *lane = strstr(line, "lane[");
        char *colon, *end, tl[64];
        size_t n;

        if (lane == NULL) {
            continue;
        }
        colon = strchr(lane, ':');        /* after "lane[i]" */
        colon = (colon != NULL) ? strchr(colon + 1, ':') : NULL;  /* after rsc index */
        if (colon == NULL) {
            continue;
        }
        end = colon + 1 + strcspn(colon + 1, " .\t");
        n = (size_t)(end - (colon + 1));
        if ((n == 0) || (n >= sizeof(tl))) {
            continue;
        }
        memcpy(tl, colon + 1, n);
        tl[n] = '\0';
        if (strstr(lanes, tl) != NULL) {
            continue;   /* list each transport once */
        }
        used += (size_t)snprintf(lanes + used, sizeof(lanes) - used, "%s%s",
                                 (used > 0) ? "," : "", tl);
        if (used >= sizeof(lanes)) {
            break;
        }
    }
    free(text);
    snprintf(agent->transports, sizeof(agent->transports), "UCX_TLS=%s; ep lanes: %s",
             agent->tls_env, (lanes[0] != '\0') ? lanes : "unknown");
}

/*
 * Close @a peer's endpoint, progressing until done or the agent timeout.
 * @return true when the peer may be freed now; false when the close timed
 *         out and the peer was parked (kvf_ucx_reap_parked() frees it).
 */
static bool kvf_ucx_ep_close(kvf_ucx_agent_h agent, kvf_ucx_peer_h peer, bool force)
{
    ucp_request_param_t cp;
    uint64_t deadline;
    void *req;

    memset(&cp, 0, sizeof(cp));
    cp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    cp.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    req = ucp_ep_close_nbx(peer->ep, &cp);
    if ((req == NULL) || UCS_PTR_IS_ERR(req)) {
        return true;            /* closed at once (or failed: UCX released it) */
    }
    deadline = kvf_ucx_now_ns() + (uint64_t)agent->timeout_ms * 1000000ull;
    while ((ucp_request_check_status(req) == UCS_INPROGRESS) &&
           (kvf_ucx_now_ns() < deadline)) {
        ucp_worker_progress(agent->worker);
    }
    if (ucp_request_check_status(req) != UCS_INPROGRESS) {
        ucp_request_free(req);
        return true;
    }
    if (agent->num_parked == KVF_UCX_MAX_PEERS) {
        /* cannot track it: leak it rather than free memory a callback may use */
        kvf_error("%s: closing the endpoint to rank %d timed out after %u ms and %d endpoints "
                  "are parked already: leaking it", agent->name, peer->remote_rank,
                  agent->timeout_ms, KVF_UCX_MAX_PEERS);
        return false;
    }
    kvf_warn("%s: closing the endpoint to rank %d timed out after %u ms; parked until its "
             "callbacks can no longer fire", agent->name, peer->remote_rank, agent->timeout_ms);
    peer->close_req = req;
    agent->parked[agent->num_parked++] = peer;
    return false;
}

kvf_status_t kvf_ucx_peer_connect(kvf_ucx_agent_h agent, const kvf_rank_meta_t *meta,
                                  kvf_ucx_peer_h *peer_p)
{
    ucp_ep_params_t ep_params;
    kvf_ucx_peer_h peer;
    kvf_status_t status;

    if (agent->num_peers == KVF_UCX_MAX_PEERS) {
        return KVF_ERR_NO_RESOURCE;
    }
    if ((meta->worker_addr_len == 0) || (meta->num_regions < 0) ||
        (meta->num_regions > KVF_XFER_MAX_REGIONS)) {
        return KVF_ERR_INVALID_PARAM;
    }
    for (int i = 0; i < meta->num_regions; ++i) {   /* before UCX sees any of it */
        char why[128];
        if (kvf_ucx_rkey_check(meta->regions[i].rkey, meta->regions[i].rkey_len, why,
                               sizeof(why)) != KVF_OK) {
            kvf_error("%s: remote key %d of rank %d of %s refused before ucp_ep_rkey_unpack:"
                      " %s", agent->name, i, meta->tp_rank, meta->engine_id, why);
            return KVF_ERR_PARSE;
        }
    }
    peer = calloc(1, sizeof(*peer));
    if (peer == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    peer->agent = agent;
    peer->remote_rank = meta->tp_rank;
    peer->status = KVF_OK;

    memset(&ep_params, 0, sizeof(ep_params));
    ep_params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
    ep_params.address = (const ucp_address_t *)meta->worker_addr;
    if (agent->peer_err_mode) {
        ep_params.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                                UCP_EP_PARAM_FIELD_ERR_HANDLER;
        ep_params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
        ep_params.err_handler.cb = kvf_ucx_ep_err_cb;
        ep_params.err_handler.arg = peer;
    }
    KVF_UCX_CHECK_GOTO(ucp_ep_create(agent->worker, &ep_params, &peer->ep), status,
                       err_free_peer);

    for (int i = 0; i < meta->num_regions; ++i) {
        ucs_status_t ucs = ucp_ep_rkey_unpack(peer->ep, meta->regions[i].rkey,
                                              &peer->regions[i].rkey);
        if (ucs != UCS_OK) {
            kvf_error("%s: cannot unpack remote key %d of rank %d: %s", agent->name, i,
                      meta->tp_rank, ucs_status_string(ucs));
            status = KVF_ERR_PARSE;
            goto err_destroy_rkeys;
        }
        peer->regions[i].addr = meta->regions[i].addr;
        peer->regions[i].len = meta->regions[i].length;
        peer->num_regions = i + 1;
    }
    kvf_ucx_record_lanes(agent, peer->ep);
    kvf_log(KVF_LOG_INFO, KVF_SUB_XFER, "%s: connected to rank %d of %s: %s", agent->name,
            meta->tp_rank, meta->engine_id, agent->transports);
    agent->peers[agent->num_peers++] = peer;
    *peer_p = peer;
    return KVF_OK;

err_destroy_rkeys:
    for (int i = 0; i < peer->num_regions; ++i) {
        ucp_rkey_destroy(peer->regions[i].rkey);
    }
    peer->num_regions = 0;
    peer->closing = true;
    if (!kvf_ucx_ep_close(agent, peer, true)) {
        return status;          /* parked: freed once its close completes */
    }
err_free_peer:
    free(peer);
    return status;
}

void kvf_ucx_peer_abort(kvf_ucx_peer_h peer)
{
    if ((peer != NULL) && (peer->status == KVF_OK)) {
        peer->status = KVF_ERR_PEER_TIMEOUT;   /* makes the close forced */
    }
    kvf_ucx_peer_destroy(peer);
}

void kvf_ucx_peer_destroy(kvf_ucx_peer_h peer)
{
    kvf_ucx_agent_h agent;

    if (peer == NULL) {
        return;
    }
    agent = peer->agent;
    peer->closing = true;
    for (int i = 0; i < peer->num_regions; ++i) {
        ucp_rkey_destroy(peer->regions[i].rkey);
    }
    for (int i = 0; i < agent->num_peers; ++i) {
        if (agent->peers[i] == peer) {
            agent->peers[i] = agent->peers[--agent->num_peers];
            break;
        }
    }
    if (kvf_ucx_ep_close(agent, peer, peer->status != KVF_OK)) {
        free(peer);
    }
    if (agent->num_parked > 0) {
        kvf_ucx_reap_parked(agent);
    }
}

kvf_status_t kvf_ucx_peer_status(kvf_ucx_peer_h peer)
{
    return peer->status;
}

/* -------------------------------------------------------------------- */

static void kvf_ucx_flush_cb(void *request, ucs_status_t ucs, void *user_data)
{
    kvf_ucx_batch_h batch = user_data;
    kvf_status_t status = kvf_ucx_status(ucs);

    (void)request;
    if ((status != KVF_OK) && !KVF_IS_PEER_ERROR(status) && (batch->peer->status != KVF_OK)) {
        status = batch->peer->status;   /* report the peer failure, not "canceled" */
    }
    batch->status = status;
}

kvf_status_t kvf_ucx_xfer_post(kvf_ucx_agent_h agent, kvf_ucx_peer_h peer, kvf_ucx_op_t op,
                               int local_region, int remote_region,
                               const kvf_xfer_desc_t *descs, size_t num_descs,
                               kvf_ucx_batch_h *batch_p)
{
    const kvf_ucx_region_t *lr;
    const kvf_ucx_remote_region_t *rr;
    ucp_request_param_t param;
    kvf_ucx_batch_h batch;
    void *req;

    if ((local_region < 0) || (local_region >= agent->num_regions) || (remote_region < 0) ||
        (remote_region >= peer->num_regions) || (op > KVF_UCX_OP_PUT) ||
        ((descs == NULL) && (num_descs > 0))) {
        return KVF_ERR_INVALID_PARAM;
    }
    if (peer->status != KVF_OK) {
        return peer->status;
    }
    lr = &agent->regions[local_region];
    rr = &peer->regions[remote_region];
    for (size_t i = 0; i < num_descs; ++i) {
        const kvf_xfer_desc_t *d = &descs[i];
        if ((d->len == 0) || (d->local_off > lr->len) || (d->len > lr->len - d->local_off) ||
            (d->remote_off > rr->len) || (d->len > rr->len - d->remote_off)) {
            kvf_error("%s: descriptor %zu {local %llu, remote %llu, len %llu} leaves a region "
                      "(local %zu, remote %llu bytes)", agent->name, i,
                      (unsigned long long)d->local_off, (unsigned long long)d->remote_off,
                      (unsigned long long)d->len, lr->len, (unsigned long long)rr->len);
            return KVF_ERR_OUT_OF_RANGE;
        }
    }
    batch = calloc(1, sizeof(*batch));
    if (batch == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    batch->peer = peer;
    batch->status = KVF_INPROGRESS;

    memset(&param, 0, sizeof(param));
    for (size_t i = 0; i < num_descs; ++i) {
        const kvf_xfer_desc_t *d = &descs[i];
        void *laddr = (uint8_t *)lr->addr + d->local_off;
        uint64_t raddr = rr->addr + d->remote_off;

        req = (op == KVF_UCX_OP_GET) ?
              ucp_get_nbx(peer->ep, laddr, d->len, raddr, rr->rkey, &param) :
              ucp_put_nbx(peer->ep, laddr, d->len, raddr, rr->rkey, &param);
        agent->ops_posted++;
        if (UCS_PTR_IS_ERR(req)) {
            /* operations already posted drain inside UCX; the batch is failed */
            batch->status = kvf_ucx_status(UCS_PTR_STATUS(req));
            if (peer->status != KVF_OK) {
                batch->status = peer->status;
            }
            kvf_error("%s: posting descriptor %zu to rank %d failed: %s", agent->name, i,
                      peer->remote_rank, ucs_status_string(UCS_PTR_STATUS(req)));
            *batch_p = batch;
            return KVF_OK;
        }
        if (req != NULL) {
            ucp_request_free(req);   /* completes in the background; flush tracks it */
        }
        (void)KVF_FAULT(UCX_POST);             /* tests: kill/stop/stall after n posted */
        if (i + 1 == (num_descs + 1) / 2) {
            (void)KVF_FAULT(UCX_HALF);         /* tests: half of this batch is in flight */
        }
    }

    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    param.cb.send = kvf_ucx_flush_cb;
    param.user_data = batch;
    req = ucp_ep_flush_nbx(peer->ep, &param);
    if (req == NULL) {
        batch->status = KVF_OK;
    } else if (UCS_PTR_IS_ERR(req)) {
        batch->status = (peer->status != KVF_OK) ? peer->status :
                        kvf_ucx_status(UCS_PTR_STATUS(req));
    } else {
        batch->flush_req = req;
    }
    *batch_p = batch;
    return KVF_OK;
}

kvf_status_t kvf_ucx_batch_test(kvf_ucx_batch_h batch)
{
    if ((batch->status == KVF_INPROGRESS) && (batch->peer->status != KVF_OK)) {
        return batch->peer->status;
    }
    return batch->status;
}

kvf_status_t kvf_ucx_batch_wait(kvf_ucx_batch_h batch, uint32_t timeout_ms)
{
    kvf_ucx_agent_h agent = batch->peer->agent;
    uint64_t deadline = kvf_ucx_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    kvf_status_t status;

    /* the deadline is checked on every round: a worker kept busy by other
     * traffic never returns 0 from progress, and must still time out */
    while ((status = kvf_ucx_batch_test(batch)) == KVF_INPROGRESS) {
        if (kvf_ucx_now_ns() >= deadline) {
            kvf_error("%s: transfer from rank %d did not complete in %u ms", agent->name,
                      batch->peer->remote_rank, timeout_ms);
            if (batch->peer->status == KVF_OK) {
                batch->peer->status = KVF_ERR_PEER_TIMEOUT;
            }
            return KVF_ERR_PEER_TIMEOUT;
        }
        if (ucp_worker_progress(agent->worker) == 0) {
            sched_yield();
        }
    }
    return status;
}

void kvf_ucx_batch_release(kvf_ucx_batch_h batch)
{
    if (batch == NULL) {
        return;
    }
    if (batch->flush_req != NULL) {
        /* after ucp_request_free UCX never calls the callback again */
        ucp_request_free(batch->flush_req);
    }
    free(batch);
}

/* -------------------------------------------------------------------- */

static void kvf_ucx_send_cb(void *request, ucs_status_t ucs, void *user_data)
{
    (void)request;
    *(ucs_status_t *)user_data = ucs;
}

kvf_status_t kvf_ucx_notify_send(kvf_ucx_agent_h agent, kvf_ucx_peer_h peer, const void *msg,
                                 size_t len)
{
    ucp_request_param_t param;
    ucs_status_t done = UCS_INPROGRESS;
    uint64_t deadline;
    void *req;

    if (len > KVF_UCX_NOTIFY_MAX) {
        return KVF_ERR_INVALID_PARAM;
    }
    if (peer->status != KVF_OK) {
        return peer->status;
    }
#if KVF_FAULT_ENABLED
    uint8_t garbled[KVF_UCX_NOTIFY_MAX];
    switch (KVF_FAULT(UCX_NOTIFY)) {
    case KVF_FAULT_DROP:
        return KVF_OK;                              /* lost on the way */
    case KVF_FAULT_CORRUPT:
        memcpy(garbled, msg, len);
        kvf_fault_garble(garbled, len, 0);
        msg = garbled;
        break;
    default:
        break;
    }
#endif
    memset(&param, 0, sizeof(param));
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                         UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_AM_SEND_FLAG_EAGER;
    param.cb.send = kvf_ucx_send_cb;
    param.user_data = &done;
    req = ucp_am_send_nbx(peer->ep, KVF_UCX_AM_NOTIFY, NULL, 0, msg, len, &param);
    if (req == NULL) {
        return KVF_OK;
    }
    if (UCS_PTR_IS_ERR(req)) {
        return (peer->status != KVF_OK) ? peer->status : kvf_ucx_status(UCS_PTR_STATUS(req));
    }
    deadline = kvf_ucx_now_ns() + (uint64_t)agent->timeout_ms * 1000000ull;
    while ((done == UCS_INPROGRESS) && (peer->status == KVF_OK) &&
           (kvf_ucx_now_ns() < deadline)) {   /* every round, busy or not */
        if (ucp_worker_progress(agent->worker) == 0) {
            sched_yield();
        }
    }
    ucp_request_free(req);
    if (done == UCS_INPROGRESS) {
        if (peer->status != KVF_OK) {
            return peer->status;
        }
        kvf_error("%s: notification to rank %d not sent in %u ms", agent->name,
                  peer->remote_rank, agent->timeout_ms);
        peer->status = KVF_ERR_PEER_TIMEOUT;
        return KVF_ERR_PEER_TIMEOUT;
    }
    return (done == UCS_OK) ? KVF_OK :
           ((peer->status != KVF_OK) ? peer->status : kvf_ucx_status(done));
}

kvf_status_t kvf_ucx_notify_recv(kvf_ucx_agent_h agent, void *buf, size_t cap, size_t *len_p,
                                 uint32_t timeout_ms)
{
    uint64_t deadline = kvf_ucx_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    kvf_ucx_notify_slot_t *slot;
    bool worked = false;

    while (agent->ring_count == 0) {
        unsigned n = ucp_worker_progress(agent->worker);   /* at least once, even for 0 */
        worked = worked || (n > 0);
        if (agent->ring_count > 0) {
            break;
        }
        if (kvf_ucx_now_ns() >= deadline) {   /* every round: busy with other events too */
            return worked ? KVF_INPROGRESS : KVF_ERR_PEER_TIMEOUT;
        }
        if (n == 0) {
            sched_yield();   /* idle: let the peer's threads run (few cores) */
        }
    }
    slot = &agent->ring[agent->ring_head];
    if (slot->len > cap) {
        return KVF_ERR_NO_RESOURCE;
    }
    memcpy(buf, slot->data, slot->len);
    *len_p = slot->len;
    agent->ring_head = (agent->ring_head + 1) % KVF_UCX_NOTIFY_RING;
    agent->ring_count--;
    return KVF_OK;
}
