/*
 * What every world backend of kvf_collectives.h shares (private to
 * common/runtime/kvf_collectives*.c): the public handle is this base, first
 * in each backend's own world struct; the world functions of
 * kvf_collectives.h dispatch through its table.
 */
#ifndef KVF_COLLECTIVES_INT_H
#define KVF_COLLECTIVES_INT_H

#include "kvf_collectives.h"

typedef struct kvf_comm_world_vtbl {
    const char   *kind;   /* "cpu", "nccl"; logs only */
    /* called by each rank's thread before its first collective; NULL: nothing to do */
    kvf_status_t (*start_rank)(kvf_comm_world_h world, int rank);
    /* name already checked (1..63 bytes) */
    kvf_status_t (*set_barrier)(kvf_comm_world_h world, const char *name, uint32_t timeout_ms);
    const char  *(*error)(kvf_comm_world_h world);
    void         (*destroy)(kvf_comm_world_h world);
} kvf_comm_world_vtbl_t;

struct kvf_comm_world {
    const kvf_comm_world_vtbl_t *vt;
    int                          size;
    kvf_comm_t                   comms[KVF_COMM_MAX_RANKS];   /* ctx: the backend's world */
};

/** kvf_comm_world_create() for KVF_DEVICE_CUDA (kvf_collectives_nccl.c). */
kvf_status_t kvf_comm_world_create_nccl(int size, const kvf_device_t *devs,
                                        kvf_comm_world_h *world_p);

#endif
