/* Growable arrays (kvf_array.h). */
#include "kvf_array.h"

#include <stdlib.h>

kvf_status_t kvf_array_reserve(void **data_p, size_t *cap_p, size_t want, size_t elem_size,
                               size_t min_cap, size_t max_cap)
{
    size_t cap = *cap_p;
    void *n;

    if (want <= cap) {
        return KVF_OK;
    }
    if ((want > max_cap) || (elem_size == 0) || (want > SIZE_MAX / elem_size)) {
        return KVF_ERR_OUT_OF_RANGE;
    }
    if (cap == 0) {
        cap = (min_cap > 0) ? min_cap : 1;
    }
    while (cap < want) {
        cap = (cap > max_cap / 2) ? max_cap : cap * 2;
    }
    if (cap > max_cap) {
        cap = max_cap;
    }
    if (cap > SIZE_MAX / elem_size) {
        cap = SIZE_MAX / elem_size;   /* >= want, checked above */
    }
    n = realloc(*data_p, cap * elem_size);
    if (n == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    *data_p = n;
    *cap_p = cap;
    return KVF_OK;
}
