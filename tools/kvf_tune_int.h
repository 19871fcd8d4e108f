/*
 * kvf tune's internals shared by the search (cmd_tune.c) and its outputs
 * (kvf_tune_out.c: the ranked table, tune.json, tune.csv, tune.png).
 */
#ifndef KVF_TUNE_INT_H
#define KVF_TUNE_INT_H

#include "kvf_bench_serve.h"
#include "kvf_config.h"
#include "kvf_layout.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>

#define KVF_TUNE_MAX_CAND  32
#define KVF_TUNE_MAX_RATES 16

typedef struct {
    char   model[KVF_CONFIG_STR_MAX];
    char   layouts[KVF_CONFIG_STR_MAX];
    char   instances[KVF_CONFIG_STR_MAX];
    int    budget;
    char   rates[KVF_CONFIG_STR_MAX];
    double rate_start, rate_max;
    int    search_steps;
    double slo_percent;
    int    max_concurrency;
    int    num_requests;                /* at least this many per rate */
    double duration_s;                  /* and rate x this many */
    int    input_len, output_len;
    int    warmup;
    double slo_ttft_ms, slo_tpot_ms;
    char   out_dir[KVF_CONFIG_STR_MAX];
    char   bin[KVF_CONFIG_STR_MAX];
    char   base_port[KVF_CONFIG_STR_MAX];
    int    up_timeout_s;
    int    token_hi;
    bool   json;
} kvf_tune_opts_t;

typedef struct {
    double rate;
    kvf_bs_summary_t s;
    bool   ran;
    bool   meets;                       /* --slo-percent of the requests within the SLO */
} kvf_tune_point_t;

typedef struct {
    char              name[32];         /* "4p2d" or "4p2d x1x2" */
    kvf_layout_t      layout;
    int               n_prefill, n_decode;
    int               ranks;
    kvf_verdict_t     verdict;
    char              why[PATH_MAX + 256]; /* refused / over budget / cannot run / failed */
    bool              runnable;
    bool              ran;
    int               num_points;
    kvf_tune_point_t  pts[KVF_TUNE_MAX_RATES];
    int               best;             /* index into pts: highest rate meeting the SLO */
    double            max_rate;         /* highest rate that met the SLO (0: none) */
    bool              at_ceiling;       /* max_rate is --rate-max: a lower bound */
} kvf_tune_cand_t;

/** Requests run at @a rate: max(--num-requests, ceil(rate x --duration)). */
int kvf_tune_requests(const kvf_tune_opts_t *o, double rate);

/** Rate meeting the SLO per rank of @a k (0: none). */
double kvf_tune_per_rank(const kvf_tune_cand_t *k);

/** The ranked table (candidates sorted, ran first) with the recommendation, on @a out. */
void kvf_tune_print_table(const kvf_tune_opts_t *o, const kvf_tune_cand_t *c, int n, FILE *out);

/** tune.json's tree (the caller deletes it). */
cJSON *kvf_tune_json(const kvf_tune_opts_t *o, const kvf_tune_cand_t *c, int n);

/** tune.csv, one row per candidate and rate. 0, or -1 logged. */
int kvf_tune_write_csv(const char *path, const kvf_tune_cand_t *c, int n);

/** tune.png: 1 written, 0 no gnuplot, 2 nothing to plot (no candidate ran), -1 failed. */
int kvf_tune_plot(const kvf_tune_opts_t *o, const kvf_tune_cand_t *c, int n);

#endif
