/*
 * Scheduling and the engine API the role daemons use:
 * - many concurrent requests (prefill and decode batched together, chunked
 *   prefill, preemption on a small pool) with random aborts: every block
 *   returns to the pool, and every request that was not aborted produces the
 *   same greedy tokens as when run alone;
 * - seeded temperature sampling is reproducible;
 * - prefill-only + import round trip (what kvf-prefill and kvf-decode do
 *   around a transfer): pages copied from a prefill engine into the blocks
 *   of a decode engine continue exactly like a colocated run.
 */
#include "kvf_model_test_util.h"
#include "kvf_page_pool.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NREQ 24
#define MAXGEN 24

static uint64_t kvf_lcg(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

static void test_concurrent_with_aborts(void **state)
{
    char dir[256];
    kvf_test_engine_opts_t o = kvf_test_engine_defaults();
    kvf_engine_h eng, solo;
    kvf_block_manager_h bm;
    int32_t prompts[NREQ][160], solo_toks[MAXGEN];
    int plen[NREQ], maxtok[NREQ], nfree0, steps = 0, added = 0;
    bool aborted[NREQ] = {false};
    uint64_t ids[NREQ], rng = 12345;
    kvf_engine_event_t ev[256];
    kvf_engine_stats_t st;

    (void)state;
    kvf_test_mkmodel("tiny-hybrid", 21, dir);
    o.kv_dtype = KVF_DTYPE_BF16;
    o.num_blocks = 12;          /* 3 blocks per short request: forces waiting and preemption */
    o.max_batch_tokens = 64;    /* forces chunked prefill of the long prompts */
    o.max_seqs = 16;
    eng = kvf_test_engine(dir, &o);
    bm = kvf_engine_block_manager(eng);
    nfree0 = kvf_block_manager_num_free(bm);
    assert_int_equal(nfree0, 12);

    for (int i = 0; i < NREQ; ++i) {
        /* most prompts end shortly before the 80-token block boundary, so decode
         * crosses it and needs a block when the pool is exhausted: preemption */
        plen[i] = (i % 4 == 0) ? 5 + (int)(kvf_lcg(&rng) % 150) : 60 + (int)(kvf_lcg(&rng) % 20);
        maxtok[i] = 1 + (int)(kvf_lcg(&rng) % MAXGEN);
        prompts[i][0] = 256;
        for (int t = 1; t < plen[i]; ++t) {
            prompts[i][t] = (int32_t)(kvf_lcg(&rng) % 256);
        }
    }
    while ((added < NREQ) || kvf_engine_has_work(eng)) {
        int ne;
        /* admit a few requests per step */
        for (int k = 0; (k < 3) && (added < NREQ); ++k, ++added) {
            kvf_req_params_t rp = {0};
            rp.prompt = prompts[added];
            rp.prompt_len = plen[added];
            rp.sampling.max_tokens = maxtok[added];
            rp.sampling.ignore_eos = true;
            assert_int_equal(kvf_engine_add_request(eng, &rp, &ids[added]), KVF_OK);
        }
        assert_int_equal(kvf_engine_step(eng, ev, 256, &ne), KVF_OK);
        /* random aborts of admitted requests */
        if ((kvf_lcg(&rng) % 5) == 0) {
            int victim = (int)(kvf_lcg(&rng) % (uint64_t)added);
            kvf_req_info_t info;
            assert_int_equal(kvf_engine_request_info(eng, ids[victim], &info), KVF_OK);
            if (info.state != KVF_REQ_FINISHED) {
                assert_int_equal(kvf_engine_abort(eng, ids[victim]), KVF_OK);
                aborted[victim] = true;
            }
        }
        assert_true(kvf_block_manager_num_free(bm) >= 0);
        assert_true(++steps < 5000);
    }
    assert_int_equal(kvf_block_manager_num_free(bm), nfree0);
    kvf_engine_get_stats(eng, &st);
    {
        int na = 0;
        for (int i = 0; i < NREQ; ++i) {
            na += aborted[i];
        }
        print_message("%d steps, %llu preemptions, %d aborted\n", steps,
                      (unsigned long long)st.preemptions, na);
        assert_true(na > 0);
    }
    assert_true(st.preemptions > 0);

    /* survivors equal solo runs */
    o.num_blocks = 64;
    o.max_batch_tokens = 0;
    solo = kvf_test_engine(dir, &o);
    for (int i = 0; i < NREQ; ++i) {
        kvf_req_info_t info;
        assert_int_equal(kvf_engine_request_info(eng, ids[i], &info), KVF_OK);
        assert_int_equal(info.state, KVF_REQ_FINISHED);
        if (aborted[i]) {
            assert_int_equal(info.finish, KVF_FINISH_ABORT);
        } else {
            assert_int_equal(info.finish, KVF_FINISH_LENGTH);
            assert_int_equal(info.num_tokens - info.prompt_len, maxtok[i]);
            kvf_test_greedy(solo, prompts[i], plen[i], maxtok[i], solo_toks, NULL);
            assert_memory_equal(info.tokens + plen[i], solo_toks,
                                (size_t)maxtok[i] * sizeof(int32_t));
        }
        assert_int_equal(kvf_engine_release(eng, ids[i]), KVF_OK);
    }
    assert_int_equal(kvf_block_manager_num_free(bm), nfree0);
    kvf_engine_destroy(solo);
    kvf_engine_destroy(eng);
    kvf_test_rmmodel(dir);
}

static void kvf_sample_run(kvf_engine_h eng, uint64_t seed, int32_t *toks)
{
    int32_t prompt[32];
    kvf_req_params_t rp = {0};
    kvf_engine_event_t ev[64];
    kvf_req_info_t info;
    uint64_t id;
    int ne;

    rp.prompt = prompt;
    rp.prompt_len = kvf_test_prompt("sample me", prompt, 32);
    rp.sampling.max_tokens = 16;
    rp.sampling.temperature = 1.0f;
    rp.sampling.seed = seed;
    rp.sampling.ignore_eos = true;
    assert_int_equal(kvf_engine_add_request(eng, &rp, &id), KVF_OK);
    while (kvf_engine_has_work(eng)) {
        assert_int_equal(kvf_engine_step(eng, ev, 64, &ne), KVF_OK);
    }
    assert_int_equal(kvf_engine_request_info(eng, id, &info), KVF_OK);
    memcpy(toks, info.tokens + info.prompt_len, 16 * sizeof(int32_t));
    assert_int_equal(kvf_engine_release(eng, id), KVF_OK);
}

static void test_seeded_sampling(void **state)
{
    char dir[256];
    kvf_test_engine_opts_t o = kvf_test_engine_defaults();
    kvf_engine_h eng;
    int32_t a[16], b[16], c[16];

    (void)state;
    kvf_test_mkmodel("tiny-hybrid", 2, dir);
    eng = kvf_test_engine(dir, &o);
    kvf_sample_run(eng, 7, a);
    kvf_sample_run(eng, 7, b);
    kvf_sample_run(eng, 8, c);
    assert_memory_equal(a, b, sizeof(a));
    assert_memory_not_equal(a, c, sizeof(a));
    kvf_engine_destroy(eng);
    kvf_test_rmmodel(dir);
}

/* Copy every page of a request's blocks from engine P to engine D, rank by rank. */
static void kvf_copy_pages(kvf_engine_h p, const kvf_req_blocks_t *bp, kvf_engine_h d,
                           const kvf_req_blocks_t *bd)
{
    kvf_tp_runner_h rp = kvf_engine_runner(p), rd = kvf_engine_runner(d);
    for (int r = 0; r < kvf_tp_runner_tp_size(rp); ++r) {
        kvf_page_pool_h pp = kvf_tp_runner_pool(rp, r), pd = kvf_tp_runner_pool(rd, r);
        assert_int_equal(kvf_page_pool_page_size(pp), kvf_page_pool_page_size(pd));
        for (int g = 0; g < bp->num_groups; ++g) {
            assert_int_equal(bp->num_blocks[g], bd->num_blocks[g]);
            for (int i = 0; i < bp->num_blocks[g]; ++i) {
                for (int s = 0; s < kvf_page_pool_slots(pp); ++s) {
                    memcpy(kvf_page_pool_page(pd, bd->blocks[g][i], s),
                           kvf_page_pool_page(pp, bp->blocks[g][i], s), kvf_page_pool_page_size(pp));
                }
            }
        }
    }
}

static void test_prefill_import_round_trip(void **state)
{
    char dir[256];
    kvf_test_engine_opts_t o = kvf_test_engine_defaults();
    kvf_engine_h pe, de, ce;
    int32_t prompt[200], first, colo[10];
    float colo_lg[10 * 260];
    kvf_req_params_t rp = {0};
    kvf_req_info_t pinfo, dinfo;
    const kvf_req_blocks_t *dblocks;
    kvf_engine_event_t ev[64];
    uint64_t pid, did;
    int n, ne, pfree, dfree;

    (void)state;
    kvf_test_mkmodel("tiny-hybrid", 13, dir);
    o.tp = 2;
    o.kv_dtype = KVF_DTYPE_BF16;
    pe = kvf_test_engine(dir, &o);
    de = kvf_test_engine(dir, &o);
    ce = kvf_test_engine(dir, &o);
    pfree = kvf_block_manager_num_free(kvf_engine_block_manager(pe));
    dfree = kvf_block_manager_num_free(kvf_engine_block_manager(de));

    prompt[0] = 256;
    for (n = 1; n < 100; ++n) {          /* crosses one block boundary (block 80) */
        prompt[n] = (int32_t)((n * 29 + 3) % 256);
    }
    kvf_test_greedy(ce, prompt, n, 10, colo, colo_lg);

    /* prefill side: run the prompt, keep the blocks, get the first token */
    rp.prompt = prompt;
    rp.prompt_len = n;
    rp.sampling.max_tokens = 10;
    rp.sampling.ignore_eos = true;
    assert_int_equal(kvf_engine_prefill(pe, &rp, &pid, &first), KVF_OK);
    assert_int_equal(first, colo[0]);
    assert_int_equal(kvf_engine_request_info(pe, pid, &pinfo), KVF_OK);
    assert_int_equal(pinfo.state, KVF_REQ_PREFILLED);

    /* decode side: allocate + zero, "transfer", commit the first token, decode */
    rp.record_logits = true;
    assert_int_equal(kvf_engine_import_begin(de, &rp, &did, &dblocks), KVF_OK);
    kvf_copy_pages(pe, pinfo.blocks, de, dblocks);
    assert_int_equal(kvf_engine_release(pe, pid), KVF_OK);   /* prefill lease ends */
    assert_int_equal(kvf_block_manager_num_free(kvf_engine_block_manager(pe)), pfree);
    assert_int_equal(kvf_engine_import_commit(de, did, first), KVF_OK);
    while (kvf_engine_has_work(de)) {
        assert_int_equal(kvf_engine_step(de, ev, 64, &ne), KVF_OK);
    }
    assert_int_equal(kvf_engine_request_info(de, did, &dinfo), KVF_OK);
    assert_int_equal(dinfo.finish, KVF_FINISH_LENGTH);
    assert_int_equal(dinfo.num_tokens - dinfo.prompt_len, 10);
    assert_memory_equal(dinfo.tokens + n, colo, sizeof(colo));
    /* logits of tokens 2..10 (token 1 came from prefill) equal the colocated run */
    assert_int_equal(dinfo.num_logits, 9);
    assert_memory_equal(dinfo.logits, colo_lg + 260, 9 * 260 * sizeof(float));
    assert_int_equal(kvf_engine_release(de, did), KVF_OK);
    assert_int_equal(kvf_block_manager_num_free(kvf_engine_block_manager(de)), dfree);

    /* import that cannot get blocks holds nothing */
    {
        kvf_test_engine_opts_t small = o;
        kvf_engine_h se;
        small.num_blocks = 2;
        se = kvf_test_engine(dir, &small);
        assert_int_equal(kvf_engine_import_begin(se, &rp, &did, &dblocks), KVF_ERR_NO_RESOURCE);
        assert_int_equal(kvf_block_manager_num_free(kvf_engine_block_manager(se)), 2);
        /* a prompt the pool can never hold fails instead of waiting forever */
        assert_int_equal(kvf_engine_prefill(se, &rp, &did, &first), KVF_ERR_NO_RESOURCE);
        assert_int_equal(kvf_block_manager_num_free(kvf_engine_block_manager(se)), 2);
        assert_false(kvf_engine_has_work(se));
        kvf_engine_destroy(se);
    }
    kvf_engine_destroy(pe);
    kvf_engine_destroy(de);
    kvf_engine_destroy(ce);
    kvf_test_rmmodel(dir);
}

/* EOS ends a request (unless ignored): make the 4th greedy token the EOS id. */
static void test_eos_finishes(void **state)
{
    char dir[256], path[512];
    kvf_test_engine_opts_t o = kvf_test_engine_defaults();
    kvf_engine_h eng;
    int32_t prompt[32], toks[8];
    kvf_req_params_t rp = {0};
    kvf_engine_event_t ev[64];
    kvf_req_info_t info;
    uint64_t id;
    int n, ne, first = -1, saw_finish = 0;
    FILE *f;

    (void)state;
    kvf_test_mkmodel("tiny-hybrid", 31, dir);
    n = kvf_test_prompt("end here", prompt, 32);
    eng = kvf_test_engine(dir, &o);
    kvf_test_greedy(eng, prompt, n, 8, toks, NULL);
    kvf_engine_destroy(eng);
    for (int i = 0; i < 8; ++i) {
        if (toks[i] == toks[3]) {
            first = i;     /* the first occurrence of that id ends the request */
            break;
        }
    }

    /* same weights, config with eos_token_id = toks[3] */
    snprintf(path, sizeof(path), "%s/config.json", dir);
    f = fopen(path, "rb");
    assert_non_null(f);
    char text[4096] = {0};
    assert_true(fread(text, 1, sizeof(text) - 1, f) > 0);
    fclose(f);
    char *e = strstr(text, "\"eos_token_id\"");
    assert_non_null(e);
    char *comma = strchr(e, ',');
    char out[4200];
    /* as a list whose first id is never sampled here: transformers stops on any id of
     * the list, so toks[3] must still end the request */
    int other = 0;
    for (int i = 0; i < 8; ++i) {
        if (toks[i] == other) {
            ++other;     /* taken: try the next id from the start */
            i = -1;
        }
    }
    snprintf(out, sizeof(out), "%.*s\"eos_token_id\": [%d, %d]%s", (int)(e - text), text, other,
             toks[3], comma);
    f = fopen(path, "wb");
    assert_non_null(f);
    fputs(out, f);
    fclose(f);

    eng = kvf_test_engine(dir, &o);
    rp.prompt = prompt;
    rp.prompt_len = n;
    rp.sampling.max_tokens = 8;
    assert_int_equal(kvf_engine_add_request(eng, &rp, &id), KVF_OK);
    while (kvf_engine_has_work(eng)) {
        assert_int_equal(kvf_engine_step(eng, ev, 64, &ne), KVF_OK);
        for (int i = 0; i < ne; ++i) {
            if (ev[i].kind == KVF_EVENT_FINISHED) {
                assert_int_equal(ev[i].reason, KVF_FINISH_EOS);
                assert_int_equal(ev[i].token, toks[3]);
                ++saw_finish;
            }
        }
    }
    assert_int_equal(saw_finish, 1);
    assert_int_equal(kvf_engine_request_info(eng, id, &info), KVF_OK);
    assert_int_equal(info.finish, KVF_FINISH_EOS);
    assert_int_equal(info.num_tokens - info.prompt_len, first + 1);
    assert_memory_equal(info.tokens + n, toks, (size_t)(first + 1) * sizeof(int32_t));
    assert_int_equal(kvf_engine_release(eng, id), KVF_OK);
    kvf_engine_destroy(eng);
    kvf_test_rmmodel(dir);
}

typedef struct {
    pthread_t       thread[4];
    kvf_page_pool_h pool[4];
    int             calls[4];
} kvf_rank_probe_t;

static kvf_status_t kvf_probe_rank(void *arg, int rank, kvf_page_pool_h pool)
{
    kvf_rank_probe_t *p = arg;
    p->thread[rank] = pthread_self();
    p->pool[rank] = pool;
    p->calls[rank]++;
    return (rank == 3) ? KVF_ERR_BUSY : KVF_OK;
}

/* Per-rank work for the transfer layer runs on each rank's own thread. */
static void test_run_on_ranks(void **state)
{
    char dir[256];
    kvf_test_engine_opts_t o = kvf_test_engine_defaults();
    kvf_rank_probe_t p;
    kvf_engine_h eng;

    (void)state;
    memset(&p, 0, sizeof(p));
    kvf_test_mkmodel("tiny-dense", 1, dir);
    o.tp = 4;
    eng = kvf_test_engine(dir, &o);
    assert_int_equal(kvf_engine_run_on_ranks(eng, kvf_probe_rank, &p), KVF_ERR_BUSY);
    assert_true(pthread_equal(p.thread[0], pthread_self()));
    for (int r = 0; r < 4; ++r) {
        assert_int_equal(p.calls[r], 1);
        assert_ptr_equal(p.pool[r], kvf_tp_runner_pool(kvf_engine_runner(eng), r));
        for (int q = 0; q < r; ++q) {
            assert_false(pthread_equal(p.thread[q], p.thread[r]));
        }
    }
    /* steps still work after a rank function */
    {
        int32_t prompt[16], toks[4];
        int n = kvf_test_prompt("after", prompt, 16);
        kvf_test_greedy(eng, prompt, n, 4, toks, NULL);
    }
    kvf_engine_destroy(eng);
    kvf_test_rmmodel(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_concurrent_with_aborts),
        cmocka_unit_test(test_seeded_sampling),
        cmocka_unit_test(test_prefill_import_round_trip),
        cmocka_unit_test(test_eos_finishes),
        cmocka_unit_test(test_run_on_ranks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
