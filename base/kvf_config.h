/*
 * Config tables (after UCX config tables and NCCL_PARAM): one static table
 * per component lists every knob with its default (a string, parsed by the
 * same code as the environment), help text, and where it lands in the
 * component's config struct.
 *
 * Precedence: default < environment KVF_<NAME> < command-line --<name>.
 * In flag form, '_' becomes '-' and the name is lower case:
 * "XFER_TIMEOUT" <- KVF_XFER_TIMEOUT <- --xfer-timeout 5s / --xfer-timeout=5s.
 */
#ifndef KVF_CONFIG_H
#define KVF_CONFIG_H

#include "kvf_status.h"
#include "kvf_dtype.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define KVF_CONFIG_STR_MAX 256

typedef enum {
    KVF_CONFIG_TYPE_STRING,   /* char[KVF_CONFIG_STR_MAX] */
    KVF_CONFIG_TYPE_INT,      /* int */
    KVF_CONFIG_TYPE_DOUBLE,   /* double */
    KVF_CONFIG_TYPE_BOOL,     /* bool: y/n, yes/no, 1/0, true/false, on/off */
    KVF_CONFIG_TYPE_TIME,     /* int64_t milliseconds: "250ms", "2s", "1m", bare = s */
    KVF_CONFIG_TYPE_SIZE,     /* size_t bytes: "64k", "2m", "1g", bare = bytes */
} kvf_config_type_t;

enum {
    KVF_CONFIG_FLAG_HIDDEN = 1u << 0,  /* test-only; not in --print-config */
    KVF_CONFIG_FLAG_SECRET = 1u << 1,  /* a secret (API key): --print-config shows "(set)" */
    KVF_CONFIG_FLAG_NO_ENV = 1u << 2,  /* never read from KVF_<NAME> (a client tool in a shell
                                        * that exports the daemons' variables); help says so */
};

typedef struct kvf_config_field {
    const char        *name;    /* upper case, e.g. "XFER_TIMEOUT"; NULL ends the table */
    const char        *dflt;    /* default as text */
    const char        *help;
    size_t             offset;  /* offsetof(struct, field) */
    kvf_config_type_t  type;
    unsigned           flags;
} kvf_config_field_t;

/**
 * Fill @a obj from defaults, environment and argv.
 *
 * @param [in]  table   Field table, NULL-name terminated.
 * @param [in]  prog    Program name for --help.
 * @param [in]  argc, argv  Arguments after the program/subcommand name.
 *                      Every argument must be a known --flag; "--help"
 *                      prints usage and "--print-config" the effective
 *                      values, both to stdout, and set *exit_p.
 * @param [out] obj     Config struct; written field by field.
 * @param [out] exit_p  true when the caller should exit 0 (help printed).
 *
 * @return KVF_OK; KVF_ERR_INVALID_PARAM with one logged line naming the flag
 *         or variable and the bad value.
 */
kvf_status_t kvf_config_parse(const kvf_config_field_t *table, const char *prog,
                              int argc, char **argv, void *obj, bool *exit_p);

/** Parse one value of @a type from text into @a dst. */
kvf_status_t kvf_config_parse_value(kvf_config_type_t type, const char *text, void *dst);

/** Print "name = value  # help" for every visible field to @a out. */
void kvf_config_print(const kvf_config_field_t *table, const void *obj, FILE *out);

enum kvf_config_dtype_flags {
    KVF_CONFIG_DTYPE_AUTO = KVF_BIT(0),   /* "auto" is accepted and selects @a dflt */
    KVF_CONFIG_DTYPE_FP8  = KVF_BIT(1),   /* fp8 (e4m3) is accepted */
};

/**
 * The one parser of number-list flag values (--request-rate 1,2,inf,
 * --metric-percentiles 50,99): numbers separated by commas or spaces, each
 * in (@a lo, @a hi]; with @a inf_ok, "inf" and "0" are accepted and stored
 * as 0 (unbounded).
 *
 * @param [in]  flag  Flag name without dashes, for the error.
 * @param [out] vals  [max]; the first (return value) entries are set.
 * @return the count (>= 1); -1 with one logged line naming the flag and the
 *         bad entry ("bad value '1,x' for --rates: 'x' is not a number in
 *         (0, inf]"), more than @a max entries, or an empty list.
 */
int kvf_config_number_list(const char *flag, const char *text, double lo, double hi,
                           bool inf_ok, double *vals, int max);

/**
 * The one parser of dtype flag values (--kv-dtype, --ssm-dtype, ...):
 * fp32, bf16, fp16 (with their aliases, kvf_dtype_parse()), fp8 only with
 * KVF_CONFIG_DTYPE_FP8, "auto" -> @a dflt only with KVF_CONFIG_DTYPE_AUTO.
 *
 * @param [in]  flag     Flag name without dashes, for the error ("kv-dtype").
 * @param [out] dtype_p  Set on success only.
 * @return KVF_OK; KVF_ERR_INVALID_PARAM, logged as
 *         "bad value 'x' for --kv-dtype (fp32, bf16, fp16)" (", fp8" when allowed).
 */
kvf_status_t kvf_config_dtype(const char *flag, const char *text, kvf_dtype_t dflt,
                              unsigned flags, kvf_dtype_t *dtype_p);

/**
 * Warn once about every KVF_* environment variable that no table parsed so
 * far consumed (typos such as KVF_XFER_TIMOUT). Logging and test variables
 * are known.
 */
void kvf_config_warn_unused(void);

#endif
