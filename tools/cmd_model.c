/*
 * Model subcommands of the kvf CLI:
 *   kvf mkmodel      write a seeded synthetic checkpoint for a config
 *   kvf generate     colocated generation with TP ranks in this process
 *   kvf bench-model  prefill and decode throughput of the engine core
 * They drive the same engine core (common/engine/kvf_engine.h) the role daemons use.
 */
#include "kvf_cmds.h"
#include "kvf_time.h"
#include "kvf_config.h"
#include "kvf_engine.h"
#include "kvf_engine_opts.h"
#include "kvf_fwd_profile.h"
#include "kvf_log.h"
#include "kvf_mkmodel.h"
#include "kvf_model.h"
#include "kvf_sampler.h"
#include "kvf_tok_model.h"
#include "kvf_tokenizer.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- mkmodel ---------------------------------------------------------------- */

typedef struct {
    char config[KVF_CONFIG_STR_MAX];
    char out[KVF_CONFIG_STR_MAX];
    int  seed;
    char dtype[KVF_CONFIG_STR_MAX];
    int  shards;
} kvf_mkmodel_opts_t;

static const kvf_config_field_t kvf_mkmodel_table[] = {
    {"CONFIG", "", "model config.json (nemotron_h, llama, qwen3, mistral)",
     offsetof(kvf_mkmodel_opts_t, config), KVF_CONFIG_TYPE_STRING, 0},
    {"OUT", "", "output folder: config.json + model.safetensors",
     offsetof(kvf_mkmodel_opts_t, out), KVF_CONFIG_TYPE_STRING, 0},
    {"SEED", "1", "initialisation seed",
     offsetof(kvf_mkmodel_opts_t, seed), KVF_CONFIG_TYPE_INT, 0},
    {"DTYPE", "fp32", "stored tensor dtype: fp32 or bf16",
     offsetof(kvf_mkmodel_opts_t, dtype), KVF_CONFIG_TYPE_STRING, 0},
    {"SHARDS", "1", "safetensors files (> 1: model-0000i-of-0000n + index.json)",
     offsetof(kvf_mkmodel_opts_t, shards), KVF_CONFIG_TYPE_INT, 0},
    {NULL, NULL, NULL, 0, 0, 0},
};

int kvf_cmd_mkmodel(int argc, char **argv)
{
    kvf_mkmodel_opts_t o;
    kvf_dtype_t dtype;
    bool done = false;

    if (kvf_config_parse(kvf_mkmodel_table, "kvf mkmodel", argc, argv, &o, &done) != KVF_OK) {
        return 2;
    }
    if (done) {
        return 0;
    }
    if ((o.config[0] == '\0') || (o.out[0] == '\0')) {
        kvf_error("kvf mkmodel: --config and --out are required");
        return 2;
    }
    if ((kvf_dtype_parse(o.dtype, &dtype) != 0) ||
        ((dtype != KVF_DTYPE_FP32) && (dtype != KVF_DTYPE_BF16))) {
        kvf_error("bad value '%s' for --dtype (fp32 or bf16)", o.dtype);
        return 2;
    }
    if ((o.shards < 1) || (o.shards > 64)) {
        kvf_error("bad value %d for --shards (1 to 64)", o.shards);
        return 2;
    }
    if (kvf_mkmodel_write_sharded(o.config, o.out, (uint64_t)(unsigned)o.seed, dtype,
                                  o.shards) != KVF_OK) {
        return 1;
    }
    if (o.shards > 1) {
        printf("wrote %s/config.json, tokenizer.json, %d safetensors shards and "
               "model.safetensors.index.json (seed %d, %s)\n", o.out, o.shards, o.seed,
               kvf_dtype_name(dtype));
    } else {
        printf("wrote %s/config.json, tokenizer.json and model.safetensors (seed %d, %s)\n",
               o.out, o.seed, kvf_dtype_name(dtype));
    }
    return 0;
}

/* ---- shared engine options ---------------------------------------------------- */

typedef struct {
    char   model[KVF_CONFIG_STR_MAX];
    int    tp;
    char   kv_dtype[KVF_CONFIG_STR_MAX];
    char   ssm_dtype[KVF_CONFIG_STR_MAX];
    char   conv_dtype[KVF_CONFIG_STR_MAX];
    int    block_size;         /* user block size: the alignment unit */
    int    exact_block_size;   /* 0: derive */
    char   kv_layout[KVF_CONFIG_STR_MAX];
    int    num_blocks;
    int    max_batch_tokens;
    char   device[KVF_CONFIG_STR_MAX];
    /* generate */
    char   prompt[KVF_CONFIG_STR_MAX];   /* the config table type: up to 255 bytes */
    char   prompt_file[KVF_CONFIG_STR_MAX];
    char   prompt_ids[KVF_CONFIG_STR_MAX];
    int    max_tokens;
    double temperature;
    int    seed;
    bool   print_logits;
    int    logprobs;
    int    prompt_logprobs;
    bool   ignore_eos;
    bool   add_bos;
    double top_p;
    int    top_k;
    double min_p;
    bool   prefix_caching;
    size_t prefix_state_bytes;
    int    prefix_state_grid;   /* 0: bench-model, which has no prefix cache */
    int    turns;
    char   logit_bias[KVF_CONFIG_STR_MAX];  /* "ID:BIAS,..." */
    char   allowed[KVF_CONFIG_STR_MAX];     /* "ID,..." */
    /* bench */
    int    prompt_len;
    int    decode_tokens;
    int    batch;
    bool   warmup;
    bool   profile;
} kvf_gen_opts_t;

/* The engine options of kvf generate and kvf bench-model (common/engine/kvf_engine_opts.h). */
#define KVF_ENGINE_FIELDS                                                                     \
    KVF_ENGINE_OPT(MODEL, kvf_gen_opts_t, ),                                                  \
    KVF_ENGINE_OPT(TP, kvf_gen_opts_t, ),                                                     \
    KVF_ENGINE_OPT(KV_DTYPE, kvf_gen_opts_t, ),                                               \
    KVF_ENGINE_OPT(SSM_DTYPE, kvf_gen_opts_t, ),                                              \
    KVF_ENGINE_OPT(CONV_DTYPE, kvf_gen_opts_t, ),                                             \
    KVF_ENGINE_OPT(BLOCK_SIZE, kvf_gen_opts_t, ),                                             \
    KVF_ENGINE_OPT(EXACT_BLOCK_SIZE, kvf_gen_opts_t, ),                                       \
    KVF_ENGINE_OPT(KV_LAYOUT, kvf_gen_opts_t, ),                                              \
    KVF_ENGINE_OPT(NUM_BLOCKS, kvf_gen_opts_t, ),                                             \
    KVF_ENGINE_OPT(MAX_BATCH_TOKENS, kvf_gen_opts_t, ),                                       \
    KVF_ENGINE_OPT(DEVICE, kvf_gen_opts_t, )

static const kvf_config_field_t kvf_generate_table[] = {
    KVF_ENGINE_FIELDS,
    {"PROMPT", "Hello", "prompt text, encoded with the model's tokenizer.json (byte-level BPE; "
     "kvf mkmodel's models declare the 256-byte vocabulary)",
     offsetof(kvf_gen_opts_t, prompt), KVF_CONFIG_TYPE_STRING, 0},
    {"PROMPT_FILE", "", "read the prompt from this file instead (any length)",
     offsetof(kvf_gen_opts_t, prompt_file), KVF_CONFIG_TYPE_STRING, 0},
    {"PROMPT_IDS", "", "the prompt as token ids, comma list, instead of text: no tokenizer "
     "needed, so a checkpoint without tokenizer.json runs (output: the tokens line alone)",
     offsetof(kvf_gen_opts_t, prompt_ids), KVF_CONFIG_TYPE_STRING, 0},
    {"MAX_TOKENS", "64", "tokens to generate",
     offsetof(kvf_gen_opts_t, max_tokens), KVF_CONFIG_TYPE_INT, 0},
    {"TEMPERATURE", "0", "sampling temperature (0: greedy)",
     offsetof(kvf_gen_opts_t, temperature), KVF_CONFIG_TYPE_DOUBLE, 0},
    {"SEED", "0", "sampling seed",
     offsetof(kvf_gen_opts_t, seed), KVF_CONFIG_TYPE_INT, 0},
    {"PRINT_LOGITS", "no", "print the logits of every generated token",
     offsetof(kvf_gen_opts_t, print_logits), KVF_CONFIG_TYPE_BOOL, 0},
    {"LOGPROBS", "-1", "print each generated token's logprob and the top N (0 to 20; the "
     "sampler's numbers, as a pool returns them for the OpenAI field logprobs; -1: none)",
     offsetof(kvf_gen_opts_t, logprobs), KVF_CONFIG_TYPE_INT, 0},
    {"PROMPT_LOGPROBS", "-1", "print each prompt token's logprob (from the second), its rank "
     "and the top N (0 to 20; as a pool returns them for the OpenAI field prompt_logprobs; "
     "-1: none)", offsetof(kvf_gen_opts_t, prompt_logprobs), KVF_CONFIG_TYPE_INT, 0},
    {"IGNORE_EOS", "no", "keep generating after EOS",
     offsetof(kvf_gen_opts_t, ignore_eos), KVF_CONFIG_TYPE_BOOL, 0},
    {"ADD_BOS", "yes", "prefix the prompt with the BOS token",
     offsetof(kvf_gen_opts_t, add_bos), KVF_CONFIG_TYPE_BOOL, 0},
    {"TOP_P", "1", "nucleus sampling: keep the most likely tokens up to this mass, (0, 1]",
     offsetof(kvf_gen_opts_t, top_p), KVF_CONFIG_TYPE_DOUBLE, 0},
    {"TOP_K", "-1", "keep the k most likely tokens (-1: all)",
     offsetof(kvf_gen_opts_t, top_k), KVF_CONFIG_TYPE_INT, 0},
    {"MIN_P", "0", "drop tokens less likely than this fraction of the most likely, [0, 1]",
     offsetof(kvf_gen_opts_t, min_p), KVF_CONFIG_TYPE_DOUBLE, 0},
    KVF_ENGINE_OPT(PREFIX_CACHING, kvf_gen_opts_t, ),
    KVF_ENGINE_OPT(PREFIX_STATE_BYTES, kvf_gen_opts_t, ),
    KVF_ENGINE_OPT(PREFIX_STATE_GRID, kvf_gen_opts_t, ),
    {"TURNS", "1", "a conversation of this many turns: each next prompt is the last prompt, "
     "its answer and a follow-up (the prompt text's first 32 tokens); prints each turn's "
     "prompt tokens, prefix-cache hit and time to first token",
     offsetof(kvf_gen_opts_t, turns), KVF_CONFIG_TYPE_INT, 0},
    {"LOGIT_BIAS", "", "ID:BIAS,... added to those tokens' logits (the OpenAI field "
     "logit_bias; biases in [-100, 100])", offsetof(kvf_gen_opts_t, logit_bias),
     KVF_CONFIG_TYPE_STRING, 0},
    {"ALLOWED_TOKEN_IDS", "", "ID,...: only these may be generated (vLLM's allowed_token_ids)",
     offsetof(kvf_gen_opts_t, allowed), KVF_CONFIG_TYPE_STRING, 0},
    {NULL, NULL, NULL, 0, 0, 0},
};

static const kvf_config_field_t kvf_bench_table[] = {
    KVF_ENGINE_FIELDS,
    {"PROMPT_LEN", "256", "prompt tokens per request",
     offsetof(kvf_gen_opts_t, prompt_len), KVF_CONFIG_TYPE_INT, 0},
    {"DECODE_TOKENS", "64", "tokens generated per request",
     offsetof(kvf_gen_opts_t, decode_tokens), KVF_CONFIG_TYPE_INT, 0},
    {"BATCH", "1", "concurrent requests",
     offsetof(kvf_gen_opts_t, batch), KVF_CONFIG_TYPE_INT, 0},
    {"WARMUP", "no", "first an untimed round of the same requests with 2 decode tokens, so "
     "first-call set-up (CUDA module loading, cuBLAS handles, workspace growth) is not timed",
     offsetof(kvf_gen_opts_t, warmup), KVF_CONFIG_TYPE_BOOL, 0},
    {"TEMPERATURE", "0", "sampling temperature of every request (0: greedy; above: each token "
     "sampled, on the device when the model is on one, with a fixed seed per request)",
     offsetof(kvf_gen_opts_t, temperature), KVF_CONFIG_TYPE_DOUBLE, 0},
    {"TOP_P", "1", "nucleus sampling of every request, (0, 1]",
     offsetof(kvf_gen_opts_t, top_p), KVF_CONFIG_TYPE_DOUBLE, 0},
    {"PROFILE", "no", "then one more round of the same requests with every kernel call of "
     "rank 0 timed between device synchronisations: a table per phase of where a step's time "
     "goes (call sites by total time); the figures above come from the unprofiled round",
     offsetof(kvf_gen_opts_t, profile), KVF_CONFIG_TYPE_BOOL, 0},
    {NULL, NULL, NULL, 0, 0, 0},
};

/* --device, opened before anything is loaded (a missing GPU fails at once). 0, 1 or 2. */
static int kvf_gen_device(const kvf_gen_opts_t *o, kvf_device_t *dev_p)
{
    kvf_status_t status = kvf_model_device_open("--device", o->device, dev_p);

    return (status == KVF_OK) ? 0 : (status == KVF_ERR_INVALID_PARAM) ? 2 : 1;
}

static int kvf_open_engine(const kvf_gen_opts_t *o, kvf_engine_h *engine_p)
{
    kvf_engine_params_t ep = {0};
    kvf_model_config_t cfg;
    int rc;

    if (o->model[0] == '\0') {
        kvf_error("--model is required (a folder written by kvf mkmodel)");
        return 2;
    }
    if ((o->tp < 1) || (o->tp > 64)) {
        kvf_error("bad value %d for --tp (tensor-parallel ranks: 1..64)", o->tp);
        return 2;
    }
    rc = kvf_gen_device(o, &ep.device);
    if (rc != 0) {
        return rc;
    }
    if (kvf_model_config_load(o->model, &cfg) != KVF_OK) {
        return 1;
    }
    kvf_cache_params_default(&cfg, &ep.cache);
    if ((kvf_engine_opts_block_sizes(o->block_size, o->exact_block_size) != KVF_OK) ||
        (kvf_engine_opts_dtype("kv-dtype", o->kv_dtype, KVF_DTYPE_BF16, true,
                               &ep.cache.kv_dtype) != KVF_OK) ||
        (kvf_engine_opts_dtype("ssm-dtype", o->ssm_dtype, cfg.ssm_cache_dtype, true,
                               &ep.cache.ssm_dtype) != KVF_OK) ||
        (kvf_engine_opts_dtype("conv-dtype", o->conv_dtype, ep.cache.conv_dtype, true,
                               &ep.cache.conv_dtype) != KVF_OK) ||
        (kvf_engine_opts_kv_layout(o->kv_layout, &ep.cache.kv_layout) != KVF_OK)) {
        return 2;
    }
    ep.cache.user_block_size = o->block_size;
    ep.cache.block_size = o->exact_block_size;
    ep.field_mask = KVF_ENGINE_PARAM_FIELD_CACHE | KVF_ENGINE_PARAM_FIELD_NUM_BLOCKS |
                    KVF_ENGINE_PARAM_FIELD_MAX_BATCH_TOKENS | KVF_ENGINE_PARAM_FIELD_DEVICE;
    ep.model_dir = o->model;
    ep.tp_size = o->tp;
    ep.num_blocks = o->num_blocks;
    ep.max_batch_tokens = o->max_batch_tokens;
    if (o->prefix_state_grid != 0) {   /* kvf generate's rows */
        if (o->prefix_state_grid < 1) {
            kvf_error("bad value %d for --prefix-state-grid (tokens, at least 1)",
                      o->prefix_state_grid);
            return 2;
        }
        ep.field_mask |= KVF_ENGINE_PARAM_FIELD_PREFIX;
        ep.prefix.enabled = o->prefix_caching;
        ep.prefix.state_grid = o->prefix_state_grid;
        ep.prefix.state_bytes = o->prefix_state_bytes;
    }
    if (kvf_engine_create(&ep, engine_p) != KVF_OK) {
        return 1;
    }
    /* the scan's state grid is the engine's (the default when no prefix rows were given):
     * one value for the chunks, the checkpoints and the scan's rounding points */
    if (kvf_model_set_state_grid(kvf_tp_runner_model(kvf_engine_runner(*engine_p)),
                                 (o->prefix_state_grid != 0) ? o->prefix_state_grid :
                                 KVF_PREFIX_STATE_GRID_DEFAULT) != KVF_OK) {
        kvf_engine_destroy(*engine_p);
        *engine_p = NULL;
        return 2;
    }
    return 0;
}

/* ---- generate ------------------------------------------------------------------- */

/* Whole file as a NUL-terminated string (trailing newline kept). */
static char *kvf_read_text(const char *path, size_t *len_p)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    long len;

    if (f == NULL) {
        kvf_error("cannot open prompt file %s: %m", path);
        return NULL;
    }
    if ((fseek(f, 0, SEEK_END) == 0) && ((len = ftell(f)) >= 0) && (fseek(f, 0, SEEK_SET) == 0)) {
        buf = malloc((size_t)len + 1);
        if ((buf != NULL) && (fread(buf, 1, (size_t)len, f) == (size_t)len)) {
            buf[len] = '\0';
            *len_p = (size_t)len;
        } else {
            kvf_error("cannot read prompt file %s: %m", path);
            free(buf);
            buf = NULL;
        }
    }
    fclose(f);
    return buf;
}

/* --top-p, --top-k, --min-p onto @a s, checked as a server checks a request's fields. */
/* --logit-bias "ID:BIAS,..." and --allowed-token-ids "ID,..." into @a s. 0, or 2 (logged). */
static int kvf_gen_lists(const kvf_gen_opts_t *o, kvf_sampling_t *s)
{
    const char *p = o->logit_bias;
    char *end;

    while (*p != '\0') {
        long id = strtol(p, &end, 10);
        if ((end == p) || (*end != ':') || (s->num_logit_bias >= KVF_SAMPLING_MAX_BIAS)) {
            kvf_error("kvf generate: bad --logit-bias '%s' (ID:BIAS,...)", o->logit_bias);
            return 2;
        }
        s->bias_ids[s->num_logit_bias] = (int32_t)id;
        s->bias_values[s->num_logit_bias++] = strtof(end + 1, &end);
        p = (*end == ',') ? end + 1 : end;
    }
    for (p = o->allowed; *p != '\0'; p = (*end == ',') ? end + 1 : end) {
        long id = strtol(p, &end, 10);
        if ((end == p) || (s->num_allowed >= KVF_SAMPLING_MAX_ALLOWED)) {
            kvf_error("kvf generate: bad --allowed-token-ids '%s' (ID,...)", o->allowed);
            return 2;
        }
        s->allowed_ids[s->num_allowed++] = (int32_t)id;
    }
    return 0;
}

static int kvf_gen_filters(const kvf_gen_opts_t *o, kvf_engine_h eng, kvf_sampling_t *s)
{
    char err[160];

    s->top_p = (float)o->top_p;
    s->top_k = o->top_k;
    s->min_p = (float)o->min_p;
    if (kvf_gen_lists(o, s) != 0) {
        return 2;
    }
    if (kvf_sampling_check(s, kvf_engine_model_config(eng)->vocab_size, err, sizeof(err)) !=
        KVF_OK) {
        kvf_error("kvf generate: bad sampling flag: %s (--top-p, --top-k, --min-p, "
                  "--logit-bias, --allowed-token-ids)", err);
        return 2;
    }
    return 0;
}

/* --print-logits: one line per generated token, "logits I TOKEN L0 L1 ...", %.9g (a
 * float's bits round-trip). */
static void kvf_print_logits(kvf_engine_h eng, const kvf_req_info_t *info)
{
    const int vocab = kvf_engine_model_config(eng)->vocab_size;

    for (int i = 0; i < info->num_logits; ++i) {
        printf("logits %d %d", i, info->tokens[info->prompt_len + i]);
        for (int v = 0; v < vocab; ++v) {
            printf(" %.9g", (double)info->logits[(size_t)i * (size_t)vocab + (size_t)v]);
        }
        printf("\n");
    }
}

/* --prompt-ids: run the ids, print the tokens line (no tokenizer, no text). 0, or 1 (logged). */
static int kvf_generate_ids(const kvf_gen_opts_t *o, kvf_engine_h eng)
{
    const kvf_model_config_t *cfg = kvf_engine_model_config(eng);
    const int vocab = cfg->vocab_size;
    int32_t ids[KVF_CONFIG_STR_MAX + 1];
    kvf_req_params_t rp = {0};
    kvf_engine_event_t ev[256];
    kvf_req_info_t info;
    char buf[KVF_CONFIG_STR_MAX];
    uint64_t id;
    int n = 0, ne;

    if (o->add_bos && (cfg->bos_token_id >= 0)) {
        ids[n++] = cfg->bos_token_id;   /* as a text prompt gets it */
    }
    snprintf(buf, sizeof(buf), "%s", o->prompt_ids);
    for (char *save = NULL, *t = strtok_r(buf, ", ", &save); t != NULL;
         t = strtok_r(NULL, ", ", &save)) {
        char *end;
        long v = strtol(t, &end, 10);
        if ((end == t) || (*end != '\0') || (v < 0) || (v >= vocab)) {
            kvf_error("bad value '%s' for --prompt-ids: '%s' is not a token id in [0, %d)",
                      o->prompt_ids, t, vocab);
            return 1;
        }
        ids[n++] = (int32_t)v;
    }
    if (n == ((o->add_bos && (cfg->bos_token_id >= 0)) ? 1 : 0)) {
        kvf_error("bad value '%s' for --prompt-ids: no token id", o->prompt_ids);
        return 1;
    }
    rp.prompt = ids;
    rp.prompt_len = n;
    rp.sampling.max_tokens = o->max_tokens;
    rp.sampling.temperature = (float)o->temperature;
    rp.sampling.seed = (uint64_t)(unsigned)o->seed;
    rp.sampling.ignore_eos = o->ignore_eos;
    rp.record_logits = o->print_logits;
    if (kvf_gen_filters(o, eng, &rp.sampling) != 0) {
        return 1;
    }
    if (kvf_engine_add_request(eng, &rp, &id) != KVF_OK) {
        return 1;
    }
    while (kvf_engine_has_work(eng)) {
        if (kvf_engine_step(eng, ev, 256, &ne) != KVF_OK) {
            return 1;
        }
    }
    (void)kvf_engine_request_info(eng, id, &info);
    printf("tokens:");
    for (int i = info.prompt_len; i < info.num_tokens; ++i) {
        printf(" %d", info.tokens[i]);
    }
    printf("\n");
    if (o->print_logits) {
        kvf_print_logits(eng, &info);
    }
    return 0;
}

/* --logprobs: one line per sampled token, "logprobs I TOKEN LP ID:LP ...", %.9g (a float's
 * bits survive the text: comparable bit for bit with a pool's JSON numbers) */
static void kvf_print_logprobs(const kvf_engine_event_t *ev, int *i)
{
    if (((ev->kind != KVF_EVENT_TOKEN) && (ev->kind != KVF_EVENT_PREFILLED)) ||
        (ev->token < 0)) {
        return;
    }
    printf("logprobs %d %d %.9g", (*i)++, ev->token, (double)ev->logprob);
    for (int k = 0; k < ev->num_top; ++k) {
        printf(" %d:%.9g", ev->top_ids[k], (double)ev->top_logprobs[k]);
    }
    printf("\n");
}

/* kvf generate's own flags; -1 (logged) when one is bad. */
static int kvf_gen_check(const kvf_gen_opts_t *o)
{
    if (o->max_tokens < 1) {
        kvf_error("bad value %d for --max-tokens (at least 1)", o->max_tokens);
    } else if ((o->turns < 1) || (o->turns > 64)) {
        kvf_error("bad value %d for --turns (1 to 64)", o->turns);
    } else if ((o->logprobs < -1) || (o->logprobs > KVF_SAMPLING_MAX_LOGPROBS) ||
               (o->prompt_logprobs < -1) || (o->prompt_logprobs > KVF_SAMPLING_MAX_LOGPROBS)) {
        kvf_error("bad value %d / %d for --logprobs / --prompt-logprobs (-1: none, or 0 to "
                  "%d)", o->logprobs, o->prompt_logprobs, KVF_SAMPLING_MAX_LOGPROBS);
    } else {
        return 0;
    }
    return -1;
}

#define KVF_GEN_FOLLOW_UP 32   /* tokens of a --turns follow-up question */

/*
 * --turns N: a conversation on one engine; turn k + 1's prompt is turn k's prompt, its
 * answer and a follow-up: the prompt text's first KVF_GEN_FOLLOW_UP ids (without BOS). One
 * line per turn: its prompt tokens, the tokens the prefix cache served, the time to its
 * first token (add to first token event) and its tokens. The figure to compare is a later
 * turn's TTFT with --prefix-caching on/off.
 */
static int kvf_gen_turns(const kvf_gen_opts_t *o, kvf_engine_h eng, kvf_req_params_t rp,
                         int bos, int *nlp)
{
    const int text_len = rp.prompt_len - bos;
    const int follow = (text_len < KVF_GEN_FOLLOW_UP) ? text_len : KVF_GEN_FOLLOW_UP;
    const int cap = (o->turns + 1) * (rp.prompt_len + o->max_tokens);
    int32_t *conv = malloc((size_t)cap * sizeof(int32_t));
    kvf_engine_event_t ev[256];
    kvf_req_info_t info;
    int len = rp.prompt_len, n, rc = 1;

    if (conv == NULL) {
        return 1;
    }
    memcpy(conv, rp.prompt, (size_t)len * sizeof(int32_t));
    for (int turn = 1; turn <= o->turns; ++turn) {
        double t0 = kvf_time_now_s(), ttft = -1.0;
        uint64_t id;
        int hit = 0;
        rp.prompt = conv;
        rp.prompt_len = len;
        if (kvf_engine_add_request(eng, &rp, &id) != KVF_OK) {
            goto out;
        }
        while (kvf_engine_has_work(eng)) {
            if (kvf_engine_step(eng, ev, 256, &n) != KVF_OK) {
                goto out;
            }
            if (hit == 0) {
                hit = kvf_engine_request_prefix_hit(eng, id);
            }
            for (int e = 0; e < n; ++e) {
                if ((ev[e].id == id) && (ev[e].kind == KVF_EVENT_TOKEN) && (ttft < 0)) {
                    ttft = kvf_time_now_s() - t0;
                }
                if (o->logprobs >= 0) {
                    kvf_print_logprobs(&ev[e], nlp);
                }
            }
        }
        (void)kvf_engine_request_info(eng, id, &info);
        printf("turn %d: %d prompt tokens, %d from the prefix cache, ttft %.3f ms, tokens:",
               turn, info.prompt_len, hit, ttft * 1e3);
        for (int i = info.prompt_len; i < info.num_tokens; ++i) {
            printf(" %d", info.tokens[i]);
            conv[len++] = info.tokens[i];
        }
        printf("\n");
        memcpy(conv + len, conv + bos, (size_t)follow * sizeof(int32_t));   /* a follow-up */
        len += follow;
        (void)kvf_engine_release(eng, id);
    }
    rc = 0;
out:
    free(conv);
    return rc;
}

/* --prompt-logprobs: one line per prompt token from the second, "prompt_logprobs I TOKEN LP
 * RANK ID:LP ...", %.9g as --logprobs */
static void kvf_print_prompt_logprobs(const kvf_req_info_t *info)
{
    const kvf_prompt_logprobs_t *p = info->prompt_logprobs;

    for (int i = 0; (p != NULL) && (i < p->n); ++i) {
        printf("prompt_logprobs %d %d %.9g %d", i + 1, info->tokens[i + 1],
               (double)p->logprob[i], p->rank[i]);
        for (int k = 0; k < p->per; ++k) {
            printf(" %d:%.9g", p->top_ids[(size_t)i * (size_t)p->per + (size_t)k],
                   (double)p->top_logprobs[(size_t)i * (size_t)p->per + (size_t)k]);
        }
        printf("\n");
    }
}

/* The request's sampling and logprob settings from the options. */
static void kvf_gen_sampling(const kvf_gen_opts_t *o, kvf_req_params_t *rp)
{
    rp->sampling.max_tokens = o->max_tokens;
    rp->sampling.temperature = (float)o->temperature;
    rp->sampling.seed = (uint64_t)(unsigned)o->seed;
    rp->sampling.ignore_eos = o->ignore_eos;
    rp->record_logits = o->print_logits;
    rp->sampling.want_logprobs = (o->logprobs >= 0);
    rp->sampling.logprobs = (o->logprobs >= 0) ? o->logprobs : 0;
    rp->sampling.want_prompt_logprobs = (o->prompt_logprobs >= 0);
    rp->sampling.prompt_logprobs = (o->prompt_logprobs >= 0) ? o->prompt_logprobs : 0;
}

/* --print-logits rows, then the engine's prefill and decode figures and the finish reason. */
static void kvf_gen_report(const kvf_gen_opts_t *o, kvf_engine_h eng, const kvf_req_info_t *info)
{
    kvf_engine_stats_t st;

    if (o->print_logits) {
        kvf_print_logits(eng, info);
    }
    kvf_engine_get_stats(eng, &st);
    printf("prefill: %llu tokens in %.2f ms (%.1f tok/s)\n", (unsigned long long)st.prefill_tokens,
           st.prefill_seconds * 1e3,
           st.prefill_seconds > 0 ? (double)st.prefill_tokens / st.prefill_seconds : 0.0);
    printf("decode: %llu tokens in %.2f ms (%.1f tok/s), finish %s\n",
           (unsigned long long)st.decode_tokens, st.decode_seconds * 1e3,
           st.decode_seconds > 0 ? (double)st.decode_tokens / st.decode_seconds : 0.0,
           (info->finish == KVF_FINISH_EOS) ? "eos" :
           (info->finish == KVF_FINISH_LENGTH) ? "length" : "other");
}

int kvf_cmd_generate(int argc, char **argv)
{
    kvf_gen_opts_t o = {0};
    kvf_engine_h eng = NULL;
    kvf_tokenizer_t tok = {0};
    kvf_tok_config_t tc;
    kvf_req_params_t rp = {0};
    kvf_engine_event_t ev[256];
    kvf_req_info_t info;
    int32_t *ids = NULL;
    char *text = NULL, *prompt = NULL;
    size_t plen = 0;
    uint64_t id;
    bool done = false;
    int rc = 1, n, nlp = 0;

    if (kvf_config_parse(kvf_generate_table, "kvf generate", argc, argv, &o, &done) != KVF_OK) {
        return 2;
    }
    if (done) {
        return 0;
    }
    if (kvf_gen_check(&o) != 0) {
        return 2;
    }
    rc = kvf_open_engine(&o, &eng);
    if (rc != 0) {
        return rc;
    }
    rc = 1;
    if (o.prompt_ids[0] != '\0') {
        rc = kvf_generate_ids(&o, eng);
        goto out;
    }
    tc = kvf_tok_config_of_model(kvf_engine_model_config(eng));
    if (kvf_tokenizer_load(o.model, &tc, &tok) != KVF_OK) {
        kvf_error("kvf generate: without a tokenizer, give the prompt as --prompt-ids");
        goto out;
    }
    if (o.prompt_file[0] != '\0') {
        prompt = kvf_read_text(o.prompt_file, &plen);
        if (prompt == NULL) {
            goto out;
        }
    } else {
        plen = strlen(o.prompt);
    }
    ids = malloc((3 * plen + 2) * sizeof(int32_t));
    if (ids == NULL) {
        goto out;
    }
    rp.prompt = ids;
    rp.prompt_len = kvf_tokenizer_encode(&tok, (prompt != NULL) ? prompt : o.prompt, plen,
                                         o.add_bos, ids, (int)(3 * plen + 2));
    kvf_gen_sampling(&o, &rp);
    if (kvf_gen_filters(&o, eng, &rp.sampling) != 0) {
        rc = 2;
        goto out;
    }
    if (o.turns > 1) {
        rc = kvf_gen_turns(&o, eng, rp, (o.add_bos && (kvf_engine_model_config(eng)->bos_token_id
                                                        >= 0)) ? 1 : 0, &nlp);
        goto out;
    }
    if (kvf_engine_add_request(eng, &rp, &id) != KVF_OK) {
        goto out;
    }
    while (kvf_engine_has_work(eng)) {
        if (kvf_engine_step(eng, ev, 256, &n) != KVF_OK) {
            goto out;
        }
        for (int e = 0; (o.logprobs >= 0) && (e < n); ++e) {
            kvf_print_logprobs(&ev[e], &nlp);
        }
    }
    (void)kvf_engine_request_info(eng, id, &info);
    kvf_print_prompt_logprobs(&info);
    {
        size_t tcap = kvf_tokenizer_stream_cap(&tok, info.num_tokens - info.prompt_len) + 16;
        text = malloc(tcap);
        if (text == NULL) {
            goto out;
        }
        kvf_tokenizer_decode(&tok, info.tokens + info.prompt_len,
                             info.num_tokens - info.prompt_len, text, tcap);
    }
    printf("%s%s\n", (prompt != NULL) ? prompt : o.prompt, text);
    printf("tokens:");
    for (int i = info.prompt_len; i < info.num_tokens; ++i) {
        printf(" %d", info.tokens[i]);
    }
    printf("\n");
    kvf_gen_report(&o, eng, &info);
    rc = 0;
out:
    kvf_tokenizer_cleanup(&tok);
    free(text);
    free(ids);
    free(prompt);
    kvf_engine_destroy(eng);
    return rc;
}

/* ---- bench-model ---------------------------------------------------------------- */

/* A /proc/self/status size of this process, bytes: "VmRSS" (resident now) or
 * "VmHWM" (peak resident); 0 when /proc is unreadable. */
static size_t kvf_proc_bytes(const char *field)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256], fmt[64];
    size_t kb = 0;

    snprintf(fmt, sizeof(fmt), "%s: %%zu kB", field);
    while ((f != NULL) && (fgets(line, sizeof(line), f) != NULL)) {
        if (sscanf(line, fmt, &kb) == 1) {
            break;
        }
    }
    if (f != NULL) {
        fclose(f);
    }
    return kb * 1024;
}

/* Load the weights alone once and print what they occupy against the files. */
static int kvf_bench_weights(const kvf_gen_opts_t *o)
{
    size_t rss0 = kvf_proc_bytes("VmRSS"), rss1, peak;
    kvf_model_h model;
    kvf_device_t dev;

    if ((kvf_gen_device(o, &dev) != 0) ||
        (kvf_model_load_device(o->model, o->tp, &dev, &model) != KVF_OK)) {
        return -1;
    }
    rss1 = kvf_proc_bytes("VmRSS");
    peak = kvf_proc_bytes("VmHWM");
    printf("weights: %.2f MiB held (%s), RSS +%.2f MiB, checkpoint %.2f MiB in %d file%s\n",
           (double)kvf_model_weight_bytes(model) / 1048576.0,
           kvf_dtype_name(kvf_model_get_config(model)->torch_dtype),
           (double)(rss1 > rss0 ? rss1 - rss0 : 0) / 1048576.0,
           (double)kvf_model_file_bytes(model) / 1048576.0, kvf_model_num_files(model),
           (kvf_model_num_files(model) == 1) ? "" : "s");
    /* peak over the load above the process before it (libraries, CUDA/UCX runtimes):
     * the file's mapped pages plus the copy made of them */
    printf("load: peak RSS %.2f MiB (%.2f MiB before loading) = %.2f x the checkpoint file"
           " size above that\n", (double)peak / 1048576.0, (double)rss0 / 1048576.0,
           (double)(peak > rss0 ? peak - rss0 : 0) /
           (double)(kvf_model_file_bytes(model) ? kvf_model_file_bytes(model) : 1));
    kvf_model_destroy(model);
    return 0;
}

/* One round: o->batch requests of o->prompt_len tokens and @a decode tokens each, run to
 * the end; steps that computed prompt tokens count as prefill, the others as decode. */
static int kvf_bench_round(const kvf_gen_opts_t *o, kvf_engine_h eng, int decode,
                           int32_t *prompt, kvf_engine_event_t *ev, double *t_prefill,
                           double *t_decode, uint64_t *prefill_tok, uint64_t *decode_tok)
{
    const int vocab = kvf_engine_model_config(eng)->vocab_size;
    int n;

    for (int b = 0; b < o->batch; ++b) {
        kvf_req_params_t rp = {0};
        uint64_t id;
        for (int i = 0; i < o->prompt_len; ++i) {
            prompt[i] = (int32_t)((i * 131 + b * 17 + 7) % (vocab < 256 ? vocab : 256));
        }
        rp.prompt = prompt;
        rp.prompt_len = o->prompt_len;
        rp.sampling.max_tokens = decode;
        rp.sampling.ignore_eos = true;
        rp.sampling.temperature = (float)o->temperature;
        rp.sampling.top_p = (float)o->top_p;
        rp.sampling.top_k = -1;
        rp.sampling.seed = (uint64_t)(b + 1);
        if (kvf_engine_add_request(eng, &rp, &id) != KVF_OK) {
            return -1;
        }
    }
    /* Prefill phase: steps until every request has its first token; then decode steps. */
    while (kvf_engine_has_work(eng)) {
        kvf_engine_stats_t before, after;
        double t0;
        kvf_engine_get_stats(eng, &before);
        t0 = kvf_time_now_s();
        if (kvf_engine_step(eng, ev, 4 * (o->batch + 64), &n) != KVF_OK) {
            return -1;
        }
        kvf_engine_get_stats(eng, &after);
        double dt = kvf_time_now_s() - t0;
        bool prefill = after.prefill_tokens > before.prefill_tokens;
        if (prefill) {
            *t_prefill += dt;
            *prefill_tok += after.prefill_tokens - before.prefill_tokens;
        } else {
            *t_decode += dt;
            *decode_tok += after.decode_tokens - before.decode_tokens;
        }
        if (kvf_fwd_profile_active()) {
            kvf_fwd_profile_commit(prefill ? KVF_PROF_PREFILL : KVF_PROF_DECODE, dt);
        }
    }
    return 0;
}

int kvf_cmd_bench_model(int argc, char **argv)
{
    kvf_gen_opts_t o = {0};
    kvf_engine_h eng = NULL;
    kvf_engine_event_t *ev = NULL;
    int32_t *prompt = NULL;
    bool done = false;
    int rc;
    double t_prefill = 0, t_decode = 0, w_prefill = 0, w_decode = 0;
    uint64_t prefill_tok = 0, decode_tok = 0, w_ptok = 0, w_dtok = 0;

    if (kvf_config_parse(kvf_bench_table, "kvf bench-model", argc, argv, &o, &done) != KVF_OK) {
        return 2;
    }
    if (done) {
        return 0;
    }
    if ((o.prompt_len < 1) || (o.decode_tokens < 1) || (o.batch < 1)) {
        kvf_error("--prompt-len, --decode-tokens and --batch must be positive");
        return 2;
    }
    if (kvf_bench_weights(&o) != 0) {
        return 1;
    }
    rc = kvf_open_engine(&o, &eng);
    if (rc != 0) {
        return rc;
    }
    {
        kvf_sampling_t s = {.temperature = (float)o.temperature, .top_p = (float)o.top_p,
                            .max_tokens = o.decode_tokens};
        char err[160];
        if (kvf_sampling_check(&s, kvf_engine_model_config(eng)->vocab_size, err,
                               sizeof(err)) != KVF_OK) {
            kvf_error("kvf bench-model: bad sampling flag: %s (--temperature, --top-p)", err);
            rc = 2;
            goto out;
        }
    }
    rc = 1;
    prompt = malloc((size_t)o.prompt_len * sizeof(int32_t));
    ev = malloc(4 * (size_t)(o.batch + 64) * sizeof(*ev));
    if ((prompt == NULL) || (ev == NULL)) {
        goto out;
    }
    if (o.warmup && (kvf_bench_round(&o, eng, 2, prompt, ev, &w_prefill, &w_decode, &w_ptok,
                                     &w_dtok) != 0)) {
        goto out;
    }
    if (kvf_bench_round(&o, eng, o.decode_tokens, prompt, ev, &t_prefill, &t_decode,
                        &prefill_tok, &decode_tok) != 0) {
        goto out;
    }
    if (o.warmup) {
        printf("warm-up: prefill %llu tokens in %.2f ms, decode %llu tokens in %.2f ms "
               "(untimed)\n", (unsigned long long)w_ptok, w_prefill * 1e3,
               (unsigned long long)w_dtok, w_decode * 1e3);
    }
    printf("model %s tp %d batch %d: prefill %llu tokens %.1f tok/s, decode %llu tokens %.1f tok/s\n",
           o.model, o.tp, o.batch, (unsigned long long)prefill_tok,
           t_prefill > 0 ? (double)prefill_tok / t_prefill : 0.0, (unsigned long long)decode_tok,
           t_decode > 0 ? (double)decode_tok / t_decode : 0.0);
    printf("run: peak RSS %.2f MiB (weights, KV pool and workspaces)\n",
           (double)kvf_proc_bytes("VmHWM") / 1048576.0);
    if (o.profile) {
        double p_prefill = 0, p_decode = 0;
        uint64_t p_ptok = 0, p_dtok = 0;
        kvf_fwd_profile_enable(true);
        rc = kvf_bench_round(&o, eng, o.decode_tokens, prompt, ev, &p_prefill, &p_decode,
                             &p_ptok, &p_dtok);
        fflush(stdout);
        kvf_fwd_profile_print(stdout);
        kvf_fwd_profile_enable(false);
        if (rc != 0) {
            rc = 1;
            goto out;
        }
    }
    rc = 0;
out:
    free(prompt);
    free(ev);
    kvf_engine_destroy(eng);
    return rc;
}
