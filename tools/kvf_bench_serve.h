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
 */
#ifndef KVF_BENCH_SERVE_H
#define KVF_BENCH_SERVE_H

#include "kvf_config.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

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
    double        slo_ttft_ms, slo_tpot_ms, slo_e2e_ms;  /* 0 : no such SLO */
    bool          progress;                   /* progress bar on stderr */
} kvf_bs_params_t;

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
} kvf_bs_result_t;

typedef struct kvf_bs_stat {
    double mean, p50, p90, p99;
    int    n;
} kvf_bs_stat_t;

typedef struct kvf_bs_summary {
    double        duration_s;         /* first start to last finish */
    int           sent, completed, failed, good;
    int           num_kinds;
    char          kinds[8][24];       /* failure kinds, with counts */
    int           kind_counts[8];
    long long     input_tokens, output_tokens;
    double        request_throughput, output_throughput, total_throughput, goodput;
    kvf_bs_stat_t ttft, tpot, itl, e2e;
    double        transfer_share_mean;   /* < 0 : the proxy gave no breakdown */
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

/** The human table (stdout style) and the JSON document (malloc'd string). */
void kvf_bs_print_table(const kvf_bs_params_t *p, const kvf_bs_summary_t *s, FILE *out);
char *kvf_bs_json(const kvf_bs_params_t *p, const kvf_bs_summary_t *s);

/** One CSV row per request, with a header line. 0, or -1 (logged). */
int kvf_bs_write_csv(const kvf_bs_summary_t *s, const char *path);

#endif
