/*
 * The planner's list sorts: a rank's descriptors by local offset, merged where both sides
 * continue each other, and the zero ranges, merged into disjoint ranges (kvf_xfer_sort.h).
 */
#include "kvf_xfer_sort.h"

#include <stdlib.h>
#include <string.h>

static int kvf_xfer_cmp_desc(const void *a, const void *b)
{
    uint64_t x = ((const kvf_xfer_desc_t *)a)->local_off;
    uint64_t y = ((const kvf_xfer_desc_t *)b)->local_off;
    return (x > y) - (x < y);
}

static int kvf_xfer_cmp_range(const void *a, const void *b)
{
    uint64_t x = ((const kvf_xfer_range_t *)a)->off;
    uint64_t y = ((const kvf_xfer_range_t *)b)->off;
    return (x > y) - (x < y);
}

/* First index past the ascending run of @a v that starts at @a i. */
static size_t kvf_xfer_run_end(const kvf_xfer_desc_t *v, size_t i, size_t n)
{
    for (++i; (i < n) && (v[i - 1].local_off < v[i].local_off); ++i) {
    }
    return i;
}

/*
 * Sort @a v[n] by local_off: bottom-up merges of the ascending runs it already holds. Every
 * page is emitted in memory order, so a rank's list is a few dozen sorted runs (one per page
 * at most) whose order only the block ids decide; qsort's callback per comparison and its
 * own merge buffer took 60 % of a plan. Local offsets are distinct (no two descriptors
 * overlap), so stability does not matter. Falls back to qsort without scratch memory.
 */
static void kvf_xfer_desc_sort(kvf_xfer_desc_t *v, size_t n)
{
    kvf_xfer_desc_t *tmp = malloc(n * sizeof(*tmp));
    kvf_xfer_desc_t *src = v, *dst = tmp, *t;
    size_t runs;

    if (tmp == NULL) {
        qsort(v, n, sizeof(*v), kvf_xfer_cmp_desc);
        return;
    }
    do {
        size_t i = 0, out = 0;
        runs = 0;
        while (i < n) {
            size_t a = i, a_end = kvf_xfer_run_end(src, i, n);
            size_t b = a_end, b_end = (a_end < n) ? kvf_xfer_run_end(src, a_end, n) : n;
            while ((a < a_end) && (b < b_end)) {
                dst[out++] = (src[a].local_off < src[b].local_off) ? src[a++] : src[b++];
            }
            while (a < a_end) {
                dst[out++] = src[a++];
            }
            while (b < b_end) {
                dst[out++] = src[b++];
            }
            i = b_end;
            runs++;
        }
        t = src;
        src = dst;
        dst = t;
    } while (runs > 1);
    if (src != v) {
        memcpy(v, src, n * sizeof(*v));
    }
    free(tmp);
}

size_t kvf_xfer_desc_sort_merge(kvf_xfer_desc_t *v, size_t n, bool merge)
{
    size_t out = 0;
    if (n < 2) {
        return n;
    }
    if (kvf_xfer_run_end(v, 0, n) < n) {   /* ascending ids: already in order */
        kvf_xfer_desc_sort(v, n);
    }
    if (!merge) {
        return n;
    }
    for (size_t i = 0; i < n; ++i) {
        kvf_xfer_desc_t *last = (out > 0) ? &v[out - 1] : NULL;
        if ((last != NULL) && (last->local_off + last->len == v[i].local_off) &&
            (last->remote_off + last->len == v[i].remote_off)) {
            last->len += v[i].len;
        } else {
            v[out++] = v[i];
        }
    }
    return out;
}

size_t kvf_xfer_range_sort_merge(kvf_xfer_range_t *v, size_t n)
{
    size_t out = 0;
    if (n < 2) {
        return n;
    }
    for (size_t i = 1; i < n; ++i) {
        if (v[i - 1].off > v[i].off) {   /* the planner emits them in order: a check */
            qsort(v, n, sizeof(*v), kvf_xfer_cmp_range);
            break;
        }
    }
    for (size_t i = 0; i < n; ++i) {
        kvf_xfer_range_t *last = (out > 0) ? &v[out - 1] : NULL;
        if ((last != NULL) && (last->off + last->len >= v[i].off)) {
            uint64_t end = v[i].off + v[i].len;
            if (end > last->off + last->len) {
                last->len = end - last->off;
            }
        } else {
            v[out++] = v[i];
        }
    }
    return out;
}
