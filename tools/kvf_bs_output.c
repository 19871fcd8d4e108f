/*
 * kvf bench-serve: the summary as a table, JSON and CSV.
 */
#include "kvf_bs_int.h"

#include <stddef.h>
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

/* mean_/median_/std_/pNN_<name>_ms as vLLM names them (p99.9 keeps its point). */
static void kvf_bs_json_stat(cJSON *root, const kvf_bs_params_t *p, const char *name,
                             const kvf_bs_stat_t *st)
{
    char key[64];

    snprintf(key, sizeof(key), "mean_%s_ms", name);
    cJSON_AddNumberToObject(root, key, st->mean);
    snprintf(key, sizeof(key), "median_%s_ms", name);
    cJSON_AddNumberToObject(root, key, kvf_bs_percentile(st, 50));
    snprintf(key, sizeof(key), "std_%s_ms", name);
    cJSON_AddNumberToObject(root, key, st->std);
    for (int i = 0; i < p->num_pct; ++i) {
        snprintf(key, sizeof(key), "p%g_%s_ms", p->pct[i], name);
        cJSON_AddNumberToObject(root, key, kvf_bs_percentile(st, p->pct[i]));
    }
}

/* --save-detailed: one entry per sent request, as vLLM's lists (times in seconds). */
static void kvf_bs_json_detail(cJSON *root, const kvf_bs_summary_t *s)
{
    cJSON *in = cJSON_AddArrayToObject(root, "input_lens");
    cJSON *out = cJSON_AddArrayToObject(root, "output_lens");
    cJSON *ttfts = cJSON_AddArrayToObject(root, "ttfts");
    cJSON *itls = cJSON_AddArrayToObject(root, "itls");
    cJSON *errs = cJSON_AddArrayToObject(root, "errors");

    for (int i = 0; i < s->sent; ++i) {
        const kvf_bs_result_t *r = &s->results[i];
        cJSON *gaps = cJSON_CreateArray();
        char err[sizeof(r->error) + sizeof(r->error_kind) + 4] = "";

        cJSON_AddItemToArray(in, cJSON_CreateNumber(r->prompt_tokens));
        cJSON_AddItemToArray(out, cJSON_CreateNumber(r->ok ? r->output_tokens : 0));
        cJSON_AddItemToArray(ttfts, cJSON_CreateNumber(r->ok ? r->ttft_ms / 1000.0 : 0));
        for (int k = 0; r->ok && (k < r->num_itl); ++k) {
            cJSON_AddItemToArray(gaps, cJSON_CreateNumber(r->itl_ms[k] / 1000.0));
        }
        cJSON_AddItemToArray(itls, gaps);
        if (!r->ok) {
            snprintf(err, sizeof(err), "%s: %s", r->error_kind, r->error);
        }
        cJSON_AddItemToArray(errs, cJSON_CreateString(err));
    }
}

cJSON *kvf_bs_json_obj(const kvf_bs_params_t *p, const kvf_bs_summary_t *s, const char *date,
                       const char *backend)
{
    static const struct {
        unsigned bit;
        const char *name;
        size_t off;
    } metrics[] = {
        {KVF_BS_M_TTFT, "ttft", offsetof(kvf_bs_summary_t, ttft)},
        {KVF_BS_M_TPOT, "tpot", offsetof(kvf_bs_summary_t, tpot)},
        {KVF_BS_M_ITL, "itl", offsetof(kvf_bs_summary_t, itl)},
        {KVF_BS_M_E2EL, "e2el", offsetof(kvf_bs_summary_t, e2e)},
    };
    bool slo = (p->slo_ttft_ms > 0) || (p->slo_tpot_ms > 0) || (p->slo_e2e_ms > 0);
    cJSON *root = cJSON_CreateObject();
    cJSON *fails, *g;
    char url[KVF_CONFIG_STR_MAX + 32];

    if (date != NULL) {
        cJSON_AddStringToObject(root, "date", date);
    }
    cJSON_AddStringToObject(root, "backend", (backend != NULL) ? backend : "openai");
    cJSON_AddStringToObject(root, "model_id", p->model);
    cJSON_AddStringToObject(root, "tokenizer_id", p->model);
    cJSON_AddNumberToObject(root, "num_prompts", p->num_requests);
    if (p->request_rate > 0) {
        cJSON_AddNumberToObject(root, "request_rate", p->request_rate);
    } else {
        cJSON_AddStringToObject(root, "request_rate", "inf");
    }
    cJSON_AddNumberToObject(root, "burstiness", p->burstiness);
    if (p->max_concurrency > 0) {
        cJSON_AddNumberToObject(root, "max_concurrency", p->max_concurrency);
    } else {
        cJSON_AddNullToObject(root, "max_concurrency");
    }
    cJSON_AddNumberToObject(root, "duration", s->duration_s);
    cJSON_AddNumberToObject(root, "completed", s->completed);
    cJSON_AddNumberToObject(root, "failed", s->failed);
    cJSON_AddNumberToObject(root, "total_input_tokens", (double)s->input_tokens);
    cJSON_AddNumberToObject(root, "total_output_tokens", (double)s->output_tokens);
    cJSON_AddNumberToObject(root, "request_throughput", s->request_throughput);
    g = slo ? cJSON_CreateNumber(s->goodput) : cJSON_CreateNull();
    cJSON_AddItemToObject(root, "request_goodput", g);
    cJSON_AddNumberToObject(root, "output_throughput", s->output_throughput);
    cJSON_AddNumberToObject(root, "total_token_throughput", s->total_throughput);
    cJSON_AddNumberToObject(root, "max_output_tokens_per_s", s->max_output_tps);
    cJSON_AddNumberToObject(root, "max_concurrent_requests", s->max_concurrent);
    for (size_t i = 0; i < sizeof(metrics) / sizeof(metrics[0]); ++i) {
        if (p->pct_metrics & metrics[i].bit) {
            kvf_bs_json_stat(root, p, metrics[i].name,
                             (const kvf_bs_stat_t *)((const char *)s + metrics[i].off));
        }
    }
    if (p->detailed) {
        kvf_bs_json_detail(root, s);
    }
    /* kvferry's own */
    snprintf(url, sizeof(url), "http://%s:%d", p->host, p->port);
    cJSON_AddStringToObject(root, "url", url);
    cJSON_AddNumberToObject(root, "random_input_len", p->input_len);
    cJSON_AddNumberToObject(root, "random_output_len", p->output_len);
    cJSON_AddNumberToObject(root, "sent", s->sent);
    cJSON_AddNumberToObject(root, "good", s->good);
    fails = cJSON_AddObjectToObject(root, "failures");
    for (int k = 0; k < s->num_kinds; ++k) {
        cJSON_AddNumberToObject(fails, s->kinds[k], s->kind_counts[k]);
    }
    if (s->transfer_share_mean >= 0) {
        cJSON_AddNumberToObject(root, "transfer_share", s->transfer_share_mean);
    } else {
        cJSON_AddNullToObject(root, "transfer_share");
    }
    return root;
}

char *kvf_bs_json(const kvf_bs_params_t *p, const kvf_bs_summary_t *s)
{
    cJSON *root = kvf_bs_json_obj(p, s, NULL, NULL);
    char *text = cJSON_Print(root);

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
