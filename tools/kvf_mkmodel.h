/*
 * Synthetic checkpoints for tests and benchmarks: a config.json plus a
 * model.safetensors with Hugging Face NemotronH tensor names and a
 * deterministic, seeded random initialisation.
 */
#ifndef KVF_MKMODEL_H
#define KVF_MKMODEL_H

#include "kvf_model_config.h"

#include <stdint.h>

/**
 * Write @a out_dir/config.json (a copy of @a config_path with torch_dtype set
 * to match @a dtype), @a out_dir/model.safetensors and, when vocab_size >= 256,
 * @a out_dir/tokenizer.json declaring the byte tokenizer (ids 0..255 are the
 * bytes; BOS/EOS ids of the config are special tokens). @a out_dir is created
 * when missing. Same (config, seed, dtype) gives the same bytes.
 *
 * Initialisation (chosen so activations stay O(1) through the layers and the
 * greedy continuation depends on the prompt): embeddings ~U with std 1;
 * projections std 1/sqrt(fan_in), output projections further scaled by
 * 1/sqrt(num_layers); norm weights 1 +- 0.1; A_log = log(1..H); dt_bias =
 * inverse softplus of a log-uniform dt in [0.01, 0.2]; D = 1 +- 0.1.
 *
 * Every model the runner loads can be written: nemotron_h (Mamba, attention,
 * MLP and MoE layers, with the biases its config asks for; backbone.* names)
 * and the dense llama / qwen3 / mistral (model.* names, q/k norms for qwen3,
 * no lm_head.weight when tie_word_embeddings), as transformers names them.
 *
 * @param [in] dtype  KVF_DTYPE_FP32 or KVF_DTYPE_BF16 for the stored tensors.
 * @return KVF_OK; errors of config loading (a refused field); KVF_ERR_IO.
 */
kvf_status_t kvf_mkmodel_write(const char *config_path, const char *out_dir, uint64_t seed,
                               kvf_dtype_t dtype);

/**
 * As kvf_mkmodel_write(), spread over @a shards files
 * model-0000i-of-0000n.safetensors (tensors round robin) with a
 * model.safetensors.index.json, as save_pretrained writes large models;
 * shards = 1 writes model.safetensors. A stale file of the other layout in
 * @a out_dir is removed. KVF_ERR_INVALID_PARAM for shards outside [1, 64].
 */
kvf_status_t kvf_mkmodel_write_sharded(const char *config_path, const char *out_dir,
                                       uint64_t seed, kvf_dtype_t dtype, int shards);

#endif
