/*
 * kvf bench-serve: the summary as a table, JSON and CSV.
 */
#include "kvf_bs_int.h"

#include <stdlib.h>
#include <string.h>

static const char *kvf_bs_dist_name(kvf_bs_dist_t d)
{
    return (d == KVF_BS_DIST_UNIFORM) ? "uniform" : (d == KVF_BS_DIST_NORMAL) ? "normal" : "fixed";
}

static void kvf_bs_slo_text(const kvf_bs_params_t *p, char *buf, size_t cap)
{
    int n = 0;

    buf[0] = '\0';
    if (p->slo_ttft_ms > 0) {
        n += snprintf(buf + n, cap - (size_t)n, " ttft<=%gms", p->slo_ttft_ms);
    }
    if (p->slo_tpot_ms > 0) {
        n += snprintf(buf + n, cap - (size_t)n, " tpot<=%gms", p->slo_tpot_ms);
    }
    if (p->slo_e2e_ms > 0) {
        snprintf(buf + n, cap - (size_t)n, " e2e<=%gms", p->slo_e2e_ms);
    }
}

void kvf_bs_print_table(const kvf_bs_params_t *p, const kvf_bs_summary_t *s, FILE *out)
{
    const struct {
        const char *name;
        const kvf_bs_stat_t *st;
    } rows[] = {{"ttft", &s->ttft}, {"tpot", &s->tpot}, {"itl", &s->itl}, {"e2e", &s->e2e}};
    char slo[128], rate[32];

    kvf_bs_slo_text(p, slo, sizeof(slo));
    if (p->request_rate > 0) {
        snprintf(rate, sizeof(rate), "%g req/s", p->request_rate);
    } else {
        snprintf(rate, sizeof(rate), "inf");
    }
    fprintf(out, "kvf bench-serve: http://%s:%d\n", p->host, p->port);
    if (p->dataset[0] != '\0') {
        fprintf(out, "workload            dataset %s, output %s %d\n", p->dataset,
                kvf_bs_dist_name(p->output_dist), p->output_len);
    } else {
        fprintf(out, "workload            input %s %d (spread %g), output %s %d (spread %g)\n",
                kvf_bs_dist_name(p->input_dist), p->input_len, p->input_spread,
                kvf_bs_dist_name(p->output_dist), p->output_len, p->output_spread);
    }
    fprintf(out, "arrivals            rate %s, burstiness %g, max concurrency %d, warm-up %d\n",
            rate, p->burstiness, p->max_concurrency, p->warmup);
    fprintf(out, "duration_s          %.3f\n", s->duration_s);
    fprintf(out, "requests            %d sent, %d completed, %d failed\n", s->sent, s->completed,
            s->failed);
    for (int k = 0; k < s->num_kinds; ++k) {
        fprintf(out, "  failed %-12s %d\n", s->kinds[k], s->kind_counts[k]);
    }
    fprintf(out, "tokens              %lld input, %lld output\n", s->input_tokens,
            s->output_tokens);
    fprintf(out, "request_throughput  %.3f req/s\n", s->request_throughput);
    fprintf(out, "output_throughput   %.1f tok/s\n", s->output_throughput);
    fprintf(out, "total_throughput    %.1f tok/s\n", s->total_throughput);
    fprintf(out, "goodput             %.3f req/s (%d of %d completed within%s)\n", s->goodput,
            s->good, s->completed, (slo[0] != '\0') ? slo : " no SLO given");
    if (s->transfer_share_mean >= 0) {
        fprintf(out, "transfer_share      %.1f%% of the time to the first decode token\n",
                100.0 * s->transfer_share_mean);
    }
    fprintf(out, "%-8s %10s %10s %10s %10s %8s\n", "ms", "mean", "p50", "p90", "p99", "n");
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); ++i) {
        fprintf(out, "%-8s %10.2f %10.2f %10.2f %10.2f %8d\n", rows[i].name, rows[i].st->mean,
                rows[i].st->p50, rows[i].st->p90, rows[i].st->p99, rows[i].st->n);
    }
}

static void kvf_bs_json_stat(cJSON *root, const char *name, const kvf_bs_stat_t *st)
{
    cJSON *o = cJSON_AddObjectToObject(root, name);

    cJSON_AddNumberToObject(o, "mean", st->mean);
    cJSON_AddNumberToObject(o, "p50", st->p50);
    cJSON_AddNumberToObject(o, "p90", st->p90);
    cJSON_AddNumberToObject(o, "p99", st->p99);
    cJSON_AddNumberToObject(o, "n", st->n);
}

char *kvf_bs_json(const kvf_bs_params_t *p, const kvf_bs_summary_t *s)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *w = cJSON_AddObjectToObject(root, "workload");
    cJSON *slo = cJSON_AddObjectToObject(root, "slo");
    cJSON *fails = cJSON_AddObjectToObject(root, "failures");
    char url[KVF_CONFIG_STR_MAX + 32];
    char *text;

    snprintf(url, sizeof(url), "http://%s:%d", p->host, p->port);
    cJSON_AddStringToObject(root, "url", url);
    cJSON_AddStringToObject(w, "dataset", p->dataset);
    cJSON_AddNumberToObject(w, "input_len", p->input_len);
    cJSON_AddStringToObject(w, "input_dist", kvf_bs_dist_name(p->input_dist));
    cJSON_AddNumberToObject(w, "input_spread", p->input_spread);
    cJSON_AddNumberToObject(w, "output_len", p->output_len);
    cJSON_AddStringToObject(w, "output_dist", kvf_bs_dist_name(p->output_dist));
    cJSON_AddNumberToObject(w, "output_spread", p->output_spread);
    cJSON_AddNumberToObject(w, "request_rate", p->request_rate > 0 ? p->request_rate : 0);
    cJSON_AddNumberToObject(w, "burstiness", p->burstiness);
    cJSON_AddNumberToObject(w, "max_concurrency", p->max_concurrency);
    cJSON_AddNumberToObject(w, "num_requests", p->num_requests);
    cJSON_AddNumberToObject(w, "duration_s", p->duration_s);
    cJSON_AddNumberToObject(w, "warmup", p->warmup);
    cJSON_AddNumberToObject(w, "seed", (double)p->seed);
    cJSON_AddNumberToObject(slo, "ttft_ms", p->slo_ttft_ms);
    cJSON_AddNumberToObject(slo, "tpot_ms", p->slo_tpot_ms);
    cJSON_AddNumberToObject(slo, "e2e_ms", p->slo_e2e_ms);
    cJSON_AddNumberToObject(root, "duration_s", s->duration_s);
    cJSON_AddNumberToObject(root, "sent", s->sent);
    cJSON_AddNumberToObject(root, "completed", s->completed);
    cJSON_AddNumberToObject(root, "failed", s->failed);
    for (int k = 0; k < s->num_kinds; ++k) {
        cJSON_AddNumberToObject(fails, s->kinds[k], s->kind_counts[k]);
    }
    cJSON_AddNumberToObject(root, "good", s->good);
    cJSON_AddNumberToObject(root, "input_tokens", (double)s->input_tokens);
    cJSON_AddNumberToObject(root, "output_tokens", (double)s->output_tokens);
    cJSON_AddNumberToObject(root, "request_throughput", s->request_throughput);
    cJSON_AddNumberToObject(root, "output_throughput", s->output_throughput);
    cJSON_AddNumberToObject(root, "total_throughput", s->total_throughput);
    cJSON_AddNumberToObject(root, "goodput", s->goodput);
    if (s->transfer_share_mean >= 0) {
        cJSON_AddNumberToObject(root, "transfer_share", s->transfer_share_mean);
    } else {
        cJSON_AddNullToObject(root, "transfer_share");
    }
    kvf_bs_json_stat(root, "ttft_ms", &s->ttft);
    kvf_bs_json_stat(root, "tpot_ms", &s->tpot);
    kvf_bs_json_stat(root, "itl_ms", &s->itl);
    kvf_bs_json_stat(root, "e2e_ms", &s->e2e);
    text = cJSON_Print(root);
    cJSON_Delete(root);
    return text;
}

static void kvf_bs_csv_text(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s != '\0'; ++s) {
        if (*s == '"') {
            fputc('"', f);
        }
        fputc((*s == '\n') ? ' ' : *s, f);
    }
    fputc('"', f);
}

int kvf_bs_write_csv(const kvf_bs_summary_t *s, const char *path)
{
    FILE *f = fopen(path, "w");

    if (f == NULL) {
        kvf_error("cannot write --csv %s: %m", path);
        return -1;
    }
    fprintf(f, "index,start_ms,end_ms,prompt_tokens,max_tokens,output_tokens,ok,good,error_kind,"
               "http_code,ttft_ms,tpot_ms,itl_mean_ms,e2e_ms,proxy_ttft_ms,transfer_ms,"
               "handshake_ms,kv_bytes,first_decode_token_ms,transfer_share,prefill_instance,"
               "decode_instance,error\n");
    for (int i = 0; i < s->sent; ++i) {
        const kvf_bs_result_t *r = &s->results[i];
        double itl = 0;

        for (int k = 0; k < r->num_itl; ++k) {
            itl += r->itl_ms[k];
        }
        fprintf(f, "%d,%.3f,%.3f,%d,%d,%d,%d,%d,%s,%d,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.0f,"
                   "%.3f,%.4f,", r->index, r->start_ms, r->end_ms, r->prompt_tokens,
                r->max_tokens, r->output_tokens, r->ok, r->good, r->error_kind, r->http_code,
                r->ttft_ms, r->tpot_ms, (r->num_itl > 0) ? itl / r->num_itl : 0, r->e2e_ms,
                r->proxy_ttft_ms, r->transfer_ms, r->handshake_ms, r->kv_bytes,
                r->first_decode_ms, r->transfer_share);
        kvf_bs_csv_text(f, r->prefill_instance);
        fputc(',', f);
        kvf_bs_csv_text(f, r->decode_instance);
        fputc(',', f);
        kvf_bs_csv_text(f, r->error);
        fputc('\n', f);
    }
    if (fclose(f) != 0) {
        kvf_error("cannot write --csv %s: %m", path);
        return -1;
    }
    return 0;
}
