/* The refusal of a request field (kvf_proxy_refuse.h). */
#include "kvf_proxy_refuse.h"

#include <stdio.h>

kvf_status_t kvf_proxy_vrefuse(int *http_p, const char **param_p, const char *param, int http,
                               char *err, size_t cap, kvf_status_t status, const char *fmt,
                               va_list ap)
{
    if ((err != NULL) && (cap > 0)) {
        vsnprintf(err, cap, fmt, ap);
    }
    if (http_p != NULL) {
        *http_p = http;
    }
    if (param_p != NULL) {
        *param_p = param;
    }
    return status;
}

kvf_status_t kvf_proxy_refuse(int *http_p, const char **param_p, const char *param, int http,
                              char *err, size_t cap, kvf_status_t status, const char *fmt, ...)
{
    kvf_status_t ret;
    va_list ap;

    va_start(ap, fmt);
    ret = kvf_proxy_vrefuse(http_p, param_p, param, http, err, cap, status, fmt, ap);
    va_end(ap);
    return ret;
}

kvf_status_t kvf_proxy_invalid(int *http_p, const char **param_p, const char *param, char *err,
                               size_t cap, const char *fmt, ...)
{
    kvf_status_t ret;
    va_list ap;

    va_start(ap, fmt);
    ret = kvf_proxy_vrefuse(http_p, param_p, param, 400, err, cap, KVF_ERR_INVALID_PARAM, fmt,
                            ap);
    va_end(ap);
    return ret;
}
