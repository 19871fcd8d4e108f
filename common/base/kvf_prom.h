/*
 * Prometheus text exposition format helpers shared by every /metrics page (kvf-proxy and
 * the daemons' own HTTP endpoint).
 */
#ifndef KVF_PROM_H
#define KVF_PROM_H

#include <stdio.h>

/**
 * Write @a v as a label value of the Prometheus text format (also a valid JSON string
 * body): backslash and double quote preceded by a backslash, newline written as "\n";
 * everything else as is. Source: Prometheus "Exposition formats", text format, label_value.
 * @param out  stream written to (not closed)
 * @param v    NUL-terminated value; NULL writes nothing
 */
void kvf_prom_label_write(FILE *out, const char *v);

#endif
