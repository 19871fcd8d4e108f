/*
 * Model digest (kvf_fingerprint.h).
 *
 * Design: scan the folder once (names, sizes, mtimes of the covered files,
 * sorted by name), compare with the cache file, and only when they differ
 * stream every file through one XXH3-128 state in 4 MiB reads. Rejected:
 * mmap of the shards (the page cache holds them either way; read() keeps
 * the address space small for a 20 GB checkpoint) and SHA-256 (about 10x
 * slower per byte, and the digest guards against mistakes, not forgery).
 */
#define XXH_STATIC_LINKING_ONLY   /* XXH3_state_t on the stack: needs its definition */
#include "kvf_fingerprint.h"

#include "kvf_log.h"
#include "kvf_time.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#define KVF_FP_READ_CHUNK (4u << 20)
#define KVF_FP_ALGORITHM  "xxh3-128"
#define KVF_FP_VERSION    1

typedef struct kvf_fp_file {
    char     name[NAME_MAX + 1];
    uint64_t size;
    int64_t  mtime_ns;
} kvf_fp_file_t;

typedef struct kvf_fp_scan {
    int           num;
    kvf_fp_file_t files[KVF_MODEL_DIGEST_MAX_FILES];
} kvf_fp_scan_t;

/* "<dir>/<name>" into @a buf (PATH_MAX); false when it does not fit. */
static bool kvf_fp_join(char *buf, const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);

    if (a + 1 + b >= PATH_MAX) {
        return false;
    }
    memcpy(buf, dir, a);
    buf[a] = '/';
    memcpy(buf + a + 1, name, b + 1);
    return true;
}

static bool kvf_fp_ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return (n >= m) && (strcmp(s + n - m, suffix) == 0);
}

/* The files that decide what the model computes (kvf_fingerprint.h). */
static bool kvf_fp_covered(const char *name)
{
    return (strcmp(name, "config.json") == 0) || (strcmp(name, "tokenizer.json") == 0) ||
           (strcmp(name, "tokenizer_config.json") == 0) ||
           kvf_fp_ends_with(name, ".safetensors") ||
           kvf_fp_ends_with(name, ".safetensors.index.json");
}

static int kvf_fp_cmp_name(const void *a, const void *b)
{
    return strcmp(((const kvf_fp_file_t *)a)->name, ((const kvf_fp_file_t *)b)->name);
}

static kvf_status_t kvf_fp_scan(const char *dir, kvf_fp_scan_t *scan)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    bool config = false, weights = false;

    scan->num = 0;
    if (d == NULL) {
        kvf_error("model digest: cannot open the model folder %s: %s", dir, strerror(errno));
        return KVF_ERR_NOT_FOUND;
    }
    while ((e = readdir(d)) != NULL) {
        char path[PATH_MAX];
        struct stat st;
        kvf_fp_file_t *f;

        if ((e->d_name[0] == '.') || !kvf_fp_covered(e->d_name)) {
            continue;
        }
        if (!kvf_fp_join(path, dir, e->d_name) || (stat(path, &st) != 0) ||
            !S_ISREG(st.st_mode)) {
            continue;                   /* a dangling link or a folder named *.json */
        }
        if (scan->num == KVF_MODEL_DIGEST_MAX_FILES) {
            closedir(d);
            kvf_error("model digest: %s holds more than %d weight/config files", dir,
                      KVF_MODEL_DIGEST_MAX_FILES);
            return KVF_ERR_NO_RESOURCE;
        }
        f = &scan->files[scan->num++];
        snprintf(f->name, sizeof(f->name), "%s", e->d_name);
        f->size = (uint64_t)st.st_size;
        f->mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000ll + st.st_mtim.tv_nsec;
        config = config || (strcmp(e->d_name, "config.json") == 0);
        weights = weights || kvf_fp_ends_with(e->d_name, ".safetensors");
    }
    closedir(d);
    if (!config || !weights) {
        kvf_error("model digest: %s holds no %s", dir,
                  !config ? "config.json" : "*.safetensors weights");
        return KVF_ERR_NOT_FOUND;
    }
    qsort(scan->files, (size_t)scan->num, sizeof(scan->files[0]), kvf_fp_cmp_name);
    return KVF_OK;
}

/* Stream one file into @a st: its name, its size (LE64), its bytes. */
static kvf_status_t kvf_fp_hash_file(const char *dir, const kvf_fp_file_t *f, uint8_t *buf,
                                     XXH3_state_t *st)
{
    char path[PATH_MAX];
    uint8_t size_le[8];
    uint64_t done = 0;
    int fd;

    fd = kvf_fp_join(path, dir, f->name) ? open(path, O_RDONLY | O_CLOEXEC) : -1;
    if (fd < 0) {
        kvf_error("model digest: cannot open %s: %s", path, strerror(errno));
        return KVF_ERR_IO;
    }
    (void)posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    for (int i = 0; i < 8; ++i) {
        size_le[i] = (uint8_t)(f->size >> (8 * i));
    }
    XXH3_128bits_update(st, f->name, strlen(f->name) + 1);
    XXH3_128bits_update(st, size_le, sizeof(size_le));
    for (;;) {
        ssize_t n = read(fd, buf, KVF_FP_READ_CHUNK);
        if ((n < 0) && (errno == EINTR)) {
            continue;
        }
        if (n < 0) {
            kvf_error("model digest: reading %s: %s", path, strerror(errno));
            close(fd);
            return KVF_ERR_IO;
        }
        if (n == 0) {
            break;
        }
        XXH3_128bits_update(st, buf, (size_t)n);
        done += (uint64_t)n;
    }
    close(fd);
    if (done != f->size) {
        kvf_error("model digest: %s changed while it was read (%llu bytes, %llu expected)",
                  path, (unsigned long long)done, (unsigned long long)f->size);
        return KVF_ERR_IO;
    }
    return KVF_OK;
}

static kvf_status_t kvf_fp_compute(const char *dir, const kvf_fp_scan_t *scan, char *hex)
{
    uint8_t *buf = malloc(KVF_FP_READ_CHUNK);
    XXH3_state_t st;
    XXH128_canonical_t canon;
    kvf_status_t status = KVF_OK;

    if (buf == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    XXH3_128bits_reset(&st);
    for (int i = 0; (i < scan->num) && (status == KVF_OK); ++i) {
        status = kvf_fp_hash_file(dir, &scan->files[i], buf, &st);
    }
    free(buf);
    if (status != KVF_OK) {
        return status;
    }
    XXH128_canonicalFromHash(&canon, XXH3_128bits_digest(&st));
    for (int i = 0; i < 16; ++i) {
        snprintf(hex + 2 * i, 3, "%02x", canon.digest[i]);
    }
    return KVF_OK;
}

static bool kvf_fp_is_hex(const char *s)
{
    if ((s == NULL) || (strlen(s) != KVF_MODEL_DIGEST_HEX)) {
        return false;
    }
    for (; *s != '\0'; ++s) {
        if (!(((*s >= '0') && (*s <= '9')) || ((*s >= 'a') && (*s <= 'f')))) {
            return false;
        }
    }
    return true;
}

/* The cached digest when the cache file describes exactly @a scan; false otherwise. */
static bool kvf_fp_cache_read(const char *cache_path, const kvf_fp_scan_t *scan, char *hex)
{
    FILE *fp = fopen(cache_path, "r");
    char text[64 * 1024];
    size_t n;
    cJSON *root, *files, *f;
    const cJSON *digest, *alg;
    bool ok = false;
    int i = 0;

    if (fp == NULL) {
        return false;
    }
    n = fread(text, 1, sizeof(text) - 1, fp);
    fclose(fp);
    text[n] = '\0';
    root = cJSON_Parse(text);
    if (root == NULL) {
        kvf_log(KVF_LOG_DEBUG, KVF_SUB_MODEL, "model digest: %s does not parse: ignored",
                cache_path);
        return false;
    }
    digest = cJSON_GetObjectItemCaseSensitive(root, "digest");
    alg = cJSON_GetObjectItemCaseSensitive(root, "algorithm");
    files = cJSON_GetObjectItemCaseSensitive(root, "files");
    if (!cJSON_IsString(alg) || (strcmp(alg->valuestring, KVF_FP_ALGORITHM) != 0) ||
        !cJSON_IsString(digest) || !kvf_fp_is_hex(digest->valuestring) ||
        !cJSON_IsArray(files) || (cJSON_GetArraySize(files) != scan->num)) {
        goto out;
    }
    cJSON_ArrayForEach(f, files) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(f, "name");
        const cJSON *size = cJSON_GetObjectItemCaseSensitive(f, "size");
        const cJSON *mtime = cJSON_GetObjectItemCaseSensitive(f, "mtime_ns");
        const kvf_fp_file_t *s = &scan->files[i++];
        /* numbers as strings: a double cannot hold every 64-bit size or ns time */
        if (!cJSON_IsString(name) || !cJSON_IsString(size) || !cJSON_IsString(mtime) ||
            (strcmp(name->valuestring, s->name) != 0) ||
            (strtoull(size->valuestring, NULL, 10) != s->size) ||
            (strtoll(mtime->valuestring, NULL, 10) != s->mtime_ns)) {
            goto out;
        }
    }
    memcpy(hex, digest->valuestring, KVF_MODEL_DIGEST_HEX + 1);
    ok = true;
out:
    cJSON_Delete(root);
    return ok;
}

/* Store @a hex for @a scan in the cache file; false (logged at debug) when not writable. */
static bool kvf_fp_cache_write(const char *dir, const char *cache_path, const kvf_fp_scan_t *scan,
                               const char *hex)
{
    char tmp[PATH_MAX], num[48];
    cJSON *root = cJSON_CreateObject(), *files = cJSON_CreateArray();
    char *text = NULL;
    bool ok = false;
    FILE *fp;
    int fd;

    if ((root == NULL) || (files == NULL)) {
        cJSON_Delete(root);
        cJSON_Delete(files);
        return false;
    }
    cJSON_AddNumberToObject(root, "kvf_fingerprint", KVF_FP_VERSION);
    cJSON_AddStringToObject(root, "algorithm", KVF_FP_ALGORITHM);
    cJSON_AddStringToObject(root, "digest", hex);
    cJSON_AddItemToObject(root, "files", files);
    for (int i = 0; i < scan->num; ++i) {
        cJSON *f = cJSON_CreateObject();
        if (f == NULL) {
            goto out;
        }
        cJSON_AddStringToObject(f, "name", scan->files[i].name);
        snprintf(num, sizeof(num), "%llu", (unsigned long long)scan->files[i].size);
        cJSON_AddStringToObject(f, "size", num);
        snprintf(num, sizeof(num), "%lld", (long long)scan->files[i].mtime_ns);
        cJSON_AddStringToObject(f, "mtime_ns", num);
        cJSON_AddItemToArray(files, f);
    }
    text = cJSON_Print(root);
    snprintf(num, sizeof(num), "%s.tmp.%ld", KVF_MODEL_DIGEST_FILE, (long)getpid());
    fd = ((text != NULL) && kvf_fp_join(tmp, dir, num)) ?
         open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644) : -1;
    if (fd < 0) {
        kvf_log(KVF_LOG_DEBUG, KVF_SUB_MODEL, "model digest: %s is not writable (%s): the "
                "digest is computed at every start", dir, strerror(errno));
        goto out;
    }
    fp = fdopen(fd, "w");
    if (fp == NULL) {
        close(fd);
    } else {
        ok = (fputs(text, fp) >= 0) && (fputc('\n', fp) != EOF);
        ok = (fclose(fp) == 0) && ok;
        ok = ok && (rename(tmp, cache_path) == 0);
    }
    if (!ok) {
        kvf_log(KVF_LOG_DEBUG, KVF_SUB_MODEL, "model digest: writing %s failed (%s)",
                cache_path, strerror(errno));
        (void)unlink(tmp);
    }
out:
    free(text);
    cJSON_Delete(root);
    return ok;
}

kvf_status_t kvf_model_digest(const char *model_dir, unsigned flags,
                              kvf_model_digest_t *digest_p)
{
    uint64_t t0 = kvf_time_now_ns();
    kvf_fp_scan_t *scan;
    kvf_model_digest_t d;
    char real[PATH_MAX], cache_path[PATH_MAX];
    size_t real_len;
    kvf_status_t status;

    if ((model_dir == NULL) || (digest_p == NULL)) {
        return KVF_ERR_INVALID_PARAM;
    }
    if (realpath(model_dir, real) == NULL) {
        kvf_error("model digest: model folder %s: %s", model_dir, strerror(errno));
        return KVF_ERR_NOT_FOUND;
    }
    scan = malloc(sizeof(*scan));
    if (scan == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    memset(&d, 0, sizeof(d));
    real_len = strlen(real);
    if (real_len >= sizeof(d.path)) {       /* for messages only: keep the tail */
        memcpy(d.path, "...", 3);
        memcpy(d.path + 3, real + real_len - (sizeof(d.path) - 4), sizeof(d.path) - 3);
    } else {
        memcpy(d.path, real, real_len + 1);
    }
    status = kvf_fp_scan(real, scan);
    if (status != KVF_OK) {
        goto out;
    }
    d.num_files = scan->num;
    for (int i = 0; i < scan->num; ++i) {
        d.bytes += scan->files[i].size;
    }
    if (!kvf_fp_join(cache_path, real, KVF_MODEL_DIGEST_FILE)) {
        flags |= KVF_MODEL_DIGEST_NO_CACHE;   /* a path that long has no room for it */
    }
    if (!(flags & KVF_MODEL_DIGEST_NO_CACHE) && kvf_fp_cache_read(cache_path, scan, d.hex)) {
        d.from_cache = true;
    } else {
        status = kvf_fp_compute(real, scan, d.hex);
        if (status != KVF_OK) {
            goto out;
        }
        d.cache_written = !(flags & KVF_MODEL_DIGEST_NO_CACHE) &&
                          kvf_fp_cache_write(real, cache_path, scan, d.hex);
    }
    d.seconds = (double)(kvf_time_now_ns() - t0) / 1e9;
    *digest_p = d;
out:
    free(scan);
    return status;
}
