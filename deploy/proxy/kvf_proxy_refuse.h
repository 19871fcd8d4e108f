/*
 * The refusal of a request field: one formatter for the request parsers (completions,
 * chat arguments, sampling lists, tools, messages), so every refusal carries the same three
 * things — the HTTP status, the offending field and a message — set the same way.
 *
 * Design: a va_list core (kvf_proxy_vrefuse) with two variadic fronts, the general one and
 * the 400/KVF_ERR_INVALID_PARAM one that most fields need. Rejected: a context struct
 * carrying http_p/param_p/err/cap through the parsers (every parser's signature would
 * change for no gain in what the caller sees).
 */
#ifndef KVF_PROXY_REFUSE_H
#define KVF_PROXY_REFUSE_H

#include "kvf_status.h"

#include <stdarg.h>
#include <stddef.h>

/**
 * Record a refusal and return @a status.
 *
 * @param [out] http_p   set to @a http; NULL: not recorded
 * @param [out] param_p  set to @a param (the field's name, a static string; NULL: none);
 *                       NULL: not recorded
 * @param       http     the HTTP status to answer (400, 404, 500, 503...)
 * @param [out] err      the message, @a fmt formatted with @a ap, truncated to @a cap bytes
 *                       (NUL included); @a cap 0: not written
 * @return @a status, so a parser can `return kvf_proxy_vrefuse(...)`.
 */
kvf_status_t kvf_proxy_vrefuse(int *http_p, const char **param_p, const char *param, int http,
                               char *err, size_t cap, kvf_status_t status, const char *fmt,
                               va_list ap) __attribute__((format(printf, 8, 0)));

/** kvf_proxy_vrefuse() with the message's arguments inline. */
kvf_status_t kvf_proxy_refuse(int *http_p, const char **param_p, const char *param, int http,
                              char *err, size_t cap, kvf_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 8, 9)));

/** A field with a bad value: kvf_proxy_vrefuse() with 400 and KVF_ERR_INVALID_PARAM. */
kvf_status_t kvf_proxy_invalid(int *http_p, const char **param_p, const char *param, char *err,
                               size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

#endif /* KVF_PROXY_REFUSE_H */
