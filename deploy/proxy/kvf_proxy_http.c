/*
 * kvf-proxy HTTP front end on libmicrohttpd: the daemon, routing, the
 * per-connection guard, the API key and TLS.
 *
 * Threading: one polling thread of the library (epoll) serves every
 * connection; a completion never blocks it: the connection is suspended
 * while its flow waits for an instance and resumed by the edge thread when
 * a reply, a deadline or a departure comes (kvf_proxy_edge.h,
 * kvf_proxy_sse.c). So the connection cap is a matter of descriptors and
 * memory (a few KiB per connection), not threads: thousands by default.
 * Rejected: a thread per connection (the previous design: 256 connections
 * took 256 threads, and idle clients took the threads real requests needed)
 * and a thread pool of the library's (each thread still blocks on what its
 * connections wait for).
 *
 * Over-cap connections are accepted (the library's own limit is about
 * twice the cap) and answered with a JSON 503 at once, then closed.
 */
#define _GNU_SOURCE
#include "kvf_proxy_http_int.h"
#include "kvf_proxy_tokenize.h"
#include "kvf_log.h"
#include "kvf_array.h"
#include "kvf_proxy_export.h"
#include "kvf_proxy_vllm.h"
#include "kvf_prom.h"

#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* Descriptors kept free of HTTP connections: the pool's sockets, logs, the edge. */
#define KVF_PROXY_FD_RESERVE 128

/* ---- answers ------------------------------------------------------------------ */

static enum MHD_Result kvf_proxy_respond_hdr(struct MHD_Connection *conn, unsigned code,
                                             const char *type, char *body, bool close,
                                             const char *hname, const char *hvalue)
{
    struct MHD_Response *resp;
    enum MHD_Result ret;

    if (body == NULL) {
        body = strdup("{\"error\": {\"message\": \"out of memory\", \"type\": \"server_error\"}}");
        code = MHD_HTTP_INTERNAL_SERVER_ERROR;
        if (body == NULL) {
            return MHD_NO;
        }
    }
    resp = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (resp == NULL) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (close) {
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
    }
    if (hname != NULL) {
        MHD_add_response_header(resp, hname, hvalue);
    }
    ret = MHD_queue_response(conn, code, resp);
    MHD_destroy_response(resp);
    return ret;
}

enum MHD_Result kvf_proxy_respond_ex(struct MHD_Connection *conn, unsigned code,
                                     const char *type, char *body, bool close)
{
    return kvf_proxy_respond_hdr(conn, code, type, body, close, NULL, NULL);
}

enum MHD_Result kvf_proxy_respond_error_retry(struct MHD_Connection *conn, int code,
                                              const char *type, const char *param,
                                              const char *msg, int retry_after_s)
{
    char secs[16];

    /* a 503 is a refusal to retry (overload, draining): say when (kvf_proxy_route.h) */
    snprintf(secs, sizeof(secs), "%d", (retry_after_s < 1) ? 1 : retry_after_s);
    return kvf_proxy_respond_hdr(conn, (unsigned)code, "application/json",
                                 kvf_proxy_openai_error_json(msg, type, param, code), false,
                                 (code == 503) ? "Retry-After" : NULL, secs);
}

enum MHD_Result kvf_proxy_respond_error(struct MHD_Connection *conn, int code, const char *type,
                                        const char *param, const char *msg)
{
    return kvf_proxy_respond_error_retry(conn, code, type, param, msg, 1);
}

/* A refusal at the headers: counted, JSON, and the connection closed (its body is not read). */
static enum MHD_Result kvf_proxy_refuse(struct kvf_proxy_http *http, struct MHD_Connection *conn,
                                        kvf_proxy_conn_t *cc, int code, const char *type,
                                        const char *msg)
{
    if (cc->slot != NULL) {
        kvf_proxy_conns_phase(http->conns, cc->slot, KVF_PROXY_PHASE_BUSY);
    }
    kvf_proxy_metrics_request(http->params.flow->metrics, code);
    return kvf_proxy_respond_hdr(conn, (unsigned)code, "application/json",
                                 kvf_proxy_openai_error_json(msg, type, NULL, code), true,
                                 (code == 401) ? MHD_HTTP_HEADER_WWW_AUTHENTICATE :
                                 (code == 503) ? "Retry-After" : NULL,
                                 (code == 401) ? "Bearer" : "1");
}

/* ---- API key ------------------------------------------------------------------ */

/* Whether @a got equals @a want, in time that depends on their lengths only. */
static bool kvf_proxy_const_eq(const char *got, size_t got_len, const char *want,
                               size_t want_len)
{
    unsigned char diff = (unsigned char)(got_len != want_len);

    for (size_t i = 0; i < want_len; ++i) {
        diff |= (unsigned char)(want[i] ^ ((i < got_len) ? got[i] : 0));
    }
    return diff == 0;
}

/* True when @a url needs the API key and the request does not carry it. */
static bool kvf_proxy_unauthorized(const struct kvf_proxy_http *http, struct MHD_Connection *conn,
                                   const char *url)
{
    const char *key = http->params.api_key;
    const char *auth;
    size_t n;

    if ((key == NULL) || (key[0] == '\0')) {
        return false;
    }
    if ((strncmp(url, "/v1/", 4) != 0) && (!http->params.protect_metrics ||
                                           ((strcmp(url, "/metrics") != 0) &&
                                            (strcmp(url, "/health") != 0)))) {
        return false;
    }
    auth = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if ((auth == NULL) || (strncasecmp(auth, "Bearer ", 7) != 0)) {
        return true;
    }
    auth += 7;
    n = strlen(auth);
    return !kvf_proxy_const_eq(auth, n, key, strlen(key));
}

/* ---- routing -------------------------------------------------------------------- */

static enum MHD_Result kvf_proxy_metrics_page(struct kvf_proxy_http *http,
                                              struct MHD_Connection *conn)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);

    if (f == NULL) {
        return kvf_proxy_respond_error(conn, 500, "server_error", NULL, "out of memory");
    }
    kvf_proxy_metrics_render(http->params.flow->metrics, f);
    kvf_prom_scalar(f, "kvf_proxy_connections", "gauge",
                    "Open HTTP connections (this one included).",
                    kvf_proxy_conns_count(http->conns));
    kvf_prom_scalar(f, "kvf_proxy_connections_waiting", "gauge",
                    "Connections suspended while their request waits for an instance.",
                    kvf_proxy_edge_suspended(http->edge));
    kvf_prom_scalar(f, "kvf_proxy_connection_timeouts_total", "counter",
                    "Connections closed for missing their header, body or idle deadline.",
                    kvf_proxy_conns_timeouts(http->conns));
    if (http->params.flow->admit != NULL) {
        const kvf_proxy_admit_stats_t st = kvf_proxy_admit_stats(http->params.flow->admit);

        kvf_prom_scalar(f, "kvf_proxy_admission_queue_requests", "gauge",
                        "Requests waiting in the proxy for an instance slot (every instance "
                        "at --max-outstanding).", st.count);
        kvf_prom_scalar(f, "kvf_proxy_admission_queue_prompt_tokens", "gauge",
                        "Their prompt tokens.", st.tokens);
        kvf_prom_scalar(f, "kvf_proxy_admission_queued_total", "counter",
                        "Requests that waited in that queue.", st.total);
    }
    kvf_proxy_pool_render_metrics(http->params.flow->pool, f);
    kvf_proxy_export_render(http->params.flow->pool, http->params.api->model_name, f);
    kvf_proxy_vllm_render(http->params.flow->pool, http->params.api->model_name,
                          http->params.api->max_model_len, f);
    fclose(f);
    return kvf_proxy_respond_ex(conn, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8",
                                buf, false);
}

/* /tokenize and /detokenize (kvf_proxy_tokenize.h): POST, with the model's tokenizer. */
static enum MHD_Result kvf_proxy_tokenize_route(struct kvf_proxy_http *http,
                                                struct MHD_Connection *conn, const char *url,
                                                bool post, kvf_proxy_conn_t *cc)
{
    const kvf_proxy_openai_ctx_t *api = http->params.api;
    const char *param = NULL;
    char err[512];
    int code = 400;
    char *json;

    if (!post) {
        return kvf_proxy_respond_error(conn, 405, "invalid_request_error", NULL,
                                       "use POST for this endpoint");
    }
    if (cc->too_large) {
        snprintf(err, sizeof(err), "request body is larger than %zu bytes",
                 http->params.max_body);
        return kvf_proxy_respond_error(conn, 413, "invalid_request_error", NULL, err);
    }
    if (!api->tok_ready) {
        return kvf_proxy_respond_error(conn, 503, "server_error", NULL, "no tokenizer yet: "
                                       "the proxy has no --model and no instance has given it "
                                       "the daemons' model folder");
    }
    json = (strcmp(url, "/tokenize") == 0) ?
           kvf_proxy_tokenize_json(api, (cc->body != NULL) ? cc->body : "", cc->len, &code,
                                   &param, err, sizeof(err)) :
           kvf_proxy_detokenize_json(api, (cc->body != NULL) ? cc->body : "", cc->len, &code,
                                     &param, err, sizeof(err));
    if (json == NULL) {
        return kvf_proxy_respond_error(conn, code, "invalid_request_error", param, err);
    }
    return kvf_proxy_respond_ex(conn, MHD_HTTP_OK, "application/json", json, false);
}

static enum MHD_Result kvf_proxy_route(struct kvf_proxy_http *http, struct MHD_Connection *conn,
                                       const char *url, const char *method,
                                       kvf_proxy_conn_t *cc)
{
    bool get = (strcmp(method, "GET") == 0) || (strcmp(method, "HEAD") == 0);
    bool post = (strcmp(method, "POST") == 0);

    if (strcmp(url, "/v1/completions") == 0) {
        if (!post) {
            return kvf_proxy_respond_error(conn, 405, "invalid_request_error", NULL,
                                           "use POST for /v1/completions");
        }
        return kvf_proxy_completions(http, conn, cc);
    }
    if (strcmp(url, "/v1/chat/completions") == 0) {
        if (!post) {
            return kvf_proxy_respond_error(conn, 405, "invalid_request_error", NULL,
                                           "use POST for /v1/chat/completions");
        }
        return kvf_proxy_chat_completions(http, conn, cc);
    }
    if ((strcmp(url, "/tokenize") == 0) || (strcmp(url, "/detokenize") == 0)) {
        return kvf_proxy_tokenize_route(http, conn, url, post, cc);
    }
    if (strcmp(url, "/version") == 0) {
        return get ? kvf_proxy_respond_ex(conn, MHD_HTTP_OK, "application/json",
                                          kvf_proxy_version_json(), false) :
                     kvf_proxy_respond_error(conn, 405, "invalid_request_error", NULL,
                                             "use GET for /version");
    }
    if ((strcmp(url, "/health") == 0) || (strcmp(url, "/v1/models") == 0) ||
        (strcmp(url, "/metrics") == 0)) {
        if (!get) {
            return kvf_proxy_respond_error(conn, 405, "invalid_request_error", NULL,
                                           "use GET for this endpoint");
        }
    }
    if (strcmp(url, "/health") == 0) {
        cJSON *h = kvf_proxy_pool_health_json(http->params.flow->pool);
        char *body = (h != NULL) ? cJSON_PrintUnformatted(h) : NULL;
        unsigned code = kvf_proxy_pool_ready(http->params.flow->pool) ?
                        MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE;

        cJSON_Delete(h);
        return kvf_proxy_respond_ex(conn, code, "application/json", body, false);
    }
    if (strcmp(url, "/v1/models") == 0) {
        return kvf_proxy_respond_ex(conn, MHD_HTTP_OK, "application/json",
                                    kvf_proxy_openai_models_json(http->params.api, http->started),
                                    false);
    }
    if (strcmp(url, "/metrics") == 0) {
        return kvf_proxy_metrics_page(http, conn);
    }
    return kvf_proxy_respond_error(conn, 404, "invalid_request_error", NULL, "no such endpoint");
}

/* First call for a request: its headers are in. Refuse at once what would be refused later. */
static enum MHD_Result kvf_proxy_access_headers(struct kvf_proxy_http *http,
                                                struct MHD_Connection *conn, const char *url,
                                                kvf_proxy_conn_t *cc)
{
    const char *clen;
    char err[256];
    kvf_proxy_admit_t admit = KVF_PROXY_ADMIT_OK;

    if (atomic_load(&http->draining)) {
        kvf_proxy_metrics_reject(http->params.flow->metrics, KVF_PROXY_REJECT_SHUTDOWN);
        return kvf_proxy_refuse(http, conn, cc, 503, "server_error",
                                "the proxy is shutting down; retry on another one");
    }
    if (cc->slot != NULL) {
        admit = kvf_proxy_conns_attribute(http->conns, cc->slot,
                                          MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                                      "X-Forwarded-For"));
    }
    if (admit != KVF_PROXY_ADMIT_OK) {
        bool total = (admit == KVF_PROXY_ADMIT_OVER_TOTAL);
        snprintf(err, sizeof(err), total ?
                 "too many connections: the proxy serves at most %u at once "
                 "(--max-connections); retry later" :
                 "too many connections from this client: at most %u at once "
                 "(--max-connections-per-client); retry later",
                 total ? http->params.max_connections : http->params.max_per_client);
        kvf_proxy_metrics_reject(http->params.flow->metrics, KVF_PROXY_REJECT_CONNECTIONS);
        return kvf_proxy_refuse(http, conn, cc, 503, "server_error", err);
    }
    if (kvf_proxy_unauthorized(http, conn, url)) {
        return kvf_proxy_refuse(http, conn, cc, 401, "invalid_request_error",
                                "invalid or missing API key: send the header "
                                "'Authorization: Bearer <key>' (the proxy's --api-key)");
    }
    clen = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if ((clen != NULL) && (strtoull(clen, NULL, 10) > http->params.max_body)) {
        snprintf(err, sizeof(err), "request body of %s bytes is larger than %zu bytes "
                 "(--max-body)", clen, http->params.max_body);
        return kvf_proxy_refuse(http, conn, cc, 413, "invalid_request_error", err);
    }
    if (cc->slot != NULL) {
        kvf_proxy_conns_phase(http->conns, cc->slot, KVF_PROXY_PHASE_BODY);
    }
    return MHD_YES;
}

/* A piece of the body: kept up to --max-body, then dropped (413 at the end). */
static enum MHD_Result kvf_proxy_access_body(struct kvf_proxy_http *http, kvf_proxy_conn_t *cc,
                                             const char *data, size_t *size)
{
    size_t n = *size;

    if (!cc->too_large && (cc->len + n > http->params.max_body)) {
        cc->too_large = true;
        free(cc->body);
        cc->body = NULL;
        cc->len = cc->cap = 0;
    }
    if (!cc->too_large) {
        if (KVF_ARRAY_GROW(cc->body, cc->cap, cc->len + n + 1, 1024) != KVF_OK) {
            return MHD_NO;
        }
        memcpy(cc->body + cc->len, data, n);
        cc->len += n;
        cc->body[cc->len] = '\0';
    }
    *size = 0;
    return MHD_YES;
}

static enum MHD_Result kvf_proxy_access(void *cls, struct MHD_Connection *conn, const char *url,
                                        const char *method, const char *version,
                                        const char *upload_data, size_t *upload_data_size,
                                        void **con_cls)
{
    struct kvf_proxy_http *http = cls;
    kvf_proxy_conn_t *cc = *con_cls;

    (void)version;
    if (cc == NULL) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);

        cc = calloc(1, sizeof(*cc));
        if (cc == NULL) {
            return MHD_NO;
        }
        *con_cls = cc;
        cc->slot = (ci != NULL) ? ci->socket_context : NULL;
        return kvf_proxy_access_headers(http, conn, url, cc);
    }
    if (*upload_data_size > 0) {
        return kvf_proxy_access_body(http, cc, upload_data, upload_data_size);
    }
    if ((cc->slot != NULL) && (cc->cmpl == NULL)) {
        kvf_proxy_conns_phase(http->conns, cc->slot, KVF_PROXY_PHASE_BUSY);
    }
    return kvf_proxy_route(http, conn, url, method, cc);
}

static void kvf_proxy_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                                enum MHD_RequestTerminationCode toe)
{
    struct kvf_proxy_http *http = cls;
    kvf_proxy_conn_t *cc = *con_cls;

    (void)conn;
    (void)toe;
    if (cc != NULL) {
        if (cc->cmpl != NULL) {   /* ended while its flow waited (shutdown, client gone) */
            kvf_proxy_cmpl_abandon(cc->cmpl);
        }
        if (cc->slot != NULL) {   /* keep-alive: the next request's headers are due */
            kvf_proxy_conns_phase(http->conns, cc->slot, KVF_PROXY_PHASE_HEADERS);
        }
        free(cc->body);
        free(cc);
        *con_cls = NULL;
    }
}

static void kvf_proxy_notify_conn(void *cls, struct MHD_Connection *conn, void **socket_context,
                                  enum MHD_ConnectionNotificationCode toe)
{
    struct kvf_proxy_http *http = cls;

    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *fd =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        const union MHD_ConnectionInfo *addr =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);

        *socket_context = (fd != NULL) ?
                          kvf_proxy_conns_open(http->conns, fd->connect_fd,
                                               (addr != NULL) ? addr->client_addr : NULL) :
                          NULL;
    } else if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
        kvf_proxy_conns_close(http->conns, *socket_context);
        *socket_context = NULL;
    }
}

/* ---- start, drain, stop --------------------------------------------------------- */

/* The whole of file @a path (for a PEM), NUL-terminated; NULL (logged) on failure. */
static char *kvf_proxy_read_file(const char *path, const char *flag)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    size_t len = 0, cap = 0;

    if (f == NULL) {
        kvf_error("%s %s: cannot open: %s", flag, path, strerror(errno));
        return NULL;
    }
    for (;;) {
        if (len + 4096 + 1 > cap) {
            char *b;
            cap = (cap == 0) ? 8192 : cap * 2;
            if ((cap > (1u << 20)) || ((b = realloc(buf, cap)) == NULL)) {
                kvf_error("%s %s: larger than 1 MiB or out of memory", flag, path);
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = b;
        }
        size_t n = fread(buf + len, 1, cap - len - 1, f);
        len += n;
        if (n == 0) {
            break;
        }
    }
    fclose(f);
    buf[len] = '\0';
    return buf;
}

/* TLS: check the library can, load the PEMs. KVF_OK also when not asked for. */
static kvf_status_t kvf_proxy_http_tls(struct kvf_proxy_http *http)
{
    const kvf_proxy_http_params_t *p = &http->params;
    bool cert = (p->tls_cert != NULL) && (p->tls_cert[0] != '\0');
    bool key = (p->tls_key != NULL) && (p->tls_key[0] != '\0');

    if (!cert && !key) {
        return KVF_OK;
    }
    if (cert != key) {
        kvf_error("--tls-cert and --tls-key go together: %s is missing",
                  cert ? "--tls-key" : "--tls-cert");
        return KVF_ERR_INVALID_PARAM;
    }
    if (MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES) {
        kvf_error("--tls-cert: this libmicrohttpd was built without TLS support "
                  "(MHD_FEATURE_TLS); install one with GnuTLS, or terminate TLS in front");
        return KVF_ERR_UNSUPPORTED;
    }
    http->tls_cert = kvf_proxy_read_file(p->tls_cert, "--tls-cert");
    http->tls_key = (http->tls_cert != NULL) ? kvf_proxy_read_file(p->tls_key, "--tls-key") :
                    NULL;
    if (http->tls_key == NULL) {
        free(http->tls_cert);
        http->tls_cert = NULL;
        return KVF_ERR_IO;
    }
    return KVF_OK;
}

/* The library's own connection limit: about twice the cap, within the descriptors we may open. */
static unsigned kvf_proxy_http_hard_limit(unsigned max_connections)
{
    struct rlimit rl;
    uint64_t want = 2ull * max_connections + 64;
    uint64_t room;

    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) {
        return (unsigned)want;
    }
    if ((rl.rlim_cur != RLIM_INFINITY) && (rl.rlim_cur < want + KVF_PROXY_FD_RESERVE) &&
        (rl.rlim_cur < rl.rlim_max)) {
        rlim_t old = rl.rlim_cur;
        rl.rlim_cur = (rl.rlim_max == RLIM_INFINITY) ? (rlim_t)(want + KVF_PROXY_FD_RESERVE) :
                      rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) == 0) {
            kvf_info("raised the open-file limit from %llu to %llu for --max-connections %u",
                     (unsigned long long)old, (unsigned long long)rl.rlim_cur,
                     max_connections);
        } else {
            rl.rlim_cur = old;
        }
    }
    room = (rl.rlim_cur == RLIM_INFINITY) ? want :
           (rl.rlim_cur > KVF_PROXY_FD_RESERVE) ? rl.rlim_cur - KVF_PROXY_FD_RESERVE : 16;
    if (room < (uint64_t)max_connections + 1) {
        kvf_warn("--max-connections %u exceeds what the open-file limit (%llu) allows; "
                 "connections beyond about %llu are closed unanswered (raise ulimit -n)",
                 max_connections, (unsigned long long)rl.rlim_cur, (unsigned long long)room);
    }
    return (unsigned)((want < room) ? want : room);
}

static struct MHD_Daemon *kvf_proxy_http_daemon(struct kvf_proxy_http *http,
                                                const struct sockaddr *addr)
{
    const kvf_proxy_http_params_t *p = &http->params;
    unsigned flags = MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME |
                     MHD_USE_ERROR_LOG | MHD_USE_ITC;   /* ITC: MHD_quiesce_daemon() */
    int64_t backstop = p->idle_timeout_ms;
    bool per_ip = (p->max_per_client != 0) &&
                  ((p->trusted_proxies == NULL) || (p->trusted_proxies[0] == '\0'));
    struct MHD_OptionItem tls[] = {
        {MHD_OPTION_HTTPS_MEM_CERT, 0, http->tls_cert},
        {MHD_OPTION_HTTPS_MEM_KEY, 0, http->tls_key},
        {MHD_OPTION_END, 0, NULL},
    };

    backstop = (p->header_timeout_ms > backstop) ? p->header_timeout_ms : backstop;
    backstop = (p->body_timeout_ms > backstop) ? p->body_timeout_ms : backstop;
    flags |= (addr->sa_family == AF_INET6) ? MHD_USE_IPv6 : 0;
    flags |= (http->tls_cert != NULL) ? MHD_USE_TLS : 0;
    /* the inactivity timeout is a backstop behind the guard's deadlines; a
     * suspended connection (a request waiting, a quiet stream) has none */
    return MHD_start_daemon(flags, (uint16_t)p->port, NULL, NULL, kvf_proxy_access, http,
                            MHD_OPTION_EXTERNAL_LOGGER, kvf_proxy_mhd_log, http,
                            MHD_OPTION_SOCK_ADDR, addr,
                            MHD_OPTION_CONNECTION_LIMIT,
                            kvf_proxy_http_hard_limit(p->max_connections),
                            MHD_OPTION_PER_IP_CONNECTION_LIMIT,
                            per_ip ? 2 * p->max_per_client + 32 : 0u,
                            MHD_OPTION_LISTEN_BACKLOG_SIZE, 4096u,
                            MHD_OPTION_CONNECTION_TIMEOUT,
                            (unsigned)((backstop + 1999) / 1000),
                            MHD_OPTION_NOTIFY_COMPLETED, kvf_proxy_completed, http,
                            MHD_OPTION_NOTIFY_CONNECTION, kvf_proxy_notify_conn, http,
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)KVF_PROXY_HEADER_MEMORY,
                            MHD_OPTION_ARRAY, (http->tls_cert != NULL) ? tls : tls + 2,
                            MHD_OPTION_END);
}

static void kvf_proxy_http_free(struct kvf_proxy_http *http)
{
    kvf_proxy_edge_destroy(http->edge);
    kvf_proxy_conns_destroy(http->conns);
    free(http->tls_cert);
    free(http->tls_key);
    free(http);
}

kvf_status_t kvf_proxy_http_start(const kvf_proxy_http_params_t *params,
                                  kvf_proxy_http_h *http_p)
{
    struct addrinfo hints = {0}, *ai = NULL;
    struct kvf_proxy_http *http;
    kvf_proxy_conns_params_t cp = {0};
    kvf_status_t st;
    char port[16];
    int rc;

    if ((params->port < 0) || (params->port > 65535)) {
        kvf_error("bad port %d", params->port);
        return KVF_ERR_INVALID_PARAM;
    }
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    snprintf(port, sizeof(port), "%d", params->port);
    rc = getaddrinfo(params->host, port, &hints, &ai);
    if ((rc != 0) || (ai == NULL)) {
        kvf_error("bad --host '%s': %s", params->host, gai_strerror(rc));
        return KVF_ERR_INVALID_PARAM;
    }
    http = calloc(1, sizeof(*http));
    if (http == NULL) {
        freeaddrinfo(ai);
        return KVF_ERR_NO_MEMORY;
    }
    http->params = *params;
    http->started = (int64_t)time(NULL);
    atomic_init(&http->stopping, false);
    atomic_init(&http->draining, false);
    atomic_init(&http->inflight, 0);
    cp.max_total = params->max_connections;
    cp.max_per_client = params->max_per_client;
    cp.trusted_proxies = params->trusted_proxies;
    cp.header_timeout_ms = params->header_timeout_ms;
    cp.body_timeout_ms = params->body_timeout_ms;
    cp.idle_timeout_ms = params->idle_timeout_ms;
    st = kvf_proxy_http_tls(http);
    if (st == KVF_OK) {
        st = kvf_proxy_conns_create(&cp, &http->conns);
    }
    if (st == KVF_OK) {
        st = kvf_proxy_edge_create(&params->flow->cancel, &http->edge);
    }
    if (st == KVF_OK) {
        http->daemon = kvf_proxy_http_daemon(http, ai->ai_addr);
        if (http->daemon == NULL) {
            kvf_error("cannot listen on %s:%d (port in use, or address not local?)",
                      params->host, params->port);
            kvf_proxy_edge_stop(http->edge);
            st = KVF_ERR_IO;
        }
    }
    freeaddrinfo(ai);
    if (st != KVF_OK) {
        kvf_proxy_http_free(http);
        return st;
    }
    *http_p = http;
    return KVF_OK;
}

int kvf_proxy_http_port(kvf_proxy_http_h http)
{
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(http->daemon, MHD_DAEMON_INFO_BIND_PORT);

    return (di != NULL) ? (int)di->port : -1;
}

/* Wait up to @a ms for the requests in flight to end; true when none is left. */
static bool kvf_proxy_http_wait_idle(struct kvf_proxy_http *http, int64_t ms)
{
    int64_t end = kvf_proxy_now_us() + ms * 1000;

    while (atomic_load(&http->inflight) > 0) {
        struct timespec nap = {0, 20 * 1000000L};
        if (kvf_proxy_now_us() >= end) {
            return false;
        }
        nanosleep(&nap, NULL);
    }
    return true;
}

void kvf_proxy_http_drain(kvf_proxy_http_h http, int64_t grace_ms)
{
    MHD_socket lsock;
    kvf_proxy_flow_ctx_t *fctx = http->params.flow;

    atomic_store(&http->draining, true);
    lsock = MHD_quiesce_daemon(http->daemon);   /* no new connections from here */
    if (lsock != MHD_INVALID_SOCKET) {
        close(lsock);
    }
    kvf_info("draining: not accepting; %d request(s) in flight get up to %lld ms to finish",
             atomic_load(&http->inflight), (long long)grace_ms);
    if (kvf_proxy_http_wait_idle(http, grace_ms)) {
        return;
    }
    /* End the rest: a stream gets an error event and [DONE], others a 503
     * (the edge resumes every waiting one once cancel is set). */
    kvf_info("draining: ending %d request(s) still in flight", atomic_load(&http->inflight));
    atomic_store(&fctx->cancel, true);
    if (!kvf_proxy_http_wait_idle(http, 2000)) {
        kvf_warn("draining: %d request(s) did not end; stopping anyway",
                 atomic_load(&http->inflight));
    }
}

void kvf_proxy_http_stop(kvf_proxy_http_h http)
{
    if (http == NULL) {
        return;
    }
    atomic_store(&http->stopping, true);
    kvf_proxy_edge_stop(http->edge);   /* resumes every waiting request: they end */
    MHD_stop_daemon(http->daemon);
    kvf_proxy_http_free(http);
}
