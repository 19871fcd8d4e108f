/* The one drain state machine of both role daemons (kvf_drain.h). */
#include "kvf_drain.h"

#include "kvf_log.h"
#include "kvf_role.h"
#include "kvf_time.h"

void kvf_drain_init(kvf_drain_t *drain, uint64_t timeout_ms)
{
    drain->timeout_ms = timeout_ms;
    drain->start_ms = 0;
    drain->drained_ms = 0;
}

bool kvf_drain_active(const kvf_drain_t *drain)
{
    return drain->start_ms != 0;
}

bool kvf_drain_step(kvf_drain_t *drain, const kvf_drain_ops_t *ops, void *arg)
{
    uint64_t now = kvf_time_now_ns() / 1000000ull;

    if (drain->start_ms == 0) {
        drain->start_ms = (now > 0) ? now : 1;
        ops->begin(arg, drain->start_ms + drain->timeout_ms);
    }
    if (ops->idle(arg)) {
        if (drain->drained_ms == 0) {
            drain->drained_ms = now;
            kvf_notice("drained in %llu ms: everything handed out was finished; exiting",
                       (unsigned long long)(now - drain->start_ms));
        }
        /* the last replies flush */
        return now - drain->drained_ms >= (uint64_t)KVF_ROLE_DRAIN_FLUSH_MS;
    }
    if (now - drain->start_ms < drain->timeout_ms) {
        return false;
    }
    kvf_warn("--drain-timeout %llu ms reached with work left; ending it with an error and"
             " exiting", (unsigned long long)drain->timeout_ms);
    ops->give_up(arg);
    return true;
}
