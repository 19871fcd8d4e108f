/*
 * Contracts that run: a header that says "only thread X may call this" backs
 * it with a check. KVF_CONTRACTS is 1 in Debug and sanitizer builds (set by
 * the top CMakeLists.txt), 0 otherwise; at 0 the checks compile to nothing.
 *
 * A kvf_thread_owner_t records the thread that owns an object: set
 * explicitly (KVF_OWNER_SET, e.g. at create) or by the first checked call
 * (KVF_OWNER_CHECK on a fresh owner claims it). A checked call from any
 * other thread logs the rule it broke, naming @a what, and aborts: a thread
 * rule broken is a bug, and the race it opens would corrupt state silently.
 */
#ifndef KVF_CONTRACT_H
#define KVF_CONTRACT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#ifndef KVF_CONTRACTS
#define KVF_CONTRACTS 0
#endif

typedef struct kvf_thread_owner {
    atomic_int state;     /* 0 unowned, 1 being claimed, 2 owned */
    pthread_t  thread;    /* valid when state == 2 */
} kvf_thread_owner_t;

/** True when this build checks contracts (KVF_CONTRACTS == 1). */
bool kvf_contracts_enabled(void);

/** From now on the calling thread owns @a owner (replaces any previous owner). */
void kvf_thread_owner_set(kvf_thread_owner_t *owner);

/**
 * Claim @a owner for the calling thread when nobody owns it yet; otherwise
 * abort (after an error line naming @a what, @a file and @a line) unless the
 * calling thread is the owner. Any thread; lock-free.
 */
void kvf_thread_owner_check(kvf_thread_owner_t *owner, const char *what, const char *file,
                            int line);

#if KVF_CONTRACTS
#define KVF_OWNER_SET(_owner)          kvf_thread_owner_set(_owner)
#define KVF_OWNER_CHECK(_owner, _what) kvf_thread_owner_check((_owner), (_what), __FILE__, __LINE__)
#else
#define KVF_OWNER_SET(_owner)          ((void)(_owner))
#define KVF_OWNER_CHECK(_owner, _what) ((void)(_owner))
#endif

#endif
