/*
 * kvf_sample_batch(): the upload of a step's sampling parameters, the launch, the download
 * (kvf_sample_batch.h). Kept apart from kvf_sample.c so the call to kvf_sample_rows() crosses
 * an object file (a link-time wrap of the entry point sees it).
 */
#include "kvf_sample_batch.h"
#include "kvf_kern_internal.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct kvf_sample_ws {
    kvf_device_t      dev;
    int               cap_rows, cap_vocab, cap_pen;
    unsigned char    *host;      /* staging: params then entries */
    void             *up;        /* (dev) the same bytes */
    float            *scratch;   /* (dev) [cap_rows][cap_vocab] */
    kvf_sample_res_t *res;       /* (dev) [cap_rows] */
};

static void kvf_ws_free_dev(kvf_sample_ws_t *ws)
{
    kvf_device_free(&ws->dev, ws->up);
    kvf_device_free(&ws->dev, ws->scratch);
    kvf_device_free(&ws->dev, ws->res);
    free(ws->host);
    ws->up = ws->scratch = NULL;
    ws->res = NULL;
    ws->host = NULL;
    ws->cap_rows = ws->cap_vocab = ws->cap_pen = 0;
}

void kvf_sample_ws_destroy(kvf_sample_ws_t *ws)
{
    if (ws != NULL) {
        kvf_ws_free_dev(ws);
        free(ws);
    }
}

size_t kvf_sample_batch_d2h_bytes(int rows)
{
    return (size_t)rows * sizeof(kvf_sample_res_t);
}

size_t kvf_sample_ws_device_bytes(int rows, int vocab, int num_pen)
{
    num_pen = (num_pen < 64) ? 64 : num_pen;
    return (size_t)rows * sizeof(kvf_sample_row_t) + (size_t)num_pen * sizeof(kvf_sample_pen_t) +
           (size_t)rows * (size_t)vocab * sizeof(float) + (size_t)rows * sizeof(kvf_sample_res_t);
}

/* Grow to rows x vocab and num_pen entries (all or nothing: a failure frees everything,
 * the next call allocates afresh). Entries grow to twice the need (histories grow a token
 * a step: a doubling, not an allocation per step). */
static int kvf_ws_reserve(kvf_sample_ws_t *ws, int rows, int vocab, int num_pen)
{
    size_t up;
    int rc;

    if ((rows <= ws->cap_rows) && (vocab <= ws->cap_vocab) && (num_pen <= ws->cap_pen)) {
        return KVF_KERN_OK;
    }
    if ((num_pen > ws->cap_pen) && (ws->cap_pen > 0)) {
        num_pen = (num_pen > INT32_MAX / 2) ? num_pen : 2 * num_pen;
    }
    rows = (rows > ws->cap_rows) ? rows : ws->cap_rows;
    vocab = (vocab > ws->cap_vocab) ? vocab : ws->cap_vocab;
    num_pen = (num_pen > ws->cap_pen) ? num_pen : ws->cap_pen;
    num_pen = (num_pen < 64) ? 64 : num_pen;
    kvf_ws_free_dev(ws);
    up = (size_t)rows * sizeof(kvf_sample_row_t) + (size_t)num_pen * sizeof(kvf_sample_pen_t);
    ws->host = malloc(up);
    if (ws->host == NULL) {
        return KVF_KERN_ENOMEM;
    }
    rc = kvf_device_alloc(&ws->dev, up, &ws->up);
    if (rc == KVF_KERN_OK) {
        rc = kvf_device_alloc(&ws->dev, (size_t)rows * (size_t)vocab * sizeof(float),
                              (void **)&ws->scratch);
    }
    if (rc == KVF_KERN_OK) {
        rc = kvf_device_alloc(&ws->dev, (size_t)rows * sizeof(kvf_sample_res_t),
                              (void **)&ws->res);
    }
    if (rc != KVF_KERN_OK) {
        kvf_ws_free_dev(ws);
        return rc;
    }
    ws->cap_rows = rows;
    ws->cap_vocab = vocab;
    ws->cap_pen = num_pen;
    return KVF_KERN_OK;
}

static int kvf_ws_get(const kvf_device_t *dev, kvf_sample_ws_t **ws_p)
{
    if (*ws_p == NULL) {
        *ws_p = calloc(1, sizeof(**ws_p));
        if (*ws_p == NULL) {
            return KVF_KERN_ENOMEM;
        }
        (*ws_p)->dev = (dev != NULL) ? *dev : kvf_device_cpu();
    }
    return KVF_KERN_OK;
}

int kvf_sample_ws_reserve(const kvf_device_t *dev, kvf_sample_ws_t **ws_p, int rows,
                          int vocab, int num_pen)
{
    int rc;

    if ((ws_p == NULL) || (rows < 1) || (vocab < 1) || (num_pen < 0)) {
        return KVF_KERN_EINVAL;
    }
    rc = kvf_ws_get(dev, ws_p);
    return (rc == KVF_KERN_OK) ? kvf_ws_reserve(*ws_p, rows, vocab, num_pen) : rc;
}

int kvf_sample_batch(const kvf_device_t *dev, kvf_sample_ws_t **ws_p, const float *logits,
                     int rows, int vocab, int ldl, const kvf_sample_row_t *params,
                     const kvf_sample_pen_t *pen, int num_pen, kvf_sample_res_t *out)
{
    kvf_sample_ws_t *ws;
    size_t pb;
    int rc;

    if ((ws_p == NULL) || (rows < 0) || (vocab < 1) || (ldl < vocab) || (num_pen < 0) ||
        ((rows > 0) && ((logits == NULL) || (params == NULL) || (out == NULL))) ||
        ((num_pen > 0) && (pen == NULL))) {
        return KVF_KERN_EINVAL;
    }
    if (rows == 0) {
        return KVF_KERN_OK;
    }
    for (int r = 0; r < rows; ++r) {
        if (kvf_sample_row_check(&params[r], pen, num_pen, vocab) != KVF_KERN_OK) {
            return KVF_KERN_EINVAL;
        }
    }
    rc = kvf_ws_get(dev, ws_p);
    if (rc != KVF_KERN_OK) {
        return rc;
    }
    ws = *ws_p;
    rc = kvf_ws_reserve(ws, rows, vocab, num_pen);
    if (rc != KVF_KERN_OK) {
        return rc;
    }
    if (kvf_kern_on_cpu(dev)) {
        return kvf_sample_rows(dev, logits, rows, vocab, ldl, params, pen, num_pen, ws->scratch,
                               out);
    }
    pb = (size_t)rows * sizeof(kvf_sample_row_t);
    memcpy(ws->host, params, pb);
    if (num_pen > 0) {
        memcpy(ws->host + pb, pen, (size_t)num_pen * sizeof(kvf_sample_pen_t));
    }
    rc = kvf_device_memcpy(dev, ws->up, ws->host, pb + (size_t)num_pen * sizeof(kvf_sample_pen_t),
                           KVF_COPY_H2D);
    if (rc == KVF_KERN_OK) {
        rc = kvf_sample_rows(dev, logits, rows, vocab, ldl, (const kvf_sample_row_t *)ws->up,
                             (const kvf_sample_pen_t *)((unsigned char *)ws->up + pb), num_pen,
                             ws->scratch, ws->res);
    }
    if (rc == KVF_KERN_OK) {
        rc = kvf_device_memcpy(dev, out, ws->res, kvf_sample_batch_d2h_bytes(rows),
                               KVF_COPY_D2H);
    }
    return rc;
}
