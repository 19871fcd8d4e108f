/* kvf_gather_tmpl_run(): jobs over a table of four templates (a coalesced whole block with
 * misaligned and over-a-chunk pieces, a clip-able partial block clipped at 0, 5, 37 tokens
 * and whole, a Mamba page whose pad (over a chunk) is dropped on the last slot, a zeroed
 * page) against a naive reference written here from the unsplit pieces, byte for byte;
 * refusals (a piece outside its page, a source block past the pool, a slot count past the
 * table); with a GPU the CUDA kernel gives the CPU's bytes (skipped without one). */
#include "kvf_gather_tmpl.h"
#include "kvf_kern_test.h"
#include "kvf_device_ipc.h"
#include "kvf_kern.h"

#include <stdlib.h>
#include <string.h>

#define DPAGE   327680u
#define SLOTS   3u
#define DBLOCKS 6
#define SBLOCKS 4
#define W       KVF_GATHER_TMPL_WHOLE

static const uint64_t spage[2] = {DPAGE + 4096u, 400000u};

static kvf_gather_piece_t pieces[32];
static kvf_gather_tmpl_t tmpls[4];
static size_t npieces;

static void add(uint32_t src, uint64_t loff, uint64_t roff, uint64_t len, uint32_t row,
                uint32_t tok0, uint32_t pad)
{
    pieces[npieces++] = (kvf_gather_piece_t){.src = src, .row = row, .tok0 = tok0, .pad = pad,
                                             .loff = loff, .roff = roff, .len = len};
}

static void build(void)
{
    npieces = 0;
    tmpls[0].first = 0;                                   /* whole block, coalesced */
    add(1, 3, 7, 200001, 0, 0, 0);
    add(0, 200010, 200010, 100000, 0, 0, 0);
    tmpls[0].count = (uint32_t)npieces;
    tmpls[1].first = (uint32_t)npieces;                   /* partial: 3 kernel blocks of 16 */
    for (uint32_t kb = 0; kb < 3; ++kb) {
        for (uint32_t kv = 0; kv < 2; ++kv) {
            for (uint32_t h = 0; h < 2; ++h) {
                uint64_t off = ((kb * 2 + kv) * 2 + h) * 16u * 256u;
                add(h, off, off + 512u * h, 16u * 256u, 256, kb * 16, 0);
            }
        }
    }
    add(0, 65536, 69000, 1024u * 256u, 256, 0, 0);        /* 1024 rows: over a chunk */
    tmpls[1].count = (uint32_t)npieces - tmpls[1].first;
    tmpls[2].first = (uint32_t)npieces;                   /* Mamba page with its pad */
    add(0, 0, 0, 100000, 0, 0, 0);
    add(1, 100000, 5000, 57000, 0, 0, 0);
    add(0, 157000, 160000, 170000, 0, 0, 150000);
    tmpls[2].count = (uint32_t)npieces - tmpls[2].first;
    tmpls[3].first = (uint32_t)npieces;                   /* zeroed page */
    add(KVF_GATHER_TMPL_ZERO, 0, 0, DPAGE, 0, 0, 0);
    tmpls[3].count = 1;
}

static const kvf_gather_job_t jobs0[] = {
    {0, 3, 0, 1, W, 0}, {1, 2, 2, 0, 37, 0}, {1, 3, 3, 2, 0, 0}, {2, 3, 1, 3, W, 0},
    {3, 2, 4, 0, W, 0}, {2, 1, 5, 0, W, 0},
};
#define NJOBS 6

static void desc_of(kvf_gather_table_desc_t *d, uint8_t *dst, uint8_t *const *src)
{
    memset(d, 0, sizeof(*d));
    d->dst_base = (uint64_t)(uintptr_t)dst;
    d->dst_page = DPAGE;
    d->dst_blocks = DBLOCKS;
    d->slots = SLOTS;
    d->num_src = 2;
    for (int s = 0; s < 2; ++s) {
        d->src_base[s] = (uint64_t)(uintptr_t)src[s];
        d->src_page[s] = spage[s];
        d->src_blocks[s] = SBLOCKS;
    }
    d->pieces = pieces;
    d->num_pieces = npieces;
    d->tmpls = tmpls;
    d->num_tmpls = 4;
}

/* The reference: each job, slot and unsplit piece, written out plainly. */
static void reference(uint8_t *dst, uint8_t *const *src, const kvf_gather_job_t *jobs, size_t n)
{
    for (size_t i = 0; i < n; ++i) {
        const kvf_gather_job_t *jb = &jobs[i];
        for (uint32_t j = 0; j < jb->nslots; ++j) {
            for (uint32_t k = tmpls[jb->tmpl].first;
                 k < tmpls[jb->tmpl].first + tmpls[jb->tmpl].count; ++k) {
                const kvf_gather_piece_t *pc = &pieces[k];
                uint64_t len = pc->len - ((j + 1 == jb->nslots) ? pc->pad : 0), copy = len;
                uint8_t *d = dst + ((uint64_t)jb->lid * SLOTS + j) * DPAGE + pc->loff;
                if (pc->src == KVF_GATHER_TMPL_ZERO) {
                    memset(d, 0, len);
                    continue;
                }
                if ((pc->row > 0) && (jb->tokens != W)) {
                    int64_t rows = (int64_t)jb->tokens - (int64_t)pc->tok0;
                    rows = (rows < 0) ? 0 : rows;
                    copy = ((uint64_t)rows * pc->row < len) ? (uint64_t)rows * pc->row : len;
                }
                memcpy(d, src[pc->src] + ((uint64_t)jb->rid * SLOTS + j) * spage[pc->src] +
                              pc->roff, copy);
                memset(d + copy, 0, len - copy);
            }
        }
    }
}

static const size_t DSIZE = (size_t)DBLOCKS * SLOTS * DPAGE;

static void fill_src(uint8_t **src)
{
    kvf_test_rng_t rng = {0x9e3779b97f4a7c15ull};
    for (int s = 0; s < 2; ++s) {
        size_t n = (size_t)SBLOCKS * SLOTS * spage[s];
        src[s] = malloc(n);
        assert_non_null(src[s]);
        for (size_t i = 0; i < n; ++i) {
            src[s][i] = (uint8_t)(kvf_test_rand(&rng, 1.0f, 255.0f));
        }
    }
}

static void test_cpu(void **state)
{
    uint8_t *src[2], *dst = malloc(DSIZE), *want = malloc(DSIZE);
    kvf_gather_job_t jobs[8];
    kvf_gather_table_desc_t d;
    kvf_gather_table_t *t = NULL;
    kvf_device_t cpu = {KVF_DEVICE_CPU, 0, NULL};

    (void)state;
    build();
    fill_src(src);
    memset(dst, 0xab, DSIZE);
    memset(want, 0xab, DSIZE);
    desc_of(&d, dst, src);
    assert_int_equal(kvf_gather_table_create(&cpu, &d, &t), KVF_KERN_OK);
    memcpy(jobs, jobs0, sizeof(jobs0));
    /* 3 x 3 (whole: the piece over a chunk in 2) + 2 x 14 + 3 x 14 (clip-able: 12 runs and
     * the long one in 2) + 3 x 5 (Mamba: 1 + 1 + data 1 + pad 2) + 2 x 3 (zero page: 3
     * chunks) + 1 x 5 */
    assert_int_equal(kvf_gather_tmpl_ops(t, jobs, NJOBS), 9 + 28 + 42 + 15 + 6 + 5);
    assert_int_equal(kvf_gather_tmpl_run(&cpu, t, jobs, NULL, NJOBS), KVF_KERN_OK);
    reference(want, src, jobs0, NJOBS);
    assert_memory_equal(dst, want, DSIZE);
    /* refusals: a source block past the pool, too many slots, a template past the table */
    jobs[0].rid = SBLOCKS;
    assert_int_equal(kvf_gather_tmpl_run(&cpu, t, jobs, NULL, 1), KVF_KERN_EINVAL);
    jobs[0] = jobs0[0];
    jobs[0].nslots = SLOTS + 1;
    assert_int_equal(kvf_gather_tmpl_run(&cpu, t, jobs, NULL, 1), KVF_KERN_EINVAL);
    jobs[0] = jobs0[0];
    jobs[0].tmpl = 4;
    assert_int_equal(kvf_gather_tmpl_run(&cpu, t, jobs, NULL, 1), KVF_KERN_EINVAL);
    jobs[0] = jobs0[0];
    jobs[0].lid = -1;
    assert_int_equal(kvf_gather_tmpl_run(&cpu, t, jobs, NULL, 1), KVF_KERN_EINVAL);
    kvf_gather_table_destroy(&cpu, t);
    /* a piece one byte past the source page */
    pieces[1].roff = spage[0] - pieces[1].len + 1;
    assert_int_equal(kvf_gather_table_create(&cpu, &d, &t), KVF_KERN_EINVAL);
    build();
    pieces[4].len = 16u * 256u + 1;   /* clip-able but not whole rows */
    assert_int_equal(kvf_gather_table_create(&cpu, &d, &t), KVF_KERN_EINVAL);
    free(src[0]);
    free(src[1]);
    free(dst);
    free(want);
}

static void test_cuda(void **state)
{
    uint8_t *src[2], *dsrc[2], *ddst, *host = malloc(DSIZE), *want = malloc(DSIZE);
    kvf_gather_job_t *jobs, *djobs;
    kvf_gather_table_desc_t d;
    kvf_gather_table_t *t = NULL;
    kvf_device_t dev;

    (void)state;
    if (!kvf_device_cuda_available()) {
        free(host);
        free(want);
        skip();
    }
    build();
    fill_src(src);
    assert_int_equal(kvf_device_init(KVF_DEVICE_CUDA, 0, &dev), KVF_KERN_OK);
    assert_int_equal(kvf_device_alloc(&dev, DSIZE, (void **)&ddst), KVF_KERN_OK);
    assert_int_equal(kvf_device_memset(&dev, ddst, 0xab, DSIZE), KVF_KERN_OK);
    for (int s = 0; s < 2; ++s) {
        size_t n = (size_t)SBLOCKS * SLOTS * spage[s];
        assert_int_equal(kvf_device_alloc(&dev, n, (void **)&dsrc[s]), KVF_KERN_OK);
        assert_int_equal(kvf_device_memcpy(&dev, dsrc[s], src[s], n, KVF_COPY_H2D),
                         KVF_KERN_OK);
    }
    desc_of(&d, ddst, dsrc);
    assert_int_equal(kvf_gather_table_create(&dev, &d, &t), KVF_KERN_OK);
    assert_int_equal(kvf_device_host_alloc(&dev, sizeof(jobs0), (void **)&jobs), KVF_KERN_OK);
    assert_int_equal(kvf_device_alloc(&dev, sizeof(jobs0), (void **)&djobs), KVF_KERN_OK);
    memcpy(jobs, jobs0, sizeof(jobs0));
    assert_int_equal(kvf_gather_tmpl_run(&dev, t, jobs, djobs, NJOBS), KVF_KERN_OK);
    assert_int_equal(kvf_device_sync(&dev), KVF_KERN_OK);
    assert_int_equal(kvf_device_memcpy(&dev, host, ddst, DSIZE, KVF_COPY_D2H), KVF_KERN_OK);
    memset(want, 0xab, DSIZE);
    reference(want, src, jobs0, NJOBS);
    assert_memory_equal(host, want, DSIZE);
    kvf_gather_table_destroy(&dev, t);
    kvf_device_host_free(&dev, jobs);
    kvf_device_free(&dev, djobs);
    kvf_device_free(&dev, ddst);
    for (int s = 0; s < 2; ++s) {
        kvf_device_free(&dev, dsrc[s]);
        free(src[s]);
    }
    free(host);
    free(want);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu),
        cmocka_unit_test(test_cuda),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
