/* The one health publisher of both role daemons (kvf_health_pub.h). */
#include "kvf_health_pub.h"

#include "kvf_daemon_http.h"
#include "kvf_role.h"

void kvf_health_fill_loop(Kvf__HealthReply *h, const kvf_health_loop_t *loop)
{
    h->has_running = h->has_queue_depth = h->has_max_queue = 1;
    h->running = loop->running;
    h->queue_depth = loop->queue_depth;
    h->max_queue = loop->max_queue;
    h->has_incarnation = h->has_draining = 1;
    h->incarnation = loop->incarnation;
    h->draining = loop->draining;
}

void kvf_health_publish(kvf_serve_server_h serve, kvf_health_fill_fn fill, void *arg)
{
    Kvf__HealthReply h;

    fill(arg, &h);
    (void)kvf_serve_server_set_health(serve, &h);   /* logged there; the last snapshot stays */
    kvf_daemon_http_publish(&h);                    /* --metrics-port's /metrics and /health */
}

void kvf_health_answer(kvf_serve_server_h serve, const kvf_serve_peer_t *peer,
                       kvf_health_fill_fn fill, void *arg)
{
    Kvf__HealthReply h;

    fill(arg, &h);
    kvf_role_reply_health(serve, peer, &h);
}
