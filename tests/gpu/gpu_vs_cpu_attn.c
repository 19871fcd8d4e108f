/*
 * TEST ONLY: gpu_vs_cpu's attention rows: paged attention, the batched and big-block
 * attention, and the stale-NaN case with and without kvf_blocks_zero (gpu_vs_cpu.c has the table).
 */
#include "kvf_act.h"
#include "kvf_argmax.h"
#include "kvf_attention.h"
#include "kvf_attention_seqs.h"
#include "kvf_conv1d.h"
#include "kvf_device.h"
#include "kvf_gemm.h"
#include "kvf_gemm_narrow.h"
#include "kvf_mamba2.h"
#include "kvf_moe.h"
#include "kvf_nccl.h"
#include "kvf_norm.h"
#include "kvf_ops.h"
#include "kvf_sample.h"
#include "kvf_ssm_seqs.h"
#include "gpu_vs_cpu.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* the attention rows' sizes (heads, head dim, block sizes, blocks, slots, pool, tokens) */
enum { A_KVH = 2, A_QH = 8, A_HD = 64, A_BS = 32, A_KBS = 16, A_NB = 5, A_SLOTS = 2,
       A_POOL_BLOCKS = 12, A_T = 150 };

static kvf_paged_kv_t attn_kv(void *base, kvf_dtype_t dt, const int32_t *table)
{
    kvf_paged_kv_t kv;
    memset(&kv, 0, sizeof(kv));
    kv.base = base;
    kv.slots = A_SLOTS;
    kv.slot = 1;
    kv.dtype = dt;
    kv.kv_heads = A_KVH;
    kv.head_dim = A_HD;
    kv.block_size = A_BS;
    kv.kernel_block_size = A_KBS;
    kv.block_table = table;
    kv.num_blocks = A_NB;
    kv.page_size = (size_t)(A_BS / A_KBS) * kvf_paged_kv_kernel_block_bytes(&kv);
    return kv;
}

/* prefill of A_T tokens then one decode token, per cache dtype */
void check_attention(kvf_dtype_t dt)
{
    static const int32_t table[A_NB] = {9, 2, 7, 0, 11};
    kvf_paged_kv_t kv = attn_kv(NULL, dt, table);
    size_t pool_bytes = (size_t)A_POOL_BLOCKS * A_SLOTS * kv.page_size;
    size_t qn = (size_t)(A_T + 1) * A_QH * A_HD, kn = (size_t)(A_T + 1) * A_KVH * A_HD;
    float *q = frand(qn, -1, 1), *k = frand(kn, -1, 1), *v = frand(kn, -1, 1);
    float *oc = malloc(qn * 4), *og = malloc(qn * 4);
    unsigned char *pc = calloc(1, pool_bytes), *pg = malloc(pool_bytes);
    int32_t pos[A_T + 1];
    float *dq = up(q, qn * 4), *dk = up(k, kn * 4), *dv = up(v, kn * 4), *dout = up(NULL, qn * 4);
    void *dpool = up(pc, pool_bytes);
    kvf_paged_kv_t kc = kv, kg = kv;
    char name[64];

    kc.base = pc;
    kg.base = dpool;
    for (int t = 0; t <= A_T; ++t) {
        pos[t] = t;
    }
    CK("write cpu", kvf_attn_cache_write(NULL, &kc, k, v, A_KVH * A_HD, pos, A_T));
    CK("write gpu", kvf_attn_cache_write(&gdev, &kg, dk, dv, A_KVH * A_HD, pos, A_T));
    down(pg, dpool, pool_bytes);
    row("attn_cache_write (pool)", kvf_dtype_name(dt), pg, pc, dt,
        pool_bytes / kvf_dtype_size(dt), 0.0);
    CK("attn cpu", kvf_attn_paged(NULL, &kc, q, A_QH * A_HD, pos, A_T, A_QH, 0.0f, oc));
    CK("attn gpu", kvf_attn_paged(&gdev, &kg, dq, A_QH * A_HD, pos, A_T, A_QH, 0.0f, dout));
    down(og, dout, (size_t)A_T * A_QH * A_HD * 4);
    snprintf(name, sizeof(name), "attn_paged prefill %d", A_T);
    rowf(name, kvf_dtype_name(dt), og, oc, (size_t)A_T * A_QH * A_HD, 1e-5);
    /* decode: token A_T */
    {
        size_t qo = (size_t)A_T * A_QH * A_HD, ko = (size_t)A_T * A_KVH * A_HD;
        CK("write cpu", kvf_attn_cache_write(NULL, &kc, k + ko, v + ko, A_KVH * A_HD, &pos[A_T], 1));
        CK("write gpu", kvf_attn_cache_write(&gdev, &kg, dk + ko, dv + ko, A_KVH * A_HD,
                                             &pos[A_T], 1));
        CK("attn cpu", kvf_attn_paged(NULL, &kc, q + qo, A_QH * A_HD, &pos[A_T], 1, A_QH, 0.0f,
                                      oc));
        CK("attn gpu", kvf_attn_paged(&gdev, &kg, dq + qo, A_QH * A_HD, &pos[A_T], 1, A_QH, 0.0f,
                                      dout));
        down(og, dout, (size_t)A_QH * A_HD * 4);
        rowf("attn_paged decode", kvf_dtype_name(dt), og, oc, (size_t)A_QH * A_HD, 1e-5);
    }
    /* a sliding window of 37 tokens (kvf_paged_kv_t.window): every row of the prompt and the
     * decode token attend to their last 37 keys only, on both */
    kc.window = 37;
    kg.window = 37;
    CK("attn cpu", kvf_attn_paged(NULL, &kc, q, A_QH * A_HD, pos, A_T + 1, A_QH, 0.0f, oc));
    CK("attn gpu", kvf_attn_paged(&gdev, &kg, dq, A_QH * A_HD, pos, A_T + 1, A_QH, 0.0f, dout));
    down(og, dout, (size_t)(A_T + 1) * A_QH * A_HD * 4);
    rowf("attn_paged window 37", kvf_dtype_name(dt), og, oc, (size_t)(A_T + 1) * A_QH * A_HD,
         1e-5);
    /* gpt-oss's attention sinks (kvf_paged_kv_t.sinks), one above every score, with the
     * window and without */
    {
        float hs[A_QH] = {0.5f, -1.0f, 30.0f, 2.0f, -3.0f, 0.0f, 1.5f, 0.25f};
        float *ds = up(hs, sizeof(hs));
        kc.sinks = hs;
        kg.sinks = ds;
        for (int w = 0; w < 2; ++w) {
            kc.window = kg.window = w ? 0 : 37;
            CK("attn cpu", kvf_attn_paged(NULL, &kc, q, A_QH * A_HD, pos, A_T + 1, A_QH, 0.0f,
                                          oc));
            CK("attn gpu", kvf_attn_paged(&gdev, &kg, dq, A_QH * A_HD, pos, A_T + 1, A_QH, 0.0f,
                                          dout));
            down(og, dout, (size_t)(A_T + 1) * A_QH * A_HD * 4);
            rowf(w ? "attn_paged sinks" : "attn_paged sinks window 37", kvf_dtype_name(dt), og,
                 oc, (size_t)(A_T + 1) * A_QH * A_HD, 1e-5);
        }
        kvf_device_free(&gdev, ds);
        kc.sinks = kg.sinks = NULL;
    }
    /* gemma2's score softcap (kvf_paged_kv_t.softcap, 0.75 binds), with the window and
     * without */
    kc.softcap = kg.softcap = 0.75f;
    for (int w = 0; w < 2; ++w) {
        kc.window = kg.window = w ? 0 : 37;
        CK("attn cpu", kvf_attn_paged(NULL, &kc, q, A_QH * A_HD, pos, A_T + 1, A_QH, 0.0f, oc));
        CK("attn gpu", kvf_attn_paged(&gdev, &kg, dq, A_QH * A_HD, pos, A_T + 1, A_QH, 0.0f,
                                      dout));
        down(og, dout, (size_t)(A_T + 1) * A_QH * A_HD * 4);
        rowf(w ? "attn_paged softcap" : "attn_paged softcap window 37", kvf_dtype_name(dt), og,
             oc, (size_t)(A_T + 1) * A_QH * A_HD, 1e-5);
    }
    kvf_device_free(&gdev, dq);
    kvf_device_free(&gdev, dk);
    kvf_device_free(&gdev, dv);
    kvf_device_free(&gdev, dout);
    kvf_device_free(&gdev, dpool);
    free(q);
    free(k);
    free(v);
    free(oc);
    free(og);
    free(pc);
    free(pg);
}

/* three requests in one call (kvf_attention_seqs.h): prefill chunks of 40, 70 and 3 tokens,
 * then one decode token each, against the CPU's per-request calls; pool and outputs */
void check_attention_seqs(kvf_dtype_t dt)
{
    static const int32_t t0[] = {9, 2}, t1[] = {7, 0, 11}, t2[] = {1};
    static const int32_t *const tables[3] = {t0, t1, t2};
    static const int nb[3] = {2, 3, 1}, pre[3] = {40, 70, 3};
    const int T = 40 + 70 + 3;
    kvf_paged_kv_t kv = attn_kv(NULL, dt, t0);
    size_t pool_bytes = (size_t)A_POOL_BLOCKS * A_SLOTS * kv.page_size;
    size_t qn = (size_t)(T + 3) * A_QH * A_HD, kn = (size_t)(T + 3) * A_KVH * A_HD;
    float *q = frand(qn, -1, 1), *k = frand(kn, -1, 1), *v = frand(kn, -1, 1);
    float *oc = malloc(qn * 4), *og = malloc(qn * 4);
    unsigned char *pc = calloc(1, pool_bytes), *pg = malloc(pool_bytes);
    int32_t pos[40 + 70 + 3 + 3];
    float *dq = up(q, qn * 4), *dk = up(k, kn * 4), *dv = up(v, kn * 4), *dout = up(NULL, qn * 4);
    void *dpool = up(pc, pool_bytes);
    kvf_paged_kv_t kc = kv, kg = kv;
    kvf_attn_seqs_t seqs = {.num_seqs = 3, .num_tokens = pre, .block_tables = tables,
                            .num_blocks = nb};
    static const int one[3] = {1, 1, 1};
    const int ld = A_KVH * A_HD, ldq = A_QH * A_HD;
    char name[64];

    kc.base = pc;
    kg.base = dpool;
    for (int i = 0, o = 0; i < 3; ++i) {
        for (int t = 0; t < pre[i]; ++t) {
            pos[o++] = t;
        }
        pos[T + i] = pre[i];
    }
    CK("seqs cpu", kvf_attn_write_paged_seqs(NULL, &kc, &seqs, k, v, ld, q, ldq, pos, A_QH,
                                             0.0f, oc));
    CK("seqs gpu", kvf_attn_write_paged_seqs(&gdev, &kg, &seqs, dk, dv, ld, dq, ldq, pos, A_QH,
                                             0.0f, dout));
    down(og, dout, (size_t)T * A_QH * A_HD * 4);
    snprintf(name, sizeof(name), "attn 3 seqs prefill %d", T);
    rowf(name, kvf_dtype_name(dt), og, oc, (size_t)T * A_QH * A_HD, 1e-5);
    seqs.num_tokens = one;   /* decode: one token each, split-K */
    CK("seqs cpu", kvf_attn_write_paged_seqs(NULL, &kc, &seqs, k + (size_t)T * ld,
                                             v + (size_t)T * ld, ld, q + (size_t)T * ldq, ldq,
                                             pos + T, A_QH, 0.0f, oc));
    CK("seqs gpu", kvf_attn_write_paged_seqs(&gdev, &kg, &seqs, dk + (size_t)T * ld,
                                             dv + (size_t)T * ld, ld, dq + (size_t)T * ldq,
                                             ldq, pos + T, A_QH, 0.0f, dout));
    down(og, dout, (size_t)3 * A_QH * A_HD * 4);
    rowf("attn 3 seqs decode", kvf_dtype_name(dt), og, oc, (size_t)3 * A_QH * A_HD, 1e-5);
    {
        /* a graphed decode step's call (kvf_model_graph.c): the tables packed by the caller
         * (width 4), split-K sized for a far longer context: the unpacked call's bits */
        enum { W = 4 };
        int32_t packed[2 * 3 + 3 * W] = {0, 1, 2};
        float *o2 = malloc((size_t)3 * A_QH * A_HD * 4);
        kvf_attn_seqs_t ps = seqs;
        for (int i = 0; i < 3; ++i) {
            packed[3 + i] = pos[T + i];
            memcpy(packed + 6 + i * W, tables[i], (size_t)nb[i] * sizeof(int32_t));
        }
        ps.packed = packed;
        ps.packed_maxb = W;
        ps.split_blocks = 4000;
        CK("seqs gpu packed", kvf_attn_write_paged_seqs(&gdev, &kg, &ps, dk + (size_t)T * ld,
                                                        dv + (size_t)T * ld, ld,
                                                        dq + (size_t)T * ldq, ldq, pos + T,
                                                        A_QH, 0.0f, dout));
        down(o2, dout, (size_t)3 * A_QH * A_HD * 4);
        rowf("attn decode packed, 64 splits (bits)", kvf_dtype_name(dt), o2, og,
             (size_t)3 * A_QH * A_HD, 0.0);
        free(o2);
    }
    down(pg, dpool, pool_bytes);
    row("attn 3 seqs (pool)", kvf_dtype_name(dt), pg, pc, dt, pool_bytes / kvf_dtype_size(dt),
        0.0);
    kvf_device_free(&gdev, dq);
    kvf_device_free(&gdev, dk);
    kvf_device_free(&gdev, dv);
    kvf_device_free(&gdev, dout);
    kvf_device_free(&gdev, dpool);
    free(q);
    free(k);
    free(v);
    free(oc);
    free(og);
    free(pc);
    free(pg);
}

/* a hybrid model's kernel block: one 1312-token block (Nemotron-Nano-9B-v2's at TP 1),
 * 700 prompt tokens then one decode token, against the CPU */
void check_attention_big_block(kvf_dtype_t dt)
{
    enum { BS = 1312, T = 700, KVH = 2, QH = 8, HD = 128 };
    static const int32_t table[1] = {1};
    kvf_paged_kv_t kv;
    memset(&kv, 0, sizeof(kv));
    kv.slots = 1;
    kv.dtype = dt;
    kv.kv_heads = KVH;
    kv.head_dim = HD;
    kv.block_size = BS;
    kv.kernel_block_size = BS;
    kv.block_table = table;
    kv.num_blocks = 1;
    kv.page_size = kvf_paged_kv_kernel_block_bytes(&kv);
    size_t pool_bytes = 2 * kv.page_size;
    size_t qn = (size_t)(T + 1) * QH * HD, kn = (size_t)(T + 1) * KVH * HD;
    float *q = frand(qn, -1, 1), *k = frand(kn, -1, 1), *v = frand(kn, -1, 1);
    float *oc = malloc(qn * 4), *og = malloc(qn * 4);
    unsigned char *pc = calloc(1, pool_bytes);
    int32_t pos[T + 1];
    float *dq = up(q, qn * 4), *dk = up(k, kn * 4), *dv = up(v, kn * 4), *dout = up(NULL, qn * 4);
    void *dpool = up(pc, pool_bytes);
    kvf_paged_kv_t kc = kv, kg = kv;

    kc.base = pc;
    kg.base = dpool;
    for (int t = 0; t <= T; ++t) {
        pos[t] = t;
    }
    CK("write cpu", kvf_attn_cache_write(NULL, &kc, k, v, KVH * HD, pos, T + 1));
    CK("write gpu", kvf_attn_cache_write(&gdev, &kg, dk, dv, KVH * HD, pos, T + 1));
    CK("attn cpu", kvf_attn_paged(NULL, &kc, q, QH * HD, pos, T + 1, QH, 0.0f, oc));
    CK("attn gpu", kvf_attn_paged(&gdev, &kg, dq, QH * HD, pos, T + 1, QH, 0.0f, dout));
    down(og, dout, qn * 4);
    rowf("attn kernel block 1312", kvf_dtype_name(dt), og, oc, qn, 1e-5);
    CK("attn cpu", kvf_attn_paged(NULL, &kc, q + (size_t)T * QH * HD, QH * HD, &pos[T], 1, QH,
                                  0.0f, oc));
    CK("attn gpu", kvf_attn_paged(&gdev, &kg, dq + (size_t)T * QH * HD, QH * HD, &pos[T], 1,
                                  QH, 0.0f, dout));
    down(og, dout, (size_t)QH * HD * 4);
    rowf("attn kernel block 1312 dec", kvf_dtype_name(dt), og, oc, (size_t)QH * HD, 1e-5);
    kvf_device_free(&gdev, dq);
    kvf_device_free(&gdev, dk);
    kvf_device_free(&gdev, dv);
    kvf_device_free(&gdev, dout);
    kvf_device_free(&gdev, dpool);
    free(q);
    free(k);
    free(v);
    free(oc);
    free(og);
    free(pc);
}

/*
 * The stale-fp32 Mamba NaN case on the device: the pool's pages last held
 * fp32 Mamba state whose bytes decode as NaN in the KV dtype (0xff bytes:
 * NaN in fp32, bf16 and fp16); 5 tokens are written, so 11 slots of the
 * first kernel block are never written. Without zeroing the masked slots
 * still enter the value sum as 0 * NaN (expected NaN: the hazard is real on
 * the GPU too); with kvf_blocks_zero of the request's pages first there is
 * none and the output equals the CPU's.
 */
void check_stale_nan(kvf_dtype_t dt)
{
    static const int32_t table[A_NB] = {3, 4, 5, 6, 8};
    enum { T = 5 };
    kvf_paged_kv_t kv = attn_kv(NULL, dt, table);
    size_t pool_bytes = (size_t)A_POOL_BLOCKS * A_SLOTS * kv.page_size;
    size_t qn = (size_t)T * A_QH * A_HD, kn = (size_t)T * A_KVH * A_HD;
    float *q = frand(qn, -1, 1), *k = frand(kn, -1, 1), *v = frand(kn, -1, 1);
    float *oc = malloc(qn * 4), *og = malloc(qn * 4);
    unsigned char *pc = calloc(1, pool_bytes);
    float *dq = up(q, qn * 4), *dk = up(k, kn * 4), *dv = up(v, kn * 4), *dout = up(NULL, qn * 4);
    void *dpool = up(NULL, pool_bytes);
    int32_t pos[T] = {0, 1, 2, 3, 4};
    int64_t pages[A_NB * A_SLOTS];
    kvf_paged_kv_t kc = kv, kg = kv;
    char name[64];

    kc.base = pc;
    kg.base = dpool;
    for (int b = 0; b < A_NB; ++b) {
        for (int s = 0; s < A_SLOTS; ++s) {
            pages[b * A_SLOTS + s] = (int64_t)table[b] * A_SLOTS + s;
        }
    }
    CK("write cpu", kvf_attn_cache_write(NULL, &kc, k, v, A_KVH * A_HD, pos, T));
    CK("attn cpu", kvf_attn_paged(NULL, &kc, q, A_QH * A_HD, pos, T, A_QH, 0.0f, oc));
    for (int zero = 0; zero <= 1; ++zero) {
        size_t nan = 0;
        CK("stale fill", kvf_device_memset(&gdev, dpool, 0xff, pool_bytes));
        if (zero) {
            CK("blocks_zero", kvf_blocks_zero(&gdev, dpool, kv.page_size, pages, A_NB * A_SLOTS));
        }
        CK("write gpu", kvf_attn_cache_write(&gdev, &kg, dk, dv, A_KVH * A_HD, pos, T));
        CK("attn gpu", kvf_attn_paged(&gdev, &kg, dq, A_QH * A_HD, pos, T, A_QH, 0.0f, dout));
        down(og, dout, qn * 4);
        for (size_t i = 0; i < qn; ++i) {
            nan += isnan(og[i]) ? 1 : 0;
        }
        if (!zero) {
            int ok = nan > 0;
            snprintf(name, sizeof(name), "stale fp32 NaN, zeroing off");
            printf("| %-28s | %-5s | %-12s | %-12s | %-7s | %s (%zu/%zu NaN, expected) |\n",
                   name, kvf_dtype_name(dt), "NaN", "NaN", ">0 NaN", ok ? "PASS" : "FAIL", nan,
                   qn);
            failures += ok ? 0 : 1;
        } else {
            rowf("stale fp32 NaN, zeroing on", kvf_dtype_name(dt), og, oc, qn, 1e-5);
        }
    }
    kvf_device_free(&gdev, dq);
    kvf_device_free(&gdev, dk);
    kvf_device_free(&gdev, dv);
    kvf_device_free(&gdev, dout);
    kvf_device_free(&gdev, dpool);
    free(q);
    free(k);
    free(v);
    free(oc);
    free(og);
    free(pc);
}

/* conv1d: fresh chunk, continued chunk (T < kernel - 1), decode step; y and state */
