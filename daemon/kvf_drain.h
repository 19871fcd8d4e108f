/*
 * Drain on SIGTERM, shared by kvf-prefill and kvf-decode
 * (docs/ARCHITECTURE.md, "Drain"): on the first call the role stops taking
 * new work (it checks kvf_drain_active()) and says so in its health; the
 * drain ends when nothing handed out is left, then the control channel
 * keeps serving KVF_ROLE_DRAIN_FLUSH_MS so the last replies leave; or at the
 * deadline (--drain-timeout after the signal), when the role ends what is
 * left with an error.
 * The role says what "nothing left" means and how to end the rest through
 * kvf_drain_ops_t. Leader thread only. Times: ms of kvf_time_now_ns().
 */
#ifndef KVF_DRAIN_H
#define KVF_DRAIN_H

#include <stdbool.h>
#include <stdint.h>

typedef struct kvf_drain {
    uint64_t timeout_ms;   /* --drain-timeout */
    uint64_t start_ms;     /* 0 until the drain began */
    uint64_t drained_ms;   /* 0 until nothing was left */
} kvf_drain_t;

typedef struct kvf_drain_ops {
    /** The drain begins (publish health, log what is left); ends by @a deadline_ms. */
    void (*begin)(void *arg, uint64_t deadline_ms);
    /** Nothing handed out is left. */
    bool (*idle)(void *arg);
    /** The deadline passed with work left: end it (error replies) now. */
    void (*give_up)(void *arg);
} kvf_drain_ops_t;

/** A drain of at most @a timeout_ms, not begun. */
void kvf_drain_init(kvf_drain_t *drain, uint64_t timeout_ms);

/** The drain began (new work is refused). */
bool kvf_drain_active(const kvf_drain_t *drain);

/**
 * One step of the drain (call it each loop iteration once the stop flag
 * asks for a drain): begins it on the first call.
 * @return true when the loop should return now (drained and flushed, or
 *         the deadline passed and what was left was ended).
 */
bool kvf_drain_step(kvf_drain_t *drain, const kvf_drain_ops_t *ops, void *arg);

#endif
