/*
 * Clocks. Timeouts and durations use the monotonic clock (never jumps);
 * only deadlines that cross processes (lease expiry in transfer params) use
 * the wall clock, since two processes share no monotonic epoch. The one
 * clock header of the tree: no layer keeps a clock wrapper of its own.
 */
#ifndef KVF_TIME_H
#define KVF_TIME_H

#include <stdint.h>
#include <time.h>

/** Monotonic time in nanoseconds (CLOCK_MONOTONIC). */
static inline uint64_t kvf_time_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/** Monotonic time in milliseconds (CLOCK_MONOTONIC). */
static inline uint64_t kvf_time_now_ms(void)
{
    return kvf_time_now_ns() / 1000000ull;
}

/** Monotonic time in seconds, as a double (durations of engine steps, benchmarks). */
static inline double kvf_time_now_s(void)
{
    return 1e-9 * (double)kvf_time_now_ns();
}

/**
 * The absolute time @a ms_from_now milliseconds from now on @a clock
 * (CLOCK_MONOTONIC for a condition variable made with that clock, or
 * clock_nanosleep; CLOCK_REALTIME for a default pthread_cond_timedwait).
 * A negative @a ms_from_now counts as 0.
 */
static inline struct timespec kvf_time_deadline_ts(clockid_t clock, int64_t ms_from_now)
{
    struct timespec ts;

    clock_gettime(clock, &ts);
    if (ms_from_now < 0) {
        ms_from_now = 0;
    }
    ts.tv_sec += (time_t)(ms_from_now / 1000);
    ts.tv_nsec += (long)(ms_from_now % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

/** Wall-clock time in milliseconds since the epoch (CLOCK_REALTIME). */
static inline uint64_t kvf_time_realtime_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000ull + (uint64_t)ts.tv_nsec / 1000000ull;
}

#endif
