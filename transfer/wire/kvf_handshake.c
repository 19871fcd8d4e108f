/*
 * Handshake messages: C structs <-> protobuf-c.
 *
 * Design: the protobuf structs never leave this file. Packing builds them on
 * the stack pointing into the caller's C struct (no copies); unpacking
 * copies into fixed-size C fields after checking every length and range, so
 * later code can index arrays with what a peer sent without re-checking.
 * protobuf-c itself rejects truncated and malformed wire data; we add the
 * semantic bounds (a well-formed message with tp_size 0 or a 1 MiB rkey is
 * still refused here). Rejected alternative: handing the Kvf__ structs to
 * callers — every consumer would need its own NULL/has_ checks.
 */
#include "kvf_handshake.h"

#include "kvf_log.h"
#include "kvf_pb_check.h"
#include "kvf_xfer.pb-c.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define XXH_STATIC_LINKING_ONLY   /* XXH3_state_t on the stack */
#include <xxhash.h>

const char *kvf_xfer_mem_type_name(kvf_xfer_mem_type_t type)
{
    switch (type) {
    case KVF_XFER_MEM_HOST:
        return "host";
    case KVF_XFER_MEM_CUDA:
        return "cuda";
    }
    return "unknown";
}

void kvf_refusal_format(const kvf_refusal_t *r, bool local_is_prefill, char *buf, size_t len)
{
    snprintf(buf, len, "handshake refused: %s prefill=%s decode=%s: %s", r->field,
             local_is_prefill ? r->local : r->remote, local_is_prefill ? r->remote : r->local,
             r->why);
}

/* Copy a peer string into a fixed field; false when missing or too long. */
static bool kvf_hs_copy_str(char *dst, size_t cap, const char *src, bool required)
{
    if (src == NULL) {
        dst[0] = '\0';
        return !required;
    }
    size_t n = strlen(src);
    if (n >= cap) {
        return false;
    }
    memcpy(dst, src, n + 1);
    return true;
}

static void kvf_hs_le32(uint8_t *w, uint32_t v)
{
    w[0] = (uint8_t)v;
    w[1] = (uint8_t)(v >> 8);
    w[2] = (uint8_t)(v >> 16);
    w[3] = (uint8_t)(v >> 24);
}

static kvf_status_t kvf_hs_finish_pack(size_t size, const ProtobufCMessage *msg, uint8_t **buf_p,
                                       size_t *len_p)
{
    uint8_t *buf = malloc(size ? size : 1);
    if (buf == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    *len_p = protobuf_c_message_pack(msg, buf);
    *buf_p = buf;
    return KVF_OK;
}

/* ---- request ---------------------------------------------------------- */

static void kvf_hs_le64(uint8_t *w, uint64_t v)
{
    for (int i = 0; i < 8; ++i) {
        w[i] = (uint8_t)(v >> (8 * i));
    }
}

static uint64_t kvf_hs_get64(const uint8_t *w)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; --i) {
        v = (v << 8) | w[i];
    }
    return v;
}

uint64_t kvf_kv_digest_ranges(const uint8_t *base, const uint64_t *ranges, size_t num_ranges)
{
    XXH3_state_t st;

    XXH3_64bits_reset(&st);
    for (size_t i = 0; i < num_ranges; ++i) {
        XXH3_64bits_update(&st, base + ranges[2 * i], (size_t)ranges[2 * i + 1]);
    }
    return XXH3_64bits_digest(&st);
}

/* The digests of a release as protobuf (pointing into @a bufs, which the caller frees). */
static kvf_status_t kvf_hs_pack_digests(const kvf_lease_msg_t *lm, Kvf__LeaseRequest *l,
                                        Kvf__KvDigest **pd, Kvf__KvDigest *d, uint8_t **bufs)
{
    for (int i = 0; i < lm->num_digests; ++i) {
        const kvf_kv_digest_t *x = &lm->digests[i];
        kvf__kv_digest__init(&d[i]);
        bufs[i] = malloc(16 * x->num_ranges + 1);
        if (bufs[i] == NULL) {
            return KVF_ERR_NO_MEMORY;
        }
        for (size_t k = 0; k < 2 * x->num_ranges; ++k) {
            kvf_hs_le64(bufs[i] + 8 * k, x->ranges[k]);
        }
        d[i].has_decode_rank = d[i].has_prefill_rank = d[i].has_ranges = d[i].has_digest = 1;
        d[i].decode_rank = (uint32_t)x->decode_rank;
        d[i].prefill_rank = (uint32_t)x->prefill_rank;
        d[i].ranges.data = bufs[i];
        d[i].ranges.len = 16 * x->num_ranges;
        d[i].digest = x->digest;
        pd[i] = &d[i];
    }
    l->n_digests = (size_t)lm->num_digests;
    l->digests = pd;
    return KVF_OK;
}

kvf_status_t kvf_handshake_request_pack(const kvf_handshake_request_t *req, uint8_t **buf_p,
                                        size_t *len_p)
{
    Kvf__HandshakeRequest m = KVF__HANDSHAKE_REQUEST__INIT;
    Kvf__LeaseRequest l = KVF__LEASE_REQUEST__INIT;
    int nd = req->has_lease ? req->lease.num_digests : 0;
    Kvf__KvDigest **pd = NULL, *d = NULL;
    uint8_t **bufs = NULL;
    kvf_status_t status = KVF_OK;

    m.engine_id = (char *)req->engine_id;
    m.has_protocol_version = 1;
    m.protocol_version = req->protocol_version;
    m.want_engine_id = (char *)req->want_engine_id;
    if (req->xfer_timeout_ms > 0) {
        m.has_xfer_timeout_ms = 1;
        m.xfer_timeout_ms = req->xfer_timeout_ms;
    }
    if (req->has_lease) {
        l.has_op = l.has_nonce = l.has_decode_rank = l.has_decode_tp = l.has_status = 1;
        l.op = (uint32_t)req->lease.op;
        l.request_id = (char *)req->lease.request_id;
        l.nonce = req->lease.nonce;
        l.decode_rank = (uint32_t)req->lease.decode_rank;
        l.decode_tp = (uint32_t)req->lease.decode_tp;
        l.status = req->lease.status;
        l.has_all_ranks = req->lease.all_ranks;
        l.all_ranks = req->lease.all_ranks;
        l.has_ids_digest = req->lease.has_ids_digest;
        l.ids_digest = req->lease.ids_digest;
        m.lease = &l;
        if ((nd < 0) || (nd > KVF_LEASE_MAX_DIGESTS)) {
            return KVF_ERR_INVALID_PARAM;
        }
        if (nd > 0) {
            pd = calloc((size_t)nd, sizeof(*pd));
            d = calloc((size_t)nd, sizeof(*d));
            bufs = calloc((size_t)nd, sizeof(*bufs));
            status = ((pd == NULL) || (d == NULL) || (bufs == NULL)) ? KVF_ERR_NO_MEMORY :
                     kvf_hs_pack_digests(&req->lease, &l, pd, d, bufs);
        }
    }
    if (status == KVF_OK) {
        status = kvf_hs_finish_pack(kvf__handshake_request__get_packed_size(&m), &m.base, buf_p,
                                    len_p);
    }
    for (int i = 0; (bufs != NULL) && (i < nd); ++i) {
        free(bufs[i]);
    }
    free(bufs);
    free(d);
    free(pd);
    return status;
}

void kvf_handshake_request_cleanup(kvf_handshake_request_t *req)
{
    for (int i = 0; (req->lease.digests != NULL) && (i < req->lease.num_digests); ++i) {
        free(req->lease.digests[i].ranges);
    }
    free(req->lease.digests);
    req->lease.digests = NULL;
    req->lease.num_digests = 0;
}

/* Copy a release's digests: every count and length in range. false: malformed (freed). */
static bool kvf_hs_unpack_digests(const Kvf__LeaseRequest *l, kvf_lease_msg_t *d)
{
    if (l->n_digests == 0) {
        return true;
    }
    if (l->n_digests > KVF_LEASE_MAX_DIGESTS) {
        return false;
    }
    d->digests = calloc(l->n_digests, sizeof(*d->digests));
    if (d->digests == NULL) {
        return false;
    }
    d->num_digests = (int)l->n_digests;
    for (size_t i = 0; i < l->n_digests; ++i) {
        const Kvf__KvDigest *x = l->digests[i];
        kvf_kv_digest_t *y = &d->digests[i];
        if (!x->has_decode_rank || !x->has_prefill_rank || !x->has_ranges || !x->has_digest ||
            (x->decode_rank >= KVF_XFER_MAX_TP) || (x->prefill_rank >= KVF_XFER_MAX_TP) ||
            (x->ranges.len % 16 != 0)) {
            return false;
        }
        y->decode_rank = (int)x->decode_rank;
        y->prefill_rank = (int)x->prefill_rank;
        y->digest = x->digest;
        y->num_ranges = x->ranges.len / 16;
        y->ranges = malloc(x->ranges.len + 1);
        if (y->ranges == NULL) {
            return false;
        }
        for (size_t k = 0; k < 2 * y->num_ranges; ++k) {
            y->ranges[k] = kvf_hs_get64(x->ranges.data + 8 * k);
        }
    }
    return true;
}

kvf_status_t kvf_handshake_request_unpack(const uint8_t *buf, size_t len,
                                          kvf_handshake_request_t *req_p)
{
    Kvf__HandshakeRequest *m;
    kvf_status_t status = KVF_ERR_PARSE;

    memset(req_p, 0, sizeof(*req_p));
    KVF_PB_UNPACK_CHECK(kvf__handshake_request, m, len, buf);
    if (!m->has_protocol_version ||
        !kvf_hs_copy_str(req_p->engine_id, sizeof(req_p->engine_id), m->engine_id, true) ||
        !kvf_hs_copy_str(req_p->want_engine_id, sizeof(req_p->want_engine_id),
                         m->want_engine_id, false)) {
        kvf_log(KVF_LOG_DEBUG, KVF_SUB_PROTO, "handshake request: missing or oversized field");
        goto out;
    }
    req_p->protocol_version = m->protocol_version;
    req_p->xfer_timeout_ms = m->has_xfer_timeout_ms ? m->xfer_timeout_ms : 0;
    if (m->lease != NULL) {
        const Kvf__LeaseRequest *l = m->lease;
        kvf_lease_msg_t *d = &req_p->lease;
        if (!l->has_op || ((l->op != KVF_LEASE_OP_CLAIM) && (l->op != KVF_LEASE_OP_RELEASE)) ||
            !l->has_nonce ||
            !kvf_hs_copy_str(d->request_id, sizeof(d->request_id), l->request_id, true) ||
            (d->request_id[0] == '\0')) {
            kvf_log(KVF_LOG_DEBUG, KVF_SUB_PROTO, "lease request: bad op, nonce or request id");
            goto out;
        }
        if ((l->op == KVF_LEASE_OP_RELEASE) &&
            (!l->has_decode_tp || !l->has_decode_rank || (l->decode_tp < 1) ||
             (l->decode_tp > KVF_XFER_MAX_TP) || (l->decode_rank >= l->decode_tp))) {
            kvf_log(KVF_LOG_DEBUG, KVF_SUB_PROTO, "lease release: decode rank/tp out of range");
            goto out;
        }
        d->op = (kvf_lease_op_t)l->op;
        d->nonce = l->nonce;
        d->decode_rank = (int)l->decode_rank;
        d->decode_tp = (int)l->decode_tp;
        d->status = l->has_status ? (kvf_status_t)l->status : KVF_OK;
        d->all_ranks = l->has_all_ranks && l->all_ranks;
        d->has_ids_digest = l->has_ids_digest;
        d->ids_digest = l->has_ids_digest ? l->ids_digest : 0;
        req_p->has_lease = true;
        if (!kvf_hs_unpack_digests(l, d)) {
            kvf_log(KVF_LOG_DEBUG, KVF_SUB_PROTO, "lease release: malformed KV digests");
            goto out;
        }
    }
    status = KVF_OK;
out:
    if (status != KVF_OK) {
        kvf_handshake_request_cleanup(req_p);
        memset(req_p, 0, sizeof(*req_p));
    }
    kvf__handshake_request__free_unpacked(m, NULL);
    return status;
}

uint64_t kvf_xfer_ids_digest(int32_t *const *ids, const int *num_ids, int num_groups)
{
    XXH3_state_t st;
    uint8_t w[4];

    XXH3_64bits_reset(&st);
    kvf_hs_le32(w, (uint32_t)num_groups);
    XXH3_64bits_update(&st, w, sizeof(w));
    for (int g = 0; g < num_groups; ++g) {
        kvf_hs_le32(w, (uint32_t)num_ids[g]);
        XXH3_64bits_update(&st, w, sizeof(w));
        for (int i = 0; i < num_ids[g]; ++i) {
            kvf_hs_le32(w, (uint32_t)ids[g][i]);
            XXH3_64bits_update(&st, w, sizeof(w));
        }
    }
    return XXH3_64bits_digest(&st);
}

/* ---- lease answer ------------------------------------------------------ */

kvf_status_t kvf_lease_reply_pack(const char *engine_id, const kvf_lease_answer_t *answer,
                                  uint8_t **buf_p, size_t *len_p)
{
    Kvf__HandshakeReply m = KVF__HANDSHAKE_REPLY__INIT;
    Kvf__LeaseReply l = KVF__LEASE_REPLY__INIT;

    m.has_accepted = 1;
    m.accepted = 1;
    m.engine_id = (char *)engine_id;
    l.has_verdict = l.has_ms_left = 1;
    l.verdict = (uint32_t)answer->verdict;
    l.ms_left = answer->ms_left;
    l.why = (char *)answer->why;
    m.lease = &l;
    return kvf_hs_finish_pack(kvf__handshake_reply__get_packed_size(&m), &m.base, buf_p, len_p);
}

kvf_status_t kvf_lease_reply_unpack(const uint8_t *buf, size_t len, char *engine_id_p,
                                    kvf_lease_answer_t *answer_p)
{
    Kvf__HandshakeReply *m = kvf__handshake_reply__unpack(NULL, len, buf);
    kvf_status_t status = KVF_ERR_PARSE;

    memset(answer_p, 0, sizeof(*answer_p));
    engine_id_p[0] = '\0';
    if (m == NULL) {
        kvf_log(KVF_LOG_DEBUG, KVF_SUB_PROTO, "lease reply: not a valid message (%zu bytes)", len);
        return KVF_ERR_PARSE;
    }
    if ((m->lease == NULL) || !m->lease->has_verdict || (m->lease->verdict > KVF_LEASE_CORRUPT) ||
        (m->n_ranks != 0) ||
        !kvf_hs_copy_str(engine_id_p, KVF_ENGINE_ID_MAX, m->engine_id, true) ||
        !kvf_hs_copy_str(answer_p->why, sizeof(answer_p->why), m->lease->why, false)) {
        kvf_log(KVF_LOG_DEBUG, KVF_SUB_PROTO, "lease reply: missing or out-of-range field");
        memset(answer_p, 0, sizeof(*answer_p));
        engine_id_p[0] = '\0';
        goto out;
    }
    answer_p->verdict = (kvf_lease_verdict_t)m->lease->verdict;
    answer_p->ms_left = m->lease->has_ms_left ? m->lease->ms_left : 0;
    status = KVF_OK;
out:
    kvf__handshake_reply__free_unpacked(m, NULL);
    return status;
}

/* ---- reply ------------------------------------------------------------ */

/* An XferIpc pointing into @a m (no copies). */
static void kvf_hs_pack_ipc(const kvf_xfer_ipc_meta_t *m, Kvf__XferIpc *x)
{
    kvf__xfer_ipc__init(x);
    x->has_handle = x->has_offset = x->has_device_uuid = 1;
    x->handle.data = (uint8_t *)m->handle;
    x->handle.len = sizeof(m->handle);
    x->offset = m->offset;
    x->node = (char *)m->node;
    x->device_uuid.data = (uint8_t *)m->uuid;
    x->device_uuid.len = sizeof(m->uuid);
}

/*
 * Check and copy an XferIpc: all four fields, a 64-byte handle, a 16-byte
 * UUID, a printable node id. false with @a why naming the field and value.
 */
static bool kvf_hs_ipc_from_proto(const Kvf__XferIpc *x, kvf_xfer_ipc_meta_t *m, char *why,
                                  size_t why_len)
{
    size_t n;

    if (!x->has_handle || (x->handle.len != KVF_XFER_IPC_HANDLE_BYTES)) {
        snprintf(why, why_len, "ipc.handle is %zu bytes, not %d", x->has_handle ?
                 x->handle.len : (size_t)0, KVF_XFER_IPC_HANDLE_BYTES);
        return false;
    }
    if (!x->has_device_uuid || (x->device_uuid.len != KVF_XFER_IPC_UUID_BYTES)) {
        snprintf(why, why_len, "ipc.device_uuid is %zu bytes, not %d", x->has_device_uuid ?
                 x->device_uuid.len : (size_t)0, KVF_XFER_IPC_UUID_BYTES);
        return false;
    }
    if (!x->has_offset || (x->offset > (1ull << 48))) {
        snprintf(why, why_len, "ipc.offset missing or past 2^48");
        return false;
    }
    n = (x->node != NULL) ? strlen(x->node) : 0;
    if ((n == 0) || (n >= sizeof(m->node))) {
        snprintf(why, why_len, "ipc.node is %zu characters, not 1..%zu", n,
                 sizeof(m->node) - 1);
        return false;
    }
    for (size_t i = 0; i < n; ++i) {
        if (((unsigned char)x->node[i] <= 0x20) || ((unsigned char)x->node[i] >= 0x7f)) {
            snprintf(why, why_len, "ipc.node has byte 0x%02x at %zu (printable only)",
                     (unsigned char)x->node[i], i);
            return false;
        }
    }
    memcpy(m->handle, x->handle.data, KVF_XFER_IPC_HANDLE_BYTES);
    memcpy(m->uuid, x->device_uuid.data, KVF_XFER_IPC_UUID_BYTES);
    memcpy(m->node, x->node, n + 1);
    m->offset = x->offset;
    return true;
}

kvf_status_t kvf_handshake_reply_pack(const kvf_handshake_reply_t *reply, uint8_t **buf_p,
                                      size_t *len_p)
{
    Kvf__HandshakeReply m = KVF__HANDSHAKE_REPLY__INIT;
    Kvf__RankMetadata *metas = NULL, **meta_ptrs = NULL;
    Kvf__XferRegion *regions = NULL, **region_ptrs = NULL;
    Kvf__XferIpc *ipcs = NULL;
    Kvf__Refusal refs[KVF_MAX_REFUSALS], *ref_ptrs[KVF_MAX_REFUSALS];
    kvf_status_t status = KVF_ERR_NO_MEMORY;
    int n = reply->num_ranks;

    if ((n < 0) || (n > KVF_XFER_MAX_TP) || (reply->num_refusals < 0) ||
        (reply->num_refusals > KVF_MAX_REFUSALS)) {
        return KVF_ERR_INVALID_PARAM;
    }
    metas = calloc((size_t)n + 1, sizeof(*metas));
    meta_ptrs = calloc((size_t)n + 1, sizeof(*meta_ptrs));
    regions = calloc((size_t)n * KVF_XFER_MAX_REGIONS + 1, sizeof(*regions));
    region_ptrs = calloc((size_t)n * KVF_XFER_MAX_REGIONS + 1, sizeof(*region_ptrs));
    ipcs = calloc((size_t)n * KVF_XFER_MAX_REGIONS + 1, sizeof(*ipcs));
    if ((metas == NULL) || (meta_ptrs == NULL) || (regions == NULL) || (region_ptrs == NULL) ||
        (ipcs == NULL)) {
        goto out;
    }

    m.has_accepted = 1;
    m.accepted = reply->accepted;
    m.engine_id = (char *)reply->engine_id;
    m.error = (char *)reply->error;
    for (int i = 0; i < n; ++i) {
        const kvf_rank_meta_t *r = &reply->ranks[i];
        Kvf__RankMetadata *p = &metas[i];

        if ((r->num_regions < 0) || (r->num_regions > KVF_XFER_MAX_REGIONS)) {
            status = KVF_ERR_INVALID_PARAM;
            goto out;
        }
        kvf__rank_metadata__init(p);
        p->engine_id = (char *)r->engine_id;
        p->has_protocol_version = 1; p->protocol_version = r->protocol_version;
        p->has_model_fingerprint = 1; p->model_fingerprint = r->model_fingerprint;
        p->has_tp_rank = 1; p->tp_rank = (uint32_t)r->tp_rank;
        p->has_tp_size = 1; p->tp_size = (uint32_t)r->tp_size;
        p->has_block_size = 1; p->block_size = (uint32_t)r->block_size;
        p->has_kernel_block_size = 1; p->kernel_block_size = (uint32_t)r->kernel_block_size;
        p->has_page_size = 1; p->page_size = r->page_size;
        p->has_slots = 1; p->slots = (uint32_t)r->slots;
        p->has_num_blocks = 1; p->num_blocks = (uint64_t)r->num_blocks;
        p->has_kv_dtype = 1; p->kv_dtype = (uint32_t)r->kv_dtype;
        p->has_conv_dtype = 1; p->conv_dtype = (uint32_t)r->conv_dtype;
        p->has_ssm_dtype = 1; p->ssm_dtype = (uint32_t)r->ssm_dtype;
        p->has_user_block_size = 1; p->user_block_size = (uint32_t)r->user_block_size;
        p->has_align_mode = 1; p->align_mode = (uint32_t)r->align;
        p->layout_tag = (char *)r->layout_tag;
        p->n_regions = (size_t)r->num_regions;
        p->regions = &region_ptrs[i * KVF_XFER_MAX_REGIONS];
        for (int j = 0; j < r->num_regions; ++j) {
            Kvf__XferRegion *x = &regions[i * KVF_XFER_MAX_REGIONS + j];
            kvf__xfer_region__init(x);
            x->has_addr = 1; x->addr = r->regions[j].addr;
            x->has_length = 1; x->length = r->regions[j].length;
            x->has_rkey = 1;
            x->rkey.len = r->regions[j].rkey_len;
            x->rkey.data = (uint8_t *)r->regions[j].rkey;
            /* host stays unsaid: the bytes of a host pool's metadata are unchanged */
            x->has_memory_type = (r->regions[j].mem_type != KVF_XFER_MEM_HOST);
            x->memory_type = (uint32_t)r->regions[j].mem_type;
            if (r->regions[j].has_ipc) {
                kvf_hs_pack_ipc(&r->regions[j].ipc, &ipcs[i * KVF_XFER_MAX_REGIONS + j]);
                x->ipc = &ipcs[i * KVF_XFER_MAX_REGIONS + j];
            }
            p->regions[j] = x;
        }
        p->has_worker_address = 1;
        p->worker_address.len = r->worker_addr_len;
        p->worker_address.data = (uint8_t *)r->worker_addr;
        p->has_incarnation = (r->incarnation != 0);
        p->incarnation = r->incarnation;
        p->model_digest = (r->model_digest[0] != '\0') ? (char *)r->model_digest : NULL;
        p->model_path = (r->model_digest[0] != '\0') ? (char *)r->model_path : NULL;
        p->has_kv_layout = (r->kv_layout != KVF_KV_LAYER_MAJOR);   /* unsaid: layer-major */
        p->kv_layout = (uint32_t)r->kv_layout;
        p->has_sliding_window = (r->sliding_window > 0);   /* unsaid without a window */
        p->sliding_window = (uint32_t)r->sliding_window;
        p->has_sliding_layers = (r->sliding_layers_len > 0);
        p->sliding_layers.len = (size_t)r->sliding_layers_len;
        p->sliding_layers.data = (uint8_t *)r->sliding_layers;
        meta_ptrs[i] = p;
    }
    m.n_ranks = (size_t)n;
    m.ranks = meta_ptrs;
    for (int i = 0; i < reply->num_refusals; ++i) {
        kvf__refusal__init(&refs[i]);
        refs[i].field = (char *)reply->refusals[i].field;
        refs[i].local = (char *)reply->refusals[i].local;
        refs[i].remote = (char *)reply->refusals[i].remote;
        refs[i].why = (char *)reply->refusals[i].why;
        ref_ptrs[i] = &refs[i];
    }
    m.n_refusals = (size_t)reply->num_refusals;
    m.refusals = ref_ptrs;

    status = kvf_hs_finish_pack(kvf__handshake_reply__get_packed_size(&m), &m.base, buf_p, len_p);
out:
    free(ipcs);
    free(region_ptrs);
    free(regions);
    free(meta_ptrs);
    free(metas);
    return status;
}

/* The model digest and folder: "" or 32 lowercase hex digits; a path without control bytes. */
static bool kvf_hs_model_from_proto(const Kvf__RankMetadata *p, kvf_rank_meta_t *r)
{
    size_t n;

    if (!kvf_hs_copy_str(r->model_digest, sizeof(r->model_digest), p->model_digest, false) ||
        !kvf_hs_copy_str(r->model_path, sizeof(r->model_path), p->model_path, false)) {
        return false;
    }
    n = strlen(r->model_digest);
    if ((n != 0) && (n != KVF_MODEL_DIGEST_HEX)) {
        return false;
    }
    for (size_t i = 0; i < n; ++i) {
        char c = r->model_digest[i];
        if (!(((c >= '0') && (c <= '9')) || ((c >= 'a') && (c <= 'f')))) {
            return false;
        }
    }
    for (const char *c = r->model_path; *c != '\0'; ++c) {
        if ((unsigned char)*c < 0x20 || (*c == 0x7f)) {
            return false;               /* it is printed in logs and refusals */
        }
    }
    return true;
}

/* Validate one rank's metadata and copy it into @a r; @a why: a reason for some refusals. */
static bool kvf_hs_rank_from_proto(const Kvf__RankMetadata *p, kvf_rank_meta_t *r, char *why,
                                   size_t why_len)
{
    char bad[64];

    if (!p->has_protocol_version || !p->has_model_fingerprint || !p->has_tp_rank ||
        !p->has_tp_size || !p->has_block_size || !p->has_kernel_block_size ||
        !p->has_page_size || !p->has_slots || !p->has_num_blocks || !p->has_kv_dtype ||
        !p->has_conv_dtype || !p->has_ssm_dtype || !p->has_worker_address) {
        return false;
    }
    if ((p->tp_size < 1) || (p->tp_size > KVF_XFER_MAX_TP) || (p->tp_rank >= p->tp_size) ||
        (p->block_size < 1) || (p->block_size > (1u << 24)) || (p->kernel_block_size < 1) ||
        (p->kernel_block_size > p->block_size) || (p->page_size < 1) ||
        (p->page_size > (1ull << 40)) || (p->slots < 1) || (p->slots > KVF_MAX_SLOTS) ||
        (p->num_blocks < 1) || (p->num_blocks > (1ull << 40)) ||
        (p->kv_dtype >= KVF_DTYPE_COUNT) || (p->conv_dtype >= KVF_DTYPE_COUNT) ||
        (p->ssm_dtype >= KVF_DTYPE_COUNT) || (p->user_block_size > (1u << 24)) ||
        (p->align_mode > KVF_ALIGN_PER_RANK) || (p->n_regions > KVF_XFER_MAX_REGIONS) ||
        (p->worker_address.len < 1) || (p->worker_address.len > KVF_WORKER_ADDR_MAX)) {
        return false;
    }
    if (!kvf_hs_copy_str(r->engine_id, sizeof(r->engine_id), p->engine_id, true) ||
        !kvf_hs_copy_str(r->layout_tag, sizeof(r->layout_tag), p->layout_tag, true)) {
        return false;
    }
    r->protocol_version = p->protocol_version;
    r->model_fingerprint = p->model_fingerprint;
    r->tp_rank = (int)p->tp_rank;
    r->tp_size = (int)p->tp_size;
    r->block_size = (int)p->block_size;
    r->kernel_block_size = (int)p->kernel_block_size;
    r->page_size = p->page_size;
    r->slots = (int)p->slots;
    r->num_blocks = (int64_t)p->num_blocks;
    r->kv_dtype = (kvf_dtype_t)p->kv_dtype;
    r->conv_dtype = (kvf_dtype_t)p->conv_dtype;
    r->ssm_dtype = (kvf_dtype_t)p->ssm_dtype;
    r->user_block_size = (int)p->user_block_size;
    r->align = (kvf_align_mode_t)p->align_mode;
    r->num_regions = (int)p->n_regions;
    for (size_t j = 0; j < p->n_regions; ++j) {
        const Kvf__XferRegion *x = p->regions[j];
        if (!x->has_addr || !x->has_length || !x->has_rkey || (x->rkey.len < 1) ||
            (x->rkey.len > KVF_RKEY_MAX) || (x->length < 1) ||
            (x->addr + x->length < x->addr)) {
            return false;
        }
        if (x->has_memory_type && (x->memory_type >= KVF_XFER_MEM_TYPES)) {
            kvf_log(KVF_LOG_DEBUG, KVF_SUB_PROTO, "handshake reply: rank %u regions[%zu]."
                    "memory_type %u is not one of host (0), cuda (1)", p->tp_rank, j,
                    x->memory_type);
            return false;
        }
        r->regions[j].addr = x->addr;
        r->regions[j].length = x->length;
        r->regions[j].mem_type = x->has_memory_type ? (kvf_xfer_mem_type_t)x->memory_type :
                                 KVF_XFER_MEM_HOST;
        r->regions[j].rkey_len = x->rkey.len;
        memcpy(r->regions[j].rkey, x->rkey.data, x->rkey.len);
        r->regions[j].has_ipc = (x->ipc != NULL);
        if ((x->ipc != NULL) && !kvf_hs_ipc_from_proto(x->ipc, &r->regions[j].ipc, bad,
                                                       sizeof(bad))) {
            snprintf(why, why_len, "rank %u regions[%zu].%s", p->tp_rank, j, bad);
            return false;
        }
    }
    r->worker_addr_len = p->worker_address.len;
    memcpy(r->worker_addr, p->worker_address.data, p->worker_address.len);
    r->incarnation = p->has_incarnation ? p->incarnation : 0;
    if ((p->has_sliding_window && (p->sliding_window > (1u << 30))) ||
        (p->has_sliding_layers && (p->sliding_layers.len > sizeof(r->sliding_layers)))) {
        snprintf(why, why_len, "rank %u sliding_window %u or sliding_layers of %zu bytes out"
                 " of range (at most %u and %zu)", p->tp_rank, p->sliding_window,
                 p->has_sliding_layers ? p->sliding_layers.len : 0, 1u << 30,
                 sizeof(r->sliding_layers));
        return false;
    }
    if (p->has_kv_layout && (p->kv_layout >= KVF_KV_LAYOUT_COUNT)) {
        snprintf(why, why_len, "rank %u kv_layout %u is not a KV cache layout (0 layer-major,"
                 " 1 head-major)", p->tp_rank, p->kv_layout);
        return false;
    }
    r->kv_layout = p->has_kv_layout ? (kvf_kv_layout_t)p->kv_layout : KVF_KV_LAYER_MAJOR;
    r->sliding_window = p->has_sliding_window ? (int)p->sliding_window : 0;
    r->sliding_layers_len = p->has_sliding_layers ? (int)p->sliding_layers.len : 0;
    memset(r->sliding_layers, 0, sizeof(r->sliding_layers));
    if (r->sliding_layers_len > 0) {
        memcpy(r->sliding_layers, p->sliding_layers.data, p->sliding_layers.len);
    }
    return kvf_hs_model_from_proto(p, r);
}

kvf_status_t kvf_handshake_reply_unpack(const uint8_t *buf, size_t len,
                                        kvf_handshake_reply_t *reply_p)
{
    Kvf__HandshakeReply *m;
    kvf_handshake_reply_t reply;
    kvf_status_t status = KVF_ERR_PARSE;
    const char *why = "missing or out-of-range field";
    char field[128], why_buf[192];

    memset(reply_p, 0, sizeof(*reply_p));
    memset(&reply, 0, sizeof(reply));
    KVF_PB_UNPACK_CHECK(kvf__handshake_reply, m, len, buf);
    if (!m->has_accepted || (m->n_ranks > KVF_XFER_MAX_TP) ||
        (m->n_refusals > KVF_MAX_REFUSALS) ||
        !kvf_hs_copy_str(reply.engine_id, sizeof(reply.engine_id), m->engine_id, false) ||
        !kvf_hs_copy_str(reply.error, sizeof(reply.error), m->error, false)) {
        goto out_free;
    }
    reply.accepted = m->accepted;
    for (size_t i = 0; i < m->n_refusals; ++i) {
        const Kvf__Refusal *f = m->refusals[i];
        kvf_refusal_t *r = &reply.refusals[i];
        if (!kvf_hs_copy_str(r->field, sizeof(r->field), f->field, true) ||
            !kvf_hs_copy_str(r->local, sizeof(r->local), f->local, false) ||
            !kvf_hs_copy_str(r->remote, sizeof(r->remote), f->remote, false) ||
            !kvf_hs_copy_str(r->why, sizeof(r->why), f->why, false)) {
            goto out_free;
        }
    }
    reply.num_refusals = (int)m->n_refusals;
    if (m->n_ranks > 0) {
        reply.ranks = calloc(m->n_ranks, sizeof(*reply.ranks));
        if (reply.ranks == NULL) {
            status = KVF_ERR_NO_MEMORY;
            goto out_free;
        }
        for (size_t i = 0; i < m->n_ranks; ++i) {
            kvf_rank_meta_t tmp_rank;
            /* heap buffer would do too; one rank on the stack is ~17 KiB */
            field[0] = '\0';
            if (!kvf_hs_rank_from_proto(m->ranks[i], &tmp_rank, field, sizeof(field))) {
                snprintf(why_buf, sizeof(why_buf), "rank metadata missing or out-of-range "
                         "field%s%s", (field[0] != '\0') ? ": " : "", field);
                why = why_buf;
                goto out_free;
            }
            /* ranks must be exactly 0..n-1 of one tp_size */
            if (((size_t)tmp_rank.tp_size != m->n_ranks) ||
                (reply.ranks[tmp_rank.tp_rank].tp_size != 0)) {
                why = "rank list does not cover 0..tp_size-1 exactly once";
                goto out_free;
            }
            reply.ranks[tmp_rank.tp_rank] = tmp_rank;
        }
    }
    reply.num_ranks = (int)m->n_ranks;
    if (reply.accepted && (reply.num_ranks == 0)) {
        why = "accepted reply without rank metadata";
        goto out_free;
    }
    kvf__handshake_reply__free_unpacked(m, NULL);
    *reply_p = reply;
    return KVF_OK;

out_free:
    free(reply.ranks);
    kvf__handshake_reply__free_unpacked(m, NULL);
    kvf_log(KVF_LOG_DEBUG, KVF_SUB_PROTO, "handshake reply rejected (%zu bytes): %s", len, why);
    return status;
}

void kvf_handshake_reply_cleanup(kvf_handshake_reply_t *reply)
{
    free(reply->ranks);
    memset(reply, 0, sizeof(*reply));
}

/* ---- notification ----------------------------------------------------- */

kvf_status_t kvf_xfer_notification_pack(const kvf_xfer_notification_t *n, uint8_t **buf_p,
                                        size_t *len_p)
{
    Kvf__TransferNotification m = KVF__TRANSFER_NOTIFICATION__INIT;

    m.request_id = (char *)n->request_id;
    m.has_rank = 1;
    m.rank = (uint32_t)n->rank;
    m.has_status = 1;
    m.status = (int32_t)n->status;
    m.engine_id = (char *)n->engine_id;
    return kvf_hs_finish_pack(kvf__transfer_notification__get_packed_size(&m), &m.base, buf_p,
                              len_p);
}

kvf_status_t kvf_xfer_notification_unpack(const uint8_t *buf, size_t len,
                                          kvf_xfer_notification_t *n_p)
{
    Kvf__TransferNotification *m;
    kvf_status_t status = KVF_ERR_PARSE;

    memset(n_p, 0, sizeof(*n_p));
    KVF_PB_UNPACK_CHECK(kvf__transfer_notification, m, len, buf);
    if (m->has_rank && m->has_status && (m->rank < KVF_XFER_MAX_TP) &&
        kvf_hs_copy_str(n_p->request_id, sizeof(n_p->request_id), m->request_id, true) &&
        kvf_hs_copy_str(n_p->engine_id, sizeof(n_p->engine_id), m->engine_id, false)) {
        n_p->rank = (int)m->rank;
        n_p->status = (kvf_status_t)m->status;
        status = KVF_OK;
    }
    kvf__transfer_notification__free_unpacked(m, NULL);
    return status;
}

/* ---- transfer params -------------------------------------------------- */

kvf_status_t kvf_xfer_params_msg_pack(const kvf_xfer_params_msg_t *p, uint8_t **buf_p,
                                      size_t *len_p)
{
    Kvf__TransferParams m = KVF__TRANSFER_PARAMS__INIT;
    Kvf__BlockIdList lists[KVF_MAX_KV_GROUPS], *list_ptrs[KVF_MAX_KV_GROUPS];

    if ((p->num_groups < 0) || (p->num_groups > KVF_MAX_KV_GROUPS)) {
        return KVF_ERR_INVALID_PARAM;
    }
    m.engine_id = (char *)p->engine_id;
    m.host = (char *)p->host;
    m.has_port = 1; m.port = (uint32_t)p->port;
    m.has_num_tokens = 1; m.num_tokens = (uint64_t)p->num_tokens;
    m.has_lease_expiry_ms = p->has_lease_expiry; m.lease_expiry_ms = p->lease_expiry_ms;
    m.has_first_token = 1; m.first_token = p->first_token;
    m.request_id = (char *)p->request_id;
    m.has_incarnation = p->has_incarnation; m.incarnation = p->incarnation;
    m.has_lease_ms_left = m.has_nonce = p->has_lease;
    m.lease_ms_left = p->lease_ms_left;
    m.nonce = p->nonce;
    m.has_prefix_source = (p->prefix_source != 0);
    m.prefix_source = p->prefix_source;
    for (int g = 0; g < p->num_groups; ++g) {
        kvf__block_id_list__init(&lists[g]);
        lists[g].n_ids = (size_t)p->num_ids[g];
        lists[g].ids = (int32_t *)p->ids[g];
        list_ptrs[g] = &lists[g];
    }
    m.n_groups = (size_t)p->num_groups;
    m.groups = list_ptrs;
    return kvf_hs_finish_pack(kvf__transfer_params__get_packed_size(&m), &m.base, buf_p, len_p);
}

#define KVF_XP_FAIL(...)                            \
    do {                                            \
        if (err_len > 0) {                          \
            snprintf(err, err_len, __VA_ARGS__);    \
        }                                           \
        status = KVF_ERR_PARSE;                     \
        goto err;                                   \
    } while (0)

kvf_status_t kvf_xfer_params_decode(const Kvf__TransferParams *m, int64_t expect_tokens,
                                    kvf_xfer_params_msg_t *p_p, char *err, size_t err_len)
{
    kvf_xfer_params_msg_t p;
    kvf_status_t status;

    if (err == NULL) {
        err_len = 0;
    }
    memset(&p, 0, sizeof(p));
    if ((m == NULL) || (m->engine_id == NULL) || (m->engine_id[0] == '\0') ||
        (m->host == NULL) || (m->host[0] == '\0')) {
        KVF_XP_FAIL("decode request needs transfer params naming the prefill engine"
                    " (engine_id and host)");
    }
    if (!kvf_hs_copy_str(p.engine_id, sizeof(p.engine_id), m->engine_id, true)) {
        KVF_XP_FAIL("transfer params: engine_id is longer than %d bytes", KVF_ENGINE_ID_MAX - 1);
    }
    if (!kvf_hs_copy_str(p.host, sizeof(p.host), m->host, true)) {
        KVF_XP_FAIL("transfer params: host is longer than %zu bytes", sizeof(p.host) - 1);
    }
    if (!m->has_port || (m->port < 1) || (m->port > 65535)) {
        KVF_XP_FAIL("transfer params: side-channel port %u is not in 1..65535", m->port);
    }
    if (!m->has_first_token) {
        KVF_XP_FAIL("transfer params carry no first token");
    }
    if (!m->has_num_tokens || (m->num_tokens < 1) || (m->num_tokens > (1ull << 40))) {
        KVF_XP_FAIL("transfer params: num_tokens %llu is not in 1..2^40",
                    (unsigned long long)m->num_tokens);
    }
    if ((expect_tokens > 0) && (m->num_tokens != (uint64_t)expect_tokens)) {
        KVF_XP_FAIL("transfer params cover %llu tokens, the prompt has %lld",
                    (unsigned long long)m->num_tokens, (long long)expect_tokens);
    }
    if ((m->n_groups == 0) || (m->n_groups > KVF_MAX_KV_GROUPS)) {
        KVF_XP_FAIL("transfer params carry %zu KV cache groups (1..%d)", m->n_groups,
                    KVF_MAX_KV_GROUPS);
    }
    if (!kvf_hs_copy_str(p.request_id, sizeof(p.request_id), m->request_id, false)) {
        KVF_XP_FAIL("transfer params: request_id is longer than %d bytes",
                    KVF_ENGINE_ID_MAX - 1);
    }
    for (size_t g = 0; g < m->n_groups; ++g) {
        const Kvf__BlockIdList *l = m->groups[g];
        if ((l == NULL) || (l->n_ids > KVF_XFER_MAX_IDS_PER_GROUP)) {
            KVF_XP_FAIL("transfer params: group %zu has more than %d block ids", g,
                        KVF_XFER_MAX_IDS_PER_GROUP);
        }
        for (size_t i = 0; i < l->n_ids; ++i) {
            if (l->ids[i] < 0) {
                KVF_XP_FAIL("transfer params: group %zu block id %d (index %zu) is negative", g,
                            l->ids[i], i);
            }
        }
        p.ids[g] = malloc((l->n_ids ? l->n_ids : 1) * sizeof(int32_t));
        if (p.ids[g] == NULL) {
            status = KVF_ERR_NO_MEMORY;
            goto err;
        }
        p.num_groups = (int)g + 1;
        if (l->n_ids > 0) {   /* an empty group's ids are NULL: no memcpy from NULL */
            memcpy(p.ids[g], l->ids, l->n_ids * sizeof(int32_t));
        }
        p.num_ids[g] = (int)l->n_ids;
    }
    p.port = (int)m->port;
    p.num_tokens = (int64_t)m->num_tokens;
    p.has_lease_expiry = m->has_lease_expiry_ms;
    p.lease_expiry_ms = m->has_lease_expiry_ms ? m->lease_expiry_ms : 0;
    p.first_token = m->first_token;
    p.has_incarnation = m->has_incarnation;
    p.incarnation = m->has_incarnation ? m->incarnation : 0;
    p.has_lease = m->has_lease_ms_left && m->has_nonce;
    p.lease_ms_left = p.has_lease ? m->lease_ms_left : 0;
    p.nonce = p.has_lease ? m->nonce : 0;
    p.prefix_source = m->has_prefix_source ? m->prefix_source : 0;
    *p_p = p;
    return KVF_OK;

err:
    kvf_xfer_params_msg_cleanup(&p);
    return status;
}

#undef KVF_XP_FAIL

kvf_status_t kvf_xfer_params_msg_unpack(const uint8_t *buf, size_t len,
                                        kvf_xfer_params_msg_t *p_p)
{
    Kvf__TransferParams *m = kvf__transfer_params__unpack(NULL, len, buf);
    char why[160];
    kvf_status_t status;

    memset(p_p, 0, sizeof(*p_p));
    if (m == NULL) {
        return KVF_ERR_PARSE;
    }
    status = kvf_xfer_params_decode(m, 0, p_p, why, sizeof(why));
    if (status != KVF_OK) {
        kvf_log(KVF_LOG_DEBUG, KVF_SUB_PROTO, "%s", why);
    }
    kvf__transfer_params__free_unpacked(m, NULL);
    return status;
}

void kvf_xfer_params_msg_cleanup(kvf_xfer_params_msg_t *p)
{
    for (int g = 0; g < p->num_groups; ++g) {
        free(p->ids[g]);
    }
    memset(p, 0, sizeof(*p));
}
