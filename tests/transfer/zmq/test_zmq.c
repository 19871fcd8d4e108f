/* ZeroMQ socket set-up (transfer/zmq/kvf_zmq.h): every option is set and
 * checked; a refused option fails the open with KVF_ERR_ZMQ and leaves no
 * socket behind; the check macros map -1 to KVF_ERR_ZMQ. */
#include "kvf_zmq.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

static kvf_status_t check_return(int rc)
{
    KVF_ZMQ_CHECK(rc);
    return KVF_OK;
}

static kvf_status_t check_goto(int rc)
{
    kvf_status_t status = KVF_OK;

    KVF_ZMQ_CHECK_GOTO(rc, status, out);
    status = KVF_INPROGRESS;       /* reached only when rc was not -1 */
out:
    return status;
}

static void test_check_macros(void **state)
{
    (void)state;
    assert_int_equal(check_return(0), KVF_OK);
    assert_int_equal(check_return(-1), KVF_ERR_ZMQ);
    assert_int_equal(check_goto(3), KVF_INPROGRESS);
    assert_int_equal(check_goto(-1), KVF_ERR_ZMQ);
    KVF_ZMQ_CHECK_IGNORE(-1);      /* logs at debug, carries on */
}

static void test_socket_open_sets_every_option(void **state)
{
    const kvf_zmq_opt_t opts[] = {
        {ZMQ_LINGER, 0},
        {ZMQ_RCVTIMEO, 1234},
        {ZMQ_SNDHWM, 777},
        {ZMQ_MAXMSGSIZE, 5ll << 32},   /* int64: must not be truncated to int */
    };
    void *ctx = zmq_ctx_new();
    void *sock = NULL;
    int iv;
    int64_t lv;
    size_t len;
    (void)state;

    assert_non_null(ctx);
    assert_int_equal(kvf_zmq_socket_open(ctx, ZMQ_DEALER, opts, 4, &sock), KVF_OK);
    assert_non_null(sock);
    len = sizeof(iv);
    assert_int_equal(zmq_getsockopt(sock, ZMQ_RCVTIMEO, &iv, &len), 0);
    assert_int_equal(iv, 1234);
    len = sizeof(iv);
    assert_int_equal(zmq_getsockopt(sock, ZMQ_SNDHWM, &iv, &len), 0);
    assert_int_equal(iv, 777);
    len = sizeof(lv);
    assert_int_equal(zmq_getsockopt(sock, ZMQ_MAXMSGSIZE, &lv, &len), 0);
    assert_true(lv == (5ll << 32));
    len = sizeof(iv);
    assert_int_equal(zmq_getsockopt(sock, ZMQ_LINGER, &iv, &len), 0);
    assert_int_equal(iv, 0);
    zmq_close(sock);
    assert_int_equal(zmq_ctx_term(ctx), 0);
}

static void test_socket_open_refused_option(void **state)
{
    const kvf_zmq_opt_t opts[] = {
        {ZMQ_LINGER, 0},
        {-12345, 1},                   /* no such option: EINVAL */
    };
    void *ctx = zmq_ctx_new();
    void *sock = (void *)&opts;        /* must stay untouched on error */
    (void)state;

    assert_int_equal(kvf_zmq_socket_open(ctx, ZMQ_REQ, opts, 2, &sock), KVF_ERR_ZMQ);
    assert_ptr_equal(sock, (void *)&opts);
    assert_int_equal(kvf_zmq_socket_open(ctx, 9999, NULL, 0, &sock), KVF_ERR_ZMQ);
    assert_ptr_equal(sock, (void *)&opts);
    /* nothing was left open: the context terminates at once */
    assert_int_equal(zmq_ctx_term(ctx), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_check_macros),
        cmocka_unit_test(test_socket_open_sets_every_option),
        cmocka_unit_test(test_socket_open_refused_option),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
