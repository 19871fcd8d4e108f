/*
 * Operator/test tools of the transfer layer, run as kvf subcommands
 * (tools/kvf_main.c lists them). Each takes the arguments after its name
 * and returns the exit code: 0 success, 1 failure or refusal, 2 bad usage.
 */
#ifndef KVF_XFER_TOOLS_H
#define KVF_XFER_TOOLS_H

/**
 * kvf xfer-test: start a prefill instance in a child process, act as the
 * decode instance, and through the KV connector the daemons use handshake,
 * pull one request of --tokens tokens over UCX (the connector plans, zeroes
 * tails and releases), then verify every byte of the decode pool.
 */
int kvf_cmd_xfer_test(int argc, char **argv);

/**
 * kvf bench: GB/s of a KV-shaped pull through the connector beside a raw
 * contiguous UCX GET of the same bytes (bare agents), their ratio, the
 * plan+post time, descriptors per request and transports.
 */
int kvf_cmd_bench(int argc, char **argv);

#endif
