/*
 * The fields of vLLM's /v1/completions and /v1/chat/completions requests: every field is in
 * one table (kvf_proxy_fields.c), honoured or refused by name unless it holds its "off"
 * value (README's table follows it), and typed getters that refuse a bad value naming the
 * field. Absent and JSON null are the same everywhere: the default.
 *
 * Every function that can refuse takes the refusal's outputs (kvf_proxy_refuse.h):
 * @a http_p (400), @a param_p (the field's name; may be NULL) and @a err / @a cap (the
 * message), and returns KVF_ERR_INVALID_PARAM.
 */
#ifndef KVF_PROXY_FIELDS_H
#define KVF_PROXY_FIELDS_H

#include "kvf_status.h"

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>

#define KVF_F_CMPL 1u   /* a field of /v1/completions */
#define KVF_F_CHAT 2u   /* a field of /v1/chat/completions */

/** @a item is an integral, finite JSON number in [lo, hi]: true and *out set. */
bool kvf_proxy_json_int(const cJSON *item, double lo, double hi, double *out);

/**
 * Every key of @a root is a field of the endpoint @a where (KVF_F_CMPL or KVF_F_CHAT) that is
 * honoured or holds its off value. An unknown key is refused by name (param: a copy that lives
 * until this thread's next call); a refused field with its reason.
 * @return KVF_OK; KVF_ERR_INVALID_PARAM.
 */
kvf_status_t kvf_proxy_check_keys(const cJSON *root, unsigned where, int *http_p,
                                  const char **param_p, char *err, size_t cap);

/** The field @a name of @a root, or NULL when absent or null (borrowed from @a root). */
const cJSON *kvf_proxy_get(const cJSON *root, const char *name);

/**
 * A number field in [lo, hi] (finite) into *out; absent leaves *out.
 * @param range  the interval as the message prints it, e.g. "(0, 1]"
 * @return KVF_OK; KVF_ERR_INVALID_PARAM (not a number, or outside, with its value).
 */
kvf_status_t kvf_proxy_num(const cJSON *root, const char *name, double lo, double hi,
                           const char *range, float *out, int *http_p, const char **param_p,
                           char *err, size_t cap);

/**
 * An integer field in [lo, hi] into *out; absent leaves *out.
 * @return KVF_OK; KVF_ERR_INVALID_PARAM (not an integer, or outside, with its value).
 */
kvf_status_t kvf_proxy_intf(const cJSON *root, const char *name, double lo, double hi,
                            double *out, int *http_p, const char **param_p, char *err,
                            size_t cap);

/**
 * A boolean field into *out; absent leaves *out.
 * @return KVF_OK; KVF_ERR_INVALID_PARAM (not a boolean).
 */
kvf_status_t kvf_proxy_boolf(const cJSON *root, const char *name, bool *out, int *http_p,
                             const char **param_p, char *err, size_t cap);

#endif /* KVF_PROXY_FIELDS_H */
