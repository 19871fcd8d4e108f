/*
 * safetensors reader (mmap) and writer.
 *
 * File format: 8-byte little-endian header length N, N bytes of JSON
 * {"name": {"dtype": "F32"|"BF16"|..., "shape": [..], "data_offsets": [b, e]},
 *  "__metadata__": {...}}, then the data section; offsets are relative to the
 * start of the data section. Only F32, BF16 and F16 tensors can be loaded
 * (converted to fp32); other dtypes are listed but refused on load.
 */
#ifndef KVF_SAFETENSORS_H
#define KVF_SAFETENSORS_H

#include "kvf_status.h"
#include "kvf_dtype.h"

#include <stddef.h>
#include <stdint.h>

#define KVF_ST_MAX_DIMS 8

typedef struct kvf_st_file *kvf_st_file_h;
typedef struct kvf_st_writer *kvf_st_writer_h;

/** One tensor's header entry. Pointers stay valid while the file is open. */
typedef struct kvf_st_tensor_info {
    const char *name;
    char        dtype_name[16];      /* as in the file: "F32", "BF16", ... */
    int         ndim;
    int64_t     shape[KVF_ST_MAX_DIMS];
    size_t      nbytes;
    const void *data;                /* inside the mapping */
} kvf_st_tensor_info_t;

/**
 * Map @a path read-only and parse its header.
 * @return KVF_OK; KVF_ERR_IO when the file cannot be opened or mapped
 *         (logged with %m); KVF_ERR_PARSE for a malformed header or a tensor
 *         whose offsets fall outside the file (logged naming the tensor).
 */
kvf_status_t kvf_st_open(const char *path, kvf_st_file_h *file_p);

/** Unmap and free. NULL is a no-op. */
void kvf_st_close(kvf_st_file_h file);

/** Number of tensors in the file. */
int kvf_st_count(kvf_st_file_h file);

/** Header entry named @a name, or NULL. */
const kvf_st_tensor_info_t *kvf_st_find(kvf_st_file_h file, const char *name);

/**
 * Load tensor @a name as fp32 into @a out (numel floats, caller-owned), after
 * checking that its shape equals @a shape[0..ndim).
 *
 * @return KVF_OK; KVF_ERR_NOT_FOUND ("tensor 'x' not found in FILE");
 *         KVF_ERR_INVALID_PARAM for a shape mismatch, logged as
 *         "tensor 'x' has shape [a, b] in FILE, expected [c, d]";
 *         KVF_ERR_UNSUPPORTED for a dtype other than F32/BF16/F16.
 */
kvf_status_t kvf_st_load_f32(kvf_st_file_h file, const char *name, int ndim,
                             const int64_t *shape, float *out);

/**
 * Load rows [row_start, row_start + rows) of 2-D (or 1-D: elements) tensor
 * @a name with full shape @a shape into @a out (rows * shape[1] floats).
 * Used for column-parallel shards. Errors as kvf_st_load_f32(), plus
 * KVF_ERR_OUT_OF_RANGE for rows outside the tensor.
 */
kvf_status_t kvf_st_load_rows_f32(kvf_st_file_h file, const char *name, int ndim,
                                  const int64_t *shape, int64_t row_start, int64_t rows,
                                  float *out);

/**
 * dtype of tensor @a name as kvf_dtype_t (F32, BF16, F16).
 * @return KVF_OK; KVF_ERR_NOT_FOUND; KVF_ERR_UNSUPPORTED for another dtype.
 */
kvf_status_t kvf_st_tensor_dtype(kvf_st_file_h file, const char *name, kvf_dtype_t *dtype_p);

/**
 * Load a block of tensor @a name (full shape @a shape, checked) seen as a
 * matrix [shape[0]][row_len], row_len = product of shape[1..]: rows
 * [row_start, row_start + rows) and, of each, elements [col_start, col_start +
 * cols), into @a out ([rows][cols] contiguous) as @a dtype. @a dtype must be
 * fp32 or the tensor's own dtype (then bytes are copied as stored: bf16 stays
 * bf16). Used for column- (rows) and row-parallel (columns) shards.
 * Errors as kvf_st_load_rows_f32(); KVF_ERR_INVALID_PARAM for another dtype.
 */
kvf_status_t kvf_st_load_block(kvf_st_file_h file, const char *name, int ndim,
                               const int64_t *shape, int64_t row_start, int64_t rows,
                               int64_t col_start, int64_t cols, kvf_dtype_t dtype, void *out);

/** Path the file was opened from (valid while it is open). */
const char *kvf_st_path(kvf_st_file_h file);

/** Size of the mapped file in bytes. */
size_t kvf_st_file_bytes(kvf_st_file_h file);

/** Start a file writer; tensors are buffered in memory until finish. */
kvf_status_t kvf_st_writer_create(kvf_st_writer_h *writer_p);

/**
 * Add tensor @a name of @a shape with fp32 values @a data (copied), stored as
 * @a dtype (fp32, bf16 or fp16). KVF_ERR_INVALID_PARAM for a duplicate name.
 */
kvf_status_t kvf_st_writer_add(kvf_st_writer_h writer, const char *name, int ndim,
                               const int64_t *shape, const float *data, kvf_dtype_t dtype);

/**
 * Write the file to @a path (via a temporary file and rename) and free the
 * writer, also on error. KVF_ERR_IO on write errors (logged with %m).
 */
kvf_status_t kvf_st_writer_finish(kvf_st_writer_h writer, const char *path);

/** Free a writer without writing. NULL is a no-op. */
void kvf_st_writer_destroy(kvf_st_writer_h writer);

#endif
