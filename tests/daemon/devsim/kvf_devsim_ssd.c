/*
 * TEST ONLY (kvf-devsim, kvf_devsim.c): what the simulated GPU records of the Mamba2 prompt
 * scans. The forward on a GPU scans prompt tokens in SSD chunks on the engine's state grid
 * (kvf_model_set_state_grid); a test reads which scan ran, on which grid, and whether each
 * chunked call's scratch fits the arena reserved at start (a real GPU would fall back to an
 * allocation there, counted as a slow path):
 *   ssd_calls C ssd_grid G ssd_ws_errors E token_scan_calls S
 * and alike of the Gated DeltaNet prompt scans (kvf_gdn_scan_chunked, kvf_gdn_scan):
 *   gdn_chunked_calls C gdn_grid G gdn_ws_errors E gdn_token_calls S
 */
#include "kvf_devsim_ssd.h"
#include "kvf_gdn.h"
#include "kvf_ssd.h"

#include <pthread.h>
#include <stdint.h>

static pthread_mutex_t ssd_lock = PTHREAD_MUTEX_INITIALIZER;
static size_t ssd_arena_min = SIZE_MAX;
static unsigned long long ssd_calls, ssd_ws_errors, ssd_token_calls;
static int ssd_grid;
static unsigned long long gdn_calls, gdn_ws_errors, gdn_token_calls;
static int gdn_grid;

void devsim_ssd_reserved(size_t device_bytes)
{
    pthread_mutex_lock(&ssd_lock);
    ssd_arena_min = (device_bytes < ssd_arena_min) ? device_bytes : ssd_arena_min;
    pthread_mutex_unlock(&ssd_lock);
}

void devsim_ssd_chunked(const kvf_mamba2_params_t *p, int T, long long pos0, int grid)
{
    const size_t need = kvf_ssd_scratch_bytes(p, T, pos0, grid);

    pthread_mutex_lock(&ssd_lock);
    ssd_calls++;
    ssd_grid = grid;
    if ((ssd_arena_min == SIZE_MAX) || (need > ssd_arena_min)) {
        ssd_ws_errors++;
        fprintf(stderr, "devsim: kvf_mamba2_scan_chunked T %d pos0 %lld grid %d needs %zu "
                "bytes of scratch, the arena reserved holds %zu\n", T, pos0, grid, need,
                (ssd_arena_min == SIZE_MAX) ? (size_t)0 : ssd_arena_min);
    }
    pthread_mutex_unlock(&ssd_lock);
}

void devsim_gdn_chunked(const kvf_gdn_params_t *p, int T, long long pos0, int grid)
{
    const size_t need = kvf_gdn_scratch_bytes(p, T, grid);

    pthread_mutex_lock(&ssd_lock);
    gdn_calls++;
    gdn_grid = grid;
    if ((ssd_arena_min == SIZE_MAX) || (need > ssd_arena_min)) {
        gdn_ws_errors++;
        fprintf(stderr, "devsim: kvf_gdn_scan_chunked T %d pos0 %lld grid %d needs %zu "
                "bytes of scratch, the arena reserved holds %zu\n", T, pos0, grid, need,
                (ssd_arena_min == SIZE_MAX) ? (size_t)0 : ssd_arena_min);
    }
    pthread_mutex_unlock(&ssd_lock);
}

void devsim_gdn_token(void)
{
    pthread_mutex_lock(&ssd_lock);
    gdn_token_calls++;
    pthread_mutex_unlock(&ssd_lock);
}

void devsim_ssd_token(void)
{
    pthread_mutex_lock(&ssd_lock);
    ssd_token_calls++;
    pthread_mutex_unlock(&ssd_lock);
}

void devsim_ssd_report(FILE *f)
{
    pthread_mutex_lock(&ssd_lock);
    fprintf(f, " ssd_calls %llu ssd_grid %d ssd_ws_errors %llu token_scan_calls %llu",
            ssd_calls, ssd_grid, ssd_ws_errors, ssd_token_calls);
    fprintf(f, " gdn_chunked_calls %llu gdn_grid %d gdn_ws_errors %llu gdn_token_calls %llu",
            gdn_calls, gdn_grid, gdn_ws_errors, gdn_token_calls);
    pthread_mutex_unlock(&ssd_lock);
}
