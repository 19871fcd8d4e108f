/*
 * The node identity of the same-node pull path: the Linux boot id.
 *
 * Design: the boot id is random per boot and shared by every process and
 * container of one kernel, so equal ids mean one machine (the condition for
 * CUDA IPC) and a rebooted node never matches its old self. Rejected: the
 * host name (containers on one machine have different ones, two machines
 * may share one), a MAC address (containers, bonding).
 */
#include "kvf_connector_ipc.h"

#include "kvf_log.h"

#include <stdio.h>
#include <string.h>

kvf_status_t kvf_node_id(char *buf, size_t len)
{
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    size_t n = 0;

    buf[0] = '\0';
    if (f != NULL) {
        if (fgets(buf, (int)len, f) == NULL) {
            buf[0] = '\0';
        }
        fclose(f);
    }
    n = strcspn(buf, "\r\n");
    buf[n] = '\0';
    if (n == 0) {
        kvf_warn("cannot read /proc/sys/kernel/random/boot_id: no node identity, so no "
                 "same-node (CUDA IPC) pulls");
        return KVF_ERR_IO;
    }
    return KVF_OK;
}
