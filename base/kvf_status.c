/* String table for kvf_status_t, generated from KVF_STATUS_MAP so no code lacks one. */
#include "kvf_status.h"

const char *kvf_status_str(kvf_status_t status)
{
    switch (status) {
#define KVF_STATUS_CASE(_name, _val, _str) case _name: return _str;
    KVF_STATUS_MAP(KVF_STATUS_CASE)
#undef KVF_STATUS_CASE
    }
    return "unknown status";
}
