/*
 * kvf-proxy: serve a P/D pool over HTTP until SIGINT or SIGTERM.
 *
 *   kvf-proxy --prefill tcp://127.0.0.1:20000 --decode tcp://127.0.0.1:20100 \
 *             --model DIR --model-name tiny --port 8000
 *
 * Prints "kvf-proxy listening on http://HOST:PORT" (https:// with --tls-cert) on stdout once it
 * accepts connections (scripts wait for that line or for /health).
 */
#include "kvf_proxy.h"
#include "kvf_fault.h"
#include "kvf_log.h"
#include "kvf_zmq_auth.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    kvf_proxy_config_t cfg;
    kvf_proxy_h proxy;
    sigset_t set;
    bool exit_now = false;
    int sig = 0;

    kvf_log_init("proxy");
    if (kvf_fault_refuse_test_switches(argc, argv) != KVF_OK) {   /* release builds: by name */
        return 2;
    }
    memset(&cfg, 0, sizeof(cfg));
    if (kvf_config_parse(kvf_proxy_config_table, "kvf-proxy", argc - 1, argv + 1, &cfg,
                         &exit_now) != KVF_OK) {
        return 2;
    }
    if (exit_now) {
        return 0;
    }
    kvf_config_warn_unused();
    {
        kvf_zmq_auth_config_t auth = {.keys_dir = cfg.keys, .key_id = cfg.key_id,
                                      .insecure = cfg.insecure};
        if (kvf_zmq_auth_init(NULL, &auth) != KVF_OK) {   /* names --keys / --insecure */
            return 2;
        }
    }

    /* Block the stop signals in every thread; this one waits for them. */
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    if (kvf_proxy_create(&cfg, &proxy) != KVF_OK) {
        return 1;
    }
    printf("kvf-proxy listening on %s://%s:%d\n", (cfg.tls_cert[0] != '\0') ? "https" : "http",
           cfg.host, kvf_proxy_port(proxy));
    fflush(stdout);
    sigwait(&set, &sig);
    kvf_info("signal %d (%s): draining, then shutting down", sig, strsignal(sig));
    kvf_proxy_drain(proxy);
    kvf_proxy_destroy(proxy);
    kvf_zmq_auth_cleanup();
    kvf_info("stopped");
    return 0;
}
