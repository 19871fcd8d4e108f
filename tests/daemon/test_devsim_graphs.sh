#!/usr/bin/env bash
# Decode steps as CUDA graphs (KVF_GPU_GRAPHS=decode, kernels/kvf_device_graph.h) on the
# simulated GPU, whose emulation checks what makes a replay right (tests/daemon/devsim):
# every kernel call of a replayed step is the recorded one (arguments, pointers, the
# fields of the parameter structs a launcher reads), every host array a launcher uploads
# lies in the step's published inputs and their device copy holds the same bytes, nothing
# copies to the host or syncs inside. For the hybrid and the dense trained models (and the
# Gated DeltaNet qwen3.5 random checkpoint; qwen3-next's MoE stays eager): greedy,
# with --print-logits, sampled on the device, and a batch of four, the tokens (and logits)
# are those of the eager run; a batch size's first decode step runs eagerly (the warm-up),
# its second is recorded, every later one a replay. A bad value is refused by name; TP 2 (CUDA builds) stays eager.
# Usage: test_devsim_graphs.sh TESTBIN CUDA_BUILD(ON/OFF)
set -euo pipefail
DEVSIM="${1:?usage: test_devsim_graphs.sh TESTBIN CUDA_BUILD}/kvf-devsim"
CUDA="${2:-OFF}"
MODELS="${KVF_SOURCE_DIR:?}/models-trained"
T="$(mktemp -d /tmp/kvf-devsim-graphs-XXXXXX)"
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

field() {
    sed -n 's/^devsim: .* '"$2"' \([0-9][0-9]*\).*/\1/p' "$1" | tail -1
}

# graphs NAME CAPTURES REPLAYS FILE [COPIES]: the graph counters of a run's devsim line, and
# COPIES (default 1: the ids) device->host copies per decode step
graphs() {
    local name="$1" c="$2" r="$3" f="$4" k="${5:-1}"
    grep -q '^devsim: ' "$f" || fail "$name: no devsim line: $(tail -5 "$f")"
    [ "$(field "$f" graph_captures)" -eq "$c" ] && [ "$(field "$f" graph_replays)" -eq "$r" ] ||
        fail "$name: $(field "$f" graph_captures) recordings and $(field "$f" graph_replays)" \
             "replays, expected $c and $r"
    [ "$(field "$f" graph_mismatches)" -eq 0 ] && [ "$(field "$f" graph_host_inputs)" -eq 0 ] ||
        fail "$name: a replay would not give the eager step: $(grep '^devsim: in' "$f" | head -3)"
    [ "$(field "$f" decode_allocs)" -eq 0 ] && [ "$(field "$f" host_ptr_errors)" -eq 0 ] ||
        fail "$name: allocations or host pointers in decode steps: $(grep '^devsim' "$f")"
    [ "$(field "$f" decode_d2h)" -eq "$((k * $(field "$f" decode_steps)))" ] ||
        fail "$name: not $k device->host copies per decode step"
}

# run NAME COPIES ARGS...: generate eagerly and with graphs; same output, graph counters
run() {
    local name="$1" k="$2"
    shift 2
    "$DEVSIM" generate --device cuda:0 --prompt "add 12 30" --ignore-eos yes "$@" \
        >"$T/eager" 2>"$T/eager.err" || fail "$name eager: $(tail -5 "$T/eager.err")"
    KVF_GPU_GRAPHS=decode "$DEVSIM" generate --device cuda:0 --prompt "add 12 30" \
        --ignore-eos yes "$@" >"$T/graph" 2>"$T/graph.err" ||
        fail "$name graphs: $(tail -5 "$T/graph.err")"
    grep -q '^tokens:' "$T/eager" || fail "$name: no tokens line"
    [ "$(grep -v 'tok/s' "$T/eager")" = "$(grep -v 'tok/s' "$T/graph")" ] ||
        fail "$name: graphs changed the output: $(diff <(grep -v 'tok/s' "$T/eager") \
              <(grep -v 'tok/s' "$T/graph") | head -5)"
    [ "$(field "$T/eager.err" graph_captures)" -eq 0 ] || fail "$name: graphs while off"
    graphs "$name" 1 5 "$T/graph.err" "$k"
    echo "$name: $(grep '^tokens:' "$T/graph"); 1 eager warm-up, 1 recording, 5 replays," \
         "the eager output"
}

for m in tiny-hybrid tiny-dense; do
    run "$m greedy" 1 --model "$MODELS/$m" --max-tokens 8
done
run "tiny-hybrid logits" 2 --model "$MODELS/tiny-hybrid" --max-tokens 8 --print-logits yes
[ "$(grep -c . "$T/graph")" -gt 8 ] || fail "tiny-hybrid logits: no logits printed"
run "tiny-hybrid sampled" 1 --model "$MODELS/tiny-hybrid" --max-tokens 8 --temperature 0.8 \
    --top-p 0.9 --seed 7 --logprobs 2

# four requests at once: batch 4's first step eager (the warm-up), one recording, then replays
KVF_GPU_GRAPHS=decode "$DEVSIM" bench-model --model "$MODELS/tiny-hybrid" --device cuda:0 \
    --prompt-len 16 --decode-tokens 6 --batch 4 >"$T/out" 2>"$T/err" ||
    fail "batch 4: $(tail -5 "$T/err")"
graphs "tiny-hybrid batch 4" 1 3 "$T/err"
echo "tiny-hybrid batch 4: 1 eager warm-up, 1 recording, 3 replays"

# Gated DeltaNet (qwen3.5's random checkpoint: GDN and gated attention, dense MLP): the
# batched decode step (kvf_gdn_decode_seqs) reads the state pointers from the packed inputs,
# its CUDA body checked against the per-request path (gdn_seqs_*), fp32 and bf16 states
GDN="$KVF_SOURCE_DIR/tests/data/families"
gdn_twin() {   # gdn_twin NAME FILE: the batched GDN body ran and equals the per-request path
    [ "$(field "$2" gdn_seqs_checked)" -gt 0 ] && [ "$(field "$2" gdn_seqs_mismatches)" -eq 0 ] ||
        fail "$1: batched GDN decode: $(grep -o 'gdn_seqs_checked.*mismatches [0-9]*' "$2")"
}
run "qwen3.5 logits" 2 --model "$GDN/qwen3.5" --max-tokens 8 --print-logits yes
gdn_twin "qwen3.5 logits" "$T/graph.err"
run "qwen3.5 bf16 state" 1 --model "$GDN/qwen3.5" --max-tokens 8 --ssm-dtype bf16
gdn_twin "qwen3.5 bf16 state" "$T/graph.err"
KVF_GPU_GRAPHS=decode "$DEVSIM" bench-model --model "$GDN/qwen3.5" --device cuda:0 \
    --prompt-len 16 --decode-tokens 6 --batch 4 >"$T/out" 2>"$T/err" ||
    fail "qwen3.5 batch 4: $(tail -5 "$T/err")"
graphs "qwen3.5 batch 4" 1 3 "$T/err"
gdn_twin "qwen3.5 batch 4" "$T/err"
echo "qwen3.5 batch 4: 1 eager warm-up, 1 recording, 3 replays"
# qwen3-next has MoE layers (the router's choice goes to the host): eager, said once
KVF_GPU_GRAPHS=decode "$DEVSIM" generate --model "$GDN/qwen3-next" --device cuda:0 \
    --prompt "add 12 30" --max-tokens 4 >"$T/out" 2>"$T/err" || fail "qwen3-next: $(tail -3 "$T/err")"
[ "$(field "$T/err" graph_captures)" -eq 0 ] && grep -q "the model has MoE layers" "$T/err" ||
    fail "qwen3-next (MoE): recorded, or no warning that the steps run eagerly"
echo "qwen3-next (MoE): eager, said"

if KVF_GPU_GRAPHS=all "$DEVSIM" generate --model "$MODELS/tiny-hybrid" --device cuda:0 \
    --prompt "add 12 30" --max-tokens 3 >"$T/out" 2>"$T/err"; then
    fail "KVF_GPU_GRAPHS=all accepted"
fi
grep -q "bad value 'all' for KVF_GPU_GRAPHS" "$T/err" || fail "bad value: $(tail -3 "$T/err")"
echo "KVF_GPU_GRAPHS=all refused by name"

if [ "$CUDA" = ON ]; then
    DEVSIM_GPUS=2 KVF_GPU_GRAPHS=decode "$DEVSIM" generate --model "$MODELS/tiny-hybrid" \
        --device cuda:0 --tp 2 --prompt "add 12 30" --max-tokens 8 --ignore-eos yes \
        >"$T/out" 2>"$T/err" || fail "tp 2: $(tail -5 "$T/err")"
    [ "$(field "$T/err" graph_captures)" -eq 0 ] || fail "tp 2: a step recorded (NCCL)"
    grep -q "KVF_GPU_GRAPHS=decode: the instance runs TP > 1" "$T/err" ||
        fail "tp 2: no warning that the steps run eagerly"
    echo "TP 2: eager (no recording)"
else
    echo "TP 2 over simulated GPUs: not run (CUDA not built in)"
fi
echo PASS
