/*
 * Fault points (kvf_fault.h): a small table of armed entries, parsed from
 * KVF_FAULT at start-up.
 *
 * Design: points are an X-macro enum, so a pass is one array index and one
 * atomic increment, no string compare (ucx.post passes once per descriptor).
 * The parser is compiled into every build, so a spec is validated by the
 * same code whether or not the build has points, and a build without them
 * refuses a set KVF_FAULT instead of ignoring it. Entries are written only
 * while nothing hits points (arm at start-up); a pass reads them without a
 * lock. Rejected: a per-call-site string name (strcmp per descriptor), and
 * arming through config-table rows (a fault is not a setting an operator
 * should find in --print-config).
 */
#include "kvf_fault.h"

#include "kvf_log.h"

#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

typedef struct {
    kvf_fault_point_t  point;
    uint64_t           nth;
    bool               every;      /* "n+": every pass from nth on */
    kvf_fault_action_t action;
    long               stall_ms;
} kvf_fault_entry_t;

static const char *const kvf_fault_point_names[] = {
#define KVF_FAULT_POINT_NAME(_e, _name, _mask) _name,
    KVF_FAULT_POINTS(KVF_FAULT_POINT_NAME)
#undef KVF_FAULT_POINT_NAME
};

static const unsigned kvf_fault_point_masks[] = {
#define KVF_FAULT_POINT_MASK(_e, _name, _mask) _mask,
    KVF_FAULT_POINTS(KVF_FAULT_POINT_MASK)
#undef KVF_FAULT_POINT_MASK
};

static const char *const kvf_fault_action_names[] = {
    [KVF_FAULT_NONE] = "none",       [KVF_FAULT_DROP] = "drop",
    [KVF_FAULT_CORRUPT] = "corrupt", [KVF_FAULT_REPLAY] = "replay",
    [KVF_FAULT_KILL] = "kill",       [KVF_FAULT_STOP] = "stop",
    [KVF_FAULT_STALL] = "stall",
};
#define KVF_FAULT_NUM_ACTIONS ((int)(sizeof(kvf_fault_action_names) / sizeof(char *)))

static kvf_fault_entry_t kvf_fault_entries[KVF_FAULT_MAX_ENTRIES];
static int kvf_fault_num_entries;
static atomic_uint_fast64_t kvf_fault_pass_count[KVF_FAULT_NUM_POINTS];

static void kvf_fault_list(char *out, size_t cap, unsigned mask, bool points)
{
    size_t used = 0;
    int n = points ? KVF_FAULT_NUM_POINTS : KVF_FAULT_NUM_ACTIONS;

    out[0] = '\0';
    for (int i = 0; i < n; ++i) {
        if (!points && (((mask >> i) & 1u) == 0)) {
            continue;
        }
        used += (size_t)snprintf(out + used, (used < cap) ? cap - used : 0, "%s%s",
                                 (used > 0) ? ", " : "",
                                 points ? kvf_fault_point_names[i] : kvf_fault_action_names[i]);
    }
}

/* One "point[@n]=action" entry (tok is modified). */
static kvf_status_t kvf_fault_parse_entry(char *tok, const char *orig, kvf_fault_entry_t *e)
{
    char list[256];
    char *eq = strchr(tok, '=');
    char *at, *end;
    const char *act;
    int p, a;

    if (eq == NULL) {
        kvf_error("KVF_FAULT: entry '%s' has no '=action' (expected point[@n]=action)", orig);
        return KVF_ERR_INVALID_PARAM;
    }
    *eq = '\0';
    act = eq + 1;
    e->nth = 1;
    e->every = false;
    at = strchr(tok, '@');
    if (at != NULL) {
        unsigned long long n;
        *at = '\0';
        errno = 0;
        n = strtoull(at + 1, &end, 10);
        if ((*end == '+') && (end[1] == '\0')) {
            e->every = true;
            ++end;
        }
        if ((at[1] < '0') || (at[1] > '9') || (*end != '\0') || (errno != 0) || (n < 1) ||
            (n > 1000000000ull)) {
            kvf_error("KVF_FAULT: entry '%s': pass '%s' is not n or n+ with n in"
                      " 1..1000000000", orig, at + 1);
            return KVF_ERR_INVALID_PARAM;
        }
        e->nth = n;
    }
    for (p = 0; p < KVF_FAULT_NUM_POINTS; ++p) {
        if (strcmp(tok, kvf_fault_point_names[p]) == 0) {
            break;
        }
    }
    if (p == KVF_FAULT_NUM_POINTS) {
        kvf_fault_list(list, sizeof(list), 0, true);
        kvf_error("KVF_FAULT: entry '%s': unknown fault point '%s' (points: %s)", orig, tok,
                  list);
        return KVF_ERR_INVALID_PARAM;
    }
    e->point = (kvf_fault_point_t)p;
    e->stall_ms = 0;
    for (a = 1; a < KVF_FAULT_NUM_ACTIONS; ++a) {
        size_t len = strlen(kvf_fault_action_names[a]);
        if ((strncmp(act, kvf_fault_action_names[a], len) == 0) &&
            ((act[len] == '\0') || ((a == KVF_FAULT_STALL) && (act[len] == ':')))) {
            break;
        }
    }
    if (a == KVF_FAULT_NUM_ACTIONS) {
        kvf_error("KVF_FAULT: entry '%s': unknown action '%s' (kill, stop, stall:<ms>, drop,"
                  " corrupt, replay)", orig, act);
        return KVF_ERR_INVALID_PARAM;
    }
    if (((kvf_fault_point_masks[p] >> a) & 1u) == 0) {
        kvf_fault_list(list, sizeof(list), kvf_fault_point_masks[p], false);
        kvf_error("KVF_FAULT: entry '%s': fault point %s does not take action %s (it takes: %s)",
                  orig, kvf_fault_point_names[p], kvf_fault_action_names[a], list);
        return KVF_ERR_INVALID_PARAM;
    }
    if (a == KVF_FAULT_STALL) {
        const char *ms = act + strlen("stall");
        long v = -1;
        if (*ms == ':') {
            errno = 0;
            v = strtol(ms + 1, &end, 10);
            if ((ms[1] < '0') || (ms[1] > '9') || (*end != '\0') || (errno != 0)) {
                v = -1;
            }
        }
        if ((v < 1) || (v > KVF_FAULT_MAX_STALL_MS)) {
            kvf_error("KVF_FAULT: entry '%s': stall needs a duration, stall:<ms> with ms in"
                      " 1..%d", orig, KVF_FAULT_MAX_STALL_MS);
            return KVF_ERR_INVALID_PARAM;
        }
        e->stall_ms = v;
    }
    e->action = (kvf_fault_action_t)a;
    return KVF_OK;
}

kvf_status_t kvf_fault_arm(const char *spec)
{
    kvf_fault_entry_t parsed[KVF_FAULT_MAX_ENTRIES];
    char buf[1024];
    char *save = NULL;
    int n = 0;

    kvf_fault_disarm();
    if ((spec == NULL) || (spec[0] == '\0')) {
        return KVF_OK;
    }
    if (strlen(spec) >= sizeof(buf)) {
        kvf_error("KVF_FAULT: spec of %zu characters is longer than %zu", strlen(spec),
                  sizeof(buf) - 1);
        return KVF_ERR_INVALID_PARAM;
    }
    snprintf(buf, sizeof(buf), "%s", spec);
    if ((buf[0] == ',') || (buf[strlen(buf) - 1] == ',') || (strstr(buf, ",,") != NULL)) {
        kvf_error("KVF_FAULT: '%s' has an empty entry (expected point[@n]=action{,...})", spec);
        return KVF_ERR_INVALID_PARAM;
    }
    for (char *tok = strtok_r(buf, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
        char orig[256];
        kvf_status_t status;
        if (n == KVF_FAULT_MAX_ENTRIES) {
            kvf_error("KVF_FAULT: more than %d entries in '%s'", KVF_FAULT_MAX_ENTRIES, spec);
            return KVF_ERR_INVALID_PARAM;
        }
        snprintf(orig, sizeof(orig), "%s", tok);
        status = kvf_fault_parse_entry(tok, orig, &parsed[n]);
        if (status != KVF_OK) {
            return status;
        }
        ++n;
    }
    if (!KVF_FAULT_ENABLED) {
        kvf_error("KVF_FAULT is set ('%s') but this build has no fault points (configure with"
                  " -DKVF_FAULT_INJECTION=ON)", spec);
        return KVF_ERR_UNSUPPORTED;
    }
    memcpy(kvf_fault_entries, parsed, sizeof(parsed[0]) * (size_t)n);
    kvf_fault_num_entries = n;
    for (int i = 0; i < n; ++i) {
        kvf_warn("fault point %s armed: fires on pass %llu%s (%s)",
                 kvf_fault_point_names[parsed[i].point], (unsigned long long)parsed[i].nth,
                 parsed[i].every ? " and every later one" : "",
                 kvf_fault_action_names[parsed[i].action]);
    }
    return KVF_OK;
}

void kvf_fault_disarm(void)
{
    kvf_fault_num_entries = 0;
    for (int i = 0; i < KVF_FAULT_NUM_POINTS; ++i) {
        atomic_store(&kvf_fault_pass_count[i], 0);
    }
}

kvf_status_t kvf_fault_init(void)
{
    return kvf_fault_arm(getenv("KVF_FAULT"));
}

kvf_status_t kvf_fault_refuse_test_switches(int argc, char *const *argv)
{
    static const char *const harness[] = {"KVF_TEST_FUZZ=", "KVF_TEST_REFERENCE=",
                                          "KVF_TEST_SANITIZERS="};
    kvf_status_t status = KVF_OK;

    if (KVF_FAULT_ENABLED) {
        return KVF_OK;
    }
    for (char **e = environ; (e != NULL) && (*e != NULL); ++e) {
        bool exempt = false;
        if (strncmp(*e, "KVF_TEST_", 9) != 0) {
            continue;
        }
        for (size_t i = 0; i < sizeof(harness) / sizeof(harness[0]); ++i) {
            exempt |= (strncmp(*e, harness[i], strlen(harness[i])) == 0);
        }
        if (!exempt) {
            kvf_error("%.*s is a test-only switch; this build (without KVF_FAULT_INJECTION) "
                      "refuses it", (int)strcspn(*e, "="), *e);
            status = KVF_ERR_UNSUPPORTED;
        }
    }
    for (int i = 1; (argv != NULL) && (i < argc); ++i) {
        if ((argv[i] != NULL) && (strncmp(argv[i], "--test-", 7) == 0)) {
            kvf_error("%.*s is a test-only switch; this build (without KVF_FAULT_INJECTION) "
                      "refuses it", (int)strcspn(argv[i], "="), argv[i]);
            status = KVF_ERR_UNSUPPORTED;
        }
    }
    return status;
}

bool kvf_fault_enabled(void)
{
    return KVF_FAULT_ENABLED != 0;
}

void kvf_fault_garble(void *buf, size_t len, size_t from)
{
    uint8_t *p = buf;
    for (size_t i = from; i < len; ++i) {
        p[i] = (uint8_t)~p[i];
    }
}

#ifdef KVF_FAULT_INJECTION

uint64_t kvf_fault_passes(kvf_fault_point_t point)
{
    return atomic_load(&kvf_fault_pass_count[point]);
}

kvf_fault_action_t kvf_fault_hit(kvf_fault_point_t point)
{
    uint64_t pass = atomic_fetch_add(&kvf_fault_pass_count[point], 1) + 1;

    for (int i = 0; i < kvf_fault_num_entries; ++i) {
        const kvf_fault_entry_t *e = &kvf_fault_entries[i];
        if ((e->point != point) || (e->every ? (pass < e->nth) : (pass != e->nth))) {
            continue;
        }
        if (!e->every || (pass == e->nth)) {   /* a repeating entry logs its first firing */
            kvf_warn("fault %s fired on pass %llu (%s%s)", kvf_fault_point_names[point],
                     (unsigned long long)pass, kvf_fault_action_names[e->action],
                     e->every ? ", and on every later pass" : "");
        }
        switch (e->action) {
        case KVF_FAULT_KILL:
            raise(SIGKILL);
            return KVF_FAULT_NONE;
        case KVF_FAULT_STOP:
            raise(SIGSTOP);
            return KVF_FAULT_NONE;
        case KVF_FAULT_STALL: {
            struct timespec d = {.tv_sec = e->stall_ms / 1000,
                                 .tv_nsec = (e->stall_ms % 1000) * 1000000L};
            while ((nanosleep(&d, &d) != 0) && (errno == EINTR)) {
            }
            return KVF_FAULT_NONE;
        }
        default:
            return e->action;
        }
    }
    return KVF_FAULT_NONE;
}

#endif
