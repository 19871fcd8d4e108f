/*
 * The decode role (kvf-decode): an instance of tp_size ranks that takes a
 * request with transfer parameters from a prefill instance, handshakes with
 * that prefill engine (cached), allocates and zeroes blocks, pulls the KV
 * and Mamba state straight into them with the planner and UCX, zeroes the
 * tails, notifies prefill, then continues decoding from the seeded first
 * token in its continuous batch, streaming tokens back.
 *
 * Load failure policy (--load-failure): "fail" answers the request with the
 * transfer error; "recompute" prefills the prompt (and the first token)
 * locally and goes on, so the client still gets its answer.
 *
 * Thread model as kvf-prefill: the leader thread owns the control socket,
 * the engine and every connector call.
 */
#ifndef KVF_DECODE_SERVER_H
#define KVF_DECODE_SERVER_H

#include "kvf_config.h"
#include "kvf_role.h"
#include "kvf_status.h"

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct kvf_decode_config {
    kvf_role_config_t role;                     /* model, tp, listen, engine id, pool, ... */
    char    load_failure[KVF_CONFIG_STR_MAX];   /* "fail" or "recompute" */
    char    kv_digest[KVF_CONFIG_STR_MAX];      /* "on" (default) or "off" */
    int     max_queue;                          /* requests waiting for blocks; > 0 */
    int64_t test_pull_delay_ms;                 /* hidden: stall before the GETs (fault tests) */
} kvf_decode_config_t;

extern const kvf_config_field_t kvf_decode_config_table[];

typedef struct kvf_decode_server *kvf_decode_server_h;

/** Load the model, build engine, pools and connector, bind the control socket. */
kvf_status_t kvf_decode_server_create(const kvf_decode_config_t *cfg,
                                      kvf_decode_server_h *srv_p);

/** Serve until *@a stop becomes non-zero. */
kvf_status_t kvf_decode_server_run(kvf_decode_server_h srv, volatile sig_atomic_t *stop);

/** Abort everything and free. NULL is a no-op. */
void kvf_decode_server_destroy(kvf_decode_server_h srv);

#endif
