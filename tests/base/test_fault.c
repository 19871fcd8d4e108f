/*
 * Fault-point specs (kvf_fault.h): the grammar, every refusal naming what is
 * wrong, and (in -DKVF_FAULT_INJECTION=ON builds) when and how an armed
 * point fires. The parser runs in every build, so both builds run this test.
 */
#include "kvf_fault.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

static void test_malformed_specs_refused(void **state)
{
    static const char *const bad[] = {
        "ucx.post",                   /* no action */
        "ucx.pots=kill",              /* unknown point */
        "ucx.post=explode",           /* unknown action */
        "ucx.post@0=kill",            /* pass 0 */
        "ucx.post@-1=kill",
        "ucx.post@x=kill",
        "ucx.post@3++=kill",
        "ucx.post@=kill",
        "ucx.post=stall",             /* stall without a duration */
        "ucx.post=stall:0",
        "ucx.post=stall:60001",       /* unbounded stalls are refused */
        "ucx.post=stall:5ms",
        "ucx.post=drop",              /* an action the point does not take */
        "side.rkey=kill",
        "lease.release=replay",
        "ucx.post=kill,",             /* empty entries */
        ",ucx.post=kill",
        "ucx.post=kill,,ucx.half=stop",
        "a=kill,b=kill,c=kill,d=kill,e=kill,f=kill,g=kill,h=kill,i=kill",
    };
    (void)state;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); ++i) {
        assert_int_equal(kvf_fault_arm(bad[i]), KVF_ERR_INVALID_PARAM);
    }
    /* nine well-formed entries: one too many */
    assert_int_equal(kvf_fault_arm("ucx.post@1=kill,ucx.post@2=kill,ucx.post@3=kill,"
                                   "ucx.post@4=kill,ucx.post@5=kill,ucx.post@6=kill,"
                                   "ucx.post@7=kill,ucx.post@8=kill,ucx.post@9=kill"),
                     KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_fault_arm(NULL), KVF_OK);
    assert_int_equal(kvf_fault_arm(""), KVF_OK);
}

static void test_wellformed_specs(void **state)
{
    static const char *const good[] = {
        "ucx.post=kill",
        "ucx.post@12=stall:1500",
        "ucx.half@2+=stop",
        "side.reply=drop,side.rkey@1=corrupt",
        "lease.send@1=corrupt,lease.send@2=replay,lease.claim@3=replay",
        "ucx.notify=corrupt,lease.release=stall:60000,decode.step@1+=stall:1",
    };
    (void)state;
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); ++i) {
        /* a build without fault points refuses a well-formed spec too, but differently */
        assert_int_equal(kvf_fault_arm(good[i]),
                         kvf_fault_enabled() ? KVF_OK : KVF_ERR_UNSUPPORTED);
    }
    kvf_fault_disarm();
}

static void test_garble(void **state)
{
    uint8_t b[4] = {0x00, 0x0f, 0xf0, 0xff};
    (void)state;
    kvf_fault_garble(b, sizeof(b), 2);
    assert_int_equal(b[0], 0x00);
    assert_int_equal(b[1], 0x0f);
    assert_int_equal(b[2], 0x0f);
    assert_int_equal(b[3], 0x00);
}

#if KVF_FAULT_ENABLED
static void test_points_fire_when_armed(void **state)
{
    (void)state;
    assert_true(kvf_fault_enabled());
    /* unarmed: passes are counted, nothing fires */
    kvf_fault_disarm();
    for (int i = 0; i < 5; ++i) {
        assert_int_equal(KVF_FAULT(UCX_NOTIFY), KVF_FAULT_NONE);
    }
    assert_int_equal(kvf_fault_passes(KVF_FAULT_POINT_UCX_NOTIFY), 5);

    /* @n fires once, on the n-th pass; other points are not affected */
    assert_int_equal(kvf_fault_arm("ucx.notify@3=drop,lease.send@1=corrupt"), KVF_OK);
    assert_int_equal(kvf_fault_passes(KVF_FAULT_POINT_UCX_NOTIFY), 0);   /* reset by arm */
    assert_int_equal(KVF_FAULT(UCX_NOTIFY), KVF_FAULT_NONE);
    assert_int_equal(KVF_FAULT(UCX_NOTIFY), KVF_FAULT_NONE);
    assert_int_equal(KVF_FAULT(UCX_NOTIFY), KVF_FAULT_DROP);
    assert_int_equal(KVF_FAULT(UCX_NOTIFY), KVF_FAULT_NONE);
    assert_int_equal(KVF_FAULT(LEASE_SEND), KVF_FAULT_CORRUPT);
    assert_int_equal(KVF_FAULT(LEASE_SEND), KVF_FAULT_NONE);
    assert_int_equal(KVF_FAULT(SIDE_REPLY), KVF_FAULT_NONE);

    /* two entries on one point; n+ repeats */
    assert_int_equal(kvf_fault_arm("lease.send@1=corrupt,lease.send@2+=replay"), KVF_OK);
    assert_int_equal(KVF_FAULT(LEASE_SEND), KVF_FAULT_CORRUPT);
    for (int i = 0; i < 4; ++i) {
        assert_int_equal(KVF_FAULT(LEASE_SEND), KVF_FAULT_REPLAY);
    }

    /* stall is performed inside the point and bounded */
    assert_int_equal(kvf_fault_arm("ucx.post@2=stall:30"), KVF_OK);
    assert_int_equal(KVF_FAULT(UCX_POST), KVF_FAULT_NONE);
    assert_int_equal(KVF_FAULT(UCX_POST), KVF_FAULT_NONE);   /* slept 30 ms */
    assert_int_equal(kvf_fault_passes(KVF_FAULT_POINT_UCX_POST), 2);

    /* a refused spec leaves nothing armed */
    assert_int_equal(kvf_fault_arm("ucx.notify=drop,bogus=kill"), KVF_ERR_INVALID_PARAM);
    assert_int_equal(KVF_FAULT(UCX_NOTIFY), KVF_FAULT_NONE);
    kvf_fault_disarm();
}
#endif

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_malformed_specs_refused),
        cmocka_unit_test(test_wellformed_specs),
        cmocka_unit_test(test_garble),
#if KVF_FAULT_ENABLED
        cmocka_unit_test(test_points_fire_when_armed),
#endif
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
