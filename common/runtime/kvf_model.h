/*
 * Model runner: weights sharded for tensor parallelism and the forward pass
 * of one TP rank over a batch of request chunks, reading and writing the
 * request's attention and Mamba pages in the rank's page pool.
 *
 * Semantics follow transformers 5 (modeling_nemotron_h.py, modeling_llama.py,
 * modeling_qwen3.py, modeling_mistral.py), every config field honoured or
 * refused at load (common/model/README.md):
 *   nemotron_h: every layer is residual + mixer(rmsnorm(h)); mixers are
 *   Mamba2 ('M'): in_proj (+bias with use_bias) -> z | xBC | dt; causal
 *                 depthwise conv1d + bias + mamba_hidden_act over xBC;
 *                 dt = softplus(dt + dt_bias), clamped to time_step_limit
 *                 [low, high] in prompt chunks, even of one token (not in the
 *                 decode step, as transformers 5.25); A = -exp(A_log);
 *                 selective scan with D
 *                 skip; y = gated_rmsnorm(y, z) with groups of inner /
 *                 n_groups; out_proj (+bias)
 *   attention ('*'): q/k/v projections, GQA, no positional encoding, softmax
 *                 scale 1/sqrt(head_dim), o_proj
 *   MLP ('-'):    down(act(up(x))) with mlp_hidden_act (relu2) and mlp_bias
 *   MoE ('E'):    sigmoid top-k router with e_score_correction_bias, group
 *                 selection, norm_topk_prob and routed_scaling_factor; routed
 *                 experts down(act(up(x))) weighted, plus the shared expert
 *   then norm_f and lm_head (never tied to the embeddings, as transformers'
 *   NemotronH).
 *   llama / qwen3 / mistral: h += attn(input_layernorm(h)); h +=
 *   mlp(post_attention_layernorm(h)); attention with RoPE (default, linear,
 *   llama3), optional q/k/v/o biases, Qwen3's per-head q/k RMSNorm before
 *   RoPE, GQA; SwiGLU MLP down(act(gate(x)) * up(x)); lm_head tied to the
 *   embeddings with tie_word_embeddings unless the file stores lm_head.weight.
 *
 * Sharding (Megatron-style, common/model/kvf_shard.h): column-parallel in_proj
 * (z, x, B, C, dt rows of this rank's heads and groups), q/k/v (heads; KV
 * heads replicated when tp > kv heads), conv1d, gate/up projections;
 * row-parallel out_proj, o_proj and down_proj followed by a sum all-reduce;
 * MoE experts whole per rank (expert parallel) and the shared expert
 * column/row split; the gated norm all-reduces its partial sums of squares
 * over the ranks sharing a group when tp > n_groups. Embeddings, norms and
 * lm_head are replicated (one shared copy). Matrices are kept in the
 * checkpoint dtype (bf16 stays bf16) and computed in fp32.
 */
#ifndef KVF_MODEL_H
#define KVF_MODEL_H

#include "kvf_collectives.h"
#include "kvf_geometry.h"
#include "kvf_model_config.h"
#include "kvf_page_pool.h"
#include "kvf_sample.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct kvf_model *kvf_model_h;

/**
 * Load @a dir/config.json and the weights (model.safetensors, or the shards
 * of model.safetensors.index.json), sharded for @a tp_size ranks (all
 * shards held by this process). Tensor names as transformers saves them:
 * backbone.* for nemotron_h, model.* for the dense archs, lm_head.weight.
 *
 * @return KVF_OK; config errors (a refused field or value, logged naming
 *         it); sharding errors (tp does not divide heads or experts);
 *         checkpoint errors naming the missing or mis-shaped tensor.
 */
kvf_status_t kvf_model_load(const char *dir, int tp_size, kvf_model_h *model_p);

/**
 * kvf_model_load() onto @a dev (NULL or a CPU device: exactly
 * kvf_model_load()). A CUDA device cuda:N (from kvf_model_device_open())
 * keeps every weight in GPU memory, rank r on cuda:(N + r) (opened here,
 * before the weights are read): each tensor is loaded on the host as on
 * the CPU; by default (KVF_GPU_WEIGHTS unset or native) bf16/fp16 matrices
 * and embeddings stay 16-bit and their GEMMs run on tensor cores through
 * cuBLASLt with the activations rounded to 16 bits, one pinned algorithm
 * per weight shape (kernels/kvf_gemm_narrow.h, kvf_gemm_plan.h: batch
 * invariant, not the CPU's bits); with exact (debugging: the CPU's bits)
 * bf16 ones are kept bf16 and widened in the fixed-order GEMM's registers
 * (kvf_gemm_w) and fp16 ones widened to fp32 on the host; with fp32 bf16
 * ones are widened too (the same bits, twice the memory); another value
 * fails the load, naming it; then copied with
 * kvf_device_memcpy() and the host copy freed; the
 * replicated tensors (embeddings, norms, lm_head) get one copy per rank's
 * GPU. The forward then runs the kernels' CUDA launchers on each rank's
 * device, the TP runner puts the page pools there and, for tp > 1, makes
 * an NCCL world (kvf_comm_world_create). Compiled, not yet run on a GPU.
 *
 * @return as kvf_model_load(); KVF_ERR_CUDA when a rank's GPU cannot be
 *         opened (logged naming the rank and the CUDA error);
 *         KVF_ERR_CUDA / KVF_ERR_NO_MEMORY when a copy to a device fails.
 */
kvf_status_t kvf_model_load_device(const char *dir, int tp_size, const kvf_device_t *dev,
                                   kvf_model_h *model_p);

/** The device rank 0's weights live on (the CPU for kvf_model_load()). */
const kvf_device_t *kvf_model_device(kvf_model_h model);

/**
 * The device rank @a rank's weights live on: the CPU, or for a model on
 * cuda:N with tp ranks, cuda:(N + rank) (one GPU per rank, as NCCL wants).
 */
const kvf_device_t *kvf_model_rank_device(kvf_model_h model, int rank);

/**
 * Parse a --device value, "cpu", "cuda" (= cuda:0) or "cuda:N", and open
 * it (kvf_device_init(): for CUDA, the device must exist and becomes
 * current on the calling thread). @a what names the option in messages
 * ("--device"). Every failure is logged once naming the value, e.g.
 * "--device cuda:0: no CUDA device (cudaGetDeviceCount: no CUDA-capable
 * device is detected)" or "--device cuda: CUDA is not built in".
 *
 * @return KVF_OK and *dev_p; KVF_ERR_INVALID_PARAM for a value that does
 *         not parse; KVF_ERR_UNSUPPORTED in a build without CUDA;
 *         KVF_ERR_CUDA when no such CUDA device can be opened.
 */
kvf_status_t kvf_model_device_open(const char *what, const char *value, kvf_device_t *dev_p);

/** Bytes of weights held in memory by all ranks together (shared tensors once). */
size_t kvf_model_weight_bytes(kvf_model_h model);

/** Bytes of the checkpoint's safetensors files. */
size_t kvf_model_file_bytes(kvf_model_h model);

/** Number of safetensors files the checkpoint had (1 unless sharded). */
int kvf_model_num_files(kvf_model_h model);

/** Free all shards; NULL is a no-op. */
void kvf_model_destroy(kvf_model_h model);

const kvf_model_config_t *kvf_model_get_config(kvf_model_h model);
int kvf_model_tp_size(kvf_model_h model);

/**
 * One request's part of a forward step: num_tokens new tokens at positions
 * [start, start + num_tokens). The caller owns every pointer.
 *
 * group_blocks[g] lists the blocks of KV cache group g (kvf_cache_layout_t):
 * for an attention group, the block table covering at least
 * start + num_tokens positions; for a Mamba group, [0] is the request's state
 * block. Mamba state is started from zero when start == 0 and continued from
 * the page otherwise (also for requests whose state was imported).
 */
typedef struct kvf_fwd_seq {
    int             num_tokens;    /* >= 1 */
    int             start;         /* tokens already in the cache */
    const int32_t  *tokens;        /* [num_tokens] */
    const int32_t *const *group_blocks;  /* [num_groups] */
    const int      *group_num_blocks;    /* [num_groups] */
    float          *logits;        /* [vocab] logits of the last token (rank 0), or NULL */
    bool            prompt;        /* a chunk of the prompt (or of a recompute): computed
                                      like transformers' prompt forward even when it is one
                                      token (Mamba dt clamped); false: a decode step */
    int             prompt_len;    /* > 0: the request's prompt length, which then decides
                                      per token instead of `prompt`: positions below it are
                                      prompt tokens (dt clamped), the rest outputs (not), so
                                      a recompute after preemption gives the bits of the
                                      first run; 0: `prompt` decides for the whole chunk */
    int32_t        *token;         /* greedy: the argmax of the last token's logits (lowest
                                      id of the largest non-NaN logit; 0 when logit 0 is NaN:
                                      the engine's greedy scan), computed on the model's
                                      device so only this id comes back (rank 0); or NULL.
                                      Independent of logits (either, both or neither). */
    const kvf_sample_row_t *sample; /* sample the last token's logits on the model's device
                                      with these parameters (kernels/kvf_sample.h; pen_start
                                      indexes the batch's sample_pen), or NULL; with it,
                                      sampled receives the result (rank 0). Independent of
                                      logits and token. */
    kvf_sample_res_t *sampled;
} kvf_fwd_seq_t;

typedef struct kvf_fwd_batch {
    int                  num_seqs;
    const kvf_fwd_seq_t *seqs;
    const kvf_sample_pen_t *sample_pen;  /* [sample_num_pen] the seqs' penalty entries */
    int                  sample_num_pen;
} kvf_fwd_batch_t;

/** What one rank's forward needs besides the weights. */
typedef struct kvf_rank_ctx {
    int                        rank;
    kvf_comm_t                *comm;    /* size == model tp */
    kvf_page_pool_h            pool;
    const kvf_rank_geometry_t *geom;
    const kvf_cache_layout_t  *layout;
    struct kvf_model_ws       *ws;      /* scratch, from kvf_model_ws_create() */
} kvf_rank_ctx_t;

/** Per-rank scratch buffers (grown on demand). */
kvf_status_t kvf_model_ws_create(struct kvf_model_ws **ws_p);
void         kvf_model_ws_destroy(struct kvf_model_ws *ws);

/** The largest step a rank's workspace is sized for at start (kvf_model_ws_prepare()). */
typedef struct kvf_step_limits {
    int max_tokens;       /* tokens of one step (the engine's max_batch_tokens), >= 1 */
    int max_seqs;         /* requests of one step, >= 1 */
    int max_blocks;       /* attention blocks in one request's table (<= the pool's) */
    int max_fresh_pages;  /* pages one step zeroes (fresh blocks x layout slots) */
    int max_context;      /* tokens one request may reach (bounds attention's split-K) */
    int kernel_block_size; /* tokens per kernel block of the rank's pool */
} kvf_step_limits_t;

/**
 * Size rank ctx->rank's workspace for steps within @a lim, at start, on the
 * rank's own thread: the forward's buffers (on a device, one
 * kvf_device_alloc() each, never again for such steps) and, on a device,
 * the stream's kernel workspace (kvf_device_workspace_reserve() of
 * kvf_model_ws_device_bytes()), released by kvf_model_ws_destroy(). A
 * later step larger than @a lim still runs (the buffers grow then). CPU
 * models: nothing happens (the buffers grow with the steps, as before).
 * @return KVF_OK; KVF_ERR_NO_MEMORY / KVF_ERR_CUDA (logged with the sizes).
 */
kvf_status_t kvf_model_ws_prepare(kvf_model_h model, const kvf_rank_ctx_t *ctx,
                                  const kvf_step_limits_t *lim);

/**
 * Set the state grid of the Mamba2 prompt scan, in tokens: the SAME value as the engine's
 * (the scheduler's prompt chunk grid and the prefix cache's state checkpoint grid:
 * common/engine kvf_engine_prefix_params_t.state_grid, resolved), given once after the
 * runner is created and before any step. With the chunked scan the forward scans a
 * request's prompt tokens (a lone last prompt token too) with kvf_mamba2_scan_chunked()
 * (kernels/kvf_ssd.h; a Gated DeltaNet model's with kvf_gdn_scan_chunked(), kernels/kvf_gdn.h)
 * from pos0 = the request's position on this grid: a 16-bit state is
 * rounded only at absolute grid multiples, so a prompt cut on the grid (the scheduler's
 * chunks, a prefix hit's restored checkpoint) gives the uncut prompt's bits. Which scan:
 * KVF_MAMBA_SCAN=chunked or token; unset or empty: chunked on a GPU under
 * KVF_GPU_WEIGHTS=native (the default), token by token on the CPU and under exact or fp32
 * (the modes giving the CPU's bits, which the token scan keeps). Until called (or for a
 * model without Mamba layers) the scan is token by token.
 * @return KVF_OK; KVF_ERR_INVALID_PARAM (logged naming the value): @a grid < 1, a chunked
 *         scan with @a grid above KVF_SSD_MAX_GRID (KVF_GDN_MAX_GRID for Gated DeltaNet),
 *         an unknown KVF_MAMBA_SCAN.
 */
kvf_status_t kvf_model_set_state_grid(kvf_model_h model, int grid);

/** The grid the forward's Mamba2 prompt scan runs on: 0 token by token. */
int kvf_model_scan_grid(kvf_model_h model);

/**
 * The device workspace of rank @a rank for steps within @a lim: the scratch
 * arena (*device_p: the largest scratch one kernel launcher holds) and the
 * pinned staging area (*staging_p: twice the host inputs of one step), in
 * bytes. The formula is written out in kvf_model.c and kernels/README.md.
 */
void kvf_model_ws_device_bytes(kvf_model_h model, int rank, const kvf_step_limits_t *lim,
                               size_t *device_p, size_t *staging_p);

/**
 * Run one forward step of @a batch on rank ctx->rank. Every rank of the
 * instance must call it with the same batch (collectives inside). Rank 0
 * writes seq->logits and seq->token (those not NULL). Writes K/V of the
 * new tokens into the attention pages
 * and advances the Mamba state pages in place.
 *
 * @return KVF_OK; KVF_ERR_INVALID_PARAM for a bad token id, too few blocks
 *         for the positions, or a kernel argument error; KVF_ERR_NO_MEMORY.
 *         Ranks keep calling the collectives on error so peers never hang.
 */
kvf_status_t kvf_model_forward_rank(kvf_model_h model, const kvf_rank_ctx_t *ctx,
                                    const kvf_fwd_batch_t *batch);

#endif
