/*
 * kvf-proxy's heap after a burst (kvf_proxy_memtrim.h).
 *
 * Why: each open connection holds a few tens of KiB of buffers (request
 * body, SSE, the flow), allocated by the thread that serves it. When a
 * burst ends they are freed, but glibc keeps the freed chunks in the
 * arena, and a non-main arena's heap shrinks only from its top, so the
 * proxy's RSS stays at the burst's peak. Measured with fake daemons and 300
 * concurrent streams: 11.7 MB idle, 23.1 MB after the burst with 1.5 MB in
 * use (malloc_stats: one arena held 13.7 MB for 0.4 MB in use), the same
 * after five more bursts (no growth: no leak; LeakSanitizer at exit found
 * none either), 11.7 MB again after malloc_trim(0). So the soak's RSS check
 * saw the allocator's high-water mark, not a leak.
 *
 * When: the connection watchdog (kvf_proxy_conns.c) reports the open count
 * every 100 ms; once a peak of at least 64 connections has fallen to a
 * quarter, the heap is trimmed (at most once a second), so a steady load
 * never trims and a burst's memory goes back soon after it ends.
 * Rejected: M_TRIM_THRESHOLD / M_MMAP_THRESHOLD tuning (the chunks are below
 * the mmap threshold and the free ones sit below live ones, which a top
 * trim cannot reach); one arena (M_ARENA_MAX 1: every request thread would
 * contend on one lock, and the fragmentation stays); a timer trimming under
 * load (each trim walks every arena under its lock while requests allocate).
 */
#include "kvf_proxy_memtrim.h"

#ifdef __GLIBC__
#include <malloc.h>
#endif

bool kvf_proxy_memtrim_due(kvf_proxy_memtrim_t *t, unsigned open, int64_t now_ms)
{
    if (open > t->peak) {
        t->peak = open;
    }
    if ((t->peak < KVF_PROXY_MEMTRIM_MIN_PEAK) || (open > t->peak / 4) ||
        ((t->last_ms != 0) && (now_ms - t->last_ms < KVF_PROXY_MEMTRIM_EVERY_MS))) {
        return false;
    }
    t->peak = open;
    t->last_ms = now_ms;
    t->trims++;
    return true;
}

bool kvf_proxy_memtrim_run(void)
{
#ifdef __GLIBC__
    return malloc_trim(0) != 0;
#else
    return false;
#endif
}
