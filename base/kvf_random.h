/*
 * Random bytes from the kernel's CSPRNG (getrandom(2)): lease nonces,
 * connector incarnations. Never a weaker fallback: a failure is an error.
 */
#ifndef KVF_RANDOM_H
#define KVF_RANDOM_H

#include "kvf_status.h"

#include <stddef.h>
#include <stdint.h>

/**
 * Fill @a buf with @a len random bytes from getrandom(2) (blocking until the
 * kernel's pool is seeded, as at boot). EINTR and short reads are retried,
 * 64 calls at the most.
 *
 * @param what  What the bytes are for, named in the error log ("lease nonce").
 * @return KVF_OK; KVF_ERR_IO (logged) when getrandom fails or the calls run out.
 */
kvf_status_t kvf_random_bytes(const char *what, void *buf, size_t len);

/**
 * A non-zero random 64-bit value (0 means "none" in the wire messages).
 * @return KVF_OK with *@a value_p; KVF_ERR_IO (logged) as kvf_random_bytes,
 *         or after eight zero draws in a row.
 */
kvf_status_t kvf_random_nonzero_u64(const char *what, uint64_t *value_p);

#endif
