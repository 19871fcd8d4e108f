/*
 * Engine core: glue between the scheduler (what runs), the block manager
 * (where it lives), the TP runner (compute) and sampling.
 *
 * Design: requests live in one array owned by the engine; a step builds a
 * kvf_fwd_batch_t whose per-request block-table pointers point straight
 * into each request's kvf_req_blocks_t, so no table is copied per step.
 * Fresh attention blocks are taken from the block manager after scheduling
 * and zeroed by every rank on its own pool inside the step, before the
 * forward reads them (docs/ARCHITECTURE.md §1). Logits come back only for requests
 * whose chunk reaches their last known token, since only those sample.
 */
#include "kvf_engine.h"
#include "kvf_engine_prefix.h"
#include "kvf_engine_window.h"
#include "kvf_fingerprint.h"
#include "kvf_sampler.h"
#include "kvf_array.h"
#include "kvf_contract.h"
#include "kvf_time.h"
#include "kvf_log.h"
#include "kvf_gemm.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

/* kvf_engine.h: one thread, the leader that created the engine, calls everything
 * but the three getters of handles fixed at create. Checked in debug builds. */
#define KVF_ENGINE_CHECK(_e, _fn) \
    KVF_OWNER_CHECK(&(_e)->leader, _fn " (the engine's leader thread only)")

struct kvf_engine {
    kvf_thread_owner_t     leader;     /* the thread that called create (kvf_engine.h) */
    kvf_model_h            model;
    kvf_tp_runner_h        runner;
    kvf_block_manager_h    bm;
    kvf_engine_prefix_h    prefix;     /* NULL: no prefix cache */
    kvf_scheduler_params_t sched;
    const kvf_model_config_t *cfg;

    kvf_request_t        **reqs;
    int                    num_reqs, cap_reqs;
    uint64_t               next_id;
    uint64_t               next_arrival;

    /* per-step scratch */
    kvf_sched_entry_t     *plan;
    kvf_fwd_seq_t         *seqs;
    float                 *logits;     /* [max_seqs][vocab] */
    int32_t               *greedy;     /* [max_seqs] greedy ids from the forward's argmax */
    bool                   dev_sample; /* the model is on a GPU: sample there (kvf_sample.h) */
    kvf_sample_row_t      *srow;       /* [max_seqs] device sampling rows */
    kvf_sample_res_t      *sres;       /* [max_seqs] their results */
    kvf_sample_pen_t      *pen;        /* the step's penalty entries */
    int                    cap_pen;
    int32_t               *fresh;
    int                    cap_fresh;
    kvf_engine_stats_t     stats;
    int                    win[KVF_MAX_KV_GROUPS];   /* groups whose every layer slides */
    bool                   window_free;  /* give back blocks leaving the window */
};

static kvf_request_t *kvf_find(kvf_engine_h e, uint64_t id, int *idx_p)
{
    for (int i = 0; i < e->num_reqs; ++i) {
        if (e->reqs[i]->id == id) {
            if (idx_p != NULL) {
                *idx_p = i;
            }
            return e->reqs[i];
        }
    }
    return NULL;
}

static void kvf_req_free(kvf_request_t *r)
{
    kvf_engine_prefix_forget(r);
    free(r->salt);
    free(r->tokens);
    free(r->logits);
    free(r->plp.logprob);
    free(r->plp.rank);
    free(r->plp.top_ids);
    free(r->plp.top_logprobs);
    free(r);
}

/* The scheduler's state grid (a model with Mamba layers: whether the cache is on or off,
 * so the two chunk a prompt alike but for the cache's one extra cut) and the cache. */
static kvf_status_t kvf_engine_prefix_setup(kvf_engine_h e, const kvf_engine_params_t *params)
{
    const kvf_cache_layout_t *lay = kvf_tp_runner_layout(e->runner);
    const kvf_engine_prefix_params_t *pp = &params->prefix;
    uint8_t digest[16];
    kvf_status_t status;

    if (pp->state_grid < 0) {
        kvf_error("engine: prefix state grid %d tokens must be positive", pp->state_grid);
        return KVF_ERR_INVALID_PARAM;
    }
    for (int g = 0; g < lay->num_groups; ++g) {
        if (lay->groups[g].kind == KVF_GROUP_MAMBA) {
            e->sched.state_grid = (pp->state_grid > 0) ? pp->state_grid :
                                  KVF_PREFIX_STATE_GRID_DEFAULT;
        }
    }
    if (!pp->enabled) {
        return KVF_OK;
    }
    if (pp->digest != NULL) {
        memcpy(digest, pp->digest, sizeof(digest));
    } else {
        kvf_model_digest_t md;
        status = kvf_model_digest(params->model_dir, 0, &md);
        if (status == KVF_OK) {
            status = kvf_block_hash_digest_from_hex(md.hex, digest);
        }
        if (status != KVF_OK) {
            kvf_error("engine: no weights digest of %s for the prefix cache's keys",
                      params->model_dir);
            return status;
        }
    }
    return kvf_engine_prefix_create(pp, digest, e->runner, e->bm, &e->prefix);
}

/* Whether plan entry @a pe computes a prompt position whose logits score the next prompt
 * token (sampling.want_prompt_logprobs). */
static bool kvf_scores_prompt(const kvf_sched_entry_t *pe)
{
    const kvf_request_t *r = pe->req;

    return r->sampling.want_prompt_logprobs && !pe->samples &&
           (pe->start + pe->num_tokens < r->prompt_len);
}

/* The prompt token after @a pe's last position, scored from that position's logits. */
static kvf_status_t kvf_engine_prompt_lp(kvf_engine_h e, const kvf_sched_entry_t *pe,
                                         const float *logits)
{
    kvf_request_t *r = pe->req;
    kvf_prompt_logprobs_t *p = &r->plp;
    int pos = pe->start + pe->num_tokens, per = r->sampling.prompt_logprobs, i;
    kvf_sample_out_t so;

    if (p->logprob == NULL) {
        size_t n = (size_t)r->prompt_len;
        p->per = per;
        p->logprob = malloc(n * sizeof(float));
        p->rank = malloc(n * sizeof(int32_t));
        p->top_ids = malloc(n * (size_t)(per ? per : 1) * sizeof(int32_t));
        p->top_logprobs = malloc(n * (size_t)(per ? per : 1) * sizeof(float));
        if ((p->logprob == NULL) || (p->rank == NULL) || (p->top_ids == NULL) ||
            (p->top_logprobs == NULL)) {
            return KVF_ERR_NO_MEMORY;
        }
    }
    i = pos - 1;   /* entry of prompt token pos */
    kvf_sampler_score(logits, e->cfg->vocab_size, r->tokens[pos], per, &so, &p->rank[i]);
    p->logprob[i] = so.logprob;
    for (int k = 0; k < per; ++k) {   /* fewer only when the vocabulary is smaller: id -1 */
        p->top_ids[(size_t)i * (size_t)per + (size_t)k] = (k < so.num_top) ? so.top_ids[k] : -1;
        p->top_logprobs[(size_t)i * (size_t)per + (size_t)k] =
            (k < so.num_top) ? so.top_logprobs[k] : 0.0f;
    }
    p->n = (i + 1 > p->n) ? i + 1 : p->n;
    return KVF_OK;
}

kvf_status_t kvf_engine_create(const kvf_engine_params_t *params, kvf_engine_h *engine_p)
{
    kvf_tp_runner_params_t rp = {0};
    kvf_block_manager_params_t bp = {0};
    kvf_engine_h e;
    kvf_status_t status;

    if ((params->field_mask & ~KVF_ENGINE_PARAM_FIELDS_KNOWN) || (params->model_dir == NULL) ||
        (params->tp_size < 1)) {
        kvf_error("engine: unknown params bits 0x%llx, no model dir or tp_size %d < 1",
                  (unsigned long long)(params->field_mask & ~KVF_ENGINE_PARAM_FIELDS_KNOWN),
                  params->tp_size);
        return KVF_ERR_INVALID_PARAM;
    }
    e = calloc(1, sizeof(*e));
    if (e == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    KVF_OWNER_SET(&e->leader);
    e->next_id = 1;
    e->sched.max_batch_tokens = (params->field_mask & KVF_ENGINE_PARAM_FIELD_MAX_BATCH_TOKENS) ?
                                params->max_batch_tokens : 512;
    e->sched.max_seqs = (params->field_mask & KVF_ENGINE_PARAM_FIELD_MAX_SEQS) ?
                        params->max_seqs : 64;
    if ((e->sched.max_batch_tokens < 1) || (e->sched.max_seqs < 1)) {
        kvf_error("engine: max_batch_tokens %d and max_seqs %d must be positive",
                  e->sched.max_batch_tokens, e->sched.max_seqs);
        status = KVF_ERR_INVALID_PARAM;
        goto err;
    }
    {
        /* TP 1: one rank thread, so the kernels may have the cores (KVF_BLAS_THREADS,
         * 1..64, default 1); TP > 1: each rank is a thread already, its kernels one */
        const char *env = getenv("KVF_BLAS_THREADS");
        char *end = NULL;
        long blas = (env != NULL) ? strtol(env, &end, 10) : 1;
        if ((env != NULL) && ((end == env) || (*end != '\0') || (blas < 1) || (blas > 64))) {
            kvf_error("engine: bad value '%s' for KVF_BLAS_THREADS (threads of a TP 1 "
                      "instance's kernels: 1..64)", env);
            status = KVF_ERR_INVALID_PARAM;
            goto err;
        }
        kvf_gemm_set_threads((params->tp_size == 1) ? (int)blas : 1);
    }
    status = kvf_model_load_device(params->model_dir, params->tp_size,
                                   (params->field_mask & KVF_ENGINE_PARAM_FIELD_DEVICE) ?
                                   &params->device : NULL, &e->model);
    if (status != KVF_OK) {
        goto err;
    }
    e->cfg = kvf_model_get_config(e->model);

    rp.model = e->model;
    if (params->field_mask & KVF_ENGINE_PARAM_FIELD_NUM_BLOCKS) {
        rp.field_mask |= KVF_TP_RUNNER_PARAM_FIELD_NUM_BLOCKS;
        rp.num_blocks = params->num_blocks;
    }
    if (params->field_mask & KVF_ENGINE_PARAM_FIELD_CACHE) {
        rp.field_mask |= KVF_TP_RUNNER_PARAM_FIELD_CACHE;
        rp.cache = params->cache;
    }
    if (params->field_mask & KVF_ENGINE_PARAM_FIELD_NO_ZERO) {
        rp.field_mask |= KVF_TP_RUNNER_PARAM_FIELD_NO_ZERO;
        rp.disable_zeroing = params->disable_zeroing;
    }
    if (params->field_mask & KVF_ENGINE_PARAM_FIELD_POOL_ALLOC) {
        rp.field_mask |= KVF_TP_RUNNER_PARAM_FIELD_POOL_ALLOC;
        rp.pool_alloc = params->pool_alloc;
        rp.pool_alloc_ctx = params->pool_alloc_ctx;
    }
    rp.field_mask |= KVF_TP_RUNNER_PARAM_FIELD_STEP_LIMITS;   /* workspaces sized at start */
    rp.max_batch_tokens = e->sched.max_batch_tokens;
    rp.max_seqs = e->sched.max_seqs;
    status = kvf_tp_runner_create(&rp, &e->runner);
    if (status != KVF_OK) {
        goto err;
    }
    bp.field_mask = KVF_BLOCK_MANAGER_PARAM_FIELD_NUM_BLOCKS |
                    KVF_BLOCK_MANAGER_PARAM_FIELD_BLOCK_SIZE | KVF_BLOCK_MANAGER_PARAM_FIELD_LAYOUT;
    bp.num_blocks = kvf_tp_runner_num_blocks(e->runner);
    bp.block_size = kvf_tp_runner_geometry(e->runner, 0)->block_size;
    bp.layout = kvf_tp_runner_layout(e->runner);
    status = kvf_block_manager_create(&bp, &e->bm);
    if (status != KVF_OK) {
        goto err;
    }
    e->window_free = !params->keep_window_blocks &&
                     kvf_engine_window_groups(e->cfg, bp.layout, e->win);
    if (params->field_mask & KVF_ENGINE_PARAM_FIELD_PREFIX) {
        status = kvf_engine_prefix_setup(e, params);
        if (status != KVF_OK) {
            goto err;
        }
    }
    e->plan = calloc((size_t)e->sched.max_seqs, sizeof(*e->plan));
    e->seqs = calloc((size_t)e->sched.max_seqs, sizeof(*e->seqs));
    e->logits = malloc((size_t)e->sched.max_seqs * (size_t)e->cfg->vocab_size * sizeof(float));
    e->greedy = malloc((size_t)e->sched.max_seqs * sizeof(int32_t));
    e->srow = calloc((size_t)e->sched.max_seqs, sizeof(*e->srow));
    e->sres = calloc((size_t)e->sched.max_seqs, sizeof(*e->sres));
    e->dev_sample = (params->field_mask & KVF_ENGINE_PARAM_FIELD_DEVICE) &&
                    (params->device.kind == KVF_DEVICE_CUDA);
    e->cap_fresh = bp.num_blocks;
    e->fresh = malloc((size_t)e->cap_fresh * sizeof(int32_t));
    if ((e->plan == NULL) || (e->seqs == NULL) || (e->logits == NULL) || (e->fresh == NULL) ||
        (e->greedy == NULL) || (e->srow == NULL) || (e->sres == NULL)) {
        status = KVF_ERR_NO_MEMORY;
        goto err;
    }
    kvf_log(KVF_LOG_INFO, KVF_SUB_MODEL, "engine: tp %d, %d blocks of %d tokens, page %zu bytes",
            params->tp_size, bp.num_blocks, bp.block_size,
            kvf_tp_runner_geometry(e->runner, 0)->page_size);
    *engine_p = e;
    return KVF_OK;

err:
    kvf_engine_destroy(e);
    return status;
}

void kvf_engine_destroy(kvf_engine_h e)
{
    if (e == NULL) {
        return;
    }
    KVF_ENGINE_CHECK(e, "kvf_engine_destroy");
    for (int i = 0; i < e->num_reqs; ++i) {
        if (e->bm != NULL) {
            (void)kvf_block_manager_free(e->bm, &e->reqs[i]->blocks);
        }
        kvf_req_free(e->reqs[i]);
    }
    free(e->reqs);
    kvf_engine_prefix_destroy(e->prefix);   /* un-caches its blocks; frees its memory */
    kvf_block_manager_destroy(e->bm);
    kvf_tp_runner_destroy(e->runner);
    kvf_model_destroy(e->model);
    free(e->plan);
    free(e->seqs);
    free(e->logits);
    free(e->greedy);
    free(e->srow);
    free(e->sres);
    free(e->pen);
    free(e->fresh);
    free(e);
}

static kvf_status_t kvf_tokens_push(kvf_request_t *r, int32_t tok)
{
    if (KVF_ARRAY_GROW(r->tokens, r->cap_tokens, r->num_tokens + 1, 64) != KVF_OK) {
        return KVF_ERR_NO_MEMORY;
    }
    r->tokens[r->num_tokens++] = tok;
    return KVF_OK;
}

static kvf_status_t kvf_new_request(kvf_engine_h e, const kvf_req_params_t *p, kvf_request_t **r_p)
{
    kvf_request_t *r;

    if ((p->prompt == NULL) || (p->prompt_len < 1) || (p->sampling.max_tokens < 1)) {
        kvf_error("request: empty prompt (%d tokens) or max_tokens %d < 1", p->prompt_len,
                  p->sampling.max_tokens);
        return KVF_ERR_INVALID_PARAM;
    }
    for (int i = 0; i < p->prompt_len; ++i) {
        if ((p->prompt[i] < 0) || (p->prompt[i] >= e->cfg->vocab_size)) {
            kvf_error("request: prompt token %d = %d is outside the vocabulary [0, %d)", i,
                      p->prompt[i], e->cfg->vocab_size);
            return KVF_ERR_INVALID_PARAM;
        }
    }
    if ((p->cache_salt_len > KVF_CACHE_SALT_MAX) ||
        ((p->cache_salt == NULL) && (p->cache_salt_len > 0))) {
        kvf_error("request: cache_salt of %zu bytes (at most %d)", p->cache_salt_len,
                  KVF_CACHE_SALT_MAX);
        return KVF_ERR_INVALID_PARAM;
    }
    if (KVF_ARRAY_GROW(e->reqs, e->cap_reqs, e->num_reqs + 1, 16) != KVF_OK) {
        return KVF_ERR_NO_MEMORY;
    }
    r = calloc(1, sizeof(*r));
    if (r == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    r->cap_tokens = p->prompt_len + p->sampling.max_tokens;
    r->tokens = malloc((size_t)r->cap_tokens * sizeof(int32_t));
    if (r->tokens == NULL) {
        free(r);
        return KVF_ERR_NO_MEMORY;
    }
    if (p->cache_salt_len > 0) {
        r->salt = malloc(p->cache_salt_len);
        if (r->salt == NULL) {
            free(r->tokens);
            free(r);
            return KVF_ERR_NO_MEMORY;
        }
        memcpy(r->salt, p->cache_salt, p->cache_salt_len);
        r->salt_len = p->cache_salt_len;
    }
    memcpy(r->tokens, p->prompt, (size_t)p->prompt_len * sizeof(int32_t));
    r->num_tokens = r->prompt_len = p->prompt_len;
    r->id = e->next_id++;
    r->arrival = e->next_arrival++;
    r->state = KVF_REQ_WAITING;
    r->sampling = p->sampling;
    r->rng = p->sampling.seed ^ 0x6a09e667f3bcc909ull;
    for (int i = 0; i < p->rng_skip; ++i) {
        kvf_sampler_skip(&r->sampling, &r->rng);   /* tokens sampled elsewhere, same seed */
    }
    r->prefill_only = p->prefill_only;
    r->record_logits = p->record_logits;
    r->outputs_in_prompt = ((p->outputs_in_prompt > 0) && (p->outputs_in_prompt < p->prompt_len)) ?
                           p->outputs_in_prompt : 0;
    e->reqs[e->num_reqs++] = r;
    *r_p = r;
    return KVF_OK;
}

kvf_status_t kvf_engine_add_request(kvf_engine_h e, const kvf_req_params_t *p, uint64_t *id_p)
{
    KVF_ENGINE_CHECK(e, "kvf_engine_add_request");
    kvf_request_t *r;
    kvf_status_t status = kvf_new_request(e, p, &r);
    if (status == KVF_OK) {
        *id_p = r->id;
    }
    return status;
}

static void kvf_finish(kvf_engine_h e, kvf_request_t *r, kvf_finish_reason_t reason)
{
    (void)kvf_block_manager_free(e->bm, &r->blocks);
    r->state = KVF_REQ_FINISHED;
    r->finish = reason;
}

static void kvf_emit(kvf_engine_event_t *events, int cap, int *n, uint64_t id,
                     kvf_event_kind_t kind, int32_t token, kvf_finish_reason_t reason)
{
    if (*n < cap) {
        events[*n] = (kvf_engine_event_t){.id = id, .kind = kind, .token = token,
                                          .reason = reason};
        ++*n;
    }
}

/* The sampler's logprobs onto the event just emitted (the last of @a n). */
static void kvf_emit_logprobs(kvf_engine_event_t *events, int n, const kvf_sample_out_t *so)
{
    if ((so == NULL) || (n < 1)) {
        return;
    }
    events[n - 1].logprob = so->logprob;
    events[n - 1].num_top = so->num_top;
    memcpy(events[n - 1].top_ids, so->top_ids, sizeof(so->top_ids));
    memcpy(events[n - 1].top_logprobs, so->top_logprobs, sizeof(so->top_logprobs));
}

/* Whether a request's next token is its logits' argmax and nothing else reads the logits:
 * then the forward computes the argmax where the logits are (kvf_fwd_seq_t.token) and
 * only the id comes back. Sampling that reads the logits at temperature 0 (penalties,
 * min_tokens' masks, logit_bias, allowed_token_ids, bad_words, logprobs: kvf_sampler.h's
 * steps 0-2) must return false here; the temperature bound is the sampler's greedy bound (step 3). */
static bool kvf_greedy_only(const kvf_request_t *r)
{
    const kvf_sampling_t *s = &r->sampling;

    return (s->temperature < 1e-5f) && !r->record_logits && !s->want_logprobs &&
           (s->min_tokens == 0) && (s->presence_penalty == 0.0f) &&
           (s->frequency_penalty == 0.0f) && (s->num_logit_bias == 0) && (s->num_allowed == 0) &&
           (s->num_bad_words == 0) &&
           ((s->repetition_penalty == 0.0f) || (s->repetition_penalty == 1.0f));
}

/* Whether plan entry @a pe samples on the model's device (a GPU; not greedy-only). */
static bool kvf_samples_on_device(const kvf_engine_h e, const kvf_sched_entry_t *pe)
{
    return e->dev_sample && pe->samples && !kvf_greedy_only(pe->req);
}

/*
 * The device sampling rows of the step's plan (e->srow[i] for plan entry i), their draws
 * taken from each request's generator, their penalty entries packed into e->pen.
 * *npen_p: entries used.
 */
static kvf_status_t kvf_engine_sample_rows(kvf_engine_h e, int np, int *npen_p)
{
    int need = 0, n = 0;

    for (int i = 0; i < np; ++i) {
        const kvf_request_t *r = e->plan[i].req;
        if (kvf_samples_on_device(e, &e->plan[i])) {
            need += kvf_sampler_device_pen_max(&r->sampling, r->num_tokens, e->cfg->num_eos);
        }
    }
    if ((need > e->cap_pen) && (KVF_ARRAY_GROW(e->pen, e->cap_pen, need, 256) != KVF_OK)) {
        return KVF_ERR_NO_MEMORY;
    }
    for (int i = 0; i < np; ++i) {
        kvf_request_t *r = e->plan[i].req;
        kvf_status_t status;
        if (!kvf_samples_on_device(e, &e->plan[i])) {
            continue;
        }
        status = kvf_sampler_device_row(&r->sampling, &r->rng, r->tokens,
                                        r->prompt_len - r->outputs_in_prompt, r->num_tokens,
                                        e->cfg->vocab_size, e->cfg->eos_token_ids,
                                        e->cfg->num_eos, &e->srow[i], e->pen, &n);
        if (status != KVF_OK) {
            return status;
        }
    }
    *npen_p = n;
    return KVF_OK;
}

/* Append a sampled token and decide what happens next; emits events. */
static kvf_status_t kvf_accept_token(kvf_engine_h e, kvf_request_t *r, int32_t tok,
                                     const float *logits, const kvf_sample_out_t *so,
                                     kvf_engine_event_t *events, int cap, int *n)
{
    const int vocab = e->cfg->vocab_size;
    kvf_status_t status;
    int outputs;

    if (r->record_logits && (logits != NULL)) {
        float *nl = realloc(r->logits, (size_t)(r->num_logits + 1) * (size_t)vocab * sizeof(float));
        if (nl == NULL) {
            return KVF_ERR_NO_MEMORY;
        }
        r->logits = nl;
        memcpy(r->logits + (size_t)r->num_logits * (size_t)vocab, logits,
               (size_t)vocab * sizeof(float));
        ++r->num_logits;
    }
    status = kvf_tokens_push(r, tok);
    if (status != KVF_OK) {
        return status;
    }
    outputs = r->num_tokens - r->prompt_len;
    if (r->prefill_only) {
        r->state = KVF_REQ_PREFILLED;
        kvf_emit(events, cap, n, r->id, KVF_EVENT_PREFILLED, tok, KVF_FINISH_NONE);
        kvf_emit_logprobs(events, *n, so);
        return KVF_OK;
    }
    kvf_emit(events, cap, n, r->id, KVF_EVENT_TOKEN, tok, KVF_FINISH_NONE);
    kvf_emit_logprobs(events, *n, so);
    if ((!r->sampling.ignore_eos && kvf_model_is_eos(e->cfg, tok)) ||
        kvf_sampling_is_stop_id(&r->sampling, tok)) {
        kvf_finish(e, r, KVF_FINISH_EOS);
    } else if (outputs >= r->sampling.max_tokens) {
        kvf_finish(e, r, KVF_FINISH_LENGTH);
    }
    if (r->state == KVF_REQ_FINISHED) {
        kvf_emit(events, cap, n, r->id, KVF_EVENT_FINISHED, tok, r->finish);
    }
    return KVF_OK;
}

/*
 * Nothing could be scheduled although requests wait. When no request holds
 * blocks for someone else (PREFILLED leases, IMPORTING fills), nothing will
 * ever free a block: the oldest waiting request can never fit the pool, so
 * it is finished with an error instead of spinning forever.
 */
static kvf_status_t kvf_engine_unstall(kvf_engine_h e, kvf_engine_event_t *events, int cap,
                                       int *n_events)
{
    kvf_request_t *oldest = NULL;

    for (int i = 0; i < e->num_reqs; ++i) {
        kvf_request_t *r = e->reqs[i];
        if ((r->state == KVF_REQ_PREFILLED) || (r->state == KVF_REQ_IMPORTING)) {
            return KVF_OK;   /* blocks come back when those are released */
        }
        if (((r->state == KVF_REQ_WAITING) || (r->state == KVF_REQ_RUNNING)) &&
            ((oldest == NULL) || (r->arrival < oldest->arrival))) {
            oldest = r;
        }
    }
    if (oldest != NULL) {
        kvf_error("request %llu needs more cache than the pool of %d blocks holds (%d tokens)",
                  (unsigned long long)oldest->id, kvf_block_manager_num_blocks(e->bm),
                  oldest->num_tokens);
        kvf_finish(e, oldest, KVF_FINISH_ERROR);
        kvf_emit(events, cap, n_events, oldest->id, KVF_EVENT_FINISHED, -1, KVF_FINISH_ERROR);
    }
    return KVF_OK;
}

/* After a step: each plan entry's outcome (a prompt position scored, a token sampled where
 * its logits are, on the host or greedily), events emitted; a failure ends its request. */
static void kvf_engine_take(kvf_engine_h e, int np, kvf_engine_event_t *events, int cap,
                            int *n_events)
{
    const int vocab = e->cfg->vocab_size;
    kvf_status_t status;

    for (int i = 0; i < np; ++i) {
        kvf_sched_entry_t *pe = &e->plan[i];
        kvf_request_t *r = pe->req;
        r->num_computed = pe->start + pe->num_tokens;
        r->sched_tokens = 0;
        if (kvf_scores_prompt(pe)) {   /* a prompt position: its logits score the next */
            status = kvf_engine_prompt_lp(e, pe, e->seqs[i].logits);
        } else if (e->seqs[i].sample != NULL) {   /* sampled on the model's device */
            kvf_sample_out_t so;
            kvf_sampler_device_out(&r->sampling, &e->sres[i], &so);
            status = kvf_accept_token(e, r, so.token, e->seqs[i].logits,
                                      r->sampling.want_logprobs ? &so : NULL, events, cap,
                                      n_events);
        } else if (e->seqs[i].logits != NULL) {
            kvf_sample_out_t so;
            status = kvf_sampler_sample(&r->sampling, &r->rng, r->tokens,
                                        r->prompt_len - r->outputs_in_prompt,
                                        r->num_tokens, e->seqs[i].logits, vocab,
                                        e->cfg->eos_token_ids, e->cfg->num_eos, &so);
            if (status == KVF_OK) {
                status = kvf_accept_token(e, r, so.token, e->seqs[i].logits,
                                          r->sampling.want_logprobs ? &so : NULL, events, cap,
                                          n_events);
            }
        } else if (e->seqs[i].token != NULL) {   /* greedy on the model's device */
            status = kvf_accept_token(e, r, e->greedy[i], NULL, NULL, events, cap, n_events);
        } else {
            continue;
        }
        if (status != KVF_OK) {
            kvf_finish(e, r, KVF_FINISH_ERROR);
            kvf_emit(events, cap, n_events, r->id, KVF_EVENT_FINISHED, -1, KVF_FINISH_ERROR);
        }
    }
}

static void kvf_engine_count_step(kvf_engine_h e, double dt, int prefill_tok, int decode_tok)
{
    e->stats.steps++;
    e->stats.prefill_tokens += (uint64_t)prefill_tok;
    e->stats.decode_tokens += (uint64_t)decode_tok;
    e->stats.prefill_seconds += dt * prefill_tok / (double)(prefill_tok + decode_tok);
    e->stats.decode_seconds += dt * decode_tok / (double)(prefill_tok + decode_tok);
}

/* The first max_seqs waiting requests without blocks (those a step can take) are given
 * their cached prefix: a hit holds blocks, and a waiting request is never preempted. */
static kvf_status_t kvf_engine_prefix_pass(kvf_engine_h e)
{
    for (int i = 0, asked = 0; (e->prefix != NULL) && (i < e->num_reqs) &&
                               (asked < e->sched.max_seqs); ++i) {
        kvf_request_t *r = e->reqs[i];
        kvf_status_t status;
        if ((r->state != KVF_REQ_WAITING) || (r->num_computed != 0)) {
            continue;
        }
        ++asked;
        status = kvf_engine_prefix_admit(e->prefix, r);
        if (status != KVF_OK) {
            return status;
        }
    }
    return KVF_OK;
}

kvf_status_t kvf_engine_step(kvf_engine_h e, kvf_engine_event_t *events, int cap, int *n_events)
{
    KVF_ENGINE_CHECK(e, "kvf_engine_step");
    const int vocab = e->cfg->vocab_size;
    kvf_fwd_batch_t batch;
    kvf_status_t status;
    int np = 0, ns = 0, n_fresh, prefill_tok = 0, decode_tok = 0, preempted = 0, npen = 0;
    double t0, dt;

    *n_events = 0;
    for (int i = 0; i < e->num_reqs; ++i) {
        preempted -= e->reqs[i]->preemptions;
    }
    if (e->window_free) {   /* before the schedule: the zero block is zeroed with the fresh */
        e->stats.window_freed_blocks +=
            (uint64_t)kvf_engine_window_release(e->bm, e->win,
                                                kvf_tp_runner_layout(e->runner)->num_groups,
                                                e->reqs, e->num_reqs);
    }
    status = kvf_engine_prefix_pass(e);
    if (status == KVF_OK) {
        status = kvf_scheduler_schedule(&e->sched, e->bm, e->reqs, e->num_reqs, e->plan, &np);
    }
    for (int i = 0; i < e->num_reqs; ++i) {
        preempted += e->reqs[i]->preemptions;
    }
    e->stats.preemptions += (uint64_t)preempted;
    if (status != KVF_OK) {
        return status;
    }
    if (np == 0) {
        return kvf_engine_unstall(e, events, cap, n_events);
    }
    status = kvf_engine_sample_rows(e, np, &npen);
    if (status != KVF_OK) {   /* no memory for the entries: the step's requests fail */
        for (int i = 0; i < np; ++i) {
            kvf_finish(e, e->plan[i].req, KVF_FINISH_ERROR);
            kvf_emit(events, cap, n_events, e->plan[i].req->id, KVF_EVENT_FINISHED, -1,
                     KVF_FINISH_ERROR);
        }
        return status;
    }
    for (int i = 0; i < np; ++i) {
        kvf_sched_entry_t *pe = &e->plan[i];
        kvf_request_t *r = pe->req;
        bool dev = kvf_samples_on_device(e, pe);
        e->seqs[i] = (kvf_fwd_seq_t){
            .num_tokens = pe->num_tokens,
            .start = pe->start,
            .tokens = r->tokens + pe->start,
            .group_blocks = (const int32_t *const *)r->blocks.blocks,
            .group_num_blocks = r->blocks.num_blocks,
            /* greedy without recorded logits: the forward's argmax id alone comes back */
            /* host sampling, or recorded logits (--print-logits) */
            .logits = ((pe->samples && !kvf_greedy_only(r) && (!dev || r->record_logits)) ||
                       kvf_scores_prompt(pe)) ?
                      e->logits + (size_t)ns++ * (size_t)vocab : NULL,
            .token = (pe->samples && kvf_greedy_only(r)) ? &e->greedy[i] : NULL,
            /* decode steps feed the one token sampled last; anything else (the prompt,
             * a recompute after preemption) is a prompt forward in transformers */
            .prompt = (pe->start < r->prompt_len) || (pe->num_tokens > 1),
            /* per token: a recompute's outputs stay outputs (batch invariance) */
            .prompt_len = r->prompt_len,
            /* sampled where the logits are: only the small result comes back */
            .sample = dev ? &e->srow[i] : NULL,
            .sampled = dev ? &e->sres[i] : NULL,
        };
        if ((pe->num_tokens == 1) && (pe->start > 0)) {
            ++decode_tok;
        } else {
            prefill_tok += pe->num_tokens;
        }
    }
    batch.num_seqs = np;
    batch.seqs = e->seqs;
    batch.sample_pen = e->pen;
    batch.sample_num_pen = npen;
    n_fresh = kvf_block_manager_take_fresh(e->bm, e->fresh, e->cap_fresh);

    t0 = kvf_time_now_s();
    status = kvf_tp_runner_step(e->runner, &batch, e->fresh, n_fresh);
    dt = kvf_time_now_s() - t0;
    kvf_engine_count_step(e, dt, prefill_tok, decode_tok);
    if ((status == KVF_OK) && (e->prefix != NULL)) {   /* before sampling frees blocks */
        status = kvf_engine_prefix_after_step(e->prefix, e->plan, np);
    }
    if (status != KVF_OK) {
        for (int i = 0; i < np; ++i) {
            kvf_finish(e, e->plan[i].req, KVF_FINISH_ERROR);
            kvf_emit(events, cap, n_events, e->plan[i].req->id, KVF_EVENT_FINISHED, -1,
                     KVF_FINISH_ERROR);
        }
        return status;
    }
    kvf_engine_take(e, np, events, cap, n_events);
    return KVF_OK;
}

bool kvf_engine_has_work(kvf_engine_h e)
{
    KVF_ENGINE_CHECK(e, "kvf_engine_has_work");
    for (int i = 0; i < e->num_reqs; ++i) {
        if ((e->reqs[i]->state == KVF_REQ_WAITING) || (e->reqs[i]->state == KVF_REQ_RUNNING)) {
            return true;
        }
    }
    return false;
}

kvf_status_t kvf_engine_abort(kvf_engine_h e, uint64_t id)
{
    KVF_ENGINE_CHECK(e, "kvf_engine_abort");
    kvf_request_t *r = kvf_find(e, id, NULL);
    if (r == NULL) {
        return KVF_ERR_NOT_FOUND;
    }
    if (r->state != KVF_REQ_FINISHED) {
        kvf_finish(e, r, KVF_FINISH_ABORT);
    }
    return KVF_OK;
}

kvf_status_t kvf_engine_release(kvf_engine_h e, uint64_t id)
{
    KVF_ENGINE_CHECK(e, "kvf_engine_release");
    int idx;
    kvf_request_t *r = kvf_find(e, id, &idx);
    if (r == NULL) {
        return KVF_ERR_NOT_FOUND;
    }
    (void)kvf_block_manager_free(e->bm, &r->blocks);
    kvf_req_free(r);
    e->reqs[idx] = e->reqs[--e->num_reqs];
    return KVF_OK;
}

kvf_status_t kvf_engine_request_info(kvf_engine_h e, uint64_t id, kvf_req_info_t *info)
{
    KVF_ENGINE_CHECK(e, "kvf_engine_request_info");
    kvf_request_t *r = kvf_find(e, id, NULL);
    if (r == NULL) {
        return KVF_ERR_NOT_FOUND;
    }
    *info = (kvf_req_info_t){
        .state = r->state, .finish = r->finish, .tokens = r->tokens,
        .prompt_len = r->prompt_len, .num_tokens = r->num_tokens,
        .num_computed = r->num_computed, .logits = r->logits, .num_logits = r->num_logits,
        .blocks = &r->blocks, .preemptions = r->preemptions, .prompt_logprobs = &r->plp,
    };
    return KVF_OK;
}

kvf_status_t kvf_engine_prefill(kvf_engine_h e, const kvf_req_params_t *params, uint64_t *id_p,
                                int32_t *first_token_p)
{
    KVF_ENGINE_CHECK(e, "kvf_engine_prefill");
    kvf_req_params_t p = *params;
    kvf_engine_event_t ev[256];
    kvf_request_t *r;
    kvf_status_t status;
    int n;

    p.prefill_only = true;
    status = kvf_new_request(e, &p, &r);
    if (status != KVF_OK) {
        return status;
    }
    while (r->state == KVF_REQ_WAITING || r->state == KVF_REQ_RUNNING) {
        uint64_t steps = e->stats.steps;
        status = kvf_engine_step(e, ev, (int)(sizeof(ev) / sizeof(ev[0])), &n);
        if (status != KVF_OK) {
            break;
        }
        if ((e->stats.steps == steps) && (r->state == KVF_REQ_WAITING)) {
            kvf_error("request %llu: the pool cannot hold its %d prompt tokens",
                      (unsigned long long)r->id, r->prompt_len);
            status = KVF_ERR_NO_RESOURCE;
            break;
        }
    }
    if ((status == KVF_OK) && (r->state == KVF_REQ_PREFILLED)) {
        *id_p = r->id;
        *first_token_p = r->tokens[r->num_tokens - 1];
        return KVF_OK;
    }
    if ((status == KVF_OK) && (r->finish == KVF_FINISH_ERROR)) {
        status = KVF_ERR_NO_RESOURCE;   /* finished by kvf_engine_unstall() */
    }
    (void)kvf_engine_release(e, r->id);
    return (status != KVF_OK) ? status : KVF_ERR_CANCELED;
}

kvf_status_t kvf_engine_import_begin(kvf_engine_h e, const kvf_req_params_t *params,
                                     uint64_t *id_p, const kvf_req_blocks_t **blocks_p)
{
    KVF_ENGINE_CHECK(e, "kvf_engine_import_begin");
    kvf_tp_runner_h rn = e->runner;
    kvf_page_pool_h pools[KVF_COMM_MAX_RANKS];
    kvf_request_t *r;
    kvf_status_t status = kvf_new_request(e, params, &r);

    if (status != KVF_OK) {
        return status;
    }
    /* pulled KV is indexed only under its source's numerics (kvf_engine_prefix_import) */
    r->prefix_counted = r->prefix_off = true;
    if (e->prefix != NULL) {
        (void)kvf_engine_prefix_import(e->prefix, r, params->import_source);
    }
    status = kvf_block_manager_allocate(e->bm, &r->blocks, r->prompt_len);
    if (status != KVF_OK) {
        (void)kvf_engine_release(e, r->id);
        return status;
    }
    for (int i = 0; i < kvf_tp_runner_tp_size(rn); ++i) {
        pools[i] = kvf_tp_runner_pool(rn, i);
    }
    status = kvf_block_manager_zero_fresh(e->bm, pools, kvf_tp_runner_tp_size(rn));
    if (status != KVF_OK) {
        (void)kvf_engine_release(e, r->id);
        return status;
    }
    r->state = KVF_REQ_IMPORTING;
    *id_p = r->id;
    *blocks_p = &r->blocks;
    return KVF_OK;
}

kvf_status_t kvf_engine_import_zeroed(kvf_engine_h e, uint64_t id, int64_t tokens)
{
    KVF_ENGINE_CHECK(e, "kvf_engine_import_zeroed");
    kvf_request_t *r = kvf_find(e, id, NULL);

    if (r == NULL) {
        return KVF_ERR_NOT_FOUND;
    }
    if ((r->state != KVF_REQ_IMPORTING) || (tokens < 0) || (tokens > r->prompt_len)) {
        kvf_error("request %llu: zeroed import tokens %lld (state %d, prompt_len %d)",
                  (unsigned long long)id, (long long)tokens, (int)r->state, r->prompt_len);
        return KVF_ERR_INVALID_PARAM;
    }
    r->import_zeroed = (int)tokens;
    return KVF_OK;
}

kvf_status_t kvf_engine_import_commit(kvf_engine_h e, uint64_t id, int32_t first_token)
{
    KVF_ENGINE_CHECK(e, "kvf_engine_import_commit");
    kvf_engine_event_t ev[4];
    kvf_request_t *r = kvf_find(e, id, NULL);
    int n = 0;

    if (r == NULL) {
        return KVF_ERR_NOT_FOUND;
    }
    if ((r->state != KVF_REQ_IMPORTING) || (first_token < 0) ||
        (first_token >= e->cfg->vocab_size)) {
        kvf_error("request %llu: cannot commit import (state %d, first token %d)",
                  (unsigned long long)id, (int)r->state, first_token);
        return KVF_ERR_INVALID_PARAM;
    }
    r->num_computed = r->prompt_len;
    r->state = KVF_REQ_RUNNING;
    r->prefill_only = false;
    if (e->prefix != NULL) {
        kvf_engine_prefix_imported(e->prefix, r);   /* landed and verified: kept */
    }
    return kvf_accept_token(e, r, first_token, NULL, NULL, ev, 4, &n);
}

kvf_status_t kvf_engine_run_on_ranks(kvf_engine_h e, kvf_rank_func_t func, void *arg)
{
    KVF_ENGINE_CHECK(e, "kvf_engine_run_on_ranks");
    return kvf_tp_runner_run_on_ranks(e->runner, func, arg);
}

kvf_tp_runner_h kvf_engine_runner(kvf_engine_h e)
{
    return e->runner;
}

kvf_block_manager_h kvf_engine_block_manager(kvf_engine_h e)
{
    return e->bm;
}

const kvf_model_config_t *kvf_engine_model_config(kvf_engine_h e)
{
    return e->cfg;
}

void kvf_engine_get_stats(kvf_engine_h e, kvf_engine_stats_t *stats_p)
{
    KVF_ENGINE_CHECK(e, "kvf_engine_get_stats");
    *stats_p = e->stats;
}

void kvf_engine_get_prefix_stats(kvf_engine_h e, kvf_engine_prefix_stats_t *stats_p)
{
    KVF_ENGINE_CHECK(e, "kvf_engine_get_prefix_stats");
    memset(stats_p, 0, sizeof(*stats_p));
    if (e->prefix != NULL) {
        kvf_engine_prefix_get_stats(e->prefix, stats_p);
    }
}

uint64_t kvf_engine_numerics_class(kvf_engine_h e)
{
    return kvf_engine_prefix_numerics(e->runner, e->sched.state_grid);
}

int kvf_engine_request_prefix_hit(kvf_engine_h e, uint64_t id)
{
    KVF_ENGINE_CHECK(e, "kvf_engine_request_prefix_hit");
    const kvf_request_t *r = kvf_find(e, id, NULL);
    return (r != NULL) ? r->prefix_hit : -1;
}
