/*
 * TEST ONLY: the same-node path (CUDA IPC, transfer/ucx/kvf_connector_ipc.c) between
 * simulated GPUs, so `kvf-devsim bench --device cuda:0 --path ipc` runs the path's host side
 * on a machine without a GPU: what a pull costs the host (plan, op list, launch) is measured
 * there, and the row tests/gpu/run.sh prints for it can be checked. Opt-in: DEVSIM_IPC=1
 * (without it every call below is the real one, which says "no CUDA", and pulls stay UCX).
 *
 * With it: kvf_device_alloc gives shared memory (a memfd mapped here), an IPC handle names
 * (process id, descriptor, length), and opening one maps /proc/<pid>/fd/<fd> (the process
 * that opens must be allowed to read the exporter's descriptors: kvf bench's decode, the
 * parent of its prefill child, is). The GPU's UUID is "devsim-gpu-NN". A gather is what a
 * stream does with it: the op list is copied (the upload) and runs at the next event query
 * or sync of any simulated stream, not inside the call, so the caller's host time is its
 * own; every op's addresses must be simulated device memory then (counted otherwise, as a
 * GPU would fault). Events are done once what was enqueued before them ran.
 */
#define _GNU_SOURCE
#include "kvf_devsim_int.h"
#include "kvf_device_ipc.h"
#include "kvf_gather.h"
#include "kvf_gather_tmpl.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define DEVSIM_IPC_MAGIC "kvf-devsim1"

typedef struct devsim_ipc_handle {
    char     magic[12];
    int32_t  pid;
    int32_t  fd;
    uint64_t len;
    int32_t  ordinal;
} devsim_ipc_handle_t;

typedef struct devsim_pending {
    struct devsim_pending    *next;
    size_t                    n;
    const kvf_gather_table_t *table;   /* set: n jobs of a template gather, else n ops */
    kvf_gather_job_t         *jobs;
    kvf_gather_op_t           ops[];
} devsim_pending_t;

static int ipc_on = -1;
static pthread_mutex_t pending_lock = PTHREAD_MUTEX_INITIALIZER;
static devsim_pending_t *pending_head, **pending_tail = &pending_head;

bool devsim_ipc_on(void)
{
    if (ipc_on < 0) {
        const char *e = getenv("DEVSIM_IPC");
        ipc_on = (e != NULL) && (strcmp(e, "1") == 0);
    }
    return ipc_on == 1;
}

void *devsim_ipc_alloc(size_t len, int *fd_p)
{
    int fd = memfd_create("devsim-gpu", MFD_CLOEXEC);
    void *p;

    if (fd < 0) {
        return NULL;
    }
    if (ftruncate(fd, (off_t)len) != 0) {
        close(fd);
        return NULL;
    }
    p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        close(fd);
        return NULL;
    }
    *fd_p = fd;
    return p;
}

void devsim_ipc_release(void *p, size_t len, int fd)
{
    if (fd >= 0) {
        munmap(p, len);
        close(fd);
    } else {
        free(p);
    }
}

int __real_kvf_gather_tmpl_run(const kvf_device_t *dev, const kvf_gather_table_t *table,
                               kvf_gather_job_t *jobs, kvf_gather_job_t *dev_jobs, size_t n);

void devsim_ipc_flush(void)
{
    kvf_device_t cpu = kvf_device_cpu();
    devsim_pending_t *list;

    pthread_mutex_lock(&pending_lock);
    list = pending_head;
    pending_head = NULL;
    pending_tail = &pending_head;
    pthread_mutex_unlock(&pending_lock);
    while (list != NULL) {
        devsim_pending_t *next = list->next;
        if (list->table != NULL) {   /* the kernel's body: kvf_gather_tmpl_op() per op */
            (void)__real_kvf_gather_tmpl_run(&cpu, list->table, list->jobs, NULL, list->n);
            free(list->jobs);
            free(list);
            list = next;
            continue;
        }
        for (size_t i = 0; i < list->n; ++i) {
            devsim_want_dev_fn((const void *)(uintptr_t)list->ops[i].dst, "kvf_gather dst");
            if (list->ops[i].src != 0) {
                devsim_want_dev_fn((const void *)(uintptr_t)list->ops[i].src, "kvf_gather src");
            }
        }
        (void)kvf_gather(&cpu, list->ops, list->n);   /* the CPU twin: memcpy / memset */
        free(list);
        list = next;
    }
}

static void devsim_uuid(int ordinal, uint8_t *uuid)
{
    char s[KVF_DEVICE_UUID_BYTES + 1];

    memset(uuid, 0, KVF_DEVICE_UUID_BYTES);
    snprintf(s, sizeof(s), "devsim-gpu-%02d", ordinal);
    memcpy(uuid, s, strlen(s));
}

int __real_kvf_device_ipc_export(const kvf_device_t *dev, const void *ptr, size_t len,
                                 kvf_ipc_export_t *exp_p);
int __wrap_kvf_device_ipc_export(const kvf_device_t *dev, const void *ptr, size_t len,
                                 kvf_ipc_export_t *exp_p);
int __wrap_kvf_device_ipc_export(const kvf_device_t *dev, const void *ptr, size_t len,
                                 kvf_ipc_export_t *exp_p)
{
    devsim_ipc_handle_t h;
    uintptr_t lo, hi;
    int ord, fd;

    if (!devsim_is_cuda(dev) || !devsim_ipc_on()) {
        return __real_kvf_device_ipc_export(dev, ptr, len, exp_p);
    }
    if ((ptr == NULL) || (len == 0) || (exp_p == NULL)) {
        return KVF_KERN_EINVAL;
    }
    if (!devsim_range_find(ptr, &lo, &hi, &ord, &fd) || (fd < 0) ||
        (len > hi - (uintptr_t)ptr)) {
        return KVF_KERN_EINVAL;   /* not (all) in one allocation of this process */
    }
    memset(&h, 0, sizeof(h));
    memcpy(h.magic, DEVSIM_IPC_MAGIC, sizeof(h.magic));
    h.pid = (int32_t)getpid();
    h.fd = fd;
    h.len = hi - lo;
    h.ordinal = ord;
    memset(exp_p, 0, sizeof(*exp_p));
    memcpy(exp_p->handle, &h, sizeof(h));
    exp_p->offset = (uint64_t)((uintptr_t)ptr - lo);
    devsim_uuid(ord, exp_p->uuid);
    return KVF_KERN_OK;
}

int __real_kvf_device_ipc_open(const kvf_device_t *dev, const uint8_t *handle, void **base_p,
                               size_t *len_p);
int __wrap_kvf_device_ipc_open(const kvf_device_t *dev, const uint8_t *handle, void **base_p,
                               size_t *len_p);
int __wrap_kvf_device_ipc_open(const kvf_device_t *dev, const uint8_t *handle, void **base_p,
                               size_t *len_p)
{
    devsim_ipc_handle_t h;
    char path[64];
    void *p;
    int fd;

    if (!devsim_is_cuda(dev) || !devsim_ipc_on()) {
        return __real_kvf_device_ipc_open(dev, handle, base_p, len_p);
    }
    if ((handle == NULL) || (base_p == NULL) || (len_p == NULL)) {
        return KVF_KERN_EINVAL;
    }
    memcpy(&h, handle, sizeof(h));
    if ((memcmp(h.magic, DEVSIM_IPC_MAGIC, sizeof(h.magic)) != 0) || (h.len == 0)) {
        return KVF_KERN_EINVAL;
    }
    snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)h.pid, (int)h.fd);
    fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        return KVF_KERN_ECUDA;   /* as cudaIpcOpenMemHandle failing */
    }
    p = mmap(NULL, (size_t)h.len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        return KVF_KERN_ECUDA;
    }
    if (devsim_range_map(p, (size_t)h.len, dev->ordinal, true) != KVF_KERN_OK) {
        munmap(p, (size_t)h.len);
        return KVF_KERN_ENOMEM;
    }
    *base_p = p;
    *len_p = (size_t)h.len;
    return KVF_KERN_OK;
}

void __real_kvf_device_ipc_close(const kvf_device_t *dev, void *base);
void __wrap_kvf_device_ipc_close(const kvf_device_t *dev, void *base);
void __wrap_kvf_device_ipc_close(const kvf_device_t *dev, void *base)
{
    uintptr_t lo, hi;
    int ord, fd;

    if (!devsim_is_cuda(dev) || !devsim_ipc_on()) {
        __real_kvf_device_ipc_close(dev, base);
        return;
    }
    if ((base != NULL) && devsim_range_find(base, &lo, &hi, &ord, &fd) &&
        (lo == (uintptr_t)base)) {
        devsim_range_map(base, 0, 0, false);
        munmap(base, hi - lo);
    }
}

bool __real_kvf_device_uuid_visible(const uint8_t *uuid);
bool __wrap_kvf_device_uuid_visible(const uint8_t *uuid);
bool __wrap_kvf_device_uuid_visible(const uint8_t *uuid)
{
    const char *e = getenv("DEVSIM_GPUS");
    long gpus = (e != NULL) ? strtol(e, NULL, 10) : 1;

    if (!devsim_ipc_on()) {
        return __real_kvf_device_uuid_visible(uuid);
    }
    for (long g = 0; (uuid != NULL) && (g < gpus) && (g < 64); ++g) {
        uint8_t u[KVF_DEVICE_UUID_BYTES];
        devsim_uuid((int)g, u);
        if (memcmp(u, uuid, sizeof(u)) == 0) {
            return true;
        }
    }
    return false;
}

int __real_kvf_device_event_record(const kvf_device_t *dev, void **event_p);
int __wrap_kvf_device_event_record(const kvf_device_t *dev, void **event_p);
int __wrap_kvf_device_event_record(const kvf_device_t *dev, void **event_p)
{
    if (!devsim_is_cuda(dev) || !devsim_ipc_on()) {
        return __real_kvf_device_event_record(dev, event_p);
    }
    if (event_p == NULL) {
        return KVF_KERN_EINVAL;
    }
    *event_p = malloc(1);   /* done once the work before it ran: the next query runs it */
    return (*event_p != NULL) ? KVF_KERN_OK : KVF_KERN_ENOMEM;
}

int __real_kvf_device_event_query(const kvf_device_t *dev, void *event, bool *done_p);
int __wrap_kvf_device_event_query(const kvf_device_t *dev, void *event, bool *done_p);
int __wrap_kvf_device_event_query(const kvf_device_t *dev, void *event, bool *done_p)
{
    if (!devsim_is_cuda(dev) || !devsim_ipc_on()) {
        return __real_kvf_device_event_query(dev, event, done_p);
    }
    if (done_p == NULL) {
        return KVF_KERN_EINVAL;
    }
    devsim_ipc_flush();
    *done_p = true;
    return KVF_KERN_OK;
}

void __real_kvf_device_event_destroy(const kvf_device_t *dev, void *event);
void __wrap_kvf_device_event_destroy(const kvf_device_t *dev, void *event);
void __wrap_kvf_device_event_destroy(const kvf_device_t *dev, void *event)
{
    if (!devsim_is_cuda(dev) || !devsim_ipc_on()) {
        __real_kvf_device_event_destroy(dev, event);
        return;
    }
    free(event);
}

int __real_kvf_device_host_alloc(const kvf_device_t *dev, size_t bytes, void **ptr_p);
int __wrap_kvf_device_host_alloc(const kvf_device_t *dev, size_t bytes, void **ptr_p);
int __wrap_kvf_device_host_alloc(const kvf_device_t *dev, size_t bytes, void **ptr_p)
{
    kvf_device_t cpu = kvf_device_cpu();

    if (!devsim_is_cuda(dev) || !devsim_ipc_on()) {
        return __real_kvf_device_host_alloc(dev, bytes, ptr_p);
    }
    return __real_kvf_device_host_alloc(&cpu, bytes, ptr_p);   /* "pinned" host memory */
}

void __real_kvf_device_host_free(const kvf_device_t *dev, void *ptr);
void __wrap_kvf_device_host_free(const kvf_device_t *dev, void *ptr);
void __wrap_kvf_device_host_free(const kvf_device_t *dev, void *ptr)
{
    kvf_device_t cpu = kvf_device_cpu();

    if (!devsim_is_cuda(dev) || !devsim_ipc_on()) {
        __real_kvf_device_host_free(dev, ptr);
        return;
    }
    __real_kvf_device_host_free(&cpu, ptr);
}

/* Enqueue @n ops on the simulated stream: copied now (the upload), run at the next query. */
static int devsim_gather_enqueue(const kvf_gather_op_t *ops, size_t n)
{
    devsim_pending_t *p;

    if ((ops == NULL) && (n > 0)) {
        return KVF_KERN_EINVAL;
    }
    p = malloc(sizeof(*p) + n * sizeof(*ops));
    if (p == NULL) {
        return KVF_KERN_ENOMEM;
    }
    p->next = NULL;
    p->n = n;
    p->table = NULL;
    p->jobs = NULL;
    memcpy(p->ops, ops, n * sizeof(*ops));
    pthread_mutex_lock(&pending_lock);
    *pending_tail = p;
    pending_tail = &p->next;
    pthread_mutex_unlock(&pending_lock);
    atomic_fetch_add(&st_kernels, 1);
    return KVF_KERN_OK;
}

int __real_kvf_gather(const kvf_device_t *dev, const kvf_gather_op_t *ops, size_t n);
int __wrap_kvf_gather(const kvf_device_t *dev, const kvf_gather_op_t *ops, size_t n);
int __wrap_kvf_gather(const kvf_device_t *dev, const kvf_gather_op_t *ops, size_t n)
{
    if (!devsim_is_cuda(dev) || !devsim_ipc_on()) {
        return __real_kvf_gather(dev, ops, n);
    }
    return devsim_gather_enqueue(ops, n);
}

int __real_kvf_gather_staged(const kvf_device_t *dev, const kvf_gather_op_t *host_ops,
                             kvf_gather_op_t *dev_ops, size_t n);
int __wrap_kvf_gather_staged(const kvf_device_t *dev, const kvf_gather_op_t *host_ops,
                             kvf_gather_op_t *dev_ops, size_t n);
int __wrap_kvf_gather_staged(const kvf_device_t *dev, const kvf_gather_op_t *host_ops,
                             kvf_gather_op_t *dev_ops, size_t n)
{
    if (!devsim_is_cuda(dev) || !devsim_ipc_on()) {
        return __real_kvf_gather_staged(dev, host_ops, dev_ops, n);
    }
    if (dev_ops == NULL) {
        return KVF_KERN_EINVAL;
    }
    devsim_want_dev_fn(dev_ops, "kvf_gather_staged dev_ops");
    return devsim_gather_enqueue(host_ops, n);
}

/* A template gather's table: host arrays (the simulated device is this process's memory). */
int __real_kvf_gather_table_create(const kvf_device_t *dev, const kvf_gather_table_desc_t *desc,
                                   kvf_gather_table_t **table_p);
int __wrap_kvf_gather_table_create(const kvf_device_t *dev, const kvf_gather_table_desc_t *desc,
                                   kvf_gather_table_t **table_p);
int __wrap_kvf_gather_table_create(const kvf_device_t *dev, const kvf_gather_table_desc_t *desc,
                                   kvf_gather_table_t **table_p)
{
    kvf_device_t cpu = kvf_device_cpu();

    if (!devsim_is_cuda(dev) || !devsim_ipc_on()) {
        return __real_kvf_gather_table_create(dev, desc, table_p);
    }
    return __real_kvf_gather_table_create(&cpu, desc, table_p);
}

/* The jobs uploaded now (copied), the kernel run at the next query or sync, as a stream. */
int __wrap_kvf_gather_tmpl_run(const kvf_device_t *dev, const kvf_gather_table_t *table,
                               kvf_gather_job_t *jobs, kvf_gather_job_t *dev_jobs, size_t n);
int __wrap_kvf_gather_tmpl_run(const kvf_device_t *dev, const kvf_gather_table_t *table,
                               kvf_gather_job_t *jobs, kvf_gather_job_t *dev_jobs, size_t n)
{
    devsim_pending_t *p;

    if (!devsim_is_cuda(dev) || !devsim_ipc_on()) {
        return __real_kvf_gather_tmpl_run(dev, table, jobs, dev_jobs, n);
    }
    if ((table == NULL) || (jobs == NULL) || (dev_jobs == NULL)) {
        return KVF_KERN_EINVAL;
    }
    devsim_want_dev_fn(dev_jobs, "kvf_gather_tmpl_run dev_jobs");
    p = calloc(1, sizeof(*p));
    if ((p == NULL) || ((p->jobs = malloc(n * sizeof(*jobs) + 1)) == NULL)) {
        free(p);
        return KVF_KERN_ENOMEM;
    }
    memcpy(p->jobs, jobs, n * sizeof(*jobs));
    p->n = n;
    p->table = table;
    pthread_mutex_lock(&pending_lock);
    *pending_tail = p;
    pending_tail = &p->next;
    pthread_mutex_unlock(&pending_lock);
    atomic_fetch_add(&st_kernels, 1);
    return KVF_KERN_OK;
}
