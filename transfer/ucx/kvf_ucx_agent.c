/*
 * UCX agent: context + worker per rank, progress and wake-up, and
 * notifications. Regions and remote keys are in kvf_ucx_mem.c, endpoints in
 * kvf_ucx_peer.c, batched transfers in kvf_ucx_xfer.c.
 *
 * Design:
 * - Peer error mode disables shared-memory transports unless
 *   UCX_POSIX_ERROR_HANDLING / UCX_SYSV_ERROR_HANDLING are set; we set them
 *   (once per process, before ucp_config_read) unless the user did.
 * - Device memory: what UCX needs for it is set on the agent's own ucp
 *   config (ucp_config_modify), never by setenv: agents of one process may
 *   hold host and device pools, and the operator's environment wins.
 *   Rejected: setting the UCX_* variable process-wide (every agent, and
 *   whatever else in the process reads UCX's environment, would get it).
 * - Notifications arrive in a worker callback and are copied into a small
 *   ring; they are tiny, so eager protocol is forced on send.
 * - Every wait loop checks its deadline on every iteration, not only when
 *   progress found nothing to do: a worker kept busy by other traffic (a
 *   stream of notifications, another peer's transfers) must not stretch a
 *   wait past its timeout.
 */
#include "kvf_ucx_agent_int.h"
#include "kvf_time.h"

#include "kvf_fault.h"
#include "kvf_log.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* -------------------------------------------------------------------- */

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

#define KVF_UCX_GET_ZCOPY_VAR "CUDA_IPC_ENABLE_GET_ZCOPY"   /* UCX 1.22: on|off|auto */

/*
 * For an agent of device memory: cuda_ipc GET zero-copy on @a config unless
 * the operator set UCX_CUDA_IPC_ENABLE_GET_ZCOPY; what happened into
 * agent->device_cfg. A UCX that does not know the variable (its CUDA module
 * not loaded, or a UCX without it) says so through ucp_config_modify and is
 * left as it is.
 */
static void kvf_ucx_config_device(kvf_ucx_agent_h agent, ucp_config_t *config)
{
    const char *mine = getenv("UCX_" KVF_UCX_GET_ZCOPY_VAR);
    ucs_status_t s;

    if (mine != NULL) {
        snprintf(agent->device_cfg, sizeof(agent->device_cfg), "UCX_%s=%s (the operator's)",
                 KVF_UCX_GET_ZCOPY_VAR, mine);
        return;
    }
    s = ucp_config_modify(config, KVF_UCX_GET_ZCOPY_VAR, "y");
    if (s == UCS_OK) {
        snprintf(agent->device_cfg, sizeof(agent->device_cfg),
                 "UCX_%s=y (cuda_ipc GET zero-copy, set by kvferry)", KVF_UCX_GET_ZCOPY_VAR);
    } else {
        snprintf(agent->device_cfg, sizeof(agent->device_cfg),
                 "UCX_%s not set: this UCX does not know it (%s)", KVF_UCX_GET_ZCOPY_VAR,
                 ucs_status_string(s));
    }
}

#define KVF_UCX_KEEPALIVE_VAR "KEEPALIVE_INTERVAL"
#define KVF_UCX_KEEPALIVE     "1s"

/*
 * UCX keepalive every KVF_UCX_KEEPALIVE on @a config unless the operator set
 * UCX_KEEPALIVE_INTERVAL. Why: a worker that a peer connected to holds an
 * endpoint UCX made itself for the wire-up (no handle of ours), and with
 * shared memory that endpoint maps the peer's receive segments. Only an
 * error on it frees them, and for a peer that died (SIGKILL) only keepalive
 * finds one: at UCX's default of 20 s a prefill whose decode instances
 * restart every few seconds held every dead incarnation's segments, 2.1 MB
 * each with UCX 1.22 (its FIFO of 256 receive buffers of 8 KB, written into;
 * 1.13's FIFO has 64). A shorter interval costs one check per endpoint per
 * second; a stopped (not dead) peer still passes it (SIGSTOP soak and stall
 * tests). Rejected: smaller UCX_{POSIX,SYSV}_FIFO_SIZE (hides it, slows
 * shared memory); there is no UCP call to close another worker's wire-up
 * endpoints.
 */
static void kvf_ucx_config_keepalive(kvf_ucx_agent_h agent, ucp_config_t *config)
{
    ucs_status_t s;

    if (getenv("UCX_" KVF_UCX_KEEPALIVE_VAR) != NULL) {
        return;                 /* the operator's choice wins */
    }
    s = ucp_config_modify(config, KVF_UCX_KEEPALIVE_VAR, KVF_UCX_KEEPALIVE);
    if (s != UCS_OK) {
        kvf_warn("%s: UCX_%s=%s not set: %s; endpoints of dead peers are freed at UCX's own"
                 " keepalive", agent->name, KVF_UCX_KEEPALIVE_VAR, KVF_UCX_KEEPALIVE,
                 ucs_status_string(s));
    }
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
    if ((params != NULL) && (params->field_mask & KVF_UCX_AGENT_PARAM_FIELD_ACCESS) &&
        ((unsigned)params->access > KVF_UCX_ACCESS_REMOTE_RW)) {
        kvf_error("ucx agent params: access %d is not one of local (0), remote read (1), "
                  "remote read-write (2)", (int)params->access);
        return KVF_ERR_INVALID_PARAM;
    }
    if ((params != NULL) && (params->field_mask & KVF_UCX_AGENT_PARAM_FIELD_MEM_TYPE) &&
        ((unsigned)params->mem_type >= KVF_XFER_MEM_TYPES)) {
        kvf_error("ucx agent params: mem_type %d is not one of host (0), cuda (1)",
                  (int)params->mem_type);
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
    agent->access = ((params != NULL) && (params->field_mask & KVF_UCX_AGENT_PARAM_FIELD_ACCESS)) ?
                    params->access : KVF_UCX_ACCESS_REMOTE_READ;
    if (agent->peer_err_mode) {
        pthread_once(&kvf_ucx_env_once, kvf_ucx_env_init);
    }

    KVF_UCX_CHECK_GOTO(ucp_config_read(NULL, NULL, &config), status, err_free_ring);
    if (agent->peer_err_mode) {
        kvf_ucx_config_keepalive(agent, config);   /* keepalive runs in peer error mode */
    }
    if ((params != NULL) && (params->field_mask & KVF_UCX_AGENT_PARAM_FIELD_MEM_TYPE) &&
        (params->mem_type == KVF_XFER_MEM_CUDA)) {
        kvf_ucx_config_device(agent, config);
    }
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

    kvf_ucx_mem_types_query(agent);
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
            "posix/sysv error handling %s/%s%s%s", agent->name, ucp_get_version_string(),
            agent->tls_env, agent->peer_err_mode ? "on" : "off",
            getenv("UCX_POSIX_ERROR_HANDLING") ? getenv("UCX_POSIX_ERROR_HANDLING") : "n",
            getenv("UCX_SYSV_ERROR_HANDLING") ? getenv("UCX_SYSV_ERROR_HANDLING") : "n",
            (agent->device_cfg[0] != '\0') ? ", device memory: " : "", agent->device_cfg);
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

const char *kvf_ucx_agent_device_config(kvf_ucx_agent_h agent)
{
    return agent->device_cfg;
}

const char *kvf_ucx_agent_transports(kvf_ucx_agent_h agent)
{
    return agent->transports;
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
    deadline = kvf_time_now_ns() + (uint64_t)agent->timeout_ms * 1000000ull;
    while ((done == UCS_INPROGRESS) && (peer->status == KVF_OK) &&
           (kvf_time_now_ns() < deadline)) {   /* every round, busy or not */
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
    uint64_t deadline = kvf_time_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    kvf_ucx_notify_slot_t *slot;
    bool worked = false;

    while (agent->ring_count == 0) {
        unsigned n = ucp_worker_progress(agent->worker);   /* at least once, even for 0 */
        worked = worked || (n > 0);
        if (agent->ring_count > 0) {
            break;
        }
        if (kvf_time_now_ns() >= deadline) {   /* every round: busy with other events too */
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
