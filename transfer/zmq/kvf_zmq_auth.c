/*
 * CURVE keys, the pool's allowlist and the ZAP handler threads
 * (kvf_zmq_auth.h; threat model in docs/SECURITY.md).
 */
#define _GNU_SOURCE
#include "kvf_zmq_auth.h"

#include "kvf_log.h"
#include "kvf_zmq.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define KVF_ZAP_ENDPOINT   "inproc://zeromq.zap.01"
#define KVF_Z85_LEN        40
#define KVF_KEY_LEN        32
#define KVF_ZAP_MAX_CTX    64    /* contexts with a handler at once */
#define KVF_ZAP_LOGGED_MAX 512   /* refused peers remembered for log-once */
#define KVF_ZAP_FRAMES     8

typedef struct kvf_auth_member {
    char    id[KVF_ZMQ_AUTH_ID_MAX + 1];
    char    role[16];
    uint8_t pub[KVF_KEY_LEN];
} kvf_auth_member_t;

enum { KVF_AUTH_DOMAIN_SERVE, KVF_AUTH_DOMAIN_SIDE, KVF_AUTH_NUM_DOMAINS };
static const char *const kvf_auth_domains[KVF_AUTH_NUM_DOMAINS] = {"serve", "side"};

/* process-wide state; members and keys written by init/cleanup only, read
 * by handler threads under kvf_auth_lock */
static pthread_mutex_t kvf_auth_lock = PTHREAD_MUTEX_INITIALIZER;
static int  kvf_auth_mode;   /* 0 unconfigured, 1 insecure, 2 secure */
static char kvf_auth_server_pub[KVF_Z85_LEN + 1], kvf_auth_server_sec[KVF_Z85_LEN + 1];
static char kvf_auth_own_pub[KVF_Z85_LEN + 1], kvf_auth_own_sec[KVF_Z85_LEN + 1];
static kvf_auth_member_t *kvf_auth_members;
static size_t kvf_auth_num_members;
static void *kvf_auth_ctxs[KVF_ZAP_MAX_CTX];   /* contexts whose handler runs */
static uint64_t kvf_auth_logged[KVF_ZAP_LOGGED_MAX];
static size_t kvf_auth_num_logged;
static atomic_uint_fast64_t kvf_auth_refused[KVF_AUTH_NUM_DOMAINS];

static int kvf_auth_domain_idx(const char *domain)
{
    for (int i = 0; (domain != NULL) && (i < KVF_AUTH_NUM_DOMAINS); ++i) {
        if (strcmp(domain, kvf_auth_domains[i]) == 0) {
            return i;
        }
    }
    return -1;
}

/* serve: proxy and tools; side: decode (kvf_zmq_auth.h) */
static bool kvf_auth_role_allowed(int domain, const char *role)
{
    if (domain == KVF_AUTH_DOMAIN_SERVE) {
        return (strcmp(role, "proxy") == 0) || (strcmp(role, "tool") == 0);
    }
    return (domain == KVF_AUTH_DOMAIN_SIDE) && (strcmp(role, "decode") == 0);
}

static bool kvf_auth_role_known(const char *role)
{
    static const char *const roles[] = {"prefill", "decode", "proxy", "tool"};
    for (size_t i = 0; i < sizeof(roles) / sizeof(roles[0]); ++i) {
        if (strcmp(role, roles[i]) == 0) {
            return true;
        }
    }
    return false;
}

static bool kvf_auth_id_ok(const char *id)
{
    size_t n = strlen(id);
    if ((n == 0) || (n > KVF_ZMQ_AUTH_ID_MAX)) {
        return false;
    }
    for (size_t i = 0; i < n; ++i) {
        char c = id[i];
        if (!(((c >= 'a') && (c <= 'z')) || ((c >= 'A') && (c <= 'Z')) ||
              ((c >= '0') && (c <= '9')) || (c == '-') || (c == '_') || (c == '.'))) {
            return false;
        }
    }
    return (strcmp(id, "server") != 0) && (strcmp(id, "pool") != 0) && (id[0] != '.');
}

static uint64_t kvf_auth_hash(const char *a, const char *b, const void *key, size_t key_len)
{
    uint64_t h = 1469598103934665603ull;
    const char *parts[2] = {a, b};
    for (int p = 0; p < 2; ++p) {
        for (const char *c = parts[p]; (c != NULL) && (*c != '\0'); ++c) {
            h = (h ^ (uint8_t)*c) * 1099511628211ull;
        }
        h = (h ^ 0xffu) * 1099511628211ull;
    }
    for (size_t i = 0; i < key_len; ++i) {
        h = (h ^ ((const uint8_t *)key)[i]) * 1099511628211ull;
    }
    return h;
}

/* count a refusal on @a domain; true when this peer was not logged before */
static bool kvf_auth_count(int domain, uint64_t peer_hash)
{
    bool first = true;

    if ((domain >= 0) && (domain < KVF_AUTH_NUM_DOMAINS)) {
        atomic_fetch_add(&kvf_auth_refused[domain], 1);
    }
    pthread_mutex_lock(&kvf_auth_lock);
    for (size_t i = 0; i < kvf_auth_num_logged; ++i) {
        first &= (kvf_auth_logged[i] != peer_hash);
    }
    if (first && (kvf_auth_num_logged < KVF_ZAP_LOGGED_MAX)) {
        kvf_auth_logged[kvf_auth_num_logged++] = peer_hash;
        if (kvf_auth_num_logged == KVF_ZAP_LOGGED_MAX) {
            kvf_warn("auth: %d refused peers logged; further new ones are counted, not logged",
                     KVF_ZAP_LOGGED_MAX);
        }
    } else if (first) {
        first = false;
    }
    pthread_mutex_unlock(&kvf_auth_lock);
    return first;
}

void kvf_zmq_auth_note_refusal(const char *domain, const char *peer_id, const char *why)
{
    int d = kvf_auth_domain_idx(domain);

    if (kvf_auth_count(d, kvf_auth_hash(domain, peer_id, why, (why != NULL) ? strlen(why) : 0))) {
        kvf_warn("auth: %s channel refused peer '%s': %s (logged once per peer)",
                 (domain != NULL) ? domain : "?", (peer_id != NULL) ? peer_id : "?",
                 (why != NULL) ? why : "refused");
    }
}

uint64_t kvf_zmq_auth_refusals(const char *domain)
{
    uint64_t n = 0;
    int d = kvf_auth_domain_idx(domain);

    for (int i = 0; i < KVF_AUTH_NUM_DOMAINS; ++i) {
        if ((domain == NULL) || (i == d)) {
            n += atomic_load(&kvf_auth_refused[i]);
        }
    }
    return n;
}

/* ------------------------------------------------------------------ keys */

static kvf_status_t kvf_auth_check_mode(const char *path, bool secret)
{
    struct stat st;

    if (stat(path, &st) != 0) {
        kvf_error("auth: cannot read %s: %m", path);
        return KVF_ERR_IO;
    }
    if (secret && ((st.st_mode & 0007) != 0)) {
        kvf_error("auth: %s is accessible to every user (mode %03o); a secret key must be "
                  "0600 or 0400 (chmod 600 %s)", path, (unsigned)(st.st_mode & 0777), path);
        return KVF_ERR_INVALID_PARAM;
    }
    if (secret && ((st.st_mode & 0070) != 0)) {
        kvf_warn("auth: %s is readable by its group (mode %03o)", path,
                 (unsigned)(st.st_mode & 0777));
    }
    return KVF_OK;
}

static bool kvf_auth_z85_ok(const char *z85)
{
    uint8_t key[KVF_KEY_LEN];
    return (strlen(z85) == KVF_Z85_LEN) && (zmq_z85_decode(key, z85) != NULL);
}

/* a key file: "public <z85>" and "secret <z85>" */
static kvf_status_t kvf_auth_load_key(const char *dir, const char *id, char *pub, char *sec)
{
    char path[4096], line[256], word[16], z85[128];
    FILE *f;
    int lineno = 0;
    kvf_status_t status;

    snprintf(path, sizeof(path), "%s/%s.key", dir, id);
    status = kvf_auth_check_mode(path, true);
    if (status != KVF_OK) {
        return status;
    }
    f = fopen(path, "r");
    if (f == NULL) {
        kvf_error("auth: cannot open %s: %m", path);
        return KVF_ERR_IO;
    }
    pub[0] = sec[0] = '\0';
    while (fgets(line, sizeof(line), f) != NULL) {
        ++lineno;
        if ((line[0] == '#') || (line[strspn(line, " \t\r\n")] == '\0')) {
            continue;
        }
        if ((sscanf(line, "%15s %127s", word, z85) != 2) || !kvf_auth_z85_ok(z85) ||
            ((strcmp(word, "public") != 0) && (strcmp(word, "secret") != 0))) {
            kvf_error("auth: %s line %d: expected 'public <z85>' or 'secret <z85>' (40 Z85 "
                      "characters)", path, lineno);
            fclose(f);
            return KVF_ERR_INVALID_PARAM;
        }
        memcpy((word[0] == 'p') ? pub : sec, z85, KVF_Z85_LEN + 1);
    }
    fclose(f);
    if ((pub[0] == '\0') || (sec[0] == '\0')) {
        kvf_error("auth: %s lacks its %s line", path, (pub[0] == '\0') ? "public" : "secret");
        return KVF_ERR_INVALID_PARAM;
    }
    return KVF_OK;
}

static kvf_status_t kvf_auth_parse_member(const char *path, int lineno, const char *line,
                                          kvf_auth_member_t *m)
{
    char id[128], role[32], z85[128], extra[8];
    int n = sscanf(line, "%127s %31s %127s %7s", id, role, z85, extra);

    if ((n != 3) || !kvf_auth_id_ok(id) || !kvf_auth_role_known(role) || !kvf_auth_z85_ok(z85)) {
        kvf_error("auth: %s line %d: expected '<id> <role> <public-z85>' (id of 1..%d of "
                  "[A-Za-z0-9._-], role prefill|decode|proxy|tool, 40 Z85 characters)",
                  path, lineno, KVF_ZMQ_AUTH_ID_MAX);
        return KVF_ERR_INVALID_PARAM;
    }
    memcpy(m->id, id, strlen(id) + 1);   /* kvf_auth_id_ok: <= KVF_ZMQ_AUTH_ID_MAX */
    snprintf(m->role, sizeof(m->role), "%.15s", role);
    zmq_z85_decode(m->pub, z85);
    return KVF_OK;
}

static kvf_status_t kvf_auth_load_pool(const char *dir, kvf_auth_member_t **members_p,
                                       size_t *num_p)
{
    char path[4096], line[512];
    kvf_auth_member_t *members = calloc(KVF_ZMQ_AUTH_MAX_MEMBERS, sizeof(*members));
    size_t num = 0;
    int lineno = 0;
    kvf_status_t status = KVF_OK;
    FILE *f;

    if (members == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    snprintf(path, sizeof(path), "%s/pool.pub", dir);
    f = fopen(path, "r");
    if (f == NULL) {
        kvf_error("auth: cannot open %s: %m", path);
        free(members);
        return KVF_ERR_IO;
    }
    while ((status == KVF_OK) && (fgets(line, sizeof(line), f) != NULL)) {
        ++lineno;
        if ((line[0] == '#') || (line[strspn(line, " \t\r\n")] == '\0')) {
            continue;
        }
        if (num == KVF_ZMQ_AUTH_MAX_MEMBERS) {
            kvf_error("auth: %s has more than %d members", path, KVF_ZMQ_AUTH_MAX_MEMBERS);
            status = KVF_ERR_INVALID_PARAM;
            break;
        }
        status = kvf_auth_parse_member(path, lineno, line, &members[num]);
        for (size_t i = 0; (status == KVF_OK) && (i < num); ++i) {
            if (strcmp(members[i].id, members[num].id) == 0) {
                kvf_error("auth: %s line %d: member '%s' listed twice", path, lineno,
                          members[num].id);
                status = KVF_ERR_INVALID_PARAM;
            }
        }
        num += (status == KVF_OK);
    }
    fclose(f);
    if (status != KVF_OK) {
        free(members);
        return status;
    }
    *members_p = members;
    *num_p = num;
    return KVF_OK;
}

static kvf_status_t kvf_auth_load(const kvf_zmq_auth_config_t *cfg)
{
    char pub[KVF_Z85_LEN + 1];
    uint8_t own[KVF_KEY_LEN];
    const kvf_auth_member_t *me = NULL;
    kvf_status_t status;

    status = kvf_auth_load_key(cfg->keys_dir, "server", kvf_auth_server_pub, kvf_auth_server_sec);
    if (status == KVF_OK) {
        status = kvf_auth_load_key(cfg->keys_dir, cfg->key_id, kvf_auth_own_pub,
                                   kvf_auth_own_sec);
    }
    if (status == KVF_OK) {
        status = kvf_auth_load_pool(cfg->keys_dir, &kvf_auth_members, &kvf_auth_num_members);
    }
    if (status != KVF_OK) {
        return status;
    }
    memcpy(pub, kvf_auth_own_pub, sizeof(pub));
    zmq_z85_decode(own, pub);
    for (size_t i = 0; i < kvf_auth_num_members; ++i) {
        if (strcmp(kvf_auth_members[i].id, cfg->key_id) == 0) {
            me = &kvf_auth_members[i];
        }
    }
    if ((me == NULL) || (memcmp(me->pub, own, KVF_KEY_LEN) != 0)) {
        kvf_error("auth: %s/pool.pub %s member '%s' (--key-id)", cfg->keys_dir,
                  (me == NULL) ? "has no" : "lists another public key for", cfg->key_id);
        free(kvf_auth_members);
        kvf_auth_members = NULL;
        return KVF_ERR_INVALID_PARAM;
    }
    kvf_info("auth: CURVE on every tcp endpoint; key '%s' (%s), %zu pool members from %s",
             me->id, me->role, kvf_auth_num_members, cfg->keys_dir);
    return KVF_OK;
}

kvf_status_t kvf_zmq_auth_init(void *zmq_ctx, const kvf_zmq_auth_config_t *cfg)
{
    bool have_dir = (cfg != NULL) && (cfg->keys_dir != NULL) && (cfg->keys_dir[0] != '\0');
    kvf_status_t status;

    if (cfg == NULL) {
        return KVF_ERR_INVALID_PARAM;
    }
    if (kvf_auth_mode != 0) {
        kvf_error("auth: kvf_zmq_auth_init called twice");
        return KVF_ERR_BUSY;
    }
    if (cfg->insecure) {
        if (have_dir) {
            kvf_error("auth: --insecure and --keys %s together; give one of them", cfg->keys_dir);
            return KVF_ERR_INVALID_PARAM;
        }
        kvf_warn("!!! INSECURE: --insecure given: every ZeroMQ channel is plain and accepts "
                 "ANY peer that can reach its port !!!");
        kvf_warn("!!! anyone on the network can read KV addresses and keys, poison handshakes, "
                 "abort streams and get answers; use only on a closed lab network "
                 "(docs/SECURITY.md) !!!");
        kvf_auth_mode = 1;
        return KVF_OK;
    }
    if (!have_dir) {
        kvf_error("auth: no keys: give --keys DIR (a key set made by kvf-up or `kvf keygen`) "
                  "or, on a closed lab network only, --insecure");
        return KVF_ERR_INVALID_PARAM;
    }
    if ((cfg->key_id == NULL) || !kvf_auth_id_ok(cfg->key_id)) {
        kvf_error("auth: --key-id '%s' is not a member id (1..%d of [A-Za-z0-9._-])",
                  (cfg->key_id != NULL) ? cfg->key_id : "", KVF_ZMQ_AUTH_ID_MAX);
        return KVF_ERR_INVALID_PARAM;
    }
    if (!zmq_has("curve")) {
        kvf_error("auth: this libzmq was built without CURVE; install one with it "
                  "(Debian's libzmq5 has it) or run with --insecure");
        return KVF_ERR_UNSUPPORTED;
    }
    status = kvf_auth_load(cfg);
    if (status != KVF_OK) {
        return status;
    }
    kvf_auth_mode = 2;
    return (zmq_ctx != NULL) ? kvf_zmq_auth_attach(zmq_ctx) : KVF_OK;
}

void kvf_zmq_auth_cleanup(void)
{
    pthread_mutex_lock(&kvf_auth_lock);
    free(kvf_auth_members);
    kvf_auth_members = NULL;
    kvf_auth_num_members = 0;
    kvf_auth_num_logged = 0;
    kvf_auth_mode = 0;
    memset(kvf_auth_server_sec, 0, sizeof(kvf_auth_server_sec));
    memset(kvf_auth_own_sec, 0, sizeof(kvf_auth_own_sec));
    pthread_mutex_unlock(&kvf_auth_lock);
}

bool kvf_zmq_auth_secure(void)
{
    return kvf_auth_mode == 2;
}

/* ------------------------------------------------------------------- ZAP */

typedef struct kvf_zap_handler {
    void *ctx;
    void *sock;
} kvf_zap_handler_t;

/* decide one ZAP request; fills @a user_id on success */
static bool kvf_zap_decide(zmq_msg_t *f, int nf, char *user_id, size_t user_id_len,
                           const char **why_p)
{
    char domain[32] = "", mech[16] = "";
    int d;

    *why_p = "malformed ZAP request";
    if ((nf < 6) || (zmq_msg_size(&f[2]) >= sizeof(domain)) ||
        (zmq_msg_size(&f[5]) >= sizeof(mech))) {
        return false;
    }
    memcpy(domain, zmq_msg_data(&f[2]), zmq_msg_size(&f[2]));
    memcpy(mech, zmq_msg_data(&f[5]), zmq_msg_size(&f[5]));
    d = kvf_auth_domain_idx(domain);
    if ((strcmp(mech, "CURVE") != 0) || (nf != 7) || (zmq_msg_size(&f[6]) != KVF_KEY_LEN) ||
        (d < 0)) {
        *why_p = "not a CURVE client of a known channel";
        return false;
    }
    *why_p = "public key not in pool.pub";
    pthread_mutex_lock(&kvf_auth_lock);
    for (size_t i = 0; i < kvf_auth_num_members; ++i) {
        const kvf_auth_member_t *m = &kvf_auth_members[i];
        if (memcmp(m->pub, zmq_msg_data(&f[6]), KVF_KEY_LEN) != 0) {
            continue;
        }
        if (!kvf_auth_role_allowed(d, m->role)) {
            *why_p = "member's role may not use this channel";
            break;
        }
        snprintf(user_id, user_id_len, "%s", m->id);
        pthread_mutex_unlock(&kvf_auth_lock);
        return true;
    }
    pthread_mutex_unlock(&kvf_auth_lock);
    return false;
}

static void kvf_zap_send(void *sock, const void *data, size_t len, bool more)
{
    KVF_ZMQ_CHECK_IGNORE(zmq_send(sock, data, len, more ? ZMQ_SNDMORE : 0));
}

static void kvf_zap_answer(void *sock, zmq_msg_t *f, int nf)
{
    char user_id[KVF_ZMQ_AUTH_ID_MAX + 1] = "";
    const char *why = NULL;
    bool ok = kvf_zap_decide(f, nf, user_id, sizeof(user_id), &why);

    if (nf >= 2) {   /* version and request id are needed to answer at all */
        kvf_zap_send(sock, "1.0", 3, true);
        kvf_zap_send(sock, zmq_msg_data(&f[1]), zmq_msg_size(&f[1]), true);
        kvf_zap_send(sock, ok ? "200" : "400", 3, true);
        kvf_zap_send(sock, ok ? "OK" : why, strlen(ok ? "OK" : why), true);
        kvf_zap_send(sock, user_id, strlen(user_id), true);
        kvf_zap_send(sock, "", 0, false);
    }
    if (!ok) {
        char addr[64] = "?", domain[32] = "?", keyz[KVF_Z85_LEN + 1] = "none";
        if ((nf >= 4) && (zmq_msg_size(&f[3]) < sizeof(addr))) {
            memcpy(addr, zmq_msg_data(&f[3]), zmq_msg_size(&f[3]));
            addr[zmq_msg_size(&f[3])] = '\0';
        }
        if ((nf >= 3) && (zmq_msg_size(&f[2]) < sizeof(domain))) {
            memcpy(domain, zmq_msg_data(&f[2]), zmq_msg_size(&f[2]));
            domain[zmq_msg_size(&f[2])] = '\0';
        }
        if ((nf == 7) && (zmq_msg_size(&f[6]) == KVF_KEY_LEN)) {
            zmq_z85_encode(keyz, zmq_msg_data(&f[6]), KVF_KEY_LEN);
        }
        if (kvf_auth_count(kvf_auth_domain_idx(domain), kvf_auth_hash(addr, keyz, "", 0))) {
            kvf_warn("auth: %s channel refused %s with key %s: %s (logged once per address "
                     "and key)", domain, addr, keyz, why);
        }
    }
}

static void kvf_zap_forget(void *ctx)
{
    pthread_mutex_lock(&kvf_auth_lock);
    for (int i = 0; i < KVF_ZAP_MAX_CTX; ++i) {
        if (kvf_auth_ctxs[i] == ctx) {
            kvf_auth_ctxs[i] = NULL;
        }
    }
    pthread_mutex_unlock(&kvf_auth_lock);
}

/* serve ZAP requests until the context terminates (ETERM) */
static void *kvf_zap_main(void *arg)
{
    kvf_zap_handler_t *h = arg;
    bool term = false;

    while (!term) {
        zmq_msg_t f[KVF_ZAP_FRAMES];
        int nf = 0, more = 1;
        while (more) {
            zmq_msg_t part;
            zmq_msg_init(&part);
            if (zmq_msg_recv(&part, h->sock, 0) < 0) {
                zmq_msg_close(&part);
                if (zmq_errno() == EINTR) {
                    continue;
                }
                term = true;   /* ETERM: the context is ending */
                break;
            }
            more = zmq_msg_more(&part);
            if (nf < KVF_ZAP_FRAMES) {
                zmq_msg_init(&f[nf]);
                zmq_msg_move(&f[nf++], &part);
                zmq_msg_close(&part);
            } else {
                zmq_msg_close(&part);
                nf = KVF_ZAP_FRAMES + 1;   /* too many frames: malformed */
            }
        }
        if (!term) {
            kvf_zap_answer(h->sock, f, (nf > KVF_ZAP_FRAMES) ? 0 : nf);
        }
        for (int i = 0; i < ((nf > KVF_ZAP_FRAMES) ? KVF_ZAP_FRAMES : nf); ++i) {
            zmq_msg_close(&f[i]);
        }
    }
    kvf_zap_forget(h->ctx);   /* before the close lets zmq_ctx_term() return */
    zmq_close(h->sock);
    free(h);
    return NULL;
}

kvf_status_t kvf_zmq_auth_attach(void *ctx)
{
    kvf_zap_handler_t *h;
    pthread_t thread;
    pthread_attr_t attr;
    int slot = -1, linger = 0;

    if (kvf_auth_mode != 2) {
        return KVF_OK;
    }
    pthread_mutex_lock(&kvf_auth_lock);
    for (int i = 0; i < KVF_ZAP_MAX_CTX; ++i) {
        if (kvf_auth_ctxs[i] == ctx) {
            pthread_mutex_unlock(&kvf_auth_lock);
            return KVF_OK;
        }
        slot = ((slot < 0) && (kvf_auth_ctxs[i] == NULL)) ? i : slot;
    }
    if (slot < 0) {
        pthread_mutex_unlock(&kvf_auth_lock);
        kvf_error("auth: more than %d ZeroMQ contexts at once", KVF_ZAP_MAX_CTX);
        return KVF_ERR_NO_RESOURCE;
    }
    h = calloc(1, sizeof(*h));
    if (h == NULL) {
        pthread_mutex_unlock(&kvf_auth_lock);
        return KVF_ERR_NO_MEMORY;
    }
    h->ctx = ctx;
    h->sock = zmq_socket(ctx, ZMQ_REP);
    if ((h->sock == NULL) || (zmq_setsockopt(h->sock, ZMQ_LINGER, &linger, sizeof(linger)) != 0) ||
        (zmq_bind(h->sock, KVF_ZAP_ENDPOINT) != 0)) {
        kvf_error("auth: cannot start the ZAP handler: %s", zmq_strerror(zmq_errno()));
        goto err_sock;
    }
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&thread, &attr, kvf_zap_main, h) != 0) {
        pthread_attr_destroy(&attr);
        kvf_error("auth: cannot start the ZAP handler thread");
        goto err_sock;
    }
    pthread_attr_destroy(&attr);
    kvf_auth_ctxs[slot] = ctx;
    pthread_mutex_unlock(&kvf_auth_lock);
    return KVF_OK;

err_sock:
    if (h->sock != NULL) {
        zmq_close(h->sock);
    }
    free(h);
    pthread_mutex_unlock(&kvf_auth_lock);
    return KVF_ERR_ZMQ;
}

/* ------------------------------------------------- handshake failures */

/* A connection without CURVE (or with a wrong server key, or not ZeroMQ at all)
 * fails the mechanism handshake inside libzmq, before the ZAP handler is asked.
 * A monitor on each bound socket sees those failures: one detached thread per
 * socket counts them on the socket's channel and logs once per kind. It ends
 * when the socket closes (MONITOR_STOPPED) or its context terminates. */
typedef struct kvf_auth_watch {
    void *pair;            /* reads the bound socket's monitor */
    int   domain;
    char  endpoint[128];
} kvf_auth_watch_t;

static const char *kvf_auth_handshake_why(uint16_t event, uint32_t value)
{
    if (event != ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) {
        return "handshake failed (no detail)";
    }
    if (value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH) {
        return "mechanism mismatch: a client without CURVE (no pool key)";
    }
    if (value == ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC) {
        return "cryptographic error: a CURVE client with another server key";
    }
    return "malformed ZMTP handshake (not a ZeroMQ peer of this pool)";
}

static void *kvf_auth_watch_main(void *arg)
{
    kvf_auth_watch_t *w = arg;

    for (;;) {
        zmq_msg_t ev, addr;
        uint16_t event = 0;
        uint32_t value = 0;
        int rc;

        zmq_msg_init(&ev);
        rc = zmq_msg_recv(&ev, w->pair, 0);
        if ((rc < 0) && (zmq_errno() == EINTR)) {
            zmq_msg_close(&ev);
            continue;
        }
        if (rc < 0) {   /* ETERM: the context is ending */
            zmq_msg_close(&ev);
            break;
        }
        if (zmq_msg_size(&ev) >= 6) {
            memcpy(&event, zmq_msg_data(&ev), 2);
            memcpy(&value, (const uint8_t *)zmq_msg_data(&ev) + 2, 4);
        }
        zmq_msg_init(&addr);
        if (zmq_msg_more(&ev)) {
            (void)zmq_msg_recv(&addr, w->pair, 0);   /* the bound endpoint */
        }
        zmq_msg_close(&addr);
        zmq_msg_close(&ev);
        if (event == ZMQ_EVENT_MONITOR_STOPPED) {
            break;
        }
        if ((event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) ||
            (event == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL)) {
            const char *why = kvf_auth_handshake_why(event, value);
            if (kvf_auth_count(w->domain, kvf_auth_hash(kvf_auth_domains[w->domain], why, NULL,
                                                        0))) {
                kvf_warn("auth: %s channel (%s) refused a connection: %s (counted; logged "
                         "once per kind)", kvf_auth_domains[w->domain], w->endpoint, why);
            }
        }
    }
    zmq_close(w->pair);
    free(w);
    return NULL;
}

/* Start the watch of @a sock, bound on @a endpoint in @a ctx; a failure only
 * loses the count (logged), never the bind. */
static void kvf_auth_watch_start(void *ctx, void *sock, const char *endpoint, int domain)
{
    static atomic_uint seq;
    const int events = ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                       ZMQ_EVENT_MONITOR_STOPPED;
    kvf_auth_watch_t *w = calloc(1, sizeof(*w));
    char url[64];
    int linger = 0;
    pthread_t thread;
    pthread_attr_t attr;

    if (w == NULL) {
        goto err;
    }
    w->domain = domain;
    snprintf(w->endpoint, sizeof(w->endpoint), "%s", endpoint);
    snprintf(url, sizeof(url), "inproc://kvf-auth-watch-%u", atomic_fetch_add(&seq, 1u));
    if (zmq_socket_monitor(sock, url, events) != 0) {
        goto err_free;
    }
    w->pair = zmq_socket(ctx, ZMQ_PAIR);
    if ((w->pair == NULL) || (zmq_setsockopt(w->pair, ZMQ_LINGER, &linger, sizeof(linger)) != 0) ||
        (zmq_connect(w->pair, url) != 0)) {
        goto err_monitor;
    }
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&thread, &attr, kvf_auth_watch_main, w) != 0) {
        pthread_attr_destroy(&attr);
        goto err_monitor;
    }
    pthread_attr_destroy(&attr);
    return;

err_monitor:
    if (w->pair != NULL) {
        zmq_close(w->pair);
    }
    (void)zmq_socket_monitor(sock, NULL, 0);
err_free:
    free(w);
err:
    kvf_warn("auth: %s: connections failing the CURVE handshake will not be counted (%s)",
             endpoint, zmq_strerror(zmq_errno()));
}

/* ------------------------------------------------------- bind / connect */

static bool kvf_auth_plain(const char *endpoint)
{
    return (kvf_auth_mode != 2) || (strncmp(endpoint, "inproc://", 9) == 0);
}

kvf_status_t kvf_zmq_bind(void *ctx, void *sock, const char *endpoint, const char *domain)
{
    int one = 1;
    bool secure = !kvf_auth_plain(endpoint);

    if (kvf_auth_domain_idx(domain) < 0) {
        kvf_error("kvf_zmq_bind(%s): unknown channel '%s' (serve, side)", endpoint,
                  (domain != NULL) ? domain : "(null)");
        return KVF_ERR_INVALID_PARAM;
    }
    if (secure) {
        if ((zmq_setsockopt(sock, ZMQ_CURVE_SERVER, &one, sizeof(one)) != 0) ||
            (zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, kvf_auth_server_sec, KVF_Z85_LEN) != 0) ||
            (zmq_setsockopt(sock, ZMQ_ZAP_DOMAIN, domain, strlen(domain)) != 0)) {
            return KVF_ERR_ZMQ;
        }
    }
    if (zmq_bind(sock, endpoint) != 0) {
        return KVF_ERR_ZMQ;
    }
    if (secure) {
        char bound[128];
        size_t len = sizeof(bound);
        if (zmq_getsockopt(sock, ZMQ_LAST_ENDPOINT, bound, &len) != 0) {
            snprintf(bound, sizeof(bound), "%s", endpoint);
        }
        kvf_auth_watch_start(ctx, sock, bound, kvf_auth_domain_idx(domain));
    }
    return KVF_OK;
}

kvf_status_t kvf_zmq_connect(void *sock, const char *endpoint)
{
    if (!kvf_auth_plain(endpoint)) {
        if ((zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY, kvf_auth_server_pub, KVF_Z85_LEN) != 0) ||
            (zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, kvf_auth_own_pub, KVF_Z85_LEN) != 0) ||
            (zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, kvf_auth_own_sec, KVF_Z85_LEN) != 0)) {
            return KVF_ERR_ZMQ;
        }
    }
    return (zmq_connect(sock, endpoint) == 0) ? KVF_OK : KVF_ERR_ZMQ;
}

const char *kvf_zmq_msg_peer_id(zmq_msg_t *msg)
{
    if (kvf_auth_mode != 2) {
        return "insecure";
    }
    return zmq_msg_gets(msg, "User-Id");
}

/* ---------------------------------------------------------------- keygen */

static kvf_status_t kvf_auth_write(const char *dir, const char *name, const char *text)
{
    char path[4096], tmp[4200];
    int fd;
    size_t len = strlen(text);

    snprintf(path, sizeof(path), "%s/%s", dir, name);
    snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid());
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) {
        kvf_error("keygen: cannot create %s: %m", tmp);
        return KVF_ERR_IO;
    }
    if ((fchmod(fd, 0600) != 0) || (write(fd, text, len) != (ssize_t)len) || (fsync(fd) != 0)) {
        kvf_error("keygen: cannot write %s: %m", tmp);
        close(fd);
        unlink(tmp);
        return KVF_ERR_IO;
    }
    close(fd);
    if (rename(tmp, path) != 0) {
        kvf_error("keygen: cannot rename %s to %s: %m", tmp, path);
        unlink(tmp);
        return KVF_ERR_IO;
    }
    return KVF_OK;
}

/* "id" or "id:role" -> id, role (role from the id's prefix when absent) */
static kvf_status_t kvf_auth_split_member(const char *spec, char *id, char *role)
{
    const char *colon = strchr(spec, ':');
    size_t n = (colon != NULL) ? (size_t)(colon - spec) : strlen(spec);

    if (n > KVF_ZMQ_AUTH_ID_MAX) {
        kvf_error("keygen: member id '%s' is longer than %d bytes", spec, KVF_ZMQ_AUTH_ID_MAX);
        return KVF_ERR_INVALID_PARAM;
    }
    memcpy(id, spec, n);
    id[n] = '\0';
    if (colon != NULL) {
        snprintf(role, 16, "%.15s", colon + 1);
    } else {
        snprintf(role, 16, "%s", (strncmp(id, "prefill", 7) == 0) ? "prefill" :
                 (strncmp(id, "decode", 6) == 0) ? "decode" :
                 (strncmp(id, "proxy", 5) == 0) ? "proxy" : "tool");
    }
    if (!kvf_auth_id_ok(id) || !kvf_auth_role_known(role)) {
        kvf_error("keygen: bad member '%s' (id of [A-Za-z0-9._-], not 'server' or 'pool'; role "
                  "prefill|decode|proxy|tool)", spec);
        return KVF_ERR_INVALID_PARAM;
    }
    return KVF_OK;
}

static kvf_status_t kvf_auth_new_key(const char *dir, const char *id, char *pub)
{
    char sec[KVF_Z85_LEN + 1], text[128], name[KVF_ZMQ_AUTH_ID_MAX + 8];
    kvf_status_t status;

    if (zmq_curve_keypair(pub, sec) != 0) {
        kvf_error("keygen: zmq_curve_keypair failed: %s", zmq_strerror(zmq_errno()));
        return KVF_ERR_UNSUPPORTED;
    }
    snprintf(text, sizeof(text), "public %s\nsecret %s\n", pub, sec);
    snprintf(name, sizeof(name), "%s.key", id);
    status = kvf_auth_write(dir, name, text);
    memset(sec, 0, sizeof(sec));
    memset(text, 0, sizeof(text));
    return status;
}

kvf_status_t kvf_zmq_auth_keygen(const char *dir, const char *const *members,
                                 size_t num_members)
{
    char ids[KVF_ZMQ_AUTH_MAX_MEMBERS][KVF_ZMQ_AUTH_ID_MAX + 1], role[16], pub[KVF_Z85_LEN + 1];
    size_t cap = (size_t)KVF_ZMQ_AUTH_MAX_MEMBERS * (KVF_ZMQ_AUTH_ID_MAX + 64) + 256, used;
    char *pool;
    kvf_status_t status = KVF_OK;

    if ((dir == NULL) || (num_members == 0) || (num_members > KVF_ZMQ_AUTH_MAX_MEMBERS)) {
        kvf_error("keygen: give a folder and 1..%d members", KVF_ZMQ_AUTH_MAX_MEMBERS);
        return KVF_ERR_INVALID_PARAM;
    }
    if (!zmq_has("curve")) {
        kvf_error("keygen: this libzmq was built without CURVE");
        return KVF_ERR_UNSUPPORTED;
    }
    if ((mkdir(dir, 0700) != 0) && (errno != EEXIST)) {
        kvf_error("keygen: cannot create %s: %m", dir);
        return KVF_ERR_IO;
    }
    if (chmod(dir, 0700) != 0) {
        kvf_error("keygen: cannot chmod 0700 %s: %m", dir);
        return KVF_ERR_IO;
    }
    pool = malloc(cap);
    if (pool == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    used = (size_t)snprintf(pool, cap, "# kvferry pool allowlist: <id> <role> <public-z85>\n");
    status = kvf_auth_new_key(dir, "server", pub);
    for (size_t i = 0; (status == KVF_OK) && (i < num_members); ++i) {
        status = kvf_auth_split_member(members[i], ids[i], role);
        for (size_t j = 0; (status == KVF_OK) && (j < i); ++j) {
            if (strcmp(ids[i], ids[j]) == 0) {
                kvf_error("keygen: member '%s' given twice", ids[i]);
                status = KVF_ERR_INVALID_PARAM;
            }
        }
        if (status == KVF_OK) {
            status = kvf_auth_new_key(dir, ids[i], pub);
        }
        if (status == KVF_OK) {
            used += (size_t)snprintf(pool + used, cap - used, "%s %s %s\n", ids[i], role, pub);
        }
    }
    if (status == KVF_OK) {
        status = kvf_auth_write(dir, "pool.pub", pool);
    }
    free(pool);
    return status;
}
