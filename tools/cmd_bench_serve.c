/*
 * kvf bench-serve: flags as `vllm bench serve` spells them (kvferry's older
 * names kept as aliases), then the engine in kvf_bench_serve.c once per
 * --request-rate, then a table (or --json) on stdout, with --save-result a
 * vLLM-shaped result JSON per rate and a PNG of TTFT and ITL percentiles
 * against request rate in --result-dir, and with --csv one row per request.
 *
 * Settings come from the command line only: KVF_<NAME> variables exported
 * for the daemons (KVF_MODEL, KVF_PORT, ...) are not bench-serve's. Without
 * --model the name is the one the proxy serves (GET /v1/models).
 *
 * Exit code: 0 when at least one measured request succeeded in every run,
 * 1 when none did, a run could not start or a result could not be written,
 * 2 for bad flags.
 */
#define _GNU_SOURCE
#include "kvf_bench_serve.h"
#include "kvf_cmds.h"
#include "kvf_log.h"
#include "kvf_tok_config.h"
#include "kvf_tokenizer.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define KVF_BS_MAX_RATES 16

typedef struct {
    kvf_bs_params_t p;
    char backend[KVF_CONFIG_STR_MAX];
    char base_url[KVF_CONFIG_STR_MAX];
    char host[KVF_CONFIG_STR_MAX];
    int  port;
    char dataset_name[KVF_CONFIG_STR_MAX];
    char rates[KVF_CONFIG_STR_MAX];
    double range_ratio;
    char input_dist[KVF_CONFIG_STR_MAX];
    char output_dist[KVF_CONFIG_STR_MAX];
    char pct_metrics[KVF_CONFIG_STR_MAX];
    char pcts[KVF_CONFIG_STR_MAX];
    char goodput[KVF_CONFIG_STR_MAX];
    bool save_result;
    char result_dir[KVF_CONFIG_STR_MAX];
    char result_filename[KVF_CONFIG_STR_MAX];
    char csv[KVF_CONFIG_STR_MAX];
    char progress[KVF_CONFIG_STR_MAX];
    bool disable_tqdm;
    int  seed;
    bool json;
    /* `vllm bench serve` flags; "" : not given */
    char sampling[7][KVF_CONFIG_STR_MAX];   /* temperature, top_p, ..., in kvf_bs_sampling order */
    char tokenizer[KVF_CONFIG_STR_MAX];
    char served_model_name[KVF_CONFIG_STR_MAX];
    char header[KVF_CONFIG_STR_MAX];
    char extra_body[KVF_CONFIG_STR_MAX];
    char ramp_up[KVF_CONFIG_STR_MAX];
    double ramp_start, ramp_end;
    char request_id_prefix[KVF_CONFIG_STR_MAX];
    double ready_timeout;
    bool append_result;
    int  rep_prefix_len, rep_suffix_len, rep_num_prefixes, rep_output_len;
    int  mt_conversations, mt_turns, mt_first_len, mt_question_len, mt_answer_len;
} kvf_bs_opts_t;

/* The sampling flags vLLM sends only when given, as the request fields of the same name. */
static const struct {
    const char *flag, *field;
    bool integer;
} kvf_bs_sampling[7] = {
    {"temperature", "temperature", false}, {"top-p", "top_p", false}, {"top-k", "top_k", true},
    {"min-p", "min_p", false}, {"frequency-penalty", "frequency_penalty", false},
    {"presence-penalty", "presence_penalty", false},
    {"repetition-penalty", "repetition_penalty", false},
};

#define KVF_BS_OFF(_f) offsetof(kvf_bs_opts_t, _f)

/* No KVF_* variable is read (every field is KVF_CONFIG_FLAG_NO_ENV): the shell that
 * runs a benchmark often exports the daemons' KVF_MODEL, KVF_PORT, ... which mean
 * something else here. */
static const kvf_config_field_t kvf_bs_table[] = {
    {"BACKEND", "openai", "openai or vllm (the completions API), openai-chat (the chat "
     "completions API: one user message per prompt, token ids decoded with --tokenizer)",
     KVF_BS_OFF(backend), KVF_CONFIG_TYPE_STRING, KVF_CONFIG_FLAG_NO_ENV},
    {"BASE_URL", "", "the proxy's base URL, e.g. http://127.0.0.1:8000 (alias --url; empty: "
     "http://HOST:PORT)", KVF_BS_OFF(base_url), KVF_CONFIG_TYPE_STRING, KVF_CONFIG_FLAG_NO_ENV},
    {"HOST", "127.0.0.1", "the proxy's host when no --base-url", KVF_BS_OFF(host),
     KVF_CONFIG_TYPE_STRING, KVF_CONFIG_FLAG_NO_ENV},
    {"PORT", "8000", "the proxy's port when no --base-url", KVF_BS_OFF(port),
     KVF_CONFIG_TYPE_INT, KVF_CONFIG_FLAG_NO_ENV},
    {"ENDPOINT", "/v1/completions", "API path: /v1/completions, or /v1/chat/completions with "
     "--backend openai-chat",
     KVF_BS_OFF(p.endpoint), KVF_CONFIG_TYPE_STRING, KVF_CONFIG_FLAG_NO_ENV},
    {"MODEL", "", "model name sent in each request (empty: the first id of the proxy's "
     "GET /v1/models)", KVF_BS_OFF(p.model), KVF_CONFIG_TYPE_STRING, KVF_CONFIG_FLAG_NO_ENV},
    {"DATASET_NAME", "", "random (synthetic token ids), prefix_repetition, multi_turn, custom "
     "(JSONL from --dataset-path), or vLLM's sharegpt (JSON), sonnet (text lines), burstgpt "
     "(CSV) from --dataset-path; empty: custom with --dataset-path, random otherwise",
     KVF_BS_OFF(dataset_name),
     KVF_CONFIG_TYPE_STRING, KVF_CONFIG_FLAG_NO_ENV},
    {"DATASET_PATH", "", "custom: JSONL file, one {\"prompt\": text or [ids], \"max_tokens\": "
     "n} per line (cycled); sharegpt, sonnet, burstgpt: vLLM's files (alias --dataset)",
     KVF_BS_OFF(p.dataset), KVF_CONFIG_TYPE_STRING, KVF_CONFIG_FLAG_NO_ENV},
    {"NUM_PROMPTS", "1000", "measured requests (0: as many as --duration allows) "
     "(alias --num-requests)",
     KVF_BS_OFF(p.num_requests), KVF_CONFIG_TYPE_INT, KVF_CONFIG_FLAG_NO_ENV},
    {"RANDOM_INPUT_LEN", "1024", "prompt tokens of random prompts after the prefix: the mean "
     "(alias --input-len)",
     KVF_BS_OFF(p.input_len), KVF_CONFIG_TYPE_INT, KVF_CONFIG_FLAG_NO_ENV},
    {"RANDOM_OUTPUT_LEN", "128", "max_tokens of each request (with --ignore-eos, the output "
     "length) (alias --output-len)",
     KVF_BS_OFF(p.output_len), KVF_CONFIG_TYPE_INT, KVF_CONFIG_FLAG_NO_ENV},
    {"RANDOM_RANGE_RATIO", "0", "lengths uniform in [len (1 - r), len (1 + r)], r in [0, 1)",
     KVF_BS_OFF(range_ratio), KVF_CONFIG_TYPE_DOUBLE, KVF_CONFIG_FLAG_NO_ENV},
    {"INPUT_DIST", "fixed", "prompt length distribution: fixed, uniform (len +- spread), "
     "normal (std spread)", KVF_BS_OFF(input_dist), KVF_CONFIG_TYPE_STRING, KVF_CONFIG_FLAG_NO_ENV},
    {"INPUT_SPREAD", "0", "uniform half-width or normal standard deviation, tokens",
     KVF_BS_OFF(p.input_spread), KVF_CONFIG_TYPE_DOUBLE, KVF_CONFIG_FLAG_NO_ENV},
    {"OUTPUT_DIST", "fixed", "output length distribution: fixed, uniform, normal",
     KVF_BS_OFF(output_dist), KVF_CONFIG_TYPE_STRING, KVF_CONFIG_FLAG_NO_ENV},
    {"OUTPUT_SPREAD", "0", "uniform half-width or normal standard deviation, tokens",
     KVF_BS_OFF(p.output_spread), KVF_CONFIG_TYPE_DOUBLE, KVF_CONFIG_FLAG_NO_ENV},
    {"TOKEN_LO", "32", "random prompt token ids are drawn from [token-lo, token-hi)",
     KVF_BS_OFF(p.token_lo), KVF_CONFIG_TYPE_INT, KVF_CONFIG_FLAG_NO_ENV},
    {"TOKEN_HI", "127", "see --token-lo; must not exceed the model's vocabulary",
     KVF_BS_OFF(p.token_hi), KVF_CONFIG_TYPE_INT, KVF_CONFIG_FLAG_NO_ENV},
    {"DURATION", "0", "stop sending after this many seconds (0: no limit)",
     KVF_BS_OFF(p.duration_s), KVF_CONFIG_TYPE_DOUBLE, KVF_CONFIG_FLAG_NO_ENV},
    {"REQUEST_RATE", "inf", "requests per second, Poisson (inf: all at once, bounded by "
     "--max-concurrency); a comma list runs once per rate", KVF_BS_OFF(rates),
     KVF_CONFIG_TYPE_STRING, KVF_CONFIG_FLAG_NO_ENV},
    {"BURSTINESS", "1", "gamma shape of the gaps between arrivals: 1 Poisson, < 1 burstier, "
     "> 1 steadier", KVF_BS_OFF(p.burstiness), KVF_CONFIG_TYPE_DOUBLE, KVF_CONFIG_FLAG_NO_ENV},
    {"MAX_CONCURRENCY", "0", "requests in flight at most (0: unlimited)",
     KVF_BS_OFF(p.max_concurrency), KVF_CONFIG_TYPE_INT, KVF_CONFIG_FLAG_NO_ENV},
    {"NUM_WARMUPS", "0", "requests sent one at a time first and not counted (alias --warmup)",
     KVF_BS_OFF(p.warmup), KVF_CONFIG_TYPE_INT, KVF_CONFIG_FLAG_NO_ENV},
    {"SEED", "0", "seed for lengths, prompts and arrival times",
     KVF_BS_OFF(seed), KVF_CONFIG_TYPE_INT, KVF_CONFIG_FLAG_NO_ENV},
    {"TEMPERATURE", "", "sampling temperature, sent only when given (the server's default "
     "otherwise)", KVF_BS_OFF(sampling[0]), KVF_CONFIG_TYPE_STRING, KVF_CONFIG_FLAG_NO_ENV},
    {"TOP_P", "", "top_p, sent only when given", KVF_BS_OFF(sampling[1]),
     KVF_CONFIG_TYPE_STRING, KVF_CONFIG_FLAG_NO_ENV},
    {"TOP_K", "", "top_k (an integer), sent only when given", KVF_BS_OFF(sampling[2]),
     KVF_CONFIG_TYPE_STRING, KVF_CONFIG_FLAG_NO_ENV},
    {"MIN_P", "", "min_p, sent only when given", KVF_BS_OFF(sampling[3]),
     KVF_CONFIG_TYPE_STRING, KVF_CONFIG_FLAG_NO_ENV},
    {"FREQUENCY_PENALTY", "", "frequency_penalty, sent only when given",
     KVF_BS_OFF(sampling[4]), KVF_CONFIG_TYPE_STRING, KVF_CONFIG_FLAG_NO_ENV},
    {"PRESENCE_PENALTY", "", "presence_penalty, sent only when given", KVF_BS_OFF(sampling[5]),
     KVF_CONFIG_TYPE_STRING, KVF_CONFIG_FLAG_NO_ENV},
    {"REPETITION_PENALTY", "", "repetition_penalty, sent only when given",
     KVF_BS_OFF(sampling[6]), KVF_CONFIG_TYPE_STRING, KVF_CONFIG_FLAG_NO_ENV},
    {"EXTRA_BODY", "", "a JSON object whose keys are added to every request body (they win "
     "over the sampling flags)", KVF_BS_OFF(extra_body), KVF_CONFIG_TYPE_STRING,
     KVF_CONFIG_FLAG_NO_ENV},
    {"IGNORE_EOS", "no", "send ignore_eos: true (the random dataset always does, as vLLM's)",
     KVF_BS_OFF(p.ignore_eos), KVF_CONFIG_TYPE_BOOL, KVF_CONFIG_FLAG_NO_ENV},
    {"SERVED_MODEL_NAME", "", "the model name sent in requests (empty: --model)",
     KVF_BS_OFF(served_model_name), KVF_CONFIG_TYPE_STRING, KVF_CONFIG_FLAG_NO_ENV},
    {"TOKENIZER", "", "tokenizer id recorded in the result (tokenizer_id); must exist when a "
     "path. Random prompts are token ids drawn in [--token-lo, --token-hi), so no text is "
     "tokenized here", KVF_BS_OFF(tokenizer), KVF_CONFIG_TYPE_STRING, KVF_CONFIG_FLAG_NO_ENV},
    {"HEADER", "", "KEY=VALUE pairs (spaces between) sent as headers with every request",
     KVF_BS_OFF(header), KVF_CONFIG_TYPE_STRING, KVF_CONFIG_FLAG_NO_ENV},
    {"LABEL", "", "the result's label (and its file name's prefix; empty: --backend)",
     KVF_BS_OFF(p.label), KVF_CONFIG_TYPE_STRING, KVF_CONFIG_FLAG_NO_ENV},
    {"REQUEST_ID_PREFIX", "auto", "x-request-id of request i is PREFIX + i (auto: "
     "bench-<8 random hex>-, as vLLM)", KVF_BS_OFF(request_id_prefix), KVF_CONFIG_TYPE_STRING,
     KVF_CONFIG_FLAG_NO_ENV},
    {"RAMP_UP_STRATEGY", "", "linear or exponential: the request rate moves from "
     "--ramp-up-start-rps to --ramp-up-end-rps over the requests (no --request-rate)",
     KVF_BS_OFF(ramp_up), KVF_CONFIG_TYPE_STRING, KVF_CONFIG_FLAG_NO_ENV},
    {"RAMP_UP_START_RPS", "-1", "the ramp-up's first rate, requests/s",
     KVF_BS_OFF(ramp_start), KVF_CONFIG_TYPE_DOUBLE, KVF_CONFIG_FLAG_NO_ENV},
    {"RAMP_UP_END_RPS", "-1", "the ramp-up's last rate, requests/s",
     KVF_BS_OFF(ramp_end), KVF_CONFIG_TYPE_DOUBLE, KVF_CONFIG_FLAG_NO_ENV},
    {"RANDOM_PREFIX_LEN", "0", "random: tokens of one prefix every prompt starts with (before "
     "--random-input-len)", KVF_BS_OFF(p.prefix_len), KVF_CONFIG_TYPE_INT,
     KVF_CONFIG_FLAG_NO_ENV},
    {"READY_CHECK_TIMEOUT_SEC", "0", "before the run, retry one test request until it is "
     "answered, at most this long (0: only check that the server lists the model)",
     KVF_BS_OFF(ready_timeout), KVF_CONFIG_TYPE_DOUBLE, KVF_CONFIG_FLAG_NO_ENV},
    {"PREFIX_REPETITION_PREFIX_LEN", "256", "prefix_repetition: tokens of each shared prefix",
     KVF_BS_OFF(rep_prefix_len), KVF_CONFIG_TYPE_INT, KVF_CONFIG_FLAG_NO_ENV},
    {"PREFIX_REPETITION_SUFFIX_LEN", "256", "prefix_repetition: tokens after the prefix, "
     "each prompt its own", KVF_BS_OFF(rep_suffix_len), KVF_CONFIG_TYPE_INT,
     KVF_CONFIG_FLAG_NO_ENV},
    {"PREFIX_REPETITION_NUM_PREFIXES", "10", "prefix_repetition: distinct prefixes (each "
     "prompt draws one)", KVF_BS_OFF(rep_num_prefixes), KVF_CONFIG_TYPE_INT,
     KVF_CONFIG_FLAG_NO_ENV},
    {"PREFIX_REPETITION_OUTPUT_LEN", "128", "prefix_repetition: max_tokens of each request",
     KVF_BS_OFF(rep_output_len), KVF_CONFIG_TYPE_INT, KVF_CONFIG_FLAG_NO_ENV},
    {"MULTI_TURN_CONVERSATIONS", "10", "multi_turn: conversations; request i is turn "
     "(i / conversations) % turns of conversation i % conversations, its prompt the "
     "conversation so far (drawn answers, not the server's)",
     KVF_BS_OFF(mt_conversations), KVF_CONFIG_TYPE_INT, KVF_CONFIG_FLAG_NO_ENV},
    {"MULTI_TURN_TURNS", "10", "multi_turn: turns per conversation",
     KVF_BS_OFF(mt_turns), KVF_CONFIG_TYPE_INT, KVF_CONFIG_FLAG_NO_ENV},
    {"MULTI_TURN_FIRST_LEN", "256", "multi_turn: tokens of a conversation's first question",
     KVF_BS_OFF(mt_first_len), KVF_CONFIG_TYPE_INT, KVF_CONFIG_FLAG_NO_ENV},
    {"MULTI_TURN_QUESTION_LEN", "64", "multi_turn: tokens of each later question",
     KVF_BS_OFF(mt_question_len), KVF_CONFIG_TYPE_INT, KVF_CONFIG_FLAG_NO_ENV},
    {"MULTI_TURN_ANSWER_LEN", "32", "multi_turn: max_tokens of each request, and the tokens "
     "of each earlier answer in the prompt", KVF_BS_OFF(mt_answer_len), KVF_CONFIG_TYPE_INT,
     KVF_CONFIG_FLAG_NO_ENV},
    {"SHAREGPT_OUTPUT_LEN", "-1", "sharegpt: max_tokens of every request (-1: the tokens of "
     "each conversation's second turn)", KVF_BS_OFF(p.sharegpt_output_len),
     KVF_CONFIG_TYPE_INT, KVF_CONFIG_FLAG_NO_ENV},
    {"SONNET_INPUT_LEN", "550", "sonnet: most prompt tokens (in the chat template) of each "
     "request", KVF_BS_OFF(p.sonnet_input_len), KVF_CONFIG_TYPE_INT, KVF_CONFIG_FLAG_NO_ENV},
    {"SONNET_OUTPUT_LEN", "150", "sonnet: max_tokens of each request",
     KVF_BS_OFF(p.sonnet_output_len), KVF_CONFIG_TYPE_INT, KVF_CONFIG_FLAG_NO_ENV},
    {"SONNET_PREFIX_LEN", "200", "sonnet: tokens of the prefix every prompt shares (the "
     "file's first lines)", KVF_BS_OFF(p.sonnet_prefix_len), KVF_CONFIG_TYPE_INT,
     KVF_CONFIG_FLAG_NO_ENV},
    {"APPEND_RESULT", "no", "append the result JSON to the result file (one document per "
     "line) instead of replacing it; implies --save-result", KVF_BS_OFF(append_result),
     KVF_CONFIG_TYPE_BOOL, KVF_CONFIG_FLAG_NO_ENV},
    {"TIMEOUT", "60", "per-request limit, seconds",
     KVF_BS_OFF(p.timeout_s), KVF_CONFIG_TYPE_DOUBLE, KVF_CONFIG_FLAG_NO_ENV},
    {"PERCENTILE_METRICS", "ttft,tpot,itl", "metrics reported with percentiles: comma list of "
     "ttft, tpot, itl, e2el",
     KVF_BS_OFF(pct_metrics), KVF_CONFIG_TYPE_STRING, KVF_CONFIG_FLAG_NO_ENV},
    {"METRIC_PERCENTILES", "99", "percentiles reported, comma list (e.g. 25,50,75,99.9)",
     KVF_BS_OFF(pcts), KVF_CONFIG_TYPE_STRING, KVF_CONFIG_FLAG_NO_ENV},
    {"GOODPUT", "", "SLOs as KEY:VALUE ms pairs, spaces or commas between (ttft, tpot, e2el), "
     "e.g. --goodput ttft:500 tpot:50",
     KVF_BS_OFF(goodput), KVF_CONFIG_TYPE_STRING, KVF_CONFIG_FLAG_NO_ENV},
    {"SLO_TTFT_MS", "0", "goodput SLO on time to first token, ms (0: none; --goodput ttft:MS, "
     "where 0 is an SLO of 0)",
     KVF_BS_OFF(p.slo_ttft_ms), KVF_CONFIG_TYPE_DOUBLE, KVF_CONFIG_FLAG_NO_ENV},
    {"SLO_TPOT_MS", "0", "goodput SLO on time per output token, ms (0: none; --goodput tpot:MS)",
     KVF_BS_OFF(p.slo_tpot_ms), KVF_CONFIG_TYPE_DOUBLE, KVF_CONFIG_FLAG_NO_ENV},
    {"SLO_E2E_MS", "0", "goodput SLO on end-to-end latency, ms (0: none; --goodput e2el:MS)",
     KVF_BS_OFF(p.slo_e2e_ms), KVF_CONFIG_TYPE_DOUBLE, KVF_CONFIG_FLAG_NO_ENV},
    {"SAVE_RESULT", "no", "write the result JSON (vLLM's field names) and the percentile PNG "
     "to --result-dir", KVF_BS_OFF(save_result), KVF_CONFIG_TYPE_BOOL, KVF_CONFIG_FLAG_NO_ENV},
    {"SAVE_DETAILED", "no", "with --save-result: per-request input_lens, output_lens, ttfts, "
     "itls, errors too", KVF_BS_OFF(p.detailed), KVF_CONFIG_TYPE_BOOL, KVF_CONFIG_FLAG_NO_ENV},
    {"RESULT_DIR", ".", "folder for --save-result (created)", KVF_BS_OFF(result_dir),
     KVF_CONFIG_TYPE_STRING, KVF_CONFIG_FLAG_NO_ENV},
    {"RESULT_FILENAME", "", "result file name (several rates: -RATEqps inserted); empty: "
     "BACKEND-RATEqps[-concurrencyN]-MODEL-YYYYMMDD-HHMMSS.json; the PNG takes the same stem",
     KVF_BS_OFF(result_filename), KVF_CONFIG_TYPE_STRING, KVF_CONFIG_FLAG_NO_ENV},
    {"JSON", "no", "print the result JSON instead of a table (a list with several rates)",
     KVF_BS_OFF(json), KVF_CONFIG_TYPE_BOOL, KVF_CONFIG_FLAG_NO_ENV},
    {"CSV", "", "write one row per request to this file (several rates: the last run)",
     KVF_BS_OFF(csv), KVF_CONFIG_TYPE_STRING, KVF_CONFIG_FLAG_NO_ENV},
    {"PROGRESS", "auto", "progress bar on stderr: auto (when stderr is a terminal), yes, no",
     KVF_BS_OFF(progress), KVF_CONFIG_TYPE_STRING, KVF_CONFIG_FLAG_NO_ENV},
    {"DISABLE_TQDM", "no", "no progress bar (as --progress no)", KVF_BS_OFF(disable_tqdm),
     KVF_CONFIG_TYPE_BOOL, KVF_CONFIG_FLAG_NO_ENV},
    {NULL, NULL, NULL, 0, 0, 0},
};

/* kvferry's earlier flag names and the vLLM names they stand for. */
static const char *const kvf_bs_aliases[][2] = {
    {"url", "base-url"},          {"num-requests", "num-prompts"},
    {"input-len", "random-input-len"}, {"output-len", "random-output-len"},
    {"warmup", "num-warmups"},    {"dataset", "dataset-path"},
};

/*
 * argv with aliases renamed and --goodput's space-separated pairs joined
 * into one value (vLLM takes them as nargs='+'). Strings in @a out point
 * into @a store or argv. Returns the new argc.
 */
static int kvf_bs_rewrite(int argc, char **argv, char **out, char *store, size_t cap)
{
    size_t used = 0;
    int n = 0;

    for (int i = 0; i < argc; ++i) {
        const char *a = argv[i];
        size_t len = strcspn(a, "=");

        out[n] = argv[i];
        if (strncmp(a, "--", 2) == 0) {
            for (size_t k = 0; k < sizeof(kvf_bs_aliases) / sizeof(kvf_bs_aliases[0]); ++k) {
                const char *old = kvf_bs_aliases[k][0];
                if ((len == strlen(old) + 2) && (strncmp(a + 2, old, len - 2) == 0)) {
                    int w = snprintf(store + used, cap - used, "--%s%s", kvf_bs_aliases[k][1],
                                     a + len);
                    if ((w > 0) && ((size_t)w < cap - used)) {   /* else left as given */
                        out[n] = store + used;
                        used += (size_t)w + 1;
                    }
                    break;
                }
            }
        }
        if (((strcmp(a, "--goodput") == 0) || (strcmp(a, "--header") == 0)) &&
            (used + 1 < cap)) {
            char *v = store + used;

            v[0] = '\0';
            while ((i + 1 < argc) && (strncmp(argv[i + 1], "--", 2) != 0) &&
                   (used + strlen(v) + strlen(argv[i + 1]) + 2 < cap)) {
                if (v[0] != '\0') {
                    strcat(v, " ");
                }
                strcat(v, argv[++i]);
            }
            used += strlen(v) + 1;
            out[++n] = v;
        }
        ++n;
    }
    out[n] = NULL;
    return n;
}

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

/* --percentile-metrics, --metric-percentiles, --goodput into p. 0, or -1 (logged). */
static int kvf_bs_metrics(kvf_bs_opts_t *o)
{
    static const char *const names[] = {"ttft", "tpot", "itl", "e2el"};
    char buf[KVF_CONFIG_STR_MAX];

    o->p.pct_metrics = 0;
    snprintf(buf, sizeof(buf), "%s", o->pct_metrics);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok != NULL;
         tok = strtok_r(NULL, ",", &save)) {
        size_t k;
        for (k = 0; (k < 4) && (strcmp(tok, names[k]) != 0); ++k) {
        }
        if (k == 4) {
            kvf_error("bad value '%s' for --percentile-metrics: unknown metric '%s' (ttft, tpot, "
                      "itl, e2el)", o->pct_metrics, tok);
            return -1;
        }
        o->p.pct_metrics |= 1u << k;
    }
    o->p.num_pct = kvf_config_number_list("metric-percentiles", o->pcts, 0, 100, false,
                                          o->p.pct, KVF_BS_MAX_PCT);
    if (o->p.num_pct < 0) {
        return -1;
    }
    /* kvferry's --slo-*-ms: 0 is none; --goodput's KEY:0 below is an SLO of 0 (vLLM's) */
    {
        double *slo[3] = {&o->p.slo_ttft_ms, &o->p.slo_tpot_ms, &o->p.slo_e2e_ms};
        static const char *const flag[3] = {"slo-ttft-ms", "slo-tpot-ms", "slo-e2e-ms"};
        for (int i = 0; i < 3; ++i) {
            if (!(*slo[i] >= 0)) {
                kvf_error("bad value %g for --%s: must be >= 0 (0: none)", *slo[i], flag[i]);
                return -1;
            }
            *slo[i] = (*slo[i] > 0) ? *slo[i] : -1;
        }
    }
    snprintf(buf, sizeof(buf), "%s", o->goodput);
    for (char *save = NULL, *tok = strtok_r(buf, ", ", &save); tok != NULL;
         tok = strtok_r(NULL, ", ", &save)) {
        char *colon = strchr(tok, ':'), *end;
        double v = (colon != NULL) ? strtod(colon + 1, &end) : -1;

        if ((colon == NULL) || (end == colon + 1) || (*end != '\0') || !(v >= 0)) {
            kvf_error("bad value '%s' for --goodput: '%s' is not KEY:MS with MS >= 0",
                      o->goodput, tok);
            return -1;
        }
        *colon = '\0';
        if (strcmp(tok, "ttft") == 0) {
            o->p.slo_ttft_ms = v;
        } else if (strcmp(tok, "tpot") == 0) {
            o->p.slo_tpot_ms = v;
        } else if (strcmp(tok, "e2el") == 0) {
            o->p.slo_e2e_ms = v;
        } else {
            kvf_error("bad value '%s' for --goodput: unknown metric '%s' (ttft, tpot, e2el)",
                      o->goodput, tok);
            return -1;
        }
    }
    return 0;
}

/* A header name or value, or a request id prefix: no control characters (CR, LF end a
 * header line). */
static bool kvf_bs_header_safe(const char *v)
{
    for (; *v != '\0'; ++v) {
        if ((unsigned char)*v < 0x20) {
            return false;
        }
    }
    return true;
}

/* The sampling flags and --extra-body into o->p.extra_body. 0, or -1 (logged). */
static int kvf_bs_body_flags(kvf_bs_opts_t *o)
{
    cJSON *extra = cJSON_CreateObject(), *user = NULL, *it;
    char *text;
    int rc = -1;

    o->p.temperature_set = false;   /* vLLM sends no temperature unless asked */
    for (int i = 0; i < 7; ++i) {
        const char *v = o->sampling[i];
        char *end;
        double x;

        if (v[0] == '\0') {
            continue;
        }
        x = strtod(v, &end);
        if ((end == v) || (*end != '\0') || !isfinite(x) ||
            (kvf_bs_sampling[i].integer && (x != floor(x)))) {
            kvf_error("bad value '%s' for --%s: %s", v, kvf_bs_sampling[i].flag,
                      kvf_bs_sampling[i].integer ? "an integer" : "a number");
            goto out;
        }
        cJSON_AddNumberToObject(extra, kvf_bs_sampling[i].field, x);
    }
    if (o->extra_body[0] != '\0') {
        user = cJSON_Parse(o->extra_body);
        if (!cJSON_IsObject(user)) {
            kvf_error("bad value '%s' for --extra-body: not a JSON object", o->extra_body);
            goto out;
        }
        cJSON_ArrayForEach(it, user) {
            cJSON_DeleteItemFromObjectCaseSensitive(extra, it->string);
            cJSON_AddItemToObject(extra, it->string, cJSON_Duplicate(it, 1));
        }
    }
    text = cJSON_PrintUnformatted(extra);
    if ((text == NULL) || (strlen(text) >= sizeof(o->p.extra_body))) {
        kvf_error("--extra-body and the sampling flags make %zu bytes of JSON: at most %zu",
                  (text != NULL) ? strlen(text) : 0, sizeof(o->p.extra_body) - 1);
        free(text);
        goto out;
    }
    snprintf(o->p.extra_body, sizeof(o->p.extra_body), "%s",
             (cJSON_GetArraySize(extra) > 0) ? text : "");
    free(text);
    rc = 0;
out:
    cJSON_Delete(user);
    cJSON_Delete(extra);
    return rc;
}

/* --header, --request-id-prefix, --served-model-name, --tokenizer, --ramp-up-*. */
static int kvf_bs_vllm_flags(kvf_bs_opts_t *o)
{
    char buf[KVF_CONFIG_STR_MAX];
    size_t used = 0;
    struct stat st;

    snprintf(buf, sizeof(buf), "%s", o->header);
    for (char *save = NULL, *tok = strtok_r(buf, " ", &save); tok != NULL;
         tok = strtok_r(NULL, " ", &save)) {
        char *eq = strchr(tok, '=');
        int w;

        if ((eq == NULL) || (eq == tok) || !kvf_bs_header_safe(tok)) {
            kvf_error("bad value '%s' for --header: '%s' is not KEY=VALUE", o->header, tok);
            return -1;
        }
        *eq = '\0';
        w = snprintf(o->p.headers + used, sizeof(o->p.headers) - used, "%s: %s\r\n", tok,
                     eq + 1);
        if ((w < 0) || ((size_t)w >= sizeof(o->p.headers) - used)) {
            kvf_error("--header: too many headers");
            return -1;
        }
        used += (size_t)w;
    }
    if (strcmp(o->request_id_prefix, "auto") == 0) {
        uint32_t r = (uint32_t)time(NULL) ^ ((uint32_t)getpid() << 16);
        FILE *f = fopen("/dev/urandom", "r");

        if ((f != NULL) && (fread(&r, sizeof(r), 1, f) != 1)) {
            r ^= (uint32_t)clock();
        }
        if (f != NULL) {
            fclose(f);
        }
        snprintf(o->p.request_id_prefix, sizeof(o->p.request_id_prefix), "bench-%08x-", r);
    } else if ((strlen(o->request_id_prefix) >= sizeof(o->p.request_id_prefix) - 12) ||
               !kvf_bs_header_safe(o->request_id_prefix)) {
        kvf_error("bad value '%s' for --request-id-prefix: at most %zu printable characters",
                  o->request_id_prefix, sizeof(o->p.request_id_prefix) - 13);
        return -1;
    } else {   /* its length checked above (memcpy: no truncation warning at -O0) */
        memcpy(o->p.request_id_prefix, o->request_id_prefix,
               strlen(o->request_id_prefix) + 1);
    }
    if (o->served_model_name[0] != '\0') {   /* the name requests carry; --model is the id */
        snprintf(o->p.tokenizer_id, sizeof(o->p.tokenizer_id), "%s", o->p.model);
        snprintf(o->p.model, sizeof(o->p.model), "%s", o->served_model_name);
    }
    if (o->tokenizer[0] != '\0') {
        if (((o->tokenizer[0] == '/') || (o->tokenizer[0] == '.')) &&
            (stat(o->tokenizer, &st) != 0)) {
            kvf_error("bad value '%s' for --tokenizer: no such file or folder", o->tokenizer);
            return -1;
        }
        snprintf(o->p.tokenizer_id, sizeof(o->p.tokenizer_id), "%s", o->tokenizer);
    }
    if (o->ramp_up[0] != '\0') {
        if ((strcmp(o->ramp_up, "linear") != 0) && (strcmp(o->ramp_up, "exponential") != 0)) {
            kvf_error("bad value '%s' for --ramp-up-strategy (linear, exponential)", o->ramp_up);
            return -1;
        }
        if ((o->ramp_start < 0) || (o->ramp_end < 0)) {
            kvf_error("--ramp-up-strategy %s needs --ramp-up-start-rps and --ramp-up-end-rps",
                      o->ramp_up);
            return -1;
        }
        o->p.ramp_up = (strcmp(o->ramp_up, "linear") == 0) ? 1 : 2;
        o->p.ramp_start_rps = o->ramp_start;
        o->p.ramp_end_rps = o->ramp_end;
    }
    if (!(o->ready_timeout >= 0)) {
        kvf_error("bad value %g for --ready-check-timeout-sec: must be >= 0", o->ready_timeout);
        return -1;
    }
    o->p.keep_text = o->p.detailed;
    return kvf_bs_body_flags(o);
}

/* KVF_BS_DS_* of vLLM's datasets read from --dataset-path; -1 for any other name. */
static int kvf_bs_file_dataset(const char *name)
{
    return (strcmp(name, "sharegpt") == 0) ? KVF_BS_DS_SHAREGPT :
           (strcmp(name, "sonnet") == 0) ? KVF_BS_DS_SONNET :
           (strcmp(name, "burstgpt") == 0) ? KVF_BS_DS_BURSTGPT : -1;
}

/* --backend and --endpoint, which must match as in vLLM's benchmark; 0, or -1 (logged). */
static int kvf_bs_check_api(kvf_bs_opts_t *o)
{
    o->p.chat = (strcmp(o->backend, "openai-chat") == 0);
    if (!o->p.chat && (strcmp(o->backend, "openai") != 0) && (strcmp(o->backend, "vllm") != 0)) {
        kvf_error("bad value '%s' for --backend: openai or vllm (completions), openai-chat "
                  "(chat completions)", o->backend);
        return -1;
    }
    if (strcmp(o->p.endpoint, o->p.chat ? "/v1/chat/completions" : "/v1/completions") != 0) {
        kvf_error("bad value '%s' for --endpoint with --backend %s: give %s (as vLLM's "
                  "benchmark: the chat backend needs the chat endpoint)", o->p.endpoint,
                  o->backend, o->p.chat ? "/v1/chat/completions" : "/v1/completions");
        return -1;
    }
    return 0;
}

/* --dataset-name multi_turn's flags into o->p; -1 (logged) when one is bad. */
static int kvf_bs_setup_multi_turn(kvf_bs_opts_t *o)
{
    if (o->p.dataset[0] != '\0') {
        kvf_error("--dataset-name multi_turn takes no --dataset-path (%s)", o->p.dataset);
        return -1;
    }
    if ((o->mt_conversations < 1) || (o->mt_turns < 1) || (o->mt_first_len < 1) ||
        (o->mt_question_len < 1) || (o->mt_answer_len < 1)) {
        kvf_error("--multi-turn-conversations %d, -turns %d, -first-len %d, "
                  "-question-len %d, -answer-len %d: each at least 1",
                  o->mt_conversations, o->mt_turns, o->mt_first_len, o->mt_question_len,
                  o->mt_answer_len);
        return -1;
    }
    o->p.mt_conversations = o->mt_conversations;
    o->p.mt_turns = o->mt_turns;
    o->p.mt_first_len = o->mt_first_len;
    o->p.mt_question_len = o->mt_question_len;
    o->p.mt_answer_len = o->mt_answer_len;
    o->p.output_len = o->mt_answer_len;
    return 0;
}

/* Everything but the rates into o->p; 0, or -1 (logged). */
static int kvf_bs_setup(kvf_bs_opts_t *o)
{
    char url[KVF_CONFIG_STR_MAX + 32];

    if (kvf_bs_check_api(o) != 0) {
        return -1;
    }
    if (o->base_url[0] != '\0') {
        snprintf(url, sizeof(url), "%s", o->base_url);
    } else {
        snprintf(url, sizeof(url), "http://%s:%d", o->host, o->port);
    }
    if (kvf_bs_parse_url(o->base_url[0] ? "base-url" : "host", url, &o->p) != 0) {
        return -1;
    }
    if (o->dataset_name[0] == '\0') {
        snprintf(o->dataset_name, sizeof(o->dataset_name), "%s",
                 (o->p.dataset[0] != '\0') ? "custom" : "random");
    }
    if ((strcmp(o->dataset_name, "random") == 0) && (o->p.dataset[0] != '\0')) {
        kvf_error("--dataset-name random takes no --dataset-path (%s): use --dataset-name custom",
                  o->p.dataset);
        return -1;
    }
    if ((strcmp(o->dataset_name, "custom") == 0) && (o->p.dataset[0] == '\0')) {
        kvf_error("--dataset-name custom needs --dataset-path FILE.jsonl");
        return -1;
    }
    if (strcmp(o->dataset_name, "prefix_repetition") == 0) {
        if (o->p.dataset[0] != '\0') {
            kvf_error("--dataset-name prefix_repetition takes no --dataset-path (%s)",
                      o->p.dataset);
            return -1;
        }
        if ((o->rep_prefix_len < 0) || (o->rep_suffix_len < 0) ||
            (o->rep_prefix_len + o->rep_suffix_len < 1) || (o->rep_num_prefixes < 1) ||
            (o->rep_output_len < 1)) {
            kvf_error("--prefix-repetition-prefix-len %d, -suffix-len %d, -num-prefixes %d, "
                      "-output-len %d: lengths >= 0 with a prompt of at least 1 token, at "
                      "least 1 prefix and 1 output token", o->rep_prefix_len,
                      o->rep_suffix_len, o->rep_num_prefixes, o->rep_output_len);
            return -1;
        }
        o->p.rep_num_prefixes = o->rep_num_prefixes;
        o->p.rep_prefix_len = o->rep_prefix_len;
        o->p.rep_suffix_len = o->rep_suffix_len;
        o->p.output_len = o->rep_output_len;
    } else if (strcmp(o->dataset_name, "multi_turn") == 0) {
        if (kvf_bs_setup_multi_turn(o) != 0) {
            return -1;
        }
    } else if (kvf_bs_file_dataset(o->dataset_name) >= 0) {
        static const char *const what[] = {"", "a ShareGPT JSON file", "a text file of lines",
                                           "the BurstGPT CSV"};

        o->p.dataset_kind = kvf_bs_file_dataset(o->dataset_name);
        if (o->p.dataset[0] == '\0') {
            kvf_error("--dataset-name %s needs --dataset-path (%s)", o->dataset_name,
                      what[o->p.dataset_kind]);
            return -1;
        }
        if ((o->p.sharegpt_output_len == 0) || (o->p.sharegpt_output_len < -1)) {
            kvf_error("bad value %d for --sharegpt-output-len: must be >= 1",
                      o->p.sharegpt_output_len);
            return -1;
        }
        if ((o->p.sonnet_input_len < 1) || (o->p.sonnet_output_len < 1) ||
            (o->p.sonnet_prefix_len < 0)) {
            kvf_error("--sonnet-input-len %d, --sonnet-output-len %d, --sonnet-prefix-len %d: "
                      "lengths >= 1 (the prefix >= 0)", o->p.sonnet_input_len,
                      o->p.sonnet_output_len, o->p.sonnet_prefix_len);
            return -1;
        }
    } else if ((strcmp(o->dataset_name, "random") != 0) &&
               (strcmp(o->dataset_name, "custom") != 0)) {
        kvf_error("bad value '%s' for --dataset-name: not implemented in kvf bench-serve "
                  "(random, with --random-prefix-len; prefix_repetition; multi_turn; custom with "
                  "--dataset-path, JSONL with \"prompt\"; sharegpt, sonnet, burstgpt with "
                  "--dataset-path; vLLM's hf and the multimodal ones are not)",
                  o->dataset_name);
        return -1;
    }
    if (strcmp(o->dataset_name, "random") == 0) {
        o->p.ignore_eos = true;   /* vLLM's random dataset runs every request to its length */
    } else if (o->p.prefix_len > 0) {
        kvf_error("--random-prefix-len %d: only with --dataset-name random", o->p.prefix_len);
        return -1;
    }
    if ((kvf_bs_dist("input-dist", o->input_dist, &o->p.input_dist) != 0) ||
        (kvf_bs_dist("output-dist", o->output_dist, &o->p.output_dist) != 0)) {
        return -1;
    }
    if (!(o->range_ratio >= 0) || !(o->range_ratio < 1)) {
        kvf_error("bad value %g for --random-range-ratio: must be in [0, 1)", o->range_ratio);
        return -1;
    }
    if (o->range_ratio > 0) {
        o->p.input_dist = o->p.output_dist = KVF_BS_DIST_UNIFORM;
        o->p.input_spread = floor(o->p.input_len * o->range_ratio);
        o->p.output_spread = floor(o->p.output_len * o->range_ratio);
    }
    if (o->seed < 0) {
        kvf_error("bad value %d for --seed: must be >= 0", o->seed);
        return -1;
    }
    o->p.seed = (uint64_t)o->seed;
    if (kvf_bs_vllm_flags(o) != 0) {
        return -1;
    }
    if (strcmp(o->progress, "auto") == 0) {
        o->p.progress = isatty(STDERR_FILENO) && !o->disable_tqdm;
    } else if ((strcmp(o->progress, "yes") == 0) || (strcmp(o->progress, "no") == 0)) {
        o->p.progress = (strcmp(o->progress, "yes") == 0) && !o->disable_tqdm;
    } else {
        kvf_error("bad value '%s' for --progress (auto, yes, no)", o->progress);
        return -1;
    }
    return kvf_bs_metrics(o);
}

/* "inf" or "%g" of a rate. */
static void kvf_bs_rate_text(double rate, char *buf, size_t cap)
{
    if (rate > 0) {
        snprintf(buf, cap, "%g", rate);
    } else {
        snprintf(buf, cap, "inf");
    }
}

/*
 * The stem (no extension) of the result for @a rates: --result-filename
 * less ".json" (with -RATEqps when @a with_rate of several), else vLLM's
 * BACKEND-RATEqps[-concurrencyN]-MODEL-DATE, RATE the rates joined by "_".
 */
static void kvf_bs_stem(const kvf_bs_opts_t *o, const double *rates, int n, bool one,
                        const char *dt, char *out, size_t cap)
{
    char rt[KVF_CONFIG_STR_MAX] = "", conc[32] = "";
    const char *base = strrchr(o->p.model, '/');
    size_t used = 0;

    for (int i = 0; i < n; ++i) {
        char r[32];
        kvf_bs_rate_text(rates[i], r, sizeof(r));
        used += (size_t)snprintf(rt + used, sizeof(rt) - used, "%s%s", i ? "_" : "", r);
        if (used >= sizeof(rt)) {
            break;
        }
    }
    if (o->result_filename[0] != '\0') {
        size_t len = strlen(o->result_filename);
        if ((len > 5) && (strcmp(o->result_filename + len - 5, ".json") == 0)) {
            len -= 5;
        }
        snprintf(out, cap, "%s/%.*s%s%s%s", o->result_dir, (int)len, o->result_filename,
                 one ? "-" : "", one ? rt : "", one ? "qps" : "");
        return;
    }
    if (o->p.max_concurrency > 0) {
        snprintf(conc, sizeof(conc), "-concurrency%d", o->p.max_concurrency);
    }
    if (o->p.ramp_up != 0) {   /* vLLM's name for a ramp-up run */
        snprintf(rt, sizeof(rt), "ramp-up-%.16s-%gqps-%g", o->ramp_up, o->p.ramp_start_rps,
                 o->p.ramp_end_rps);
    }
    snprintf(out, cap, "%s/%s-%sqps%s-%s-%s", o->result_dir,
             (o->p.label[0] != '\0') ? o->p.label : o->backend, rt, conc,
             (base != NULL) ? base + 1 : o->p.model, dt);
}

/* Write one JSON document to @a path (@a append: after what it holds, one document per
 * line, as vLLM's --append-result). 0, or -1 (logged). */
static int kvf_bs_write(const char *path, cJSON *doc, bool append)
{
    char *text = append ? cJSON_PrintUnformatted(doc) : cJSON_Print(doc);
    FILE *f = fopen(path, append ? "a" : "w");
    int rc = 0;

    if ((f != NULL) && append && (ftell(f) > 0) && (fputc('\n', f) == EOF)) {
        rc = -1;
    }
    if ((text == NULL) || (f == NULL) || (fprintf(f, "%s%s", text, append ? "" : "\n") < 0)) {
        rc = -1;
    }
    if ((f != NULL) && (fclose(f) != 0)) {
        rc = -1;
    }
    if (rc != 0) {
        kvf_error("cannot write --save-result %s: %m", path);
    }
    free(text);
    return rc;
}

/* --save-result: the JSON per rate and the PNG. 0, or -1 (logged). */
static int kvf_bs_save(kvf_bs_opts_t *o, kvf_bs_summary_t *runs, const double *rates, int n,
                       const char *dt)
{
    char stem[PATH_MAX], path[PATH_MAX + 8];
    int rc = 0;

    if ((mkdir(o->result_dir, 0755) != 0) && (errno != EEXIST)) {
        kvf_error("cannot create --result-dir %s: %m", o->result_dir);
        return -1;
    }
    for (int r = 0; r < n; ++r) {
        cJSON *doc;
        o->p.request_rate = rates[r];
        doc = kvf_bs_json_obj(&o->p, &runs[r], dt, o->backend);
        kvf_bs_stem(o, &rates[r], 1, n > 1, dt, stem, sizeof(stem));
        snprintf(path, sizeof(path), "%s.json", stem);
        rc |= kvf_bs_write(path, doc, o->append_result);
        cJSON_Delete(doc);
        if (rc == 0) {
            fprintf(stderr, "kvf bench-serve: wrote %s\n", path);
        }
    }
    kvf_bs_stem(o, rates, n, false, dt, stem, sizeof(stem));
    snprintf(path, sizeof(path), "%s.png", stem);
    if (kvf_bs_plot(path, &o->p, runs, rates, n) > 0) {
        fprintf(stderr, "kvf bench-serve: wrote %s\n", path);
    } else {
        rc = -1;
    }
    return rc;
}

/* The runs' table or JSON on stdout. */
static void kvf_bs_report(kvf_bs_opts_t *o, kvf_bs_summary_t *runs, const double *rates, int n,
                          const char *dt)
{
    if (o->json) {
        cJSON *all = (n > 1) ? cJSON_CreateArray() : NULL, *doc = NULL;
        char *text;

        for (int r = 0; r < n; ++r) {
            o->p.request_rate = rates[r];
            doc = kvf_bs_json_obj(&o->p, &runs[r], dt, o->backend);
            if (all != NULL) {
                cJSON_AddItemToArray(all, doc);
            }
        }
        text = cJSON_Print((all != NULL) ? all : doc);
        printf("%s\n", text);
        free(text);
        cJSON_Delete((all != NULL) ? all : doc);
        return;
    }
    for (int r = 0; r < n; ++r) {
        o->p.request_rate = rates[r];
        kvf_bs_print_table(&o->p, &runs[r], stdout);
    }
}

/*
 * openai-chat sends text: a token-id prompt (random, prefix_repetition, custom ids) is decoded
 * with --tokenizer (a model folder or its tokenizer.json), as vLLM's benchmark decodes with
 * its tokenizer. 0 (loaded into @a tok, or not needed), -1 logged.
 */
static int kvf_bs_chat_tokenizer(kvf_bs_opts_t *o, kvf_tokenizer_t *tok)
{
    kvf_tok_config_t cfg;
    struct stat st;
    bool text_only = (strcmp(o->dataset_name, "sharegpt") == 0) ||
                     (strcmp(o->dataset_name, "sonnet") == 0);
    kvf_status_t status;

    if (!o->p.chat || ((o->tokenizer[0] == '\0') && text_only)) {
        return 0;
    }
    if ((o->tokenizer[0] == '\0') || (stat(o->tokenizer, &st) != 0)) {
        kvf_error("--backend openai-chat sends each prompt as a text message: give --tokenizer "
                  "DIR (the served model's folder; its tokenizer.json decodes the %s prompts' "
                  "token ids)%s", o->dataset_name,
                  (o->tokenizer[0] != '\0') ? ": --tokenizer is not a readable path" : "");
        return -1;
    }
    if (S_ISDIR(st.st_mode)) {
        status = kvf_tokenizer_load(o->tokenizer, (kvf_tok_config_load(o->tokenizer, &cfg) ==
                                                   KVF_OK) ? &cfg : NULL, tok);
    } else {
        status = kvf_tokenizer_load_file(o->tokenizer, NULL, tok);
    }
    if (status != KVF_OK) {
        kvf_error("--tokenizer %s: no tokenizer loaded (%s)", o->tokenizer,
                  kvf_status_str(status));
        return -1;
    }
    o->p.chat_tok = tok;
    return 0;
}

int kvf_cmd_bench_serve(int argc, char **argv)
{
    static char store[8192];
    char **args = calloc((size_t)argc + 1, sizeof(char *));
    kvf_bs_summary_t runs[KVF_BS_MAX_RATES];
    double rates[KVF_BS_MAX_RATES];
    kvf_bs_opts_t o;
    static kvf_tokenizer_t chat_tok;
    char dt[32];
    time_t now = time(NULL);
    int nargs, nrates, nrun = 0, rc = 0;
    bool done;

    if (args == NULL) {
        return 1;
    }
    nargs = kvf_bs_rewrite(argc, argv, args, store, sizeof(store));
    memset(&o, 0, sizeof(o));
    memset(runs, 0, sizeof(runs));
    kvf_bs_params_default(&o.p);
    if (kvf_config_parse(kvf_bs_table, "kvf bench-serve", nargs, args, &o, &done) != KVF_OK) {
        free(args);
        return 2;
    }
    free(args);
    if (done) {
        return 0;
    }
    nrates = kvf_config_number_list("request-rate", o.rates, 0, INFINITY, true, rates,
                                    KVF_BS_MAX_RATES);
    if ((nrates < 0) || (kvf_bs_setup(&o) != 0) || (kvf_bs_chat_tokenizer(&o, &chat_tok) != 0)) {
        kvf_tokenizer_cleanup(&chat_tok);
        return 2;
    }
    for (int r = 0; r < nrates; ++r) {
        o.p.request_rate = rates[r];
        if (kvf_bs_params_check(&o.p) != 0) {
            return 2;
        }
    }
    if (getenv("OPENAI_API_KEY") != NULL) {   /* as vLLM's client sends it */
        snprintf(o.p.api_key, sizeof(o.p.api_key), "%s", getenv("OPENAI_API_KEY"));
    }
    if (o.p.ramp_up != 0) {
        for (int r = 0; r < nrates; ++r) {
            if (rates[r] > 0) {
                kvf_error("--ramp-up-strategy sets the rate: give no --request-rate (%s)",
                          o.rates);
                return 2;
            }
        }
    }
    if ((o.p.model[0] == '\0') && (kvf_bs_fetch_model(&o.p) != 0)) {
        return 1;
    }
    if (kvf_bs_ready_check(&o.p, o.ready_timeout) != 0) {   /* names the server's error */
        return 1;
    }
    o.save_result |= o.append_result;
    strftime(dt, sizeof(dt), "%Y%m%d-%H%M%S", localtime(&now));
    for (; nrun < nrates; ++nrun) {
        o.p.request_rate = rates[nrun];
        if (kvf_bs_run(&o.p, &runs[nrun]) != 0) {
            rc = 1;
            break;
        }
        if (runs[nrun].completed == 0) {
            char r[32];
            kvf_bs_rate_text(rates[nrun], r, sizeof(r));
            kvf_error("kvf bench-serve: no request succeeded at request rate %s (%d sent)", r,
                      runs[nrun].sent);
            rc = 1;
        }
    }
    if (nrun > 0) {
        kvf_bs_report(&o, runs, rates, nrun, dt);
        if (o.save_result && (kvf_bs_save(&o, runs, rates, nrun, dt) != 0)) {
            rc = 1;
        }
        if ((o.csv[0] != '\0') && (kvf_bs_write_csv(&runs[nrun - 1], o.csv) != 0)) {
            rc = 1;
        }
    }
    for (int r = 0; r < nrun; ++r) {
        kvf_bs_summary_cleanup(&runs[r]);
    }
    kvf_tokenizer_cleanup(&chat_tok);
    return rc;
}
