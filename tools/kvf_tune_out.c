/*
 * kvf tune's outputs: the ranked table with the recommendation, tune.json,
 * tune.csv and tune.png (goodput and SLO attainment against the offered
 * rate per layout; gnuplot's own messages are kept out of the output
 * unless it fails).
 */
#define _GNU_SOURCE
#include "kvf_log.h"
#include "kvf_tune_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int kvf_tune_requests(const kvf_tune_opts_t *o, double rate)
{
    double n = ceil(rate * o->duration_s);

    return (n > o->num_requests) ? (int)n : o->num_requests;
}

double kvf_tune_per_rank(const kvf_tune_cand_t *k)
{
    return (k->ranks > 0) ? k->max_rate / k->ranks : 0;
}

/* The closing line: the first candidate (the table's order) and its margin to the next. */
static void kvf_tune_recommend(const kvf_tune_cand_t *c, int n, FILE *out)
{
    const kvf_tune_cand_t *a = &c[0], *b = (n > 1) && c[1].ran && (c[1].max_rate > 0) ?
                                          &c[1] : NULL;

    if ((n == 0) || !a->ran || (a->max_rate == 0)) {
        fprintf(out, "recommended: none (no candidate met the SLO at any tried rate)\n");
        return;
    }
    fprintf(out, "recommended: %s, %g req/s meeting the SLO, %.2f req/s per rank", a->name,
            a->max_rate, kvf_tune_per_rank(a));
    if (b != NULL) {
        double m = 100.0 * (kvf_tune_per_rank(a) / kvf_tune_per_rank(b) - 1.0);
        fprintf(out, "; %.0f %% more per rank than %s (%.2f)%s", m, b->name,
                kvf_tune_per_rank(b),
                (m < 10) ? ": within the search's resolution, a near tie" : "");
    }
    if (a->at_ceiling) {
        fprintf(out, "; it met the SLO at --rate-max, so its rate is a lower bound: raise "
                "--rate-max");
    }
    fprintf(out, "\n");
}

void kvf_tune_print_table(const kvf_tune_opts_t *o, const kvf_tune_cand_t *c, int n, FILE *out)
{
    fprintf(out, "kvf tune: %s, %d-token prompts, %d-token outputs, SLO: %g %% of requests "
            "within ttft<=%gms tpot<=%gms, budget %d ranks\n", o->model, o->input_len,
            o->output_len, o->slo_percent, o->slo_ttft_ms, o->slo_tpot_ms, o->budget);
    fprintf(out, "requests per rate: max(%d, rate x %g s): a rate above capacity must offer "
            "long enough for its queue to pass the TTFT SLO (a quarter over capacity takes 4 x "
            "the SLO); a short burst ends before any queue forms\n", o->num_requests,
            o->duration_s);
    fprintf(out, "%-4s %-12s %5s %-10s %8s %8s %8s %9s %9s %9s %9s %9s %9s %8s  %s\n", "rank",
            "layout", "ranks", "verdict", "max_rate", "per_rank", "rate", "goodput", "tok/s",
            "ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "xfer%", "note");
    for (int i = 0; i < n; ++i) {
        const kvf_tune_cand_t *k = &c[i];
        const kvf_bs_summary_t *s;
        char share[16];

        if (!k->ran) {
            fprintf(out, "%-4s %-12s %5d %-10s %8s %8s %8s %9s %9s %9s %9s %9s %9s %8s  %s\n",
                    "-", k->name, k->ranks, kvf_verdict_str(k->verdict), "-", "-", "-", "-",
                    "-", "-", "-", "-", "-", "-", k->why[0] ? k->why : "not run");
            continue;
        }
        s = &k->pts[k->best].s;
        if (s->transfer_share_mean >= 0) {
            snprintf(share, sizeof(share), "%.1f", 100.0 * s->transfer_share_mean);
        } else {
            snprintf(share, sizeof(share), "-");
        }
        fprintf(out, "%-4d %-12s %5d %-10s %8g %8.2f %8g %9.3f %9.1f %9.1f %9.1f %9.2f %9.2f "
                "%8s  %s\n", i + 1, k->name, k->ranks, kvf_verdict_str(k->verdict),
                k->max_rate, kvf_tune_per_rank(k), k->pts[k->best].rate, s->goodput,
                s->output_throughput, s->ttft.p50, s->ttft.p99, s->tpot.p50, s->tpot.p99, share,
                (k->max_rate == 0) ? "no tried rate met the SLO" :
                k->at_ceiling ? "met the SLO at --rate-max (a lower bound)" :
                (s->failed > 0) ? "requests failed" : "");
    }
    fprintf(out, "max_rate: the highest tried rate (req/s) meeting the SLO; per_rank: max_rate "
            "over the pool's ranks (CPU threads here, GPUs on GPUs), the ranking's key; rate: "
            "the point shown (max_rate, else the highest goodput); xfer%%: handshake + posting "
            "+ wire + post-ops share of the time to the first decoded token\n");
    kvf_tune_recommend(c, n, out);
}

cJSON *kvf_tune_json(const kvf_tune_opts_t *o, const kvf_tune_cand_t *c, int n)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(root, "candidates");

    cJSON_AddStringToObject(root, "model", o->model);
    cJSON_AddNumberToObject(root, "budget", o->budget);
    cJSON_AddNumberToObject(root, "slo_ttft_ms", o->slo_ttft_ms);
    cJSON_AddNumberToObject(root, "slo_tpot_ms", o->slo_tpot_ms);
    cJSON_AddNumberToObject(root, "slo_percent", o->slo_percent);
    cJSON_AddBoolToObject(root, "searched", o->rates[0] == '\0');
    cJSON_AddNumberToObject(root, "rate_max", o->rate_max);
    cJSON_AddNumberToObject(root, "min_requests_per_rate", o->num_requests);
    cJSON_AddNumberToObject(root, "duration_s", o->duration_s);
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
            cJSON_AddNumberToObject(j, "max_rate_per_rank", kvf_tune_per_rank(k));
            cJSON_AddBoolToObject(j, "at_rate_max", k->at_ceiling);
        } else {
            cJSON_AddStringToObject(j, "why", k->why);
        }
        for (int r = 0; r < k->num_points; ++r) {
            const kvf_bs_summary_t *s = &k->pts[r].s;
            cJSON *pj = cJSON_CreateObject();
            cJSON_AddNumberToObject(pj, "rate", k->pts[r].rate);
            cJSON_AddBoolToObject(pj, "meets_slo", k->pts[r].meets);
            cJSON_AddNumberToObject(pj, "sent", s->sent);
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

int kvf_tune_write_csv(const char *path, const kvf_tune_cand_t *c, int n)
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
int kvf_tune_plot(const kvf_tune_opts_t *o, const kvf_tune_cand_t *c, int n)
{
    char dat[PATH_MAX], gp[PATH_MAX], png[PATH_MAX], gnuplot[PATH_MAX], err[512];
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
        unlink(dat);
        return 2;
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
    rc = kvf_bs_run_gnuplot(gnuplot, gp, err, sizeof(err));
    if ((rc != 0) || (access(png, R_OK) != 0)) {   /* its warnings are shown only then */
        kvf_error("gnuplot %s failed (exit %d): %s", gp, rc, err);
        return -1;
    }
    return 1;
}

