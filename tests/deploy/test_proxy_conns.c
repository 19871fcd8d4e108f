/*
 * kvf-proxy connection guard (deploy/proxy/kvf_proxy_conns.h): the total
 * and per-client caps, X-Forwarded-For believed only from trusted proxies
 * (its rightmost address that is not one), a bad --trusted-proxy refused,
 * and which connection the HTTP library may be reading from. Expected
 * admissions are worked out by hand from the header's rules.
 */
#include "kvf_proxy_conns.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>
#include <cmocka.h>

static struct sockaddr_in test_addr(const char *ip)
{
    struct sockaddr_in a;

    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_port = htons(40000);
    assert_int_equal(inet_pton(AF_INET, ip, &a.sin_addr), 1);
    return a;
}

static kvf_proxy_conn_slot_t *test_open(kvf_proxy_conns_h c, int fd, const char *ip)
{
    struct sockaddr_in a = test_addr(ip);
    kvf_proxy_conn_slot_t *s = kvf_proxy_conns_open(c, fd, (const struct sockaddr *)&a);

    assert_non_null(s);
    return s;
}

static kvf_proxy_conns_h test_conns(unsigned total, unsigned per_client, const char *trusted)
{
    kvf_proxy_conns_params_t p = {total, per_client, trusted, 10000, 10000, 10000};
    kvf_proxy_conns_h c = NULL;

    assert_int_equal(kvf_proxy_conns_create(&p, &c), KVF_OK);
    return c;
}

static void test_total_cap(void **state)
{
    kvf_proxy_conns_h c = test_conns(2, 0, NULL);
    kvf_proxy_conn_slot_t *s[4];

    (void)state;
    for (int i = 0; i < 3; ++i) {
        s[i] = test_open(c, 10 + i, "10.0.0.1");   /* per-client cap off: one address is fine */
    }
    assert_int_equal(kvf_proxy_conns_admission(c, s[0]), KVF_PROXY_ADMIT_OK);
    assert_int_equal(kvf_proxy_conns_admission(c, s[1]), KVF_PROXY_ADMIT_OK);
    assert_int_equal(kvf_proxy_conns_admission(c, s[2]), KVF_PROXY_ADMIT_OVER_TOTAL);
    assert_int_equal(kvf_proxy_conns_count(c), 3);
    kvf_proxy_conns_close(c, s[0]);   /* an admitted one leaves: room for the next */
    s[3] = test_open(c, 13, "10.0.0.2");
    assert_int_equal(kvf_proxy_conns_admission(c, s[3]), KVF_PROXY_ADMIT_OK);
    kvf_proxy_conns_close(c, s[2]);   /* a refused one leaving frees nothing it held */
    kvf_proxy_conns_close(c, s[1]);
    kvf_proxy_conns_close(c, s[3]);
    assert_int_equal(kvf_proxy_conns_count(c), 0);
    kvf_proxy_conns_destroy(c);
}

static void test_per_client_cap(void **state)
{
    kvf_proxy_conns_h c = test_conns(100, 2, NULL);
    kvf_proxy_conn_slot_t *a1 = test_open(c, 10, "10.0.0.1");
    kvf_proxy_conn_slot_t *a2 = test_open(c, 11, "10.0.0.1");
    kvf_proxy_conn_slot_t *a3 = test_open(c, 12, "10.0.0.1");
    kvf_proxy_conn_slot_t *b1 = test_open(c, 13, "10.0.0.2");

    (void)state;
    assert_int_equal(kvf_proxy_conns_admission(c, a1), KVF_PROXY_ADMIT_OK);
    assert_int_equal(kvf_proxy_conns_admission(c, a2), KVF_PROXY_ADMIT_OK);
    assert_int_equal(kvf_proxy_conns_admission(c, a3), KVF_PROXY_ADMIT_OVER_CLIENT);
    assert_int_equal(kvf_proxy_conns_admission(c, b1), KVF_PROXY_ADMIT_OK);
    /* an untrusted peer's X-Forwarded-For changes nothing */
    assert_int_equal(kvf_proxy_conns_attribute(c, a3, "10.0.0.9"), KVF_PROXY_ADMIT_OVER_CLIENT);
    kvf_proxy_conns_close(c, a1);
    kvf_proxy_conns_close(c, a2);
    kvf_proxy_conns_close(c, a3);
    kvf_proxy_conns_close(c, b1);
    kvf_proxy_conns_destroy(c);
}

static void test_trusted_forwarded_for(void **state)
{
    kvf_proxy_conns_h c = test_conns(100, 1, "127.0.0.7, ::1");
    kvf_proxy_conn_slot_t *s[6];

    (void)state;
    for (int i = 0; i < 6; ++i) {   /* a balancer's connections count for no client yet */
        s[i] = test_open(c, 10 + i, "127.0.0.7");
        assert_int_equal(kvf_proxy_conns_admission(c, s[i]), KVF_PROXY_ADMIT_OK);
    }
    assert_int_equal(kvf_proxy_conns_attribute(c, s[0], "10.0.0.1"), KVF_PROXY_ADMIT_OK);
    assert_int_equal(kvf_proxy_conns_attribute(c, s[1], " 10.0.0.1 "),
                     KVF_PROXY_ADMIT_OVER_CLIENT);
    /* rightmost address that is not a trusted proxy: 10.0.0.2, not the client's 10.0.0.1 */
    assert_int_equal(kvf_proxy_conns_attribute(c, s[2], "10.0.0.1, 10.0.0.2, 127.0.0.7"),
                     KVF_PROXY_ADMIT_OK);
    assert_int_equal(kvf_proxy_conns_attribute(c, s[3], "10.0.0.2"),
                     KVF_PROXY_ADMIT_OVER_CLIENT);
    /* junk rightmost: nothing left of it is believed; the balancer itself is the client */
    assert_int_equal(kvf_proxy_conns_attribute(c, s[4], "10.0.0.3, junk"), KVF_PROXY_ADMIT_OK);
    assert_int_equal(kvf_proxy_conns_attribute(c, s[5], NULL), KVF_PROXY_ADMIT_OVER_CLIENT);
    /* the next request on a connection names another client: attributed anew */
    assert_int_equal(kvf_proxy_conns_attribute(c, s[1], "10.0.0.4"), KVF_PROXY_ADMIT_OK);
    for (int i = 0; i < 6; ++i) {
        kvf_proxy_conns_close(c, s[i]);
    }
    kvf_proxy_conns_destroy(c);
}

static void test_trusted_refused(void **state)
{
    kvf_proxy_conns_params_t p = {10, 1, "127.0.0.1,proxy.example", 1000, 1000, 1000};
    kvf_proxy_conns_h c = NULL;

    (void)state;
    assert_int_equal(kvf_proxy_conns_create(&p, &c), KVF_ERR_INVALID_PARAM);
    p.trusted_proxies = "127.0.0.1,,::1";
    assert_int_equal(kvf_proxy_conns_create(&p, &c), KVF_ERR_INVALID_PARAM);
    p.trusted_proxies = "";
    p.max_total = 0;
    assert_int_equal(kvf_proxy_conns_create(&p, &c), KVF_ERR_INVALID_PARAM);
}

static void test_sole_reading(void **state)
{
    kvf_proxy_conns_h c = test_conns(10, 0, NULL);
    kvf_proxy_conn_slot_t *a = test_open(c, 21, "10.0.0.1");
    kvf_proxy_conn_slot_t *b = test_open(c, 22, "10.0.0.2");

    (void)state;
    assert_int_equal(kvf_proxy_conns_sole_reading_fd(c), -1);   /* two may be read */
    kvf_proxy_conns_phase(c, a, KVF_PROXY_PHASE_BUSY);
    assert_int_equal(kvf_proxy_conns_sole_reading_fd(c), 22);
    kvf_proxy_conns_phase(c, b, KVF_PROXY_PHASE_BUSY);
    assert_int_equal(kvf_proxy_conns_sole_reading_fd(c), -1);   /* none */
    kvf_proxy_conns_phase(c, a, KVF_PROXY_PHASE_HEADERS);       /* keep-alive, next request */
    assert_int_equal(kvf_proxy_conns_sole_reading_fd(c), 21);
    kvf_proxy_conns_close(c, a);
    kvf_proxy_conns_close(c, b);
    kvf_proxy_conns_destroy(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_total_cap),       cmocka_unit_test(test_per_client_cap),
        cmocka_unit_test(test_trusted_forwarded_for), cmocka_unit_test(test_trusted_refused),
        cmocka_unit_test(test_sole_reading),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
