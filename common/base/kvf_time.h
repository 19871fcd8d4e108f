/*
 * Clocks. Timeouts and durations use the monotonic clock (never jumps);
 * only deadlines that cross processes (lease expiry in transfer params) use
 * the wall clock, since two processes share no monotonic epoch.
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

/** Wall-clock time in milliseconds since the epoch (CLOCK_REALTIME). */
static inline uint64_t kvf_time_realtime_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000ull + (uint64_t)ts.tv_nsec / 1000000ull;
}

#endif
