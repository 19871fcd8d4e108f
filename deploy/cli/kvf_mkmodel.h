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
 * to match @a dtype) and @a out_dir/model.safetensors. @a out_dir is created
 * when missing. Same (config, seed, dtype) gives the same bytes.
 *
 * Initialisation (chosen so activations stay O(1) through the layers and the
 * greedy continuation depends on the prompt): embeddings ~U with std 1;
 * projections std 1/sqrt(fan_in), output projections further scaled by
 * 1/sqrt(num_layers); norm weights 1 +- 0.1; A_log = log(1..H); dt_bias =
 * inverse softplus of a log-uniform dt in [0.01, 0.2]; D = 1 +- 0.1.
 *
 * @param [in] dtype  KVF_DTYPE_FP32 or KVF_DTYPE_BF16 for the stored tensors.
 * @return KVF_OK; errors of config loading; KVF_ERR_UNSUPPORTED for a model
 *         with MoE layers or a non-nemotron_h model_type; KVF_ERR_IO.
 */
kvf_status_t kvf_mkmodel_write(const char *config_path, const char *out_dir, uint64_t seed,
                               kvf_dtype_t dtype);

#endif
