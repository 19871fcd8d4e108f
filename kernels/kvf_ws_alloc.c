/*
 * The device workspace's arena and staging area (kvf_ws_alloc.h has the
 * design).
 */
#include "kvf_ws_alloc.h"

#include <string.h>

static size_t kvf_ws_round(size_t n, size_t a)
{
    return (n + a - 1) / a * a;
}

void kvf_arena_init(kvf_arena_t *a, void *base, size_t cap)
{
    memset(a, 0, sizeof(*a));
    a->base = (uintptr_t)base;
    a->cap = (base != NULL) ? cap : 0;
}

void *kvf_arena_alloc(kvf_arena_t *a, size_t bytes)
{
    size_t off = kvf_ws_round(a->top, KVF_WS_ALIGN);

    if ((bytes == 0) || (a->nlive == KVF_WS_MAX_LIVE) || (off > a->cap) ||
        (bytes > a->cap - off)) {
        a->overflows++;
        a->overflow_max = (bytes > a->overflow_max) ? bytes : a->overflow_max;
        return NULL;
    }
    a->live[a->nlive++] = (kvf_arena_piece_t){off, off + bytes, false};
    a->top = off + bytes;
    a->peak = (a->top > a->peak) ? a->top : a->peak;
    return (void *)(a->base + off);
}

bool kvf_arena_free(kvf_arena_t *a, const void *p)
{
    uintptr_t at = (uintptr_t)p;
    size_t i;

    if ((p == NULL) || (at < a->base) || (at >= a->base + a->cap)) {
        return false;
    }
    for (i = a->nlive; i > 0; --i) {   /* LIFO: the last piece first */
        if ((a->live[i - 1].off == at - a->base) && !a->live[i - 1].freed) {
            break;
        }
    }
    if (i == 0) {
        return false;
    }
    a->live[i - 1].freed = true;
    while ((a->nlive > 0) && a->live[a->nlive - 1].freed) {
        a->nlive--;
    }
    a->top = (a->nlive > 0) ? a->live[a->nlive - 1].end : 0;
    return true;
}

size_t kvf_arena_in_use(const kvf_arena_t *a)
{
    return a->top;
}

void kvf_staging_init(kvf_staging_t *s, void *base, size_t cap, const kvf_staging_ops_t *ops,
                      void *ctx)
{
    memset(s, 0, sizeof(*s));
    s->base = base;
    s->half_cap = (base != NULL) ? (cap / 2) / KVF_WS_STAGE_ALIGN * KVF_WS_STAGE_ALIGN : 0;
    s->ops = ops;
    s->ctx = ctx;
}

int kvf_staging_take(kvf_staging_t *s, size_t bytes, void **ptr_p)
{
    size_t need = kvf_ws_round((bytes > 0) ? bytes : 1, KVF_WS_STAGE_ALIGN);
    int rc;

    if ((s->half_cap == 0) || (need > s->half_cap)) {
        s->overflows++;
        s->overflow_max = (bytes > s->overflow_max) ? bytes : s->overflow_max;
        return KVF_STAGING_TOO_BIG;
    }
    if (s->used[s->cur] + need > s->half_cap) {
        /* this half is full: fence its copies, move to the other once its fence passed */
        int other = 1 - s->cur;
        bool waited = false;

        rc = s->ops->fence(s->ctx, s->cur);
        if (rc != 0) {
            return rc;
        }
        s->fenced[s->cur] = true;
        if (s->fenced[other]) {
            rc = s->ops->wait(s->ctx, other, &waited);
            if (rc != 0) {
                return rc;
            }
            s->waits += waited ? 1u : 0u;
            s->fenced[other] = false;
        }
        s->used[other] = 0;   /* fenced and passed, or emptied by a reset */
        s->cur = other;
    }
    *ptr_p = s->base + (size_t)s->cur * s->half_cap + s->used[s->cur];
    s->used[s->cur] += need;
    s->peak = (s->used[s->cur] > s->peak) ? s->used[s->cur] : s->peak;
    s->takes++;
    return 0;
}

uint64_t kvf_staging_mark(const kvf_staging_t *s)
{
    return s->takes;
}

bool kvf_staging_synced(kvf_staging_t *s, uint64_t mark)
{
    if (s->takes != mark) {
        return false;   /* a copy issued during the sync may still be queued */
    }
    if ((s->used[0] | s->used[1]) != 0) {
        s->resets++;
    }
    s->used[0] = s->used[1] = 0;
    s->fenced[0] = s->fenced[1] = false;
    s->cur = 0;
    return true;
}

void *kvf_ws_inputs_find(const kvf_ws_inputs_t *in, const void *host, size_t bytes)
{
    const uintptr_t lo = (uintptr_t)in->host, h = (uintptr_t)host;

    if ((in->host == NULL) || (host == NULL) || (h < lo) || (h - lo > in->bytes) ||
        (bytes > in->bytes - (h - lo))) {
        return NULL;
    }
    return in->dev + (h - lo);
}

bool kvf_ws_inputs_owns(const kvf_ws_inputs_t *in, const void *p)
{
    const uintptr_t lo = (uintptr_t)in->dev, a = (uintptr_t)p;

    return (in->dev != NULL) && (p != NULL) && (a >= lo) && (a - lo < in->bytes);
}
