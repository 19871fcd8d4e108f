/* kvf-prefill: the prefill role daemon. See prefill/kvf_prefill_server.h. */
#include "prefill/kvf_prefill_server.h"
#include "common/kvf_log.h"

#include <signal.h>
#include <string.h>

static volatile sig_atomic_t kvf_prefill_stop;

static void kvf_prefill_on_signal(int sig)
{
    (void)sig;
    kvf_prefill_stop = 1;
}

int main(int argc, char **argv)
{
    kvf_prefill_config_t cfg;
    kvf_prefill_server_h srv;
    struct sigaction sa;
    bool done;

    kvf_log_init("prefill");
    memset(&cfg, 0, sizeof(cfg));
    if (kvf_config_parse(kvf_prefill_config_table, "kvf-prefill", argc - 1, argv + 1, &cfg,
                         &done) != KVF_OK) {
        return 2;
    }
    if (done) {
        return 0;
    }
    kvf_config_warn_unused();
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = kvf_prefill_on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    if (kvf_prefill_server_create(&cfg, &srv) != KVF_OK) {
        return 1;
    }
    kvf_status_t status = kvf_prefill_server_run(srv, &kvf_prefill_stop);
    kvf_prefill_server_destroy(srv);
    return (status == KVF_OK) ? 0 : 1;
}
