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


/* ---- kvf_bs_request.c ---- */

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
