/* Prometheus text format helpers (kvf_prom.h). */
#include "kvf_prom.h"

void kvf_prom_label_write(FILE *out, const char *v)
{
    for (; (v != NULL) && (*v != '\0'); ++v) {
        if ((*v == '\\') || (*v == '"')) {
            fputc('\\', out);
            fputc(*v, out);
        } else if (*v == '\n') {
            fputs("\\n", out);
        } else {
            fputc(*v, out);
        }
    }
}
