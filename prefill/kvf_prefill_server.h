/*
 * The prefill role (kvf-prefill): an instance of tp_size ranks that runs
 * prompts, samples the first token, and keeps each request's blocks under
 * a lease until the decode instance that pulls them releases them (or the
 * lease expires). It answers the handshake side channel for all its ranks.
 *
 * Thread model (docs/ARCHITECTURE.md §5): the leader thread (kvf_prefill_server_run)
 * owns the ZeroMQ control socket, the engine and its scheduler, and the
 * lease table; rank threads run inside engine steps; the side-channel thread
 * answers handshakes; each rank's UCX worker is progressed by the leader.
 */
#ifndef KVF_PREFILL_SERVER_H
#define KVF_PREFILL_SERVER_H

#include "kvf_config.h"
#include "kvf_role.h"
#include "kvf_status.h"

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct kvf_prefill_config {
    kvf_role_config_t role;                  /* model, tp, listen, engine id, pool, ... */
    char    host[KVF_CONFIG_STR_MAX];        /* address decode uses for the side channel */
    int     side_port;
    int64_t lease_timeout_ms;
    int64_t max_quarantine_ms;   /* bound on the quarantine a decode's timeout may ask for */
    int     max_queue;                       /* prompts admitted, not yet prefilled; > 0 */
    bool    test_no_release;                 /* hidden: ignore decode's release (lease tests) */
} kvf_prefill_config_t;

/** The config table (flags and KVF_* variables); see --help. */
extern const kvf_config_field_t kvf_prefill_config_table[];

typedef struct kvf_prefill_server *kvf_prefill_server_h;

/**
 * Load the model, build the engine and its pools, register the pools with
 * one UCX agent per rank, start the side channel and bind @a cfg->listen.
 * @return KVF_OK; any setup error (logged); nothing is left running on error.
 */
kvf_status_t kvf_prefill_server_create(const kvf_prefill_config_t *cfg,
                                       kvf_prefill_server_h *srv_p);

/**
 * Serve until *@a stop becomes non-zero (a signal handler sets it).
 * @return KVF_OK on a requested stop; a fatal error otherwise.
 */
kvf_status_t kvf_prefill_server_run(kvf_prefill_server_h srv, volatile sig_atomic_t *stop);

/** Abort all requests, free all blocks, stop every thread. NULL is a no-op. */
void kvf_prefill_server_destroy(kvf_prefill_server_h srv);

#endif
