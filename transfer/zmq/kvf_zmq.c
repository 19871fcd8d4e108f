/*
 * ZeroMQ socket set-up shared by the side channel, the serve channel and the
 * proxy: one place that creates a socket and checks every zmq_setsockopt(),
 * and one reader of socket-monitor events.
 */
#include "kvf_zmq.h"

#include <string.h>

static const char *kvf_zmq_type_name(int type)
{
    switch (type) {
    case ZMQ_REQ:    return "REQ";
    case ZMQ_REP:    return "REP";
    case ZMQ_ROUTER: return "ROUTER";
    case ZMQ_DEALER: return "DEALER";
    case ZMQ_PAIR:   return "PAIR";
    default:         return "?";
    }
}

static int kvf_zmq_opt_set(void *sock, const kvf_zmq_opt_t *opt)
{
    if (opt->name == ZMQ_MAXMSGSIZE) {
        int64_t v = opt->value;
        return zmq_setsockopt(sock, opt->name, &v, sizeof(v));
    }
    int v = (int)opt->value;
    return zmq_setsockopt(sock, opt->name, &v, sizeof(v));
}

kvf_status_t kvf_zmq_socket_open(void *ctx, int type, const kvf_zmq_opt_t *opts,
                                 size_t num_opts, void **sock_p)
{
    static const kvf_zmq_opt_t defaults[] = {   /* bounded queues and messages on every socket */
        {ZMQ_SNDHWM, KVF_ZMQ_DEFAULT_HWM},
        {ZMQ_RCVHWM, KVF_ZMQ_DEFAULT_HWM},
        {ZMQ_MAXMSGSIZE, KVF_ZMQ_DEFAULT_MAXMSGSIZE},
    };
    void *sock;
    kvf_status_t status = kvf_zmq_auth_attach(ctx);   /* this context's ZAP handler */

    if (status != KVF_OK) {
        return status;
    }
    sock = zmq_socket(ctx, type);
    if (sock == NULL) {
        kvf_error("zmq_socket(%s) failed: %s", kvf_zmq_type_name(type),
                  zmq_strerror(zmq_errno()));
        return KVF_ERR_ZMQ;
    }
    for (size_t i = 0; i < sizeof(defaults) / sizeof(defaults[0]); ++i) {
        if (kvf_zmq_opt_set(sock, &defaults[i]) == -1) {
            kvf_error("zmq_setsockopt(%s socket, default option %d) failed: %s",
                      kvf_zmq_type_name(type), defaults[i].name, zmq_strerror(zmq_errno()));
            zmq_close(sock);
            return KVF_ERR_ZMQ;
        }
    }
    for (size_t i = 0; i < num_opts; ++i) {
        if (kvf_zmq_opt_set(sock, &opts[i]) == -1) {
            kvf_error("zmq_setsockopt(%s socket, option %d, %lld) failed: %s",
                      kvf_zmq_type_name(type), opts[i].name, (long long)opts[i].value,
                      zmq_strerror(zmq_errno()));
            zmq_close(sock);
            return KVF_ERR_ZMQ;
        }
    }
    *sock_p = sock;
    return KVF_OK;
}

int kvf_zmq_monitor_event(void *mon)
{
    uint16_t event = 0;
    int got = 0, more = 1;

    while (more) {
        zmq_msg_t frame;

        zmq_msg_init(&frame);
        if (zmq_msg_recv(&frame, mon, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&frame);
            break;
        }
        if ((got++ == 0) && (zmq_msg_size(&frame) >= 6)) {   /* id (2) + value (4) */
            memcpy(&event, zmq_msg_data(&frame), sizeof(event));
        }
        more = zmq_msg_more(&frame);
        zmq_msg_close(&frame);
    }
    return (got == 0) ? -1 : (int)event;
}
