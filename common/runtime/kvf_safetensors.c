/*
 * safetensors reader and writer.
 *
 * Design: the reader maps the whole file read-only and keeps the parsed
 * header as a flat array of kvf_st_tensor_info_t pointing into the mapping,
 * so a lookup is a linear scan over a few hundred names (load time only) and
 * no tensor data is copied until a caller asks for fp32. Conversion to fp32
 * happens on load, so the model code only ever sees fp32 weights. The writer
 * buffers converted tensors in memory (test and tiny models only) and writes
 * through a temporary file so a crashed mkmodel never leaves a half file.
 */
#include "kvf_safetensors.h"
#include "kvf_log.h"
#include "kvf_array.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

struct kvf_st_file {
    char                 *path;
    void                 *map;
    size_t                map_len;
    int                   count;
    kvf_st_tensor_info_t *tensors;
    char                 *names;     /* all names, NUL-separated */
};

static size_t kvf_st_elt_size(const char *dtype)
{
    if (strcmp(dtype, "F32") == 0 || strcmp(dtype, "I32") == 0 || strcmp(dtype, "U32") == 0) {
        return 4;
    }
    if (strcmp(dtype, "BF16") == 0 || strcmp(dtype, "F16") == 0 || strcmp(dtype, "I16") == 0) {
        return 2;
    }
    if (strcmp(dtype, "F64") == 0 || strcmp(dtype, "I64") == 0) {
        return 8;
    }
    if (strcmp(dtype, "I8") == 0 || strcmp(dtype, "U8") == 0 || strcmp(dtype, "BOOL") == 0 ||
        strncmp(dtype, "F8", 2) == 0) {
        return 1;
    }
    return 0;
}

static void kvf_st_shape_str(int ndim, const int64_t *shape, char *buf, size_t len)
{
    size_t n = (size_t)snprintf(buf, len, "[");
    for (int i = 0; (i < ndim) && (n < len); ++i) {
        n += (size_t)snprintf(buf + n, len - n, "%s%lld", i ? ", " : "", (long long)shape[i]);
    }
    if (n < len) {
        snprintf(buf + n, len - n, "]");
    }
}

static kvf_status_t kvf_st_parse_header(kvf_st_file_h f, const char *json, size_t json_len,
                                        const unsigned char *data, size_t data_len)
{
    cJSON *root = cJSON_ParseWithLength(json, json_len);
    const cJSON *it;
    size_t names_len = 0, pos = 0;
    kvf_status_t status = KVF_ERR_PARSE;
    int n = 0;

    if (!cJSON_IsObject(root)) {
        kvf_error("%s: safetensors header is not a JSON object", f->path);
        goto out;
    }
    cJSON_ArrayForEach(it, root) {
        if (strcmp(it->string, "__metadata__") != 0) {
            names_len += strlen(it->string) + 1;
            ++n;
        }
    }
    f->tensors = calloc((size_t)(n ? n : 1), sizeof(*f->tensors));
    f->names = malloc(names_len ? names_len : 1);
    if ((f->tensors == NULL) || (f->names == NULL)) {
        status = KVF_ERR_NO_MEMORY;
        goto out;
    }
    cJSON_ArrayForEach(it, root) {
        kvf_st_tensor_info_t *t;
        const cJSON *dt, *shape, *offs, *dim;
        double b, e;
        size_t numel = 1, elt;

        if (strcmp(it->string, "__metadata__") == 0) {
            continue;
        }
        t = &f->tensors[f->count];
        dt = cJSON_GetObjectItemCaseSensitive(it, "dtype");
        shape = cJSON_GetObjectItemCaseSensitive(it, "shape");
        offs = cJSON_GetObjectItemCaseSensitive(it, "data_offsets");
        if (!cJSON_IsString(dt) || !cJSON_IsArray(shape) || !cJSON_IsArray(offs) ||
            (cJSON_GetArraySize(offs) != 2) || (cJSON_GetArraySize(shape) > KVF_ST_MAX_DIMS)) {
            kvf_error("%s: tensor '%s' has a malformed header entry", f->path, it->string);
            goto out;
        }
        snprintf(t->dtype_name, sizeof(t->dtype_name), "%s", dt->valuestring);
        cJSON_ArrayForEach(dim, shape) {
            if (!cJSON_IsNumber(dim) || (dim->valuedouble < 0)) {
                kvf_error("%s: tensor '%s' has a bad shape", f->path, it->string);
                goto out;
            }
            t->shape[t->ndim++] = (int64_t)dim->valuedouble;
            numel *= (size_t)dim->valuedouble;
        }
        b = cJSON_GetArrayItem(offs, 0)->valuedouble;
        e = cJSON_GetArrayItem(offs, 1)->valuedouble;
        elt = kvf_st_elt_size(t->dtype_name);
        if ((b < 0) || (e < b) || ((size_t)e > data_len) || (elt == 0) ||
            ((size_t)(e - b) != numel * elt)) {
            kvf_error("%s: tensor '%s' (%s) has data_offsets [%.0f, %.0f] that do not match its"
                      " shape or the file size", f->path, it->string, t->dtype_name, b, e);
            goto out;
        }
        t->nbytes = (size_t)(e - b);
        t->data = data + (size_t)b;
        memcpy(f->names + pos, it->string, strlen(it->string) + 1);
        t->name = f->names + pos;
        pos += strlen(it->string) + 1;
        ++f->count;
    }
    status = KVF_OK;
out:
    cJSON_Delete(root);
    return status;
}

kvf_status_t kvf_st_open(const char *path, kvf_st_file_h *file_p)
{
    kvf_st_file_h f = calloc(1, sizeof(*f));
    struct stat st;
    uint64_t hlen = 0;
    kvf_status_t status;
    int fd = -1;

    if (f == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    f->path = strdup(path);
    if (f->path == NULL) {
        status = KVF_ERR_NO_MEMORY;
        goto err;
    }
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        kvf_error("cannot open %s: %m", path);
        status = KVF_ERR_IO;
        goto err;
    }
    if ((fstat(fd, &st) != 0) || (st.st_size < 8)) {
        kvf_error("%s is not a safetensors file (too short)", path);
        status = KVF_ERR_PARSE;
        goto err;
    }
    f->map_len = (size_t)st.st_size;
    f->map = mmap(NULL, f->map_len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (f->map == MAP_FAILED) {
        f->map = NULL;
        kvf_error("cannot map %s: %m", path);
        status = KVF_ERR_IO;
        goto err;
    }
    close(fd);
    fd = -1;
    for (int i = 0; i < 8; ++i) {
        hlen |= (uint64_t)((const unsigned char *)f->map)[i] << (8 * i);
    }
    if (hlen > f->map_len - 8) {
        kvf_error("%s: header length %llu exceeds the file size %zu", path,
                  (unsigned long long)hlen, f->map_len);
        status = KVF_ERR_PARSE;
        goto err;
    }
    status = kvf_st_parse_header(f, (const char *)f->map + 8, (size_t)hlen,
                                 (const unsigned char *)f->map + 8 + hlen,
                                 f->map_len - 8 - (size_t)hlen);
    if (status != KVF_OK) {
        goto err;
    }
    *file_p = f;
    return KVF_OK;

err:
    if (fd >= 0) {
        close(fd);
    }
    kvf_st_close(f);
    return status;
}

void kvf_st_close(kvf_st_file_h file)
{
    if (file == NULL) {
        return;
    }
    if (file->map != NULL) {
        munmap(file->map, file->map_len);
    }
    free(file->tensors);
    free(file->names);
    free(file->path);
    free(file);
}

int kvf_st_count(kvf_st_file_h file)
{
    return file->count;
}

const kvf_st_tensor_info_t *kvf_st_find(kvf_st_file_h file, const char *name)
{
    for (int i = 0; i < file->count; ++i) {
        if (strcmp(file->tensors[i].name, name) == 0) {
            return &file->tensors[i];
        }
    }
    return NULL;
}

static kvf_status_t kvf_st_lookup(kvf_st_file_h file, const char *name, int ndim,
                                  const int64_t *shape, const kvf_st_tensor_info_t **t_p)
{
    const kvf_st_tensor_info_t *t = kvf_st_find(file, name);
    bool same;

    if (t == NULL) {
        kvf_error("tensor '%s' not found in %s", name, file->path);
        return KVF_ERR_NOT_FOUND;
    }
    same = (t->ndim == ndim);
    for (int i = 0; same && (i < ndim); ++i) {
        same = (t->shape[i] == shape[i]);
    }
    if (!same) {
        char have[128], want[128];
        kvf_st_shape_str(t->ndim, t->shape, have, sizeof(have));
        kvf_st_shape_str(ndim, shape, want, sizeof(want));
        kvf_error("tensor '%s' has shape %s in %s, expected %s", name, have, file->path, want);
        return KVF_ERR_INVALID_PARAM;
    }
    if ((strcmp(t->dtype_name, "F32") != 0) && (strcmp(t->dtype_name, "BF16") != 0) &&
        (strcmp(t->dtype_name, "F16") != 0)) {
        kvf_error("tensor '%s' in %s has dtype %s; only F32, BF16 and F16 can be loaded", name,
                  file->path, t->dtype_name);
        return KVF_ERR_UNSUPPORTED;
    }
    *t_p = t;
    return KVF_OK;
}

/* Convert n elements starting at element `first` of t into out. */
static void kvf_st_convert(const kvf_st_tensor_info_t *t, size_t first, size_t n, float *out)
{
    if (strcmp(t->dtype_name, "F32") == 0) {
        memcpy(out, (const float *)t->data + first, n * sizeof(float));   /* mapping is 8-aligned + 8 */
    } else {
        kvf_dtype_t dt = (strcmp(t->dtype_name, "BF16") == 0) ? KVF_DTYPE_BF16 : KVF_DTYPE_FP16;
        for (size_t i = 0; i < n; ++i) {
            out[i] = kvf_dtype_load(t->data, dt, first + i);
        }
    }
}

kvf_status_t kvf_st_load_f32(kvf_st_file_h file, const char *name, int ndim,
                             const int64_t *shape, float *out)
{
    const kvf_st_tensor_info_t *t;
    kvf_status_t status = kvf_st_lookup(file, name, ndim, shape, &t);
    size_t numel = 1;

    if (status != KVF_OK) {
        return status;
    }
    for (int i = 0; i < ndim; ++i) {
        numel *= (size_t)shape[i];
    }
    kvf_st_convert(t, 0, numel, out);
    return KVF_OK;
}

kvf_status_t kvf_st_load_rows_f32(kvf_st_file_h file, const char *name, int ndim,
                                  const int64_t *shape, int64_t row_start, int64_t rows,
                                  float *out)
{
    const kvf_st_tensor_info_t *t;
    kvf_status_t status = kvf_st_lookup(file, name, ndim, shape, &t);
    size_t row_len = 1;

    if (status != KVF_OK) {
        return status;
    }
    if ((ndim < 1) || (row_start < 0) || (rows < 0) || (row_start + rows > shape[0])) {
        kvf_error("rows [%lld, %lld) of tensor '%s' are outside its %lld rows",
                  (long long)row_start, (long long)(row_start + rows), name,
                  (long long)((ndim > 0) ? shape[0] : 0));
        return KVF_ERR_OUT_OF_RANGE;
    }
    for (int i = 1; i < ndim; ++i) {
        row_len *= (size_t)shape[i];
    }
    kvf_st_convert(t, (size_t)row_start * row_len, (size_t)rows * row_len, out);
    return KVF_OK;
}

static bool kvf_st_dtype_of(const char *name, kvf_dtype_t *dtype_p)
{
    if (strcmp(name, "F32") == 0) {
        *dtype_p = KVF_DTYPE_FP32;
    } else if (strcmp(name, "BF16") == 0) {
        *dtype_p = KVF_DTYPE_BF16;
    } else if (strcmp(name, "F16") == 0) {
        *dtype_p = KVF_DTYPE_FP16;
    } else {
        return false;
    }
    return true;
}

kvf_status_t kvf_st_tensor_dtype(kvf_st_file_h file, const char *name, kvf_dtype_t *dtype_p)
{
    const kvf_st_tensor_info_t *t = kvf_st_find(file, name);

    if (t == NULL) {
        kvf_error("tensor '%s' not found in %s", name, file->path);
        return KVF_ERR_NOT_FOUND;
    }
    if (!kvf_st_dtype_of(t->dtype_name, dtype_p)) {
        kvf_error("tensor '%s' in %s has dtype %s; only F32, BF16 and F16 can be loaded", name,
                  file->path, t->dtype_name);
        return KVF_ERR_UNSUPPORTED;
    }
    return KVF_OK;
}

/*
 * The mapped pages of bytes [off, off + len) of tensor @a t are copied out:
 * drop them from the process (the map is read-only and never written, so a
 * later read faults them back in from the page cache). Without this a load
 * holds the mapped file and the copy at once (about 2x the file resident).
 */
static void kvf_st_drop_pages(kvf_st_file_h file, const kvf_st_tensor_info_t *t, size_t off,
                              size_t len)
{
    const size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = (uintptr_t)t->data + off, hi = lo + len;
    uintptr_t map_lo = (uintptr_t)file->map, map_hi = map_lo + file->map_len;

    lo &= ~(uintptr_t)(pg - 1);
    hi = (hi + pg - 1) & ~(uintptr_t)(pg - 1);
    lo = (lo < map_lo) ? map_lo : lo;
    hi = (hi > map_hi) ? ((map_hi + pg - 1) & ~(uintptr_t)(pg - 1)) : hi;
    if (hi > lo) {
        (void)madvise((void *)lo, (size_t)(hi - lo), MADV_DONTNEED);
    }
}

kvf_status_t kvf_st_load_block(kvf_st_file_h file, const char *name, int ndim,
                               const int64_t *shape, int64_t row_start, int64_t rows,
                               int64_t col_start, int64_t cols, kvf_dtype_t dtype, void *out)
{
    const kvf_st_tensor_info_t *t;
    kvf_status_t status = kvf_st_lookup(file, name, ndim, shape, &t);
    kvf_dtype_t have = KVF_DTYPE_FP32;
    int64_t row_len = 1;
    size_t esz;

    if (status != KVF_OK) {
        return status;
    }
    (void)kvf_st_dtype_of(t->dtype_name, &have);
    for (int i = 1; i < ndim; ++i) {
        row_len *= shape[i];
    }
    if ((ndim < 1) || (row_start < 0) || (rows < 0) || (row_start + rows > shape[0]) ||
        (col_start < 0) || (cols < 0) || (col_start + cols > row_len)) {
        kvf_error("block rows [%lld, %lld) cols [%lld, %lld) of tensor '%s' are outside its"
                  " %lld x %lld elements", (long long)row_start, (long long)(row_start + rows),
                  (long long)col_start, (long long)(col_start + cols), name,
                  (long long)((ndim > 0) ? shape[0] : 0), (long long)row_len);
        return KVF_ERR_OUT_OF_RANGE;
    }
    if ((dtype != KVF_DTYPE_FP32) && (dtype != have)) {
        kvf_error("tensor '%s' is %s and cannot be loaded as %s", name, t->dtype_name,
                  kvf_dtype_name(dtype));
        return KVF_ERR_INVALID_PARAM;
    }
    esz = kvf_dtype_size(dtype);
    for (int64_t r = 0; r < rows; ++r) {
        size_t first = (size_t)((row_start + r) * row_len + col_start);
        void *dst = (char *)out + (size_t)(r * cols) * esz;
        if (dtype == have) {
            memcpy(dst, (const char *)t->data + first * esz, (size_t)cols * esz);
        } else {
            kvf_st_convert(t, first, (size_t)cols, dst);
        }
    }
    kvf_st_drop_pages(file, t, (size_t)(row_start * row_len) * kvf_dtype_size(have),
                      (size_t)(rows * row_len) * kvf_dtype_size(have));
    return KVF_OK;
}

const char *kvf_st_path(kvf_st_file_h file)
{
    return file->path;
}

size_t kvf_st_file_bytes(kvf_st_file_h file)
{
    return file->map_len;
}

/* ---- writer ---------------------------------------------------------------- */

typedef struct {
    char       *name;
    kvf_dtype_t dtype;
    int         ndim;
    int64_t     shape[KVF_ST_MAX_DIMS];
    void       *data;
    size_t      nbytes;
} kvf_st_wtensor_t;

struct kvf_st_writer {
    kvf_st_wtensor_t *tensors;
    int               count, cap;
};

kvf_status_t kvf_st_writer_create(kvf_st_writer_h *writer_p)
{
    kvf_st_writer_h w = calloc(1, sizeof(*w));
    if (w == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    *writer_p = w;
    return KVF_OK;
}

void kvf_st_writer_destroy(kvf_st_writer_h writer)
{
    if (writer == NULL) {
        return;
    }
    for (int i = 0; i < writer->count; ++i) {
        free(writer->tensors[i].name);
        free(writer->tensors[i].data);
    }
    free(writer->tensors);
    free(writer);
}

kvf_status_t kvf_st_writer_add(kvf_st_writer_h writer, const char *name, int ndim,
                               const int64_t *shape, const float *data, kvf_dtype_t dtype)
{
    kvf_st_wtensor_t *t;
    size_t numel = 1;

    if ((ndim < 0) || (ndim > KVF_ST_MAX_DIMS) ||
        ((dtype != KVF_DTYPE_FP32) && (dtype != KVF_DTYPE_BF16) && (dtype != KVF_DTYPE_FP16))) {
        kvf_error("tensor '%s': unsupported rank %d or dtype %s", name, ndim,
                  kvf_dtype_name(dtype));
        return KVF_ERR_INVALID_PARAM;
    }
    for (int i = 0; i < writer->count; ++i) {
        if (strcmp(writer->tensors[i].name, name) == 0) {
            kvf_error("tensor '%s' added twice", name);
            return KVF_ERR_INVALID_PARAM;
        }
    }
    if (KVF_ARRAY_GROW(writer->tensors, writer->cap, writer->count + 1, 64) != KVF_OK) {
        return KVF_ERR_NO_MEMORY;
    }
    t = &writer->tensors[writer->count];
    memset(t, 0, sizeof(*t));
    for (int i = 0; i < ndim; ++i) {
        t->shape[i] = shape[i];
        numel *= (size_t)shape[i];
    }
    t->ndim = ndim;
    t->dtype = dtype;
    t->nbytes = numel * kvf_dtype_size(dtype);
    t->name = strdup(name);
    t->data = malloc(t->nbytes ? t->nbytes : 1);
    if ((t->name == NULL) || (t->data == NULL)) {
        free(t->name);
        free(t->data);
        return KVF_ERR_NO_MEMORY;
    }
    for (size_t i = 0; i < numel; ++i) {
        kvf_dtype_store(t->data, dtype, i, data[i]);
    }
    ++writer->count;
    return KVF_OK;
}

static const char *kvf_st_dtype_tag(kvf_dtype_t d)
{
    return (d == KVF_DTYPE_FP32) ? "F32" : (d == KVF_DTYPE_BF16) ? "BF16" : "F16";
}

kvf_status_t kvf_st_writer_finish(kvf_st_writer_h writer, const char *path)
{
    cJSON *root = cJSON_CreateObject();
    char tmp[4096];
    char *json = NULL;
    size_t off = 0, jlen, padded;
    unsigned char lenbuf[8];
    kvf_status_t status = KVF_ERR_NO_MEMORY;
    FILE *f = NULL;

    if (root == NULL) {
        goto out;
    }
    for (int i = 0; i < writer->count; ++i) {
        kvf_st_wtensor_t *t = &writer->tensors[i];
        cJSON *e = cJSON_AddObjectToObject(root, t->name);
        cJSON *shape, *offs;
        if (e == NULL) {
            goto out;
        }
        cJSON_AddStringToObject(e, "dtype", kvf_st_dtype_tag(t->dtype));
        shape = cJSON_AddArrayToObject(e, "shape");
        offs = cJSON_AddArrayToObject(e, "data_offsets");
        if ((shape == NULL) || (offs == NULL)) {
            goto out;
        }
        for (int d = 0; d < t->ndim; ++d) {
            cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->shape[d]));
        }
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(off + t->nbytes)));
        off += t->nbytes;
    }
    {
        cJSON *meta = cJSON_AddObjectToObject(root, "__metadata__");
        if (meta != NULL) {
            cJSON_AddStringToObject(meta, "format", "pt");
        }
    }
    json = cJSON_PrintUnformatted(root);
    if (json == NULL) {
        goto out;
    }
    jlen = strlen(json);
    padded = (jlen + 7) & ~(size_t)7;   /* data section 8-byte aligned, padding is spaces */
    for (int i = 0; i < 8; ++i) {
        lenbuf[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    }
    snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid());
    f = fopen(tmp, "wb");
    if (f == NULL) {
        kvf_error("cannot create %s: %m", tmp);
        status = KVF_ERR_IO;
        goto out;
    }
    status = KVF_ERR_IO;
    if (fwrite(lenbuf, 1, 8, f) != 8 || fwrite(json, 1, jlen, f) != jlen) {
        goto io_err;
    }
    for (size_t i = jlen; i < padded; ++i) {
        if (fputc(' ', f) == EOF) {
            goto io_err;
        }
    }
    for (int i = 0; i < writer->count; ++i) {
        if (fwrite(writer->tensors[i].data, 1, writer->tensors[i].nbytes, f) !=
            writer->tensors[i].nbytes) {
            goto io_err;
        }
    }
    if (fclose(f) != 0) {
        f = NULL;
        goto io_err;
    }
    f = NULL;
    if (rename(tmp, path) != 0) {
        goto io_err;
    }
    status = KVF_OK;
    goto out;

io_err:
    kvf_error("cannot write %s: %m", tmp);
    if (f != NULL) {
        fclose(f);
    }
    unlink(tmp);
out:
    free(json);
    cJSON_Delete(root);
    kvf_st_writer_destroy(writer);
    return status;
}
