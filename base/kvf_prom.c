/* The Prometheus text format writer (kvf_prom.h). */
#include "kvf_prom.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

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

const char *kvf_prom_num(double v, char *buf, size_t cap)
{
    char e[KVF_PROM_NUM_MAX];
    int p, exp10;

    if (isnan(v)) {
        snprintf(buf, cap, "NaN");
        return buf;
    }
    if (isinf(v)) {
        snprintf(buf, cap, (v > 0) ? "+Inf" : "-Inf");
        return buf;
    }
    if (v == 0) {
        snprintf(buf, cap, "0");
        return buf;
    }
    /* the fewest significant digits that read back as v */
    for (p = 1; p < 17; ++p) {
        snprintf(e, sizeof(e), "%.*e", p - 1, v);
        if (strtod(e, NULL) == v) {
            break;
        }
    }
    snprintf(e, sizeof(e), "%.*e", p - 1, v);
    exp10 = atoi(strchr(e, 'e') + 1);
    if ((exp10 < -4) || (exp10 >= 21)) {
        snprintf(buf, cap, "%s", e);
    } else {
        snprintf(buf, cap, "%.*f", (p - 1 - exp10 > 0) ? p - 1 - exp10 : 0, v);
    }
    return buf;
}

void kvf_prom_head(FILE *out, const char *name, const char *type, const char *help)
{
    fprintf(out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* <name><suffix>{labels} and the space before the value. */
static void kvf_prom_series(FILE *out, const char *name, const char *suffix,
                            const kvf_prom_label_t *labels, int nlabels)
{
    fputs(name, out);
    fputs(suffix, out);
    for (int i = 0; i < nlabels; ++i) {
        fputs((i == 0) ? "{" : ",", out);
        fputs(labels[i].name, out);
        fputs("=\"", out);
        kvf_prom_label_write(out, labels[i].value);
        fputc('"', out);
    }
    fputs((nlabels > 0) ? "} " : " ", out);
}

void kvf_prom_sample(FILE *out, const char *name, const kvf_prom_label_t *labels, int nlabels,
                     double v)
{
    char num[KVF_PROM_NUM_MAX];

    kvf_prom_series(out, name, "", labels, nlabels);
    fprintf(out, "%s\n", kvf_prom_num(v, num, sizeof(num)));
}

void kvf_prom_sample_u64(FILE *out, const char *name, const kvf_prom_label_t *labels,
                         int nlabels, uint64_t v)
{
    kvf_prom_series(out, name, "", labels, nlabels);
    fprintf(out, "%" PRIu64 "\n", v);
}

void kvf_prom_scalar(FILE *out, const char *name, const char *type, const char *help,
                     uint64_t v)
{
    kvf_prom_head(out, name, type, help);
    kvf_prom_sample_u64(out, name, NULL, 0, v);
}

void kvf_prom_histogram(FILE *out, const char *name, const kvf_prom_label_t *labels,
                        int nlabels, const kvf_prom_hist_t *h)
{
    kvf_prom_label_t l[KVF_PROM_MAX_LABELS];
    char num[KVF_PROM_NUM_MAX];
    uint64_t cum = 0;
    int n = (nlabels < KVF_PROM_MAX_LABELS - 1) ? nlabels : KVF_PROM_MAX_LABELS - 1;

    for (int i = 0; i < n; ++i) {
        l[i] = labels[i];
    }
    l[n].name = "le";
    for (int b = 0; b < h->num_bounds; ++b) {
        cum += h->buckets[b];
        if ((h->le_max > 0) && (h->bounds[b] > h->le_max)) {
            continue;
        }
        l[n].value = kvf_prom_num(h->bounds[b], num, sizeof(num));
        kvf_prom_series(out, name, "_bucket", l, n + 1);
        fprintf(out, "%" PRIu64 "\n", cum);
    }
    cum += h->buckets[h->num_bounds];
    l[n].value = "+Inf";
    kvf_prom_series(out, name, "_bucket", l, n + 1);
    fprintf(out, "%" PRIu64 "\n", cum);
    kvf_prom_series(out, name, "_sum", l, n);
    fprintf(out, "%s\n", kvf_prom_num(h->sum, num, sizeof(num)));
    kvf_prom_series(out, name, "_count", l, n);
    fprintf(out, "%" PRIu64 "\n", h->count);
}
