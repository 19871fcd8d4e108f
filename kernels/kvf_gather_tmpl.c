/*
 * kvf_gather_tmpl.h: tables (checked, split into chunks, uploaded once), job checks, and the
 * CPU twin: every job's ops through kvf_gather_tmpl_op(), the function the CUDA kernel
 * calls, then memcpy / memset.
 *
 * Design: a table is made once per (prefill engine, decode rank) pair and read by every pull
 * of it; a pull checks its jobs (a few per request block) and expands nothing on the host.
 * Rejected: uploading the expanded op list per pull (kvf_gather_staged(): ~1,400 ops for a
 * 9B 4p2d 8k pull, built on the host after a plan of the same size); one template per
 * request shape (partial block tails differ per request: clipping at the job's tokens keeps
 * one partial template per pair).
 */
#include "kvf_gather_tmpl.h"
#ifdef KVF_HAVE_CUDA
#include "kvf_gather_tmpl_cuda.h"
#endif
#include "kvf_log.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

struct kvf_gather_table {
    kvf_gather_tmpl_view_t view;     /* pieces/tmpls: device copies on CUDA, else host */
    kvf_gather_piece_t    *pieces;   /* host */
    kvf_gather_tmpl_t     *tmpls;    /* host */
    size_t                 num_pieces, num_tmpls;
    int64_t                dst_blocks;
    int64_t                src_blocks[KVF_GATHER_TMPL_MAX_SRC];
    bool                   cuda;
};

/* Chunks piece @a pc splits into (data first, then its pad alone: dropped whole on a
 * job's last slot); writes them to @a out when not NULL. */
static size_t kvf_gather_piece_split(const kvf_gather_piece_t *pc, kvf_gather_piece_t *out)
{
    uint64_t data = pc->len - pc->pad;
    uint64_t step = KVF_GATHER_CHUNK;
    size_t n = 0;

    if (pc->row > 0) {
        step = (KVF_GATHER_CHUNK / pc->row) * pc->row;
    }
    for (uint64_t done = 0; done < pc->len; ++n) {
        uint64_t end = (done < data) ? data : pc->len;
        uint64_t l = (end - done < step) ? end - done : step;
        if (out != NULL) {
            out[n] = *pc;
            out[n].loff = pc->loff + done;
            out[n].roff = pc->roff + done;
            out[n].len = l;
            out[n].pad = (done < data) ? 0 : (uint32_t)l;
            out[n].tok0 = (pc->row > 0) ? pc->tok0 + (uint32_t)(done / pc->row) : 0;
        }
        done += l;
    }
    return n;
}

static bool kvf_gather_piece_ok(const kvf_gather_table_desc_t *d, size_t i)
{
    const kvf_gather_piece_t *pc = &d->pieces[i];
    bool zero = (pc->src == KVF_GATHER_TMPL_ZERO);

    if ((pc->len == 0) || (pc->pad > pc->len) || (pc->loff > d->dst_page) ||
        (pc->len > d->dst_page - pc->loff) || (!zero && (pc->src >= d->num_src)) ||
        (!zero && ((pc->roff > d->src_page[pc->src]) ||
                   (pc->len > d->src_page[pc->src] - pc->roff))) ||
        ((pc->row > 0) && ((pc->len % pc->row != 0) || (pc->pad != 0)))) {
        kvf_error("gather table: piece %zu {src %" PRIu32 ", loff %" PRIu64 ", roff %" PRIu64
                  ", len %" PRIu64 ", pad %" PRIu32 ", row %" PRIu32 "} leaves a page (local "
                  "%" PRIu64 " bytes) or names no source (%" PRIu32 ")", i, pc->src, pc->loff,
                  pc->roff, pc->len, pc->pad, pc->row, d->dst_page, d->num_src);
        return false;
    }
    return true;
}

/* Split every piece, remapping the templates (host arrays of @a t). */
static int kvf_gather_table_fill(const kvf_gather_table_desc_t *d, kvf_gather_table_t *t)
{
    size_t total = 0;

    for (size_t i = 0; i < d->num_pieces; ++i) {
        if (!kvf_gather_piece_ok(d, i)) {
            return KVF_KERN_EINVAL;
        }
        total += kvf_gather_piece_split(&d->pieces[i], NULL);
    }
    t->pieces = malloc((total + 1) * sizeof(*t->pieces));
    t->tmpls = malloc((d->num_tmpls + 1) * sizeof(*t->tmpls));
    if ((t->pieces == NULL) || (t->tmpls == NULL)) {
        return KVF_KERN_ENOMEM;
    }
    for (size_t k = 0; k < d->num_tmpls; ++k) {
        const kvf_gather_tmpl_t *tm = &d->tmpls[k];
        if ((tm->count == 0) || (tm->first > d->num_pieces) ||
            (tm->count > d->num_pieces - tm->first)) {
            kvf_error("gather table: template %zu {first %" PRIu32 ", count %" PRIu32 "} "
                      "leaves the %zu pieces", k, tm->first, tm->count, d->num_pieces);
            return KVF_KERN_EINVAL;
        }
        t->tmpls[k].first = (uint32_t)t->num_pieces;
        for (uint32_t i = tm->first; i < tm->first + tm->count; ++i) {
            t->num_pieces += kvf_gather_piece_split(&d->pieces[i], t->pieces + t->num_pieces);
        }
        t->tmpls[k].count = (uint32_t)t->num_pieces - t->tmpls[k].first;
    }
    t->num_tmpls = d->num_tmpls;
    return KVF_KERN_OK;
}

int kvf_gather_table_create(const kvf_device_t *dev, const kvf_gather_table_desc_t *desc,
                            kvf_gather_table_t **table_p)
{
    kvf_gather_table_t *t;
    int err;

    if ((desc == NULL) || (table_p == NULL) || (desc->num_src > KVF_GATHER_TMPL_MAX_SRC) ||
        (desc->slots == 0) || (desc->dst_page == 0) ||
        ((desc->num_pieces > 0) && (desc->pieces == NULL)) ||
        ((desc->num_tmpls > 0) && (desc->tmpls == NULL))) {
        kvf_error("gather table: desc, table_p, pieces and templates must be set, slots and "
                  "the page size > 0, num_src <= %d", KVF_GATHER_TMPL_MAX_SRC);
        return KVF_KERN_EINVAL;
    }
    t = calloc(1, sizeof(*t));
    if (t == NULL) {
        return KVF_KERN_ENOMEM;
    }
    t->cuda = (dev != NULL) && (dev->kind == KVF_DEVICE_CUDA);
    err = kvf_gather_table_fill(desc, t);
    t->view.dst_base = desc->dst_base;
    t->view.dst_page = desc->dst_page;
    t->view.slots = desc->slots;
    t->view.num_src = desc->num_src;
    memcpy(t->view.src_base, desc->src_base, sizeof(t->view.src_base));
    memcpy(t->view.src_page, desc->src_page, sizeof(t->view.src_page));
    memcpy(t->src_blocks, desc->src_blocks, sizeof(t->src_blocks));
    t->dst_blocks = desc->dst_blocks;
    t->view.pieces = t->pieces;
    t->view.tmpls = t->tmpls;
    if ((err == KVF_KERN_OK) && t->cuda) {
#ifdef KVF_HAVE_CUDA
        err = kvf_cuda_gather_table_upload(dev, t->pieces, t->num_pieces, t->tmpls,
                                           t->num_tmpls, &t->view);
#else
        err = KVF_KERN_EUNSUPPORTED;
#endif
    }
    if (err != KVF_KERN_OK) {
        kvf_gather_table_destroy(dev, t);
        return err;
    }
    *table_p = t;
    return KVF_KERN_OK;
}

void kvf_gather_table_destroy(const kvf_device_t *dev, kvf_gather_table_t *table)
{
    if (table == NULL) {
        return;
    }
#ifdef KVF_HAVE_CUDA
    if (table->cuda && (table->view.pieces != table->pieces)) {
        kvf_cuda_gather_table_free(dev, &table->view);
    }
#else
    (void)dev;
#endif
    free(table->pieces);
    free(table->tmpls);
    free(table);
}

size_t kvf_gather_tmpl_ops(const kvf_gather_table_t *table, kvf_gather_job_t *jobs, size_t n)
{
    uint64_t ops = 0;

    for (size_t i = 0; i < n; ++i) {
        if (jobs[i].tmpl >= table->num_tmpls) {
            return 0;
        }
        jobs[i].first_op = (uint32_t)ops;
        ops += (uint64_t)jobs[i].nslots * table->tmpls[jobs[i].tmpl].count;
    }
    return (ops > UINT32_MAX) ? 0 : (size_t)ops;
}

/* Every job inside both regions (ids against each side's block count, slots). */
static bool kvf_gather_jobs_ok(const kvf_gather_table_t *t, const kvf_gather_job_t *jobs,
                               size_t n)
{
    for (size_t i = 0; i < n; ++i) {
        const kvf_gather_job_t *jb = &jobs[i];
        bool ok = (jb->tmpl < t->num_tmpls) && (jb->nslots >= 1) &&
                  (jb->nslots <= t->view.slots) && (jb->lid >= 0) && (jb->lid < t->dst_blocks);
        for (uint32_t k = 0; ok && (k < t->tmpls[jb->tmpl].count); ++k) {
            uint32_t s = t->pieces[t->tmpls[jb->tmpl].first + k].src;
            ok = (s == KVF_GATHER_TMPL_ZERO) || ((jb->rid >= 0) && (jb->rid < t->src_blocks[s]));
        }
        if (!ok) {
            kvf_error("gather: job %zu {template %" PRIu32 " of %zu, slots %" PRIu32 " of %"
                      PRIu32 ", local block %" PRId32 " of %" PRId64 ", source block %" PRId32
                      "} leaves a region", i, jb->tmpl, t->num_tmpls, jb->nslots, t->view.slots,
                      jb->lid, t->dst_blocks, jb->rid);
            return false;
        }
    }
    return true;
}

/* The CPU twin: op by op through the function the kernel calls. */
static void kvf_gather_tmpl_cpu(const kvf_gather_table_t *t, const kvf_gather_job_t *jobs,
                                size_t n, size_t ops)
{
    for (size_t o = 0; o < ops; ++o) {
        const kvf_gather_job_t *jb = &jobs[kvf_gather_tmpl_job(jobs, n, o)];
        kvf_gather_op_t op;
        uint64_t copy;

        kvf_gather_tmpl_op(&t->view, jb, (uint32_t)(o - jb->first_op), &op, &copy);
        if (copy > 0) {
            memcpy((void *)(uintptr_t)op.dst, (const void *)(uintptr_t)op.src, (size_t)copy);
        }
        if (op.len > copy) {
            memset((void *)(uintptr_t)(op.dst + copy), 0, (size_t)(op.len - copy));
        }
    }
}

int kvf_gather_tmpl_run(const kvf_device_t *dev, const kvf_gather_table_t *table,
                        kvf_gather_job_t *jobs, kvf_gather_job_t *dev_jobs, size_t n)
{
    size_t ops;

    if (n == 0) {
        return KVF_KERN_OK;
    }
    if ((table == NULL) || (jobs == NULL) || !kvf_gather_jobs_ok(table, jobs, n)) {
        return KVF_KERN_EINVAL;
    }
    ops = kvf_gather_tmpl_ops(table, jobs, n);
    if (ops == 0) {
        kvf_error("gather: %zu jobs expand to more than %" PRIu32 " ops", n, UINT32_MAX);
        return KVF_KERN_EINVAL;
    }
    if (table->cuda) {
#ifdef KVF_HAVE_CUDA
        return (dev_jobs == NULL) ? KVF_KERN_EINVAL :
               kvf_cuda_gather_tmpl_run(dev, &table->view, jobs, dev_jobs, n, ops);
#else
        (void)dev_jobs;
        return KVF_KERN_EUNSUPPORTED;
#endif
    }
    (void)dev;
    (void)dev_jobs;
    kvf_gather_tmpl_cpu(table, jobs, n, ops);
    return KVF_KERN_OK;
}
