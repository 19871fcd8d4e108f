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
    if (p->slo_ttft_ms >= 0) {
        n += snprintf(buf + n, cap - (size_t)n, " ttft<=%gms", p->slo_ttft_ms);
    }
    if (p->slo_tpot_ms >= 0) {
        n += snprintf(buf + n, cap - (size_t)n, " tpot<=%gms", p->slo_tpot_ms);
    }
    if (p->slo_e2e_ms >= 0) {
        snprintf(buf + n, cap - (size_t)n, " e2e<=%gms", p->slo_e2e_ms);
    }
}

/* One "----Header----" line, centred in 50 columns as vLLM prints it. */
static void kvf_bs_rule(FILE *out, const char *title, char c)
{
    int len = (int)strlen(title), left = (50 - len) / 2, right = 50 - len - left;

    for (int i = 0; i < left; ++i) {
        fputc(c, out);
    }
    fputs(title, out);
    for (int i = 0; i < right; ++i) {
        fputc(c, out);
    }
    fputc('\n', out);
}

void kvf_bs_print_table(const kvf_bs_params_t *p, const kvf_bs_summary_t *s, FILE *out)
{
    static const struct {
        unsigned bit;
        const char *name, *header;
        size_t off;
    } metrics[] = {
        {KVF_BS_M_TTFT, "TTFT", "Time to First Token", offsetof(kvf_bs_summary_t, ttft)},
        {KVF_BS_M_TPOT, "TPOT", "Time per Output Token (excl. 1st token)",
         offsetof(kvf_bs_summary_t, tpot)},
        {KVF_BS_M_ITL, "ITL", "Inter-token Latency", offsetof(kvf_bs_summary_t, itl)},
        {KVF_BS_M_E2EL, "E2EL", "End-to-end Latency", offsetof(kvf_bs_summary_t, e2e)},
    };
    char slo[128], rate[32], line[64];

    kvf_bs_slo_text(p, slo, sizeof(slo));
    if (p->request_rate > 0) {
        snprintf(rate, sizeof(rate), "%g", p->request_rate);
    } else {
        snprintf(rate, sizeof(rate), "inf");
    }
    fprintf(out, "kvf bench-serve: http://%s:%d, model %s\n", p->host, p->port, p->model);
    if (p->dataset[0] != '\0') {
        fprintf(out, "workload: dataset %s, output %s %d\n", p->dataset,
                kvf_bs_dist_name(p->output_dist), p->output_len);
    } else {
        fprintf(out, "workload: random, input %s %d (spread %g), output %s %d (spread %g)\n",
                kvf_bs_dist_name(p->input_dist), p->input_len, p->input_spread,
                kvf_bs_dist_name(p->output_dist), p->output_len, p->output_spread);
    }
    fprintf(out, "Traffic request rate: %s\nBurstiness factor: %g\n", rate, p->burstiness);
    if (p->max_concurrency > 0) {
        fprintf(out, "Maximum request concurrency: %d\n", p->max_concurrency);
    } else {
        fprintf(out, "Maximum request concurrency: None\n");
    }
    kvf_bs_rule(out, " Serving Benchmark Result ", '=');
#define KVF_BS_ROW(_label, _fmt, ...) fprintf(out, "%-40s " _fmt "\n", _label, __VA_ARGS__)
    KVF_BS_ROW("Successful requests:", "%-10d", s->completed);
    KVF_BS_ROW("Failed requests:", "%-10d", s->failed);
    for (int k = 0; k < s->num_kinds; ++k) {
        snprintf(line, sizeof(line), "  failed %s:", s->kinds[k]);
        fprintf(out, "%-40s %-10d first: %s\n", line, s->kind_counts[k],
                s->kind_first_error[k]);
    }
    if (p->max_concurrency > 0) {
        KVF_BS_ROW("Maximum request concurrency:", "%-10d", p->max_concurrency);
    }
    KVF_BS_ROW("Benchmark duration (s):", "%-10.2f", s->duration_s);
    KVF_BS_ROW("Total input tokens:", "%-10lld", s->input_tokens);
    KVF_BS_ROW("Total generated tokens:", "%-10lld", s->output_tokens);
    KVF_BS_ROW("Request throughput (req/s):", "%-10.2f", s->request_throughput);
    if (slo[0] != '\0') {
        snprintf(line, sizeof(line), "Request goodput (req/s):");
        fprintf(out, "%-40s %-10.2f (%d of %d within%s)\n", line, s->goodput, s->good,
                s->completed, slo);
    }
    KVF_BS_ROW("Output token throughput (tok/s):", "%-10.2f", s->output_throughput);
    KVF_BS_ROW("Peak output token throughput (tok/s):", "%-10.2f", s->max_output_tps);
    KVF_BS_ROW("Peak concurrent requests:", "%-10d", s->max_concurrent);
    KVF_BS_ROW("Total Token throughput (tok/s):", "%-10.2f", s->total_throughput);
    if (s->transfer_share_mean >= 0) {
        KVF_BS_ROW("KV transfer share of first decode (%):", "%-10.1f",
                   100.0 * s->transfer_share_mean);
    }
    for (size_t i = 0; i < sizeof(metrics) / sizeof(metrics[0]); ++i) {
        const kvf_bs_stat_t *st = (const kvf_bs_stat_t *)((const char *)s + metrics[i].off);

        if (!(p->pct_metrics & metrics[i].bit)) {
            continue;
        }
        kvf_bs_rule(out, metrics[i].header, '-');
        snprintf(line, sizeof(line), "Mean %s (ms):", metrics[i].name);
        KVF_BS_ROW(line, "%-10.2f", st->mean);
        snprintf(line, sizeof(line), "Median %s (ms):", metrics[i].name);
        KVF_BS_ROW(line, "%-10.2f", kvf_bs_percentile(st, 50));
        for (int k = 0; k < p->num_pct; ++k) {
            snprintf(line, sizeof(line), "P%g %s (ms):", p->pct[k], metrics[i].name);
            KVF_BS_ROW(line, "%-10.2f", kvf_bs_percentile(st, p->pct[k]));
        }
    }
#undef KVF_BS_ROW
    kvf_bs_rule(out, "", '=');
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
    cJSON *starts = cJSON_AddArrayToObject(root, "start_times");
    cJSON *texts = cJSON_AddArrayToObject(root, "generated_texts");

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
        cJSON_AddItemToArray(starts, cJSON_CreateNumber(r->start_ms / 1000.0));
        cJSON_AddItemToArray(texts, cJSON_CreateString((r->text != NULL) ? r->text : ""));
    }
}

/* What vLLM writes without --save-detailed too: per-request latencies and queue times. */
static void kvf_bs_json_always(cJSON *root, const kvf_bs_summary_t *s)
{
    cJSON *lat = cJSON_AddArrayToObject(root, "latencies");
    cJSON *queue = cJSON_AddArrayToObject(root, "queue_times");

    for (int i = 0; i < s->sent; ++i) {
        const kvf_bs_result_t *r = &s->results[i];
        double q = r->start_ms - r->arrival_ms;

        cJSON_AddItemToArray(lat, cJSON_CreateNumber(r->ok ? r->e2e_ms / 1000.0 : 0));
        cJSON_AddItemToArray(queue, cJSON_CreateNumber((q > 0) ? q / 1000.0 : 0));
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
    bool slo = (p->slo_ttft_ms >= 0) || (p->slo_tpot_ms >= 0) || (p->slo_e2e_ms >= 0);
    cJSON *root = cJSON_CreateObject();
    cJSON *fails, *g;
    char url[KVF_CONFIG_STR_MAX + 32];

    if (date != NULL) {
        cJSON_AddStringToObject(root, "date", date);
    }
    cJSON_AddStringToObject(root, "endpoint_type", (backend != NULL) ? backend : "openai");
    cJSON_AddStringToObject(root, "backend", (backend != NULL) ? backend : "openai");
    if (p->label[0] != '\0') {
        cJSON_AddStringToObject(root, "label", p->label);
    } else {
        cJSON_AddNullToObject(root, "label");
    }
    cJSON_AddStringToObject(root, "model_id", p->model);
    cJSON_AddStringToObject(root, "tokenizer_id",
                            (p->tokenizer_id[0] != '\0') ? p->tokenizer_id : p->model);
    cJSON_AddNumberToObject(root, "num_prompts", p->num_requests);
    if (p->request_rate > 0) {
        cJSON_AddNumberToObject(root, "request_rate", p->request_rate);
    } else {
        cJSON_AddStringToObject(root, "request_rate", "inf");
    }
    cJSON_AddNumberToObject(root, "burstiness", p->burstiness);
    if (p->ramp_up != 0) {
        cJSON_AddStringToObject(root, "ramp_up_strategy", (p->ramp_up == 1) ? "linear" :
                                "exponential");
        cJSON_AddNumberToObject(root, "ramp_up_start_rps", p->ramp_start_rps);
        cJSON_AddNumberToObject(root, "ramp_up_end_rps", p->ramp_end_rps);
    }
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
    cJSON_AddNumberToObject(root, "rtfx", 0.0);
    kvf_bs_json_always(root, s);
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
    fails = cJSON_AddObjectToObject(root, "failure_examples");
    for (int k = 0; k < s->num_kinds; ++k) {
        cJSON_AddStringToObject(fails, s->kinds[k], s->kind_first_error[k]);
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
