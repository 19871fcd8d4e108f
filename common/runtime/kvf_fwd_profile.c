/*
 * Per-call-site step profile of the forward (kvf_fwd_profile.h).
 */
#include "kvf_fwd_profile.h"
#include "kvf_time.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define KVF_PROF_SITES 256

typedef struct {
    const char        *func, *call;   /* static; call's address is the identity */
    int                line;
    unsigned long long calls[KVF_PROF_PHASES], pend_calls;
    double             secs[KVF_PROF_PHASES], pend_secs;
} kvf_prof_site_t;

static atomic_bool kvf_prof_on;
static kvf_prof_site_t kvf_prof_sites[KVF_PROF_SITES + 1];   /* + "(other sites)" */
static int kvf_prof_nsites;
static double kvf_prof_step_secs[KVF_PROF_PHASES];
static unsigned long long kvf_prof_steps[KVF_PROF_PHASES];
static _Thread_local const kvf_device_t *kvf_prof_dev;
static _Thread_local bool kvf_prof_thread_on;

void kvf_fwd_profile_enable(bool on)
{
    memset(kvf_prof_sites, 0, sizeof(kvf_prof_sites));
    memset(kvf_prof_step_secs, 0, sizeof(kvf_prof_step_secs));
    memset(kvf_prof_steps, 0, sizeof(kvf_prof_steps));
    kvf_prof_nsites = 0;
    atomic_store(&kvf_prof_on, on);
}

bool kvf_fwd_profile_thread(int rank, const kvf_device_t *dev)
{
    kvf_prof_thread_on = (rank == 0) && atomic_load_explicit(&kvf_prof_on, memory_order_relaxed);
    kvf_prof_dev = kvf_prof_thread_on ? dev : NULL;
    return kvf_prof_thread_on;
}

bool kvf_fwd_profile_active(void)
{
    return kvf_prof_thread_on;
}

double kvf_fwd_profile_begin(void)
{
    if ((kvf_prof_dev != NULL) && (kvf_prof_dev->kind != KVF_DEVICE_CPU)) {
        (void)kvf_device_sync(kvf_prof_dev);
    }
    return kvf_time_now_s();
}

static kvf_prof_site_t *kvf_prof_site(const char *func, int line, const char *call)
{
    for (int i = 0; i < kvf_prof_nsites; ++i) {
        if (kvf_prof_sites[i].call == call) {
            return &kvf_prof_sites[i];
        }
    }
    if (kvf_prof_nsites == KVF_PROF_SITES) {
        kvf_prof_site_t *o = &kvf_prof_sites[KVF_PROF_SITES];
        o->func = "(other sites)";
        o->call = "";
        return o;
    }
    kvf_prof_site_t *s = &kvf_prof_sites[kvf_prof_nsites++];
    s->func = func;
    s->line = line;
    s->call = call;
    return s;
}

void kvf_fwd_profile_end(const char *func, int line, const char *call, double t0)
{
    if ((kvf_prof_dev != NULL) && (kvf_prof_dev->kind != KVF_DEVICE_CPU)) {
        (void)kvf_device_sync(kvf_prof_dev);
    }
    double dt = kvf_time_now_s() - t0;
    kvf_prof_site_t *s = kvf_prof_site(func, line, call);
    s->pend_calls++;
    s->pend_secs += dt;
}

void kvf_fwd_profile_commit(kvf_prof_phase_t phase, double step_seconds)
{
    for (int i = 0; i <= KVF_PROF_SITES; ++i) {
        kvf_prof_site_t *s = &kvf_prof_sites[i];
        s->calls[phase] += s->pend_calls;
        s->secs[phase] += s->pend_secs;
        s->pend_calls = 0;
        s->pend_secs = 0;
    }
    kvf_prof_step_secs[phase] += step_seconds;
    kvf_prof_steps[phase]++;
}

static int kvf_prof_cmp_phase;

static int kvf_prof_cmp(const void *a, const void *b)
{
    double x = (*(const kvf_prof_site_t *const *)a)->secs[kvf_prof_cmp_phase];
    double y = (*(const kvf_prof_site_t *const *)b)->secs[kvf_prof_cmp_phase];
    return (x < y) - (x > y);
}

void kvf_fwd_profile_print(FILE *f)
{
    static const char *names[KVF_PROF_PHASES] = {"prefill", "decode"};
    kvf_prof_site_t *order[KVF_PROF_SITES + 1];

    for (int ph = 0; ph < KVF_PROF_PHASES; ++ph) {
        double in_calls = 0, wall = kvf_prof_step_secs[ph];
        int n = 0;
        if (kvf_prof_steps[ph] == 0) {
            continue;
        }
        for (int i = 0; i <= KVF_PROF_SITES; ++i) {
            if (kvf_prof_sites[i].calls[ph] > 0) {
                order[n++] = &kvf_prof_sites[i];
                in_calls += kvf_prof_sites[i].secs[ph];
            }
        }
        kvf_prof_cmp_phase = ph;
        qsort(order, (size_t)n, sizeof(order[0]), kvf_prof_cmp);
        fprintf(f, "profile %s: %llu steps, %.3f ms (rank 0, each call synchronised)\n",
                names[ph], kvf_prof_steps[ph], wall * 1e3);
        fprintf(f, "  %6s %10s %8s %10s  %s\n", "share", "total ms", "calls", "mean us",
                "site");
        for (int i = 0; i < n; ++i) {
            const kvf_prof_site_t *s = order[i];
            fprintf(f, "  %5.1f%% %10.3f %8llu %10.2f  %s:%d %.64s\n",
                    (wall > 0) ? 100.0 * s->secs[ph] / wall : 0.0, s->secs[ph] * 1e3,
                    s->calls[ph], s->secs[ph] * 1e6 / (double)s->calls[ph], s->func, s->line,
                    s->call);
        }
        fprintf(f, "  %5.1f%% %10.3f %8s %10s  (outside the calls above: the runner, scheduling,"
                " host sampling)\n",
                (wall > 0) ? 100.0 * (wall - in_calls) / wall : 0.0, (wall - in_calls) * 1e3,
                "-", "-");
    }
}

unsigned long long kvf_fwd_profile_calls(kvf_prof_phase_t phase, const char *call_prefix)
{
    unsigned long long n = 0;
    size_t len = strlen(call_prefix);

    for (int i = 0; i < kvf_prof_nsites; ++i) {
        if (strncmp(kvf_prof_sites[i].call, call_prefix, len) == 0) {
            n += kvf_prof_sites[i].calls[phase];
        }
    }
    return n;
}
