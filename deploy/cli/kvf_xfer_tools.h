/*
 * Operator/test tools of the transfer layer, run as kvf subcommands
 * (deploy/cli/kvf_main.c lists them). Each takes the arguments after its name
 * and returns the exit code: 0 success, 1 failure or refusal, 2 bad usage.
 */
#ifndef KVF_XFER_TOOLS_H
#define KVF_XFER_TOOLS_H

/**
 * kvf xfer-test: start a prefill instance in a child process, act as the
 * decode instance, handshake, plan, pull one request of --tokens tokens
 * over UCX, zero tails, notify, and verify every byte of the decode pool.
 */
int kvf_cmd_xfer_test(int argc, char **argv);

/**
 * kvf bench: GB/s of a KV-shaped pull beside a raw contiguous UCX GET of
 * the same bytes, their ratio, descriptors per request and transports.
 */
int kvf_cmd_bench(int argc, char **argv);

#endif
