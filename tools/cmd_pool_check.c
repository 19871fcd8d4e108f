/*
 * kvf pool-check: what kvf-up checks before it starts any process, with the
 * daemons' own rules (their KV dtype parser, the planner's sharding, the
 * handshake's digests), so a pool that cannot come up fails in about a
 * second naming the field instead of in a daemon's log or at the health
 * timeout:
 *   - every model folder has a config.json and (daemons) weights;
 *   - each role's --kv-dtype is one the daemons accept, and both are equal;
 *   - the layout shards the model (heads, KV heads, Mamba heads, groups);
 *   - the proxy's tokenizer is the daemons', prefill's is decode's;
 *   - prefill's and decode's folders hold the same files (the model digest
 *     the handshake compares; computed only when the folders differ);
 *   - every listed port binds on its address.
 * Every failing check prints one line; exit 0 all pass, 1 any failed, 2 bad
 * usage.
 *
 * Rejected: the same checks in kvf-up's shell (a second definition of the
 * daemons' dtype rule, the sharding rule and the digest).
 */
#define _GNU_SOURCE
#include "kvf_cmds.h"
#include "kvf_config.h"
#include "kvf_fingerprint.h"
#include "kvf_layout.h"
#include "kvf_log.h"
#include "kvf_role.h"
#include "kvf_tok_digest.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
    char layout[KVF_CONFIG_STR_MAX];
    char prefill_model[KVF_CONFIG_STR_MAX];
    char decode_model[KVF_CONFIG_STR_MAX];
    char proxy_model[KVF_CONFIG_STR_MAX];
    char prefill_kv_dtype[KVF_CONFIG_STR_MAX];
    char decode_kv_dtype[KVF_CONFIG_STR_MAX];
    char ports[KVF_CONFIG_STR_MAX];
} kvf_pc_opts_t;

#define KVF_PC_OFF(_f) offsetof(kvf_pc_opts_t, _f)

static const kvf_config_field_t kvf_pc_table[] = {
    {"LAYOUT", "", "XpYd: prefill TP X, decode TP Y", KVF_PC_OFF(layout),
     KVF_CONFIG_TYPE_STRING, 0},
    {"PREFILL_MODEL", "", "the prefill daemons' model folder", KVF_PC_OFF(prefill_model),
     KVF_CONFIG_TYPE_STRING, 0},
    {"DECODE_MODEL", "", "the decode daemons' model folder", KVF_PC_OFF(decode_model),
     KVF_CONFIG_TYPE_STRING, 0},
    {"PROXY_MODEL", "", "the proxy's model folder (its tokenizer); empty: not checked",
     KVF_PC_OFF(proxy_model), KVF_CONFIG_TYPE_STRING, 0},
    {"PREFILL_KV_DTYPE", KVF_ENGINE_KV_DTYPE_DEFAULT, "the prefill daemons' --kv-dtype",
     KVF_PC_OFF(prefill_kv_dtype), KVF_CONFIG_TYPE_STRING, 0},
    {"DECODE_KV_DTYPE", KVF_ENGINE_KV_DTYPE_DEFAULT, "the decode daemons' --kv-dtype",
     KVF_PC_OFF(decode_kv_dtype), KVF_CONFIG_TYPE_STRING, 0},
    {"PORTS", "", "NAME=ADDR:PORT,... that must bind on this machine (NAME says whose); -: "
     "read the entries from stdin, one a line",
     KVF_PC_OFF(ports), KVF_CONFIG_TYPE_STRING, 0},
    {NULL, NULL, NULL, 0, 0, 0},
};

/* The folder of a model path (a folder, or a config.json inside one). */
static void kvf_pc_folder(const char *model, char *dir, size_t cap)
{
    struct stat st;
    char tmp[PATH_MAX];

    if ((stat(model, &st) == 0) && S_ISDIR(st.st_mode)) {
        snprintf(dir, cap, "%s", model);
        return;
    }
    snprintf(tmp, sizeof(tmp), "%s", model);
    snprintf(dir, cap, "%s", dirname(tmp));
}

static bool kvf_pc_has_weights(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    bool found = false;

    if (d == NULL) {
        return false;
    }
    while (!found && ((e = readdir(d)) != NULL)) {
        size_t n = strlen(e->d_name);
        found = (n > 12) && (strcmp(e->d_name + n - 12, ".safetensors") == 0);
    }
    closedir(d);
    return found;
}

/* Both roles' KV dtypes as the daemons parse them, and equal. Returns failures. */
static int kvf_pc_dtypes(const kvf_pc_opts_t *o, kvf_dtype_t *dt)
{
    const char *text[2] = {o->prefill_kv_dtype, o->decode_kv_dtype};
    const char *role[2] = {"prefill", "decode"};
    int bad = 0;

    for (int i = 0; i < 2; ++i) {
        if (kvf_role_kv_dtype(text[i], &dt[i]) != KVF_OK) {
            printf("kv_dtype: the %s daemons refuse --kv-dtype %s (they accept fp32, bf16, "
                   "fp16, auto)\n", role[i], text[i]);
            ++bad;
        }
    }
    if ((bad == 0) && (dt[0] != dt[1])) {
        printf("kv_dtype prefill=%s decode=%s: KV cache dtypes differ; blocks cannot be copied "
               "without conversion\n", kvf_dtype_name(dt[0]), kvf_dtype_name(dt[1]));
        ++bad;
    }
    return bad;
}

/* The layout shards the model with the daemons' derived block sizes. Returns failures. */
static int kvf_pc_layout(const kvf_pc_opts_t *o, const kvf_model_config_t *cfg, kvf_dtype_t dt)
{
    kvf_cache_params_t params;
    kvf_layout_t layout;
    kvf_layout_plan_t pl;

    kvf_cache_params_default(cfg, &params);
    params.kv_dtype = dt;
    if (kvf_layout_parse(o->layout, &layout) != KVF_OK) {
        printf("layout: '%s' is not an XpYd layout (e.g. 4p2d)\n", o->layout);
        return 1;
    }
    if (kvf_layout_plan(cfg, &params, layout, 1, true, &pl) != KVF_OK) {
        printf("layout %s: the planner failed on %s\n", o->layout, o->prefill_model);
        return 1;
    }
    if (pl.verdict != KVF_VERDICT_REFUSED) {
        return 0;
    }
    if (strcmp(pl.field, "tp_size") == 0) {
        printf("layout %s: %s\n", o->layout, pl.why);
    } else {
        printf("layout %s: %s prefill=%s decode=%s: %s\n", o->layout, pl.field,
               pl.prefill_value, pl.decode_value, pl.why);
    }
    return 1;
}

/* Tokenizers: the proxy's and decode's against prefill's. Returns failures. */
static int kvf_pc_tokenizers(const kvf_pc_opts_t *o)
{
    const char *who[3] = {"prefill", "decode", "proxy"};
    const char *path[3] = {o->prefill_model, o->decode_model, o->proxy_model};
    char hex[3][KVF_TOK_DIGEST_HEX + 1];
    kvf_status_t st[3];
    int bad = 0;

    char real[3][PATH_MAX];
    bool same[3] = {false, false, false};

    for (int i = 0; i < 3; ++i) {
        char dir[PATH_MAX];
        kvf_pc_folder(path[i], dir, sizeof(dir));
        if ((path[i][0] == '\0') || (realpath(dir, real[i]) == NULL)) {
            snprintf(real[i], PATH_MAX, "%s", dir);
        }
        same[i] = (i > 0) && (strcmp(real[i], real[0]) == 0);   /* one file: nothing to load */
    }
    for (int i = 0; i < 3; ++i) {
        bool other = (i > 0) && (path[i][0] != '\0') && !same[i];
        bool needed = other || ((i == 0) && ((path[1][0] != '\0' && !same[1]) ||
                                             (path[2][0] != '\0' && !same[2])));
        st[i] = needed ? kvf_tokenizer_digest_of_model(path[i], hex[i]) : KVF_ERR_NOT_FOUND;
    }
    for (int i = 1; i < 3; ++i) {
        if ((path[i][0] == '\0') || same[i] || (st[0] != KVF_OK) || (st[i] != KVF_OK)) {
            continue;   /* the same folder, or one without tokenizer.json: nothing to compare */
        }
        if (strcmp(hex[0], hex[i]) != 0) {
            printf("tokenizer: %s=%s (%s) prefill=%s (%s): the tokenizers differ, so token ids "
                   "mean other text\n", who[i], hex[i], path[i], hex[0], path[0]);
            ++bad;
        }
    }
    return bad;
}

/* Weights in both daemons' folders; @a real gets each folder's realpath. Returns failures. */
static int kvf_pc_weights(const kvf_pc_opts_t *o, char real[2][PATH_MAX])
{
    const char *who[2] = {"prefill", "decode"};
    char dir[PATH_MAX];
    int bad = 0;

    for (int i = 0; i < 2; ++i) {
        kvf_pc_folder((i == 0) ? o->prefill_model : o->decode_model, dir, PATH_MAX);
        if (realpath(dir, real[i]) == NULL) {
            snprintf(real[i], PATH_MAX, "%s", dir);
        }
        if (!kvf_pc_has_weights(dir)) {
            printf("weights: no *.safetensors in %s (the %s model folder; a config alone "
                   "cannot be served: kvf mkmodel --config CFG --out DIR writes a seeded "
                   "checkpoint)\n", dir, who[i]);
            ++bad;
        }
    }
    return bad;
}

/* The same files on both sides (the handshake's model digest); only when the folders differ:
 * a first digest reads every weight byte, one folder needs none. Returns failures. */
static int kvf_pc_digests(char real[2][PATH_MAX])
{
    const char *who[2] = {"prefill", "decode"};
    kvf_model_digest_t dg[2];

    if (strcmp(real[0], real[1]) == 0) {
        return 0;
    }
    for (int i = 0; i < 2; ++i) {
        if (kvf_model_digest(real[i], 0, &dg[i]) != KVF_OK) {
            printf("model_digest: cannot digest the %s model folder %s\n", who[i], real[i]);
            return 1;
        }
    }
    if (strcmp(dg[0].hex, dg[1].hex) != 0) {
        printf("model_digest prefill=%s (%s) decode=%s (%s): weights or tokenizer differ\n",
               dg[0].hex, dg[0].path, dg[1].hex, dg[1].path);
        return 1;
    }
    return 0;
}

/* One NAME=ADDR:PORT entry binds on ADDR (as a daemon's listener would: SO_REUSEADDR). */
static int kvf_pc_port(char *entry)
{
    char *eq = strchr(entry, '='), *colon = strrchr(entry, ':');
    struct sockaddr_in sa = {.sin_family = AF_INET};
    int fd, one = 1, rc;
    long port;

    if ((eq == NULL) || (colon == NULL) || (colon < eq)) {
        printf("ports: bad entry '%s' (NAME=ADDR:PORT)\n", entry);
        return 1;
    }
    *eq = '\0';
    *colon = '\0';
    port = strtol(colon + 1, NULL, 10);
    if ((port < 1) || (port > 65535) || (inet_pton(AF_INET, eq + 1, &sa.sin_addr) != 1)) {
        printf("ports: %s: bad address %s:%s\n", entry, eq + 1, colon + 1);
        return 1;
    }
    sa.sin_port = htons((uint16_t)port);
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        printf("ports: socket: %s\n", strerror(errno));
        return 1;
    }
    (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    rc = bind(fd, (struct sockaddr *)&sa, sizeof(sa));
    if (rc != 0) {
        printf("port %ld on %s (%s) is not free: %s\n", port, eq + 1, entry, strerror(errno));
    }
    close(fd);
    return (rc != 0);
}

static int kvf_pc_ports(const kvf_pc_opts_t *o)
{
    char buf[KVF_CONFIG_STR_MAX];
    int bad = 0;

    if (strcmp(o->ports, "-") == 0) {   /* a pool's list outgrows one flag value */
        while (fgets(buf, sizeof(buf), stdin) != NULL) {
            buf[strcspn(buf, "\r\n")] = '\0';
            bad += (buf[0] != '\0') ? kvf_pc_port(buf) : 0;
        }
        return bad;
    }
    snprintf(buf, sizeof(buf), "%s", o->ports);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok != NULL;
         tok = strtok_r(NULL, ",", &save)) {
        bad += kvf_pc_port(tok);
    }
    return bad;
}

int kvf_cmd_pool_check(int argc, char **argv)
{
    kvf_pc_opts_t o;
    kvf_model_config_t cfg[2];
    kvf_dtype_t dt[2];
    char real[2][PATH_MAX];
    bool done;
    int bad = 0;

    memset(&o, 0, sizeof(o));
    if (kvf_config_parse(kvf_pc_table, "kvf pool-check", argc, argv, &o, &done) != KVF_OK) {
        return 2;
    }
    if (done) {
        return 0;
    }
    if ((o.layout[0] == '\0') || (o.prefill_model[0] == '\0') || (o.decode_model[0] == '\0')) {
        kvf_error("kvf pool-check: --layout, --prefill-model and --decode-model are required");
        return 2;
    }
    for (int i = 0; i < 2; ++i) {
        const char *m = (i == 0) ? o.prefill_model : o.decode_model;
        if (kvf_model_config_load(m, &cfg[i]) != KVF_OK) {
            printf("model: %s has no readable config.json (the %s daemons' --model)\n", m,
                   (i == 0) ? "prefill" : "decode");
            ++bad;
        }
    }
    bad += kvf_pc_dtypes(&o, dt);
    if (bad == 0) {
        bad += kvf_pc_layout(&o, &cfg[0], dt[1]);
    }
    if (bad == 0) {
        bad += kvf_pc_weights(&o, real);
    }
    if (bad == 0) {
        bad += kvf_pc_tokenizers(&o);
    }
    if (bad == 0) {
        bad += kvf_pc_digests(real);
    }
    bad += kvf_pc_ports(&o);
    return (bad > 0) ? 1 : 0;
}
