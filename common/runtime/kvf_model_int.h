/*
 * Internal to the model (kvf_model.c: loading; kvf_model_fwd.c: workspace and
 * forward): the resident weights of every rank and the per-rank workspace.
 * kvf_model.c's opening comment describes the design.
 */
#ifndef KVF_MODEL_INT_H
#define KVF_MODEL_INT_H


#include "kvf_model.h"
#include "kvf_checkpoint.h"
#include "kvf_fwd_profile.h"
#include "kvf_kern_status.h"
#include "kvf_log.h"
#include "kvf_safetensors.h"
#include "kvf_act.h"
#include "kvf_argmax.h"
#include "kvf_attention.h"
#include "kvf_attention_seqs.h"
#include "kvf_conv1d.h"
#include "kvf_gdn.h"
#include "kvf_gemm.h"
#include "kvf_gemm_narrow.h"
#include "kvf_gemm_plan.h"
#include "kvf_mamba2.h"
#include "kvf_moe.h"
#include "kvf_norm.h"
#include "kvf_ops.h"
#include "kvf_sample_batch.h"
#include "kvf_ssm_seqs.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A weight matrix [rows][cols] in its checkpoint dtype (fp32, bf16 or fp16). */
typedef struct kvf_mat_s {
    void       *data;
    kvf_dtype_t dtype;
    int         rows, cols;
    bool        tensor_cores;   /* 16-bit on a GPU under KVF_GPU_WEIGHTS=native (the default):
                                 * multiplied by kvf_gemm_narrow (activations rounded to 16
                                 * bits, cuBLASLt) */
} kvf_mat_t;

typedef struct {
    /* Mamba */
    kvf_mat_t in_proj;   /* [in_rows][H]: z | x | B | C | dt of this rank */
    float    *in_bias;   /* [in_rows] or NULL */
    int       in_rows;
    float    *conv_w;    /* [conv_dim][K] */
    float    *conv_b;    /* [conv_dim] or NULL */
    float    *dt_bias, *A_log, *D;   /* [heads] */
    float    *gnorm_w;   /* [heads * head_dim] */
    kvf_mat_t out_proj;  /* [H][heads * head_dim] */
    float    *out_bias;  /* [H], rank 0 only */
    /* attention */
    kvf_mat_t qkv;       /* [(q_heads + 2 kv_heads) * head_dim][H] */
    float    *qkv_bias;  /* [qkv_rows] or NULL */
    int       qkv_rows;
    kvf_mat_t o_proj;    /* [H][q_heads * head_dim] */
    float    *o_bias;    /* [H], rank 0 only */
    float    *q_norm, *k_norm;   /* [head_dim] (qwen3) */
    /* MLP: nemotron_h up/down; dense archs fused gate|up rows, then down */
    kvf_mat_t up;        /* [cols or 2 cols][H] */
    float    *up_bias;
    kvf_mat_t down;      /* [H][cols] */
    float    *down_bias; /* rank 0 only */
    /* MoE */
    float    *router_w;  /* [E][H] fp32 (replicated per rank: small) */
    float    *router_b;  /* e_score_correction_bias [E] */
    kvf_mat_t *exp_up;   /* [experts on this rank]: [moe_I][H] */
    kvf_mat_t *exp_down; /* [H][moe_I] */
    kvf_mat_t sh_up, sh_down;    /* shared expert slice */
    float    *sh_gate;   /* [H] qwen3_next: shared_expert_gate (fp32, replicated), or NULL */
    float    *sh_up_b, *sh_down_b;
    /* gpt_oss (kvf_model_gpt_oss.c) */
    float    *sinks;     /* [attn heads of this rank] attention sink logits */
    float    *router_lin_b;      /* [E] the router's linear bias (added to its logits) */
    float    *exp_up_b;  /* [experts on this rank][2 moe_I]: gate | up biases */
    float    *exp_down_b;        /* [experts on this rank][H] */
} kvf_layer_w_t;

/* ---- loading (kvf_model.c), shared with kvf_model_gdn.c ---------------------------- */

typedef struct {
    kvf_ckpt_h  ck;
    bool        dense;
    const char *prefix;  /* of the layers, embeddings, final norm: "model", "backbone",
                          * "model.language_model" (a multimodal wrapper's text) */
    const char *mamba;   /* the Mamba2 mixer's module: "mixer" (nemotron_h), "mamba" */
    char        name[256];
    size_t      bytes;   /* weights loaded so far */
    float       norm_offset;   /* added to every RMSNorm weight (gemma3_text, qwen3_next: 1) */
} kvf_loader_t;

/* nemotron_h: backbone.layers.N.<suffix>; the others: model.layers.N.<suffix> (in ld->name;
 * layer < 0: the suffix alone). */
const char *kvf_lname(kvf_loader_t *ld, int layer, const char *suffix);
/* The rows of @a n matrices of one dtype and width, concatenated into @a out (its data
 * kvf_alloc'ed, the caller's); KVF_ERR_UNSUPPORTED, logged naming @a what, when they differ. */
kvf_status_t kvf_mat_concat(const kvf_mat_t *parts, int n, const char *what, kvf_mat_t *out);
/* malloc of at least one byte. */
void *kvf_alloc(size_t bytes);
/* Rows {start, count} @a ranges of tensor @a name (shape [ndim]), of each row columns
 * [c0, c0 + cols) (cols < 0: whole rows), concatenated into *out_p as fp32 or, with
 * keep_dtype, the tensor's own dtype (*dtype_p). KVF_ERR_NOT_FOUND when absent. */
kvf_status_t kvf_load_part(kvf_loader_t *ld, const char *name, int ndim, const int64_t *shape,
                           const int64_t (*ranges)[2], int nr, int64_t c0, int64_t cols,
                           bool keep_dtype, void **out_p, kvf_dtype_t *dtype_p);
/* Whole fp32 tensor. */
kvf_status_t kvf_load_vec(kvf_loader_t *ld, const char *name, int ndim, const int64_t *shape,
                          float **out_p);
/* An RMSNorm weight [n] (fp32) plus ld->norm_offset. */
kvf_status_t kvf_load_norm(kvf_loader_t *ld, const char *name, int64_t n, float **out_p);
/* Row ranges of a 1-D tensor [n] as fp32. */
kvf_status_t kvf_load_vec_rows(kvf_loader_t *ld, const char *name, int64_t n,
                               const int64_t (*ranges)[2], int nr, float **out_p);
/* Column-parallel: row ranges of a [N][K] matrix, kept in its dtype. */
kvf_status_t kvf_load_mat_rows(kvf_loader_t *ld, const char *name, int64_t N, int64_t K,
                               const int64_t (*ranges)[2], int nr, struct kvf_mat_s *m);
/* Row-parallel: columns [c0, c0 + cols) of a [N][K] matrix, kept in its dtype. */
kvf_status_t kvf_load_mat_cols(kvf_loader_t *ld, const char *name, int64_t N, int64_t K,
                               int64_t c0, int64_t cols, struct kvf_mat_s *m);

/* An MLP's column slice [c0, c0 + C) of width I under module @a pfx of layer l (gated: the
 * gate rows, then the up rows, fused into *up); rank 0 loads down's bias. */
kvf_status_t kvf_load_mlp_part(kvf_loader_t *ld, const kvf_model_config_t *cfg, int rank, int l,
                               const char *pfx, bool gated, int64_t I, int64_t c0, int64_t C,
                               struct kvf_mat_s *up, float **up_b, struct kvf_mat_s *down,
                               float **down_b);

/* The tensors every rank uses whole (replicated): one shared copy on the CPU; on GPUs one
 * copy per rank, on the rank's device (kvf_rank_w_t.rep). */
typedef struct kvf_rep_w {
    kvf_mat_t          embed;     /* [V][H] */
    float             *norm_f;    /* [H] */
    kvf_mat_t          lm_head;   /* [V][H]; aliases embed when tied */
    float            **norm_w;    /* [L][H] pre-norm of each layer (dense: input_layernorm) */
    float            **norm2_w;   /* [L][H] dense: post_attention_layernorm */
    float             *inv_freq;  /* [rope.rotary_dim / 2] RoPE, or NULL */
    float             *inv_freq_local; /* [rope_local.rotary_dim / 2]: gemma3_text's sliding
                                          layers' RoPE, or NULL (every layer: inv_freq) */
    float            **post_w;    /* [2L][H] gemma3_text: layer l's attention-output norm at
                                     2l, its MLP-output norm at 2l + 1; NULL entries elsewhere */
} kvf_rep_w_t;

typedef struct {
    kvf_shard_t    shard;
    kvf_device_t   dev;        /* where this rank's weights live (CPU: host memory) */
    kvf_rep_w_t   *rep;        /* this rank's replicated tensors: NULL = the model's shared */
    kvf_layer_w_t *layers;
    int            max_rows;   /* widest column-parallel output of any layer */
    int            max_inner;  /* widest per-token intermediate (g buffer) */
} kvf_rank_w_t;

struct kvf_model {
    kvf_model_config_t cfg;
    int                tp;
    kvf_device_t       dev;       /* rank 0's device (CPU: every weight in host memory; CUDA:
                                   * rank r on ordinal dev.ordinal + r, ranks[r].dev) */
    kvf_rep_w_t        rep;       /* replicated tensors as loaded (host); on GPUs emptied by
                                   * kvf_model_upload() into each rank's own copy */
    kvf_device_t      *gpu_devs;  /* [tp] GPU models: rank r's device (kvf_model_gpu_open) */
    kvf_rank_w_t      *ranks;
    size_t             weight_bytes;
    size_t             file_bytes;
    int                num_files;
    int                scan_grid; /* > 0: Mamba2 / Gated DeltaNet prompt tokens scanned in
                                   * chunks on this state grid (kvf_model_set_state_grid);
                                   * 0: token by token */
};

/*
 * Buffers marked (dev) live on the rank's device (the pool's: host memory on
 * the CPU, device memory on CUDA); the others are always host memory (index
 * arrays the kernels take as HOST, and the bf16 widening tile of the CPU).
 */
struct kvf_model_ws {
    size_t cap_tokens, cap_seqs, cap_tile;
    kvf_device_t dev;           /* the device of the (dev) buffers, fixed at the first reserve */
    bool   dev_set;
    bool   dev_ws;              /* dev's kernel workspace reserved (kvf_model_ws_prepare) */
    float *h, *xn, *out;        /* [T][H] (dev) */
    float *proj, *ybuf;         /* [T][max_rows] (dev) */
    float *xbc;                 /* [T][conv_dim] (dev) */
    float *g;                   /* [T][max_inner] (dev) */
    float *sumsq;               /* [T][groups] (dev) */
    int32_t *pos;               /* [T] positions (host) */
    float *xg, *yg;             /* [T][H] MoE gather / expert output (dev) */
    float *scores;              /* [T][E] router (dev) */
    int32_t *route_idx;         /* [T][top_k] ids, then [T][top_k] fp32 weights (dev) */
    int32_t *rows;              /* [T] tokens of one expert (host) */
    float *rw;                  /* [T] their weights (host) */
    float *tile;                /* widened weight rows (host, CPU bf16/fp16 GEMMs) */
    float *last;                /* [S][H] (dev) */
    float *logits;              /* [S][V] (dev) */
    int32_t *ids;               /* [T] token ids of the step (host) */
    int32_t *last_rows;         /* [S] rows of h whose logits are wanted (host) */
    int32_t *h_route_idx;       /* host copy of route_idx, ids and weights (CUDA) */
    int     *seq_n, *seq_nb;    /* [S] tokens and attention blocks of each seq (host) */
    const int32_t **seq_tab;    /* [S] their attention block tables (host) */
    int     *dec_rows;          /* [S] rows of the seqs taking a Mamba decode step (host) */
    void   **dec_conv, **dec_ssm;  /* [S] their conv and SSM state pages (host arrays) */
    float   *dec_dtmin;         /* [S] their dt clamps (host): low */
    float   *dec_dtmax;         /* [S] and high */
    int32_t *d_tok;             /* [S] greedy ids (dev) */
    int32_t *h_tok;             /* [S] their host copy */
    void    *xs;                /* [T][max K] 16-bit activations of the tensor-core GEMMs
                                 * (kvf_gemm_narrow; device only, KVF_GPU_WEIGHTS=native, the default) */
    struct kvf_sample_ws *sample_ws;   /* device sampling's buffers (kvf_sample_batch.h) */
    kvf_sample_row_t *srow;     /* [S] the head's sampling rows (host) */
    kvf_sample_res_t *sres;     /* [S] their results (host) */
    size_t  cap_srow;
    /* decode steps as CUDA graphs (kvf_model_graph.c; KVF_GPU_GRAPHS=decode) */
    uint64_t gen;               /* bumped whenever a (dev) buffer above moves */
    const kvf_device_t *run_dev;   /* set: the forward launches here (a capture stream) */
    struct kvf_step_in *in;     /* set: the step's inputs come from the published block */
    struct kvf_fwd_graphs *graphs; /* NULL: every step eager */
    struct kvf_fwd_fi *fi;      /* KVF_GPU_ATTN=flashinfer: plan and buffers (kvf_model_fi.c) */
};

/* ---- the forward's parts, for kvf_model_graph.c --------------------------------- */

/* The published inputs of a graphed decode step (kvf_model_graph.c): host arrays inside one
 * block whose device copy each replay reads. */
struct kvf_step_in {
    int32_t  *ids;          /* [S] the token of each request */
    int32_t  *pos;          /* [S] its position */
    int32_t  *last_rows;    /* [S] 0, 1, ... S - 1 */
    int32_t **attn;         /* [num_groups] per attention cache group: the packed table of
                             * kvf_attn_seqs_t (packed_maxb = maxb); NULL otherwise */
    void    **mamba;        /* [num_layers] per Mamba layer: kvf_ssm_seqs_t.packed */
    int       maxb;         /* table width: the step limits' max_blocks */
    int       split_blocks; /* kernel blocks of the longest context the limits allow */
};

/* Embedding, every layer and the head's logits (ws->logits) of @a batch (T tokens) on
 * @a dev (ws->run_dev when set): the work a graphed step records. */
kvf_status_t kvf_fwd_body(kvf_model_h m, const kvf_rank_ctx_t *ctx,
                          const kvf_fwd_batch_t *batch, int T);
/* Rank 0's tokens from ws->logits: device sampling or argmax, the step's one copy back,
 * logits copied for the seqs that asked. */
kvf_status_t kvf_fwd_head_pick(kvf_model_h m, const kvf_rank_ctx_t *ctx,
                               const kvf_fwd_batch_t *batch, kvf_status_t status);
/* The dt clamp of a seq's one-token Mamba2 step (the scan's for a prompt's last token). */
float kvf_fwd_step_dt_min(const kvf_model_config_t *cfg, const kvf_fwd_seq_t *sq);
float kvf_fwd_step_dt_max(const kvf_model_config_t *cfg, const kvf_fwd_seq_t *sq);

/* kvf_model_graph.c: set up at kvf_model_ws_prepare() when KVF_GPU_GRAPHS asks (refused by
 * name when its value is unknown), freed by kvf_model_ws_destroy(). */
kvf_status_t kvf_fwd_graphs_prepare(kvf_model_h m, const kvf_rank_ctx_t *ctx,
                                    const kvf_step_limits_t *lim);
void kvf_fwd_graphs_destroy(struct kvf_model_ws *ws);
/* Run @a batch's step through its graph when it qualifies: true with *status_p set when it
 * did (tokens picked too), false when the caller must run it eagerly (nothing launched
 * that matters: at most the inputs' upload). */
bool kvf_fwd_graph_try(kvf_model_h m, const kvf_rank_ctx_t *ctx, const kvf_fwd_batch_t *batch,
                       int T, kvf_status_t *status_p);

/* kvf_model_scan.c: whether the Mamba2 / Gated DeltaNet prompt scan is chunked (KVF_MAMBA_SCAN, else the
 * device and KVF_GPU_WEIGHTS decide): 1 chunked, 0 token by token, -1 a bad value. */
int kvf_model_scan_chunked(kvf_model_h m);

/* One kernel call of the forward: skipped after a failure, its error logged and mapped;
 * timed per call site under `kvf bench-model --profile` (kvf_fwd_profile.h;
 * kvf_model_fwd.c, kvf_model_scan.c). */
#define KVF_KCALL(_call)                                                   \
    do {                                                                   \
        if (status == KVF_OK) {                                            \
            bool _prof = kvf_fwd_profile_active();                         \
            double _t0 = _prof ? kvf_fwd_profile_begin() : 0.0;            \
            int _e = (_call);                                              \
            if (_prof) {                                                   \
                kvf_fwd_profile_end(__func__, __LINE__, #_call, _t0);      \
            }                                                              \
            if (_e != KVF_KERN_OK) {                                       \
                kvf_error("%s failed: %s", #_call, kvf_kern_strerror(_e)); \
                status = kvf_status_from_kern(_e);                         \
            }                                                              \
        }                                                                  \
    } while (0)

/* kvf_model_fi.c: FlashInfer's attention under KVF_GPU_ATTN=flashinfer, set up at
 * kvf_model_ws_prepare() (refused by name when the build or the cache cannot have it),
 * freed by kvf_model_ws_destroy(); _step plans an eager step once, before its layers (its
 * one upload on @a dev; a step it cannot take is left to kvferry's kernel); _try runs layer
 * @a l's K/V write and attention of the planned step into ws->g (true, *status_p set) or
 * leaves it to the caller (false). */
kvf_status_t kvf_fwd_fi_prepare(kvf_model_h m, const kvf_rank_ctx_t *ctx,
                                const kvf_step_limits_t *lim);
void kvf_fwd_fi_destroy(struct kvf_model_ws *ws);
void kvf_fwd_fi_step(const kvf_rank_ctx_t *ctx, const kvf_device_t *dev,
                     const kvf_fwd_batch_t *batch);
bool kvf_fwd_fi_try(kvf_model_h m, const kvf_rank_ctx_t *ctx, const kvf_device_t *dev,
                    const kvf_fwd_batch_t *batch, int l, const int32_t *pos,
                    kvf_status_t *status_p);

/* kvf_model_scan.c: whether seq @a sq's one-token Mamba2 step is a prompt token's (the
 * scan's dt clamp) or an output's; with prompt_len set, the token's position decides. */
bool kvf_fwd_step_is_prompt(const kvf_fwd_seq_t *sq);
/* kvf_model_scan.c: seq @a sq's Mamba2 scan on @a dev, its prompt tokens [0, np) chunked on
 * the model's state grid when set, its outputs token by token (rows from @a o, ld @a R). */
kvf_status_t kvf_fwd_scan_seq(kvf_model_h m, const kvf_rank_ctx_t *ctx, const kvf_device_t *dev,
                              const kvf_mamba2_params_t *mp_scan,
                              const kvf_mamba2_params_t *mp_step, const kvf_fwd_seq_t *sq, int np,
                              int o, int R, void *ssm_state, kvf_status_t status);

/* kvf_model_gpt_oss.c: layer @a l's gpt_oss tensors of rank shard @a s from @a ck: the
 * attention sinks of its heads, the router (weight, bias) and its whole experts, their
 * interleaved gate_up [E][H][2I] and down [E][I][H] (x @ W) turned into the gated layout
 * ([2I][H]: gate rows, then up rows; [H][I]) in the file's dtype, biases alike; the bytes
 * read added to *bytes_p. Errors: a missing tensor (logged by name), a bad shape or dtype. */
kvf_status_t kvf_model_load_gpt_oss(kvf_ckpt_h ck, const kvf_model_config_t *cfg,
                                    const kvf_shard_t *s, int l, kvf_layer_w_t *w,
                                    size_t *bytes_p);

/* kvf_model_gpt_oss.c: rank-local expert @a e of layer weights @a w over the n gathered rows
 * ws->xg into ws->yg: down(swiglu_clamp(gate_up x + b) ) + b (ws->proj, ws->g scratch);
 * a kernel status. */
int kvf_fwd_oss_expert(const kvf_device_t *dev, struct kvf_model_ws *ws,
                       const kvf_model_config_t *cfg, const kvf_layer_w_t *w, int e, int n);
/* kvf_model_fwd.c's parts for kvf_model_gdn.c and kvf_model_gpt_oss.c: where the forward
 * launches; y[M][w->rows] (ldy) = x[M][w->cols] (ldx) W^T + bias, whatever @a w's dtype and
 * device (a kernel status); out's all-reduce then times @a rm. */
/* Whether the (dev) buffers of @a ws are device memory (not host memory). */
static inline bool kvf_ws_on_device(const struct kvf_model_ws *ws)
{
    return ws->dev_set && (ws->dev.kind != KVF_DEVICE_CPU);
}
/* Whether @a w goes straight to kvf_gemm_w() (fp32, or bf16 widened in the registers). */
static inline bool kvf_mat_direct(const kvf_mat_t *w)
{
    return (w->dtype == KVF_DTYPE_FP32) || ((w->dtype == KVF_DTYPE_BF16) && !w->tensor_cores);
}
/* kvf_model_ffn.c: layer @a l's FFN over the T rows of ws->xn into ws->out, all-reduced and
 * scaled by residual_multiplier: the dense MLP slice, or the routed experts (router, shared
 * expert, this rank's experts). A status; nothing runs when @a status is an error. */
kvf_status_t kvf_fwd_mlp(kvf_model_h m, const kvf_rank_ctx_t *ctx, int l, int T,
                         kvf_status_t status);
kvf_status_t kvf_fwd_moe(kvf_model_h m, const kvf_rank_ctx_t *ctx, int l, int T,
                         kvf_status_t status);
const kvf_device_t *kvf_fwd_dev(const kvf_rank_ctx_t *ctx);
int kvf_mat_gemm(const kvf_device_t *dev, struct kvf_model_ws *ws, int M, const float *x, int ldx,
                 const kvf_mat_t *w, const float *bias, float *y, int ldy);
kvf_status_t kvf_reduce_residual(const kvf_rank_ctx_t *ctx, struct kvf_model_ws *ws, size_t T,
                                 size_t H, float rm, kvf_status_t status);

/* kvf_model_gdn.c (qwen3_next): a rank's Gated DeltaNet layer (in_proj rows z | v | k | q |
 * b | a, conv channels v | k | q, dt_bias, A_log, the gated norm's [head_dim] weight,
 * out_proj columns) and gated attention layer (qkv rows q | k | v | gate); the Gated
 * DeltaNet forward of layer @a l (its state in the layer's Mamba-shaped pages). */
kvf_status_t kvf_load_gdn(kvf_loader_t *ld, const kvf_model_config_t *cfg, const kvf_shard_t *s,
                          int l, kvf_layer_w_t *w);
kvf_status_t kvf_load_gated_attention(kvf_loader_t *ld, const kvf_model_config_t *cfg,
                                      const kvf_shard_t *s, int l, kvf_layer_w_t *w);
/* kvf_model.c: the arrays of this rank's experts' matrices (calloc'ed). */
kvf_status_t kvf_alloc_experts(const kvf_shard_t *s, kvf_layer_w_t *w);
kvf_status_t kvf_load_qn_moe(kvf_loader_t *ld, const kvf_model_config_t *cfg,
                             const kvf_shard_t *s, int l, kvf_layer_w_t *w);
/* kvf_fwd_moe's shared expert output ws->out (T rows of H) times sigmoid(sh_gate . xn) per
 * row (qwen3_next); nothing when w->sh_gate is NULL. */
kvf_status_t kvf_fwd_shared_gate(const kvf_device_t *dev, struct kvf_model_ws *ws,
                                 const kvf_layer_w_t *w, int T, int H, kvf_status_t status);
kvf_status_t kvf_fwd_gdn(kvf_model_h m, const kvf_rank_ctx_t *ctx, const kvf_fwd_batch_t *batch,
                         int l, int T, kvf_status_t status);

/* Weights to the ranks' devices (kvf_model_dev.c): after the host load, CUDA only. */
kvf_status_t kvf_model_upload(kvf_model_h m);
/* A model on GPU @a dev with m->tp ranks: m->dev = *dev and m->gpu_devs[r] =
 * cuda:(ordinal + r) (NCCL takes one GPU per rank), each opened (kvf_device_init; a
 * failure logged naming the rank and the CUDA error), the calling thread left on rank 0's. */
kvf_status_t kvf_model_gpu_open(kvf_model_h m, const kvf_device_t *dev);
/* Free a set of replicated tensors (the model's shared one or a rank's own), zeroing it. */
void kvf_model_rep_free(kvf_model_h m, kvf_rep_w_t *rep);
/* The replicated tensors rank @a r reads. */
static inline const kvf_rep_w_t *kvf_model_rep(const struct kvf_model *m, int r)
{
    return (m->ranks[r].rep != NULL) ? m->ranks[r].rep : &m->rep;
}
/* Free a weight buffer wherever it lives (host free() on a CPU model). */
void kvf_model_wfree(kvf_model_h m, void *p);


#endif
