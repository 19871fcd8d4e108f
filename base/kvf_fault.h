/*
 * Named fault points for tests (docs/CODE_RULES.md §11).
 *
 * A fault point is a place in the transfer path where a test can make the
 * process die, stop, stall, or lose / corrupt / replay one message, at an
 * exact moment (after the n-th GET posted, before a notification, before a
 * side-channel reply, on a lease release) instead of guessing it with
 * signals and sleeps.
 *
 * Build: the points exist only with -DKVF_FAULT_INJECTION=ON (tests/run.sh
 * builds its test tree so). Otherwise KVF_FAULT() is the constant
 * KVF_FAULT_NONE, every `if (KVF_FAULT(...) == ...)` is dead code the
 * compiler drops, and a set KVF_FAULT variable is refused at start-up
 * (never silently ignored).
 *
 * Arming: kvf-prefill and kvf-decode call kvf_fault_init() at start-up,
 * which reads the environment variable KVF_FAULT:
 *
 *   KVF_FAULT = entry { "," entry }
 *   entry     = point [ "@" n [ "+" ] ] "=" action
 *   n         = decimal, 1..10^9; default 1: the pass on which it fires;
 *               "n+" fires on pass n and on every pass after it
 *   action    = "kill" | "stop" | "stall:" ms | "drop" | "corrupt" | "replay"
 *   ms        = decimal milliseconds, 1..60000 (bounded: a stall always ends)
 *
 * e.g. KVF_FAULT="ucx.half=stall:1500" or
 *      KVF_FAULT="lease.send@1=corrupt,lease.send@2=replay".
 * Each entry fires once, on the n-th pass of its point in this process
 * (with "n+", on every pass from the n-th on, e.g. "decode.step@1+=stall:50"
 * makes every decode step 50 ms slower);
 * several entries may name one point (at different n). At most
 * KVF_FAULT_MAX_ENTRIES entries. Every firing logs, at warn level and
 * before acting, "fault <point> fired on pass <n> (<action>)", so a test can
 * wait for that line in the log.
 *
 * Actions:
 *   kill      raise(SIGKILL): the process dies at that instant
 *   stop      raise(SIGSTOP): the whole process stops until SIGCONT
 *   stall:ms  the calling thread sleeps ms milliseconds, then goes on
 *   drop      the message is not sent (what "not sent" means: see the point)
 *   corrupt   the message is garbled (how: see the point)
 *   replay    the message is sent again / old state is re-sent (see the point)
 * kill, stop and stall happen inside KVF_FAULT(); drop, corrupt and replay
 * are returned to the call site, which acts on them. A point accepts only
 * the actions listed for it below.
 *
 * Points (KVF_FAULT_POINTS below; grep KVF_FAULT( for the call sites):
 *   ucx.post      UCX agent, after each GET/PUT descriptor is posted; n counts
 *                 descriptors posted by the process. kill stop stall
 *   ucx.half      UCX agent, once per batch, after half (rounded up) of its
 *                 descriptors were posted; n counts batches. kill stop stall
 *   ucx.notify    UCX agent, before a notification (active message) is sent.
 *                 kill stop stall; drop (reported sent), corrupt (its bytes
 *                 inverted)
 *   side.reply    side-channel server, before a handshake (metadata) reply.
 *                 kill stop stall; drop (never answered, nor is any request
 *                 after it: the side channel hangs, as a hung peer's would), corrupt (bytes of the
 *                 packed reply inverted from the middle on)
 *   side.rkey     side-channel server, before a handshake reply: the reply
 *                 stays well-formed but every region's packed remote key
 *                 gets 5 bytes appended, as a newer UCX may append to its
 *                 keys (decode must accept them: keys are never parsed).
 *                 corrupt
 *   lease.claim   decode, before it claims a request's lease (before any GET;
 *                 queue heartbeats are claims too). kill stop stall; replay
 *                 (the claim names the previous request whose lease decode
 *                 released, with that lease's nonce: stale transfer params)
 *   lease.send    decode, before a lease release (decode's "read done"
 *                 notification) is sent. kill stop stall; drop (not sent:
 *                 the release fails as unanswered), corrupt (first sends one
 *                 copy with a wrong nonce and one naming another engine, then
 *                 the real one), replay (sends the real one again after its
 *                 answer)
 *   lease.release prefill, when a lease release arrives, before it is
 *                 answered. kill stop stall
 *   decode.step   decode, before each engine step (a token for every running
 *                 request). kill stop stall
 *   ucx.data      decode connector, when a rank's landed KV is digested
 *                 (--kv-digest on), once per prefill rank read: corrupt flips
 *                 one byte of the landed bytes, as if garbled on the wire
 *   tp.barrier    TP collectives (common/runtime/kvf_collectives.c), when a
 *                 rank thread arrives at a barrier of a world of 2 or more
 *                 ranks; n counts arrivals in the process (every rank, every
 *                 collective). kill stop stall; drop (the arrival is lost:
 *                 the barrier breaks at once as its timeout would, and the
 *                 world with it, for good). The NCCL world
 *                 (kvf_collectives_nccl.c) passes it at the start of each
 *                 collective: drop aborts that rank's communicators and
 *                 breaks the world as an NCCL timeout would
 *
 * Thread rules: kvf_fault_init()/kvf_fault_arm()/kvf_fault_disarm() before
 * other threads hit points (start-up, or a single-threaded unit test);
 * KVF_FAULT() from any thread (pass counts are atomic).
 */
#ifndef KVF_FAULT_H
#define KVF_FAULT_H

#include "kvf_status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVF_FAULT_MAX_ENTRIES 8
#define KVF_FAULT_MAX_STALL_MS 60000

/* Actions; bit i of a point's mask allows action i. Checklist: when adding
 * one, update the grammar above, kvf_fault_action_names[] in kvf_fault.c and
 * tests/base/test_fault.c. */
typedef enum {
    KVF_FAULT_NONE    = 0,   /* returned: nothing to do at the call site */
    KVF_FAULT_DROP    = 1,
    KVF_FAULT_CORRUPT = 2,
    KVF_FAULT_REPLAY  = 3,
    KVF_FAULT_KILL    = 4,   /* never returned: performed inside KVF_FAULT() */
    KVF_FAULT_STOP    = 5,   /* idem */
    KVF_FAULT_STALL   = 6,   /* idem */
} kvf_fault_action_t;

#define KVF_FA_(_a)   (1u << KVF_FAULT_##_a)
#define KVF_FA_PROC   (KVF_FA_(KILL) | KVF_FA_(STOP) | KVF_FA_(STALL))

/* _X(enum suffix, name, allowed actions) */
#define KVF_FAULT_POINTS(_X)                                                         \
    _X(UCX_POST,      "ucx.post",      KVF_FA_PROC)                                  \
    _X(UCX_HALF,      "ucx.half",      KVF_FA_PROC)                                  \
    _X(UCX_NOTIFY,    "ucx.notify",    KVF_FA_PROC | KVF_FA_(DROP) | KVF_FA_(CORRUPT)) \
    _X(SIDE_REPLY,    "side.reply",    KVF_FA_PROC | KVF_FA_(DROP) | KVF_FA_(CORRUPT)) \
    _X(SIDE_RKEY,     "side.rkey",     KVF_FA_(CORRUPT))                             \
    _X(LEASE_CLAIM,   "lease.claim",   KVF_FA_PROC | KVF_FA_(REPLAY))                \
    _X(LEASE_SEND,    "lease.send",    KVF_FA_PROC | KVF_FA_(DROP) | KVF_FA_(CORRUPT) | \
                                       KVF_FA_(REPLAY))                              \
    _X(LEASE_RELEASE, "lease.release", KVF_FA_PROC)                                  \
    _X(DECODE_STEP,   "decode.step",   KVF_FA_PROC)                                  \
    _X(UCX_DATA,      "ucx.data",      KVF_FA_(CORRUPT))                             \
    _X(TP_BARRIER,    "tp.barrier",    KVF_FA_PROC | KVF_FA_(DROP))

typedef enum {
#define KVF_FAULT_POINT_ENUM(_e, _name, _mask) KVF_FAULT_POINT_##_e,
    KVF_FAULT_POINTS(KVF_FAULT_POINT_ENUM)
#undef KVF_FAULT_POINT_ENUM
    KVF_FAULT_NUM_POINTS
} kvf_fault_point_t;

/**
 * Arm the points from @a spec (grammar above), replacing what was armed;
 * NULL or "" disarms. Every build parses, so a malformed spec is refused the
 * same way with or without fault points.
 *
 * @return KVF_OK (armed); KVF_ERR_INVALID_PARAM for a malformed spec, with
 *         one logged line naming the entry and what is wrong (unknown point,
 *         with the list of points; action the point does not take, with the
 *         ones it does; bad n or stall duration; too many entries); nothing
 *         is armed then. KVF_ERR_UNSUPPORTED for a well-formed spec in a
 *         build without -DKVF_FAULT_INJECTION=ON (logged).
 */
kvf_status_t kvf_fault_arm(const char *spec);

/** Disarm every point and reset pass counts. */
void kvf_fault_disarm(void);

/** kvf_fault_arm(getenv("KVF_FAULT")); the daemons call it at start-up and exit 2 on error. */
kvf_status_t kvf_fault_init(void);

/**
 * Test-only switches (the hidden TEST_* config rows: KVF_TEST_NO_RELEASE,
 * KVF_TEST_PULL_DELAY, KVF_TEST_NO_BLOCK_ZERO, ...) exist only in builds with
 * -DKVF_FAULT_INJECTION=ON. In a build without it, refuse any KVF_TEST_*
 * environment variable and any --test-* flag in @a argv[1..argc), naming
 * it ("KVF_TEST_NO_RELEASE is a test-only switch; this build (without
 * KVF_FAULT_INJECTION) refuses it"). Exempt: the test harness's own
 * variables, read by tests/run.sh and never by a product binary
 * (KVF_TEST_FUZZ, KVF_TEST_REFERENCE, KVF_TEST_SANITIZERS). Every daemon and
 * kvf-proxy calls it first at start and exits 2 on error.
 * @return KVF_OK; KVF_ERR_UNSUPPORTED (logged) in a release build that sees one.
 */
kvf_status_t kvf_fault_refuse_test_switches(int argc, char *const *argv);

/** True when this build has fault points (-DKVF_FAULT_INJECTION=ON). */
bool kvf_fault_enabled(void);

/**
 * Invert @a len bytes of @a buf from byte @a from on (the "corrupt" action's
 * garbling: deterministic, so a rerun corrupts the same way). Any build.
 */
void kvf_fault_garble(void *buf, size_t len, size_t from);

#ifdef KVF_FAULT_INJECTION
/**
 * One pass of @a point: counts it and, if an armed entry fires, logs and
 * performs it. @return KVF_FAULT_DROP/CORRUPT/REPLAY for the call site to
 * act on; KVF_FAULT_NONE otherwise (also after a stall, or SIGCONT after stop).
 */
kvf_fault_action_t kvf_fault_hit(kvf_fault_point_t point);

/** Passes of @a point so far in this process (armed or not). */
uint64_t kvf_fault_passes(kvf_fault_point_t point);

#define KVF_FAULT(_point)   kvf_fault_hit(KVF_FAULT_POINT_##_point)
#define KVF_FAULT_ENABLED   1
#else
#define KVF_FAULT(_point)   KVF_FAULT_NONE
#define KVF_FAULT_ENABLED   0
#endif

#endif
