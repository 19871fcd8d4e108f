/*
 * kvf tune: which layout serves this workload best here. For each candidate
 * layout and instance count that fits the budget (ranks: CPU threads here,
 * GPUs where present) and that the planner does not refuse, start a pool
 * with kvf-up, search for the highest request rate at which the pool meets
 * the SLO (at least --slo-percent of the requests succeed within
 * --slo-ttft-ms and --slo-tpot-ms): the rate doubles from --rate-start
 * while the SLO holds (up to --rate-max), then --search-steps bisections
 * between the last rate that held and the first that did not; --rates
 * instead runs a fixed list. Each rate offers max(--num-requests, rate x
 * --duration) requests, so a rate above capacity lasts long enough for its
 * queue to break the SLO (40 requests at 512 req/s were a 78 ms burst that
 * every layout "met"). Stop the pool, rank the candidates by that rate per
 * rank (then the rate, goodput, TTFT p50) and recommend the first with its
 * margin to the next. A candidate that cannot run is refused before any pool
 * starts: kvf pool-check (weights, sharding, dtypes) and the memory its
 * daemons allocate against MemAvailable. Writes a ranked table on stdout,
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
#include "kvf_cmds.h"
#include "kvf_geometry.h"
#include "kvf_log.h"
#include "kvf_role.h"
#include "kvf_tune_int.h"

#include <dirent.h>
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
    {"NUM_REQUESTS", "40", "measured requests per rate at least",
     KVF_TUNE_OFF(num_requests), KVF_CONFIG_TYPE_INT, 0},
    {"DURATION", "2", "seconds of arrivals per rate: a rate runs max(--num-requests, rate x "
     "this) requests, so a rate above capacity queues past the TTFT SLO (a quarter over "
     "capacity needs 4 x the SLO) instead of ending as a short burst",
     KVF_TUNE_OFF(duration_s), KVF_CONFIG_TYPE_DOUBLE, 0},
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
    {"BASE_PORT", "auto", "kvf-up --base-port of every pool (auto: a free, reserved range "
     "from 20000 up)", KVF_TUNE_OFF(base_port), KVF_CONFIG_TYPE_STRING, 0},
    {"UP_TIMEOUT", "120", "seconds kvf-up may take to bring a pool up",
     KVF_TUNE_OFF(up_timeout_s), KVF_CONFIG_TYPE_INT, 0},
    {"TOKEN_HI", "127", "synthetic prompt ids are drawn from [32, token-hi)",
     KVF_TUNE_OFF(token_hi), KVF_CONFIG_TYPE_INT, 0},
    {"JSON", "no", "print tune.json on stdout instead of the table",
     KVF_TUNE_OFF(json), KVF_CONFIG_TYPE_BOOL, 0},
    {NULL, NULL, NULL, 0, 0, 0},
};

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

/* Bytes of the *.safetensors files in the model folder of @a model. */
static double kvf_tune_weight_bytes(const char *model)
{
    char dir[PATH_MAX], path[PATH_MAX * 2];
    struct stat st;
    double sum = 0;
    DIR *d;
    struct dirent *e;

    snprintf(dir, sizeof(dir), "%s", model);
    if ((stat(model, &st) == 0) && !S_ISDIR(st.st_mode)) {
        snprintf(dir, sizeof(dir), "%s", dirname(strcpy(path, model)));
    }
    d = opendir(dir);
    while ((d != NULL) && ((e = readdir(d)) != NULL)) {
        size_t n = strlen(e->d_name);
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        if ((n > 12) && (strcmp(e->d_name + n - 12, ".safetensors") == 0) &&
            (stat(path, &st) == 0)) {
            sum += (double)st.st_size;
        }
    }
    if (d != NULL) {
        closedir(d);
    }
    return sum;
}

/* MemAvailable of /proc/meminfo in bytes (< 0: unknown). */
static double kvf_tune_mem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    double kb = -1;

    while ((f != NULL) && (fgets(line, sizeof(line), f) != NULL)) {
        if (sscanf(line, "MemAvailable: %lf kB", &kb) == 1) {
            break;
        }
    }
    if (f != NULL) {
        fclose(f);
    }
    return (kb < 0) ? -1 : kb * 1024.0;
}

/*
 * Refuse @a k before any pool starts when it cannot run: kvf pool-check (weights, sharding,
 * the daemons' dtypes) or memory: every instance loads the weights, every rank allocates
 * --num-blocks blocks x slots pages; more than MemAvailable is refused naming both.
 */
static void kvf_tune_precheck(const kvf_tune_opts_t *o, const kvf_model_config_t *cfg,
                              kvf_tune_cand_t *k)
{
    char self[PATH_MAX], lay[16], out[4096];
    kvf_cache_params_t params;
    kvf_cache_layout_t cl;
    kvf_layout_plan_t pl;
    double weights, pools, need, avail;
    int rc;

    snprintf(self, sizeof(self), "%s/kvf", o->bin);
    snprintf(lay, sizeof(lay), "%dp%dd", k->layout.prefill_tp, k->layout.decode_tp);
    {
        const char *argv[] = {self, "pool-check", "--layout", lay, "--prefill-model", o->model,
                              "--decode-model", o->model, NULL};
        rc = kvf_tune_exec(argv, out, sizeof(out));
    }
    if (rc != 0) {
        out[strcspn(out, "\n")] = '\0';
        snprintf(k->why, sizeof(k->why), "cannot run: %s", out[0] ? out : "kvf pool-check failed");
        k->runnable = false;
        return;
    }
    kvf_cache_params_default(cfg, &params);
    if ((kvf_layout_plan(cfg, &params, k->layout, 1, true, &pl) != KVF_OK) ||
        (kvf_cache_layout_build(cfg, &cl) != KVF_OK)) {
        return;   /* the pools will say */
    }
    weights = kvf_tune_weight_bytes(o->model);
    pools = atof(KVF_ENGINE_NUM_BLOCKS_DEFAULT) * cl.slots *
            ((double)k->n_prefill * k->layout.prefill_tp * (double)pl.prefill.page_size +
             (double)k->n_decode * k->layout.decode_tp * (double)pl.decode.page_size);
    need = weights * (k->n_prefill + k->n_decode) + pools;
    avail = kvf_tune_mem_available();
    if ((avail > 0) && (need > avail)) {
        snprintf(k->why, sizeof(k->why), "not enough memory: needs %.1f GiB (weights %.1f GiB x "
                 "%d instances + KV/Mamba pools %.1f GiB: %s blocks x %d slots per rank), "
                 "MemAvailable %.1f GiB", need / 1073741824.0, weights / 1073741824.0,
                 k->n_prefill + k->n_decode, pools / 1073741824.0, KVF_ENGINE_NUM_BLOCKS_DEFAULT,
                 cl.slots, avail / 1073741824.0);
        k->runnable = false;
    }
}

/* Run one rate on the pool into the next point: 1 met the SLO, 0 did not, -1 could not run. */
static int kvf_tune_point(const kvf_tune_opts_t *o, kvf_tune_cand_t *k, kvf_bs_params_t *p,
                          double rate)
{
    kvf_tune_point_t *pt = &k->pts[k->num_points];
    const kvf_bs_summary_t *s = &pt->s;

    p->request_rate = rate;
    p->num_requests = kvf_tune_requests(o, rate);
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
            k->at_ceiling = true;   /* held up to the highest rate asked for: a lower bound */
            return;
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
        const char *argv[] = {up, "--layout", lay, "--prefill-instances", np,
                              "--decode-instances", nd, "--model", o->model, "--run-dir",
                              run_dir, "--port", "0", "--bin", o->bin, "--timeout", tmo,
                              "--base-port", o->base_port, NULL};
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

/* Rank order: ran first, then the highest rate meeting the SLO per rank (what a fleet of
 * such pools serves per GPU), then that rate, goodput at the best rate, lower TTFT p50. */
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
    if (kvf_tune_per_rank(x) != kvf_tune_per_rank(y)) {
        return (kvf_tune_per_rank(x) > kvf_tune_per_rank(y)) ? -1 : 1;
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

/* The flags' ranges; 0, or -1 with one line naming the values. */
static int kvf_tune_check_opts(const kvf_tune_opts_t *o)
{
    if (!(o->rate_start > 0) || !(o->rate_max >= o->rate_start) || (o->search_steps < 0) ||
        !(o->slo_percent > 0) || (o->slo_percent > 100) || (o->max_concurrency < 0)) {
        kvf_error("kvf tune: bad value: --rate-start %g must be > 0 and <= --rate-max %g; "
                  "--search-steps %d and --max-concurrency %d >= 0; --slo-percent %g in (0, 100]",
                  o->rate_start, o->rate_max, o->search_steps, o->max_concurrency,
                  o->slo_percent);
        return -1;
    }
    if ((o->budget < 2) || (o->num_requests < 1) || (o->input_len < 1) || (o->output_len < 1) ||
        (o->warmup < 0) || (o->up_timeout_s < 1) || (o->token_hi <= 32)) {
        kvf_error("kvf tune: bad value: --budget %d must be >= 2; --num-requests %d, "
                  "--input-len %d, --output-len %d, --up-timeout %d >= 1; --warmup %d >= 0; "
                  "--token-hi %d > 32", o->budget, o->num_requests, o->input_len, o->output_len,
                  o->up_timeout_s, o->warmup, o->token_hi);
        return -1;
    }
    if (!(o->duration_s >= 0) || ((strcmp(o->base_port, "auto") != 0) &&
                                 (strspn(o->base_port, "0123456789") != strlen(o->base_port) ||
                                  (o->base_port[0] == '\0')))) {
        kvf_error("kvf tune: bad value: --duration %g must be >= 0; --base-port '%s' must be "
                  "auto or a port", o->duration_s, o->base_port);
        return -1;
    }
    return 0;
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
    if (kvf_tune_check_opts(&o) != 0) {
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
    for (int i = 0; i < n; ++i) {   /* every refusal before the first pool starts */
        if (c[i].runnable) {
            kvf_tune_precheck(&o, &cfg, &c[i]);
        }
        if (!c[i].runnable) {
            fprintf(stderr, "kvf tune: %s: %s\n", c[i].name, c[i].why);
        }
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
               (plotted == 1) ? ", " : "", (plotted == 1) ? o.out_dir : "",
               (plotted == 1) ? "/tune.png" : (plotted == 2) ? " (no plot: no candidate ran)" :
               (plotted == 0) ? " (no plot: gnuplot not found)" : " (the plot failed)");
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
