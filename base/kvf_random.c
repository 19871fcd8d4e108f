/* Random bytes from the kernel's CSPRNG (kvf_random.h). */
#include "kvf_random.h"

#include "kvf_log.h"

#include <errno.h>
#include <string.h>
#include <sys/random.h>
#include <sys/types.h>

#define KVF_RANDOM_MAX_CALLS 64
#define KVF_RANDOM_MAX_ZEROS 8

kvf_status_t kvf_random_bytes(const char *what, void *buf, size_t len)
{
    size_t got = 0;

    for (int calls = 0; (got < len) && (calls < KVF_RANDOM_MAX_CALLS); ++calls) {
        ssize_t n = getrandom((char *)buf + got, len - got, 0);
        if ((n < 0) && (errno == EINTR)) {
            continue;
        }
        if (n < 0) {
            kvf_error("getrandom() for the %s failed: %s", what, strerror(errno));
            return KVF_ERR_IO;
        }
        got += (size_t)n;
    }
    if (got < len) {
        kvf_error("getrandom() for the %s gave %zu of %zu bytes in %d calls", what, got, len,
                  KVF_RANDOM_MAX_CALLS);
        return KVF_ERR_IO;
    }
    return KVF_OK;
}

kvf_status_t kvf_random_nonzero_u64(const char *what, uint64_t *value_p)
{
    for (int zeros = 0; zeros < KVF_RANDOM_MAX_ZEROS; ++zeros) {
        uint64_t x = 0;
        kvf_status_t status = kvf_random_bytes(what, &x, sizeof(x));
        if (status != KVF_OK) {
            return status;
        }
        if (x != 0) {
            *value_p = x;
            return KVF_OK;
        }
    }
    kvf_error("getrandom() for the %s drew zero %d times in a row", what, KVF_RANDOM_MAX_ZEROS);
    return KVF_ERR_IO;
}
