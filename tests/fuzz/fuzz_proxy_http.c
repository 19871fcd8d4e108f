/*
 * libFuzzer target: kvf-proxy's HTTP front end as a client reaches it. A
 * real proxy (deploy/proxy: libmicrohttpd, one epoll event loop, the
 * tiny hybrid model's tokenizer, no instances behind it) runs in this
 * process; each input is sent as raw bytes on a fresh TCP connection,
 * which is then half-closed, and the answer is read until it is whole (its
 * Content-Length, or a chunked body's end) or the proxy closes.
 *
 * Checked beyond "no crash, leak or UB" in the proxy's code: every answer
 * is an HTTP/1.x status line with a code in 100..599, and a JSON answer
 * with a Content-Length (to anything but HEAD, which gets headers only) has
 * that many bytes of valid JSON (the documented
 * error shape for refusals); the proxy answers within 20 s, and when it
 * closed without an answer it still serves (GET /health: 503, no instances).
 *
 * Seeds: tests/fuzz/corpus/fuzz_proxy_http (tests/fuzz/make_seeds.c).
 */
#define _GNU_SOURCE   /* strcasestr */

#include "kvf_log.h"
#include "kvf_proxy.h"
#include "kvf_time.h"

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(cond)                                                                   \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            fprintf(stderr, "fuzz_proxy_http: invariant failed: %s (line %d)\n", #cond,   \
                    __LINE__);                                                             \
            abort();                                                                       \
        }                                                                                  \
    } while (0)

#define FUZZ_ANSWER_MAX (1 << 20)
#define FUZZ_WAIT_NS    (20ull * 1000000000ull)

static kvf_proxy_h g_proxy;
static int g_port;
static char *g_answer;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    char *args[] = {
        (char *)"--port", (char *)"0",
        (char *)"--model", (char *)KVF_SOURCE_DIR "/models-trained/tiny-hybrid",
        (char *)"--model-name", (char *)"tiny",
        (char *)"--max-body", (char *)"64k",
        (char *)"--header-timeout", (char *)"2s",
        (char *)"--body-timeout", (char *)"2s",
        (char *)"--idle-timeout", (char *)"2s",
        (char *)"--max-connections", (char *)"64",
    };
    kvf_proxy_config_t cfg;
    bool exit_now = false;

    (void)argc;
    (void)argv;
    kvf_log_set_level(KVF_LOG_ERROR);
    signal(SIGPIPE, SIG_IGN);
    memset(&cfg, 0, sizeof(cfg));
    FUZZ_CHECK(kvf_config_parse(kvf_proxy_config_table, "kvf-proxy",
                                (int)(sizeof(args) / sizeof(args[0])), args, &cfg,
                                &exit_now) == KVF_OK);
    FUZZ_CHECK(kvf_proxy_create(&cfg, &g_proxy) == KVF_OK);
    g_port = kvf_proxy_port(g_proxy);
    g_answer = malloc(FUZZ_ANSWER_MAX + 1);
    FUZZ_CHECK(g_answer != NULL);
    return 0;
}

/*
 * Whether g_answer[0, got) holds a whole first answer: its headers and the
 * Content-Length bytes after them (none for HEAD), or a chunked body's last
 * chunk. The proxy keeps a kept-alive connection whose client half-closed
 * until its connection guard sees the hang-up (two 100 ms ticks); waiting
 * for that close made every input cost 200 ms (18 inputs/s), so the harness
 * closes as soon as the answer is whole.
 */
static bool fuzz_answer_whole(size_t got, bool head)
{
    const char *hdr_end, *cl;
    size_t hdr_len;

    g_answer[got] = '\0';
    hdr_end = strstr(g_answer, "\r\n\r\n");
    if (hdr_end == NULL) {
        return false;
    }
    hdr_len = (size_t)(hdr_end - g_answer) + 4;
    if (head) {
        return true;
    }
    cl = strcasestr(g_answer, "\r\nContent-Length: ");
    if ((cl != NULL) && (cl < hdr_end)) {
        return got >= hdr_len + (size_t)strtoul(cl + 18, NULL, 10);
    }
    if (strcasestr(g_answer, "\r\nTransfer-Encoding: chunked") != NULL) {
        return (got >= hdr_len + 5) && (memcmp(g_answer + got - 5, "0\r\n\r\n", 5) == 0);
    }
    return false;   /* no length: the answer ends with the connection */
}

/* Send @a len bytes on a fresh connection, half-close, read until the first answer is
 * whole or the proxy closes. @return bytes read. */
static size_t fuzz_roundtrip(const uint8_t *data, size_t len, bool head)
{
    struct sockaddr_in a;
    uint64_t deadline = kvf_time_now_ns() + FUZZ_WAIT_NS;
    size_t off = 0, got = 0;
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    FUZZ_CHECK(fd >= 0);
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)g_port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    while (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        FUZZ_CHECK(errno == EINTR);
    }
    while (off < len) {   /* the proxy may answer (and close) before reading it all */
        ssize_t n = send(fd, data + off, len - off, MSG_NOSIGNAL);
        if ((n < 0) && (errno == EINTR)) {
            continue;
        }
        if (n <= 0) {
            break;
        }
        off += (size_t)n;
    }
    /* The FIN goes after the proxy has read the bytes (an answer, or at most 1 ms): the
     * HTTP library notices a FIN that arrives with the data only at the connection
     * guard's next ticks (200 ms), which made every input cost that (18 inputs/s). */
    {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        (void)poll(&p, 1, 1);
    }
    shutdown(fd, SHUT_WR);
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        ssize_t n;
        if (kvf_time_now_ns() > deadline) {
            fprintf(stderr, "fuzz_proxy_http: no answer (or no close) within 20 s\n");
            abort();
        }
        if (poll(&p, 1, 100) <= 0) {
            continue;
        }
        n = recv(fd, g_answer + got, FUZZ_ANSWER_MAX - got, 0);
        if ((n < 0) && (errno == EINTR)) {
            continue;
        }
        if (n <= 0) {
            break;   /* closed (or reset after a refusal) */
        }
        got += (size_t)n;
        if ((got == FUZZ_ANSWER_MAX) || fuzz_answer_whole(got, head)) {
            break;
        }
    }
    close(fd);
    g_answer[got] = '\0';
    return got;
}

/*
 * The first answer in g_answer[0, len): a status line, and valid JSON when it
 * says JSON, unless it answers a HEAD request (@a head), which has headers
 * only: what follows them is the next pipelined request's answer.
 */
static int check_answer(size_t len, bool head)
{
    char *end, *hdr_end, *cl, *ct;
    long code;

    FUZZ_CHECK((len >= 12) && ((strncmp(g_answer, "HTTP/1.1 ", 9) == 0) ||
                               (strncmp(g_answer, "HTTP/1.0 ", 9) == 0)));
    code = strtol(g_answer + 9, &end, 10);
    FUZZ_CHECK((code >= 100) && (code <= 599) && (end == g_answer + 12));
    hdr_end = strstr(g_answer, "\r\n\r\n");
    if (hdr_end == NULL) {
        return (int)code;   /* cut short: the client half-closed */
    }
    *hdr_end = '\0';
    ct = strcasestr(g_answer, "\r\nContent-Type: application/json");
    cl = strcasestr(g_answer, "\r\nContent-Length: ");
    if (!head && (ct != NULL) && (cl != NULL)) {
        long n = strtol(cl + 18, NULL, 10);
        char *body = hdr_end + 4;
        if ((n > 0) && ((size_t)(body - g_answer) + (size_t)n <= len)) {
            cJSON *j = cJSON_ParseWithLength(body, (size_t)n);
            FUZZ_CHECK(j != NULL);
            cJSON_Delete(j);
        }
    }
    *hdr_end = '\r';
    return (int)code;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char health[] = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    const bool head = (size >= 5) && (memcmp(data, "HEAD ", 5) == 0);
    size_t n = fuzz_roundtrip(data, size, head);

    if (n > 0) {
        (void)check_answer(n, head);
        return 0;
    }
    /* closed without an answer (bytes that never made a request): still serving? */
    n = fuzz_roundtrip((const uint8_t *)health, sizeof(health) - 1, false);
    FUZZ_CHECK(check_answer(n, false) == 503);
    return 0;
}
