/*
 * Contracts that run (kvf_contract.h): the thread rules of kvf_connector.h
 * abort a debug build when broken. Each case runs the offending call in a
 * forked child and expects the child to die of SIGABRT; the same calls from
 * the right thread succeed. The connector cases are skipped in builds that
 * compile the checks out (release); the primitive is checked in every build.
 */
#include "kvf_connector_ucx.h"
#include "kvf_contract.h"

#include "kvf_log.h"

#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#define P_BLOCKS 4

static kvf_model_config_t cfg;
static kvf_cache_layout_t layout;
static const kvf_connector_ops_t *ops;

typedef void (*child_func_t)(void);

/* Run @a fn in a child (bounded by alarm()); its wait status. */
static int run_child(child_func_t fn)
{
    int wstatus = 0;
    pid_t pid = fork();

    assert_true(pid >= 0);
    if (pid == 0) {
        alarm(20);             /* a child that neither aborts nor exits dies of SIGALRM */
        fn();
        _exit(0);
    }
    assert_int_equal(waitpid(pid, &wstatus, 0), pid);
    return wstatus;
}

static void assert_aborted(int wstatus)
{
    assert_true(WIFSIGNALED(wstatus));
    assert_int_equal(WTERMSIG(wstatus), SIGABRT);
}

static void assert_exited_ok(int wstatus)
{
    assert_true(WIFEXITED(wstatus));
    assert_int_equal(WEXITSTATUS(wstatus), 0);
}

static void *on_thread(void *arg)
{
    ((child_func_t)arg)();
    return NULL;
}

/* Call @a fn on a second thread and wait for it. */
static void run_on_other_thread(child_func_t fn)
{
    pthread_t th;
    if (pthread_create(&th, NULL, on_thread, (void *)fn) == 0) {
        pthread_join(th, NULL);
    }
}

/* ---- the primitive -------------------------------------------------- */

static kvf_thread_owner_t owner;

static void owner_check(void)
{
    kvf_thread_owner_check(&owner, "test op", __FILE__, __LINE__);
}

static void owner_claimed_here_checked_there(void)
{
    kvf_thread_owner_set(&owner);
    owner_check();                      /* the owner: fine */
    run_on_other_thread(owner_check);   /* another thread: abort */
}

static void owner_claimed_by_first_use(void)
{
    memset(&owner, 0, sizeof(owner));
    run_on_other_thread(owner_check);   /* claims it for that (now gone) thread */
    owner_check();                      /* this thread is not the owner: abort */
}

static void owner_same_thread(void)
{
    memset(&owner, 0, sizeof(owner));
    owner_check();
    owner_check();
}

static void test_owner_primitive(void **state)
{
    (void)state;
    assert_aborted(run_child(owner_claimed_here_checked_there));
    assert_aborted(run_child(owner_claimed_by_first_use));
    assert_exited_ok(run_child(owner_same_thread));
}

/* ---- the connector -------------------------------------------------- */

static kvf_connector_h conn;
static uint8_t *pool_mem;
static kvf_connector_pool_t pool;

static void create_decode(void)
{
    kvf_connector_config_t dc = {0};
    dc.engine_id = "decode-contract";
    dc.role = KVF_CONNECTOR_ROLE_DECODE;
    dc.tp_size = 1;
    dc.cfg = &cfg;
    if (ops->create(&dc, &conn) != KVF_OK) {
        _exit(3);
    }
}

static void register_rank0(void)
{
    kvf_rank_geometry_t g;

    memset(&pool, 0, sizeof(pool));
    kvf_cache_params_default(&cfg, &pool.params);
    if (kvf_rank_geometry_compute(&cfg, &pool.params, 1, 0, &g) != KVF_OK) {
        _exit(4);
    }
    pool.tp_rank = 0;
    pool.num_blocks = P_BLOCKS;
    pool.len = (size_t)P_BLOCKS * (size_t)layout.slots * g.page_size;
    pool_mem = calloc(1, pool.len);
    pool.base = pool_mem;
    if ((pool.base == NULL) || (ops->register_pool(conn, &pool) != KVF_OK)) {
        _exit(5);
    }
}

static void forget_unknown(void)
{
    /* the leader's own call: nothing cached, so NOT_FOUND */
    if (ops->forget_engine(conn, "nobody") != KVF_ERR_NOT_FOUND) {
        _exit(6);
    }
}

static void get_metadata_rank0(void)
{
    uint8_t buf[64 << 10];
    size_t len;
    if (ops->get_metadata(conn, 0, buf, sizeof(buf), &len) != KVF_OK) {
        _exit(7);
    }
}

/* leader op from a second thread */
static void leader_op_elsewhere(void)
{
    create_decode();
    forget_unknown();
    run_on_other_thread(forget_unknown);
}

/* rank op from a thread other than the one that registered the rank */
static void rank_op_elsewhere(void)
{
    create_decode();
    register_rank0();
    get_metadata_rank0();
    run_on_other_thread(get_metadata_rank0);
}

/* the daemons' way: every op on the leader */
static void all_on_leader(void)
{
    create_decode();
    register_rank0();
    get_metadata_rank0();
    forget_unknown();
    ops->destroy(conn);
    free(pool_mem);
}

/* a rank given its own thread, then an op that touches every rank from the leader */
static void every_rank_op_with_rank_thread(void)
{
    create_decode();
    run_on_other_thread(register_rank0);
    forget_unknown();
}

static void test_connector_thread_rules(void **state)
{
    (void)state;
    if (!kvf_contracts_enabled()) {
        skip();                 /* release build: the checks are compiled out */
    }
    assert_exited_ok(run_child(all_on_leader));
    assert_aborted(run_child(leader_op_elsewhere));
    assert_aborted(run_child(rank_op_elsewhere));
    assert_aborted(run_child(every_rank_op_with_rank_thread));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_owner_primitive),
        cmocka_unit_test(test_connector_thread_rules),
    };
    kvf_log_init("test");
    if ((kvf_model_config_load(KVF_SOURCE_DIR "/tests/data/models/tiny-hybrid.config.json",
                               &cfg) != KVF_OK) ||
        (kvf_cache_layout_build(&cfg, &layout) != KVF_OK)) {
        return 1;
    }
    ops = kvf_connector_ucx_ops();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
