/*
 * Growable arrays: one overflow-checked grow-by-doubling for every
 * hand-rolled (pointer, count, capacity) array of the tree.
 *
 *     if (KVF_ARRAY_GROW(v->items, v->cap, v->n + 1, 64) != KVF_OK) { ...no memory... }
 *     v->items[v->n++] = item;
 *
 * The capacity may be any integer type (int or size_t); it never grows past
 * what that type holds (INT_MAX for int). On failure the array, its
 * elements and its capacity stay as they were, so the caller's error path
 * frees one consistent array.
 */
#ifndef KVF_ARRAY_H
#define KVF_ARRAY_H

#include "kvf_status.h"

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

/**
 * Make room for @a want elements of @a elem_size bytes in *@a data_p, whose
 * capacity (elements) is *@a cap_p: when *cap_p < want, the capacity
 * doubles, starting from @a min_cap (at least 1) when it is 0, until it holds
 * @a want, and the buffer is realloc'd to it; capped at @a max_cap elements.
 *
 * @param [in,out] data_p  The buffer (NULL when empty); replaced on growth.
 * @param [in,out] cap_p   Its capacity in elements; updated on growth.
 * @return KVF_OK (also when it already held @a want); KVF_ERR_OUT_OF_RANGE
 *         when @a want exceeds @a max_cap or its bytes overflow size_t;
 *         KVF_ERR_NO_MEMORY when realloc fails. On error nothing changes.
 */
kvf_status_t kvf_array_reserve(void **data_p, size_t *cap_p, size_t want, size_t elem_size,
                               size_t min_cap, size_t max_cap);

/* The largest capacity a capacity variable @a _cap holds (signed or not: the signed bound). */
#define KVF_ARRAY_CAP_MAX(_cap)                                                           \
    ((sizeof(_cap) >= sizeof(size_t)) ? (SIZE_MAX >> 1)                                    \
                                      : ((((size_t)1) << (sizeof(_cap) * CHAR_BIT - 1)) - 1))

/**
 * kvf_array_reserve on an array @a _data (a typed pointer lvalue) with the
 * capacity lvalue @a _cap of any integer type: room for @a _want elements,
 * doubling from @a _min. Evaluates to its kvf_status_t.
 */
#define KVF_ARRAY_GROW(_data, _cap, _want, _min)                                           \
    __extension__({                                                                        \
        void *kvf_ag_data_ = (_data);                                                      \
        size_t kvf_ag_cap_ = (size_t)(_cap);                                               \
        kvf_status_t kvf_ag_st_ =                                                          \
            kvf_array_reserve(&kvf_ag_data_, &kvf_ag_cap_, (size_t)(_want), sizeof(*(_data)), \
                              (size_t)(_min), KVF_ARRAY_CAP_MAX(_cap));                    \
        if (kvf_ag_st_ == KVF_OK) {                                                        \
            (_data) = kvf_ag_data_;                                                        \
            (_cap) = (__typeof__(_cap))kvf_ag_cap_;                                        \
        }                                                                                  \
        kvf_ag_st_;                                                                        \
    })

#endif
