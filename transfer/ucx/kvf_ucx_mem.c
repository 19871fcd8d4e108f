/*
 * UCX agent: registered regions (ucp_mem_map) and remote keys, packed for
 * publication; a peer's key is bounded before ucp_ep_rkey_unpack() sees it.
 */
#include "kvf_ucx_agent_int.h"

#include "kvf_device.h"
#include "kvf_log.h"

#include <stdio.h>
#include <string.h>

void kvf_ucx_mem_types_query(kvf_ucx_agent_h agent)
{
    agent->mem_types = UCS_BIT(UCS_MEMORY_TYPE_HOST);
#if KVF_UCX_HAS_MEM_TYPES_QUERY
    ucp_context_attr_t attr;

    memset(&attr, 0, sizeof(attr));
    attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
    if (ucp_context_query(agent->context, &attr) == UCS_OK) {
        agent->mem_types |= attr.memory_types;
    }
#endif
}

/* The UCX memory type of @a type (kvf_xfer_mem_type_t values are checked by the callers). */
static ucs_memory_type_t kvf_ucx_mem_type(kvf_xfer_mem_type_t type)
{
    return (type == KVF_XFER_MEM_CUDA) ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST;
}

void kvf_ucx_agent_describe(kvf_ucx_agent_h agent, char *buf, size_t len)
{
    char types[128] = "";
    size_t used = 0;

    for (unsigned t = 0; (t < UCS_MEMORY_TYPE_LAST) && (used < sizeof(types)); ++t) {
        if (agent->mem_types & UCS_BIT(t)) {   /* UCX's own names: host, cuda, ... */
            used += (size_t)snprintf(types + used, sizeof(types) - used, "%s%s",
                                     (used > 0) ? "," : "", ucs_memory_type_names[t]);
        }
    }
    snprintf(buf, len, "UCX %s reaching %s memory, UCX_TLS=%s%s", ucp_get_version_string(),
             types, agent->tls_env,
             KVF_UCX_HAS_MEM_TYPES_QUERY ? "" : " (too old to report memory types)");
}

kvf_status_t kvf_ucx_agent_mem_reach(kvf_ucx_agent_h agent, kvf_xfer_mem_type_t type,
                                     char *what, size_t what_len)
{
    kvf_ucx_agent_describe(agent, what, what_len);
    if ((unsigned)type >= KVF_XFER_MEM_TYPES) {
        return KVF_ERR_INVALID_PARAM;
    }
    if (!KVF_UCX_HAS_MEM_TYPE_PARAMS && (type != KVF_XFER_MEM_HOST)) {
        return KVF_ERR_UNSUPPORTED;
    }
    return (agent->mem_types & UCS_BIT(kvf_ucx_mem_type(type))) ? KVF_OK :
           KVF_ERR_UNSUPPORTED;
}

#define KVF_UCX_MEM_DETECT (-1)   /* kvf_ucx_agent_map(): ask kvf_device_ptr_is_cuda() */

/*
 * The memory type of the region at @a addr: @a want (a kvf_xfer_mem_type_t:
 * CUDA is checked against the pointer, HOST is taken as said and touches no
 * CUDA), or KVF_UCX_MEM_DETECT. Refuses a device region this UCX cannot
 * register, naming the type and the UCX.
 */
static kvf_status_t kvf_ucx_map_type(kvf_ucx_agent_h agent, const void *addr, int want,
                                     kvf_xfer_mem_type_t *type_p)
{
    char what[256];

    if ((want != KVF_UCX_MEM_DETECT) && ((want < 0) || (want >= KVF_XFER_MEM_TYPES))) {
        kvf_error("%s: memory type %d is not one of host (0), cuda (1)", agent->name, want);
        return KVF_ERR_INVALID_PARAM;
    }
    if ((want == KVF_XFER_MEM_HOST) || (addr == NULL)) {
        *type_p = KVF_XFER_MEM_HOST;
    } else {
        *type_p = kvf_device_ptr_is_cuda(addr) ? KVF_XFER_MEM_CUDA : KVF_XFER_MEM_HOST;
        if ((want == KVF_XFER_MEM_CUDA) && (*type_p != KVF_XFER_MEM_CUDA)) {
            kvf_error("%s: the region at %p was declared cuda memory, and CUDA does not know"
                      " it as device memory", agent->name, addr);
            return KVF_ERR_INVALID_PARAM;
        }
    }
    if (kvf_ucx_agent_mem_reach(agent, *type_p, what, sizeof(what)) != KVF_OK) {
        kvf_error("%s: the region at %p is %s memory, and this UCX cannot register it (%s):"
                  " a pool in device memory needs a UCX built with CUDA (-DKVF_UCX_PREFIX)",
                  agent->name, addr, kvf_xfer_mem_type_name(*type_p), what);
        return KVF_ERR_UNSUPPORTED;
    }
    return KVF_OK;
}

/*
 * Map @a len bytes as the agent's next region: @a addr given (register; CUDA
 * device memory is mapped as UCS_MEMORY_TYPE_CUDA), or NULL with
 * UCP_MEM_MAP_ALLOCATE (UCX allocates host memory; the address is queried
 * back). *addr_p receives the region's address.
 */
static kvf_status_t kvf_ucx_agent_map(kvf_ucx_agent_h agent, void *addr, size_t len,
                                      int want, void **addr_p, int *region_p)
{
    ucp_mem_map_params_t mp;
    ucp_mem_attr_t attr;
    kvf_ucx_region_t *r;
    kvf_xfer_mem_type_t type;
    kvf_status_t status;

    if (agent->num_regions == KVF_XFER_MAX_REGIONS) {
        kvf_error("%s: more than %d registered regions", agent->name, KVF_XFER_MAX_REGIONS);
        return KVF_ERR_NO_RESOURCE;
    }
    status = kvf_ucx_map_type(agent, addr, want, &type);
    if (status != KVF_OK) {
        return status;
    }
    r = &agent->regions[agent->num_regions];
    memset(&mp, 0, sizeof(mp));
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    mp.address = addr;
    mp.length = len;
#if KVF_UCX_HAS_MEM_TYPE_PARAMS
    if (type != KVF_XFER_MEM_HOST) {
        /* never with UCP_MEM_MAP_ALLOCATE: addr is given (kvf_device_alloc()) */
        mp.field_mask |= UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
        mp.memory_type = kvf_ucx_mem_type(type);
    }
#endif
    /* UCX 1.13.1 ignores prot (kvf_ucx_access_t); set for a UCX that honours it */
    mp.field_mask |= UCP_MEM_MAP_PARAM_FIELD_PROT;
    mp.prot = UCP_MEM_MAP_PROT_LOCAL_READ | UCP_MEM_MAP_PROT_LOCAL_WRITE;
    if (agent->access != KVF_UCX_ACCESS_LOCAL) {
        mp.prot |= UCP_MEM_MAP_PROT_REMOTE_READ;
    }
    if (agent->access == KVF_UCX_ACCESS_REMOTE_RW) {
        mp.prot |= UCP_MEM_MAP_PROT_REMOTE_WRITE;
    }
    if (addr == NULL) {
        mp.field_mask |= UCP_MEM_MAP_PARAM_FIELD_FLAGS;
        mp.flags = UCP_MEM_MAP_ALLOCATE;
    }
    KVF_UCX_CHECK(ucp_mem_map(agent->context, &mp, &r->memh));
    if (addr == NULL) {
        memset(&attr, 0, sizeof(attr));
        attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
        if ((ucp_mem_query(r->memh, &attr) != UCS_OK) || (attr.address == NULL) ||
            (attr.length < len)) {
            KVF_UCX_CHECK_IGNORE(ucp_mem_unmap(agent->context, r->memh));
            kvf_error("%s: UCX allocated no usable %zu-byte region", agent->name, len);
            return KVF_ERR_NO_MEMORY;
        }
        addr = attr.address;
    }
    r->addr = addr;
    r->len = len;
    r->access = agent->access;
    r->mem_type = type;
    *addr_p = addr;
    *region_p = agent->num_regions++;
    return KVF_OK;
}

kvf_status_t kvf_ucx_agent_mem_register(kvf_ucx_agent_h agent, void *addr, size_t len,
                                        int *region_p)
{
    void *mapped;

    if ((addr == NULL) || (len == 0)) {
        return KVF_ERR_INVALID_PARAM;
    }
    return kvf_ucx_agent_map(agent, addr, len, KVF_UCX_MEM_DETECT, &mapped, region_p);
}

kvf_status_t kvf_ucx_agent_mem_register_type(kvf_ucx_agent_h agent, void *addr, size_t len,
                                             kvf_xfer_mem_type_t type, int *region_p)
{
    void *mapped;

    if ((addr == NULL) || (len == 0)) {
        return KVF_ERR_INVALID_PARAM;
    }
    return kvf_ucx_agent_map(agent, addr, len, (int)type, &mapped, region_p);
}

kvf_status_t kvf_ucx_agent_mem_alloc(kvf_ucx_agent_h agent, size_t len, void **addr_p,
                                     int *region_p)
{
    if ((len == 0) || (addr_p == NULL) || (region_p == NULL)) {
        return KVF_ERR_INVALID_PARAM;
    }
    return kvf_ucx_agent_map(agent, NULL, len, KVF_XFER_MEM_HOST, addr_p, region_p);
}

/*
 * Design: a peer's packed key is opaque. It is bounded here and handed to
 * ucp_ep_rkey_unpack() as it came; what vouches for it is who sent it (an
 * authenticated pool member, docs/SECURITY.md "Remote keys").
 * Rejected: walking UCX's packed layout to refuse garbage before UCX sees
 * it. That layout is UCX's private format and changes between versions
 * (UCX 1.22 appends bytes to a CUDA key that the 1.13 layout has no room
 * for), so the walk refused every key of a newer UCX, and learning the
 * layout meant registering a shared scratch buffer in every agent.
 */
kvf_status_t kvf_ucx_rkey_check(const uint8_t *rkey, size_t len, char *why, size_t why_len)
{
    if ((rkey == NULL) || (len < 1) || (len > KVF_RKEY_MAX)) {
        snprintf(why, why_len, "rkey_len %zu is outside 1..%d", len, KVF_RKEY_MAX);
        return KVF_ERR_PARSE;
    }
    return KVF_OK;
}

kvf_status_t kvf_ucx_agent_region_meta(kvf_ucx_agent_h agent, int region,
                                       kvf_xfer_region_meta_t *meta_p)
{
    void *rkey_buf;
    size_t rkey_len;

    if ((region < 0) || (region >= agent->num_regions)) {
        return KVF_ERR_INVALID_PARAM;
    }
    meta_p->addr = (uint64_t)(uintptr_t)agent->regions[region].addr;
    meta_p->length = agent->regions[region].len;
    meta_p->mem_type = agent->regions[region].mem_type;
    if (agent->regions[region].access == KVF_UCX_ACCESS_LOCAL) {
        meta_p->rkey_len = 0;   /* not remotely accessible: no key exists to leak */
        return KVF_OK;
    }
    KVF_UCX_CHECK(ucp_rkey_pack(agent->context, agent->regions[region].memh, &rkey_buf,
                                &rkey_len));
    if (rkey_len > KVF_RKEY_MAX) {
        kvf_error("%s: packed rkey of %zu bytes exceeds %d", agent->name, rkey_len,
                  KVF_RKEY_MAX);
        ucp_rkey_buffer_release(rkey_buf);
        return KVF_ERR_NO_RESOURCE;
    }
    meta_p->rkey_len = rkey_len;
    memcpy(meta_p->rkey, rkey_buf, rkey_len);
    ucp_rkey_buffer_release(rkey_buf);
    return KVF_OK;
}

