/*
 * kvf tune: which layout serves this workload best here. For each candidate
 * layout and instance count that fits the budget (ranks: CPU threads here,
 * GPUs where present) and that the planner does not refuse, start a pool
 * with kvf-up, search for the highest request rate at which the pool meets
 * the SLO (at least --slo-percent of the requests succeed within
 * --slo-ttft-ms and --slo-tpot-ms): the rate doubles from --rate-start
 * while the SLO holds (up to --rate-max), then --search-steps bisections
 * between the last rate that held and the first that did not; --rates
 * instead runs a fixed list. Stop the pool, rank the candidates by that
 * rate (then goodput, then TTFT p50). Writes a ranked table on stdout,
 * tune.json and tune.csv (one row per candidate and rate), and tune.png
 * (goodput against request rate per layout with the SLO line goodput =
 * slo-percent x rate, and TTFT p99 against rate with the TTFT SLO) when
 * gnuplot is installed.
 *
 * Rejected: timing each candidate in its own process tree by shelling out
 * to kvf bench-serve (the engine is linked in, so the numbers come back as
 * structs, not parsed text); running candidates side by side (they would
 * share the cores and measure each other).
 */
#define _GNU_SOURCE
#include "kvf_bench_serve.h"
#include "kvf_cmds.h"
#include "kvf_config.h"
#include "kvf_layout.h"
#include "kvf_log.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

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
    int    num_requests;
    int    input_len, output_len;
    int    warmup;
    double slo_ttft_ms, slo_tpot_ms;
    char   out_dir[KVF_CONFIG_STR_MAX];
    char   bin[KVF_CONFIG_STR_MAX];
    int    up_timeout_s;
    int    token_hi;
    bool   json;
} kvf_tune_opts_t;

#define KVF_TUNE_OFF(_f) offsetof(kvf_tune_opts_t, _f)

static const kvf_config_field_t kvf_tune_table[] = {
    {"MODEL", "", "model folder (weights and config.json) the pools serve",
     KVF_TUNE_OFF(model), KVF_CONFIG_TYPE_STRING, 0},
    {"LAYOUTS", "1p1d,2p2d,4p2d,2p4d", "candidate XpYd layouts",
     KVF_TUNE_OFF(layouts), KVF_CONFIG_TYPE_STRING, 0},
    {"INSTANCES", "1x1", "candidate instance counts PxD (prefill x decode instances), comma list",
     KVF_TUNE_OFF(instances), KVF_CONFIG_TYPE_STRING, 0},
    {"BUDGET", "8", "ranks a pool may use in all (CPU threads here, GPUs where present)",
     KVF_TUNE_OFF(budget), KVF_CONFIG_TYPE_INT, 0},
    {"RATES", "", "a fixed list of request rates to run, requests/s (Poisson); empty: search "
     "for the highest rate that meets the SLO", KVF_TUNE_OFF(rates), KVF_CONFIG_TYPE_STRING, 0},
    {"RATE_START", "8", "search: the first rate, requests/s (doubled while the SLO holds)",
     KVF_TUNE_OFF(rate_start), KVF_CONFIG_TYPE_DOUBLE, 0},
    {"RATE_MAX", "512", "search: the highest rate tried, requests/s",
     KVF_TUNE_OFF(rate_max), KVF_CONFIG_TYPE_DOUBLE, 0},
    {"SEARCH_STEPS", "3", "search: bisections between the last rate that met the SLO and the "
     "first that did not", KVF_TUNE_OFF(search_steps), KVF_CONFIG_TYPE_INT, 0},
    {"SLO_PERCENT", "90", "a rate meets the SLO when at least this share of its requests (%) "
     "succeed within every SLO", KVF_TUNE_OFF(slo_percent), KVF_CONFIG_TYPE_DOUBLE, 0},
    {"MAX_CONCURRENCY", "0", "requests in flight at most (0: unlimited, so a rate above "
     "capacity queues)", KVF_TUNE_OFF(max_concurrency), KVF_CONFIG_TYPE_INT, 0},
    {"NUM_REQUESTS", "40", "measured requests per rate",
     KVF_TUNE_OFF(num_requests), KVF_CONFIG_TYPE_INT, 0},
    {"INPUT_LEN", "64", "prompt tokens per request", KVF_TUNE_OFF(input_len),
     KVF_CONFIG_TYPE_INT, 0},
    {"OUTPUT_LEN", "16", "output tokens per request", KVF_TUNE_OFF(output_len),
     KVF_CONFIG_TYPE_INT, 0},
    {"WARMUP", "1", "warm-up requests per pool (not counted)", KVF_TUNE_OFF(warmup),
     KVF_CONFIG_TYPE_INT, 0},
    {"SLO_TTFT_MS", "300", "goodput SLO on time to first token, ms (0: none)",
     KVF_TUNE_OFF(slo_ttft_ms), KVF_CONFIG_TYPE_DOUBLE, 0},
    {"SLO_TPOT_MS", "50", "goodput SLO on time per output token, ms (0: none)",
     KVF_TUNE_OFF(slo_tpot_ms), KVF_CONFIG_TYPE_DOUBLE, 0},
    {"OUT_DIR", "kvf-tune", "folder for tune.json, tune.csv, tune.png and the pools' run dirs",
     KVF_TUNE_OFF(out_dir), KVF_CONFIG_TYPE_STRING, 0},
    {"BIN", "", "folder with kvf-up, kvf-down and the daemons (default: next to kvf)",
     KVF_TUNE_OFF(bin), KVF_CONFIG_TYPE_STRING, 0},
    {"UP_TIMEOUT", "120", "seconds kvf-up may take to bring a pool up",
     KVF_TUNE_OFF(up_timeout_s), KVF_CONFIG_TYPE_INT, 0},
    {"TOKEN_HI", "127", "synthetic prompt ids are drawn from [32, token-hi)",
     KVF_TUNE_OFF(token_hi), KVF_CONFIG_TYPE_INT, 0},
    {"JSON", "no", "print tune.json on stdout instead of the table",
     KVF_TUNE_OFF(json), KVF_CONFIG_TYPE_BOOL, 0},
    {NULL, NULL, NULL, 0, 0, 0},
};

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
    char              why[PATH_MAX + 256]; /* refused / over budget / failed to start */
    bool              runnable;
    bool              ran;
    int               num_points;
    kvf_tune_point_t  pts[KVF_TUNE_MAX_RATES];
    int               best;             /* index into pts: highest rate meeting the SLO */
    double            max_rate;         /* highest rate that met the SLO (0: none) */
} kvf_tune_cand_t;

/* Run argv, wait, capture stdout (up to cap - 1 bytes); the exit code or -1. */
static int kvf_tune_exec(const char *const argv[], char *out, size_t cap)
{
    int fds[2], status;
    size_t len = 0;
    pid_t pid;

    if (pipe(fds) != 0) {
        return -1;
    }
    fflush(stdout);   /* the child must not write our buffered output again */
    fflush(stderr);
    pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        return -1;
    }
    if (pid == 0) {
        dup2(fds[1], STDOUT_FILENO);
        close(fds[0]);
        close(fds[1]);
        execv(argv[0], (char *const *)argv);
        fprintf(stderr, "kvf tune: cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(fds[1]);
    for (;;) {
        char tmp[4096];
        ssize_t n = read(fds[0], tmp, sizeof(tmp));
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            break;
        }
        if (len + (size_t)n < cap) {
            memcpy(out + len, tmp, (size_t)n);
            len += (size_t)n;
        }
    }
    close(fds[0]);
    out[len] = '\0';
    while (waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR) {
            return -1;
        }
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void kvf_tune_default_bin(char *bin, size_t cap)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);

    if (n <= 0) {
        snprintf(bin, cap, ".");
        return;
    }
    self[n] = '\0';
    snprintf(bin, cap, "%s", dirname(self));
}

/* The candidates: every layout x instance count, with its verdict and whether it fits. */
static int kvf_tune_candidates(const kvf_tune_opts_t *o, const kvf_model_config_t *cfg,
                               kvf_tune_cand_t *c, int *n_p)
{
    kvf_cache_params_t params;
    char lbuf[KVF_CONFIG_STR_MAX], ibuf[KVF_CONFIG_STR_MAX];
    int n = 0;

    kvf_cache_params_default(cfg, &params);
    snprintf(lbuf, sizeof(lbuf), "%s", o->layouts);
    for (char *s1 = NULL, *lt = strtok_r(lbuf, ",", &s1); lt != NULL;
         lt = strtok_r(NULL, ",", &s1)) {
        kvf_layout_t layout;
        kvf_layout_plan_t pl;

        if (kvf_layout_parse(lt, &layout) != KVF_OK) {
            return -1;
        }
        if (kvf_layout_plan(cfg, &params, layout, o->input_len, true, &pl) != KVF_OK) {
            return -1;
        }
        snprintf(ibuf, sizeof(ibuf), "%s", o->instances);
        for (char *s2 = NULL, *it = strtok_r(ibuf, ",", &s2); it != NULL;
             it = strtok_r(NULL, ",", &s2)) {
            kvf_tune_cand_t *k = &c[n];
            int np, nd;
            char tail;

            if ((sscanf(it, "%dx%d%c", &np, &nd, &tail) != 2) || (np < 1) || (nd < 1)) {
                kvf_error("bad value '%s' for --instances: give PxD counts such as 1x1,1x2",
                          it);
                return -1;
            }
            if (n == KVF_TUNE_MAX_CAND) {
                kvf_error("--layouts x --instances name more than %d candidates",
                          KVF_TUNE_MAX_CAND);
                return -1;
            }
            memset(k, 0, sizeof(*k));
            k->layout = layout;
            k->n_prefill = np;
            k->n_decode = nd;
            k->ranks = np * layout.prefill_tp + nd * layout.decode_tp;
            k->verdict = pl.verdict;
            if ((np == 1) && (nd == 1)) {
                snprintf(k->name, sizeof(k->name), "%dp%dd", layout.prefill_tp,
                         layout.decode_tp);
            } else {
                snprintf(k->name, sizeof(k->name), "%dp%dd %dx%d", layout.prefill_tp,
                         layout.decode_tp, np, nd);
            }
            if (pl.verdict == KVF_VERDICT_REFUSED) {
                snprintf(k->why, sizeof(k->why), "refused: %s: %s", pl.field, pl.why);
            } else if (k->ranks > o->budget) {
                snprintf(k->why, sizeof(k->why), "over budget: %d ranks > --budget %d",
                         k->ranks, o->budget);
            } else {
                k->runnable = true;
            }
            ++n;
        }
    }
    if (n == 0) {
        kvf_error("kvf tune: --layouts '%s' names no layout", o->layouts);
        return -1;
    }
    *n_p = n;
    return 0;
}

/* Run one rate on the pool into the next point: 1 met the SLO, 0 did not, -1 could not run. */
static int kvf_tune_point(const kvf_tune_opts_t *o, kvf_tune_cand_t *k, kvf_bs_params_t *p,
                          double rate)
{
    kvf_tune_point_t *pt = &k->pts[k->num_points];
    const kvf_bs_summary_t *s = &pt->s;

    p->request_rate = rate;
    p->warmup = (k->num_points == 0) ? o->warmup : 0;
    p->seed = (uint64_t)k->num_points;
    pt->rate = rate;
    if (kvf_bs_run(p, &pt->s) != 0) {
        snprintf(k->why, sizeof(k->why), "bench-serve could not run at %g req/s", rate);
        return -1;
    }
    pt->ran = true;
    pt->meets = (s->sent > 0) && (100.0 * s->good >= o->slo_percent * s->sent);
    k->num_points++;
    k->ran = true;
    if (pt->meets && (rate > k->max_rate)) {
        k->max_rate = rate;
    }
    fprintf(stderr, "kvf tune: %s: %g req/s: %d of %d within the SLO, goodput %.2f req/s, "
            "TTFT p99 %.0f ms: %s\n", k->name, rate, s->good, s->sent, s->goodput, s->ttft.p99,
            pt->meets ? "meets the SLO" : "misses the SLO");
    return pt->meets ? 1 : 0;
}

/*
 * The search: double from --rate-start while the SLO holds (to --rate-max),
 * then bisect between the highest rate that held (0 when none) and the
 * lowest that did not, --search-steps times.
 */
static void kvf_tune_search(const kvf_tune_opts_t *o, kvf_tune_cand_t *k, kvf_bs_params_t *p)
{
    double lo = 0, hi = 0, rate = o->rate_start;
    int rc;

    while (k->num_points < KVF_TUNE_MAX_RATES) {
        rc = kvf_tune_point(o, k, p, rate);
        if (rc < 0) {
            return;
        }
        if (rc == 0) {
            hi = rate;
            break;
        }
        lo = rate;
        if (rate >= o->rate_max) {
            return;       /* held up to the highest rate asked for */
        }
        rate = (2 * rate < o->rate_max) ? 2 * rate : o->rate_max;
    }
    for (int step = 0; (step < o->search_steps) && (hi > 0) &&
                       (k->num_points < KVF_TUNE_MAX_RATES); ++step) {
        double mid = round((lo + hi) / 2.0 * 100.0) / 100.0;

        if ((mid <= lo) || (mid >= hi)) {
            break;
        }
        rc = kvf_tune_point(o, k, p, mid);
        if (rc < 0) {
            return;
        }
        *((rc > 0) ? &lo : &hi) = mid;
    }
}

static int kvf_tune_rate_cmp(const void *a, const void *b)
{
    const kvf_tune_point_t *x = a, *y = b;

    return (x->rate < y->rate) ? -1 : (x->rate > y->rate);
}

static void kvf_tune_run_cand(const kvf_tune_opts_t *o, kvf_tune_cand_t *k, const double *rates,
                              int nrates)
{
    char run_dir[PATH_MAX], np[16], nd[16], lay[16], tmo[16], up[PATH_MAX], down[PATH_MAX];
    char out[16384];
    char *url;
    kvf_bs_params_t p;
    int rc;

    snprintf(run_dir, sizeof(run_dir), "%s/run-%dp%dd-%dx%d", o->out_dir, k->layout.prefill_tp,
             k->layout.decode_tp, k->n_prefill, k->n_decode);
    snprintf(up, sizeof(up), "%s/kvf-up", o->bin);
    snprintf(down, sizeof(down), "%s/kvf-down", o->bin);
    snprintf(np, sizeof(np), "%d", k->n_prefill);
    snprintf(nd, sizeof(nd), "%d", k->n_decode);
    snprintf(lay, sizeof(lay), "%dp%dd", k->layout.prefill_tp, k->layout.decode_tp);
    snprintf(tmo, sizeof(tmo), "%d", o->up_timeout_s);
    {
        const char *argv[] = {up, "--layout", lay, "--prefill-instances", np, "--decode-instances", nd,
                        "--model", o->model, "--run-dir", run_dir, "--port", "0",
                        "--bin", o->bin, "--timeout", tmo, NULL};
        fprintf(stderr, "kvf tune: %s: starting the pool (%d ranks)\n", k->name, k->ranks);
        rc = kvf_tune_exec(argv, out, sizeof(out));
    }
    url = strrchr(out, '\n');
    while ((url != NULL) && (url > out) && (url[1] == '\0')) {   /* last non-empty line */
        *url = '\0';
        url = strrchr(out, '\n');
    }
    url = (url != NULL) ? url + 1 : out;
    kvf_bs_params_default(&p);
    if ((rc != 0) || (kvf_bs_parse_url("url", url, &p) != 0)) {
        snprintf(k->why, sizeof(k->why), "kvf-up failed (exit %d); see %s", rc, run_dir);
        goto out_down;
    }
    p.input_len = o->input_len;
    p.output_len = o->output_len;
    p.token_hi = o->token_hi;
    p.num_requests = o->num_requests;
    p.slo_ttft_ms = (o->slo_ttft_ms > 0) ? o->slo_ttft_ms : -1;   /* 0: none, as --help says */
    p.slo_tpot_ms = (o->slo_tpot_ms > 0) ? o->slo_tpot_ms : -1;
    p.timeout_s = 120;
    p.max_concurrency = o->max_concurrency;
    if (nrates > 0) {
        for (int r = 0; (r < nrates) && (kvf_tune_point(o, k, &p, rates[r]) >= 0); ++r) {
        }
    } else {
        kvf_tune_search(o, k, &p);
    }
    qsort(k->pts, (size_t)k->num_points, sizeof(k->pts[0]), kvf_tune_rate_cmp);
out_down:
    {
        const char *argv[] = {down, "--run-dir", run_dir, NULL};
        (void)kvf_tune_exec(argv, out, sizeof(out));
    }
}

/* Rank order: ran first, then the highest rate meeting the SLO, then goodput at the best rate,
 * then lower TTFT p50 there. */
static int kvf_tune_cmp(const void *a, const void *b)
{
    const kvf_tune_cand_t *x = a, *y = b;
    const kvf_bs_summary_t *sx, *sy;

    if (x->ran != y->ran) {
        return x->ran ? -1 : 1;
    }
    if (!x->ran) {
        return 0;
    }
    if (x->max_rate != y->max_rate) {
        return (x->max_rate > y->max_rate) ? -1 : 1;
    }
    sx = &x->pts[x->best].s;
    sy = &y->pts[y->best].s;
    if (sx->goodput != sy->goodput) {
        return (sx->goodput > sy->goodput) ? -1 : 1;
    }
    return (sx->ttft.p50 < sy->ttft.p50) ? -1 : (sx->ttft.p50 > sy->ttft.p50);
}

/* The best point: the highest rate that met the SLO; when none did, the highest goodput. */
static void kvf_tune_pick_best(kvf_tune_cand_t *k)
{
    k->best = 0;
    for (int r = 1; r < k->num_points; ++r) {
        const kvf_tune_point_t *pt = &k->pts[r], *bp = &k->pts[k->best];
        const kvf_bs_summary_t *s = &pt->s, *b = &bp->s;
        if ((pt->meets && !bp->meets) || (pt->meets && bp->meets && (pt->rate > bp->rate)) ||
            (!pt->meets && !bp->meets &&
             ((s->goodput > b->goodput) ||
              ((s->goodput == b->goodput) && (s->ttft.p50 < b->ttft.p50))))) {
            k->best = r;
        }
    }
}

static void kvf_tune_print_table(const kvf_tune_opts_t *o, kvf_tune_cand_t *c, int n, FILE *out)
{
    fprintf(out, "kvf tune: %s, %d-token prompts, %d-token outputs, %d requests per rate, "
            "SLO: %g %% of requests within ttft<=%gms tpot<=%gms, budget %d ranks\n", o->model,
            o->input_len, o->output_len, o->num_requests, o->slo_percent, o->slo_ttft_ms,
            o->slo_tpot_ms, o->budget);
    fprintf(out, "%-4s %-12s %5s %-10s %8s %8s %9s %9s %9s %9s %9s %9s %8s  %s\n", "rank",
            "layout", "ranks", "verdict", "max_rate", "rate", "goodput", "tok/s", "ttft_p50",
            "ttft_p99", "tpot_p50", "tpot_p99", "xfer%", "recommendation");
    for (int i = 0; i < n; ++i) {
        const kvf_tune_cand_t *k = &c[i];
        const kvf_bs_summary_t *s;
        char share[16];

        if (!k->ran) {
            fprintf(out, "%-4s %-12s %5d %-10s %8s %8s %9s %9s %9s %9s %9s %9s %8s  %s\n",
                    "-", k->name, k->ranks, kvf_verdict_str(k->verdict), "-", "-", "-", "-", "-",
                    "-", "-", "-", "-", k->why[0] ? k->why : "not run");
            continue;
        }
        s = &k->pts[k->best].s;
        if (s->transfer_share_mean >= 0) {
            snprintf(share, sizeof(share), "%.1f", 100.0 * s->transfer_share_mean);
        } else {
            snprintf(share, sizeof(share), "-");
        }
        fprintf(out, "%-4d %-12s %5d %-10s %8g %8g %9.3f %9.1f %9.1f %9.1f %9.2f %9.2f %8s  "
                "%s\n", i + 1, k->name, k->ranks, kvf_verdict_str(k->verdict), k->max_rate,
                k->pts[k->best].rate, s->goodput, s->output_throughput, s->ttft.p50, s->ttft.p99,
                s->tpot.p50, s->tpot.p99, share,
                (k->max_rate == 0) ? "no tried rate met the SLO" :
                (i == 0) ? "recommended: highest rate meeting the SLO" :
                (s->failed > 0) ? "requests failed" : "");
    }
    fprintf(out, "max_rate: the highest tried rate (req/s) meeting the SLO; rate: the point "
            "shown (max_rate, else the highest goodput); xfer%%: handshake + posting + wire + "
            "post-ops share of the time to the first decoded token\n");
}

static cJSON *kvf_tune_json(const kvf_tune_opts_t *o, const kvf_tune_cand_t *c, int n)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(root, "candidates");

    cJSON_AddStringToObject(root, "model", o->model);
    cJSON_AddNumberToObject(root, "budget", o->budget);
    cJSON_AddNumberToObject(root, "slo_ttft_ms", o->slo_ttft_ms);
    cJSON_AddNumberToObject(root, "slo_tpot_ms", o->slo_tpot_ms);
    cJSON_AddNumberToObject(root, "slo_percent", o->slo_percent);
    cJSON_AddBoolToObject(root, "searched", o->rates[0] == '\0');
    for (int i = 0; i < n; ++i) {
        const kvf_tune_cand_t *k = &c[i];
        cJSON *j = cJSON_CreateObject();
        cJSON *pts = cJSON_AddArrayToObject(j, "points");

        cJSON_AddStringToObject(j, "name", k->name);
        cJSON_AddNumberToObject(j, "prefill_tp", k->layout.prefill_tp);
        cJSON_AddNumberToObject(j, "decode_tp", k->layout.decode_tp);
        cJSON_AddNumberToObject(j, "prefill_instances", k->n_prefill);
        cJSON_AddNumberToObject(j, "decode_instances", k->n_decode);
        cJSON_AddNumberToObject(j, "ranks", k->ranks);
        cJSON_AddStringToObject(j, "verdict", kvf_verdict_str(k->verdict));
        cJSON_AddBoolToObject(j, "ran", k->ran);
        if (k->ran) {
            cJSON_AddNumberToObject(j, "rank", i + 1);
            cJSON_AddNumberToObject(j, "best_rate", k->pts[k->best].rate);
            cJSON_AddNumberToObject(j, "max_rate_meeting_slo", k->max_rate);
        } else {
            cJSON_AddStringToObject(j, "why", k->why);
        }
        for (int r = 0; r < k->num_points; ++r) {
            const kvf_bs_summary_t *s = &k->pts[r].s;
            cJSON *pj = cJSON_CreateObject();
            cJSON_AddNumberToObject(pj, "rate", k->pts[r].rate);
            cJSON_AddBoolToObject(pj, "meets_slo", k->pts[r].meets);
            cJSON_AddNumberToObject(pj, "good", s->good);
            cJSON_AddNumberToObject(pj, "completed", s->completed);
            cJSON_AddNumberToObject(pj, "failed", s->failed);
            cJSON_AddNumberToObject(pj, "goodput", s->goodput);
            cJSON_AddNumberToObject(pj, "request_throughput", s->request_throughput);
            cJSON_AddNumberToObject(pj, "output_throughput", s->output_throughput);
            cJSON_AddNumberToObject(pj, "ttft_p50_ms", s->ttft.p50);
            cJSON_AddNumberToObject(pj, "ttft_p99_ms", s->ttft.p99);
            cJSON_AddNumberToObject(pj, "tpot_p50_ms", s->tpot.p50);
            cJSON_AddNumberToObject(pj, "tpot_p99_ms", s->tpot.p99);
            cJSON_AddNumberToObject(pj, "e2e_p50_ms", s->e2e.p50);
            cJSON_AddNumberToObject(pj, "transfer_share", s->transfer_share_mean);
            cJSON_AddItemToArray(pts, pj);
        }
        cJSON_AddItemToArray(arr, j);
    }
    return root;
}

static int kvf_tune_write_csv(const char *path, const kvf_tune_cand_t *c, int n)
{
    FILE *f = fopen(path, "w");

    if (f == NULL) {
        kvf_error("cannot write %s: %m", path);
        return -1;
    }
    fprintf(f, "candidate,ranks,verdict,rate,completed,failed,goodput,output_throughput,"
               "ttft_p50_ms,ttft_p99_ms,tpot_p50_ms,tpot_p99_ms,e2e_p50_ms,transfer_share,"
               "meets_slo\n");
    for (int i = 0; i < n; ++i) {
        for (int r = 0; r < c[i].num_points; ++r) {
            const kvf_bs_summary_t *s = &c[i].pts[r].s;
            fprintf(f, "%s,%d,%s,%g,%d,%d,%.4f,%.2f,%.3f,%.3f,%.3f,%.3f,%.3f,%.4f,%d\n",
                    c[i].name, c[i].ranks, kvf_verdict_str(c[i].verdict), c[i].pts[r].rate,
                    s->completed, s->failed, s->goodput, s->output_throughput, s->ttft.p50,
                    s->ttft.p99, s->tpot.p50, s->tpot.p99, s->e2e.p50, s->transfer_share_mean,
                    c[i].pts[r].meets);
        }
    }
    return (fclose(f) == 0) ? 0 : -1;
}

/* tune.png through gnuplot: 1 written, 0 skipped (no gnuplot), -1 failed. */
static int kvf_tune_plot(const kvf_tune_opts_t *o, const kvf_tune_cand_t *c, int n)
{
    char dat[PATH_MAX], gp[PATH_MAX], png[PATH_MAX], gnuplot[PATH_MAX], out[4096];
    double top = 0;
    FILE *f;
    int series = 0, rc;

    if (!kvf_bs_find_gnuplot(gnuplot, sizeof(gnuplot))) {
        fprintf(stderr, "kvf tune: plot skipped: gnuplot not found (apt-get install "
                "gnuplot-nox)\n");
        return 0;
    }
    snprintf(dat, sizeof(dat), "%s/tune.dat", o->out_dir);
    snprintf(gp, sizeof(gp), "%s/tune.gp", o->out_dir);
    snprintf(png, sizeof(png), "%s/tune.png", o->out_dir);
    f = fopen(dat, "w");
    if (f == NULL) {
        kvf_error("cannot write %s: %m", dat);
        return -1;
    }
    for (int i = 0; i < n; ++i) {
        if (!c[i].ran) {
            continue;
        }
        fprintf(f, "# %s\n", c[i].name);
        for (int r = 0; r < c[i].num_points; ++r) {
            const kvf_bs_summary_t *s = &c[i].pts[r].s;
            fprintf(f, "%g %.4f %.3f %d\n", c[i].pts[r].rate, s->goodput,
                    (s->sent > 0) ? 100.0 * s->good / s->sent : 0.0, c[i].pts[r].meets ? 7 : 6);
            top = (c[i].pts[r].rate > top) ? c[i].pts[r].rate : top;
        }
        fprintf(f, "\n\n");
        series++;
    }
    fclose(f);
    if (series == 0) {
        return 0;
    }
    f = fopen(gp, "w");
    if (f == NULL) {
        kvf_error("cannot write %s: %m", gp);
        return -1;
    }
    fprintf(f, "set terminal png size 1100,480\nset output '%s'\nset multiplot layout 1,2 title "
               "'kvf tune: %d-token prompts, %d-token outputs, %d requests per rate; SLO: %g %% "
               "within ttft<=%gms tpot<=%gms (filled: met)'\nset grid\nset xlabel 'request rate (req/s)'\n"
               "set key top left\nset xrange [0:%g]\nset yrange [0:*]\n", png, o->input_len,
            o->output_len, o->num_requests, o->slo_percent, o->slo_ttft_ms, o->slo_tpot_ms,
            top * 1.05);
    for (int panel = 0; panel < 2; ++panel) {
        int idx = 0;
        fprintf(f, "set key %s\n", panel ? "bottom left" : "top left");
        fprintf(f, "set ylabel '%s'\nset title '%s'\nset yrange [0:%s]\nplot ",
                panel ? "requests within the SLO (%)" : "goodput (req/s)",
                panel ? "SLO attainment" : "goodput: requests within the SLO per second",
                panel ? "105" : "*");
        if (panel == 0) {
            fprintf(f, "%g * x with lines lw 2 dt 2 lc rgb 'red' title '%g %% of the offered "
                       "rate', ", o->slo_percent / 100.0, o->slo_percent);
        } else {
            fprintf(f, "%g with lines lw 2 dt 2 lc rgb 'red' title 'SLO: %g %% of requests', ",
                    o->slo_percent, o->slo_percent);
        }
        for (int i = 0; i < n; ++i) {
            if (!c[i].ran) {
                continue;
            }
            fprintf(f, "%s'%s' index %d using 1:%d:4 with linespoints lw 2 pt variable ps 1.5 "
                    "title '%s'", idx ? ", " : "", dat, idx, panel ? 3 : 2, c[i].name);
            idx++;
        }
        fprintf(f, "\n");
    }
    fprintf(f, "unset multiplot\n");
    fclose(f);
    {
        const char *argv[] = {gnuplot, gp, NULL};
        rc = kvf_tune_exec(argv, out, sizeof(out));
    }
    if ((rc != 0) || (access(png, R_OK) != 0)) {
        kvf_error("gnuplot %s failed (exit %d)", gp, rc);
        return -1;
    }
    return 1;
}

int kvf_cmd_tune(int argc, char **argv)
{
    kvf_tune_opts_t o;
    kvf_model_config_t cfg;
    kvf_tune_cand_t *c;
    double rates[KVF_TUNE_MAX_RATES];
    int nrates, n = 0, rc = 0, plotted;
    bool done;
    char path[PATH_MAX];
    cJSON *j;
    char *text;

    memset(&o, 0, sizeof(o));
    if (kvf_config_parse(kvf_tune_table, "kvf tune", argc, argv, &o, &done) != KVF_OK) {
        return 2;
    }
    if (done) {
        return 0;
    }
    if (o.model[0] == '\0') {
        kvf_error("kvf tune: --model is required (a model folder the daemons can load)");
        return 2;
    }
    if (!(o.rate_start > 0) || !(o.rate_max >= o.rate_start) || (o.search_steps < 0) ||
        !(o.slo_percent > 0) || (o.slo_percent > 100) || (o.max_concurrency < 0)) {
        kvf_error("kvf tune: bad value: --rate-start %g must be > 0 and <= --rate-max %g; "
                  "--search-steps %d and --max-concurrency %d >= 0; --slo-percent %g in (0, 100]",
                  o.rate_start, o.rate_max, o.search_steps, o.max_concurrency, o.slo_percent);
        return 2;
    }
    if ((o.budget < 2) || (o.num_requests < 1) || (o.input_len < 1) || (o.output_len < 1) ||
        (o.warmup < 0) || (o.up_timeout_s < 1) || (o.token_hi <= 32)) {
        kvf_error("kvf tune: bad value: --budget %d must be >= 2; --num-requests %d, "
                  "--input-len %d, --output-len %d, --up-timeout %d >= 1; --warmup %d >= 0; "
                  "--token-hi %d > 32", o.budget, o.num_requests, o.input_len, o.output_len,
                  o.up_timeout_s, o.warmup, o.token_hi);
        return 2;
    }
    nrates = (o.rates[0] != '\0') ?
             kvf_config_number_list("rates", o.rates, 0, INFINITY, false, rates,
                                    KVF_TUNE_MAX_RATES) : 0;
    if (nrates < 0) {
        return 2;
    }
    if (o.bin[0] == '\0') {
        kvf_tune_default_bin(o.bin, sizeof(o.bin));
    }
    if (kvf_model_config_load(o.model, &cfg) != KVF_OK) {
        return 1;
    }
    if ((mkdir(o.out_dir, 0755) != 0) && (errno != EEXIST)) {
        kvf_error("cannot create --out-dir %s: %m", o.out_dir);
        return 1;
    }
    c = calloc(KVF_TUNE_MAX_CAND, sizeof(*c));
    if (c == NULL) {
        return 1;
    }
    if (kvf_tune_candidates(&o, &cfg, c, &n) != 0) {
        free(c);
        return 2;
    }
    for (int i = 0; i < n; ++i) {
        if (c[i].runnable) {
            kvf_tune_run_cand(&o, &c[i], rates, nrates);
            kvf_tune_pick_best(&c[i]);
        }
    }
    qsort(c, (size_t)n, sizeof(*c), kvf_tune_cmp);

    j = kvf_tune_json(&o, c, n);
    text = cJSON_Print(j);
    cJSON_Delete(j);
    snprintf(path, sizeof(path), "%s/tune.json", o.out_dir);
    {
        FILE *f = fopen(path, "w");
        if ((f == NULL) || (fprintf(f, "%s\n", text) < 0) || (fclose(f) != 0)) {
            kvf_error("cannot write %s: %m", path);
            rc = 1;
        }
    }
    snprintf(path, sizeof(path), "%s/tune.csv", o.out_dir);
    if (kvf_tune_write_csv(path, c, n) != 0) {
        rc = 1;
    }
    plotted = kvf_tune_plot(&o, c, n);
    if (plotted < 0) {
        rc = 1;
    }
    if (o.json) {
        printf("%s\n", text);
    } else {
        kvf_tune_print_table(&o, c, n, stdout);
        printf("wrote %s/tune.json, %s/tune.csv%s%s%s\n", o.out_dir, o.out_dir,
               (plotted > 0) ? ", " : "", (plotted > 0) ? o.out_dir : "",
               (plotted > 0) ? "/tune.png" : " (no plot: gnuplot not found)");
    }
    free(text);
    if ((n > 0) && !c[0].ran) {
        kvf_error("kvf tune: no candidate ran (see the table)");
        rc = 1;
    }
    for (int i = 0; i < n; ++i) {
        for (int r = 0; r < c[i].num_points; ++r) {
            kvf_bs_summary_cleanup(&c[i].pts[r].s);
        }
    }
    free(c);
    return rc;
}
