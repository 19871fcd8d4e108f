/*
 * The UCX implementation of the KV connector (transfer/ucx/kvf_connector.h): UCX
 * agents per rank, the ZeroMQ side channel, the compatibility check and the
 * transfer planner behind one ops table.
 */
#ifndef KVF_CONNECTOR_UCX_H
#define KVF_CONNECTOR_UCX_H

#include "kvf_connector.h"

/** The "ucx" connector ops table (static storage, every op set). */
const kvf_connector_ops_t *kvf_connector_ucx_ops(void);

#endif
