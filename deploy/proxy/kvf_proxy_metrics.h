/*
 * kvf-proxy metrics: counters and histograms the request flow updates, and
 * their Prometheus text rendering (exposition format 0.0.4). Thread-safe:
 * one mutex; every update is a few additions.
 */
#ifndef KVF_PROXY_METRICS_H
#define KVF_PROXY_METRICS_H

#include "kvf_status.h"

#include <stdint.h>
#include <stdio.h>

typedef struct kvf_proxy_metrics *kvf_proxy_metrics_h;

/* Monotonic counters. NOTE: keep in sync with the name table in kvf_proxy_metrics.c. */
typedef enum {
    KVF_PROXY_CTR_PROMPT_TOKENS = 0,    /* prompt tokens of requests sent to prefill */
    KVF_PROXY_CTR_GENERATION_TOKENS,    /* completion tokens relayed to clients */
    KVF_PROXY_CTR_KV_BYTES,             /* KV + Mamba bytes decode pulled */
    KVF_PROXY_CTR_KV_DESCRIPTORS,       /* transfer descriptors */
    KVF_PROXY_CTR_KV_READS,             /* (prefill rank -> decode rank) reads */
    KVF_PROXY_CTR_KV_RECOMPUTED,        /* requests whose load failed and were recomputed */
    KVF_PROXY_CTR_HANDSHAKE_REFUSALS,   /* requests failed with a handshake refusal */
    KVF_PROXY_CTR_PEER_ERRORS,          /* requests failed because a peer went away */
    KVF_PROXY_CTR_TIMEOUTS,             /* requests that ran out of time */
    KVF_PROXY_CTR_CLIENT_ABORTS,        /* clients that went away before the end */
    KVF_PROXY_CTR_DECODE_REROUTES,      /* sent to another decode: theirs went away in prefill */
    KVF_PROXY_CTR_COUNT
} kvf_proxy_counter_t;

/* Histograms, all in seconds. */
typedef enum {
    KVF_PROXY_HIST_TTFT = 0,            /* request received -> first token ready */
    KVF_PROXY_HIST_ITL,                 /* gap between consecutive tokens */
    KVF_PROXY_HIST_E2E,                 /* request received -> last token */
    KVF_PROXY_HIST_PREFILL,             /* prefill compute time as reported by prefill */
    KVF_PROXY_HIST_TRANSFER,            /* KV transfer time as reported by decode */
    KVF_PROXY_HIST_HANDSHAKE,           /* handshake time (only when one happened) */
    KVF_PROXY_HIST_FIRST_DECODE,        /* request received -> first reply from decode */
    KVF_PROXY_HIST_COUNT
} kvf_proxy_hist_t;

/*
 * Phases of the time to the first decoded token, in order; they add up to
 * KVF_PROXY_HIST_FIRST_DECODE (the last, unaccounted, is what no daemon
 * timed). Rendered as kvf_proxy_ttft_phase_seconds{phase="<name>"}.
 * NOTE: keep in sync with kvf_proxy_ttft_phase_names in kvf_proxy_metrics.c.
 */
typedef enum {
    KVF_PROXY_TTFT_PHASE_PROXY_QUEUE = 0,    /* proxy: flow start -> PrefillRequest queued */
    KVF_PROXY_TTFT_PHASE_PREFILL_QUEUE,      /* prefill: received -> first step over it */
    KVF_PROXY_TTFT_PHASE_PREFILL_COMPUTE,    /* prefill: first step -> first token sampled */
    KVF_PROXY_TTFT_PHASE_PREFILL_RELAY,      /* prefill leg round trip less prefill's own time */
    KVF_PROXY_TTFT_PHASE_PROXY_DISPATCH,     /* proxy: prefill answer -> DecodeRequest queued */
    KVF_PROXY_TTFT_PHASE_DECODE_QUEUE,       /* decode: received -> blocks allocated */
    KVF_PROXY_TTFT_PHASE_BLOCK_ALLOC,        /* decode: allocate, zero fresh attention blocks */
    KVF_PROXY_TTFT_PHASE_HANDSHAKE,
    KVF_PROXY_TTFT_PHASE_POSTING,            /* decode: plan and post the GETs */
    KVF_PROXY_TTFT_PHASE_WIRE,               /* decode: posted -> last GET landed */
    KVF_PROXY_TTFT_PHASE_POST_OPS,           /* decode: zero tails, release, commit */
    KVF_PROXY_TTFT_PHASE_FIRST_STEP,         /* decode: committed -> first token ready */
    KVF_PROXY_TTFT_PHASE_DECODE_RELAY,       /* decode leg to the first reply less decode's own time */
    KVF_PROXY_TTFT_PHASE_UNACCOUNTED,        /* measured total less the sum above */
    KVF_PROXY_TTFT_PHASE_COUNT
} kvf_proxy_ttft_phase_t;

/*
 * Why a request was refused before (or instead of) being served, for
 * kvf_proxy_rejected_total{reason="<name>"}; each such answer is a 503.
 * NOTE: keep in sync with kvf_proxy_reject_names in kvf_proxy_metrics.c.
 */
typedef enum {
    KVF_PROXY_REJECT_PREDICTED_WAIT = 0,  /* queued prompt work / recent rate > its deadline */
    KVF_PROXY_REJECT_QUEUE_FULL,          /* every candidate instance at --max-outstanding */
    KVF_PROXY_REJECT_NO_INSTANCE,         /* none healthy and not draining (or refused pairs) */
    KVF_PROXY_REJECT_INSTANCE_BUSY,       /* a daemon refused it: its queue full, or draining */
    KVF_PROXY_REJECT_CONNECTIONS,         /* a connection cap of the HTTP edge */
    KVF_PROXY_REJECT_SHUTDOWN,            /* the proxy is shutting down */
    KVF_PROXY_REJECT_COUNT
} kvf_proxy_reject_t;

/** "predicted_wait", "queue_full", ... ("?" out of range). */
const char *kvf_proxy_reject_name(kvf_proxy_reject_t reason);

/** Count one request refused for @a reason. */
void kvf_proxy_metrics_reject(kvf_proxy_metrics_h metrics, kvf_proxy_reject_t reason);

/** Requests refused for @a reason so far. */
uint64_t kvf_proxy_metrics_rejected(kvf_proxy_metrics_h metrics, kvf_proxy_reject_t reason);

/** "proxy_queue", "prefill_queue", ... (the JSON key is this with "_ms"). */
const char *kvf_proxy_ttft_phase_name(kvf_proxy_ttft_phase_t phase);

/** Record one observation of @a seconds for @a phase (negative values count as 0). */
void kvf_proxy_metrics_observe_phase(kvf_proxy_metrics_h metrics, kvf_proxy_ttft_phase_t phase,
                                     double seconds);

/** Allocate zeroed metrics; KVF_ERR_NO_MEMORY. */
kvf_status_t kvf_proxy_metrics_create(kvf_proxy_metrics_h *metrics_p);

/** Free @a metrics (NULL is a no-op). */
void kvf_proxy_metrics_destroy(kvf_proxy_metrics_h metrics);

/** Count one finished /v1/completions request answered with HTTP @a code. */
void kvf_proxy_metrics_request(kvf_proxy_metrics_h metrics, int code);

/** Add @a n to counter @a ctr. */
void kvf_proxy_metrics_add(kvf_proxy_metrics_h metrics, kvf_proxy_counter_t ctr, uint64_t n);

/** Record @a count observations of @a seconds into histogram @a hist. */
void kvf_proxy_metrics_observe(kvf_proxy_metrics_h metrics, kvf_proxy_hist_t hist,
                               double seconds, uint64_t count);

/** Adjust the in-flight request gauge by @a delta (+1 / -1). */
void kvf_proxy_metrics_in_flight(kvf_proxy_metrics_h metrics, int delta);

/**
 * Write every proxy metric in Prometheus text format to @a out: HELP and
 * TYPE lines, counters with a _total suffix, histograms as _bucket{le=..},
 * _sum and _count.
 */
void kvf_proxy_metrics_render(kvf_proxy_metrics_h metrics, FILE *out);

#endif
