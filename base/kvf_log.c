/*
 * Logging backend. Each line is formatted into a stack buffer and written
 * with one write(2) so lines from rank threads and processes do not
 * interleave. errno is saved and restored so "%m" and callers keep working.
 */
#include "kvf_log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

int      kvf_log_level_cur   = KVF_LOG_WARN;
unsigned kvf_log_subsys_mask = ~0u;
static char kvf_log_role[96] = "kvf";

static const char *const kvf_log_level_names[] = {
    "error", "warn", "info", "debug", "trace"
};

int kvf_log_level_parse(const char *name)
{
    for (int i = 0; i <= KVF_LOG_TRACE; ++i) {
        if (strcasecmp(name, kvf_log_level_names[i]) == 0) {
            return i;
        }
    }
    return -1;
}

void kvf_log_set_level(kvf_log_level_t level)
{
    kvf_log_level_cur = (int)level;
}

static unsigned kvf_log_subsys_parse(const char *list)
{
    static const struct { const char *name; unsigned bit; } subs[] = {
        {"xfer", KVF_SUB_XFER}, {"proto", KVF_SUB_PROTO}, {"sched", KVF_SUB_SCHED},
        {"model", KVF_SUB_MODEL}, {"pool", KVF_SUB_POOL}, {"net", KVF_SUB_NET},
    };
    char buf[256];
    unsigned mask = 0;

    snprintf(buf, sizeof(buf), "%s", list);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok != NULL;
         tok = strtok_r(NULL, ",", &save)) {
        if (strcmp(tok, "all") == 0) {
            return ~0u;
        }
        for (size_t i = 0; i < sizeof(subs) / sizeof(subs[0]); ++i) {
            if (strcmp(tok, subs[i].name) == 0) {
                mask |= subs[i].bit;
            }
        }
    }
    return mask;
}

void kvf_log_set_name(const char *role, const char *name)
{
    if ((name == NULL) || (name[0] == '\0')) {
        snprintf(kvf_log_role, sizeof(kvf_log_role), "%s", role);
    } else {
        snprintf(kvf_log_role, sizeof(kvf_log_role), "%s %s", role, name);
    }
}

void kvf_log_init(const char *role)
{
    const char *lvl = getenv("KVF_LOG_LEVEL");
    const char *sub = getenv("KVF_LOG_SUBSYS");

    if (role != NULL) {
        snprintf(kvf_log_role, sizeof(kvf_log_role), "%s", role);
    }
    if ((lvl != NULL) && (*lvl != '\0')) {
        int l = kvf_log_level_parse(lvl);
        if (l < 0) {
            kvf_warn("unknown KVF_LOG_LEVEL '%s', keeping warn", lvl);
        } else {
            kvf_log_level_cur = l;
        }
    }
    if ((sub != NULL) && (*sub != '\0')) {
        kvf_log_subsys_mask = kvf_log_subsys_parse(sub);
    }
}

void kvf_log_emit(const char *file, int line, const char *func,
                  kvf_log_level_t level, unsigned subsys, const char *fmt, ...)
{
    int saved_errno = errno;
    char buf[2048];
    const char *base = strrchr(file, '/');
    va_list ap;
    int n;

    (void)func;
    (void)subsys;
    {
        struct timespec ts;
        struct tm tm;

        clock_gettime(CLOCK_REALTIME, &ts);
        gmtime_r(&ts.tv_sec, &tm);
        n = (int)strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S", &tm);
        n += snprintf(buf + n, sizeof(buf) - (size_t)n, ".%03ldZ ", ts.tv_nsec / 1000000L);
    }
    if (kvf_log_level_cur >= KVF_LOG_DEBUG) {
        n += snprintf(buf + n, sizeof(buf) - (size_t)n, "[kvf %s %d] %s %s:%d: ", kvf_log_role,
                      (int)getpid(), kvf_log_level_names[level],
                      (base != NULL) ? base + 1 : file, line);
    } else {   /* operators read these: keep them to one short line */
        n += snprintf(buf + n, sizeof(buf) - (size_t)n, "[kvf %s] %s: ", kvf_log_role,
                      kvf_log_level_names[level]);
    }
    va_start(ap, fmt);
    errno = saved_errno;  /* so %m reports the caller's errno */
    n += vsnprintf(buf + n, sizeof(buf) - (size_t)n - 1, fmt, ap);
    va_end(ap);
    if (n > (int)sizeof(buf) - 2) {
        n = (int)sizeof(buf) - 2;
    }
    buf[n++] = '\n';
    if (write(STDERR_FILENO, buf, (size_t)n) < 0) {
        /* nothing sensible to do if stderr is gone */
    }
    errno = saved_errno;
}
