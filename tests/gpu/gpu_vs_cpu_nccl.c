/*
 * TEST ONLY: gpu_vs_cpu's NCCL rows: two GPUs, one thread per rank as the TP runner's, and
 * the stream-ordered collectives (gpu_vs_cpu.c has the table).
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

/* ---- NCCL over 2 GPUs (cuda:0, cuda:1), one thread per rank as the TP runner's ---- */
enum { NCCL2_N = 4096 };

typedef struct {
    kvf_device_t         dev;
    const kvf_nccl_id_t *id;
    int                  rank;
    int                  rc;
    const char          *what;   /* the step that failed */
    float                sum[NCCL2_N];
    float                bcast[NCCL2_N];
} nccl2_arg_t;

/* rank r: all-reduce of (i + 1000 r), then a broadcast of 0.5 i from rank 1; each checked */
static void *nccl2_rank(void *p)
{
    nccl2_arg_t *a = p;
    kvf_nccl_comm_h comm = NULL;
    static float h[2][NCCL2_N];
    float *mine = h[a->rank];
    void *d = NULL;

    for (int i = 0; i < NCCL2_N; ++i) {
        mine[i] = (float)(i + 1000 * a->rank);
    }
#define NCCL2_STEP(_what, _call) \
    if (a->rc == KVF_KERN_OK) {  \
        a->what = (_what);       \
        a->rc = (_call);         \
    }
    NCCL2_STEP("bind", kvf_device_bind(&a->dev));
    NCCL2_STEP("alloc", kvf_device_alloc(&a->dev, sizeof(a->sum), &d));
    NCCL2_STEP("comm init", kvf_nccl_comm_init(&a->dev, a->id, 2, a->rank, 30000, &comm));
    NCCL2_STEP("up", kvf_device_memcpy(&a->dev, d, mine, sizeof(a->sum), KVF_COPY_H2D));
    NCCL2_STEP("all-reduce", kvf_nccl_all_reduce_sum(comm, d, d, NCCL2_N));
    NCCL2_STEP("down", kvf_device_memcpy(&a->dev, a->sum, d, sizeof(a->sum), KVF_COPY_D2H));
    for (int i = 0; i < NCCL2_N; ++i) {
        mine[i] = (a->rank == 1) ? 0.5f * (float)i : -1.0f;
    }
    NCCL2_STEP("up", kvf_device_memcpy(&a->dev, d, mine, sizeof(a->sum), KVF_COPY_H2D));
    NCCL2_STEP("broadcast", kvf_nccl_broadcast(comm, d, d, sizeof(a->bcast), 1));
    NCCL2_STEP("down", kvf_device_memcpy(&a->dev, a->bcast, d, sizeof(a->bcast), KVF_COPY_D2H));
#undef NCCL2_STEP
    kvf_nccl_comm_destroy(comm);   /* both ranks at once: each finalize waits for the other */
    kvf_device_free(&a->dev, d);
    return NULL;
}

static void check_nccl_two(void)
{
    static nccl2_arg_t a[2];
    static float want_sum[2 * NCCL2_N], want_bc[2 * NCCL2_N], got_sum[2 * NCCL2_N],
                 got_bc[2 * NCCL2_N];
    kvf_device_t d1;
    kvf_nccl_id_t id;
    pthread_t th[2];

    if (kvf_device_init(KVF_DEVICE_CUDA, 1, &d1) != KVF_KERN_OK) {
        printf("| %-28s | %-5s | %-12s | %-12s | %-7s | %s |\n", "nccl 2 GPUs", "-", "-", "-",
               "-", "not run (one GPU)");
        (void)kvf_device_bind(&gdev);
        return;
    }
    (void)kvf_device_bind(&gdev);
    CK("nccl id (2 GPUs)", kvf_nccl_id_make(&id));
    for (int r = 0; r < 2; ++r) {
        a[r] = (nccl2_arg_t){.dev = (r == 0) ? gdev : d1, .id = &id, .rank = r};
        a[r].dev.stream = NULL;
        if (pthread_create(&th[r], NULL, nccl2_rank, &a[r]) != 0) {
            die("pthread_create (nccl 2 GPUs)", KVF_KERN_ENOMEM);
        }
    }
    for (int r = 0; r < 2; ++r) {
        pthread_join(th[r], NULL);
    }
    (void)kvf_device_bind(&gdev);
    for (int r = 0; r < 2; ++r) {
        if (a[r].rc != KVF_KERN_OK) {
            printf("| %-28s | %-5s | %-12s | %-12s | %-7s | FAIL (rank %d: %s: %s) |\n",
                   "nccl 2 GPUs", "fp32", "-", "-", "0", r, a[r].what,
                   kvf_kern_strerror(a[r].rc));
            failures++;
            return;
        }
        for (int i = 0; i < NCCL2_N; ++i) {
            want_sum[r * NCCL2_N + i] = (float)(2 * i + 1000);
            want_bc[r * NCCL2_N + i] = 0.5f * (float)i;
            got_sum[r * NCCL2_N + i] = a[r].sum[i];
            got_bc[r * NCCL2_N + i] = a[r].bcast[i];
        }
    }
    rowf("nccl all_reduce (2 GPUs)", "fp32", got_sum, want_sum, 2 * NCCL2_N, 0.0);
    rowf("nccl broadcast (2 GPUs)", "fp32", got_bc, want_bc, 2 * NCCL2_N, 0.0);
}

/* a pool on its own stream (zeroing ordered there), and one-rank NCCL collectives */
void check_stream_nccl(void)
{
    enum { N = 4096 };
    static const int64_t ids[2] = {1, 3};
    float h[N], back[4 * N];
    kvf_device_t own;
    void *dp;
    int ok;

    for (int i = 0; i < N; ++i) {
        h[i] = (float)i;
    }
    CK("stream create", kvf_device_stream_create(&gdev, &own));
    CK("alloc", kvf_device_alloc(&own, 4 * N * 4, &dp));
    ok = (gdev.kind != KVF_DEVICE_CUDA) || kvf_device_ptr_is_cuda(dp);
    CK("fill", kvf_device_memset(&own, dp, 0x55, 4 * N * 4));
    CK("zero", kvf_blocks_zero(&own, dp, N * 4, ids, 2));
    CK("sync", kvf_device_sync(&own));
    CK("back", kvf_device_memcpy(&own, back, dp, sizeof(back), KVF_COPY_D2H));
    ok = ok && (back[N] == 0.0f) && (back[3 * N + 17] == 0.0f) && (back[0] != 0.0f);
    printf("| %-28s | %-5s | %-12s | %-12s | %-7s | %s |\n", "blocks_zero on own stream", "u8",
           ok ? "0" : "wrong", "-", "0", ok ? "PASS" : "FAIL");
    failures += ok ? 0 : 1;
    if (kvf_nccl_available() && (gdev.kind == KVF_DEVICE_CUDA)) {
        kvf_nccl_id_t id;
        kvf_nccl_comm_h comm = NULL;
        CK("nccl id", kvf_nccl_id_make(&id));
        CK("nccl init", kvf_nccl_comm_init(&own, &id, 1, 0, 30000, &comm));
        CK("up", kvf_device_memcpy(&own, dp, h, sizeof(h), KVF_COPY_H2D));
        CK("all-reduce", kvf_nccl_all_reduce_sum(comm, dp, (float *)dp + N, N));
        CK("all-gather", kvf_nccl_all_gather(comm, (float *)dp + N, (float *)dp + 2 * N, N));
        CK("broadcast", kvf_nccl_broadcast(comm, dp, (float *)dp + 3 * N, N * 4, 0));
        down(back, dp, sizeof(back));
        rowf("nccl all_reduce (1 rank)", "fp32", back + N, h, N, 0.0);
        rowf("nccl all_gather (1 rank)", "fp32", back + 2 * N, h, N, 0.0);
        rowf("nccl broadcast (1 rank)", "fp32", back + 3 * N, h, N, 0.0);
        kvf_nccl_comm_destroy(comm);
        check_nccl_two();
    } else {
        printf("| %-28s | %-5s | %-12s | %-12s | %-7s | %s |\n", "nccl collectives", "-", "-",
               "-", "-", kvf_nccl_available() ? "not run (CPU device)" : "not built (no NCCL)");
    }
    kvf_device_free(&own, dp);
    kvf_device_stream_destroy(&own);
}
