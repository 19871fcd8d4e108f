/* FlashInfer decode on kvferry's pages (kernels/kvf_fi_plan.h), on the CPU:
 * - refusals by name: fp32 caches, dtypes/head dims not instantiated, bad geometry; GQA
 *   groups FlashInfer's decode does not dispatch (Nemotron-Nano-9B-v2's 40 / 8 = 5) marked
 *   decode_on_prefill, page indices
 *   past INT32_MAX; Llama-3-8B-like and the trained models' geometries accepted;
 * - every element FlashInfer would read (page index * stride_page + head * stride_h + row *
 *   stride_n, V at + v_offset) is the element kvferry's own attention reads
 *   (kvf_attention_math.h's kernel-block offset and row), for pages that are whole kernel
 *   blocks and for pages padded to a Mamba page;
 * - the work plan: fixed chunks of KVF_FI_SPLIT_TOKENS, and a request's entries the same
 *   alone and inside any batch (batch invariance). */
#include "kvf_attention_math.h"
#include "kvf_fi_plan.h"
#include "kvf_kern_test.h"

#include <string.h>

static void test_refusals(void **state)
{
    kvf_fi_geom_t g;

    (void)state;
    /* Llama-3-8B-like: 32 / 8 heads, head_dim 128, bf16, kernel blocks of 16 */
    assert_null(kvf_fi_geometry(KVF_DTYPE_BF16, 128, 32, 8, 16, 65536, 1u << 30, 1, &g));
    assert_int_equal(g.decode_on_prefill, 0);
    /* the trained tiny models: 8 / 2 heads, head_dim 32 */
    assert_null(kvf_fi_geometry(KVF_DTYPE_BF16, 32, 8, 2, 16, 4096, 1u << 20, 1, &g));
    assert_int_equal(g.decode_on_prefill, 0);
    assert_non_null(strstr(kvf_fi_geometry(KVF_DTYPE_FP32, 128, 32, 8, 16, 131072, 1u << 30, 1,
                                           &g), "not fp32"));
    assert_non_null(strstr(kvf_fi_geometry(KVF_DTYPE_BF16, 128, 32, 8, 16, 65536, 1u << 30, 0,
                                           &g), "instantiated"));
    /* Nemotron-Nano-9B-v2: 40 query heads over 8 KV heads, a group of 5 its decode does not
     * dispatch: outputs on its prefill; 6 and 16 on its decode, 7 and 10 on its prefill */
    assert_null(kvf_fi_geometry(KVF_DTYPE_BF16, 128, 40, 8, 16, 81920, 1u << 30, 1, &g));
    assert_int_equal(g.decode_on_prefill, 1);
    for (int grp = 1; grp <= 16; ++grp) {
        const int want = (grp <= 4) || (grp == 6) || (grp == 8) || (grp == 16);
        assert_int_equal(kvf_fi_decode_group(grp), want);
        assert_null(kvf_fi_geometry(KVF_DTYPE_BF16, 128, 2 * grp, 2, 16, 16384, 1u << 30, 1,
                                    &g));
        assert_int_equal(g.decode_on_prefill, !want);
    }
    assert_non_null(kvf_fi_geometry(KVF_DTYPE_BF16, 128, 30, 8, 16, 65536, 1u << 30, 1, &g));
    assert_non_null(kvf_fi_geometry(KVF_DTYPE_BF16, 0, 32, 8, 16, 65536, 1u << 30, 1, &g));
    assert_non_null(kvf_fi_geometry(KVF_DTYPE_BF16, 128, 32, 8, 16, 1024, 1u << 30, 1, &g));
    /* a page padded by 16 bytes: unit 16 bytes, so a pool past 32 GiB overflows the indices */
    assert_non_null(strstr(kvf_fi_geometry(KVF_DTYPE_BF16, 128, 32, 8, 16, 65552, 40ull << 30, 1,
                                           &g), "INT32_MAX"));
    assert_null(kvf_fi_geometry(KVF_DTYPE_BF16, 128, 32, 8, 16, 65552, 1ull << 30, 1, &g));
    /* padded by 2 bytes: pages off FlashInfer's 16-byte vector alignment */
    assert_non_null(strstr(kvf_fi_geometry(KVF_DTYPE_BF16, 128, 32, 8, 16, 65538, 1ull << 30, 1,
                                           &g), "multiple of 16"));
    assert_int_equal(kvf_fi_built(KVF_DTYPE_FP32, 128), 0);
}

/* every K and V element of the first tokens of a request, both ways */
static void check_elements(kvf_dtype_t dt, int kvh, int hd, int kbs, int block_size, int slots,
                           int slot, size_t page_size)
{
    const int32_t table[] = {7, 2, 11, 0};
    const int tokens = 3 * block_size + kbs / 2;
    const size_t elt = kvf_dtype_size(dt);
    const size_t kbb = 2u * (size_t)kvh * (size_t)kbs * (size_t)hd * elt;
    kvf_fi_geom_t g;
    int32_t pages[256];

    assert_null(kvf_fi_geometry(dt, hd, kvh * 4, kvh, kbs, page_size, 64u << 20, 1, &g));
    int n = kvf_fi_pages(&g, table, block_size, slots, slot, page_size, tokens, pages, 256);
    assert_int_equal(n, (tokens + kbs - 1) / kbs);
    for (int pos = 0; pos < tokens; ++pos) {
        size_t kb0 = kvf_attn_kblock_offset(table, block_size, kbs, slots, slot, page_size, kbb,
                                            pos);
        int row = pos % kbs;
        for (int h = 0; h < kvh; ++h) {
            uint64_t fk = (uint64_t)pages[pos / kbs] * g.stride_page + (uint64_t)h * g.stride_h +
                          (uint64_t)row * g.stride_n;
            assert_int_equal(fk * elt, kb0 + kvf_attn_row_first((size_t)kvh, (size_t)kbs,
                                                                (size_t)hd, (size_t)h,
                                                                (size_t)row, 0) * elt);
            assert_int_equal((fk + g.v_offset) * elt,
                             kb0 + kvf_attn_row_first((size_t)kvh, (size_t)kbs, (size_t)hd,
                                                      (size_t)h, (size_t)row, 1) * elt);
        }
    }
    {   /* slot 0's indices serve slot j through a base moved by j pages (the forward's one
         * plan per cache group, common/runtime/kvf_model_fi.c) */
        int32_t p0[256];
        assert_int_equal(page_size % g.unit, 0);
        assert_int_equal(kvf_fi_pages(&g, table, block_size, slots, 0, page_size, tokens, p0,
                                      256), n);
        for (int i = 0; i < n; ++i) {
            assert_int_equal((uint64_t)pages[i] * g.unit,
                             (uint64_t)p0[i] * g.unit + (uint64_t)slot * page_size);
        }
    }
    assert_int_equal(kvf_fi_pages(&g, table, block_size, slots, slot, page_size, tokens, pages,
                                  n - 1), -1);
    assert_int_equal(kvf_fi_pages(&g, table, block_size, slots, slots, page_size, tokens, pages,
                                  256), -1);
}

/* the same through kvf_fi_geometry_kv() at both KV layouts (kvf_kv_layout.h): FlashInfer's
 * address of every K and V row (page index, head stride, v_offset, and slot j's base moved
 * by j slots) is the strides' own, kvf_kv_pos_run_off() */
static void check_elements_kv(int layout, int kvh, int hd, int kbs, int block_size, int slots,
                              size_t page_size)
{
    const int32_t table[] = {7, 2, 11, 0};
    const int tokens = 3 * block_size + kbs / 2;
    const size_t elt = 2;
    const kvf_kv_strides_t st = kvf_kv_strides_make(layout, slots, page_size, block_size / kbs,
                                                    kvh, kbs, hd, elt);
    kvf_fi_geom_t g;
    int32_t pages[256];

    assert_null(kvf_fi_geometry_kv(KVF_DTYPE_BF16, hd, kvh * 4, kvh, kbs, &st, 64u << 20, 1,
                                   &g));
    assert_int_equal(kvf_fi_pages_kv(&g, table, block_size, 0, tokens, pages, 256),
                     (tokens + kbs - 1) / kbs);
    for (int slot = 0; slot < slots; ++slot) {
        assert_int_equal(st.slot % g.unit, 0);
        for (int pos = 0; pos < tokens; ++pos) {
            const int row = pos % kbs;
            for (int h = 0; h < kvh; ++h) {
                uint64_t fk = (uint64_t)slot * st.slot / elt +
                              (uint64_t)pages[pos / kbs] * g.stride_page +
                              (uint64_t)h * g.stride_h + (uint64_t)row * g.stride_n;
                for (int kv = 0; kv < 2; ++kv) {
                    assert_int_equal((fk + (kv ? g.v_offset : 0)) * elt,
                                     kvf_kv_pos_run_off(&st, table, block_size, kbs, slot, pos,
                                                        kv, h) + (size_t)row * hd * elt);
                }
            }
        }
    }
    assert_int_equal(kvf_fi_pages_kv(&g, table, block_size, slots, tokens, pages, 256), -1);
}

static void test_elements_kv_layouts(void **state)
{
    (void)state;
    for (int layout = 0; layout < KVF_KV_LAYOUT_COUNT; ++layout) {
        check_elements_kv(layout, 2, 32, 16, 32, 3, 2u * 2 * 2 * 16 * 32 * 2);
        check_elements_kv(layout, 4, 64, 16, 48, 2, 3u * 2 * 4 * 16 * 64 * 2);
        check_elements_kv(layout, 1, 128, 32, 32, 4, 2u * 1 * 32 * 128 * 2);
    }
}

static void test_elements(void **state)
{
    (void)state;
    /* pages that are 2 kernel blocks exactly */
    check_elements(KVF_DTYPE_BF16, 2, 32, 16, 32, 3, 1, 2u * 2 * 2 * 16 * 32 * 2);
    /* a hybrid's page, padded to its Mamba page (not a multiple of a kernel block) */
    check_elements(KVF_DTYPE_BF16, 2, 32, 16, 48, 2, 1, 3u * 2 * 2 * 16 * 32 * 2 + 1024);
    check_elements(KVF_DTYPE_BF16, 2, 32, 16, 32, 4, 3, 2u * 2 * 2 * 16 * 32 * 2 + 64);
    check_elements(KVF_DTYPE_FP16, 8, 128, 16, 16, 1, 0, 65536 + 65536 / 2);
}

static void test_plan(void **state)
{
    kvf_fi_geom_t g;
    const int32_t lens[] = {1, 2048, 2049, 5000, 16, 17};
    int32_t ri[64], ti[64], oi[8], ri1[16], ti1[16], oi1[2];

    (void)state;
    assert_null(kvf_fi_geometry(KVF_DTYPE_BF16, 128, 32, 8, 16, 65536, 1u << 30, 1, &g));
    assert_int_equal(g.chunk_pages, KVF_FI_SPLIT_TOKENS / 16);
    int n = kvf_fi_decode_plan(&g, lens, 6, ri, ti, oi, 64);
    /* 1 + 1 + 2 + 3 + 1 + 1 chunks (5000 tokens: 313 pages of 16, chunks of 128 pages) */
    assert_int_equal(n, 9);
    const int32_t want_o[] = {0, 1, 2, 4, 7, 8, 9};
    assert_memory_equal(oi, want_o, sizeof(want_o));
    assert_true((ri[4] == 3) && (ti[4] == 0) && (ri[6] == 3) && (ti[6] == 2));
    /* each request alone: the same chunks as inside the batch */
    for (int r = 0; r < 6; ++r) {
        int m = kvf_fi_decode_plan(&g, &lens[r], 1, ri1, ti1, oi1, 16);
        assert_int_equal(m, oi[r + 1] - oi[r]);
        for (int i = 0; i < m; ++i) {
            assert_int_equal(ri1[i], 0);
            assert_int_equal(ti1[i], ti[oi[r] + i]);
        }
    }
    /* a huge kernel block: one page a chunk at least */
    assert_null(kvf_fi_geometry(KVF_DTYPE_BF16, 32, 8, 2, 4096, 2u * 2 * 4096 * 32 * 2,
                                1u << 30, 1, &g));
    assert_int_equal(g.chunk_pages, 1);
    /* refused: a zero length, too small a plan */
    const int32_t zero[] = {0};
    assert_int_equal(kvf_fi_decode_plan(&g, zero, 1, ri, ti, oi, 64), -1);
    assert_int_equal(kvf_fi_decode_plan(&g, lens, 6, ri, ti, oi, 3), -1);
}

static void test_prefill_plan(void **state)
{
    const int32_t qo[] = {1, 16, 17, 100};
    int32_t ri[64], qi[64], ki[64], qp[5], ri1[16], qi1[16], ki1[16], qp1[2];

    (void)state;
    /* GQA group 4: 4, 64, 68 and 400 packed rows: 1, 1, 2 and 7 tiles of 64 */
    int n = kvf_fi_prefill_plan(qo, 4, 4, ri, qi, ki, qp, 64);
    assert_int_equal(n, 11);
    const int32_t want_q[] = {0, 1, 17, 34, 134};
    assert_memory_equal(qp, want_q, sizeof(want_q));
    assert_true((ri[2] == 2) && (qi[2] == 0) && (ri[3] == 2) && (qi[3] == 1) && (ri[10] == 3) &&
                (qi[10] == 6));
    for (int i = 0; i < n; ++i) {
        assert_int_equal(ki[i], 0); /* never split over the KV */
    }
    /* each request alone: its tiles as in the batch */
    for (int r = 0, at = 0; r < 4; ++r) {
        int m = kvf_fi_prefill_plan(&qo[r], 1, 4, ri1, qi1, ki1, qp1, 16);
        for (int i = 0; i < m; ++i) {
            assert_int_equal(qi1[i], qi[at + i]);
            assert_int_equal(ri[at + i], r);
        }
        at += m;
    }
    const int32_t zero[] = {0};
    assert_int_equal(kvf_fi_prefill_plan(zero, 1, 4, ri, qi, ki, qp, 64), -1);
    assert_int_equal(kvf_fi_prefill_plan(qo, 4, 0, ri, qi, ki, qp, 64), -1);
    assert_int_equal(kvf_fi_prefill_plan(qo, 4, 4, ri, qi, ki, qp, 10), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_elements),
        cmocka_unit_test(test_elements_kv_layouts),
        cmocka_unit_test(test_plan),
        cmocka_unit_test(test_prefill_plan),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
