/* Jinja subset for chat templates (kvf_proxy_jinja.h). */
#include "kvf_proxy_jinja.h"

#include <stdio.h>

kvf_status_t kvf_proxy_jinja_render(const char *tmpl, const cJSON *vars, char **out_p,
                                    char *err, size_t cap)
{
    (void)tmpl;
    (void)vars;
    *out_p = NULL;
    snprintf(err, cap, "templates are not rendered yet");
    return KVF_ERR_UNSUPPORTED;
}
