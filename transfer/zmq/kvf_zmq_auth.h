/*
 * Authenticated ZeroMQ: CURVE on every tcp:// endpoint of the pool, with a
 * ZAP handler that accepts only the pool's own keys (docs/SECURITY.md).
 *
 * Key set (made by kvf-up with `kvf keygen` in <run-dir>/keys, or given by
 * the operator; folder mode 0700, files 0600):
 *   server.key   the pool's server key pair: every daemon's bound socket
 *                uses its secret, every client pins its public key
 *   <id>.key     one client key pair per pool member (prefill-0, decode-0,
 *                proxy, ...)
 *   pool.pub     the allowlist, one member a line: "<id> <role> <public-z85>"
 *                (role: prefill | decode | proxy | tool); '#' starts a comment
 * A key file is two lines, "public <z85>" and "secret <z85>" (40 Z85
 * characters each, 32 bytes of key).
 *
 * Channels (ZAP domains) and the roles each accepts:
 *   "serve"  control channel of a daemon (proxy -> daemon): proxy, tool
 *   "side"   side channel of prefill (decode -> prefill): decode
 *
 * Modes: secure after kvf_zmq_auth_init() with a keys folder; insecure after
 * kvf_zmq_auth_init() with insecure = true (plain ZeroMQ, every peer
 * accepted, a loud warning at start); unconfigured (no init: in-process
 * tools and unit tests) behaves as insecure without the warning.
 *
 * ZAP handlers: ZeroMQ asks the handler bound on inproc://zeromq.zap.01 of
 * the socket's own context. In secure mode kvf_zmq_socket_open() (kvf_zmq.h)
 * starts one handler thread per context the first time a socket is opened
 * on it; the thread ends when the context is terminated (zmq_ctx_term()).
 * So a socket given to kvf_zmq_bind() must come from kvf_zmq_socket_open().
 *
 * Thread rules: init/cleanup once, before/after every other thread uses
 * ZeroMQ; the rest from any thread.
 */
#ifndef KVF_ZMQ_AUTH_H
#define KVF_ZMQ_AUTH_H

#include "kvf_status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <zmq.h>

/** Longest member id (bytes, without the NUL). */
#define KVF_ZMQ_AUTH_ID_MAX 63
/** Most members in pool.pub. */
#define KVF_ZMQ_AUTH_MAX_MEMBERS 1024

/** Process-wide configuration (daemons: --keys DIR --key-id ID [--insecure]). */
typedef struct kvf_zmq_auth_config {
    const char *keys_dir;   /* folder holding server.key, <key_id>.key, pool.pub;
                             * NULL or "" only with insecure */
    const char *key_id;     /* this process's member id (a line of pool.pub) */
    bool        insecure;   /* plain ZeroMQ, no keys: lab use only, warns */
} kvf_zmq_auth_config_t;

/**
 * Configure authentication for the whole process: load server.key,
 * <key_id>.key and pool.pub from cfg->keys_dir (secure), or log the
 * insecure warning (insecure). When @a zmq_ctx is not NULL a ZAP handler is
 * started on it now (otherwise on each context at its first socket).
 * @return KVF_OK; KVF_ERR_INVALID_PARAM naming the problem (no keys folder
 *         and not insecure, key_id missing or not in pool.pub, a file
 *         readable by others, a malformed line with its number);
 *         KVF_ERR_IO (a file cannot be read, with the path);
 *         KVF_ERR_UNSUPPORTED (this libzmq has no CURVE); KVF_ERR_BUSY (init
 *         twice without cleanup). Each error is logged.
 */
kvf_status_t kvf_zmq_auth_init(void *zmq_ctx, const kvf_zmq_auth_config_t *cfg);

/** Forget the configuration (back to unconfigured). Handler threads keep
 *  running until their contexts end and refuse everyone meanwhile. */
void kvf_zmq_auth_cleanup(void);

/**
 * Make sure context @a ctx has a ZAP handler when secure (no-op otherwise);
 * kvf_zmq_socket_open() calls it for every socket it opens.
 * @return KVF_OK; KVF_ERR_ZMQ / KVF_ERR_NO_RESOURCE when the handler cannot
 *         be bound or its thread cannot start (logged).
 */
kvf_status_t kvf_zmq_auth_attach(void *ctx);

/** true after a secure kvf_zmq_auth_init(). */
bool kvf_zmq_auth_secure(void);

/**
 * Bind @a sock (opened in context @a ctx) on @a endpoint as a CURVE server
 * with server.key, ZAP domain @a domain ("serve" or "side"). inproc://
 * endpoints, and every endpoint when not secure, are bound plainly
 * (zmq_bind). A secure bind also starts a monitor of @a sock (a thread that
 * ends when the socket closes or @a ctx terminates): each connection that
 * fails the CURVE handshake before the key check (no CURVE, another server
 * key, not ZeroMQ) counts as a refusal on @a domain (kvf_zmq_auth_refusals())
 * and is logged once per kind; so @a sock must not get another
 * zmq_socket_monitor().
 * @return KVF_OK; KVF_ERR_INVALID_PARAM (unknown domain);
 *         KVF_ERR_ZMQ (an option or zmq_bind failed; zmq_errno() is that of
 *         the failed call, so callers can log zmq_strerror(zmq_errno())).
 */
kvf_status_t kvf_zmq_bind(void *ctx, void *sock, const char *endpoint, const char *domain);

/**
 * Connect @a sock to @a endpoint as a CURVE client with this process's
 * <key_id>.key, server key pinned to server.key's public half. inproc://
 * endpoints, and every endpoint when not secure, connect plainly.
 * @return KVF_OK; KVF_ERR_ZMQ (zmq_errno() as for kvf_zmq_bind).
 */
kvf_status_t kvf_zmq_connect(void *sock, const char *endpoint);

/**
 * The authenticated member id of the peer that sent @a msg (received with
 * zmq_msg_recv() on a socket bound with kvf_zmq_bind()): the ZAP User-Id,
 * e.g. "decode-0". "insecure" when the process is not secure. NULL only
 * for a message without a User-Id in secure mode (inproc sockets).
 * Valid while @a msg is.
 */
const char *kvf_zmq_msg_peer_id(zmq_msg_t *msg);

/**
 * Count and log (once per peer) a refusal decided by a handler above this
 * layer, e.g. a lease claim from "decode-1" on a connection authenticated
 * as "proxy". @a domain "serve" or "side"; @a peer_id the authenticated id
 * (may be NULL); @a why a short reason for the log.
 */
void kvf_zmq_auth_note_refusal(const char *domain, const char *peer_id, const char *why);

/**
 * Refusals counted so far on channel @a domain ("serve", "side"), by the ZAP
 * handler and by kvf_zmq_auth_note_refusal(); NULL: all channels.
 */
uint64_t kvf_zmq_auth_refusals(const char *domain);

/**
 * Write a new key set into @a dir (created with mode 0700 if missing; files
 * 0600): server.key, one <id>.key per member and pool.pub. A member is
 * "id" or "id:role"; without a role it is taken from the id: "prefill*" ->
 * prefill, "decode*" -> decode, "proxy*" -> proxy, anything else -> tool.
 * Existing files are replaced (rotation: write a new set, restart the pool).
 * @return KVF_OK; KVF_ERR_INVALID_PARAM (bad or duplicate id, unknown role);
 *         KVF_ERR_IO (with the path); KVF_ERR_UNSUPPORTED (no CURVE).
 */
kvf_status_t kvf_zmq_auth_keygen(const char *dir, const char *const *members,
                                 size_t num_members);

#endif
