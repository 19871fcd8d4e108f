/*
 * kvf_release_switch_check: the start-up check every daemon and kvf-proxy
 * runs first (kvf_fault_refuse_test_switches), in a build without
 * KVF_FAULT_INJECTION: exits 0 when the environment and arguments hold no
 * test-only switch, 2 (with the refusal naming it on stderr) otherwise.
 */
#ifdef KVF_FAULT_INJECTION
#error "kvf_release_switch_check must be compiled without KVF_FAULT_INJECTION"
#endif
#include "kvf_fault.h"
#include "kvf_log.h"

int main(int argc, char **argv)
{
    kvf_log_init("release-check");
    if (kvf_fault_enabled()) {
        return 3;   /* the check below would be the fault build's */
    }
    return (kvf_fault_refuse_test_switches(argc, argv) == KVF_OK) ? 0 : 2;
}
