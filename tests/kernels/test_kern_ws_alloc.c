/* The device workspace's allocators (kernels/kvf_ws_alloc.h) over host memory: the arena's
 * alignment, LIFO reuse and out-of-order frees, refusals counted (too big, too many
 * pieces, a foreign pointer); the staging area's halves, fences recorded on a switch and
 * waited for only when their copies are still queued, and reuse only after a
 * synchronisation that no take raced with. A fake fence stands for the CUDA events: it
 * records which copies a fence covers and whether they "ran". Then the device layer's
 * workspace calls: nothing to reserve on the CPU; with a GPU, a workspace too small for a
 * zeroing list falls back and counts it, a large one serves it without fallbacks, a host
 * sync empties the staging area, and uploads beyond a staging half land intact (without a
 * GPU that case reports skipped). */
#include "kvf_ws_alloc.h"
#include "kvf_device.h"
#include "kvf_device_graph.h"
#include "kvf_kern_test.h"
#include "kvf_kern.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void test_arena_align_lifo(void **state)
{
    enum { CAP = 64 * 1024 };
    void *mem = aligned_alloc(KVF_WS_ALIGN, CAP);
    kvf_arena_t a;

    (void)state;
    assert_non_null(mem);
    kvf_arena_init(&a, mem, CAP);
    unsigned char *p1 = kvf_arena_alloc(&a, 10);
    unsigned char *p2 = kvf_arena_alloc(&a, 300);
    unsigned char *p3 = kvf_arena_alloc(&a, 1);
    assert_ptr_equal(p1, mem);
    assert_ptr_equal(p2, (unsigned char *)mem + 256);          /* 10 rounded up to 256 */
    assert_ptr_equal(p3, (unsigned char *)mem + 768);          /* 256 + 300 -> 768 */
    for (unsigned char *p = p1; p != NULL; p = (p == p1) ? p2 : (p == p2) ? p3 : NULL) {
        assert_int_equal((uintptr_t)p % KVF_WS_ALIGN, 0);
    }
    assert_int_equal(kvf_arena_in_use(&a), 769);
    /* LIFO: each free gives its piece back at once */
    assert_true(kvf_arena_free(&a, p3));
    assert_int_equal(kvf_arena_in_use(&a), 556);
    assert_ptr_equal(kvf_arena_alloc(&a, 5), p3);               /* the same bytes again */
    assert_true(kvf_arena_free(&a, p3));
    assert_true(kvf_arena_free(&a, p2));
    assert_true(kvf_arena_free(&a, p1));
    assert_int_equal(kvf_arena_in_use(&a), 0);
    assert_int_equal(a.peak, 773);                              /* 768 + 5 */
    assert_int_equal(a.overflows, 0);
    /* out of order: p1 freed under p2 stays held until p2 goes, then both come back */
    p1 = kvf_arena_alloc(&a, 100);
    p2 = kvf_arena_alloc(&a, 100);
    assert_true(kvf_arena_free(&a, p1));
    assert_int_equal(kvf_arena_in_use(&a), 356);
    assert_ptr_equal(kvf_arena_alloc(&a, 1), (unsigned char *)mem + 512);   /* above p2 */
    assert_true(kvf_arena_free(&a, (unsigned char *)mem + 512));
    assert_false(kvf_arena_free(&a, p1));                       /* already freed */
    assert_true(kvf_arena_free(&a, p2));
    assert_int_equal(kvf_arena_in_use(&a), 0);
    free(mem);
}

static void test_arena_overflow(void **state)
{
    enum { CAP = 4096 };
    void *mem = aligned_alloc(KVF_WS_ALIGN, CAP);
    void *pieces[KVF_WS_MAX_LIVE + 1];
    kvf_arena_t a;
    int local = 0;

    (void)state;
    assert_non_null(mem);
    kvf_arena_init(&a, mem, CAP);
    assert_null(kvf_arena_alloc(&a, CAP + 1));                  /* too big: refused, counted */
    assert_int_equal(a.overflows, 1);
    assert_int_equal(a.overflow_max, CAP + 1);
    void *p = kvf_arena_alloc(&a, CAP - 256);
    assert_non_null(p);
    assert_null(kvf_arena_alloc(&a, 257));                      /* 256 left */
    assert_int_equal(a.overflows, 2);
    assert_int_equal(a.overflow_max, CAP + 1);                  /* the largest stays */
    void *q = kvf_arena_alloc(&a, 256);                         /* exactly what is left */
    assert_ptr_equal(q, (unsigned char *)mem + CAP - 256);
    assert_null(kvf_arena_alloc(&a, 1));
    assert_int_equal(a.overflows, 3);
    assert_false(kvf_arena_free(&a, &local));                   /* not the arena's: caller's */
    assert_false(kvf_arena_free(&a, NULL));
    assert_true(kvf_arena_free(&a, q));
    assert_true(kvf_arena_free(&a, p));
    free(mem);
    /* the live-piece table is bounded: with room to spare, the 65th live piece is refused */
    mem = aligned_alloc(KVF_WS_ALIGN, (KVF_WS_MAX_LIVE + 1) * KVF_WS_ALIGN);
    assert_non_null(mem);
    kvf_arena_init(&a, mem, (KVF_WS_MAX_LIVE + 1) * KVF_WS_ALIGN);
    for (unsigned i = 0; i < KVF_WS_MAX_LIVE; ++i) {
        pieces[i] = kvf_arena_alloc(&a, 1);
        assert_non_null(pieces[i]);
    }
    assert_null(kvf_arena_alloc(&a, 1));
    assert_int_equal(a.overflows, 1);
    for (unsigned i = KVF_WS_MAX_LIVE; i > 0; --i) {
        assert_true(kvf_arena_free(&a, pieces[i - 1]));
    }
    assert_int_equal(kvf_arena_in_use(&a), 0);
    assert_non_null(kvf_arena_alloc(&a, 1));                    /* and usable again */
    /* no memory at all (a zero-byte reservation): every request falls back */
    kvf_arena_init(&a, NULL, 0);
    assert_null(kvf_arena_alloc(&a, 1));
    assert_int_equal(a.overflows, 1);
    free(mem);
}

/* ---- staging ----------------------------------------------------------------------------- */

/* A fake stream: copies are numbered as issued; "ran" says how many have run. A fence of a
 * half remembers the copies issued when it was recorded. */
typedef struct {
    int      issued, ran;
    int      fence_at[2];
    int      fences, waits_blocking, waits;
} fake_stream_t;

static int fake_fence(void *ctx, int half)
{
    fake_stream_t *f = ctx;
    f->fence_at[half] = f->issued;
    f->fences++;
    return 0;
}

static int fake_wait(void *ctx, int half, bool *waited_p)
{
    fake_stream_t *f = ctx;
    f->waits++;
    *waited_p = (f->ran < f->fence_at[half]);
    if (*waited_p) {
        f->waits_blocking++;
        f->ran = f->fence_at[half];     /* blocking until the fence passed */
    }
    return 0;
}

static const kvf_staging_ops_t fake_ops = {fake_fence, fake_wait};

/* A take plus the copy that reads it (issued on the fake stream). */
static unsigned char *take(kvf_staging_t *s, fake_stream_t *f, size_t bytes)
{
    void *p = NULL;
    assert_int_equal(kvf_staging_take(s, bytes, &p), 0);
    assert_int_equal((uintptr_t)p % KVF_WS_STAGE_ALIGN, 0);
    f->issued++;
    return p;
}

static void test_staging_halves(void **state)
{
    enum { CAP = 1024 };   /* two halves of 512 */
    unsigned char *mem = aligned_alloc(64, CAP);
    fake_stream_t f = {0};
    kvf_staging_t s;
    void *p = NULL;

    (void)state;
    assert_non_null(mem);
    kvf_staging_init(&s, mem, CAP, &fake_ops, &f);
    assert_int_equal(s.half_cap, 512);
    assert_ptr_equal(take(&s, &f, 100), mem);
    assert_ptr_equal(take(&s, &f, 300), mem + 128);            /* 100 -> 128 */
    assert_ptr_equal(take(&s, &f, 64), mem + 448);             /* 448 + 64 = 512: fits */
    assert_int_equal(f.fences, 0);
    /* half 0 full: its copies are fenced, half 1 (never used) is taken without a wait */
    assert_ptr_equal(take(&s, &f, 1), mem + 512);
    assert_int_equal(f.fences, 1);
    assert_int_equal(f.fence_at[0], 3);
    assert_int_equal(f.waits, 0);
    assert_ptr_equal(take(&s, &f, 448), mem + 576);
    /* half 1 full: back to half 0, whose 3 copies have not run: the host must wait */
    f.ran = 2;
    assert_ptr_equal(take(&s, &f, 8), mem);
    assert_int_equal(f.waits_blocking, 1);
    assert_int_equal(s.waits, 1);
    assert_int_equal(f.ran, 3);                                 /* it waited for exactly those */
    /* and to half 1 again: its copies (4 and 5) ran meanwhile: asked, no block */
    f.ran = f.issued;
    assert_ptr_equal(take(&s, &f, 500), mem + 512);
    assert_int_equal(f.waits, 2);
    assert_int_equal(f.waits_blocking, 1);
    assert_int_equal(s.waits, 1);
    /* larger than a half: refused with its own code, counted; nothing consumed */
    assert_int_equal(kvf_staging_take(&s, 513, &p), KVF_STAGING_TOO_BIG);
    assert_int_equal(s.overflows, 1);
    assert_int_equal(s.overflow_max, 513);
    assert_int_equal(s.peak, 512);
    free(mem);
}

static void test_staging_reuse_after_sync(void **state)
{
    enum { CAP = 1024 };
    unsigned char *mem = aligned_alloc(64, CAP);
    fake_stream_t f = {0};
    kvf_staging_t s;
    uint64_t mark;

    (void)state;
    assert_non_null(mem);
    kvf_staging_init(&s, mem, CAP, &fake_ops, &f);
    unsigned char *a = take(&s, &f, 200);
    take(&s, &f, 200);
    /* a step's one synchronisation: every copy before it ran, so the area is empty again
     * and the next take reuses the first bytes, without a fence or a wait */
    mark = kvf_staging_mark(&s);
    f.ran = f.issued;
    assert_true(kvf_staging_synced(&s, mark));
    assert_int_equal(s.resets, 1);
    assert_ptr_equal(take(&s, &f, 10), a);
    assert_int_equal(f.fences + f.waits, 0);
    /* a take between the mark and the end of the sync (another thread): its copy may be
     * queued after the sync, so nothing is reused and the next take goes above it */
    mark = kvf_staging_mark(&s);
    unsigned char *racing = take(&s, &f, 10);
    assert_false(kvf_staging_synced(&s, mark));
    assert_int_equal(s.resets, 1);
    assert_ptr_equal(take(&s, &f, 10), racing + 64);
    /* the next sync without a race empties it */
    mark = kvf_staging_mark(&s);
    assert_true(kvf_staging_synced(&s, mark));
    assert_ptr_equal(take(&s, &f, 10), a);
    /* a sync with nothing taken is no reset (counted resets are the ones that freed bytes) */
    mark = kvf_staging_mark(&s);
    assert_true(kvf_staging_synced(&s, mark));
    mark = kvf_staging_mark(&s);
    assert_true(kvf_staging_synced(&s, mark));
    assert_int_equal(s.resets, 3);
    /* a fenced half forgotten by a reset is not waited for afterwards */
    take(&s, &f, 500);
    take(&s, &f, 500);                                          /* switch: half 0 fenced */
    assert_int_equal(f.fences, 1);
    mark = kvf_staging_mark(&s);
    f.ran = f.issued;
    assert_true(kvf_staging_synced(&s, mark));
    take(&s, &f, 500);
    take(&s, &f, 500);                                          /* half 1: never fenced */
    assert_int_equal(f.waits, 0);
    free(mem);
}

/* Random takes, syncs and copy progress: a byte handed out is never handed out again while
 * the copy that reads it has not run (the property the fences and resets exist for). */
static void test_staging_random(void **state)
{
    enum { CAP = 4096, OPS = 20000 };
    unsigned char *mem = aligned_alloc(64, CAP);
    int *owner = malloc(CAP * sizeof(int));   /* copy number reading each byte; -1 none */
    fake_stream_t f = {0};
    kvf_staging_t s;
    kvf_test_rng_t rng = {0x9e3779b97f4a7c15ull};

    (void)state;
    assert_non_null(mem);
    assert_non_null(owner);
    for (int i = 0; i < CAP; ++i) {
        owner[i] = -1;
    }
    kvf_staging_init(&s, mem, CAP, &fake_ops, &f);
    for (int op = 0; op < OPS; ++op) {
        float r = kvf_test_rand(&rng, 0.0f, 1.0f);
        if (r < 0.05f) {                                        /* a host sync */
            uint64_t mark = kvf_staging_mark(&s);
            f.ran = f.issued;
            assert_true(kvf_staging_synced(&s, mark));
        } else if (r < 0.35f) {                                 /* the stream makes progress */
            f.ran += (f.ran < f.issued) ? 1 : 0;
        } else {
            size_t bytes = 1 + (size_t)kvf_test_rand(&rng, 0.0f, 700.0f);
            void *p = NULL;
            int rc = kvf_staging_take(&s, bytes, &p);
            if (bytes > s.half_cap) {
                assert_int_equal(rc, KVF_STAGING_TOO_BIG);
                continue;
            }
            assert_int_equal(rc, 0);
            size_t at = (size_t)((unsigned char *)p - mem);
            assert_true(at + bytes <= CAP);
            for (size_t i = at; i < at + bytes; ++i) {
                assert_true((owner[i] < 0) || (owner[i] < f.ran));   /* its last reader ran */
                owner[i] = f.issued;                            /* this copy reads it */
            }
            f.issued++;
        }
    }
    assert_true(s.waits > 0);      /* the random walk did hit queued copies */
    assert_true(s.resets > 0);
    free(owner);
    free(mem);
}

/* Zero @a n ranges of device buffer @a d (@a size bytes) and check them against the CPU. */
static void zero_and_check(const kvf_device_t *dev, unsigned char *d, size_t size,
                           const size_t *off, const size_t *len, size_t n)
{
    unsigned char *h = malloc(size), *back = malloc(size);
    kvf_device_t cpu = kvf_device_cpu();

    assert_non_null(h);
    assert_non_null(back);
    memset(h, 0x5a, size);
    assert_int_equal(kvf_device_memcpy(dev, d, h, size, KVF_COPY_H2D), KVF_KERN_OK);
    assert_int_equal(kvf_zero_ranges(dev, d, off, len, n), KVF_KERN_OK);
    assert_int_equal(kvf_zero_ranges(&cpu, h, off, len, n), KVF_KERN_OK);
    assert_int_equal(kvf_device_memcpy(dev, back, d, size, KVF_COPY_D2H), KVF_KERN_OK);
    assert_memory_equal(back, h, size);
    free(h);
    free(back);
}

static void test_device_workspace(void **state)
{
    enum { N = 600, SIZE = 1 << 18, CHUNK = 16384, CHUNKS = 100, DBYTES = 4 << 20 };
    kvf_device_t cpu = kvf_device_cpu(), dev;
    kvf_device_ws_stats_t st;
    size_t off[N], len[N];
    unsigned char *d = NULL, *h, *back;

    (void)state;
    assert_int_equal(kvf_device_workspace_reserve(&cpu, 1 << 20, 1 << 20), KVF_KERN_OK);
    assert_int_equal(kvf_device_workspace_stats(&cpu, &st), KVF_KERN_OK);
    assert_false(st.reserved);
    assert_int_equal(st.device_bytes, 0);
    kvf_device_workspace_release(&cpu);
    assert_int_equal(kvf_device_workspace_stats(&cpu, NULL), KVF_KERN_EINVAL);
    if (!kvf_device_cuda_available()) {
#ifndef KVF_HAVE_CUDA
        kvf_device_t fake = {KVF_DEVICE_CUDA, 0, NULL};
        assert_int_equal(kvf_device_workspace_reserve(&fake, 1, 1), KVF_KERN_EUNSUPPORTED);
#endif
        skip();
    }
    for (size_t i = 0; i < N; ++i) {   /* 600 ranges: 4800-byte offset and length lists */
        off[i] = i * 400 + (i % 7);
        len[i] = 1 + (i * 37) % 390;
    }
    assert_int_equal(kvf_device_init(KVF_DEVICE_CUDA, 0, &dev), KVF_KERN_OK);
    assert_int_equal(kvf_device_alloc(&dev, DBYTES, (void **)&d), KVF_KERN_OK);
    /* too small: 4 KiB of arena, 2 KiB staging halves: both lists fall back, counted */
    assert_int_equal(kvf_device_workspace_reserve(&dev, 4096, 4096), KVF_KERN_OK);
    zero_and_check(&dev, d, SIZE, off, len, N);
    assert_int_equal(kvf_device_workspace_stats(&dev, &st), KVF_KERN_OK);
    assert_true(st.reserved);
    assert_int_equal(st.device_bytes, 4096);
    assert_true(st.device_fallbacks >= 2);
    assert_int_equal(st.device_fallback_max, N * sizeof(size_t));
    assert_true(st.staging_fallbacks >= 2);
    assert_int_equal(st.device_in_use, 0);
    kvf_device_workspace_release(&dev);
    assert_int_equal(kvf_device_workspace_stats(&dev, &st), KVF_KERN_OK);
    assert_false(st.reserved);
    /* large enough: served from the workspace; the D2H copy's sync empties the staging */
    assert_int_equal(kvf_device_workspace_reserve(&dev, 1 << 20, 1 << 20), KVF_KERN_OK);
    zero_and_check(&dev, d, SIZE, off, len, N);
    assert_int_equal(kvf_device_workspace_stats(&dev, &st), KVF_KERN_OK);
    assert_int_equal(st.device_fallbacks + st.staging_fallbacks, 0);
    assert_true(st.device_peak >= 2 * N * sizeof(size_t));
    assert_int_equal(st.device_in_use, 0);
    assert_true(st.staging_peak > 0);
    assert_true(st.staging_resets >= 1);
    /* 1.6 MB of uploads through 512 KiB halves without a sync (fences, maybe a wait): all
     * intact, and the host buffer is rewritten right after each copy (reusable on return) */
    h = malloc(CHUNK);
    back = malloc((size_t)CHUNK * CHUNKS);
    assert_non_null(h);
    assert_non_null(back);
    for (int c = 0; c < CHUNKS; ++c) {
        memset(h, c + 1, CHUNK);
        assert_int_equal(kvf_device_memcpy(&dev, d + (size_t)c * CHUNK, h, CHUNK, KVF_COPY_H2D),
                         KVF_KERN_OK);
        memset(h, 0xee, CHUNK);
    }
    assert_int_equal(kvf_device_memcpy(&dev, d + DBYTES / 2, d, (size_t)CHUNKS * CHUNK,
                                       KVF_COPY_D2D), KVF_KERN_OK);
    assert_int_equal(kvf_device_memcpy(&dev, back, d + DBYTES / 2, (size_t)CHUNKS * CHUNK,
                                       KVF_COPY_D2H), KVF_KERN_OK);
    for (int c = 0; c < CHUNKS; ++c) {
        for (size_t i = 0; i < CHUNK; ++i) {
            assert_int_equal(back[(size_t)c * CHUNK + i], c + 1);
        }
    }
    assert_int_equal(kvf_device_workspace_stats(&dev, &st), KVF_KERN_OK);
    assert_int_equal(st.staging_fallbacks, 0);
    assert_true(st.staging_peak <= (1u << 19));
    kvf_device_workspace_release(&dev);
    kvf_device_free(&dev, d);
    free(h);
    free(back);
}

/* The published inputs of a captured step (kvf_device_graph.h): an input wholly inside the
 * host block maps to the same offset of the device copy; one that starts before it, ends
 * past it, is empty-published or near the address space's end is refused; only pointers
 * into the device copy are owned (never freed to the arena). */
static void test_inputs_lookup(void **state)
{
    (void)state;
    static unsigned char hbuf[200], dev[100];
    unsigned char *host = hbuf + 50;   /* the block: 100 bytes inside a larger buffer */
    const kvf_ws_inputs_t in = {host, dev, 100}, none = {NULL, NULL, 0};

    assert_ptr_equal(kvf_ws_inputs_find(&in, host, 100), dev);
    assert_ptr_equal(kvf_ws_inputs_find(&in, host + 40, 60), dev + 40);
    assert_ptr_equal(kvf_ws_inputs_find(&in, host + 100, 0), dev + 100);
    assert_null(kvf_ws_inputs_find(&in, host + 40, 61));      /* one byte past the end */
    assert_null(kvf_ws_inputs_find(&in, host + 101, 0));
    assert_null(kvf_ws_inputs_find(&in, host - 1, 2));        /* starts before the block */
    assert_null(kvf_ws_inputs_find(&in, host + 1, SIZE_MAX)); /* no wrap-around */
    assert_null(kvf_ws_inputs_find(&in, (const void *)UINTPTR_MAX, 1));
    assert_null(kvf_ws_inputs_find(&in, NULL, 0));
    assert_null(kvf_ws_inputs_find(&none, host, 1));
    assert_true(kvf_ws_inputs_owns(&in, dev));
    assert_true(kvf_ws_inputs_owns(&in, dev + 99));
    assert_false(kvf_ws_inputs_owns(&in, dev + 100));
    assert_false(kvf_ws_inputs_owns(&in, host));
    assert_false(kvf_ws_inputs_owns(&none, dev));
    assert_false(kvf_ws_inputs_owns(&in, NULL));
}

/* kvf_device_graph.h on the CPU: no graphs (callers keep their eager path), bad arguments
 * refused, and the calls that take a cache accept NULL. */
static void test_graphs_cpu(void **state)
{
    (void)state;
    kvf_device_t cpu = kvf_device_cpu();
    kvf_device_graphs_t *g = (kvf_device_graphs_t *)1;
    kvf_device_graphs_stats_t st;
    kvf_graph_how_t how = KVF_GRAPH_REPLAYED;

    assert_int_equal(kvf_device_graphs_create(&cpu, 4096, 4, &g), KVF_KERN_EUNSUPPORTED);
    assert_ptr_equal(g, (kvf_device_graphs_t *)1);   /* untouched */
    assert_int_equal(kvf_device_graphs_create(&cpu, 4096, 0, &g), KVF_KERN_EINVAL);
    assert_int_equal(kvf_device_graphs_create(NULL, 4096, 4, &g), KVF_KERN_EINVAL);
    assert_int_equal(kvf_device_graphs_create(&cpu, 4096, 4, NULL), KVF_KERN_EINVAL);
    assert_int_equal(kvf_device_graph_run(NULL, 1, NULL, NULL, NULL, NULL, 0, &how),
                     KVF_KERN_EINVAL);
    memset(&st, 0xab, sizeof(st));
    kvf_device_graphs_stats(NULL, &st);
    assert_int_equal(st.graphs, 0);
    assert_int_equal(st.captures, 0);
    assert_false(st.disabled);
    kvf_device_graphs_clear(NULL);
    kvf_device_graphs_destroy(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_arena_align_lifo),
        cmocka_unit_test(test_arena_overflow),
        cmocka_unit_test(test_staging_halves),
        cmocka_unit_test(test_staging_reuse_after_sync),
        cmocka_unit_test(test_staging_random),
        cmocka_unit_test(test_device_workspace),
        cmocka_unit_test(test_inputs_lookup),
        cmocka_unit_test(test_graphs_cpu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
