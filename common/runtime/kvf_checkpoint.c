/*
 * Sharded and single-file checkpoints.
 *
 * Design: the index's weight_map is only used to learn which files exist and
 * to check that each listed tensor really is in its file; lookups then scan
 * the (few) open shards, so a hand-copied folder with a stale index fails
 * at open, naming the tensor, instead of loading from the wrong file.
 */
#include "kvf_checkpoint.h"
#include "kvf_json.h"
#include "kvf_log.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define KVF_CKPT_MAX_FILES 4096

struct kvf_ckpt {
    char          dir[4096];
    int           count;
    kvf_st_file_h files[KVF_CKPT_MAX_FILES];
    char         *names[KVF_CKPT_MAX_FILES];
};

static int kvf_ckpt_file_index(kvf_ckpt_h ck, const char *name)
{
    for (int i = 0; i < ck->count; ++i) {
        if (strcmp(ck->names[i], name) == 0) {
            return i;
        }
    }
    return -1;
}

static kvf_status_t kvf_ckpt_add(kvf_ckpt_h ck, const char *name)
{
    char path[8192];
    kvf_status_t status;

    if ((strchr(name, '/') != NULL) || (strcmp(name, "..") == 0) || (name[0] == '\0')) {
        kvf_error("%s: shard name '%s' must be a file name in the model folder", ck->dir, name);
        return KVF_ERR_PARSE;
    }
    if (ck->count >= KVF_CKPT_MAX_FILES) {
        kvf_error("%s: more than %d shards", ck->dir, KVF_CKPT_MAX_FILES);
        return KVF_ERR_PARSE;
    }
    snprintf(path, sizeof(path), "%s/%s", ck->dir, name);
    ck->names[ck->count] = strdup(name);
    if (ck->names[ck->count] == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    status = kvf_st_open(path, &ck->files[ck->count]);
    if (status != KVF_OK) {
        free(ck->names[ck->count]);
        return status;
    }
    ++ck->count;
    return KVF_OK;
}

static kvf_status_t kvf_ckpt_open_index(kvf_ckpt_h ck, const char *index_path)
{
    cJSON *root;
    const cJSON *map, *it;
    kvf_status_t status = kvf_json_load(index_path, 0, &root);

    if (status != KVF_OK) {
        return (status == KVF_ERR_PARSE) ? status : KVF_ERR_IO;
    }
    map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(map)) {
        kvf_error("%s: missing object 'weight_map'", index_path);
        cJSON_Delete(root);
        return KVF_ERR_PARSE;
    }
    cJSON_ArrayForEach(it, map) {
        int fi;
        if (!cJSON_IsString(it)) {
            kvf_error("%s: weight_map entry '%s' is not a file name", index_path, it->string);
            status = KVF_ERR_PARSE;
            break;
        }
        fi = kvf_ckpt_file_index(ck, it->valuestring);
        if (fi < 0) {
            status = kvf_ckpt_add(ck, it->valuestring);
            if (status != KVF_OK) {
                break;
            }
            fi = ck->count - 1;
        }
        if (kvf_st_find(ck->files[fi], it->string) == NULL) {
            kvf_error("%s: tensor '%s' is listed in %s but not found there", index_path,
                      it->string, it->valuestring);
            status = KVF_ERR_PARSE;
            break;
        }
    }
    if ((status == KVF_OK) && (ck->count == 0)) {
        kvf_error("%s: weight_map is empty", index_path);
        status = KVF_ERR_PARSE;
    }
    cJSON_Delete(root);
    return status;
}

kvf_status_t kvf_ckpt_open(const char *dir, kvf_ckpt_h *ckpt_p)
{
    kvf_ckpt_h ck = calloc(1, sizeof(*ck));
    char path[8192];
    struct stat st;
    kvf_status_t status;

    if (ck == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    snprintf(ck->dir, sizeof(ck->dir), "%s", dir);
    snprintf(path, sizeof(path), "%s/model.safetensors.index.json", dir);
    if (stat(path, &st) == 0) {
        status = kvf_ckpt_open_index(ck, path);
    } else {
        status = kvf_ckpt_add(ck, "model.safetensors");
    }
    if (status != KVF_OK) {
        kvf_ckpt_close(ck);
        return status;
    }
    *ckpt_p = ck;
    return KVF_OK;
}

void kvf_ckpt_close(kvf_ckpt_h ckpt)
{
    if (ckpt == NULL) {
        return;
    }
    for (int i = 0; i < ckpt->count; ++i) {
        kvf_st_close(ckpt->files[i]);
        free(ckpt->names[i]);
    }
    free(ckpt);
}

kvf_st_file_h kvf_ckpt_find(kvf_ckpt_h ckpt, const char *name)
{
    for (int i = 0; i < ckpt->count; ++i) {
        if (kvf_st_find(ckpt->files[i], name) != NULL) {
            return ckpt->files[i];
        }
    }
    return NULL;
}

kvf_st_file_h kvf_ckpt_need(kvf_ckpt_h ckpt, const char *name)
{
    kvf_st_file_h f = kvf_ckpt_find(ckpt, name);
    if (f == NULL) {
        kvf_error("tensor '%s' not found in %s (%d safetensors file%s)", name, ckpt->dir,
                  ckpt->count, (ckpt->count == 1) ? "" : "s");
    }
    return f;
}

int kvf_ckpt_num_files(kvf_ckpt_h ckpt)
{
    return ckpt->count;
}

size_t kvf_ckpt_bytes(kvf_ckpt_h ckpt)
{
    size_t n = 0;
    for (int i = 0; i < ckpt->count; ++i) {
        n += kvf_st_file_bytes(ckpt->files[i]);
    }
    return n;
}
