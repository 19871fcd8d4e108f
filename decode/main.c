/* kvf-decode: the decode role daemon. See decode/kvf_decode_server.h. */
#include "decode/kvf_decode_server.h"
#include "common/kvf_log.h"

#include <signal.h>
#include <string.h>

static volatile sig_atomic_t kvf_decode_stop;

static void kvf_decode_on_signal(int sig)
{
    (void)sig;
    kvf_decode_stop = 1;
}

int main(int argc, char **argv)
{
    kvf_decode_config_t cfg;
    kvf_decode_server_h srv;
    struct sigaction sa;
    bool done;

    kvf_log_init("decode");
    memset(&cfg, 0, sizeof(cfg));
    if (kvf_config_parse(kvf_decode_config_table, "kvf-decode", argc - 1, argv + 1, &cfg,
                         &done) != KVF_OK) {
        return 2;
    }
    if (done) {
        return 0;
    }
    kvf_config_warn_unused();
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = kvf_decode_on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    if (kvf_decode_server_create(&cfg, &srv) != KVF_OK) {
        return 1;
    }
    kvf_status_t status = kvf_decode_server_run(srv, &kvf_decode_stop);
    kvf_decode_server_destroy(srv);
    return (status == KVF_OK) ? 0 : 1;
}
