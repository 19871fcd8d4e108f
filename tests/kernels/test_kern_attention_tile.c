/*
 * The query tiles of the tiled CUDA attention (kernels/kvf_attention_tile.h)
 * against the per-token CUDA kernel's partition, on the CPU: for random
 * shapes (requests, rows, positions, kernel block size, head_dim, KV heads,
 * GQA ratio, split-K count) every query (row, query head) is in exactly one
 * tile per KV head it belongs to, and walking the tile's kernel blocks as the
 * kernel does (kvf_attn_tile_span, kvf_attn_tile_folds) gives each query
 * exactly the kernel blocks of each split-K range, in ascending order, that
 * the per-token kernel folds for it (the reference below restates that
 * kernel's rule: kernel block range y * per .. min(y * per + per, nkb) with
 * per from the query's own length), with its own request's block table, and
 * the K rows a tile reads cover every folding query's unmasked slots.
 */
#include "kvf_attention_tile.h"
#include "kvf_kern_test.h"

#include <stdlib.h>
#include <string.h>

/* the per-token kernel's range of split y for a query at position limit */
static void ref_range(int limit, int kbs, int y, int *a, int *b)
{
    const int nkb = limit / kbs + 1;
    const int min_per = (2048 + kbs - 1) / kbs, by_max = (nkb + 63) / 64;
    const int per = (by_max > min_per) ? by_max : min_per;
    *a = y * per;
    *b = (*a + per < nkb) ? *a + per : nkb;
}

typedef struct shape {
    int kbs, hd, kv_heads, group, num_seqs;
    int seq_tokens[8];
    int32_t *positions;   /* [sum seq_tokens] */
} shape_t;

static uint64_t rnd_u(kvf_test_rng_t *r, uint64_t n)
{
    return (uint64_t)kvf_test_rand(r, 0.0f, (float)n) % n;
}

/* Walk every tile of one shape as the kernel does; returns the (query, split) pairs checked. */
static size_t check_shape(const shape_t *s)
{
    const int q_heads = s->kv_heads * s->group, kbs = s->kbs;
    int T = 0, max_pos = 0;
    int seq_of[8 * 1024];

    for (int i = 0; i < s->num_seqs; ++i) {
        for (int j = 0; j < s->seq_tokens[i]; ++j) {
            seq_of[T + j] = i;
        }
        T += s->seq_tokens[i];
    }
    for (int t = 0; t < T; ++t) {
        max_pos = (s->positions[t] > max_pos) ? s->positions[t] : max_pos;
    }
    /* the launchers' split count: from the longest query of the launch */
    const int splits = kvf_attn_split_count(max_pos / kbs + 1, kbs);
    const int qt = kvf_attn_tile_queries(s->hd, kbs);
    assert_true(qt >= 2);
    assert_true(qt <= KVF_ATTN_TILE_Q_MAX);
    assert_true(qt * s->hd <= KVF_ATTN_TILE_ACC * KVF_ATTN_TILE_THREADS);
    assert_true((size_t)qt * (size_t)kbs <= KVF_ATTN_TILE_SCORES);
    assert_true(kvf_attn_tile_smem(qt, s->hd, kbs) <= 106624u);

    const int ntiles = kvf_attn_tile_count(s->seq_tokens, s->num_seqs, s->group, qt);
    int32_t *tiles = malloc((size_t)ntiles * 2 * sizeof(int32_t) + 1);
    /* next[(t * q_heads + qh) * splits + y]: the next kernel block the query must fold, -1
     * before its tile was seen */
    const size_t npairs = (size_t)T * (size_t)q_heads * (size_t)splits;
    int *next = malloc(npairs * sizeof(int));
    assert_non_null(tiles);
    assert_non_null(next);
    assert_int_equal(kvf_attn_tile_plan(s->seq_tokens, s->num_seqs, s->group, qt, tiles),
                     ntiles);
    for (size_t i = 0; i < npairs; ++i) {
        next[i] = -1;
    }
    for (int x = 0; x < ntiles; ++x) {
        const int u0 = tiles[2 * x], nq = tiles[2 * x + 1];
        assert_true((nq >= 1) && (nq <= qt));
        for (int kh = 0; kh < s->kv_heads; ++kh) {
            for (int y = 0; y < splits; ++y) {
                int lim[KVF_ATTN_TILE_Q_MAX], kb0[KVF_ATTN_TILE_Q_MAX], kb1[KVF_ATTN_TILE_Q_MAX];
                size_t pair[KVF_ATTN_TILE_Q_MAX];
                int t0, qh0, lo, hi;
                kvf_attn_tile_query(u0, s->group, kh, &t0, &qh0);
                for (int i = 0; i < nq; ++i) {
                    int t, qh, a, b;
                    kvf_attn_tile_query(u0 + i, s->group, kh, &t, &qh);
                    assert_true((t >= 0) && (t < T));
                    assert_true((qh >= 0) && (qh < q_heads));
                    /* the per-token kernel's KV head of qh, and the tile's one request */
                    assert_int_equal(qh / (q_heads / s->kv_heads), kh);
                    assert_int_equal(seq_of[t], seq_of[t0]);
                    lim[i] = s->positions[t];
                    kvf_attn_split_range(lim[i], 0, kbs, y, &kb0[i], &kb1[i]);
                    ref_range(lim[i], kbs, y, &a, &b);
                    assert_int_equal(kb0[i], a);
                    assert_int_equal(kb1[i], b);
                    pair[i] = ((size_t)t * q_heads + (size_t)qh) * splits + (size_t)y;
                    assert_int_equal(next[pair[i]], -1);   /* in one tile only */
                    next[pair[i]] = a;
                }
                kvf_attn_tile_span(kb0, kb1, nq, &lo, &hi);
                /* the kernel's walk: the folded blocks of the span, ascending */
                for (int kb = kvf_attn_tile_next(kb0, kb1, nq, lo - 1, hi); kb < hi;
                     kb = kvf_attn_tile_next(kb0, kb1, nq, kb, hi)) {
                    int want_rows = 0;
                    for (int i = 0; i < nq; ++i) {
                        if (kvf_attn_tile_folds(kb, kb0[i], kb1[i])) {
                            assert_int_equal(kb, next[pair[i]]);   /* its next, ascending */
                            ++next[pair[i]];
                            int r = lim[i] - kb * kbs + 1;
                            assert_true(r >= 1);   /* at least one unmasked slot */
                            r = (r > kbs) ? kbs : r;
                            want_rows = (r > want_rows) ? r : want_rows;
                        }
                    }
                    assert_true(want_rows > 0);   /* next() stops only where a query folds */
                    assert_int_equal(kvf_attn_tile_k_rows(lim, kb0, kb1, nq, kb, kbs),
                                     want_rows);
                }
                for (int i = 0; i < nq; ++i) {
                    int a, b;
                    ref_range(lim[i], kbs, y, &a, &b);
                    /* every block of its range folded (an empty range: none) */
                    assert_int_equal(next[pair[i]], (a < b) ? b : a);
                    next[pair[i]] = -2;   /* done */
                }
            }
        }
    }
    for (size_t i = 0; i < npairs; ++i) {
        if (next[i] != -2) {
            fail_msg("query %zu split %zu is in no tile", i / (size_t)splits,
                     i % (size_t)splits);
        }
    }
    free(tiles);
    free(next);
    return npairs;
}

static void test_tile_sizes(void **state)
{
    (void)state;
    assert_int_equal(kvf_attn_tile_queries(128, 16), 16);     /* 9B dense geometry */
    assert_int_equal(kvf_attn_tile_queries(32, 16), 16);      /* tiny models */
    assert_int_equal(kvf_attn_tile_queries(256, 16), 8);      /* 8 accumulators x 256 */
    assert_int_equal(kvf_attn_tile_queries(128, 1312), 12);   /* 9B hybrid kernel block */
    assert_int_equal(kvf_attn_tile_queries(128, 8192), 2);    /* KVF_ATTN_KBS_MAX */
    assert_int_equal(kvf_attn_tile_queries(2048, 16), 0);     /* one query: per-token */
    assert_int_equal(kvf_attn_tile_queries(64, 16384), 0);
    assert_int_equal(kvf_attn_tile_smem(8, 256, 2048), 4u * (2048 + 16384 + 32 * 257));
    /* staging passes: PF values a thread, at most KVF_ATTN_TILE_ROWS rows */
    assert_int_equal(kvf_attn_tile_pass_rows(32), 32);
    assert_int_equal(kvf_attn_tile_pass_rows(64), 32);
    assert_int_equal(kvf_attn_tile_pass_rows(128), 16);
    assert_int_equal(kvf_attn_tile_pass_rows(80), 25);
    assert_int_equal(kvf_attn_tile_pass_rows(256), 8);
    for (int hd = 1; hd <= KVF_ATTN_HD_MAX; ++hd) {
        const int pr = kvf_attn_tile_pass_rows(hd);
        assert_true((pr >= 1) && (pr <= KVF_ATTN_TILE_ROWS));
        assert_true(pr * hd <= KVF_ATTN_TILE_PF * KVF_ATTN_TILE_THREADS);
    }
    /* the largest tile of the GPU limits (head_dim 256, 8 queries x kbs 2048) */
    size_t most = 0;
    for (int hd = 16; hd <= KVF_ATTN_HD_MAX; hd += 16) {
        for (int kbs = 16; kbs <= KVF_ATTN_KBS_MAX; kbs += 16) {
            const int qt = kvf_attn_tile_queries(hd, kbs);
            assert_true(qt >= 2);
            size_t b = kvf_attn_tile_smem(qt, hd, kbs);
            most = (b > most) ? b : most;
        }
    }
    assert_int_equal(most, 106624u);
}

/* A request cut into tiles: 3 rows x group 5 = 15 queries in runs of 4, u from the first
 * query of the request, then a 1-row request */
static void test_tile_plan(void **state)
{
    const int rows[2] = {3, 1};
    int32_t tiles[16];
    int t, qh;
    (void)state;
    assert_int_equal(kvf_attn_tile_count(rows, 2, 5, 4), 4 + 2);
    assert_int_equal(kvf_attn_tile_plan(rows, 2, 5, 4, tiles), 6);
    const int32_t want[12] = {0, 4, 4, 4, 8, 4, 12, 3, 15, 4, 19, 1};
    assert_memory_equal(tiles, want, sizeof(want));
    kvf_attn_tile_query(13, 5, 2, &t, &qh);   /* row 2, head 3 of KV head 2's five */
    assert_int_equal(t, 2);
    assert_int_equal(qh, 13);
    int kb0[3] = {4, 0, 9}, kb1[3] = {6, 0, 12}, lo, hi;   /* the middle one empty */
    kvf_attn_tile_span(kb0, kb1, 3, &lo, &hi);
    assert_int_equal(lo, 4);
    assert_int_equal(hi, 12);
    assert_false(kvf_attn_tile_folds(7, kb0[0], kb1[0]));
    assert_false(kvf_attn_tile_folds(7, kb0[2], kb1[2]));   /* a gap: no query folds 7 */
    assert_int_equal(kvf_attn_tile_next(kb0, kb1, 3, lo - 1, hi), 4);
    assert_int_equal(kvf_attn_tile_next(kb0, kb1, 3, 5, hi), 9);   /* over the gap 6..8 */
    assert_int_equal(kvf_attn_tile_next(kb0, kb1, 3, 11, hi), hi);
    const int lim[3] = {5 * 16 + 3, 0, 11 * 16 + 15};
    assert_int_equal(kvf_attn_tile_k_rows(lim, kb0, kb1, 3, 5, 16), 4);
    assert_int_equal(kvf_attn_tile_k_rows(lim, kb0, kb1, 3, 4, 16), 16);
    assert_int_equal(kvf_attn_tile_k_rows(lim, kb0, kb1, 3, 7, 16), 0);
    kb1[2] = 9;   /* all empty */
    kb1[0] = 4;
    kvf_attn_tile_span(kb0, kb1, 3, &lo, &hi);
    assert_true(lo >= hi);
}

/* The shapes of the models in tests/data/models: Nemotron-Nano-9B-v2 (40 query heads, 8 KV
 * heads, head_dim 128; kernel blocks of 16 and its hybrid 1312), tiny models (8/2, 32) */
static void test_tile_model_shapes(void **state)
{
    static const int kbss[2] = {16, 1312};
    static int32_t pos[16 * 512];
    (void)state;
    for (int k = 0; k < 2; ++k) {
        for (int m = 0; m < 2; ++m) {
            shape_t s = {.kbs = kbss[k], .hd = m ? 32 : 128, .kv_heads = m ? 2 : 8,
                         .group = m ? 4 : 5, .num_seqs = 1, .positions = pos};
            /* prefill chunks of 512 at the start and at 8k, then a decode batch of 16 */
            for (int p0 = 0; p0 <= 7680; p0 += 7680) {
                s.num_seqs = 1;
                s.seq_tokens[0] = 512;
                for (int t = 0; t < 512; ++t) {
                    pos[t] = p0 + t;
                }
                assert_true(check_shape(&s) >= (size_t)512 * s.kv_heads * s.group);
            }
            s.num_seqs = 8;
            for (int i = 0; i < 8; ++i) {
                s.seq_tokens[i] = 1;
                pos[i] = 37 + 1023 * i * i;   /* up to 50k: several split-K ranges */
            }
            assert_true(check_shape(&s) > (size_t)8 * s.kv_heads * s.group);
        }
    }
}

static void test_tile_random_shapes(void **state)
{
    static const int kbss[] = {16, 32, 48, 64, 96, 128, 256, 512, 1312, 2048, 4096, 8192, 5, 24};
    static const int hds[] = {32, 64, 80, 96, 128, 256};
    static int32_t pos[8 * 1024];
    kvf_test_rng_t r = {0x2545f4914f6cdd1dull};
    size_t pairs = 0;
    (void)state;
    for (int n = 0; n < 400; ++n) {
        shape_t s = {.kbs = kbss[rnd_u(&r, sizeof(kbss) / sizeof(kbss[0]))],
                     .hd = hds[rnd_u(&r, sizeof(hds) / sizeof(hds[0]))],
                     .kv_heads = 1 + (int)rnd_u(&r, 8), .group = 1 + (int)rnd_u(&r, 8),
                     .num_seqs = 1 + (int)rnd_u(&r, 6), .positions = pos};
        const int kind = (int)rnd_u(&r, 4);   /* 0,1 prefill; 2 decode; 3 any positions */
        /* positions up to 8k mostly, some up to 600k with the large kernel blocks (per grows
         * past the 64-range cap; the walk costs rows x heads x kernel blocks) */
        const int pmax = (rnd_u(&r, 8) == 0) ? 600000 : 8192;
        if (pmax > 8192) {
            s.kbs = kbss[8 + rnd_u(&r, 4)];
        }
        int o = 0;
        for (int i = 0; i < s.num_seqs; ++i) {
            int rows = (kind == 2) ? 1 : 1 + (int)rnd_u(&r, (pmax > 8192) ? 40 : 512);
            const int p0 = (int)rnd_u(&r, (uint64_t)pmax);
            s.seq_tokens[i] = rows;
            for (int t = 0; t < rows; ++t) {
                pos[o + t] = (kind == 3) ? (int)rnd_u(&r, (uint64_t)pmax) : p0 + t;
            }
            o += rows;
        }
        pairs += check_shape(&s);
    }
    /* the shapes were real work: many (query, split) pairs walked */
    printf("walked %zu (query, split) pairs\n", pairs);
    assert_true(pairs > 5000000u);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tile_sizes),
        cmocka_unit_test(test_tile_plan),
        cmocka_unit_test(test_tile_model_shapes),
        cmocka_unit_test(test_tile_random_shapes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
