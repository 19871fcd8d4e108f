/*
 * Model digest: what a prefill/decode pair compares at handshake so that
 * two checkpoints of the same config (`kvf mkmodel --seed 1` vs `--seed 2`)
 * never pair up (issue 22 item 4; kvf_compat.c refuses differing digests).
 *
 * The digest is XXH3-128 (libxxhash) over, in name order, every file of the
 * model folder that decides what the model computes: config.json,
 * tokenizer.json, tokenizer_config.json, every *.safetensors shard and
 * *.safetensors.index.json; each contributes its name, its size (8 bytes
 * little-endian) and its bytes. It catches mistakes (the wrong checkpoint
 * on one side), not an adversary who controls a model folder: XXH3 is not
 * a cryptographic hash.
 *
 * Cache: the result is kept in <model>/.kvf-fingerprint (JSON: digest, and
 * each covered file's name, size and mtime in ns) and reused while every
 * file's size and mtime match; a file added, removed or changed recomputes
 * it. A folder that is not writable gets the digest computed on every call
 * (said at debug level). Writes are atomic (temporary file + rename).
 */
#ifndef KVF_FINGERPRINT_H
#define KVF_FINGERPRINT_H

#include "kvf_status.h"

#include <stdbool.h>
#include <stdint.h>

#define KVF_MODEL_DIGEST_HEX  32          /* hex digits of an XXH3-128 digest */
#define KVF_MODEL_PATH_MAX    256         /* bytes incl. NUL of a reported folder */
#define KVF_MODEL_DIGEST_FILE ".kvf-fingerprint"
#define KVF_MODEL_DIGEST_MAX_FILES 256    /* covered files per folder */

enum kvf_model_digest_flags {
    KVF_MODEL_DIGEST_NO_CACHE = 1u << 0,  /* neither read nor write the cache file */
};

typedef struct kvf_model_digest {
    char     hex[KVF_MODEL_DIGEST_HEX + 1];   /* lowercase hex, NUL-terminated */
    char     path[KVF_MODEL_PATH_MAX];        /* realpath() of the folder (truncated) */
    int      num_files;                       /* files covered */
    uint64_t bytes;                           /* their total size, bytes */
    bool     from_cache;                      /* reused from KVF_MODEL_DIGEST_FILE */
    bool     cache_written;                   /* computed and stored in the cache file */
    double   seconds;                         /* wall time of the call */
} kvf_model_digest_t;

/**
 * Digest of the model folder @a model_dir (see above), from the cache file
 * when it is current.
 *
 * @param [in]  flags     kvf_model_digest_flags.
 * @param [out] digest_p  Filled on KVF_OK only.
 * @return KVF_OK; KVF_ERR_NOT_FOUND when @a model_dir is not a folder or
 *         holds no config.json or no *.safetensors file (named in the log);
 *         KVF_ERR_IO when a file cannot be read or changed size while read;
 *         KVF_ERR_NO_RESOURCE past KVF_MODEL_DIGEST_MAX_FILES files;
 *         KVF_ERR_NO_MEMORY. A cache file that cannot be read, parsed or
 *         written is never an error (recomputed; logged at debug level).
 * Thread-safe (no shared state); reads every covered byte when computing.
 */
kvf_status_t kvf_model_digest(const char *model_dir, unsigned flags,
                              kvf_model_digest_t *digest_p);

#endif
