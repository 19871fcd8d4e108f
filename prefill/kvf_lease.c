/*
 * Lease table as a flat array with swap-remove. Leases live for one
 * transfer (milliseconds to seconds) and a prefill instance holds at most
 * as many as it has running requests, so a linear scan beats a hash map in
 * both code and time at these sizes.
 */
#include "kvf_lease.h"
#include "kvf_log.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    char     id[KVF_LEASE_ID_MAX];
    uint64_t expiry_ms;
    void    *owner;
} kvf_lease_t;

struct kvf_lease_table {
    kvf_lease_t *leases;
    size_t       count;
    size_t       capacity;
};

kvf_status_t kvf_lease_table_create(kvf_lease_table_h *table_p)
{
    struct kvf_lease_table *t = calloc(1, sizeof(*t));
    if (t == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    *table_p = t;
    return KVF_OK;
}

void kvf_lease_table_destroy(kvf_lease_table_h table)
{
    if (table != NULL) {
        free(table->leases);
        free(table);
    }
}

static long kvf_lease_find(kvf_lease_table_h t, const char *id)
{
    for (size_t i = 0; i < t->count; ++i) {
        if (strcmp(t->leases[i].id, id) == 0) {
            return (long)i;
        }
    }
    return -1;
}

kvf_status_t kvf_lease_table_add(kvf_lease_table_h table, const char *request_id,
                                 uint64_t expiry_ms, void *owner)
{
    size_t len = (request_id != NULL) ? strlen(request_id) : 0;

    if ((len == 0) || (len >= KVF_LEASE_ID_MAX)) {
        kvf_error("lease: request id must be 1..%d bytes", KVF_LEASE_ID_MAX - 1);
        return KVF_ERR_INVALID_PARAM;
    }
    if (kvf_lease_find(table, request_id) >= 0) {
        kvf_error("lease: request %s is already held", request_id);
        return KVF_ERR_INVALID_PARAM;
    }
    if (table->count == table->capacity) {
        size_t cap = table->capacity ? table->capacity * 2 : 64;
        kvf_lease_t *n = realloc(table->leases, cap * sizeof(*n));
        if (n == NULL) {
            return KVF_ERR_NO_MEMORY;
        }
        table->leases = n;
        table->capacity = cap;
    }
    memcpy(table->leases[table->count].id, request_id, len + 1);
    table->leases[table->count].expiry_ms = expiry_ms;
    table->leases[table->count].owner = owner;
    table->count++;
    return KVF_OK;
}

static void *kvf_lease_remove_at(kvf_lease_table_h t, size_t i)
{
    void *owner = t->leases[i].owner;
    t->leases[i] = t->leases[--t->count];
    return owner;
}

void *kvf_lease_table_release(kvf_lease_table_h table, const char *request_id)
{
    long i = (request_id != NULL) ? kvf_lease_find(table, request_id) : -1;
    return (i < 0) ? NULL : kvf_lease_remove_at(table, (size_t)i);
}

bool kvf_lease_table_shorten(kvf_lease_table_h table, const char *request_id,
                             uint64_t expiry_ms)
{
    long i = (request_id != NULL) ? kvf_lease_find(table, request_id) : -1;

    if (i < 0) {
        return false;
    }
    if (expiry_ms < table->leases[i].expiry_ms) {
        table->leases[i].expiry_ms = expiry_ms;
    }
    return true;
}

size_t kvf_lease_table_expire(kvf_lease_table_h table, uint64_t now_ms, void **owners,
                              size_t cap)
{
    size_t n = 0;
    size_t i = 0;
    while ((i < table->count) && (n < cap)) {
        if (table->leases[i].expiry_ms <= now_ms) {
            owners[n++] = kvf_lease_remove_at(table, i);   /* i now holds the swapped-in lease */
        } else {
            ++i;
        }
    }
    return n;
}

size_t kvf_lease_table_count(kvf_lease_table_h table)
{
    return table->count;
}

uint64_t kvf_lease_table_next_expiry(kvf_lease_table_h table)
{
    uint64_t next = UINT64_MAX;
    for (size_t i = 0; i < table->count; ++i) {
        if (table->leases[i].expiry_ms < next) {
            next = table->leases[i].expiry_ms;
        }
    }
    return next;
}
