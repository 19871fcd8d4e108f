/*
 * Config table parser. Values are parsed from text whether they come from
 * the default, the environment or a flag, so a default can never drift from
 * what a user could type. Consumed variable names are remembered for
 * kvf_config_warn_unused().
 */
#include "kvf_config.h"
#include "kvf_log.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

extern char **environ;

#define KVF_CONFIG_MAX_SEEN 256

static pthread_mutex_t kvf_config_lock = PTHREAD_MUTEX_INITIALIZER;
static const char *kvf_config_seen[KVF_CONFIG_MAX_SEEN];
static int kvf_config_num_seen;

static void kvf_config_mark_seen(const char *name)
{
    pthread_mutex_lock(&kvf_config_lock);
    for (int i = 0; i < kvf_config_num_seen; ++i) {
        if (strcmp(kvf_config_seen[i], name) == 0) {
            pthread_mutex_unlock(&kvf_config_lock);
            return;
        }
    }
    if (kvf_config_num_seen < KVF_CONFIG_MAX_SEEN) {
        kvf_config_seen[kvf_config_num_seen++] = name;
    }
    pthread_mutex_unlock(&kvf_config_lock);
}

static kvf_status_t kvf_config_parse_scaled(const char *text, const char *const *suffixes,
                                            const double *scales, size_t n, double *out)
{
    char *end;
    double v;

    errno = 0;
    v = strtod(text, &end);
    if ((end == text) || (errno != 0) || (v < 0) || !isfinite(v)) {
        return KVF_ERR_INVALID_PARAM;
    }
    for (size_t i = 0; i < n; ++i) {
        if (strcasecmp(end, suffixes[i]) == 0) {
            *out = v * scales[i];
            return KVF_OK;
        }
    }
    return KVF_ERR_INVALID_PARAM;
}

kvf_status_t kvf_config_parse_value(kvf_config_type_t type, const char *text, void *dst)
{
    char *end;
    double d;

    switch (type) {
    case KVF_CONFIG_TYPE_STRING:
        if (strlen(text) >= KVF_CONFIG_STR_MAX) {
            return KVF_ERR_INVALID_PARAM;
        }
        snprintf(dst, KVF_CONFIG_STR_MAX, "%s", text);
        return KVF_OK;
    case KVF_CONFIG_TYPE_INT: {
        long v;
        errno = 0;
        v = strtol(text, &end, 0);
        if ((end == text) || (*end != '\0') || (errno != 0) || (v < -2147483647L) ||
            (v > 2147483647L)) {
            return KVF_ERR_INVALID_PARAM;
        }
        *(int *)dst = (int)v;
        return KVF_OK;
    }
    case KVF_CONFIG_TYPE_DOUBLE:
        errno = 0;
        d = strtod(text, &end);
        if ((end == text) || (*end != '\0') || (errno != 0) || !isfinite(d)) {
            return KVF_ERR_INVALID_PARAM;
        }
        *(double *)dst = d;
        return KVF_OK;
    case KVF_CONFIG_TYPE_BOOL: {
        static const char *const yes[] = {"y", "yes", "1", "true", "on"};
        static const char *const no[] = {"n", "no", "0", "false", "off"};
        for (size_t i = 0; i < 5; ++i) {
            if (strcasecmp(text, yes[i]) == 0) {
                *(bool *)dst = true;
                return KVF_OK;
            }
            if (strcasecmp(text, no[i]) == 0) {
                *(bool *)dst = false;
                return KVF_OK;
            }
        }
        return KVF_ERR_INVALID_PARAM;
    }
    case KVF_CONFIG_TYPE_TIME: {
        static const char *const sfx[] = {"", "s", "ms", "us", "m", "h"};
        static const double scale[] = {1000, 1000, 1, 0.001, 60000, 3600000};
        if (kvf_config_parse_scaled(text, sfx, scale, 6, &d) != KVF_OK) {
            return KVF_ERR_INVALID_PARAM;
        }
        *(int64_t *)dst = (int64_t)llround(d);
        return KVF_OK;
    }
    case KVF_CONFIG_TYPE_SIZE: {
        static const char *const sfx[] = {"", "b", "k", "kb", "m", "mb", "g", "gb"};
        static const double scale[] = {1, 1, 1024, 1024, 1048576, 1048576, 1073741824.0,
                                       1073741824.0};
        if (kvf_config_parse_scaled(text, sfx, scale, 8, &d) != KVF_OK) {
            return KVF_ERR_INVALID_PARAM;
        }
        *(size_t *)dst = (size_t)d;
        return KVF_OK;
    }
    }
    return KVF_ERR_INVALID_PARAM;
}

static void kvf_config_flag_name(const char *name, char *buf, size_t len)
{
    size_t i;
    for (i = 0; (name[i] != '\0') && (i + 1 < len); ++i) {
        buf[i] = (name[i] == '_') ? '-' : (char)tolower((unsigned char)name[i]);
    }
    buf[i] = '\0';
}

static const char *kvf_config_expected(kvf_config_type_t type)
{
    switch (type) {
    case KVF_CONFIG_TYPE_STRING: return "at most 255 bytes";
    case KVF_CONFIG_TYPE_INT:    return "an integer";
    case KVF_CONFIG_TYPE_DOUBLE: return "a number";
    case KVF_CONFIG_TYPE_BOOL:   return "yes or no";
    case KVF_CONFIG_TYPE_TIME:   return "a duration such as 500ms, 2s, 1m";
    case KVF_CONFIG_TYPE_SIZE:   return "a size such as 4096, 64k, 2m, 1g";
    }
    return "a valid value";
}

/* A too long string for NAME when @a table has NAME_FILE: " (--name-file takes any length)". */
static void kvf_config_file_hint(const kvf_config_field_t *table, const kvf_config_field_t *f,
                                 char *buf, size_t len)
{
    char want[96], flag[96];

    buf[0] = '\0';
    snprintf(want, sizeof(want), "%s_FILE", f->name);
    for (const kvf_config_field_t *g = table; g->name != NULL; ++g) {
        if (strcmp(g->name, want) == 0) {
            kvf_config_flag_name(g->name, flag, sizeof(flag));
            snprintf(buf, len, "; --%s takes a longer value from a file", flag);
            return;
        }
    }
}

/* @a source names where the text came from: "--tp", "KVF_TP" or "default". */
static kvf_status_t kvf_config_set(const kvf_config_field_t *table, const kvf_config_field_t *f,
                                   const char *text, const char *source, void *obj)
{
    if (kvf_config_parse_value(f->type, text, (char *)obj + f->offset) != KVF_OK) {
        char hint[160] = "";

        if (f->type == KVF_CONFIG_TYPE_STRING) {
            kvf_config_file_hint(table, f, hint, sizeof(hint));   /* 160 > 96 + 40 */
        }
        kvf_error("bad value '%.64s%s' for %s: expected %s%s", text,
                  (strlen(text) > 64) ? "..." : "", source, kvf_config_expected(f->type), hint);
        return KVF_ERR_INVALID_PARAM;
    }
    return KVF_OK;
}

static void kvf_config_format(const kvf_config_field_t *f, const void *obj, char *buf, size_t len)
{
    const char *p = (const char *)obj + f->offset;
    switch (f->type) {
    case KVF_CONFIG_TYPE_STRING: snprintf(buf, len, "%s", p); break;
    case KVF_CONFIG_TYPE_INT:    snprintf(buf, len, "%d", *(const int *)p); break;
    case KVF_CONFIG_TYPE_DOUBLE: snprintf(buf, len, "%g", *(const double *)p); break;
    case KVF_CONFIG_TYPE_BOOL:   snprintf(buf, len, "%s", *(const bool *)p ? "yes" : "no"); break;
    case KVF_CONFIG_TYPE_TIME:   snprintf(buf, len, "%" PRId64 "ms", *(const int64_t *)p); break;
    case KVF_CONFIG_TYPE_SIZE:   snprintf(buf, len, "%zu", *(const size_t *)p); break;
    }
}

void kvf_config_print(const kvf_config_field_t *table, const void *obj, FILE *out)
{
    for (const kvf_config_field_t *f = table; f->name != NULL; ++f) {
        char val[KVF_CONFIG_STR_MAX + 32];
        if (f->flags & KVF_CONFIG_FLAG_HIDDEN) {
            continue;
        }
        kvf_config_format(f, obj, val, sizeof(val));
        if ((f->flags & KVF_CONFIG_FLAG_SECRET) && (val[0] != '\0')) {
            snprintf(val, sizeof(val), "(set)");   /* the value never leaves the process */
        }
        if (f->flags & KVF_CONFIG_FLAG_NO_ENV) {   /* a flag only: print it as one */
            char flag[96];
            kvf_config_flag_name(f->name, flag, sizeof(flag));
            fprintf(out, "# %s\n--%s=%s\n", f->help, flag, val);
            continue;
        }
        fprintf(out, "# %s\nKVF_%s=%s\n", f->help, f->name, val);
    }
}

static void kvf_config_usage(const kvf_config_field_t *table, const char *prog, FILE *out)
{
    fprintf(out, "usage: %s [--flag value ...]\n\n", prog);
    for (const kvf_config_field_t *f = table; f->name != NULL; ++f) {
        char flag[96];
        if (f->flags & KVF_CONFIG_FLAG_HIDDEN) {
            continue;
        }
        kvf_config_flag_name(f->name, flag, sizeof(flag));
        if (f->flags & KVF_CONFIG_FLAG_NO_ENV) {
            fprintf(out, "  --%-22s %s (default: %s)\n", flag, f->help,
                    (f->dflt[0] != '\0') ? f->dflt : "\"\"");
            continue;
        }
        fprintf(out, "  --%-22s %s (default: %s; env KVF_%s)\n", flag, f->help,
                (f->dflt[0] != '\0') ? f->dflt : "\"\"", f->name);
    }
    fprintf(out, "  --%-22s %s\n  --%-22s %s\n", "print-config",
            "print the effective configuration and exit", "help", "print this help and exit");
}

kvf_status_t kvf_config_parse(const kvf_config_field_t *table, const char *prog,
                              int argc, char **argv, void *obj, bool *exit_p)
{
    bool print_config = false;
    kvf_status_t status;

    *exit_p = false;
    for (const kvf_config_field_t *f = table; f->name != NULL; ++f) {
        char env[128];
        const char *v;
        status = kvf_config_set(table, f, f->dflt, f->name, obj);
        if (status != KVF_OK) {
            return status;
        }
        snprintf(env, sizeof(env), "KVF_%s", f->name);
        kvf_config_mark_seen(f->name);
        v = (f->flags & KVF_CONFIG_FLAG_NO_ENV) ? NULL : getenv(env);
        if (v != NULL) {
            status = kvf_config_set(table, f, v, env, obj);
            if (status != KVF_OK) {
                return status;
            }
        }
    }

    for (int i = 0; i < argc; ++i) {
        const char *arg = argv[i];
        const char *val = NULL;
        const char *eq;
        char flag_name[100];
        size_t name_len;
        const kvf_config_field_t *f;

        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            kvf_config_usage(table, prog, stdout);
            *exit_p = true;
            return KVF_OK;
        }
        if (strcmp(arg, "--print-config") == 0) {
            print_config = true;
            continue;
        }
        if (strncmp(arg, "--", 2) != 0) {
            kvf_error("%s: unexpected argument '%s' (try --help)", prog, arg);
            return KVF_ERR_INVALID_PARAM;
        }
        arg += 2;
        eq = strchr(arg, '=');
        name_len = (eq != NULL) ? (size_t)(eq - arg) : strlen(arg);
        for (f = table; f->name != NULL; ++f) {
            char flag[96];
            kvf_config_flag_name(f->name, flag, sizeof(flag));
            if ((strlen(flag) == name_len) && (strncmp(flag, arg, name_len) == 0)) {
                break;
            }
        }
        if (f->name == NULL) {
            kvf_error("%s: unknown flag '%s' (try --help)", prog, argv[i]);
            return KVF_ERR_INVALID_PARAM;
        }
        snprintf(flag_name, sizeof(flag_name), "--%.*s", (int)name_len, arg);
        if (eq != NULL) {
            val = eq + 1;
        } else if ((f->type == KVF_CONFIG_TYPE_BOOL) &&
                   ((i + 1 >= argc) || (strncmp(argv[i + 1], "--", 2) == 0))) {
            val = "yes";   /* bare boolean flag */
        } else if (i + 1 < argc) {
            val = argv[++i];
        } else {
            kvf_error("%s: flag '%s' needs a value", prog, argv[i]);
            return KVF_ERR_INVALID_PARAM;
        }
        status = kvf_config_set(table, f, val, flag_name, obj);
        if (status != KVF_OK) {
            return status;
        }
    }
    if (print_config) {
        kvf_config_print(table, obj, stdout);
        *exit_p = true;
    }
    return KVF_OK;
}

void kvf_config_warn_unused(void)
{
    static const char *const known[] = {
        "LOG_LEVEL", "LOG_SUBSYS", "SOURCE_DIR", "BIN", "SHARED_MODELS",
        "FAULT",          /* kvf_fault.h: read by kvf_fault_init() */
        "BLAS_THREADS",   /* common/engine: threads of a TP 1 instance's kernels */
        "GPU_WEIGHTS",    /* common/runtime/kvf_model_dev.c: 16-bit matrices on a GPU */
    };
    for (char **e = environ; (e != NULL) && (*e != NULL); ++e) {
        const char *name = *e;
        size_t len;
        bool ok = false;
        if (strncmp(name, "KVF_", 4) != 0) {
            continue;
        }
        name += 4;
        len = strcspn(name, "=");
        if (strncmp(name, "TEST_", 5) == 0) {
            continue;
        }
        for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); ++i) {
            ok |= (strlen(known[i]) == len) && (strncmp(known[i], name, len) == 0);
        }
        pthread_mutex_lock(&kvf_config_lock);
        for (int i = 0; i < kvf_config_num_seen; ++i) {
            ok |= (strlen(kvf_config_seen[i]) == len) &&
                  (strncmp(kvf_config_seen[i], name, len) == 0);
        }
        pthread_mutex_unlock(&kvf_config_lock);
        if (!ok) {
            kvf_warn("environment variable KVF_%.*s is set but not used", (int)len, name);
        }
    }
}

int kvf_config_number_list(const char *flag, const char *text, double lo, double hi,
                           bool inf_ok, double *vals, int max)
{
    char buf[KVF_CONFIG_STR_MAX];
    int n = 0;

    snprintf(buf, sizeof(buf), "%s", text);
    for (char *save = NULL, *tok = strtok_r(buf, ", ", &save); tok != NULL;
         tok = strtok_r(NULL, ", ", &save)) {
        char *end;
        double v = strtod(tok, &end);

        if (inf_ok && ((strcmp(tok, "inf") == 0) || (strcmp(tok, "0") == 0))) {
            v = 0;
        } else if ((end == tok) || (*end != '\0') || !(v > lo) || (v > hi)) {
            kvf_error("bad value '%s' for --%s: '%s' is not a number in (%g, %g]%s", text,
                      flag, tok, lo, hi, inf_ok ? " or inf" : "");
            return -1;
        }
        if (n == max) {
            kvf_error("bad value '%s' for --%s: at most %d entries", text, flag, max);
            return -1;
        }
        vals[n++] = v;
    }
    if (n == 0) {
        kvf_error("bad value '%s' for --%s: empty", text, flag);
        return -1;
    }
    return n;
}

kvf_status_t kvf_config_dtype(const char *flag, const char *text, kvf_dtype_t dflt,
                              unsigned flags, kvf_dtype_t *dtype_p)
{
    bool fp8 = (flags & KVF_CONFIG_DTYPE_FP8) != 0;
    kvf_dtype_t dtype;

    if ((flags & KVF_CONFIG_DTYPE_AUTO) && (strcmp(text, "auto") == 0)) {
        *dtype_p = dflt;
        return KVF_OK;
    }
    if ((kvf_dtype_parse(text, &dtype) != 0) || (!fp8 && (dtype == KVF_DTYPE_FP8))) {
        kvf_error("bad value '%s' for --%s (fp32, bf16, fp16%s)", text, flag,
                  fp8 ? ", fp8" : "");
        return KVF_ERR_INVALID_PARAM;
    }
    *dtype_p = dtype;
    return KVF_OK;
}
