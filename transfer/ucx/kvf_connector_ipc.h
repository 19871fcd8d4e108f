/*
 * Inside the UCX connector: the same-node pull path (kvf_connector_ipc.c)
 * and the node identity it compares (kvf_node_id.c). Not for other users;
 * included by kvf_connector_ucx_int.h, whose types it uses.
 */
#ifndef KVF_CONNECTOR_IPC_H
#define KVF_CONNECTOR_IPC_H

#include "kvf_status.h"
#include "kvf_xfer_plan.h"

#include <stddef.h>

struct kvf_connector;
struct kvf_connector_req;
struct kvf_conn_rank;
struct kvf_connector_pool;
struct kvf_connector_stats;
struct kvf_connector_pull;

/**
 * This node's identity: the Linux boot id (/proc/sys/kernel/random/boot_id,
 * 36 characters, random per boot, the same for every process and container
 * of one running kernel). Two processes with the same one share a machine,
 * which is what CUDA IPC needs first; whether the GPU is reachable is
 * checked apart (the GPU's UUID, then cudaIpcOpenMemHandle itself).
 * @param [out] buf  NUL-terminated; @a len >= 37.
 * @return KVF_OK; KVF_ERR_IO (unreadable or empty: logged once).
 */
kvf_status_t kvf_node_id(char *buf, size_t len);

/**
 * Prefill, at registration of a CUDA pool: share it for the same-node path
 * (cudaIpcGetMemHandle, this node's id, the GPU's UUID) in the rank's
 * published region, unless the config path is UCX. A failure is logged
 * (warn) and leaves the region without a share: decode reads over UCX.
 */
void kvf_conn_ipc_export(struct kvf_connector *conn, struct kvf_conn_rank *rk,
                         const struct kvf_connector_pool *pool);

/**
 * Decode, in start_pull once the plan and the release endpoints exist:
 * when this pull can take the same-node path (config path, both pools CUDA,
 * the same node, the GPU visible, every source rank's allocation mapped:
 * opened once per (engine, incarnation, rank) and cached), enqueue it as
 * ONE gather of every descriptor and zero range (kvf_gather_staged()) on
 * the pool's stream, and an event after it; req->ipc is then true and poll()
 * watches the event. Otherwise req->ipc stays false and the caller posts
 * UCX GETs (the reason logged once per engine and rank).
 * @return KVF_OK (either way); KVF_ERR_UNSUPPORTED when the config path is
 *         IPC and this pull cannot take it (logged with the reason);
 *         KVF_ERR_OUT_OF_RANGE for a descriptor outside a region or a
 *         mapping; KVF_ERR_NO_MEMORY; a device error (logged).
 */
kvf_status_t kvf_conn_ipc_start(struct kvf_connector *conn, struct kvf_conn_rank *rk,
                                struct kvf_connector_req *req);

/**
 * Decode, in start_pull before any plan: when this pull can take the same-node path
 * (as kvf_conn_ipc_start() decides, once per engine generation) and the pair has a gather
 * table (kvf_xfer_tmpl.h: built with the mappings from the pair's pieces; none where block
 * sizes differ), write the request's jobs (kvf_xfer_tmpl_jobs(): the plan's checks, no
 * walk) into a staging slot, set req->ipc_jobs, req->src / nsrc and keep a copy of the
 * pull's ids in req->pull_copy. Otherwise req->ipc_jobs stays 0 and the caller plans.
 * @return KVF_OK (either way); the plan's errors for a request it would refuse;
 *         KVF_ERR_NO_MEMORY.
 */
kvf_status_t kvf_conn_ipc_jobs(struct kvf_connector *conn, struct kvf_conn_rank *rk,
                               struct kvf_connector_req *req, const kvf_xfer_plan_params_t *pp,
                               const struct kvf_connector_pull *pull);

/**
 * Enqueue the jobs kvf_conn_ipc_jobs() wrote as one template gather (kvf_gather_tmpl_run())
 * and an event on the pool's stream; req->ipc is then true.
 * @return KVF_OK; a device error (logged; what was enqueued drained).
 */
kvf_status_t kvf_conn_ipc_run_jobs(struct kvf_connector *conn, struct kvf_conn_rank *rk,
                                   struct kvf_connector_req *req);

/**
 * poll() of a request that took the same-node path: KVF_INPROGRESS until
 * its event completes (then the landed/done times are set and KVF_OK),
 * KVF_ERR_PEER_TIMEOUT past the request's deadline, a device error.
 */
kvf_status_t kvf_conn_ipc_poll(struct kvf_connector *conn, struct kvf_connector_req *req);

/** Request teardown: wait for an unfinished gather (it writes the pool), drop the event. */
void kvf_conn_ipc_req_free(struct kvf_connector *conn, struct kvf_connector_req *req);

/** Fill the path fields of @a stats for @a req. */
void kvf_conn_ipc_stats(struct kvf_connector *conn, const struct kvf_connector_req *req,
                        struct kvf_connector_stats *stats);

/** Connector destroy: wait for the rank's stream, close every mapping, free the state. */
void kvf_conn_ipc_rank_destroy(struct kvf_conn_rank *rk);

#endif
