/*
 * The HTTP library's own error pages, answered in the proxy's JSON error
 * shape instead.
 *
 * Requests the library refuses before our handler runs (headers over its
 * per-connection memory, a malformed header line, a bad Content-Length or
 * chunk, an unsupported HTTP version) would get its built-in HTML. It logs
 * each one ("Error processing request (HTTP response code is N ...") on
 * its thread just before it queues the page, so the logger writes the JSON
 * answer on that socket first and shuts its write side: the page then
 * fails to go out and the library closes the connection.
 *
 * Which socket: the logger is not told. The library parses input only of
 * connections that are not being answered, so when exactly one connection
 * is reading a request (kvf_proxy_conns_sole_reading_fd()) the page is
 * its. With several reading at once (a busy edge), or over TLS (a plain
 * write would break the TLS stream), the library's page goes out instead:
 * never someone else's connection. A request line that is not HTTP at all
 * is closed without an answer by the library (no page either).
 * Rejected: the library has no option to replace these pages, and a parser
 * of our own in front of it would duplicate its HTTP handling.
 */
#define _GNU_SOURCE
#include "kvf_proxy_http_int.h"
#include "kvf_log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

/* The readable text of one of the library's pages: its <body>, tags dropped. */
static void kvf_proxy_page_text(const char *html, size_t len, char *out, size_t cap)
{
    const char *b = strstr(html, "<body>");
    const char *end = html + len;
    size_t n = 0;
    bool tag = false;

    html = (b != NULL) ? b + 6 : html;
    for (; (html < end) && (n + 1 < cap); ++html) {
        if (strncmp(html, "</body>", 7) == 0) {
            break;
        }
        if (*html == '<') {
            tag = true;
        } else if (*html == '>') {
            tag = false;
        } else if (!tag) {
            out[n++] = *html;
        }
    }
    out[n] = '\0';
}

/* Send @a buf on @a fd without waiting (an answer this small fits the socket's buffer). */
static bool kvf_proxy_send_now(int fd, const char *buf, size_t len)
{
    while (len > 0) {
        ssize_t n = send(fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if ((n < 0) && (errno == EINTR)) {
            continue;
        }
        if (n <= 0) {
            return false;
        }
        buf += n;
        len -= (size_t)n;
    }
    return true;
}

static void kvf_proxy_page_message(unsigned code, const char *text, char *msg, size_t cap)
{
    const char *reason = MHD_get_reason_phrase_for(code);

    switch (code) {
    case 431:
    case 414:
        snprintf(msg, cap, "%s: the request line and headers must fit in %u KiB",
                 (code == 414) ? "request line (URL) too long" : "request headers too large",
                 KVF_PROXY_HEADER_MEMORY / 1024u);
        break;
    case 505:
        snprintf(msg, cap, "HTTP version not supported: use HTTP/1.1 or HTTP/1.0");
        break;
    default:
        snprintf(msg, cap, "malformed HTTP request: %s",
                 (text[0] != '\0') ? text : ((reason != NULL) ? reason : "refused"));
        break;
    }
}

/*
 * The library is about to send its own error page for status @a code
 * (@a page: its HTML). Answer in JSON first.
 * @return true when the JSON answer went out instead.
 */
static bool kvf_proxy_replace_page(struct kvf_proxy_http *http, unsigned code, const char *page,
                                   size_t page_len)
{
    int fd = (http->tls_cert == NULL) ? kvf_proxy_conns_sole_reading_fd(http->conns) : -1;
    char text[256], msg[384], head[256];
    const char *reason = MHD_get_reason_phrase_for(code);
    char *json;
    int hl;

    if (fd < 0) {
        return false;
    }
    kvf_proxy_page_text(page, page_len, text, sizeof(text));
    kvf_proxy_page_message(code, text, msg, sizeof(msg));
    json = kvf_proxy_openai_error_json(msg, (code >= 500) ? "server_error" :
                                       "invalid_request_error", NULL, (int)code);
    if (json == NULL) {
        return false;
    }
    hl = snprintf(head, sizeof(head), "HTTP/1.1 %u %s\r\nContent-Type: application/json\r\n"
                  "Content-Length: %zu\r\nConnection: close\r\n\r\n", code,
                  (reason != NULL) ? reason : "Error", strlen(json));
    if (kvf_proxy_send_now(fd, head, (size_t)hl)) {
        kvf_proxy_send_now(fd, json, strlen(json));
    }
    free(json);
    shutdown(fd, SHUT_WR);   /* the library's page fails to go out; it closes */
    kvf_proxy_metrics_request(http->params.flow->metrics, (int)code);
    kvf_info("http: refused a request with %u: %s", code, msg);
    return true;
}

void kvf_proxy_mhd_log(void *cls, const char *fmt, va_list ap)
{
    static const char prefix[] = "Error processing request (HTTP response code is ";
    struct kvf_proxy_http *http = cls;
    char line[512];

    vsnprintf(line, sizeof(line), fmt, ap);
    line[strcspn(line, "\n")] = '\0';
    if (strncmp(line, prefix, sizeof(prefix) - 1) == 0) {
        unsigned code = 0;
        const char *page = strstr(line, " ('");
        const char *page_end = strstr(line, "')).");

        if ((sscanf(line + sizeof(prefix) - 1, "%u", &code) == 1) && (page != NULL) &&
            (page_end != NULL) && (page_end > page) &&
            kvf_proxy_replace_page(http, code, page + 3, (size_t)(page_end - page - 3))) {
            return;
        }
    }
    /* clients closing early, timeouts and caps are ordinary events for a
     * server; the library's failures to start or run are not */
    if ((strstr(line, "closed by remote") != NULL) || (strstr(line, "timed out") != NULL) ||
        (strstr(line, "connection limit") != NULL) || (strstr(line, "Too many") != NULL) ||
        (strstr(line, "application error generating response") != NULL) ||
        (strstr(line, "no longer available for sending") != NULL) ||
        (strstr(line, "TLS") != NULL) || (strstr(line, "handshake") != NULL) ||
        (strncmp(line, "Failed to parse", 15) == 0) || (strstr(line, "Error processing") != NULL)) {
        /* a stream whose client left (the request logs its own outcome), a page
         * that could not follow our JSON answer, a client's malformed header,
         * a client's failed TLS handshake */
        kvf_info("http: %s", line);
    } else {
        kvf_warn("http: %s", line);
    }
}
