/*
 * Connector ops-table helpers: stubs for unsupported ops (so callers never
 * test for NULL) and the ABI check a caller runs before using a table.
 */
#include "kvf_connector.h"

#include "kvf_log.h"

static kvf_status_t kvf_connector_stub_create(const kvf_connector_config_t *config,
                                              kvf_connector_h *conn_p)
{
    (void)config;
    (void)conn_p;
    return KVF_ERR_UNSUPPORTED;
}

static void kvf_connector_stub_destroy(kvf_connector_h conn)
{
    (void)conn;
}

static kvf_status_t kvf_connector_stub_register_pool(kvf_connector_h conn,
                                                     const kvf_connector_pool_t *pool)
{
    (void)conn;
    (void)pool;
    return KVF_ERR_UNSUPPORTED;
}

static kvf_status_t kvf_connector_stub_get_metadata(kvf_connector_h conn, int tp_rank,
                                                    void *buf, size_t cap, size_t *len_p)
{
    (void)conn;
    (void)tp_rank;
    (void)buf;
    (void)cap;
    (void)len_p;
    return KVF_ERR_UNSUPPORTED;
}

static kvf_status_t kvf_connector_stub_serve(kvf_connector_h conn, int *port_p)
{
    (void)conn;
    (void)port_p;
    return KVF_ERR_UNSUPPORTED;
}

static kvf_status_t kvf_connector_stub_handshake(kvf_connector_h conn, const char *engine_id,
                                                 const char *host, int port, char *why,
                                                 size_t why_len)
{
    (void)conn;
    (void)engine_id;
    (void)host;
    (void)port;
    (void)why;
    (void)why_len;
    return KVF_ERR_UNSUPPORTED;
}

static kvf_status_t kvf_connector_stub_start_pull(kvf_connector_h conn, int tp_rank,
                                                  const kvf_connector_pull_t *pull,
                                                  kvf_connector_req_h *req_p)
{
    (void)conn;
    (void)tp_rank;
    (void)pull;
    (void)req_p;
    return KVF_ERR_UNSUPPORTED;
}

static kvf_status_t kvf_connector_stub_poll(kvf_connector_h conn, int tp_rank,
                                            kvf_connector_req_h req)
{
    (void)conn;
    (void)tp_rank;
    (void)req;
    return KVF_ERR_UNSUPPORTED;
}

static kvf_status_t kvf_connector_stub_poll_release(kvf_connector_h conn, int tp_rank,
                                                    uint32_t timeout_ms, char *request_id,
                                                    size_t id_len, int *decode_rank_p,
                                                    kvf_status_t *status_p)
{
    (void)conn;
    (void)tp_rank;
    (void)timeout_ms;
    (void)request_id;
    (void)id_len;
    (void)decode_rank_p;
    (void)status_p;
    return KVF_ERR_UNSUPPORTED;
}

static kvf_status_t kvf_connector_stub_req_stats(kvf_connector_h conn, int tp_rank,
                                                 kvf_connector_req_h req,
                                                 kvf_connector_stats_t *stats_p)
{
    (void)conn;
    (void)tp_rank;
    (void)req;
    (void)stats_p;
    return KVF_ERR_UNSUPPORTED;
}

static kvf_status_t kvf_connector_stub_forget_engine(kvf_connector_h conn,
                                                     const char *engine_id)
{
    (void)conn;
    (void)engine_id;
    return KVF_ERR_UNSUPPORTED;
}

static uint64_t kvf_connector_stub_incarnation(kvf_connector_h conn)
{
    (void)conn;
    return 0;
}

static kvf_status_t kvf_connector_stub_remote_incarnation(kvf_connector_h conn,
                                                          const char *engine_id,
                                                          uint64_t *incarnation_p)
{
    (void)conn;
    (void)engine_id;
    (void)incarnation_p;
    return KVF_ERR_UNSUPPORTED;
}

static kvf_status_t kvf_connector_stub_wait_fds(kvf_connector_h conn, int *fds, int cap,
                                                int *n_p)
{
    (void)conn;
    (void)fds;
    (void)cap;
    (void)n_p;
    return KVF_ERR_UNSUPPORTED;
}

static kvf_status_t kvf_connector_stub_set_lease_handler(kvf_connector_h conn,
                                                        kvf_connector_lease_func_t func,
                                                        void *arg)
{
    (void)conn;
    (void)func;
    (void)arg;
    return KVF_ERR_UNSUPPORTED;
}

static kvf_status_t kvf_connector_stub_lease(kvf_connector_h conn, const char *engine_id,
                                             const char *host, int port,
                                             const kvf_lease_msg_t *msg,
                                             kvf_lease_answer_t *answer_p)
{
    (void)conn;
    (void)engine_id;
    (void)host;
    (void)port;
    (void)msg;
    (void)answer_p;
    return KVF_ERR_UNSUPPORTED;
}

static kvf_status_t kvf_connector_stub_alloc_pool(kvf_connector_h conn,
                                                  const kvf_connector_pool_t *pool,
                                                  void **base_p)
{
    (void)conn;
    (void)pool;
    (void)base_p;
    return KVF_ERR_UNSUPPORTED;
}

static kvf_status_t kvf_connector_stub_handshake_start(kvf_connector_h conn,
                                                       const kvf_connector_peer_t *peer,
                                                       uint64_t *ticket_p)
{
    (void)conn;
    (void)peer;
    (void)ticket_p;
    return KVF_ERR_UNSUPPORTED;
}

static kvf_status_t kvf_connector_stub_handshake_poll(kvf_connector_h conn, uint64_t ticket,
                                                      char *why, size_t why_len)
{
    (void)conn;
    (void)ticket;
    if (why_len > 0) {
        why[0] = '\0';
    }
    return KVF_ERR_UNSUPPORTED;
}

static kvf_status_t kvf_connector_stub_lease_start(kvf_connector_h conn,
                                                   const kvf_connector_peer_t *peer,
                                                   const kvf_lease_msg_t *msg, uint64_t *ticket_p)
{
    (void)conn;
    (void)peer;
    (void)msg;
    (void)ticket_p;
    return KVF_ERR_UNSUPPORTED;
}

static kvf_status_t kvf_connector_stub_lease_poll(kvf_connector_h conn, uint64_t ticket,
                                                  kvf_lease_answer_t *answer_p)
{
    (void)conn;
    (void)ticket;
    (void)answer_p;
    return KVF_ERR_UNSUPPORTED;
}

static void kvf_connector_stub_cancel(kvf_connector_h conn, uint64_t ticket)
{
    (void)conn;
    (void)ticket;
}

static bool kvf_connector_stub_side_wait(kvf_connector_h conn, int timeout_ms)
{
    (void)conn;
    (void)timeout_ms;
    return false;
}

static kvf_status_t kvf_connector_stub_req_digests(kvf_connector_h conn, int tp_rank,
                                                   kvf_connector_req_h req,
                                                   const kvf_kv_digest_t **digests_p, int *n_p)
{
    (void)conn;
    (void)tp_rank;
    (void)req;
    (void)digests_p;
    (void)n_p;
    return KVF_ERR_UNSUPPORTED;
}

void kvf_connector_ops_fill_stubs(kvf_connector_ops_t *ops)
{
    /* checklist: one line per op of kvf_connector_ops_t */
    if (ops->create == NULL)         ops->create = kvf_connector_stub_create;
    if (ops->destroy == NULL)        ops->destroy = kvf_connector_stub_destroy;
    if (ops->register_pool == NULL)  ops->register_pool = kvf_connector_stub_register_pool;
    if (ops->get_metadata == NULL)   ops->get_metadata = kvf_connector_stub_get_metadata;
    if (ops->serve == NULL)          ops->serve = kvf_connector_stub_serve;
    if (ops->handshake == NULL)      ops->handshake = kvf_connector_stub_handshake;
    if (ops->start_pull == NULL)     ops->start_pull = kvf_connector_stub_start_pull;
    if (ops->poll == NULL)           ops->poll = kvf_connector_stub_poll;
    if (ops->notify_release == NULL) ops->notify_release = kvf_connector_stub_poll;
    if (ops->poll_release == NULL)   ops->poll_release = kvf_connector_stub_poll_release;
    if (ops->req_stats == NULL)      ops->req_stats = kvf_connector_stub_req_stats;
    if (ops->forget_engine == NULL)  ops->forget_engine = kvf_connector_stub_forget_engine;
    if (ops->incarnation == NULL)    ops->incarnation = kvf_connector_stub_incarnation;
    if (ops->remote_incarnation == NULL) {
        ops->remote_incarnation = kvf_connector_stub_remote_incarnation;
    }
    if (ops->wait_fds == NULL)       ops->wait_fds = kvf_connector_stub_wait_fds;
    if (ops->set_lease_handler == NULL) {
        ops->set_lease_handler = kvf_connector_stub_set_lease_handler;
    }
    if (ops->lease == NULL)          ops->lease = kvf_connector_stub_lease;
    if (ops->finish_pull == NULL)    ops->finish_pull = kvf_connector_stub_poll;
    if (ops->alloc_pool == NULL)     ops->alloc_pool = kvf_connector_stub_alloc_pool;
    if (ops->handshake_start == NULL) ops->handshake_start = kvf_connector_stub_handshake_start;
    if (ops->handshake_poll == NULL) ops->handshake_poll = kvf_connector_stub_handshake_poll;
    if (ops->lease_start == NULL)    ops->lease_start = kvf_connector_stub_lease_start;
    if (ops->lease_poll == NULL)     ops->lease_poll = kvf_connector_stub_lease_poll;
    if (ops->cancel == NULL)         ops->cancel = kvf_connector_stub_cancel;
    if (ops->side_wait == NULL)      ops->side_wait = kvf_connector_stub_side_wait;
    if (ops->req_digests == NULL)    ops->req_digests = kvf_connector_stub_req_digests;
}

kvf_status_t kvf_connector_ops_check(const kvf_connector_ops_t *ops)
{
    if ((ops == NULL) || (ops->abi_version != KVF_CONNECTOR_ABI)) {
        kvf_error("connector ops abi %u, expected %u", (ops != NULL) ? ops->abi_version : 0u,
                  KVF_CONNECTOR_ABI);
        return KVF_ERR_UNSUPPORTED;
    }
    if ((ops->create == NULL) || (ops->destroy == NULL) || (ops->register_pool == NULL) ||
        (ops->get_metadata == NULL) || (ops->serve == NULL) || (ops->handshake == NULL) ||
        (ops->start_pull == NULL) || (ops->poll == NULL) || (ops->notify_release == NULL) ||
        (ops->poll_release == NULL) || (ops->req_stats == NULL) ||
        (ops->forget_engine == NULL) || (ops->incarnation == NULL) ||
        (ops->remote_incarnation == NULL) || (ops->wait_fds == NULL) ||
        (ops->set_lease_handler == NULL) || (ops->lease == NULL) || (ops->finish_pull == NULL) ||
        (ops->alloc_pool == NULL) || (ops->handshake_start == NULL) ||
        (ops->handshake_poll == NULL) || (ops->lease_start == NULL) ||
        (ops->lease_poll == NULL) || (ops->cancel == NULL) || (ops->side_wait == NULL) ||
        (ops->req_digests == NULL)) {
        kvf_error("connector '%s' has a NULL op", (ops->name != NULL) ? ops->name : "?");
        return KVF_ERR_UNSUPPORTED;
    }
    return KVF_OK;
}
