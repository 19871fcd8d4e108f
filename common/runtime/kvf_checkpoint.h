/*
 * A model folder's weights: one model.safetensors, or the shards named by
 * model.safetensors.index.json (as transformers' save_pretrained writes them
 * above its max_shard_size), seen as one set of named tensors.
 */
#ifndef KVF_CHECKPOINT_H
#define KVF_CHECKPOINT_H

#include "kvf_safetensors.h"

typedef struct kvf_ckpt *kvf_ckpt_h;

/**
 * Open @a dir's checkpoint: model.safetensors.index.json when present (every
 * shard it names is mapped, and every tensor of its weight_map must be in the
 * shard it names), else model.safetensors.
 * @return KVF_OK; KVF_ERR_IO (neither file, or a shard missing; logged with
 *         the path); KVF_ERR_PARSE for a malformed index or shard (logged
 *         naming the file and entry).
 */
kvf_status_t kvf_ckpt_open(const char *dir, kvf_ckpt_h *ckpt_p);

/** Unmap every shard. NULL is a no-op. */
void kvf_ckpt_close(kvf_ckpt_h ckpt);

/** The shard holding tensor @a name, or NULL (nothing logged). */
kvf_st_file_h kvf_ckpt_find(kvf_ckpt_h ckpt, const char *name);

/**
 * The shard holding @a name; when none does, logs "tensor 'x' not found in
 * DIR" and returns NULL.
 */
kvf_st_file_h kvf_ckpt_need(kvf_ckpt_h ckpt, const char *name);

/** Number of safetensors files (1 for an unsharded checkpoint). */
int kvf_ckpt_num_files(kvf_ckpt_h ckpt);

/** Bytes of all safetensors files together. */
size_t kvf_ckpt_bytes(kvf_ckpt_h ckpt);

#endif
