#!/usr/bin/env bash
# Every op the model uses has a CUDA kernel compiled into libkvf_kernels.a, for sm_80 and
# sm_90: nm lists the kernel's host stub, and the CUDA flags name both architectures.
# Usage: check_kernels.sh <libkvf_kernels.a> <flags.make of kvf_kernels>. Runs without a GPU.
set -euo pipefail
lib=$1
flags=$2
want=(kvf_attn_write_kernel kvf_attn_paged_kernel kvf_conv_chunk_kernel kvf_conv_step_kernel
      kvf_mamba2_scan_kernel kvf_rmsnorm_kernel kvf_gated_sumsq_kernel kvf_gated_apply_kernel
      kvf_act_kernel kvf_convert_kernel kvf_moe_route_kernel kvf_zero_list_kernel
      kvf_bias_rows_kernel kvf_add_kernel kvf_gather_rows_kernel
      kvf_scatter_add_rows_kernel kvf_act_mul_kernel kvf_rope_kernel kvf_attn_merge_kernel
      kvf_round_rows_kernel kvf_argmax_rows_kernel kvf_conv_step_seqs_kernel
      kvf_mamba2_step_seqs_kernel kvf_attn_tiled_kernel kvf_conv_chunk_tok_kernel
      kvf_conv_chunk_tail_kernel kvf_gated_fused_kernel kvf_add_rmsnorm_kernel
      kvf_ssd_cs_kernel kvf_ssd_cb_kernel kvf_ssd_intra_kernel kvf_ssd_pass_kernel
      kvf_ssd_out_kernel kvf_ssd_state_kernel kvf_gdn_scan_kernel kvf_gdn_ck_norm_kernel
      kvf_gdn_ck_chunk_kernel kvf_gdn_ck_pass_kernel kvf_gdn_ck_state_kernel
      kvf_gdn_step_seqs_kernel)
have=$(nm -C "$lib" 2>/dev/null | sed -n 's/^[0-9a-f]* T \(kvf_[a-z0-9_]*_kernel\)(.*/\1/p' | sort -u)
missing=0
for k in "${want[@]}"; do
    if ! grep -qx "$k" <<<"$have"; then
        echo "missing CUDA kernel: $k"
        missing=1
    fi
done
for arch in 80 90; do
    if ! grep -q "code=\[compute_$arch,sm_$arch\]\|sm_$arch" "$flags"; then
        echo "CUDA flags do not build sm_$arch: $(grep CUDA_FLAGS "$flags")"
        missing=1
    fi
done
grep -q -- "-Werror" "$flags" || { echo "CUDA flags lack -Werror"; missing=1; }
[ "$missing" -eq 0 ] && echo "${#want[@]} CUDA kernels present, sm_80 and sm_90, -Werror"
exit "$missing"
