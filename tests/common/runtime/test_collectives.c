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

typedef struct {
    kvf_comm_t  *comm;
    kvf_status_t status;
} kvf_wait_arg_t;

static void *kvf_barrier_main(void *p)
{
    kvf_wait_arg_t *a = p;
    a->status = kvf_comm_barrier(a->comm);
    return NULL;
}

/* A rank that never arrives: the others get an error naming the barrier and its
 * timeout instead of hanging; the world stays broken for every later collective. */
static void test_barrier_timeout(void **state)
{
    kvf_comm_world_h w;
    pthread_t th[2];
    kvf_wait_arg_t args[2];
    const char *why;
    float x = 1.0f;

    (void)state;
    assert_int_equal(kvf_comm_world_create_cpu(3, &w), KVF_OK);
    assert_int_equal(kvf_comm_world_set_barrier(w, NULL, 100), KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_comm_world_set_barrier(w, "test-world", 100), KVF_OK);
    assert_null(kvf_comm_world_error(w));
    for (int r = 0; r < 2; ++r) {   /* ranks 0 and 1 meet; rank 2 is "stuck" */
        args[r] = (kvf_wait_arg_t){kvf_comm_world_rank(w, r), KVF_OK};
        assert_int_equal(pthread_create(&th[r], NULL, kvf_barrier_main, &args[r]), 0);
    }
    for (int r = 0; r < 2; ++r) {
        pthread_join(th[r], NULL);
        assert_int_equal(args[r].status, KVF_ERR_TIMED_OUT);
    }
    why = kvf_comm_world_error(w);
    assert_non_null(why);
    assert_non_null(strstr(why, "test-world barrier of 3 ranks"));
    assert_non_null(strstr(why, "100 ms"));
    /* the late rank, and any later collective, fail at once */
    assert_int_equal(kvf_comm_barrier(kvf_comm_world_rank(w, 2)), KVF_ERR_TIMED_OUT);
    assert_int_equal(kvf_comm_all_reduce(kvf_comm_world_rank(w, 0), &x, 1), KVF_ERR_TIMED_OUT);
    assert_true(x == 1.0f);
    kvf_comm_world_destroy(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_collectives),
        cmocka_unit_test(test_barrier_timeout),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
