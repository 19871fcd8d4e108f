/*
 * The stale-page NaN hazard at model level (docs/ARCHITECTURE.md §1, failure 1).
 *
 * A request's fp32 Mamba state pages are freed; the block manager hands the
 * block freed last out first, so the next request's first attention block
 * is a page that held fp32 SSM state. Read as bf16 K/V, the low halves of
 * those fp32 words include NaN/Inf bit patterns, and the attention kernel
 * reads whole kernel blocks and masks unwritten rows by multiplying by 0:
 * 0 * NaN = NaN. With block zeroing disabled (test-only switch) the logits
 * are NaN; with zeroing on they equal a run on a fresh pool bit for bit.
 */
#include "kvf_model_test_util.h"
#include "kvf_page_pool.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    float    logits[260];
    int32_t  attn_block;
    int32_t  mamba_blocks[8];
    int      n_mamba;
    int      stale_nan_words;   /* NaN/Inf bf16 patterns in the recycled page before reuse */
} kvf_nan_run_t;

static int kvf_count_nan_bf16(const void *page, size_t bytes)
{
    const uint16_t *w = page;
    int n = 0;
    for (size_t i = 0; i < bytes / 2; ++i) {
        n += ((w[i] & 0x7f80u) == 0x7f80u);
    }
    return n;
}

/* recycle: run a long request first, free it, then the probe request */
static void kvf_run(const char *dir, bool recycle, bool no_zero, kvf_nan_run_t *out)
{
    kvf_test_engine_opts_t o = kvf_test_engine_defaults();
    kvf_engine_h eng;
    kvf_req_params_t rp = {0};
    kvf_req_info_t info;
    int32_t prompt[64], first;
    uint64_t id;
    int n;

    memset(out, 0, sizeof(*out));
    o.kv_dtype = KVF_DTYPE_BF16;
    o.ssm_dtype = o.conv_dtype = KVF_DTYPE_FP32;
    o.num_blocks = 8;
    o.no_zero = no_zero;
    eng = kvf_test_engine(dir, &o);
    const kvf_cache_layout_t *lay = kvf_tp_runner_layout(kvf_engine_runner(eng));
    kvf_page_pool_h pool = kvf_tp_runner_pool(kvf_engine_runner(eng), 0);

    /* Start from an all-zero pool (allocator memory may hold bytes of an earlier
     * engine), so the only stale bytes the probe can meet are the recycled ones. */
    memset(kvf_page_pool_base(pool), 0, kvf_page_pool_bytes(pool));

    rp.sampling.max_tokens = 1;
    if (recycle) {
        n = kvf_test_prompt("a long first request fills its Mamba state pages", prompt, 64);
        rp.prompt = prompt;
        rp.prompt_len = n;
        rp.record_logits = true;
        assert_int_equal(kvf_engine_prefill(eng, &rp, &id, &first), KVF_OK);
        assert_int_equal(kvf_engine_request_info(eng, id, &info), KVF_OK);
        for (int i = 0; i < 260; ++i) {
            assert_false(isnan(info.logits[i]));   /* the first request itself is clean */
        }
        for (int g = 0; g < lay->num_groups; ++g) {
            if (lay->groups[g].kind == KVF_GROUP_MAMBA) {
                out->mamba_blocks[out->n_mamba++] = info.blocks->blocks[g][0];
            }
        }
        assert_true(out->n_mamba > 0);
        /* the last Mamba block is freed last, so it is handed out first */
        for (int s = 0; s < lay->slots; ++s) {
            out->stale_nan_words += kvf_count_nan_bf16(
                kvf_page_pool_page(pool, out->mamba_blocks[out->n_mamba - 1], s),
                kvf_page_pool_page_size(pool));
        }
        assert_int_equal(kvf_engine_release(eng, id), KVF_OK);
    }
    n = kvf_test_prompt("hi", prompt, 64);
    rp.prompt = prompt;
    rp.prompt_len = n;
    rp.record_logits = true;
    assert_int_equal(kvf_engine_prefill(eng, &rp, &id, &first), KVF_OK);
    assert_int_equal(kvf_engine_request_info(eng, id, &info), KVF_OK);
    assert_int_equal(info.num_logits, 1);
    memcpy(out->logits, info.logits, sizeof(out->logits));
    out->attn_block = info.blocks->blocks[0][0];   /* group 0 is the attention group */
    assert_int_equal(lay->groups[0].kind, KVF_GROUP_ATTENTION);
    assert_int_equal(kvf_engine_release(eng, id), KVF_OK);
    kvf_engine_destroy(eng);
}

static void test_recycled_mamba_page_nan_without_zeroing(void **state)
{
    char dir[256];
    kvf_nan_run_t fresh, bad, good;
    int nan_count = 0;

    (void)state;
    kvf_test_mkmodel("tiny-hybrid", 9, dir);
    kvf_run(dir, false, false, &fresh);
    kvf_run(dir, true, true, &bad);
    kvf_run(dir, true, false, &good);

    /* preconditions: the probe's attention block is the recycled Mamba block,
     * and that page holds NaN/Inf patterns when read as bf16 */
    assert_int_equal(bad.attn_block, bad.mamba_blocks[bad.n_mamba - 1]);
    assert_int_equal(good.attn_block, good.mamba_blocks[good.n_mamba - 1]);
    print_message("recycled page: %d NaN/Inf bf16 words\n", bad.stale_nan_words);
    assert_true(bad.stale_nan_words > 0);

    for (int i = 0; i < 260; ++i) {
        assert_false(isnan(fresh.logits[i]));
        nan_count += isnan(bad.logits[i]) ? 1 : 0;
    }
    print_message("without zeroing: %d of 260 logits are NaN\n", nan_count);
    assert_int_equal(nan_count, 260);
    assert_memory_equal(good.logits, fresh.logits, sizeof(fresh.logits));
    kvf_test_rmmodel(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_recycled_mamba_page_nan_without_zeroing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
