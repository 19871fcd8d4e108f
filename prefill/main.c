/* kvf-prefill: the prefill role daemon. See prefill/kvf_prefill_server.h. */
#include "kvf_prefill_server.h"
#include "kvf_role.h"

#include <string.h>

static kvf_status_t kvf_prefill_create(const void *config, void **server_p)
{
    return kvf_prefill_server_create(config, (kvf_prefill_server_h *)server_p);
}

static kvf_status_t kvf_prefill_run(void *server, volatile sig_atomic_t *stop)
{
    return kvf_prefill_server_run(server, stop);
}

static void kvf_prefill_destroy(void *server)
{
    kvf_prefill_server_destroy(server);
}

int main(int argc, char **argv)
{
    kvf_prefill_config_t cfg;
    const kvf_role_daemon_t daemon = {
        .name = "kvf-prefill", .role = "prefill", .table = kvf_prefill_config_table,
        .config = &cfg, .create = kvf_prefill_create, .run = kvf_prefill_run,
        .destroy = kvf_prefill_destroy,
    };

    memset(&cfg, 0, sizeof(cfg));
    return kvf_role_main(&daemon, argc, argv);
}
