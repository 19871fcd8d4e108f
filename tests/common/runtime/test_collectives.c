/*
 * CPU collectives: full and span all-reduce and broadcast across rank
 * threads, repeated many times to stress the spin/futex barrier, checked
 * against sums computed here.
 */
#include "kvf_collectives.h"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <pthread.h>
#include <string.h>

#define RANKS 4
#define N     37
#define ITERS 2000

typedef struct {
    kvf_comm_t *comm;
    int         errors;
} kvf_rank_arg_t;

static void *kvf_rank_main(void *p)
{
    kvf_rank_arg_t *a = p;
    const int r = a->comm->rank;
    float buf[N];
    int bc[4];

    for (int it = 0; it < ITERS; ++it) {
        for (int i = 0; i < N; ++i) {
            buf[i] = (float)(r * 1000 + i + it);
        }
        if (kvf_comm_all_reduce(a->comm, buf, N) != KVF_OK) {
            a->errors++;
        }
        for (int i = 0; i < N; ++i) {
            /* sum over r of (1000 r + i + it) = 6000 + 4 (i + it) */
            a->errors += (buf[i] != (float)(6000 + RANKS * (i + it)));
        }
        for (int i = 0; i < N; ++i) {
            buf[i] = (float)(r + 1);
        }
        if (kvf_comm_all_reduce_span(a->comm, buf, N, 2) != KVF_OK) {
            a->errors++;
        }
        /* ranks {0,1} -> 1 + 2 = 3, ranks {2,3} -> 3 + 4 = 7 */
        a->errors += (buf[N - 1] != ((r < 2) ? 3.0f : 7.0f));
        memset(bc, 0, sizeof(bc));
        if (r == it % RANKS) {
            bc[0] = it;
            bc[3] = -it;
        }
        (void)kvf_comm_broadcast(a->comm, bc, sizeof(bc), it % RANKS);
        a->errors += (bc[0] != it) || (bc[3] != -it);
    }
    a->errors += (kvf_comm_barrier(a->comm) != KVF_OK);
    return NULL;
}

static void test_cpu_collectives(void **state)
{
    kvf_comm_world_h w;
    pthread_t th[RANKS];
    kvf_rank_arg_t args[RANKS];

    (void)state;
    assert_int_equal(kvf_comm_world_create_cpu(RANKS, &w), KVF_OK);
    for (int r = 0; r < RANKS; ++r) {
        args[r] = (kvf_rank_arg_t){kvf_comm_world_rank(w, r), 0};
        assert_int_equal(args[r].comm->rank, r);
        assert_int_equal(pthread_create(&th[r], NULL, kvf_rank_main, &args[r]), 0);
    }
    for (int r = 0; r < RANKS; ++r) {
        pthread_join(th[r], NULL);
        assert_int_equal(args[r].errors, 0);
    }
    assert_null(kvf_comm_world_rank(w, RANKS));
    kvf_comm_world_destroy(w);
    assert_int_equal(kvf_comm_world_create_cpu(0, &w), KVF_ERR_INVALID_PARAM);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_collectives),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
