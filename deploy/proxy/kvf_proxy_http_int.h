/*
 * kvf-proxy HTTP front end, internal: the server object and the per-request
 * state shared by kvf_proxy_http.c (daemon, routing, auth), kvf_proxy_sse.c
 * (completions: waiting, streaming) and kvf_proxy_page.c (the library's own
 * refusals answered in JSON). Not for other users.
 */
#ifndef KVF_PROXY_HTTP_INT_H
#define KVF_PROXY_HTTP_INT_H

#include "kvf_proxy_conns.h"
#include "kvf_proxy_choice.h"
#include "kvf_proxy_edge.h"
#include "kvf_proxy_http.h"

#include <microhttpd.h>
#include <stdatomic.h>
#include <stdbool.h>

/* Per-connection memory of the HTTP library: the request line and headers
 * must fit in it (less its bookkeeping); larger ones get a JSON 431 (or 414). */
#define KVF_PROXY_HEADER_MEMORY (32u * 1024u)

struct kvf_proxy_http {
    struct MHD_Daemon *daemon;
    kvf_proxy_http_params_t params;
    kvf_proxy_conns_h  conns;
    kvf_proxy_edge_h   edge;
    atomic_bool        stopping;
    atomic_bool        draining;  /* SIGTERM: no new requests */
    atomic_int         inflight;  /* completions being handled or streamed */
    int64_t            started;   /* unix seconds, /v1/models "created" */
    char              *tls_cert;  /* PEM, when serving HTTPS */
    char              *tls_key;
};

typedef enum {
    KVF_PROXY_SSE_FIRST = 0,   /* the first token(s), from prefill */
    KVF_PROXY_SSE_RUN,         /* relaying decode replies */
    KVF_PROXY_SSE_DONE_MARK,   /* the final chunk went out; [DONE] next */
    KVF_PROXY_SSE_END,         /* everything went out */
} kvf_proxy_sse_phase_t;

/* A completion in progress: owned by its connection's request state until a
 * stream's response is queued, then by that response (its free callback). */
typedef struct kvf_proxy_cmpl {
    struct kvf_proxy_http     *http;
    struct MHD_Connection     *conn;
    kvf_proxy_wait_t           wait;      /* suspended while its flows wait */
    kvf_proxy_completion_req_t req;
    kvf_proxy_choice_t        *choices;   /* prompts x n, each with its flow */
    int                        num_choices;
    int                        rr;        /* stream: the choice looked at first next */
    int                        failed;    /* the choice whose flow failed, or -1 */
    char                       xrid[72];  /* the client's x-request-id, echoed; "" none */
    kvf_proxy_sse_phase_t      phase;
    int                        code;      /* for the request counter */
    char                      *out;       /* pending SSE bytes */
    size_t                     out_len;
    size_t                     out_off;
} kvf_proxy_cmpl_t;

/* Per request: the request body as it arrives, and the completion when there is one. */
typedef struct kvf_proxy_conn {
    char              *body;
    size_t             len;
    size_t             cap;
    bool               too_large;
    kvf_proxy_conn_slot_t *slot;   /* the connection's guard slot; NULL: none */
    kvf_proxy_cmpl_t  *cmpl;       /* NULL: none, or handed to its stream */
} kvf_proxy_conn_t;

/** Queue a response with @a body (malloc'd, taken; NULL: a 500). @a close: Connection: close. */
enum MHD_Result kvf_proxy_respond_ex(struct MHD_Connection *conn, unsigned code,
                                     const char *type, char *body, bool close);

/** Queue the OpenAI-style error JSON (a 503 with Retry-After: 1). */
enum MHD_Result kvf_proxy_respond_error(struct MHD_Connection *conn, int code, const char *type,
                                        const char *param, const char *msg);

/** The same with a 503's Retry-After of @a retry_after_s seconds (< 1: 1). */
enum MHD_Result kvf_proxy_respond_error_retry(struct MHD_Connection *conn, int code,
                                              const char *type, const char *param,
                                              const char *msg, int retry_after_s);

/** POST /v1/completions, the body complete (first call or after a resume). */
enum MHD_Result kvf_proxy_completions(struct kvf_proxy_http *http, struct MHD_Connection *conn,
                                      kvf_proxy_conn_t *cc);

/** POST /v1/chat/completions, as kvf_proxy_completions() (kvf_proxy_chat.h renders it). */
enum MHD_Result kvf_proxy_chat_completions(struct kvf_proxy_http *http,
                                           struct MHD_Connection *conn, kvf_proxy_conn_t *cc);

/** The connection ended with @a cc's completion still in the handler's hands: end it. */
void kvf_proxy_cmpl_abandon(kvf_proxy_cmpl_t *c);

/** The library's logger: its own error pages are answered in JSON first (kvf_proxy_page.c). */
void kvf_proxy_mhd_log(void *cls, const char *fmt, va_list ap);

#endif
