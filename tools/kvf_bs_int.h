/*
 * Internal to kvf bench-serve (kvf_bench_serve.c, kvf_bs_request.c,
 * kvf_bs_output.c): one request's job and what the parts call in each other.
 * kvf_bench_serve.c's opening comment describes the design.
 */
#ifndef KVF_BS_INT_H
#define KVF_BS_INT_H

#include "kvf_bench_serve.h"
#include "kvf_log.h"
#include "kvf_time.h"

#include <cjson/cJSON.h>
#include <netdb.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>

/* One request: what its thread needs and where it reports. */
typedef struct {
    const kvf_bs_params_t *p;
    const struct addrinfo *addr;
    uint64_t               t0_ns;       /* benchmark start */
    char                  *body;
    kvf_bs_result_t       *res;
    sem_t                 *slots;       /* NULL: unlimited */
    atomic_int            *done;
    atomic_int            *failed;
    pthread_t              thread;
} kvf_bs_job_t;


/* ---- kvf_bs_dataset.c ---- */

/* One prompt of a dataset. */
typedef struct {
    cJSON *line;        /* the parsed line, or the object built for it (owned) */
    cJSON *prompt;      /* its "prompt" item (owned by line): text or token ids */
    int    max_tokens;  /* 0: draw from the output distribution */
} kvf_bs_item_t;

typedef struct {
    kvf_bs_item_t *items;
    int            n, cap;
} kvf_bs_dataset_t;

/*
 * The prompts of p->dataset_kind from p->dataset (JSONL for custom; a ShareGPT JSON file, a
 * text file of lines for sonnet, a BurstGPT CSV), sampled with p->seed; the server at @a ai
 * counts tokens (POST /tokenize) where vLLM's benchmark does. Request i uses item
 * i % n. 0, or -1 with a line naming the flag, file and why (nothing to free then).
 */
int kvf_bs_dataset_open(const kvf_bs_params_t *p, const struct addrinfo *ai,
                        kvf_bs_dataset_t *d);

void kvf_bs_dataset_free(kvf_bs_dataset_t *d);

/* ---- kvf_bs_request.c ---- */

/* @a method @a path with the JSON @a req_body (NULL: none) on a connection of its own, the
 * answer's body into *@a body_p (malloc'd; NULL on failure). The HTTP status, or -1 with
 * @a res failed (connect, timeout, protocol). Waits at most 10 s. */
int kvf_bs_http(const kvf_bs_params_t *p, const struct addrinfo *ai, const char *method,
                const char *path, const char *req_body, char **body_p, kvf_bs_result_t *res);


/* Mark @a res failed with @a kind ("connect", "timeout", ...) and a message; the first failure stays. */
void kvf_bs_fail(kvf_bs_result_t *res, const char *kind, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The ready check's first half: GET /v1/models lists p->model. 0, or -1 with the server's
 * error text (or the names it serves) logged. */
int kvf_bs_check_model(const kvf_bs_params_t *p);

/* Thread body of one kvf_bs_job_t: the request, then its counts and its concurrency slot. */
void *kvf_bs_thread(void *arg);

/* Milliseconds from monotonic @a a to @a b (negative when b is earlier). */
static inline double kvf_bs_ms(uint64_t a, uint64_t b)
{
    return (double)((int64_t)(b - a)) / 1e6;
}

#endif
