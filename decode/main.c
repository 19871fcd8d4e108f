/* kvf-decode: the decode role daemon. See decode/kvf_decode_server.h. */
#include "kvf_decode_server.h"
#include "kvf_role.h"

#include <string.h>

static kvf_status_t kvf_decode_create(const void *config, void **server_p)
{
    return kvf_decode_server_create(config, (kvf_decode_server_h *)server_p);
}

static kvf_status_t kvf_decode_run(void *server, volatile sig_atomic_t *stop)
{
    return kvf_decode_server_run(server, stop);
}

static void kvf_decode_destroy(void *server)
{
    kvf_decode_server_destroy(server);
}

int main(int argc, char **argv)
{
    kvf_decode_config_t cfg;
    const kvf_role_daemon_t daemon = {
        .name = "kvf-decode", .role = "decode", .table = kvf_decode_config_table,
        .config = &cfg, .create = kvf_decode_create, .run = kvf_decode_run,
        .destroy = kvf_decode_destroy,
    };

    memset(&cfg, 0, sizeof(cfg));
    return kvf_role_main(&daemon, argc, argv);
}
