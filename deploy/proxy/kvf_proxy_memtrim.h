/*
 * kvf-proxy's heap after a burst: the memory glibc's allocator keeps once a
 * peak of connections is over is given back to the system when the load
 * has fallen (kvf_proxy_memtrim.c says why and when).
 */
#ifndef KVF_PROXY_MEMTRIM_H
#define KVF_PROXY_MEMTRIM_H

#include <stdbool.h>
#include <stdint.h>

/* Open connections a peak must reach before its memory is worth giving back. */
#define KVF_PROXY_MEMTRIM_MIN_PEAK 64u
/* Least time between two trims (each walks every arena under its lock). */
#define KVF_PROXY_MEMTRIM_EVERY_MS 1000

/** The peak seen since the last trim; zeroed is the initial state. One owner thread. */
typedef struct kvf_proxy_memtrim {
    unsigned peak;          /* most open connections since the last trim */
    int64_t  last_ms;       /* kvf_time_now_ms() of the last trim; 0: none yet */
    uint64_t trims;         /* trims done */
} kvf_proxy_memtrim_t;

/**
 * Note @a open connections at time @a now_ms (ms, monotonic). True when the
 * heap should be trimmed now: the peak since the last trim reached
 * KVF_PROXY_MEMTRIM_MIN_PEAK, the connections fell to a quarter of it, and
 * the last trim is KVF_PROXY_MEMTRIM_EVERY_MS old. The peak then restarts
 * from @a open. Pure bookkeeping: the caller trims (kvf_proxy_memtrim_run())
 * outside its locks.
 */
bool kvf_proxy_memtrim_due(kvf_proxy_memtrim_t *t, unsigned open, int64_t now_ms);

/**
 * Give the allocator's free memory back to the system (glibc's
 * malloc_trim(0): every arena's free pages, not only the top). Takes each
 * arena's lock in turn, for a few ms at most with a proxy's heap; any
 * thread. A no-op without glibc. @return true when memory was released.
 */
bool kvf_proxy_memtrim_run(void);

#endif
