/*
 * Prefill and decode tokens per CPU second of the engine's rank-0 thread:
 * unlike `kvf bench-model`'s wall-clock figures, these hold on a host other
 * jobs load, so two builds can be compared there (run each a few times,
 * interleaved). One request of PROMPT_LEN random token ids, prefilled in one
 * step (budget = PROMPT_LEN), then DECODE_TOKENS decode steps; caches as
 * `kvf generate` defaults them. At TP 1 with one kernel thread the rank-0
 * thread does all the work; other settings leave work on other threads, so
 * use wall-clock figures there.
 *
 *   build/tests/bin/bench_engine_cpu_time MODEL_DIR [PROMPT_LEN 1000] [DECODE_TOKENS 32]
 */
#include "kvf_engine.h"
#include "kvf_geometry.h"
#include "kvf_model_config.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double kvf_thread_cpu_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int kvf_arg(int argc, char **argv, int i, const char *what, int def, int *out)
{
    char *end = NULL;
    long v = (argc > i) ? strtol(argv[i], &end, 10) : def;
    if ((argc > i) && ((end == argv[i]) || (*end != '\0') || (v < 1) || (v > 1000000))) {
        fprintf(stderr, "bad value '%s' for %s (1..1000000)\n", argv[i], what);
        return -1;
    }
    *out = (int)v;
    return 0;
}

int main(int argc, char **argv)
{
    kvf_engine_params_t ep = {0};
    kvf_model_config_t cfg;
    kvf_req_params_t rp = {0};
    kvf_engine_event_t ev[16];
    kvf_engine_h e;
    int32_t *prompt;
    int plen, dec, n, steps = 0;
    uint64_t id, seed = 1;
    double t0, t1, t2;

    if ((argc < 2) || (argc > 4) || (kvf_arg(argc, argv, 2, "PROMPT_LEN", 1000, &plen) != 0) ||
        (kvf_arg(argc, argv, 3, "DECODE_TOKENS", 32, &dec) != 0)) {
        fprintf(stderr, "usage: %s MODEL_DIR [PROMPT_LEN] [DECODE_TOKENS]\n", argv[0]);
        return 2;
    }
    if (kvf_model_config_load(argv[1], &cfg) != KVF_OK) {
        return 1;
    }
    kvf_cache_params_default(&cfg, &ep.cache);
    ep.field_mask = KVF_ENGINE_PARAM_FIELD_CACHE | KVF_ENGINE_PARAM_FIELD_MAX_BATCH_TOKENS;
    ep.model_dir = argv[1];
    ep.tp_size = 1;
    ep.max_batch_tokens = plen;
    prompt = malloc((size_t)plen * sizeof(*prompt));
    if ((prompt == NULL) || (kvf_engine_create(&ep, &e) != KVF_OK)) {
        free(prompt);
        return 1;
    }
    for (int i = 0; i < plen; ++i) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        prompt[i] = (int32_t)((seed >> 33) % (uint64_t)cfg.vocab_size);
    }
    rp.prompt = prompt;
    rp.prompt_len = plen;
    rp.sampling.max_tokens = dec + 1;
    rp.sampling.ignore_eos = true;
    if (kvf_engine_add_request(e, &rp, &id) != KVF_OK) {
        kvf_engine_destroy(e);
        free(prompt);
        return 1;
    }
    t0 = kvf_thread_cpu_s();
    (void)kvf_engine_step(e, ev, 16, &n);
    t1 = kvf_thread_cpu_s();
    while (kvf_engine_has_work(e) && (kvf_engine_step(e, ev, 16, &n) == KVF_OK)) {
        ++steps;
    }
    t2 = kvf_thread_cpu_s();
    printf("prefill %d tokens %.1f tok/cpu-s, decode %d tokens %.1f tok/cpu-s\n", plen,
           plen / (t1 - t0), steps, steps / (t2 - t1));
    kvf_engine_destroy(e);
    free(prompt);
    return 0;
}
