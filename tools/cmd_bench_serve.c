/*
 * kvf bench-serve: flags, then the engine in kvf_bench_serve.c, then a
 * table (or --json) on stdout and, with --csv, one row per request.
 * Exit code: 0 when at least one measured request succeeded, 1 when none
 * did or the run could not start, 2 for bad flags.
 */
#include "kvf_bench_serve.h"
#include "kvf_cmds.h"
#include "kvf_log.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    kvf_bs_params_t p;
    char url[KVF_CONFIG_STR_MAX];
    char input_dist[KVF_CONFIG_STR_MAX];
    char output_dist[KVF_CONFIG_STR_MAX];
    char csv[KVF_CONFIG_STR_MAX];
    char progress[KVF_CONFIG_STR_MAX];
    int  seed;
    bool json;
} kvf_bs_opts_t;

#define KVF_BS_OFF(_f) offsetof(kvf_bs_opts_t, _f)

static const kvf_config_field_t kvf_bs_table[] = {
    {"URL", "http://127.0.0.1:8000", "the proxy's base URL",
     KVF_BS_OFF(url), KVF_CONFIG_TYPE_STRING, 0},
    {"MODEL", "", "model name sent in each request (empty: none; the proxy serves one)",
     KVF_BS_OFF(p.model), KVF_CONFIG_TYPE_STRING, 0},
    {"DATASET", "", "JSONL file, one {\"prompt\": text or [ids], \"max_tokens\": n} per line "
     "(cycled); empty: synthetic prompts", KVF_BS_OFF(p.dataset), KVF_CONFIG_TYPE_STRING, 0},
    {"INPUT_LEN", "128", "prompt tokens (synthetic prompts): the mean",
     KVF_BS_OFF(p.input_len), KVF_CONFIG_TYPE_INT, 0},
    {"INPUT_DIST", "fixed", "prompt length distribution: fixed, uniform (len +- spread), "
     "normal (std spread)", KVF_BS_OFF(input_dist), KVF_CONFIG_TYPE_STRING, 0},
    {"INPUT_SPREAD", "0", "uniform half-width or normal standard deviation, tokens",
     KVF_BS_OFF(p.input_spread), KVF_CONFIG_TYPE_DOUBLE, 0},
    {"OUTPUT_LEN", "32", "max_tokens of each request (with ignore_eos, the output length)",
     KVF_BS_OFF(p.output_len), KVF_CONFIG_TYPE_INT, 0},
    {"OUTPUT_DIST", "fixed", "output length distribution: fixed, uniform, normal",
     KVF_BS_OFF(output_dist), KVF_CONFIG_TYPE_STRING, 0},
    {"OUTPUT_SPREAD", "0", "uniform half-width or normal standard deviation, tokens",
     KVF_BS_OFF(p.output_spread), KVF_CONFIG_TYPE_DOUBLE, 0},
    {"TOKEN_LO", "32", "synthetic prompt token ids are drawn from [token-lo, token-hi)",
     KVF_BS_OFF(p.token_lo), KVF_CONFIG_TYPE_INT, 0},
    {"TOKEN_HI", "127", "see --token-lo; must not exceed the model's vocabulary",
     KVF_BS_OFF(p.token_hi), KVF_CONFIG_TYPE_INT, 0},
    {"NUM_REQUESTS", "100", "measured requests (0: as many as --duration allows)",
     KVF_BS_OFF(p.num_requests), KVF_CONFIG_TYPE_INT, 0},
    {"DURATION", "0", "stop sending after this many seconds (0: no limit)",
     KVF_BS_OFF(p.duration_s), KVF_CONFIG_TYPE_DOUBLE, 0},
    {"REQUEST_RATE", "0", "requests per second (0: all at once, bounded by --max-concurrency)",
     KVF_BS_OFF(p.request_rate), KVF_CONFIG_TYPE_DOUBLE, 0},
    {"BURSTINESS", "1", "gamma shape of the gaps between arrivals: 1 Poisson, < 1 burstier, "
     "> 1 steadier", KVF_BS_OFF(p.burstiness), KVF_CONFIG_TYPE_DOUBLE, 0},
    {"MAX_CONCURRENCY", "0", "requests in flight at most (0: unlimited)",
     KVF_BS_OFF(p.max_concurrency), KVF_CONFIG_TYPE_INT, 0},
    {"WARMUP", "0", "requests sent one at a time first and not counted",
     KVF_BS_OFF(p.warmup), KVF_CONFIG_TYPE_INT, 0},
    {"SEED", "0", "seed for lengths, prompts and arrival times",
     KVF_BS_OFF(seed), KVF_CONFIG_TYPE_INT, 0},
    {"TEMPERATURE", "0", "sampling temperature of each request",
     KVF_BS_OFF(p.temperature), KVF_CONFIG_TYPE_DOUBLE, 0},
    {"IGNORE_EOS", "yes", "ask for exactly max_tokens tokens",
     KVF_BS_OFF(p.ignore_eos), KVF_CONFIG_TYPE_BOOL, 0},
    {"TIMEOUT", "60", "per-request limit, seconds",
     KVF_BS_OFF(p.timeout_s), KVF_CONFIG_TYPE_DOUBLE, 0},
    {"SLO_TTFT_MS", "0", "goodput SLO on time to first token, ms (0: none)",
     KVF_BS_OFF(p.slo_ttft_ms), KVF_CONFIG_TYPE_DOUBLE, 0},
    {"SLO_TPOT_MS", "0", "goodput SLO on time per output token, ms (0: none)",
     KVF_BS_OFF(p.slo_tpot_ms), KVF_CONFIG_TYPE_DOUBLE, 0},
    {"SLO_E2E_MS", "0", "goodput SLO on end-to-end latency, ms (0: none)",
     KVF_BS_OFF(p.slo_e2e_ms), KVF_CONFIG_TYPE_DOUBLE, 0},
    {"JSON", "no", "print the summary as JSON instead of a table",
     KVF_BS_OFF(json), KVF_CONFIG_TYPE_BOOL, 0},
    {"CSV", "", "write one row per request to this file",
     KVF_BS_OFF(csv), KVF_CONFIG_TYPE_STRING, 0},
    {"PROGRESS", "auto", "progress bar on stderr: auto (when stderr is a terminal), yes, no",
     KVF_BS_OFF(progress), KVF_CONFIG_TYPE_STRING, 0},
    {NULL, NULL, NULL, 0, 0, 0},
};

static int kvf_bs_dist(const char *flag, const char *text, kvf_bs_dist_t *out)
{
    if (strcmp(text, "fixed") == 0) {
        *out = KVF_BS_DIST_FIXED;
    } else if (strcmp(text, "uniform") == 0) {
        *out = KVF_BS_DIST_UNIFORM;
    } else if (strcmp(text, "normal") == 0) {
        *out = KVF_BS_DIST_NORMAL;
    } else {
        kvf_error("bad value '%s' for --%s (fixed, uniform, normal)", text, flag);
        return -1;
    }
    return 0;
}

int kvf_cmd_bench_serve(int argc, char **argv)
{
    kvf_bs_opts_t o;
    kvf_bs_summary_t s;
    bool done;
    int rc;

    memset(&o, 0, sizeof(o));
    kvf_bs_params_default(&o.p);
    if (kvf_config_parse(kvf_bs_table, "kvf bench-serve", argc, argv, &o, &done) != KVF_OK) {
        return 2;
    }
    if (done) {
        return 0;
    }
    if ((kvf_bs_parse_url("url", o.url, &o.p) != 0) ||
        (kvf_bs_dist("input-dist", o.input_dist, &o.p.input_dist) != 0) ||
        (kvf_bs_dist("output-dist", o.output_dist, &o.p.output_dist) != 0)) {
        return 2;
    }
    if (o.seed < 0) {
        kvf_error("bad value %d for --seed: must be >= 0", o.seed);
        return 2;
    }
    o.p.seed = (uint64_t)o.seed;
    if (strcmp(o.progress, "auto") == 0) {
        o.p.progress = isatty(STDERR_FILENO);
    } else if ((strcmp(o.progress, "yes") == 0) || (strcmp(o.progress, "no") == 0)) {
        o.p.progress = (strcmp(o.progress, "yes") == 0);
    } else {
        kvf_error("bad value '%s' for --progress (auto, yes, no)", o.progress);
        return 2;
    }
    if (kvf_bs_params_check(&o.p) != 0) {
        return 2;
    }
    if (kvf_bs_run(&o.p, &s) != 0) {
        return 1;
    }
    if (o.json) {
        char *text = kvf_bs_json(&o.p, &s);
        printf("%s\n", text);
        free(text);
    } else {
        kvf_bs_print_table(&o.p, &s, stdout);
    }
    rc = (s.completed > 0) ? 0 : 1;
    if ((o.csv[0] != '\0') && (kvf_bs_write_csv(&s, o.csv) != 0)) {
        rc = 1;
    }
    if (s.completed == 0) {
        kvf_error("kvf bench-serve: no request succeeded (%d sent)", s.sent);
    }
    kvf_bs_summary_cleanup(&s);
    return rc;
}
