/*
 * SamplingParams (proto/kvf_serve.proto) to the engine's kvf_sampling_t, checked:
 * both role daemons take sampling parameters from a socket and trust none of them
 * (kvf_sampling_check(): vLLM's ranges), and logprobs from engine events into a
 * ServeReply.
 */
#ifndef KVF_SAMPLING_MSG_H
#define KVF_SAMPLING_MSG_H

#include "kvf_engine.h"
#include "kvf_serve.pb-c.h"

#include <stddef.h>

/**
 * Fill @a out from @a msg (NULL: defaults: greedy off, temperature 0, max_tokens
 * @a default_max) and check it.
 *
 * @param vocab  the model's vocabulary size (stop ids are checked against it)
 * @param [out] err  on failure: the field and its value, one line
 * @return KVF_OK; KVF_ERR_INVALID_PARAM.
 */
kvf_status_t kvf_sampling_from_msg(const Kvf__SamplingParams *msg, int default_max, int vocab,
                                   kvf_sampling_t *out, char *err, size_t cap);

/** Logprobs of replies: per token its logprob and top entries (owned, grown as needed). */
typedef struct kvf_logprob_buf {
    int      n;            /* tokens */
    int      cap;
    int      per_token;    /* top entries per token */
    float   *token_logprobs;
    int32_t *top_ids;      /* [cap][per_token] */
    float   *top_logprobs;
} kvf_logprob_buf_t;

/** Append the logprobs of @a ev (per_token of them: its sampling.logprobs). @return KVF_OK;
 *  KVF_ERR_NO_MEMORY. */
kvf_status_t kvf_logprob_buf_push(kvf_logprob_buf_t *b, int per_token,
                                  const kvf_engine_event_t *ev);

/** Point @a reply's logprob fields at @a b (which must outlive the reply's packing). */
void kvf_logprob_buf_attach(const kvf_logprob_buf_t *b, Kvf__ServeReply *reply);

/** Empty @a b (keeps its memory). */
void kvf_logprob_buf_clear(kvf_logprob_buf_t *b);

/** Free @a b's memory; safe on a zeroed buffer. */
void kvf_logprob_buf_free(kvf_logprob_buf_t *b);

#endif
