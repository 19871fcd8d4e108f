/*
 * Thread-ownership checks behind KVF_OWNER_SET / KVF_OWNER_CHECK. Always
 * compiled (tests call them directly); the macros reach them only when
 * KVF_CONTRACTS is 1.
 */
#include "kvf_contract.h"
#include "kvf_log.h"

#include <stdlib.h>

bool kvf_contracts_enabled(void)
{
    return KVF_CONTRACTS != 0;
}

void kvf_thread_owner_set(kvf_thread_owner_t *owner)
{
    atomic_store(&owner->state, 1);
    owner->thread = pthread_self();
    atomic_store(&owner->state, 2);
}

void kvf_thread_owner_check(kvf_thread_owner_t *owner, const char *what, const char *file,
                            int line)
{
    int expected = 0;

    if (atomic_compare_exchange_strong(&owner->state, &expected, 1)) {
        owner->thread = pthread_self();       /* first use claims it */
        atomic_store(&owner->state, 2);
        return;
    }
    while (atomic_load(&owner->state) != 2) {
        /* another thread is claiming it this instant: its claim decides */
    }
    if (pthread_equal(owner->thread, pthread_self())) {
        return;
    }
    kvf_error("thread contract broken at %s:%d: %s called from thread %#lx, but thread %#lx "
              "owns it", file, line, what, (unsigned long)pthread_self(),
              (unsigned long)owner->thread);
    abort();
}
