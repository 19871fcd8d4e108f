/*
 * The same-node path's pieces below the connector: XferIpc on the wire
 * (kvf_handshake.c) and the gather's CPU twin (kernels/kvf_gather.c).
 * Checks: a region's share survives pack/unpack field for field and a
 * region without one unpacks as before (older peers); a reply whose share
 * is forged or short (handle not 64 bytes, UUID not 16, node empty, too long
 * or not printable, no offset) is refused at unpack, and the debug line
 * names the field and value; the gather's ops cut at 128 KiB and its CPU
 * execution equal memcpy/memset of the ranges at every alignment.
 */
#include "kvf_gather.h"
#include "kvf_handshake.h"
#include "kvf_xfer.pb-c.h"

#include "kvf_log.h"

#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

static void meta_fill(kvf_rank_meta_t *m, bool ipc)
{
    memset(m, 0, sizeof(*m));
    snprintf(m->engine_id, sizeof(m->engine_id), "prefill-a");
    m->protocol_version = KVF_XFER_PROTOCOL_VERSION;
    m->tp_size = 1;
    m->block_size = m->kernel_block_size = 16;
    m->page_size = 4096;
    m->slots = 1;
    m->num_blocks = 8;
    m->kv_dtype = m->conv_dtype = m->ssm_dtype = KVF_DTYPE_BF16;
    snprintf(m->layout_tag, sizeof(m->layout_tag), "HND");
    m->num_regions = 1;
    m->regions[0].addr = 0x7f0000000000ull;
    m->regions[0].length = 8 * 4096;
    m->regions[0].mem_type = KVF_XFER_MEM_CUDA;
    m->regions[0].rkey_len = 17;
    memset(m->regions[0].rkey, 0xa0, 17);
    m->worker_addr_len = 33;
    memset(m->worker_addr, 0x30, 33);
    if (ipc) {
        m->regions[0].has_ipc = true;
        for (int i = 0; i < KVF_XFER_IPC_HANDLE_BYTES; ++i) {
            m->regions[0].ipc.handle[i] = (uint8_t)(i * 3 + 1);
        }
        for (int i = 0; i < KVF_XFER_IPC_UUID_BYTES; ++i) {
            m->regions[0].ipc.uuid[i] = (uint8_t)(0xf0 - i);
        }
        m->regions[0].ipc.offset = 512;
        snprintf(m->regions[0].ipc.node, sizeof(m->regions[0].ipc.node),
                 "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0");
    }
}

static void pack(bool ipc, uint8_t **buf_p, size_t *len_p)
{
    kvf_handshake_reply_t reply;
    kvf_rank_meta_t m;

    meta_fill(&m, ipc);
    memset(&reply, 0, sizeof(reply));
    reply.accepted = true;
    snprintf(reply.engine_id, sizeof(reply.engine_id), "prefill-a");
    reply.num_ranks = 1;
    reply.ranks = &m;
    assert_int_equal(kvf_handshake_reply_pack(&reply, buf_p, len_p), KVF_OK);
}

static void test_ipc_round_trip(void **state)
{
    kvf_handshake_reply_t out;
    kvf_rank_meta_t want;
    uint8_t *buf;
    size_t len;

    (void)state;
    pack(true, &buf, &len);
    assert_int_equal(kvf_handshake_reply_unpack(buf, len, &out), KVF_OK);
    meta_fill(&want, true);
    assert_true(out.ranks[0].regions[0].has_ipc);
    assert_memory_equal(out.ranks[0].regions[0].ipc.handle, want.regions[0].ipc.handle, 64);
    assert_memory_equal(out.ranks[0].regions[0].ipc.uuid, want.regions[0].ipc.uuid, 16);
    assert_int_equal(out.ranks[0].regions[0].ipc.offset, 512);
    assert_string_equal(out.ranks[0].regions[0].ipc.node,
                        "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0");
    kvf_handshake_reply_cleanup(&out);
    free(buf);
    /* a peer that shares nothing (host pools, older builds): no share, as before */
    pack(false, &buf, &len);
    assert_int_equal(kvf_handshake_reply_unpack(buf, len, &out), KVF_OK);
    assert_false(out.ranks[0].regions[0].has_ipc);
    kvf_handshake_reply_cleanup(&out);
    free(buf);
}

/* Unpack @a buf with stderr captured; the debug line must contain @a expect. */
static void expect_refused(const uint8_t *buf, size_t len, const char *expect)
{
    char path[] = "/tmp/kvf-ipc-meta-XXXXXX", text[4096];
    kvf_handshake_reply_t out;
    int fd = mkstemp(path), saved = dup(STDERR_FILENO);
    ssize_t n;
    kvf_status_t s;

    assert_true((fd >= 0) && (saved >= 0));
    kvf_log_set_level(KVF_LOG_DEBUG);
    dup2(fd, STDERR_FILENO);
    s = kvf_handshake_reply_unpack(buf, len, &out);
    dup2(saved, STDERR_FILENO);
    close(saved);
    kvf_log_set_level(KVF_LOG_WARN);
    n = pread(fd, text, sizeof(text) - 1, 0);
    close(fd);
    unlink(path);
    text[(n > 0) ? n : 0] = '\0';
    print_message("%s -> %s: %s", expect, kvf_status_str(s), text);
    assert_int_equal(s, KVF_ERR_PARSE);
    assert_non_null(strstr(text, expect));
}

/* The valid reply with its XferIpc altered by @a forge, repacked with protobuf-c. */
static void forged(void (*forge)(Kvf__XferIpc *x), const char *expect)
{
    uint8_t *buf, *out;
    size_t len, olen;
    Kvf__HandshakeReply *m;

    pack(true, &buf, &len);
    m = kvf__handshake_reply__unpack(NULL, len, buf);
    assert_non_null(m);
    assert_non_null(m->ranks[0]->regions[0]->ipc);
    forge(m->ranks[0]->regions[0]->ipc);
    olen = kvf__handshake_reply__get_packed_size(m);
    out = malloc(olen);
    assert_non_null(out);
    assert_int_equal(kvf__handshake_reply__pack(m, out), olen);
    expect_refused(out, olen, expect);
    kvf__handshake_reply__free_unpacked(m, NULL);
    free(out);
    free(buf);
}

static void short_handle(Kvf__XferIpc *x) { x->handle.len = 12; }
static void long_handle(Kvf__XferIpc *x) { x->handle.len = 64; x->has_handle = 0; }
static void short_uuid(Kvf__XferIpc *x) { x->device_uuid.len = 15; }
static void no_offset(Kvf__XferIpc *x) { x->has_offset = 0; }
static void empty_node(Kvf__XferIpc *x) { x->node[0] = '\0'; }
static void ctl_node(Kvf__XferIpc *x) { x->node[3] = '\n'; }

static void test_ipc_forged_refused(void **state)
{
    static uint8_t big[65];

    (void)state;
    forged(short_handle, "rank 0 regions[0].ipc.handle is 12 bytes, not 64");
    forged(long_handle, "ipc.handle is 0 bytes, not 64");
    forged(short_uuid, "ipc.device_uuid is 15 bytes, not 16");
    forged(no_offset, "ipc.offset missing");
    forged(empty_node, "ipc.node is 0 characters, not 1..63");
    forged(ctl_node, "ipc.node has byte 0x0a at 3");
    {   /* a 65-byte handle */
        uint8_t *buf, *out;
        size_t len, olen;
        Kvf__HandshakeReply *m;
        pack(true, &buf, &len);
        m = kvf__handshake_reply__unpack(NULL, len, buf);
        assert_non_null(m);
        uint8_t *own = m->ranks[0]->regions[0]->ipc->handle.data;
        memcpy(big, own, 64);
        m->ranks[0]->regions[0]->ipc->handle.data = big;
        m->ranks[0]->regions[0]->ipc->handle.len = 65;
        olen = kvf__handshake_reply__get_packed_size(m);
        out = malloc(olen);
        assert_non_null(out);
        kvf__handshake_reply__pack(m, out);
        m->ranks[0]->regions[0]->ipc->handle.data = own;   /* protobuf-c frees its own */
        m->ranks[0]->regions[0]->ipc->handle.len = 64;
        expect_refused(out, olen, "ipc.handle is 65 bytes, not 64");
        kvf__handshake_reply__free_unpacked(m, NULL);
        free(out);
        free(buf);
    }
}

/* kvf_gather() on the CPU against memcpy/memset of the same ranges, at odd alignments. */
static void test_gather_cpu_twin(void **state)
{
    enum { SRC = 1 << 20, DST = 2 << 20 };
    uint8_t *src = malloc(SRC + 64), *dst = malloc(DST + 64), *ref = malloc(DST + 64);
    static const uint64_t lens[] = {1, 15, 16, 17, 4095, 65535, 65536, 65537, 200000};
    kvf_gather_op_t *ops = calloc(4096, sizeof(*ops));
    size_t n = 0;
    uint64_t doff = 0;

    (void)state;
    assert_non_null(src);
    assert_non_null(dst);
    assert_non_null(ref);
    assert_non_null(ops);
    for (size_t i = 0; i < SRC + 64; ++i) {
        src[i] = (uint8_t)(1 + i % 253);
    }
    memset(dst, 0xee, DST + 64);
    memset(ref, 0xee, DST + 64);
    for (size_t k = 0; k < sizeof(lens) / sizeof(lens[0]); ++k) {
        for (uint64_t misalign = 0; misalign < 3; ++misalign) {
            uint64_t soff = (k * 70001 + misalign * 5) % (SRC - lens[k]);
            bool zero = ((k + misalign) % 4) == 3;
            size_t m = kvf_gather_split(zero ? 0 : (uint64_t)(uintptr_t)(src + soff),
                                        (uint64_t)(uintptr_t)(dst + doff + misalign), lens[k],
                                        ops + n);
            assert_int_equal(m, kvf_gather_ops_for(lens[k]));
            for (size_t j = 0; j < m; ++j) {
                assert_true((ops[n + j].len > 0) && (ops[n + j].len <= KVF_GATHER_CHUNK));
            }
            if (zero) {
                memset(ref + doff + misalign, 0, lens[k]);
            } else {
                memcpy(ref + doff + misalign, src + soff, lens[k]);
            }
            n += m;
            doff += lens[k] + 7;
        }
    }
    assert_true(doff < DST);
    assert_int_equal(kvf_gather(NULL, ops, n), KVF_KERN_OK);
    assert_memory_equal(dst, ref, DST + 64);
    /* bad ops are refused before anything is written */
    ops[0].len = 0;
    assert_int_equal(kvf_gather(NULL, ops, n), KVF_KERN_EINVAL);
    assert_int_equal(kvf_gather(NULL, NULL, 3), KVF_KERN_EINVAL);
    assert_int_equal(kvf_gather(NULL, NULL, 0), KVF_KERN_OK);
    print_message("gather: %zu ops over %llu bytes equal memcpy/memset\n", n,
                  (unsigned long long)doff);
    free(ops);
    free(src);
    free(dst);
    free(ref);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ipc_round_trip),
        cmocka_unit_test(test_ipc_forged_refused),
        cmocka_unit_test(test_gather_cpu_twin),
    };
    kvf_log_init("test");
    return cmocka_run_group_tests(tests, NULL, NULL);
}
