/*
 * kvf: the operator CLI. One binary, one subcommand per task; each
 * subcommand lives with the layer it exercises and is listed here.
 */
#include "kvf_cmds.h"
#include "kvf_log.h"

#include <stdio.h>
#include <string.h>

static const kvf_cmd_t kvf_cmds[] = {
    {"plan", kvf_cmd_plan, "per-rank cache geometry and block sizes for P/D layouts"},
    {"mkmodel", kvf_cmd_mkmodel, "write a seeded synthetic NemotronH checkpoint for a config"},
    {"matrix", kvf_cmd_matrix, "transfer check and accuracy per layout, block sizes and KV dtypes"},
    {"tokenize", kvf_cmd_tokenize, "encode or decode text with a model's tokenizer.json"},
    {"generate", kvf_cmd_generate, "colocated generation with TP ranks in this process"},
    {"bench-model", kvf_cmd_bench_model, "prefill and decode tokens/s of the engine core"},
    {"xfer-test", kvf_cmd_xfer_test, "pull one request prefill -> decode over UCX and verify every byte"},
    {"bench", kvf_cmd_bench, "GB/s of a KV-shaped pull vs a raw contiguous UCX GET"},
    {"bench-serve", kvf_cmd_bench_serve, "load generator against kvf-proxy: TTFT/TPOT/ITL percentiles, goodput"},
    {"keygen", kvf_cmd_keygen, "write a pool's CURVE key set: server.key, <id>.key, pool.pub"},
    {"pool-check", kvf_cmd_pool_check, "what kvf-up checks before it starts a pool: dtypes, sharding, digests, ports"},
    {"tune", kvf_cmd_tune, "start each fitting layout with kvf-up, bench it at a few rates, rank them"},
    {NULL, NULL, NULL},
};

static void kvf_usage(FILE *out)
{
    fprintf(out, "usage: kvf <command> [flags]   (kvf <command> --help for flags)\n\ncommands:\n");
    for (const kvf_cmd_t *c = kvf_cmds; c->name != NULL; ++c) {
        fprintf(out, "  %-12s %s\n", c->name, c->help);
    }
}

int main(int argc, char **argv)
{
    kvf_log_init("kvf");
    if ((argc < 2) || (strcmp(argv[1], "--help") == 0) || (strcmp(argv[1], "-h") == 0)) {
        kvf_usage((argc < 2) ? stderr : stdout);
        return (argc < 2) ? 2 : 0;
    }
    for (const kvf_cmd_t *c = kvf_cmds; c->name != NULL; ++c) {
        if (strcmp(argv[1], c->name) == 0) {
            return c->func(argc - 2, argv + 2);
        }
    }
    fprintf(stderr, "kvf: unknown command '%s'\n", argv[1]);
    kvf_usage(stderr);
    return 2;
}
