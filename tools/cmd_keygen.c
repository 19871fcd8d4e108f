/*
 * kvf keygen: write a pool's key set (docs/SECURITY.md):
 *
 *   kvf keygen --out DIR --members prefill-0,decode-0,proxy[,bench:tool]
 *
 * DIR (created 0700) gets server.key, one <id>.key per member (0600) and
 * pool.pub, the allowlist every daemon and the proxy load with --keys DIR.
 * A member is "id" or "id:role"; without a role it follows the id
 * (prefill*, decode*, proxy*, anything else tool). Running it again on the
 * same folder replaces every key (rotation: then restart the pool).
 */
#include "kvf_cmds.h"
#include "kvf_zmq_auth.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void kvf_keygen_usage(FILE *out)
{
    fprintf(out, "usage: kvf keygen --out DIR --members ID[:ROLE],...\n"
                 "  writes DIR/server.key, DIR/<id>.key per member and DIR/pool.pub\n"
                 "  (dir 0700, files 0600); ROLE: prefill, decode, proxy or tool (default:\n"
                 "  from the id's prefix, tool otherwise)\n");
}

int kvf_cmd_keygen(int argc, char **argv)
{
    const char *out = NULL, *members = NULL;
    const char *list[KVF_ZMQ_AUTH_MAX_MEMBERS];
    size_t n = 0;
    char *copy, *save = NULL;
    int rc;

    for (int i = 0; i < argc; ++i) {
        if ((strcmp(argv[i], "--help") == 0) || (strcmp(argv[i], "-h") == 0)) {
            kvf_keygen_usage(stdout);
            return 0;
        }
        if ((i + 1 < argc) && (strcmp(argv[i], "--out") == 0)) {
            out = argv[++i];
        } else if ((i + 1 < argc) && (strcmp(argv[i], "--members") == 0)) {
            members = argv[++i];
        } else {
            fprintf(stderr, "kvf keygen: unknown or incomplete argument '%s'\n", argv[i]);
            kvf_keygen_usage(stderr);
            return 2;
        }
    }
    if ((out == NULL) || (members == NULL) || (out[0] == '\0')) {
        fprintf(stderr, "kvf keygen: give --out DIR and --members ID,...\n");
        kvf_keygen_usage(stderr);
        return 2;
    }
    copy = strdup(members);
    if (copy == NULL) {
        return 1;
    }
    for (char *tok = strtok_r(copy, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
        if (n == KVF_ZMQ_AUTH_MAX_MEMBERS) {
            fprintf(stderr, "kvf keygen: more than %d members\n", KVF_ZMQ_AUTH_MAX_MEMBERS);
            free(copy);
            return 2;
        }
        list[n++] = tok;
    }
    rc = (kvf_zmq_auth_keygen(out, list, n) == KVF_OK) ? 0 : 1;
    if (rc == 0) {
        printf("kvf keygen: %zu member keys, server.key and pool.pub in %s\n", n, out);
    }
    free(copy);
    return rc;
}
