/*
 * Subcommands of the kvf CLI. Each takes the arguments after its name and
 * returns the process exit code: 0 success, 1 failure/refusal, 2 bad usage.
 */
#ifndef KVF_CMDS_H
#define KVF_CMDS_H

typedef int (*kvf_cmd_func_t)(int argc, char **argv);

typedef struct kvf_cmd {
    const char     *name;
    kvf_cmd_func_t  func;
    const char     *help;
} kvf_cmd_t;

/* tools/cmd_plan.c */
int kvf_cmd_plan(int argc, char **argv);

/* tools/cmd_model.c */
int kvf_cmd_mkmodel(int argc, char **argv);
int kvf_cmd_generate(int argc, char **argv);
int kvf_cmd_bench_model(int argc, char **argv);

/* tools/cmd_bench_serve.c */
int kvf_cmd_bench_serve(int argc, char **argv);

/* tools/cmd_tune.c */
int kvf_cmd_tune(int argc, char **argv);

/* tools/cmd_matrix.c: runs kvf-matrix beside this binary */
int kvf_cmd_matrix(int argc, char **argv);

/* tools/cmd_pool_check.c */
int kvf_cmd_pool_check(int argc, char **argv);

/* tools/cmd_keygen.c */
int kvf_cmd_keygen(int argc, char **argv);

/* tools/cmd_tokenize.c */
int kvf_cmd_tokenize(int argc, char **argv);

/* tools/kvf_xfer_test.c (declared in tools/kvf_xfer_tools.h too) */
int kvf_cmd_xfer_test(int argc, char **argv);
int kvf_cmd_bench(int argc, char **argv);

#endif
