/*
 * Continuous-batching scheduler.
 *
 * Design: the scheduler is a pure function of the request list and the block
 * manager; it owns no queue. The engine keeps requests in one array and
 * calls kvf_scheduler_schedule() once per step, so adding, aborting or
 * importing a request between steps needs no queue surgery. Requests are
 * ordered by arrival (insertion sort over pointers: a step holds tens of
 * requests, not thousands). Preemption is by recompute, as in vLLM: the
 * victim keeps its tokens and RNG state, loses its blocks, and is prefilled
 * again later over prompt + outputs, so its continuation is unchanged.
 * Rejected: swapping state to host memory (more code, and the tiny CPU
 * pools never need it).
 */
#include "kvf_scheduler.h"
#include "kvf_sampler.h"
#include "kvf_log.h"

#include <math.h>
#include <stdlib.h>

static void kvf_sort_by_arrival(kvf_request_t **v, int n)
{
    for (int i = 1; i < n; ++i) {
        kvf_request_t *x = v[i];
        int j = i - 1;
        while ((j >= 0) && (v[j]->arrival > x->arrival)) {
            v[j + 1] = v[j];
            --j;
        }
        v[j + 1] = x;
    }
}

static void kvf_preempt(kvf_block_manager_h bm, kvf_request_t *r)
{
    kvf_log(KVF_LOG_INFO, KVF_SUB_SCHED, "preempting request %llu (%d tokens computed)",
            (unsigned long long)r->id, r->num_computed);
    (void)kvf_block_manager_free(bm, &r->blocks);
    r->num_computed = 0;
    r->state = KVF_REQ_WAITING;
    r->preemptions++;
    r->prefix_hit = 0;   /* recomputed: the cache is asked again */
}

/* 1. decode tokens of running requests: one token each, preempting the
 * latest-arrived running request not yet scheduled when blocks run out. */
static kvf_status_t kvf_sched_decode(const kvf_scheduler_params_t *params, kvf_block_manager_h bm,
                                     kvf_request_t **v, int nv, kvf_sched_entry_t *plan,
                                     int *np_p, int *budget_p)
{
    int np = *np_p, budget = *budget_p;
    kvf_status_t status = KVF_OK;

    for (int i = 0; (i < nv) && (budget > 0) && (np < params->max_seqs); ++i) {
        kvf_request_t *r = v[i];
        if ((r->state != KVF_REQ_RUNNING) || (r->num_tokens - r->num_computed != 1)) {
            continue;
        }
        while (!kvf_block_manager_can_allocate(bm, &r->blocks, r->num_computed + 1)) {
            kvf_request_t *victim = NULL;
            for (int j = nv - 1; j >= 0; --j) {
                if ((v[j] != r) && (v[j]->state == KVF_REQ_RUNNING) && (v[j]->sched_tokens == 0)) {
                    victim = v[j];
                    break;
                }
            }
            if (victim == NULL) {
                break;
            }
            kvf_preempt(bm, victim);
        }
        status = kvf_block_manager_allocate(bm, &r->blocks, r->num_computed + 1);
        if (status == KVF_ERR_NO_RESOURCE) {
            status = KVF_OK;
            continue;    /* waits for blocks; nothing left to preempt */
        }
        if (status != KVF_OK) {
            break;
        }
        r->sched_tokens = 1;
        plan[np++] = (kvf_sched_entry_t){r, r->num_computed, 1, true};
        --budget;
    }
    *np_p = np;
    *budget_p = budget;
    return status;
}

/* Shares the prefill budget: want[i] are the tokens of v[i] in this step
 * (-1: not a prefill candidate). Pass 1, in arrival order: each candidate
 * gets up to cap; pass 2: what is left goes to the requests closest to done
 * first. */
static void kvf_sched_share(const kvf_scheduler_params_t *params, kvf_request_t **v, int nv,
                            int np, int budget, int *want)
{
    int cap = params->max_batch_tokens / 4;
    int ncand = 0;

    if (cap < 16) {
        cap = 16;
    }
    for (int i = 0; i < nv; ++i) {
        kvf_request_t *r = v[i];
        int remaining = r->num_tokens - r->num_computed;
        want[i] = -1;
        if ((np + ncand >= params->max_seqs) || (r->sched_tokens > 0) || (remaining <= 0) ||
            ((r->state == KVF_REQ_RUNNING) && (remaining == 1))) {
            continue;
        }
        want[i] = 0;
        ncand++;
    }
    for (int i = 0; (i < nv) && (budget > 0); ++i) {
        int take;
        if (want[i] < 0) {
            continue;
        }
        take = v[i]->num_tokens - v[i]->num_computed;
        take = (take < cap) ? take : cap;
        take = (take < budget) ? take : budget;
        want[i] = take;
        budget -= take;
    }
    while (budget > 0) {
        int best = -1, best_left = 0;
        for (int i = 0; i < nv; ++i) {
            int left = (want[i] < 0) ? 0 : v[i]->num_tokens - v[i]->num_computed - want[i];
            if ((want[i] > 0) && (left > 0) && ((best < 0) || (left < best_left))) {
                best = i;
                best_left = left;
            }
        }
        if (best < 0) {
            break;
        }
        best_left = (best_left < budget) ? best_left : budget;
        want[best] += best_left;
        budget -= best_left;
    }
}

/* Where a chunk of @a chunk tokens from r->num_computed ends: at the cache's cut when it
 * falls inside, else, short of the last known token, on the state grid; a chunk that does
 * not reach the next grid multiple waits for a step whose share does (0 tokens now), unless
 * the step budget itself is below the grid (then it runs as it is and the next one
 * realigns). Why wait: the chunked Mamba2 / Gated DeltaNet scans (kernels/kvf_ssd.h,
 * kvf_gdn.h) give the uncut prompt's bits only for cuts on the grid, so a cut placed by
 * what else is in the step would make a request's tokens depend on its batch. The price: while
 * decodes leave less than the rest of a grid step of budget, the chunk waits for them to
 * finish (a budget of at least the grid plus max_seqs never waits for that). Rejected:
 * waiting only when the budget holds the grid plus max_seqs (no wait ever stalls then, but a
 * smaller budget, 40 tokens beside 64 requests, would cut off the grid by load again). */
static int kvf_sched_cut(const kvf_scheduler_params_t *params, const kvf_request_t *r,
                         int chunk)
{
    const int start = r->num_computed;
    int end = start + chunk;

    if (chunk <= 0) {
        return chunk;
    }
    if ((r->chunk_cut > start) && (r->chunk_cut < end)) {
        end = r->chunk_cut;
    } else if ((params->state_grid > 0) && (end < r->num_tokens)) {
        const int on = end / params->state_grid * params->state_grid;
        if (on > start) {
            end = on;
        } else if (params->max_batch_tokens >= params->state_grid) {
            return 0;
        }
    }
    return end - start;
}

/* 2. prefill chunks. Each request waiting for prefill gets up to a quarter
 * of the step budget (so one long prompt cannot take a whole step while
 * others wait); what is left goes to the requests closest to done first (a
 * short prompt behind a long one finishes in this step). Then blocks are
 * allocated in arrival order (FCFS: stop at the first that does not fit).
 * Rejected: equal shares for all (processor sharing): under saturation every
 * request finishes late, together, and many miss their deadline. */
static kvf_status_t kvf_sched_prefill(const kvf_scheduler_params_t *params, kvf_block_manager_h bm,
                                      kvf_request_t **v, int nv, kvf_sched_entry_t *plan,
                                      int *np_p, int budget)
{
    int *want = calloc((size_t)(nv ? nv : 1), sizeof(*want));
    int np = *np_p;
    kvf_status_t status = KVF_OK;

    if (want == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    kvf_sched_share(params, v, nv, np, budget, want);
    for (int i = 0; i < nv; ++i) {
        kvf_request_t *r = v[i];
        int chunk = kvf_sched_cut(params, r, want[i]);
        if (chunk <= 0) {
            continue;
        }
        if (r->sampling.want_prompt_logprobs && (r->num_computed < r->prompt_len)) {
            chunk = 1;   /* each prompt position's logits: the last of its own chunk */
        }
        status = kvf_block_manager_allocate(bm, &r->blocks, r->num_computed + chunk);
        if (status == KVF_ERR_NO_RESOURCE) {
            status = KVF_OK;
            break;
        }
        if (status != KVF_OK) {
            break;
        }
        r->state = KVF_REQ_RUNNING;
        r->sched_tokens = chunk;
        plan[np++] = (kvf_sched_entry_t){r, r->num_computed, chunk,
                                         chunk == r->num_tokens - r->num_computed};
    }
    free(want);
    *np_p = np;
    return status;
}

kvf_status_t kvf_scheduler_schedule(const kvf_scheduler_params_t *params, kvf_block_manager_h bm,
                                    kvf_request_t **reqs, int n, kvf_sched_entry_t *plan,
                                    int *n_plan)
{
    kvf_request_t **v = malloc((size_t)(n ? n : 1) * sizeof(*v));
    int budget = params->max_batch_tokens, np = 0, nv = 0;
    kvf_status_t status;

    if (v == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    for (int i = 0; i < n; ++i) {
        reqs[i]->sched_tokens = 0;
        if ((reqs[i]->state == KVF_REQ_WAITING) || (reqs[i]->state == KVF_REQ_RUNNING)) {
            v[nv++] = reqs[i];
        }
    }
    kvf_sort_by_arrival(v, nv);

    status = kvf_sched_decode(params, bm, v, nv, plan, &np, &budget);
    if (status == KVF_OK) {
        status = kvf_sched_prefill(params, bm, v, nv, plan, &np, budget);
    }
    free(v);
    *n_plan = np;
    return status;
}

/* The sampler proper is kvf_sampler.h; these keep the request-level entry points. */
void kvf_sample_skip(kvf_request_t *req)
{
    kvf_sampler_skip(&req->sampling, &req->rng);
}

int32_t kvf_sample_token(kvf_request_t *req, const float *logits, int vocab)
{
    kvf_sample_out_t out;

    if (kvf_sampler_sample(&req->sampling, &req->rng, req->tokens, req->prompt_len,
                           req->num_tokens, logits, vocab, NULL, 0, &out) != KVF_OK) {
        return 0;   /* no memory for the scratch: the lowest id, as a greedy tie would */
    }
    return out.token;
}
