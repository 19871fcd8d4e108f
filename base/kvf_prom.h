/*
 * The Prometheus text exposition format, written once for every /metrics page (kvf-proxy's
 * and the daemons' own HTTP endpoint): the HELP/TYPE head, one sample, one histogram, label
 * values and numbers. Source: Prometheus "Exposition formats", text format.
 *
 * Numbers are written as Prometheus' Go client writes them: the shortest decimal that reads
 * back as the same double, without an exponent for 1e-4 <= |v| < 1e21 ("0.005", "65536",
 * "4294967296"), "+Inf", "-Inf", "NaN"; counts as integers.
 *
 * Design: plain functions over a FILE * (the pages are open_memstream buffers) and label
 * arrays built on the caller's stack. Rejected: a registry of metric objects (each page
 * already snapshots its own state under its own lock; a registry would be a second copy).
 */
#ifndef KVF_PROM_H
#define KVF_PROM_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/** One label of a sample: name (a valid label name, written as is) and value (escaped). */
typedef struct kvf_prom_label {
    const char *name;
    const char *value;   /* NULL: written as "" */
} kvf_prom_label_t;

/** Most labels of one sample, the histogram's le included. */
#define KVF_PROM_MAX_LABELS 15

/** Room kvf_prom_num() needs. */
#define KVF_PROM_NUM_MAX 40

/**
 * Write @a v as a label value of the Prometheus text format (also a valid JSON string
 * body): backslash and double quote preceded by a backslash, newline written as "\n";
 * everything else as is. Source: Prometheus "Exposition formats", text format, label_value.
 * @param out  stream written to (not closed)
 * @param v    NUL-terminated value; NULL writes nothing
 */
void kvf_prom_label_write(FILE *out, const char *v);

/**
 * @a v as the text format writes a number (see above) into @a buf (@a cap >=
 * KVF_PROM_NUM_MAX; shorter is truncated).
 * @return @a buf.
 */
const char *kvf_prom_num(double v, char *buf, size_t cap);

/** "# HELP <name> <help>\n# TYPE <name> <type>\n"; @a type: counter, gauge or histogram. */
void kvf_prom_head(FILE *out, const char *name, const char *type, const char *help);

/**
 * One sample line: <name>{<l1>="<v1>",...} <v>. @a nlabels 0 (labels may be NULL): no
 * braces; at most KVF_PROM_MAX_LABELS.
 */
void kvf_prom_sample(FILE *out, const char *name, const kvf_prom_label_t *labels, int nlabels,
                     double v);

/** kvf_prom_sample() of a count, written exactly (no double rounding above 2^53). */
void kvf_prom_sample_u64(FILE *out, const char *name, const kvf_prom_label_t *labels,
                         int nlabels, uint64_t v);

/** A family of one unlabelled count: kvf_prom_head() and kvf_prom_sample_u64(). */
void kvf_prom_scalar(FILE *out, const char *name, const char *type, const char *help,
                     uint64_t v);

/** One histogram series' data. */
typedef struct kvf_prom_hist {
    const double   *bounds;      /* [num_bounds] ascending upper bounds */
    int             num_bounds;
    const uint64_t *buckets;     /* [num_bounds + 1] per-bucket counts, the last above all */
    double          sum;
    uint64_t        count;
    double          le_max;      /* > 0: bounds above it are not written (their counts reach
                                  * +Inf only, as vLLM's token buckets stop at
                                  * max_model_len); 0: every bound */
} kvf_prom_hist_t;

/**
 * The samples of one histogram series (the head is the caller's, once per family):
 * <name>_bucket{labels,le="b"} with the cumulative count of each bound, le="+Inf" with all,
 * <name>_sum{labels} and <name>_count{labels}. @a nlabels < KVF_PROM_MAX_LABELS.
 */
void kvf_prom_histogram(FILE *out, const char *name, const kvf_prom_label_t *labels,
                        int nlabels, const kvf_prom_hist_t *h);

#endif
