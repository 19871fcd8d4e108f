/*
 * kvf-proxy assembly: config table, tokenizer, instance pool, metrics and
 * the HTTP front end, created in dependency order and torn down in reverse
 * (HTTP first, so no request thread is left waiting on a pool that is gone).
 */
#include "kvf_proxy.h"
#include "kvf_proxy_tokcfg.h"
#include "kvf_proxy_flow.h"
#include "kvf_proxy_http.h"
#include "kvf_proxy_tools.h"
#include "kvf_proxy_reasoning.h"
#include "kvf_log.h"
#include "kvf_tok_config.h"
#include "kvf_tokenizer.h"
#include "kvf_tok_digest.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define KVF_PF(_f) offsetof(kvf_proxy_config_t, _f)

const kvf_config_field_t kvf_proxy_config_table[] = {
    {"HOST", "127.0.0.1", "address the HTTP server binds (0.0.0.0: every interface)",
     KVF_PF(host), KVF_CONFIG_TYPE_STRING, 0},
    {"PORT", "8000", "HTTP port (0: any free port, printed at start)",
     KVF_PF(port), KVF_CONFIG_TYPE_INT, 0},
    {"PREFILL", "", "comma list of prefill instance endpoints (tcp://host:port; a host name is "
     "resolved at every health round, the instance follows its address)",
     KVF_PF(prefill), KVF_CONFIG_TYPE_STRING, 0},
    {"DECODE", "", "comma list of decode instance endpoints (tcp://host:port)",
     KVF_PF(decode), KVF_CONFIG_TYPE_STRING, 0},
    {"PREFILL_FILE", "", "file listing the prefill endpoints (commas, spaces or lines between; "
     "# comments), instead of --prefill: no 255-character limit (a Kubernetes ConfigMap)",
     KVF_PF(prefill_file), KVF_CONFIG_TYPE_STRING, 0},
    {"DECODE_FILE", "", "file listing the decode endpoints, instead of --decode",
     KVF_PF(decode_file), KVF_CONFIG_TYPE_STRING, 0},
    {"MODEL", "", "model folder or config.json, for the tokenizer's vocabulary, BOS and EOS; "
     "an instance with another tokenizer is refused (empty: the daemons' model folder, when "
     "this machine can read it; completions get 503 until then)", KVF_PF(model),
     KVF_CONFIG_TYPE_STRING, 0},
    {"MODEL_NAME", "kvferry", "model id served in /v1/models and accepted in requests",
     KVF_PF(model_name), KVF_CONFIG_TYPE_STRING, 0},
    {"REQUEST_TIMEOUT", "60s", "deadline for a whole completion request",
     KVF_PF(request_timeout), KVF_CONFIG_TYPE_TIME, 0},
    {"PREFILL_TIMEOUT", "30s", "longest wait for prefill's first token",
     KVF_PF(prefill_timeout), KVF_CONFIG_TYPE_TIME, 0},
    {"TOKEN_TIMEOUT", "30s", "longest wait between two decode replies (the first includes "
     "the KV transfer)", KVF_PF(token_timeout), KVF_CONFIG_TYPE_TIME, 0},
    {"HEALTH_INTERVAL", "500ms", "period of the health probes sent to every instance",
     KVF_PF(health_interval), KVF_CONFIG_TYPE_TIME, 0},
    {"HEALTH_TIMEOUT", "5s", "a probe unanswered this long marks the instance unhealthy",
     KVF_PF(health_timeout), KVF_CONFIG_TYPE_TIME, 0},
    {"MAX_OUTSTANDING", "128", "requests per instance sent and not yet answered (prefill) or "
     "finished (decode); when every instance is at it, new requests wait in the proxy's "
     "queue while their predicted wait fits their deadline (503 otherwise)",
     KVF_PF(max_outstanding), KVF_CONFIG_TYPE_INT, 0},
    {"ADMISSION_QUEUE_BYTES", "64m", "bound on the prompts waiting in the proxy for a slot (4 "
     "bytes per token); past it a request gets a 503 (queue_full); 0: no queue, a full pool "
     "answers 503 at once", KVF_PF(admission_queue_bytes), KVF_CONFIG_TYPE_SIZE, 0},
    {"IDLE_TIMEOUT", "10s", "a keep-alive connection idle this long after an answer is closed",
     KVF_PF(idle_timeout), KVF_CONFIG_TYPE_TIME, 0},
    {"HEADER_TIMEOUT", "10s", "a new connection must send complete request headers within this",
     KVF_PF(header_timeout), KVF_CONFIG_TYPE_TIME, 0},
    {"BODY_TIMEOUT", "30s", "the request body must arrive within this after the headers",
     KVF_PF(body_timeout), KVF_CONFIG_TYPE_TIME, 0},
    {"DRAIN_TIMEOUT", "5s", "on SIGTERM: how long requests in flight may still run before "
     "they are ended (streams get an error event and [DONE])",
     KVF_PF(drain_timeout), KVF_CONFIG_TYPE_TIME, 0},
    {"MAX_CONNECTIONS", "4096", "concurrent HTTP connections served (one event loop; a few KiB "
     "each); more get a JSON 503", KVF_PF(max_connections), KVF_CONFIG_TYPE_INT, 0},
    {"MAX_CONNECTIONS_PER_CLIENT", "0", "concurrent HTTP connections from one client (its "
     "address, or X-Forwarded-For from a --trusted-proxy); more get a JSON 503; 0: no cap",
     KVF_PF(max_per_client), KVF_CONFIG_TYPE_INT, 0},
    {"TRUSTED_PROXY", "", "comma list of addresses (load balancers, ingresses) whose "
     "X-Forwarded-For names the client for --max-connections-per-client; from any other peer it "
     "is ignored", KVF_PF(trusted_proxy), KVF_CONFIG_TYPE_STRING, 0},
    {"API_KEY", "", "clients must send 'Authorization: Bearer KEY' (401 otherwise); prefer the "
     "environment or --api-key-file to the command line (ps shows it)",
     KVF_PF(api_key), KVF_CONFIG_TYPE_STRING, KVF_CONFIG_FLAG_SECRET},
    {"API_KEY_FILE", "", "file whose first line is the API key (instead of --api-key)",
     KVF_PF(api_key_file), KVF_CONFIG_TYPE_STRING, 0},
    {"PROTECT_METRICS", "no", "with an API key: /health and /metrics need it too (they are open "
     "by default, for probes and scrapers)", KVF_PF(protect_metrics), KVF_CONFIG_TYPE_BOOL, 0},
    {"TLS_CERT", "", "PEM certificate (chain): serve HTTPS (with --tls-key)",
     KVF_PF(tls_cert), KVF_CONFIG_TYPE_STRING, 0},
    {"TLS_KEY", "", "PEM private key of --tls-cert", KVF_PF(tls_key), KVF_CONFIG_TYPE_STRING, 0},
    {"MAX_BODY", "4m", "largest request body; larger ones get 413",
     KVF_PF(max_body), KVF_CONFIG_TYPE_SIZE, 0},
    {"MAX_PROMPT_TOKENS", "32768", "longest prompt accepted, in tokens",
     KVF_PF(max_prompt_tokens), KVF_CONFIG_TYPE_INT, 0},
    {"MAX_TOKENS_LIMIT", "8192", "largest max_tokens accepted",
     KVF_PF(max_tokens_limit), KVF_CONFIG_TYPE_INT, 0},
    {"DEFAULT_MAX_TOKENS", "16", "max_tokens when a request does not say",
     KVF_PF(default_max_tokens), KVF_CONFIG_TYPE_INT, 0},
    {"ADD_BOS", "yes", "prefix string prompts with the model's BOS token (when it has one)",
     KVF_PF(add_bos), KVF_CONFIG_TYPE_BOOL, 0},
    {"KEYS", "", "key set folder (server.key, <id>.key, pool.pub; made by kvf-up or `kvf keygen`): "
     "CURVE to every daemon (docs/SECURITY.md)", KVF_PF(keys), KVF_CONFIG_TYPE_STRING, 0},
    {"KEY_ID", "proxy", "this proxy's member id in pool.pub", KVF_PF(key_id),
     KVF_CONFIG_TYPE_STRING, 0},
    {"INSECURE", "no", "no keys: plain ZeroMQ to the daemons (closed lab networks only; warns "
     "at every start)", KVF_PF(insecure), KVF_CONFIG_TYPE_BOOL, 0},
    {"SERVED_MODEL_NAME", "", "comma list of model ids served (vLLM's --served-model-name): "
     "requests may name any; /v1/models lists each; the first is the one answers carry; "
     "empty: --model-name", KVF_PF(served_model_name), KVF_CONFIG_TYPE_STRING, 0},
    {"ROUTING", "prefix", "how a request's prefill and decode instances are picked: prefix "
     "(prefill: the least predicted wait, a prefix an instance caches, per its KV events, "
     "counted as work not to do; decode: the least load plus the share of the prompt it "
     "would pull; instances without --kv-events-* are routed by load) or load (load alone)",
     KVF_PF(routing), KVF_CONFIG_TYPE_STRING, 0},
    {"PREFIX_ROUTING_WEIGHT", "1", "--routing prefix: a cached prompt token counts as this "
     "many tokens of work saved (1: the request's own time alone; more: keep a prefix where it "
     "is cached even behind a longer queue, as llm-d weighs its prefix scorer above load)",
     KVF_PF(prefix_routing_weight), KVF_CONFIG_TYPE_DOUBLE, 0},
    {"DECODE_PREFIX_ROUTING_WEIGHT", "4", "--routing prefix on decode: a whole prompt to pull "
     "counts as this many outstanding requests, a held prefix its share less (0: decode by "
     "load alone; docs/PREFIX_CACHE.md section 7)",
     KVF_PF(decode_prefix_routing_weight), KVF_CONFIG_TYPE_DOUBLE, 0},
    {"SCHEDULING_POLICY", "fcfs", "order of the requests waiting in the proxy's queue: fcfs "
     "(arrival; a request's non-zero \"priority\" is refused, as vLLM's) or priority (lower "
     "\"priority\" first, then arrival: vLLM's --scheduling-policy priority)",
     KVF_PF(scheduling_policy), KVF_CONFIG_TYPE_STRING, 0},
    {"ENABLE_AUTO_TOOL_CHOICE", "no", "parse tool calls out of chat outputs when a request "
     "has tools and tool_choice \"auto\" (vLLM's flag; needs --tool-call-parser)",
     KVF_PF(enable_auto_tool_choice), KVF_CONFIG_TYPE_BOOL, 0},
    {"TOOL_CALL_PARSER", "", "the model's tool-call format: hermes (<tool_call> JSON: Qwen, "
     "Hermes), llama3_json (Llama 3.x JSON), mistral ([TOOL_CALLS])",
     KVF_PF(tool_call_parser), KVF_CONFIG_TYPE_STRING, 0},
    {"REASONING_PARSER", "", "return a chat output's <think> ... </think> text apart, as "
     "reasoning_content: deepseek_r1 (reasoning up to </think>) or qwen3 (between <think> "
     "and </think>)", KVF_PF(reasoning_parser), KVF_CONFIG_TYPE_STRING, 0},
    {NULL, NULL, NULL, 0, 0, 0},
};

#define KVF_PROXY_MAX_NAMES 16

struct kvf_proxy {
    kvf_tokenizer_t        tok;
    kvf_proxy_pool_h       pool;
    kvf_proxy_metrics_h    metrics;
    char                  *prefill_list, *decode_list;   /* read from --*-file (owned) */
    kvf_proxy_flow_ctx_t   flow;
    kvf_proxy_openai_ctx_t api;
    kvf_proxy_http_h       http;
    char                   model_name[KVF_CONFIG_STR_MAX];
    char                   api_key[KVF_CONFIG_STR_MAX];   /* "" = none */
    kvf_tokenizer_t        bytes_tok;  /* stand-in until the daemons' tokenizer is known */
    char                   tok_hex[KVF_TOK_DIGEST_HEX + 1]; /* kvf_tok_digest.h; "" = none */
    char                   tok_src[KVF_CONFIG_STR_MAX + 16];
    kvf_proxy_tokcfg_t     tokcfg;     /* chat template, BOS/EOS text, model folder */
    char                   names_buf[KVF_CONFIG_STR_MAX];
    const char            *names[KVF_PROXY_MAX_NAMES];
};

/* The chat template and the model folder of @a path, before the tokenizer is published. */
static void kvf_proxy_take_tokcfg(struct kvf_proxy *proxy, const char *path)
{
    if (kvf_proxy_tokcfg_load(path, &proxy->tokcfg) != KVF_OK) {
        kvf_warn("%s: tokenizer_config.json does not parse: chat is refused", path);
    }
    proxy->api.chat_template = proxy->tokcfg.chat_template;
    proxy->api.bos_token = proxy->tokcfg.bos_token;
    proxy->api.eos_token = proxy->tokcfg.eos_token;
    proxy->api.root = proxy->tokcfg.root;
}

/* No --model: the pool's thread offers the daemons' model folder (kvf_proxy_tokcheck.c). */
static kvf_status_t kvf_proxy_adopt_tok(void *ctx, const char *path, const char *digest,
                                        char *why, size_t cap)
{
    struct kvf_proxy *proxy = ctx;
    kvf_tok_config_t tc;
    kvf_tokenizer_t tok;
    char hex[KVF_TOK_DIGEST_HEX + 1];
    kvf_status_t status;

    memset(&tok, 0, sizeof(tok));
    if (path == NULL) {
        proxy->api.tok_ready = true;     /* the stand-in: byte ids, said in log and /health */
        return KVF_OK;
    }
    status = kvf_tok_config_load(path, &tc);
    if (status == KVF_OK) {
        status = kvf_tokenizer_load(path, &tc, &tok);
    }
    if (status != KVF_OK) {
        snprintf(why, cap, "its config.json or tokenizer does not load here (%s)",
                 kvf_status_str(status));
        return status;
    }
    status = kvf_tokenizer_digest(&tok, hex);
    if ((status == KVF_OK) && (strcmp(hex, digest) != 0)) {
        snprintf(why, cap, "the folder here has tokenizer %s, the daemon's has %s (not the "
                 "same files)", hex, digest);
        status = KVF_ERR_REFUSED;
    }
    if (status != KVF_OK) {
        kvf_tokenizer_cleanup(&tok);
        return status;
    }
    proxy->tok = tok;
    proxy->api.max_model_len = tc.max_position_embeddings;
    kvf_proxy_take_tokcfg(proxy, path);
    proxy->api.tok = &proxy->tok;   /* published (atomic stores), then text is served */
    proxy->api.tok_ready = true;
    return KVF_OK;
}

/* The API key from --api-key (or KVF_API_KEY) or the first line of --api-key-file. */
static kvf_status_t kvf_proxy_api_key(const kvf_proxy_config_t *cfg, char *key, size_t cap)
{
    FILE *f;
    size_t n;

    snprintf(key, cap, "%s", cfg->api_key);
    if (cfg->api_key_file[0] == '\0') {
        return KVF_OK;
    }
    if (cfg->api_key[0] != '\0') {
        kvf_error("--api-key and --api-key-file both given: use one");
        return KVF_ERR_INVALID_PARAM;
    }
    f = fopen(cfg->api_key_file, "r");
    if ((f == NULL) || (fgets(key, (int)cap, f) == NULL)) {
        kvf_error("--api-key-file %s: cannot read a key from it", cfg->api_key_file);
        if (f != NULL) {
            fclose(f);
        }
        key[0] = '\0';
        return KVF_ERR_IO;
    }
    fclose(f);
    n = strcspn(key, "\r\n");
    key[n] = '\0';
    while ((n > 0) && ((key[n - 1] == ' ') || (key[n - 1] == '\t'))) {
        key[--n] = '\0';
    }
    if (n == 0) {
        kvf_error("--api-key-file %s: the first line is empty", cfg->api_key_file);
        return KVF_ERR_INVALID_PARAM;
    }
    return KVF_OK;
}

/* The request policies of the flags (checked by kvf_proxy_check): priority scheduling, the
 * tool-call and reasoning parsers. */
static void kvf_proxy_api_policies(const kvf_proxy_config_t *cfg, kvf_proxy_openai_ctx_t *api)
{
    kvf_proxy_tool_parser_t parser = KVF_TOOL_PARSER_NONE;
    kvf_proxy_reasoning_t reasoning = KVF_REASONING_NONE;

    api->priority_scheduling = (strcmp(cfg->scheduling_policy, "priority") == 0);
    (void)kvf_proxy_tool_parser_from_name(cfg->tool_call_parser, &parser);
    api->tool_parser = (int)parser;
    api->auto_tool_choice = cfg->enable_auto_tool_choice;
    (void)kvf_proxy_reasoning_from_name(cfg->reasoning_parser, &reasoning);
    api->reasoning_parser = (int)reasoning;
}

static kvf_status_t kvf_proxy_check(const kvf_proxy_config_t *cfg)
{
    kvf_proxy_tool_parser_t parser;
    kvf_proxy_reasoning_t reasoning;

    if ((cfg->port < 0) || (cfg->port > 65535)) {
        kvf_error("bad value %d for --port: must be in [0, 65535]", cfg->port);
        return KVF_ERR_INVALID_PARAM;
    }
    if ((cfg->request_timeout <= 0) || (cfg->prefill_timeout <= 0) || (cfg->token_timeout <= 0) ||
        (cfg->health_interval <= 0) || (cfg->health_timeout <= 0) || (cfg->idle_timeout <= 0) ||
        (cfg->header_timeout <= 0) || (cfg->body_timeout <= 0) || (cfg->drain_timeout < 0)) {
        kvf_error("timeouts and the health interval must be positive");
        return KVF_ERR_INVALID_PARAM;
    }
    if ((cfg->max_connections <= 0) || (cfg->max_per_client < 0) || (cfg->max_outstanding <= 0) ||
        (cfg->max_prompt_tokens <= 0) ||
        (cfg->max_tokens_limit <= 0) || (cfg->default_max_tokens <= 0) ||
        (cfg->default_max_tokens > cfg->max_tokens_limit) || (cfg->max_body == 0)) {
        kvf_error("limits must be positive, and --default-max-tokens at most --max-tokens-limit");
        return KVF_ERR_INVALID_PARAM;
    }
    if (cfg->model_name[0] == '\0') {
        kvf_error("--model-name must not be empty");
        return KVF_ERR_INVALID_PARAM;
    }
    if ((strcmp(cfg->routing, "prefix") != 0) && (strcmp(cfg->routing, "load") != 0)) {
        kvf_error("--routing '%s' must be prefix or load", cfg->routing);
        return KVF_ERR_INVALID_PARAM;
    }
    if (!(cfg->prefix_routing_weight >= 0) || (cfg->prefix_routing_weight > 100)) {
        kvf_error("--prefix-routing-weight %g must be in 0..100", cfg->prefix_routing_weight);
        return KVF_ERR_INVALID_PARAM;
    }
    if (!(cfg->decode_prefix_routing_weight >= 0) || (cfg->decode_prefix_routing_weight > 100)) {
        kvf_error("--decode-prefix-routing-weight %g must be in 0..100",
                  cfg->decode_prefix_routing_weight);
        return KVF_ERR_INVALID_PARAM;
    }
    if ((strcmp(cfg->scheduling_policy, "fcfs") != 0) &&
        (strcmp(cfg->scheduling_policy, "priority") != 0)) {
        kvf_error("--scheduling-policy '%s' must be fcfs or priority", cfg->scheduling_policy);
        return KVF_ERR_INVALID_PARAM;
    }
    if ((cfg->tool_call_parser[0] != '\0') &&
        !kvf_proxy_tool_parser_from_name(cfg->tool_call_parser, &parser)) {
        kvf_error("--tool-call-parser '%s' is not one of hermes, llama3_json, mistral",
                  cfg->tool_call_parser);
        return KVF_ERR_INVALID_PARAM;
    }
    if ((cfg->reasoning_parser[0] != '\0') &&
        !kvf_proxy_reasoning_from_name(cfg->reasoning_parser, &reasoning)) {
        kvf_error("--reasoning-parser '%s' is not one of deepseek_r1, qwen3",
                  cfg->reasoning_parser);
        return KVF_ERR_INVALID_PARAM;
    }
    if (cfg->enable_auto_tool_choice && (cfg->tool_call_parser[0] == '\0')) {
        kvf_error("--enable-auto-tool-choice needs --tool-call-parser");
        return KVF_ERR_INVALID_PARAM;
    }
    return KVF_OK;
}

/* Max bytes of an endpoint file: 64 instances of long DNS names, with room to spare. */
#define KVF_PROXY_LIST_FILE_MAX (1u << 20)

/*
 * The endpoint list of one role: --prefill/--decode, or the file --prefill-file/
 * --decode-file names, read into a comma list (*list_p, malloc'd when read).
 * Both given is refused by name. KVF_OK, or an error naming the flag and path.
 */
static kvf_status_t kvf_proxy_endpoint_list(const char *role, const char *list,
                                            const char *path, char **owned_p,
                                            const char **list_p)
{
    FILE *f;
    char *buf, *out;
    size_t n, o = 0;
    bool comment = false, sep = true;

    *owned_p = NULL;
    *list_p = list;
    if (path[0] == '\0') {
        return KVF_OK;
    }
    if (list[0] != '\0') {
        kvf_error("--%s and --%s-file %s are both given: use one", role, role, path);
        return KVF_ERR_INVALID_PARAM;
    }
    f = fopen(path, "r");
    buf = malloc(KVF_PROXY_LIST_FILE_MAX + 1);
    out = malloc(KVF_PROXY_LIST_FILE_MAX + 1);
    if ((f == NULL) || (buf == NULL) || (out == NULL)) {
        kvf_error("cannot read --%s-file %s: %m", role, path);
        goto err;
    }
    n = fread(buf, 1, KVF_PROXY_LIST_FILE_MAX + 1, f);
    if (n > KVF_PROXY_LIST_FILE_MAX) {
        kvf_error("--%s-file %s is over %u bytes", role, path, KVF_PROXY_LIST_FILE_MAX);
        goto err;
    }
    for (size_t i = 0; i < n; ++i) {   /* commas, blanks and newlines separate; # comments */
        char c = buf[i];

        comment = (c == '#') ? true : (c == '\n') ? false : comment;
        if (comment || (c == ',') || (c == ' ') || (c == '\t') || (c == '\n') ||
            (c == '\r')) {
            sep = true;
            continue;
        }
        if (sep && (o > 0)) {
            out[o++] = ',';
        }
        sep = false;
        out[o++] = c;
    }
    out[o] = '\0';
    fclose(f);
    free(buf);
    *owned_p = out;
    *list_p = out;
    return KVF_OK;
err:
    if (f != NULL) {
        fclose(f);
    }
    free(buf);
    free(out);
    return KVF_ERR_INVALID_PARAM;
}

/* The tokenizer: --model's (its fingerprint checked against every instance's), or a
 * stand-in until the daemons' model folder is adopted (kvf_proxy_tokcheck.c). */
static kvf_status_t kvf_proxy_tok_setup(const kvf_proxy_config_t *cfg, struct kvf_proxy *proxy,
                                        kvf_proxy_pool_params_t *pp)
{
    kvf_status_t status;

    if (cfg->model[0] != '\0') {
        kvf_tok_config_t tc;

        status = kvf_tok_config_load(cfg->model, &tc);
        if (status == KVF_OK) {
            status = kvf_tokenizer_load(cfg->model, &tc, &proxy->tok);
            proxy->api.max_model_len = tc.max_position_embeddings;
        }
        if (status == KVF_OK) {
            status = kvf_tokenizer_digest(&proxy->tok, proxy->tok_hex);
        }
        if (status != KVF_OK) {
            return status;
        }
        kvf_proxy_take_tokcfg(proxy, cfg->model);
        proxy->api.tok = &proxy->tok;
        proxy->api.tok_ready = true;
        snprintf(proxy->tok_src, sizeof(proxy->tok_src), "--model %s", cfg->model);
        kvf_info("tokenizer %s (--model %s): instances with another are refused",
                 proxy->tok_hex, cfg->model);
    } else {
        /* never byte ids: the tokenizer comes from the daemons' model, or none is served */
        proxy->bytes_tok.vocab_size = 256;     /* byte ids; no BOS, no EOS */
        proxy->bytes_tok.bos_token_id = -1;
        proxy->bytes_tok.eos_token_id = -1;
        proxy->api.tok = &proxy->bytes_tok;
        proxy->api.tok_ready = false;
        snprintf(proxy->tok_src, sizeof(proxy->tok_src), "none yet: no --model, waiting for "
                 "the daemons' model folder");
        pp->adopt = kvf_proxy_adopt_tok;
        pp->adopt_ctx = proxy;
    }
    pp->tokenizer_digest = proxy->tok_hex;
    pp->tokenizer_source = proxy->tok_src;
    return KVF_OK;
}

static void kvf_proxy_tok_wait(const kvf_proxy_config_t *cfg, struct kvf_proxy *proxy)
{
    /* No --model: the tokenizer comes with the daemons' first health replies
     * (kvf_proxy_tokcheck.c); wait for them, as long as the warm-up at most, before the
     * HTTP edge opens, so that early requests are not refused for the lack of it. */
    if (!proxy->api.tok_ready &&
        ((kvf_proxy_pool_count(proxy->pool, KVF_PROXY_ROLE_PREFILL) +
          kvf_proxy_pool_count(proxy->pool, KVF_PROXY_ROLE_DECODE)) > 0)) {
        int64_t end_us = kvf_proxy_now_us() + (cfg->health_interval + cfg->health_timeout) * 1000;

        while (!proxy->api.tok_ready && (kvf_proxy_now_us() < end_us)) {
            usleep(10000);
        }
        if (!proxy->api.tok_ready) {
            kvf_warn("no --model and no instance has reported a model folder this machine can "
                     "read yet: completions get 503 until one does (/health: tokenizer)");
        }
    }
}

/* --served-model-name: the comma-separated names the API answers to, the first one reported. */
static kvf_status_t kvf_proxy_served_names(const kvf_proxy_config_t *cfg, struct kvf_proxy *proxy)
{
    char *save = NULL;

    if (cfg->served_model_name[0] == '\0') {
        return KVF_OK;
    }
    snprintf(proxy->names_buf, sizeof(proxy->names_buf), "%s", cfg->served_model_name);
    for (char *t = strtok_r(proxy->names_buf, ",", &save); t != NULL;
         t = strtok_r(NULL, ",", &save)) {
        if (proxy->api.num_names == KVF_PROXY_MAX_NAMES) {
            kvf_error("--served-model-name: more than %d names", KVF_PROXY_MAX_NAMES);
            return KVF_ERR_INVALID_PARAM;
        }
        proxy->names[proxy->api.num_names++] = t;
    }
    if (proxy->api.num_names == 0) {
        kvf_error("--served-model-name '%s': no name in it", cfg->served_model_name);
        return KVF_ERR_INVALID_PARAM;
    }
    proxy->api.names = proxy->names;
    proxy->api.model_name = proxy->names[0];
    return KVF_OK;
}

/* The request flow's pool, metrics and timeouts. */
static void kvf_proxy_flow_init(const kvf_proxy_config_t *cfg, struct kvf_proxy *proxy)
{
    proxy->flow.pool = proxy->pool;
    proxy->flow.metrics = proxy->metrics;
    proxy->flow.request_timeout_ms = cfg->request_timeout;
    proxy->flow.prefill_timeout_ms = cfg->prefill_timeout;
    proxy->flow.token_timeout_ms = cfg->token_timeout;
    proxy->flow.drain_timeout_ms = cfg->drain_timeout;
    /* a restarted proxy waits for its first probes before it refuses work */
    proxy->flow.started_us = kvf_proxy_now_us();
    proxy->flow.health_interval_ms = cfg->health_interval;
    proxy->flow.warmup_until_us = proxy->flow.started_us +
                                  (cfg->health_interval + cfg->health_timeout) * 1000;
}

static void kvf_proxy_http_params(const kvf_proxy_config_t *cfg, struct kvf_proxy *proxy,
                                  kvf_proxy_http_params_t *hp)
{
    hp->host = cfg->host;
    hp->port = cfg->port;
    hp->max_connections = (unsigned)cfg->max_connections;
    hp->max_per_client = (unsigned)cfg->max_per_client;
    hp->trusted_proxies = cfg->trusted_proxy;
    hp->api_key = proxy->api_key;
    hp->protect_metrics = cfg->protect_metrics;
    hp->tls_cert = cfg->tls_cert;
    hp->tls_key = cfg->tls_key;
    hp->max_body = cfg->max_body;
    hp->header_timeout_ms = cfg->header_timeout;
    hp->body_timeout_ms = cfg->body_timeout;
    hp->idle_timeout_ms = cfg->idle_timeout;
    hp->flow = &proxy->flow;
    hp->api = &proxy->api;
}

kvf_status_t kvf_proxy_create(const kvf_proxy_config_t *cfg, kvf_proxy_h *proxy_p)
{
    kvf_proxy_pool_params_t pp = {0};
    kvf_proxy_http_params_t hp = {0};
    struct kvf_proxy *proxy;
    kvf_status_t status;

    status = kvf_proxy_check(cfg);
    if (status != KVF_OK) {
        return status;
    }
    proxy = calloc(1, sizeof(*proxy));
    if (proxy == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    status = kvf_proxy_tok_setup(cfg, proxy, &pp);
    if (status != KVF_OK) {
        goto err_free;
    }
    status = kvf_proxy_metrics_create(&proxy->metrics);
    if (status != KVF_OK) {
        goto err_free;
    }
    status = kvf_proxy_endpoint_list("prefill", cfg->prefill, cfg->prefill_file,
                                     &proxy->prefill_list, &pp.prefill_urls);
    if (status == KVF_OK) {
        status = kvf_proxy_endpoint_list("decode", cfg->decode, cfg->decode_file,
                                         &proxy->decode_list, &pp.decode_urls);
    }
    if (status != KVF_OK) {
        goto err_metrics;
    }
    pp.health_interval_ms = cfg->health_interval;
    pp.health_timeout_ms = cfg->health_timeout;
    pp.max_outstanding = cfg->max_outstanding;
    pp.prefix_routing = (strcmp(cfg->routing, "prefix") == 0);
    pp.prefix_weight = cfg->prefix_routing_weight;
    pp.decode_prefix_weight = cfg->decode_prefix_routing_weight;
    status = kvf_proxy_pool_create(&pp, &proxy->pool);
    if (status != KVF_OK) {
        goto err_metrics;
    }
    kvf_proxy_tok_wait(cfg, proxy);
    /* One line per missing role, so a proxy started with neither says so for both. */
    if (kvf_proxy_pool_count(proxy->pool, KVF_PROXY_ROLE_PREFILL) == 0) {
        kvf_warn("no prefill instances configured (--prefill / KVF_PREFILL): /health stays 503 "
                 "and completions get 503");
    }
    if (kvf_proxy_pool_count(proxy->pool, KVF_PROXY_ROLE_DECODE) == 0) {
        kvf_warn("no decode instances configured (--decode / KVF_DECODE): /health stays 503 "
                 "and completions get 503");
    }

    kvf_proxy_flow_init(cfg, proxy);
    atomic_init(&proxy->flow.cancel, false);
    if (cfg->admission_queue_bytes > 0) {
        status = kvf_proxy_admit_create(cfg->admission_queue_bytes, &proxy->flow.admit);
        if (status != KVF_OK) {
            goto err_pool;
        }
    }

    snprintf(proxy->model_name, sizeof(proxy->model_name), "%s", cfg->model_name);
    proxy->api.model_name = proxy->model_name;
    status = kvf_proxy_served_names(cfg, proxy);
    if (status != KVF_OK) {
        goto err_pool;
    }
    proxy->api.add_bos = cfg->add_bos;
    proxy->api.max_prompt_tokens = cfg->max_prompt_tokens;
    proxy->api.max_tokens_limit = (uint32_t)cfg->max_tokens_limit;
    proxy->api.default_max_tokens = (uint32_t)cfg->default_max_tokens;
    kvf_proxy_api_policies(cfg, &proxy->api);

    status = kvf_proxy_api_key(cfg, proxy->api_key, sizeof(proxy->api_key));
    if (status != KVF_OK) {
        goto err_pool;
    }
    kvf_proxy_http_params(cfg, proxy, &hp);
    status = kvf_proxy_http_start(&hp, &proxy->http);
    if (status != KVF_OK) {
        goto err_pool;
    }
    *proxy_p = proxy;
    return KVF_OK;

err_pool:
    kvf_proxy_admit_destroy(proxy->flow.admit);
    kvf_proxy_pool_destroy(proxy->pool);
err_metrics:
    kvf_proxy_metrics_destroy(proxy->metrics);
    free(proxy->prefill_list);
    free(proxy->decode_list);
err_free:
    kvf_tokenizer_cleanup(&proxy->tok);
    kvf_proxy_tokcfg_cleanup(&proxy->tokcfg);
    free(proxy);
    return status;
}

int kvf_proxy_port(kvf_proxy_h proxy)
{
    return kvf_proxy_http_port(proxy->http);
}

void kvf_proxy_drain(kvf_proxy_h proxy)
{
    kvf_proxy_http_drain(proxy->http, proxy->flow.drain_timeout_ms);
}

void kvf_proxy_destroy(kvf_proxy_h proxy)
{
    if (proxy == NULL) {
        return;
    }
    kvf_proxy_http_stop(proxy->http);
    kvf_proxy_admit_destroy(proxy->flow.admit);   /* empty: every request has ended */
    kvf_proxy_pool_destroy(proxy->pool);
    kvf_proxy_metrics_destroy(proxy->metrics);
    free(proxy->prefill_list);
    free(proxy->decode_list);
    kvf_tokenizer_cleanup(&proxy->tok);
    kvf_proxy_tokcfg_cleanup(&proxy->tokcfg);
    free(proxy);
}
