/*
 * libFuzzer target: every message a peer can send us at handshake or in a
 * transfer goes through these decoders. They must return KVF_OK or
 * KVF_ERR_PARSE, never crash, leak or read out of bounds (build with
 * -fsanitize=fuzzer,address). A decoded reply must only describe ranks
 * 0..tp_size-1 with bounded key and address lengths. Transfer params go
 * through the one decoder twice: packed on their own (the tools' path) and
 * inside a ServeRequest's DecodeRequest (kvf-decode's path).
 *
 *   cmake -DCMAKE_C_COMPILER=clang ... && ./fuzz_handshake -max_total_time=60
 */
#include "kvf_handshake.h"
#include "kvf_serve.pb-c.h"

#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvf_handshake_reply_t reply;
    kvf_handshake_request_t req;
    kvf_xfer_notification_t n;
    kvf_xfer_params_msg_t p;

    if (kvf_handshake_reply_unpack(data, size, &reply) == KVF_OK) {
        for (int r = 0; r < reply.num_ranks; ++r) {
            if ((reply.ranks[r].tp_rank != r) || (reply.ranks[r].tp_size != reply.num_ranks) ||
                (reply.ranks[r].worker_addr_len > KVF_WORKER_ADDR_MAX) ||
                (reply.ranks[r].num_regions > KVF_XFER_MAX_REGIONS)) {
                abort();
            }
        }
        kvf_handshake_reply_cleanup(&reply);
    }
    (void)kvf_handshake_request_unpack(data, size, &req);
    (void)kvf_xfer_notification_unpack(data, size, &n);
    if (kvf_xfer_params_msg_unpack(data, size, &p) == KVF_OK) {
        kvf_xfer_params_msg_cleanup(&p);
    }
    Kvf__ServeRequest *sr = kvf__serve_request__unpack(NULL, size, data);
    if (sr != NULL) {
        char why[256];
        if ((sr->body_case == KVF__SERVE_REQUEST__BODY_DECODE) &&
            (kvf_xfer_params_decode(sr->decode->params, (int64_t)sr->decode->n_prompt_tokens, &p,
                                    why, sizeof(why)) == KVF_OK)) {
            if ((p.num_groups < 1) || (p.num_groups > KVF_MAX_KV_GROUPS) || (p.port < 1)) {
                abort();
            }
            kvf_xfer_params_msg_cleanup(&p);
        }
        kvf__serve_request__free_unpacked(sr, NULL);
    }
    return 0;
}
