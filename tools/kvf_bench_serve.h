/*
 * kvf bench-serve: a load generator against kvf-proxy's OpenAI API
 * (POST /v1/completions with stream: true), in the manner of `vllm bench
 * serve`. `kvf tune` drives the same engine at several rates.
 *
 * Timings are taken on the client: a request starts when its connection is
 * opened; TTFT ends at the first SSE chunk that carries a token; ITL is the
 * gap between chunks that carry tokens (split evenly over a chunk's tokens);
 * TPOT = (E2E - TTFT) / (output tokens - 1); E2E ends at the final chunk.
 * Goodput counts requests that succeeded and met every SLO that was given.
 *
 * Names follow `vllm bench serve`: the flags (cmd_bench_serve.c) and the
 * result JSON (kvf_bs_json(): completed, total_input_tokens, mean_ttft_ms,
 * median_ttft_ms, std_ttft_ms, p99_ttft_ms, ... for ttft, tpot, itl, e2el),
 * with kvferry's own figures (failures by kind, transfer share) beside them.
 */
#ifndef KVF_BENCH_SERVE_H
#define KVF_BENCH_SERVE_H

#include "kvf_config.h"

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#define KVF_BS_MAX_PCT 16   /* --metric-percentiles entries at most */

/* --percentile-metrics bits. */
enum {
    KVF_BS_M_TTFT = 1u << 0,
    KVF_BS_M_TPOT = 1u << 1,
    KVF_BS_M_ITL  = 1u << 2,
    KVF_BS_M_E2EL = 1u << 3,
};

typedef enum {
    KVF_BS_DIST_FIXED = 0,
    KVF_BS_DIST_UNIFORM,     /* [len - spread, len + spread] */
    KVF_BS_DIST_NORMAL,      /* mean len, standard deviation spread */
} kvf_bs_dist_t;

/** What to send and how fast. Lengths are in tokens, times in seconds unless named. */
typedef struct kvf_bs_params {
    char          host[KVF_CONFIG_STR_MAX];   /* proxy host (name or address) */
    int           port;
    char          model[KVF_CONFIG_STR_MAX];  /* "" : no "model" field in requests */
    char          endpoint[KVF_CONFIG_STR_MAX];/* request path, "/v1/completions" */
    bool          chat;                       /* openai-chat: messages, /v1/chat/completions */
    const struct kvf_tokenizer *chat_tok;     /* chat: decodes token-id prompts into the
                                               * user message (not owned); NULL: text only */
    char          api_key[KVF_CONFIG_STR_MAX];/* "" : no Authorization header */
    char          dataset[KVF_CONFIG_STR_MAX];/* JSONL file of prompts, "" : synthetic */
    int           input_len;
    kvf_bs_dist_t input_dist;
    double        input_spread;
    int           output_len;
    kvf_bs_dist_t output_dist;
    double        output_spread;
    int           token_lo, token_hi;         /* synthetic prompt ids in [lo, hi) */
    int           num_requests;               /* 0 : bounded by duration alone */
    double        duration_s;                 /* 0 : bounded by num_requests alone */
    double        request_rate;               /* requests/s; <= 0 : all at once */
    double        burstiness;                 /* gamma shape; 1 = Poisson */
    int           max_concurrency;            /* 0 : unlimited */
    int           warmup;                     /* requests run first, not counted */
    uint64_t      seed;
    double        temperature;
    bool          ignore_eos;
    double        timeout_s;                  /* per request */
    double        slo_ttft_ms, slo_tpot_ms, slo_e2e_ms;  /* < 0 : no such SLO (0 is one) */
    bool          progress;                   /* progress bar on stderr */
    unsigned      pct_metrics;                /* KVF_BS_M_* reported with percentiles */
    double        pct[KVF_BS_MAX_PCT];        /* percentiles reported, in (0, 100] */
    int           num_pct;
    bool          detailed;                   /* per-request arrays in the JSON */
    /* `vllm bench serve` parity (cmd_bench_serve.c sets these; the defaults keep what
     * kvf tune sends) */
    bool          temperature_set;            /* send "temperature" (default true) */
    char          extra_body[2048];           /* JSON object whose keys are merged into
                                               * each body (sampling flags, --extra-body);
                                               * "" : none */
    char          headers[2048];              /* "Key: Value\r\n" lines for each request */
    char          request_id_prefix[64];      /* x-request-id: prefix + index; "" : none */
    int           prefix_len;                 /* random: tokens of one prefix every prompt
                                               * starts with (--random-prefix-len) */
    int           ramp_up;                    /* 0 none, 1 linear, 2 exponential */
    double        ramp_start_rps, ramp_end_rps;
    bool          keep_text;                  /* results keep the generated text */
    char          label[KVF_CONFIG_STR_MAX];  /* result JSON "label"; "" : null */
    char          tokenizer_id[KVF_CONFIG_STR_MAX]; /* result JSON; "" : the model */
    /* vLLM's prefix_repetition dataset (rep_num_prefixes > 0): each prompt is one of
     * rep_num_prefixes fixed prefixes of rep_prefix_len tokens, then rep_suffix_len
     * tokens of its own; output_len as max_tokens */
    int           rep_num_prefixes, rep_prefix_len, rep_suffix_len;
    /* multi_turn (mt_conversations > 0): request i is turn (i / C) % T of conversation
     * i % C; its prompt is the conversation so far: a first question of mt_first_len tokens,
     * then per earlier turn an answer of mt_answer_len tokens and a question of
     * mt_question_len, each drawn from a seed of (conversation, turn); max_tokens is
     * mt_answer_len. The earlier answers are drawn, not the server's (the prompts do not wait
     * for replies), so the workload is fixed; a prefix cache sees the same sharing. */
    int           mt_conversations, mt_turns, mt_first_len, mt_question_len, mt_answer_len;
    /* --dataset-path's format (kvf_bs_dataset.c): KVF_BS_DS_*; sharegpt's fixed output
     * length (-1: each conversation's second turn, counted) and sonnet's lengths */
    int           dataset_kind;
    int           sharegpt_output_len;
    int           sonnet_input_len, sonnet_output_len, sonnet_prefix_len;
} kvf_bs_params_t;

/* kvf_bs_params_t.dataset_kind: what --dataset-path holds. */
enum {
    KVF_BS_DS_CUSTOM = 0,    /* JSONL: {"prompt": text | [ids], "max_tokens": n} per line */
    KVF_BS_DS_SHAREGPT,      /* vLLM's sharegpt: JSON list of {"conversations": [...]} */
    KVF_BS_DS_SONNET,        /* vLLM's sonnet: a text file of lines */
    KVF_BS_DS_BURSTGPT,      /* vLLM's burstgpt: the BurstGPT trace CSV */
};

/** One measured request. Times in milliseconds. */
typedef struct kvf_bs_result {
    int      index;
    double   start_ms;            /* since the benchmark started */
    double   end_ms;              /* final chunk, or the failure */
    int      prompt_tokens;       /* as sent (synthetic) or as the proxy counted */
    int      max_tokens;
    int      output_tokens;
    bool     ok;
    char     error_kind[24];      /* "" when ok: connect, timeout, http_NNN, stream_error, protocol */
    int      http_code;
    char     error[160];
    double   ttft_ms, tpot_ms, e2e_ms;   /* tpot_ms < 0 : fewer than 2 tokens */
    double  *itl_ms;              /* output_tokens - 1 gaps (owned) */
    int      num_itl;
    bool     good;                /* ok and within every SLO */
    /* what the proxy reported in the final chunk (< 0 : absent) */
    double   proxy_ttft_ms;
    double   transfer_ms, handshake_ms;
    double   kv_bytes;
    double   first_decode_ms;     /* ttft_breakdown.time_to_first_decode_token_ms */
    double   transfer_share;      /* transfer phases / time to first decode token */
    char     prefill_instance[64], decode_instance[64];
    double   arrival_ms;          /* when it was due (before waiting for a concurrency slot) */
    char    *text;                /* generated text with p->keep_text (owned), else NULL */
    size_t   text_len;
} kvf_bs_result_t;

typedef struct kvf_bs_stat {
    double  mean, std, p50, p90, p99;   /* std: population (numpy's default) */
    int     n;
    double *v;                          /* the n values, sorted (owned) */
} kvf_bs_stat_t;

typedef struct kvf_bs_summary {
    double        duration_s;         /* first start to last finish */
    int           sent, completed, failed, good;
    int           num_kinds;
    char          kinds[8][24];       /* failure kinds, with counts */
    int           kind_counts[8];
    char          kind_first_error[8][160];   /* the first error text of each kind */
    long long     input_tokens, output_tokens;
    double        request_throughput, output_throughput, total_throughput, goodput;
    kvf_bs_stat_t ttft, tpot, itl, e2e;
    double        transfer_share_mean;   /* < 0 : the proxy gave no breakdown */
    int           max_concurrent;     /* most requests in flight at one time */
    double        max_output_tps;     /* most output tokens in one 1 s window */
    kvf_bs_result_t *results;         /* sent entries, in index order (owned) */
} kvf_bs_summary_t;

/** Defaults for every field (what kvf bench-serve uses without flags). */
void kvf_bs_params_default(kvf_bs_params_t *p);

/**
 * Parse "http://HOST:PORT" (a trailing "/" allowed; no https) into
 * p->host and p->port. 0, or -1 with a logged line naming @a flag.
 */
int kvf_bs_parse_url(const char *flag, const char *url, kvf_bs_params_t *p);

/** Check ranges; 0, or -1 with a logged line naming the flag and value. */
int kvf_bs_params_check(const kvf_bs_params_t *p);

/**
 * Run the benchmark: warm-up, then the measured requests. Blocks until every
 * request finished or timed out.
 * @return 0 (summary filled; free with kvf_bs_summary_cleanup()), -1 when
 *         the run could not start (warm-up failed, dataset unreadable); a
 *         line naming why is logged.
 */
int kvf_bs_run(const kvf_bs_params_t *p, kvf_bs_summary_t *summary_p);

void kvf_bs_summary_cleanup(kvf_bs_summary_t *s);

/** Percentile @a q in [0, 100] of @a st's values, linearly interpolated (numpy's default); 0 when empty. */
double kvf_bs_percentile(const kvf_bs_stat_t *st, double q);

/**
 * The model name the proxy serves (the first id of GET /v1/models) into
 * p->model. 0, or -1 with a logged line (proxy unreachable, no model listed).
 */
int kvf_bs_fetch_model(kvf_bs_params_t *p);

/**
 * A PNG of TTFT and ITL percentiles (median and p->pct) against request
 * rate, one point per run, through gnuplot. @a rates[i] <= 0 is "inf".
 * @return 1 written, 0 skipped (no gnuplot; a line says so), -1 failed (logged).
 */
int kvf_bs_plot(const char *png, const kvf_bs_params_t *p, const kvf_bs_summary_t *runs,
                const double *rates, int n);

/** Path of an executable gnuplot ($PATH, then /usr/bin, /usr/local/bin, /bin) into @a buf;
 * false when none is installed. */
bool kvf_bs_find_gnuplot(char *buf, size_t cap);

/**
 * Run @a gnuplot on @a script with its stdout discarded and its stderr
 * (warnings, errors) put in @a err (@a cap bytes, one line, NUL-terminated)
 * instead of this process's output: callers show it only when the plot
 * failed. @return gnuplot's exit code, or -1 when it could not be started.
 */
int kvf_bs_run_gnuplot(const char *gnuplot, const char *script, char *err, size_t cap);

/**
 * vLLM's ready check before a run: the model p->model must be one the server
 * lists (GET /v1/models), then with @a timeout_s > 0 one request (the first
 * prompt, max_tokens 1... as p sends it) is retried until it is answered
 * 200 or @a timeout_s passes; a 4xx answer ends it at once. On failure a
 * line with the server's own error text is logged. 0 ready, -1 not.
 */
int kvf_bs_ready_check(const kvf_bs_params_t *p, double timeout_s);

/** The human table (stdout style) and the JSON document (malloc'd string). */
void kvf_bs_print_table(const kvf_bs_params_t *p, const kvf_bs_summary_t *s, FILE *out);

/**
 * The result as `vllm bench serve --save-result` writes it: date, backend,
 * model_id, num_prompts, request_rate ("inf" or req/s), burstiness,
 * max_concurrency, duration (s), completed, failed, total_input_tokens,
 * total_output_tokens, request_throughput, request_goodput (null without an
 * SLO), output_throughput, total_token_throughput, max_output_tokens_per_s,
 * max_concurrent_requests, then mean_/median_/std_/pNN_{ttft,tpot,itl,e2el}_ms
 * for p->pct_metrics and p->pct; with p->detailed input_lens, output_lens,
 * ttfts (s), itls (s), start_times (s since the run began), generated_texts,
 * errors; always endpoint_type, label, latencies (s), queue_times (s waiting for
 * a concurrency slot), rtfx (0: not a speech benchmark), ramp_up_* when used.
 * kvferry's own: sent, good, failures (by kind), failure_examples (the first
 * error text of each kind), transfer_share, url. Returns a cJSON object (owned by
 * the caller).
 */
cJSON *kvf_bs_json_obj(const kvf_bs_params_t *p, const kvf_bs_summary_t *s, const char *date,
                       const char *backend);

/** kvf_bs_json_obj() printed (malloc'd string). */
char *kvf_bs_json(const kvf_bs_params_t *p, const kvf_bs_summary_t *s);

/** One CSV row per request, with a header line. 0, or -1 (logged). */
int kvf_bs_write_csv(const kvf_bs_summary_t *s, const char *path);

#endif
