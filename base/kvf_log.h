/*
 * Leveled logging with subsystem masks (after UCX log_def.h, NCCL INFO()).
 * KVF_LOG_LEVEL = error|warn|info|debug|trace (default warn);
 * KVF_LOG_SUBSYS = comma list of xfer,proto,sched,model,pool,net (default all).
 * Messages go to stderr as "<UTC time> [kvf <role> <name>] <level>: <msg>" (with
 * the pid, file and line at debug level and above).
 * The level is tested before arguments are evaluated; errno is preserved.
 */
#ifndef KVF_LOG_H
#define KVF_LOG_H

#include <stdbool.h>

typedef enum {
    KVF_LOG_ERROR = 0,
    KVF_LOG_WARN  = 1,
    KVF_LOG_INFO  = 2,
    KVF_LOG_DEBUG = 3,
    KVF_LOG_TRACE = 4,
} kvf_log_level_t;

typedef enum {
    KVF_SUB_ALL   = 0,          /* always passes the subsystem mask */
    KVF_SUB_XFER  = 1u << 0,
    KVF_SUB_PROTO = 1u << 1,
    KVF_SUB_SCHED = 1u << 2,
    KVF_SUB_MODEL = 1u << 3,
    KVF_SUB_POOL  = 1u << 4,
    KVF_SUB_NET   = 1u << 5,
} kvf_log_subsys_t;

extern int      kvf_log_level_cur;   /* read by the macro; set by kvf_log_init */
extern unsigned kvf_log_subsys_mask;

#define kvf_unlikely(_x) __builtin_expect(!!(_x), 0)
#define kvf_log_enabled(_lvl, _sub)                                           \
    (((int)(_lvl) <= kvf_log_level_cur) &&                                     \
     (((_sub) == KVF_SUB_ALL) || (kvf_log_subsys_mask & (unsigned)(_sub))))

#define kvf_log(_lvl, _sub, _fmt, ...)                                        \
    do {                                                                      \
        if (kvf_unlikely(kvf_log_enabled((_lvl), (_sub)))) {                  \
            kvf_log_emit(__FILE__, __LINE__, __func__, (_lvl), (_sub),        \
                         _fmt, ##__VA_ARGS__);                                \
        }                                                                     \
    } while (0)

#define kvf_error(_fmt, ...) kvf_log(KVF_LOG_ERROR, KVF_SUB_ALL, _fmt, ##__VA_ARGS__)
#define kvf_warn(_fmt, ...)  kvf_log(KVF_LOG_WARN,  KVF_SUB_ALL, _fmt, ##__VA_ARGS__)
#define kvf_info(_fmt, ...)  kvf_log(KVF_LOG_INFO,  KVF_SUB_ALL, _fmt, ##__VA_ARGS__)
#define kvf_debug(_fmt, ...) kvf_log(KVF_LOG_DEBUG, KVF_SUB_ALL, _fmt, ##__VA_ARGS__)
/* An info line written whatever the level: a daemon's life-cycle (ready, draining, stopped). */
#define kvf_notice(_fmt, ...)                                                 \
    kvf_log_emit(__FILE__, __LINE__, __func__, KVF_LOG_INFO, KVF_SUB_ALL, _fmt, ##__VA_ARGS__)

/**
 * Read KVF_LOG_LEVEL and KVF_LOG_SUBSYS and remember @a role ("prefill",
 * "decode", "proxy", "kvf"; copied, may be NULL) for the line prefix.
 * Safe to call more than once; unknown values warn and keep the default.
 */
void kvf_log_init(const char *role);

/**
 * Name the process in every line from now on: "<role> <name>" (an instance's
 * engine id), or just @a role when @a name is NULL or empty. Call from the
 * main thread before other threads log.
 */
void kvf_log_set_name(const char *role, const char *name);

/** Set the level directly (tests, --quiet/--verbose flags). */
void kvf_log_set_level(kvf_log_level_t level);

/** Parse "error".."trace"; returns -1 for an unknown name. */
int kvf_log_level_parse(const char *name);

/** Do not call directly; use kvf_log(). Thread-safe, one write per line. */
void kvf_log_emit(const char *file, int line, const char *func,
                  kvf_log_level_t level, unsigned subsys, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

#endif
