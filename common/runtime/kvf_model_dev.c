/*
 * The model on a device: parsing and opening a --device value, and moving
 * the loaded weights into a CUDA device's memory (kvf_model.h,
 * kvf_model_load_device()).
 *
 * Design: the loader (kvf_model.c) reads every tensor into host memory as
 * on the CPU; kvf_model_upload() then replaces each host buffer by a device
 * copy, one tensor at a time (peak host memory: the host model plus one
 * widened matrix). By default (KVF_GPU_WEIGHTS unset, empty or "native")
 * bf16/fp16 matrices stay 16-bit and the forward runs their GEMMs on tensor
 * cores through cuBLASLt (kernels/kvf_gemm_narrow.h: activations rounded
 * to 16 bits, fp32 accumulation, as a bf16 PyTorch model computes; one
 * pinned algorithm per weight shape, so batch invariant: kvf_gemm_plan.h;
 * not the CPU's bits). "exact" is the debugging mode with the CPU's bits:
 * bf16 matrices kept bf16 and widened in the registers of the fixed-order
 * GEMM (kvf_gemm_w), fp16 ones widened to fp32 on the host (kvf_convert).
 * "fp32" widens bf16 too (the same bits as exact, twice the memory). fp32
 * checkpoints are the same in every mode. Each pointer
 * is either host or device memory at any moment, and
 * kvf_model_wfree() asks which (kvf_device_ptr_is_cuda), so a model whose
 * upload failed half way is freed correctly. A CPU model never reaches
 * this file's CUDA paths: its buffers are host memory, freed with free().
 */
#include "kvf_model_int.h"

#include <errno.h>
#include <limits.h>

/* ---- --device ---------------------------------------------------------------- */

#ifdef KVF_HAVE_CUDA
/* The first CUDA failure of kvf_device_init(), caught from the kernels' reporter. The
 * reporter is process-wide and swapped for the one call: meant for start-up, before other
 * threads use CUDA (a report of theirs meanwhile would land in their own buffer, unlogged). */
static _Thread_local char kvf_dev_err_call[64], kvf_dev_err_text[160];

static void kvf_dev_capture(const char *call, const char *error)
{
    size_t n = strcspn(call, "(");   /* "cudaGetDeviceCount(&count)" -> the function name */

    if (kvf_dev_err_call[0] != '\0') {
        return;
    }
    if (n >= sizeof(kvf_dev_err_call)) {
        n = sizeof(kvf_dev_err_call) - 1;
    }
    memcpy(kvf_dev_err_call, call, n);
    kvf_dev_err_call[n] = '\0';
    snprintf(kvf_dev_err_text, sizeof(kvf_dev_err_text), "%s", error);
}

/* Open CUDA device @a ordinal, naming the value and the CUDA error on failure. */
static kvf_status_t kvf_device_open_cuda(const char *what, int ordinal, kvf_device_t *dev_p)
{
    kvf_device_t dev;
    int e;

    kvf_dev_err_call[0] = '\0';
    kvf_dev_err_text[0] = '\0';
    kvf_kern_set_report_func(kvf_dev_capture);
    e = kvf_device_init(KVF_DEVICE_CUDA, ordinal, &dev);
    kvf_kern_set_report_func(NULL);   /* back to the default reporter (the log) */
    if (e == KVF_KERN_OK) {
        *dev_p = dev;
        return KVF_OK;
    }
    if (kvf_dev_err_call[0] != '\0') {
        kvf_error("%s cuda:%d: no CUDA device (%s: %s)", what, ordinal, kvf_dev_err_call,
                  kvf_dev_err_text);
    } else {
        kvf_error("%s cuda:%d: no CUDA device with index %d (%s)", what, ordinal, ordinal,
                  kvf_kern_strerror(e));
    }
    return kvf_status_from_kern(e);
}
#endif

/* "cpu", "cuda", "cuda:N" -> kind and ordinal; false when it does not parse. */
static bool kvf_device_parse(const char *value, kvf_device_kind_t *kind_p, int *ordinal_p)
{
    if (strcmp(value, "cpu") == 0) {
        *kind_p = KVF_DEVICE_CPU;
        *ordinal_p = 0;
        return true;
    }
    if (strcmp(value, "cuda") == 0) {
        *kind_p = KVF_DEVICE_CUDA;
        *ordinal_p = 0;
        return true;
    }
    if (strncmp(value, "cuda:", 5) == 0) {
        char *end;
        long v;
        errno = 0;
        v = strtol(value + 5, &end, 10);
        if ((end == value + 5) || (*end != '\0') || (errno != 0) || (v < 0) || (v > INT_MAX)) {
            return false;
        }
        *kind_p = KVF_DEVICE_CUDA;
        *ordinal_p = (int)v;
        return true;
    }
    return false;
}

kvf_status_t kvf_model_device_open(const char *what, const char *value, kvf_device_t *dev_p)
{
    kvf_device_kind_t kind;
    int ordinal;

    if ((value == NULL) || !kvf_device_parse(value, &kind, &ordinal)) {
        kvf_error("bad value '%s' for %s: cpu, cuda or cuda:N (N a device index)",
                  (value != NULL) ? value : "(null)", what);
        return KVF_ERR_INVALID_PARAM;
    }
    if (kind == KVF_DEVICE_CPU) {
        *dev_p = kvf_device_cpu();
        return KVF_OK;
    }
#ifdef KVF_HAVE_CUDA
    return kvf_device_open_cuda(what, ordinal, dev_p);
#else
    kvf_error("%s cuda:%d: CUDA is not built in (configure with -DKVF_CUDA=ON on a machine "
              "with nvcc)", what, ordinal);
    return KVF_ERR_UNSUPPORTED;
#endif
}

/* ---- weights to the device ------------------------------------------------------ */

void kvf_model_wfree(kvf_model_h m, void *p)
{
    if (p == NULL) {
        return;
    }
    if ((m->dev.kind != KVF_DEVICE_CPU) && kvf_device_ptr_is_cuda(p)) {
        kvf_device_free(&m->dev, p);
    } else {
        free(p);
    }
}

void kvf_model_rep_free(kvf_model_h m, kvf_rep_w_t *rep)
{
    for (int l = 0; (rep->norm_w != NULL) && (l < m->cfg.num_layers); ++l) {
        kvf_model_wfree(m, rep->norm_w[l]);
    }
    for (int l = 0; (rep->norm2_w != NULL) && (l < m->cfg.num_layers); ++l) {
        kvf_model_wfree(m, rep->norm2_w[l]);
    }
    for (int l = 0; (rep->post_w != NULL) && (l < 2 * m->cfg.num_layers); ++l) {
        kvf_model_wfree(m, rep->post_w[l]);
    }
    free(rep->norm_w);
    free(rep->norm2_w);
    free(rep->post_w);
    if (rep->lm_head.data != rep->embed.data) {
        kvf_model_wfree(m, rep->lm_head.data);
    }
    kvf_model_wfree(m, rep->embed.data);
    kvf_model_wfree(m, rep->norm_f);
    kvf_model_wfree(m, rep->inv_freq);
    kvf_model_wfree(m, rep->inv_freq_local);
    memset(rep, 0, sizeof(*rep));
}

kvf_status_t kvf_model_gpu_open(kvf_model_h m, const kvf_device_t *dev)
{
    const int tp = m->tp;
    kvf_device_t *devs = calloc((size_t)tp, sizeof(*devs));

    if (devs == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    m->dev = *dev;
    m->gpu_devs = devs;   /* freed with the model */
    devs[0] = *dev;
    for (int r = 1; r < tp; ++r) {
#ifdef KVF_HAVE_CUDA
        char what[96];
        kvf_status_t status;

        snprintf(what, sizeof(what), "--device cuda:%d --tp %d, rank %d (one GPU per rank):",
                 dev->ordinal, tp, r);
        status = kvf_device_open_cuda(what, dev->ordinal + r, &devs[r]);
        if (status != KVF_OK) {
            return status;
        }
#else
        kvf_error("model: rank %d on cuda:%d: CUDA is not built in", r, dev->ordinal + r);
        return KVF_ERR_UNSUPPORTED;
#endif
    }
    /* opening a device makes it current: the loading thread goes back to rank 0's (the
     * first CUDA call of a model loaded without kvf_model_device_open: a missing GPU fails
     * here, before any weight is read) */
    int e = kvf_device_bind(&devs[0]);
    if (e != KVF_KERN_OK) {
        kvf_error("model: cuda:%d cannot be made current: %s", dev->ordinal,
                  kvf_kern_strerror(e));
    }
    return kvf_status_from_kern(e);
}

/* A device copy on @a dev of @a bytes at host @a src, into *dst_p (NULL src: nothing). */
static kvf_status_t kvf_up_copy(const kvf_device_t *dev, const void *src, size_t bytes,
                                void **dst_p)
{
    void *d = NULL;
    int e;

    if ((src == NULL) || (bytes == 0)) {
        return KVF_OK;
    }
    e = kvf_device_alloc(dev, bytes, &d);
    if (e == KVF_KERN_OK) {
        e = kvf_device_memcpy(dev, d, src, bytes, KVF_COPY_H2D);
        if (e != KVF_KERN_OK) {
            kvf_device_free(dev, d);
        }
    }
    if (e != KVF_KERN_OK) {
        kvf_error("model: copying %zu bytes of weights to cuda:%d failed: %s", bytes,
                  dev->ordinal, kvf_kern_strerror(e));
        return kvf_status_from_kern(e);
    }
    *dst_p = d;
    return KVF_OK;
}

/* Replace host buffer *p (bytes) by a device copy; the host copy is freed on success. */
static kvf_status_t kvf_up_bytes(const kvf_device_t *dev, void **p, size_t bytes)
{
    void *d = NULL;
    kvf_status_t status = kvf_up_copy(dev, *p, bytes, &d);

    if ((status == KVF_OK) && (d != NULL)) {
        free(*p);
        *p = d;
    }
    return status;
}

static kvf_status_t kvf_up_vec(const kvf_device_t *dev, float **p, size_t n)
{
    return kvf_up_bytes(dev, (void **)p, n * sizeof(float));
}

/* A host matrix widened to fp32 in place (if stored narrower); bytes added to the count. */
static kvf_status_t kvf_widen_mat(kvf_model_h m, kvf_mat_t *w)
{
    size_t n = (size_t)w->rows * (size_t)w->cols;
    float *wide;

    if ((w->data == NULL) || (w->dtype == KVF_DTYPE_FP32)) {
        return KVF_OK;
    }
    wide = malloc((n ? n : 1) * sizeof(float));
    if (wide == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    (void)kvf_convert(NULL, wide, KVF_DTYPE_FP32, w->data, w->dtype, n);
    m->weight_bytes += n * (sizeof(float) - kvf_dtype_size(w->dtype));
    free(w->data);
    w->data = wide;
    w->dtype = KVF_DTYPE_FP32;
    return KVF_OK;
}

/* KVF_GPU_WEIGHTS (kernels/kvf_gemm_plan.h: the values and the path each matrix takes);
 * anything else refused by name. */
typedef kvf_gpu_weights_t kvf_gpu_w_mode_t;

static kvf_status_t kvf_gpu_weights_mode(kvf_gpu_w_mode_t *mode_p)
{
    const char *env = getenv("KVF_GPU_WEIGHTS");

    if (kvf_gpu_weights_parse(env, mode_p) == 0) {
        return KVF_OK;
    }
    kvf_error("bad value '%s' for KVF_GPU_WEIGHTS: %s", env, kvf_gpu_weights_help());
    return KVF_ERR_INVALID_PARAM;
}

/* Whether a host matrix stays in its dtype on the GPU under @a mode (else it is widened to
 * fp32 first). */
static bool kvf_gpu_keeps(const kvf_mat_t *w, kvf_gpu_w_mode_t mode)
{
    return kvf_gpu_weights_keeps(mode, w->dtype) != 0;
}

/* Whether a kept matrix runs its GEMMs on tensor cores (cuBLASLt: kvf_gemm_narrow). */
static bool kvf_gpu_tc(const kvf_mat_t *w, kvf_gpu_w_mode_t mode)
{
    return kvf_gpu_gemm_path(mode, w->dtype) == KVF_GEMM_PATH_LT;
}

/* A matrix: widened to fp32 on the host unless kvf_gpu_keeps() it, then moved to @a dev in
 * its dtype; a kept 16-bit one under native is marked for the tensor-core GEMM. */
static kvf_status_t kvf_up_mat(kvf_model_h m, const kvf_device_t *dev, kvf_mat_t *w,
                               kvf_gpu_w_mode_t mode)
{
    kvf_status_t status = kvf_gpu_keeps(w, mode) ? KVF_OK : kvf_widen_mat(m, w);

    if (status != KVF_OK) {
        return status;
    }
    w->tensor_cores = kvf_gpu_tc(w, mode);
    return kvf_up_bytes(dev, &w->data,
                        (size_t)w->rows * (size_t)w->cols * kvf_dtype_size(w->dtype));
}

#define KVF_UP(_expr)                  \
    do {                               \
        if (status == KVF_OK) {        \
            status = (_expr);          \
        }                              \
    } while (0)

static kvf_status_t kvf_up_layer(kvf_model_h m, const kvf_device_t *dev, const kvf_shard_t *s,
                                 kvf_layer_w_t *w, kvf_gpu_w_mode_t nat)
{
    const kvf_model_config_t *cfg = &m->cfg;
    const size_t H = (size_t)cfg->hidden_size, hd = (size_t)cfg->head_dim;
    const size_t heads = (size_t)s->mamba_heads, cd = (size_t)s->conv_dim;
    kvf_status_t status = KVF_OK;

    KVF_UP(kvf_up_mat(m, dev, &w->in_proj, nat));
    KVF_UP(kvf_up_vec(dev, &w->in_bias, (size_t)w->in_rows));
    KVF_UP(kvf_up_vec(dev, &w->conv_w, cd * (size_t)cfg->conv_kernel));
    KVF_UP(kvf_up_vec(dev, &w->conv_b, cd));
    KVF_UP(kvf_up_vec(dev, &w->dt_bias, heads));
    KVF_UP(kvf_up_vec(dev, &w->A_log, heads));
    KVF_UP(kvf_up_vec(dev, &w->D, heads));
    /* Gated DeltaNet: one [head_dim] norm weight shared by the heads; Mamba2: per channel */
    KVF_UP(kvf_up_vec(dev, &w->gnorm_w, ((cfg->state_kind == KVF_STATE_GDN) ? 1 : heads) *
                                        (size_t)cfg->mamba_head_dim));
    KVF_UP(kvf_up_mat(m, dev, &w->out_proj, nat));
    KVF_UP(kvf_up_vec(dev, &w->out_bias, H));
    KVF_UP(kvf_up_mat(m, dev, &w->qkv, nat));
    KVF_UP(kvf_up_vec(dev, &w->qkv_bias, (size_t)w->qkv_rows));
    KVF_UP(kvf_up_mat(m, dev, &w->o_proj, nat));
    KVF_UP(kvf_up_vec(dev, &w->o_bias, H));
    KVF_UP(kvf_up_vec(dev, &w->q_norm, hd));
    KVF_UP(kvf_up_vec(dev, &w->k_norm, hd));
    KVF_UP(kvf_up_mat(m, dev, &w->up, nat));
    KVF_UP(kvf_up_vec(dev, &w->up_bias, (size_t)w->up.rows));
    KVF_UP(kvf_up_mat(m, dev, &w->down, nat));
    KVF_UP(kvf_up_vec(dev, &w->down_bias, H));
    KVF_UP(kvf_up_vec(dev, &w->router_w, (size_t)cfg->moe_num_experts * H));
    KVF_UP(kvf_up_vec(dev, &w->router_b, (size_t)cfg->moe_num_experts));
    KVF_UP(kvf_up_vec(dev, &w->router_lin_b, (size_t)cfg->moe_num_experts));
    KVF_UP(kvf_up_vec(dev, &w->sinks, (size_t)s->attn_heads));
    KVF_UP(kvf_up_vec(dev, &w->exp_up_b, (size_t)s->moe_experts * 2u *
                      (size_t)cfg->moe_intermediate_size));
    KVF_UP(kvf_up_vec(dev, &w->exp_down_b, (size_t)s->moe_experts * H));
    for (int e = 0; (w->exp_up != NULL) && (e < s->moe_experts); ++e) {
        KVF_UP(kvf_up_mat(m, dev, &w->exp_up[e], nat));
        KVF_UP(kvf_up_mat(m, dev, &w->exp_down[e], nat));
    }
    KVF_UP(kvf_up_mat(m, dev, &w->sh_up, nat));
    KVF_UP(kvf_up_vec(dev, &w->sh_up_b, (size_t)w->sh_up.rows));
    KVF_UP(kvf_up_mat(m, dev, &w->sh_down, nat));
    KVF_UP(kvf_up_vec(dev, &w->sh_down_b, H));
    KVF_UP(kvf_up_vec(dev, &w->sh_gate, H));   /* qwen3_next's shared expert gate */
    return status;
}

/* Rank @a r's own copy of the replicated tensors (host m->rep: fp32, or embeddings and
 * lm_head in the checkpoint's 16-bit dtype where kvf_gpu_keeps() them) on its device. */
static kvf_status_t kvf_up_rep(kvf_model_h m, int r)
{
    const kvf_model_config_t *cfg = &m->cfg;
    const kvf_device_t *dev = &m->ranks[r].dev;
    const size_t H = (size_t)cfg->hidden_size, V = (size_t)cfg->vocab_size;
    const size_t L = (size_t)(cfg->num_layers > 0 ? cfg->num_layers : 1);
    const bool tied = (m->rep.lm_head.data == m->rep.embed.data);
    kvf_rep_w_t *rep = calloc(1, sizeof(*rep));
    kvf_status_t status = KVF_OK;

    if (rep == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    m->ranks[r].rep = rep;   /* freed with the model, whatever was copied */
    rep->embed = m->rep.embed;
    rep->lm_head = m->rep.lm_head;
    rep->embed.data = rep->lm_head.data = NULL;
    rep->norm_w = calloc(L, sizeof(*rep->norm_w));
    rep->norm2_w = calloc(L, sizeof(*rep->norm2_w));
    rep->post_w = calloc(2 * L, sizeof(*rep->post_w));
    if ((rep->norm_w == NULL) || (rep->norm2_w == NULL) || (rep->post_w == NULL)) {
        return KVF_ERR_NO_MEMORY;
    }
    KVF_UP(kvf_up_copy(dev, m->rep.embed.data, V * H * kvf_dtype_size(m->rep.embed.dtype),
                       &rep->embed.data));
    if (tied) {
        rep->lm_head.data = rep->embed.data;
    } else {
        KVF_UP(kvf_up_copy(dev, m->rep.lm_head.data,
                           V * H * kvf_dtype_size(m->rep.lm_head.dtype), &rep->lm_head.data));
    }
    KVF_UP(kvf_up_copy(dev, m->rep.norm_f, H * sizeof(float), (void **)&rep->norm_f));
    KVF_UP(kvf_up_copy(dev, m->rep.inv_freq, (size_t)(cfg->rope.rotary_dim / 2) * sizeof(float),
                       (void **)&rep->inv_freq));
    KVF_UP(kvf_up_copy(dev, m->rep.inv_freq_local,
                       (size_t)(cfg->rope_local.rotary_dim / 2) * sizeof(float),
                       (void **)&rep->inv_freq_local));
    for (int l = 0; l < cfg->num_layers; ++l) {
        KVF_UP(kvf_up_copy(dev, m->rep.norm_w[l], H * sizeof(float), (void **)&rep->norm_w[l]));
        KVF_UP(kvf_up_copy(dev, m->rep.norm2_w[l], H * sizeof(float),
                           (void **)&rep->norm2_w[l]));
        for (int k = 2 * l; k < 2 * l + 2; ++k) {
            KVF_UP(kvf_up_copy(dev, m->rep.post_w[k], H * sizeof(float), (void **)&rep->post_w[k]));
        }
    }
    return status;
}

kvf_status_t kvf_model_upload(kvf_model_h m)
{
    const bool tied = (m->rep.lm_head.data == m->rep.embed.data);
    kvf_status_t status = KVF_OK;
    kvf_gpu_w_mode_t native = KVF_GPU_W_NATIVE;

    if ((m->dev.kind == KVF_DEVICE_CPU) || (m->gpu_devs == NULL)) {
        return KVF_OK;
    }
    status = kvf_gpu_weights_mode(&native);
    if (status != KVF_OK) {
        return status;
    }
    for (int r = 0; r < m->tp; ++r) {
        m->ranks[r].dev = m->gpu_devs[r];
    }
    /* replicated tensors: widened once on the host, then one copy per rank's GPU (counted
     * once in weight_bytes, as the CPU's shared copy) */
    if (!kvf_gpu_keeps(&m->rep.embed, native)) {
        KVF_UP(kvf_widen_mat(m, &m->rep.embed));
    }
    m->rep.embed.tensor_cores = kvf_gpu_tc(&m->rep.embed, native);
    if (tied) {
        m->rep.lm_head = m->rep.embed;   /* one copy, as on the host (also after a failure) */
    } else {
        if (!kvf_gpu_keeps(&m->rep.lm_head, native)) {
            KVF_UP(kvf_widen_mat(m, &m->rep.lm_head));
        }
        m->rep.lm_head.tensor_cores = kvf_gpu_tc(&m->rep.lm_head, native);
    }
    for (int r = 0; r < m->tp; ++r) {
        KVF_UP(kvf_up_rep(m, r));
        for (int l = 0; l < m->cfg.num_layers; ++l) {
            KVF_UP(kvf_up_layer(m, &m->ranks[r].dev, &m->ranks[r].shard,
                                &m->ranks[r].layers[l], native));
        }
    }
    /* host->device copies are only enqueued (kvf_device_memcpy()): wait for each rank's
     * stream once, so a copy that failed fails the load, and leave the thread on rank 0's */
    for (int r = m->tp - 1; (status == KVF_OK) && (r >= 0); --r) {
        int e = kvf_device_bind(&m->ranks[r].dev);
        e = (e == KVF_KERN_OK) ? kvf_device_sync(&m->ranks[r].dev) : e;
        if (e != KVF_KERN_OK) {
            kvf_error("model: the weights' copy to cuda:%d failed: %s", m->ranks[r].dev.ordinal,
                      kvf_kern_strerror(e));
            status = kvf_status_from_kern(e);
        }
    }
    if (status == KVF_OK) {
        kvf_model_rep_free(m, &m->rep);   /* the host copy: every rank has its own now */
    }
    return status;
}
