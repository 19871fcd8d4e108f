/*
 * Which Mamba2 prompt scan the forward runs, and on which state grid (kvf_model.h,
 * kvf_model_set_state_grid()).
 *
 * Design: the chunked (SSD) scan rounds a 16-bit state only at absolute multiples of its
 * grid (kernels/kvf_ssd.h), so it gives the bits of the uncut prompt exactly when a prompt
 * is cut on that grid. The scheduler cuts prompt chunks on its state grid and the prefix
 * cache checkpoints states on it; making the scan's grid the same value means a restored
 * checkpoint is the state a recompute would reach, bit for bit, and chunking by load
 * changes no bit. Rejected: a scan grid of its own (a cache hit or a chunk cut off it
 * would differ from the recompute by rounding). Gated DeltaNet models (qwen3_next,
 * qwen3_5_text) take the same switch and the same grid for their chunked scan
 * (kernels/kvf_gdn.h, kvf_gdn_scan_chunked: the WY form, chunk length = the grid), for the
 * same reasons; Rejected there: a fixed chunk of its own inside the grid (64 tokens, say):
 * with a grid that is not its multiple the cuts on the grid would not be chunk ends, and
 * the grid is already one engine-wide length.
 */
#include "kvf_model_int.h"
#include "kvf_fwd_profile.h"
#include "kvf_gemm_plan.h"
#include "kvf_log.h"
#include "kvf_gdn.h"
#include "kvf_ssd.h"

#include <stdlib.h>
#include <string.h>

int kvf_model_scan_chunked(kvf_model_h m)
{
    const char *env = getenv("KVF_MAMBA_SCAN");
    kvf_gpu_weights_t wmode = KVF_GPU_W_NATIVE;

    if ((env != NULL) && (strcmp(env, "chunked") == 0)) {
        return 1;
    }
    if ((env != NULL) && (strcmp(env, "token") == 0)) {
        return 0;
    }
    if ((env != NULL) && (env[0] != '\0')) {
        return -1;
    }
    /* the default: chunked on a GPU with tensor-core weights; token by token on the CPU
     * and under KVF_GPU_WEIGHTS=exact/fp32, the modes that give the CPU's bits */
    if ((kvf_model_device(m)->kind == KVF_DEVICE_CPU) ||
        (kvf_gpu_weights_parse(getenv("KVF_GPU_WEIGHTS"), &wmode) != 0)) {
        return 0;
    }
    return (wmode == KVF_GPU_W_NATIVE) ? 1 : 0;
}

kvf_status_t kvf_model_set_state_grid(kvf_model_h m, int grid)
{
    const int chunked = kvf_model_scan_chunked(m);
    const bool gdn = (m->cfg.state_kind == KVF_STATE_GDN);
    bool mamba = false;

    for (int l = 0; l < m->cfg.num_layers; ++l) {
        mamba = mamba || (m->cfg.layer_kinds[l] == KVF_LAYER_MAMBA);
    }
    if (chunked < 0) {
        kvf_error("bad value '%s' for KVF_MAMBA_SCAN: chunked (the Mamba2 / Gated DeltaNet "
                  "prompt scan in chunks on the state grid; the default on a GPU) or token "
                  "(token by "
                  "token: the CPU's bits; the default on the CPU)", getenv("KVF_MAMBA_SCAN"));
        return KVF_ERR_INVALID_PARAM;
    }
    if (grid < 1) {
        kvf_error("state grid %d tokens: must be >= 1", grid);
        return KVF_ERR_INVALID_PARAM;
    }
    if (mamba && chunked && (grid > (gdn ? KVF_GDN_MAX_GRID : KVF_SSD_MAX_GRID))) {
        const int most = gdn ? KVF_GDN_MAX_GRID : KVF_SSD_MAX_GRID;
        kvf_error("--prefix-state-grid %d tokens exceeds the chunked %s scan's largest "
                  "grid %d (give at most %d, or KVF_MAMBA_SCAN=token)", grid,
                  gdn ? "Gated DeltaNet" : "Mamba2", most, most);
        return KVF_ERR_INVALID_PARAM;
    }
    m->scan_grid = (mamba && chunked) ? grid : 0;
    if (m->scan_grid > 0) {
        kvf_info("%s prompt scan: chunked (%s) on the state grid of %d tokens",
                 gdn ? "Gated DeltaNet" : "Mamba2", gdn ? "WY form" : "SSD", grid);
    }
    return KVF_OK;
}

int kvf_model_scan_grid(kvf_model_h m)
{
    return m->scan_grid;
}

/* Whether a seq's one-token Mamba2 step is a prompt token's (the scan's dt clamp) or an
 * output's (not clamped); with prompt_len set, the token's position decides
 * (kvf_fwd_seq_t.prompt_len). The one place that decides it for the batched decode call, the
 * per-seq step and a graphed step's inputs. */
bool kvf_fwd_step_is_prompt(const kvf_fwd_seq_t *sq)
{
    return (sq->prompt_len > 0) ? (sq->start < sq->prompt_len) : sq->prompt;
}

/* The Mamba2 scan of seq @a sq's tokens (rows from @a o of the layer's xbc / proj / ybuf):
 * its prompt tokens [0, np) with the scan's dt clamp, chunked on the model's state grid
 * from the request's position when set (kvf_model_set_state_grid: cut on that grid, the
 * bits of one call), then its outputs (a recompute) token by token (a token-by-token scan
 * in two calls gives the bits of one). */
kvf_status_t kvf_fwd_scan_seq(kvf_model_h m, const kvf_rank_ctx_t *ctx, const kvf_device_t *dev,
                              const kvf_mamba2_params_t *mp_scan,
                              const kvf_mamba2_params_t *mp_step, const kvf_fwd_seq_t *sq, int np,
                              int o, int R, void *ssm_state, kvf_status_t status)
{
    const kvf_shard_t *s = &m->ranks[ctx->rank].shard;
    struct kvf_model_ws *ws = ctx->ws;
    const int n = sq->num_tokens, N = m->cfg.ssm_state_size;
    const int dim = s->mamba_heads * m->cfg.mamba_head_dim, cd = s->conv_dim;
    const kvf_dtype_t sdt = ctx->geom->ssm_dtype;

    for (int part = 0; part < 2; ++part) {
        const int t0 = (part == 0) ? 0 : np, tn = (part == 0) ? np : n - np;
        const size_t r0 = (size_t)(o + t0) * (size_t)R;
        const float *x = ws->xbc + (size_t)(o + t0) * cd, *dt = ws->proj + r0 + dim + cd;
        const float *B = x + dim, *C = x + dim + s->groups * N;
        const int has = (sq->start > 0) || (t0 > 0);

        if (tn == 0) {
            continue;
        }
        if ((part == 0) && (m->scan_grid > 0)) {
            KVF_KCALL(kvf_mamba2_scan_chunked(dev, mp_scan, tn, (long long)sq->start,
                                              m->scan_grid, x, cd, dt, R, B, C, cd, ssm_state,
                                              sdt, has, ws->ybuf + r0, R));
        } else {
            KVF_KCALL(kvf_mamba2_scan(dev, (part == 0) ? mp_scan : mp_step, tn, x, cd, dt, R, B,
                                      C, cd, ssm_state, sdt, has, ws->ybuf + r0, R));
        }
    }
    return status;
}

