# shellcheck shell=bash
# The row runner of tests/gpu/run.sh (sourced, not run): one function runs one row of the GPU
# table with its own cap, keeps its log, streams its lines and records its verdict for the
# summary. Why: a GPU window is short (minutes), so every row must report the moment it is
# measured, a hang may cost only its own row, and the whole table must end within the budget.
#
#   rr_init OUT_DIR BUDGET_S         results file OUT_DIR/gpu-results.txt (truncated), logs in
#                                    OUT_DIR/gpu-logs/ (kept: nothing is removed at exit)
#   rr_add ID CAP_S FUNC [ARGS...]   appends a row to the table (run in the order added)
#   rr_run_all                       runs every row: a row starts only while the budget has
#                                    more than 2.5 s left beyond RR_RESERVE_S (1 s, the
#                                    summary's), capped at min(CAP_S, what is left less the
#                                    2 s kill grace); the rest are "not reached"
#   rr_summary                       one line per row: PASS / FAIL: why / skipped: why /
#                                    not reached (budget); returns 1 when a row FAILed
#
# A row is FUNC ARGS run as `timeout -k 2 CAP bash -c ...` in its own process group (every
# process it started is signalled at the cap; functions and variables it needs are exported
# with `export -f` / `export`). Its stdout is its table lines (RR_OUT), its stderr and the
# outputs of the programs it runs go to its log, gpu-logs/ID.log ($RR_LOG; $RR_DIR is the logs
# folder, for files later rows read). It ends with exit 0 (PASS), 77 (skipped) or anything
# else (FAIL); `rr_verdict TEXT` (from inside the row) words the verdict, e.g.
# "PASS (same tokens)" or "skipped: one GPU". KVF_GPU_CAPS="ID=S,ID=S" overrides caps by id
# (an operator giving the engine row more, or the dry-run test making a hang short).
#
# Design: rows are data (a table), so the order is one list, the caps are beside it and the
# summary knows every row even when the budget ends first. Rejected: one timeout for the
# whole table (one hang starves every later row) and logs in a temporary folder copied at
# exit (a killed run loses them).

RR_RESERVE_S=1
RR_IDS=()
RR_CAPS=()
RR_CMDS=()
RR_VERDICTS=()

rr_now_ms() {
    local t=${EPOCHREALTIME/./}
    echo $((t / 1000))
}

rr_init() { # out_dir budget_s
    RR_OUTDIR=$1
    RR_BUDGET_MS=$(($2 * 1000))
    RR_START_MS=$(rr_now_ms)
    RR_DIR="$RR_OUTDIR/gpu-logs"
    RR_RESULTS="$RR_OUTDIR/gpu-results.txt"
    mkdir -p "$RR_DIR" || return 1
    : >"$RR_RESULTS" || return 1
    export RR_DIR
}

rr_elapsed_s() { # seconds since rr_init, one decimal
    local ms=$(($(rr_now_ms) - RR_START_MS))
    printf '%d.%d' $((ms / 1000)) $((ms % 1000 / 100))
}

# a line to the terminal and the results file at once
rr_say() {
    printf '%s\n' "$*" | tee -a "$RR_RESULTS"
}

rr_add() { # id cap_s func [args...]: args must not contain a tab
    local id=$1 cap=$2
    shift 2
    # KVF_GPU_ROWS="id,id,...": only those rows (and build and kernels, which find the GPU)
    if [ -n "${KVF_GPU_ROWS:-}" ] && [[ ",$KVF_GPU_ROWS,build,kernels," != *",$id,"* ]]; then
        return 0
    fi
    RR_IDS+=("$id")
    RR_CAPS+=("$cap")
    local IFS=$'\t'
    RR_CMDS+=("$*")
}

rr_verdict() { # text: the row's verdict (called inside a row)
    printf '%s\n' "$*" >"$RR_DIR/.verdict"
}
export -f rr_verdict

rr_cap_override() { # id default: KVF_GPU_CAPS's figure for id (seconds > 0), else default
    local kv v
    local IFS=,
    for kv in ${KVF_GPU_CAPS:-}; do
        [ "${kv%%=*}" = "$1" ] || continue
        v=${kv#*=}
        # `timeout 0` would mean no cap at all: a figure that is not > 0 keeps the default
        if [[ $v =~ ^[0-9]+([.][0-9]+)?$ ]] && awk -v c="$v" 'BEGIN { exit !(c > 0) }'; then
            echo "$v"
            return
        fi
        echo "run.sh: KVF_GPU_CAPS $kv: not seconds > 0, row $1 keeps its cap $2 s" >&2
    done
    echo "$2"
}

# Runs row i; sets RR_VERDICTS[i]. Returns 0, or 2 when the budget was spent before it.
rr_run_one() {
    local i=$1 id=${RR_IDS[$1]} cap rc t0 left_ms cap_ms cut="" v secs
    local -a cmd
    IFS=$'\t' read -r -a cmd <<<"${RR_CMDS[$i]}"
    cap=$(rr_cap_override "$id" "${RR_CAPS[$i]}")
    left_ms=$((RR_BUDGET_MS - ($(rr_now_ms) - RR_START_MS) - RR_RESERVE_S * 1000))
    # the row's kill grace (timeout -k 2) comes out of what is left
    if [ "$left_ms" -le 2500 ]; then
        RR_VERDICTS[i]="not reached (budget)"
        return 2
    fi
    cap_ms=$(awk -v c="$cap" 'BEGIN { printf "%d", c * 1000 }')
    if [ "$cap_ms" -gt $((left_ms - 2000)) ]; then
        cap_ms=$((left_ms - 2000))
        cut=" (budget)"
    fi
    secs=$((cap_ms / 1000))
    [ $((cap_ms % 1000)) -ne 0 ] && secs=$(printf '%d.%03d' $((cap_ms / 1000)) $((cap_ms % 1000)))
    export RR_LOG="$RR_DIR/$id.log" RR_CAP_S=$((cap_ms / 1000))
    rm -f "$RR_DIR/.verdict"
    printf '[%6ss] %s: running (cap %s s%s, log %s)\n' "$(rr_elapsed_s)" "$id" "$secs" "$cut" \
        "$RR_LOG"
    t0=$(rr_now_ms)
    timeout -k 2 "$secs" bash -c '"$@"' "$id" "${cmd[@]}" >"$RR_DIR/$id.out" 2>"$RR_LOG"
    rc=$?
    t0=$(( $(rr_now_ms) - t0 ))
    v=$(cat "$RR_DIR/.verdict" 2>/dev/null)
    rm -f "$RR_DIR/.verdict"
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        v="FAIL: cap ${secs} s reached${cut}, killed (exit $rc)${v:+; it had said: $v}"
    elif [ "$rc" -eq 77 ]; then
        case $v in skipped*) ;; *) v="skipped${v:+: $v}" ;; esac
    elif [ "$rc" -ne 0 ]; then
        case $v in FAIL*) ;; *) v="FAIL (exit $rc)${v:+: $v}" ;; esac
    else
        case $v in PASS*) ;; *) v="PASS${v:+ ($v)}" ;; esac
    fi
    RR_VERDICTS[i]="$v"
    # the row's lines, then its verdict, to the terminal and the results file at once
    tee -a "$RR_RESULTS" <"$RR_DIR/$id.out"
    rr_say "row $id: $v ($((t0 / 1000)).$((t0 % 1000 / 100)) s)"
    return 0
}

rr_run_all() {
    local i
    for ((i = 0; i < ${#RR_IDS[@]}; i++)); do
        rr_run_one "$i"
    done
}

# Run rows [from, to) only; for a caller that acts between rows (run.sh stops after the
# kernels row when the device is not there).
rr_run_range() {
    local i
    for ((i = $1; i < $2 && i < ${#RR_IDS[@]}; i++)); do
        rr_run_one "$i"
    done
}

rr_summary() {
    local i fail=0 v
    rr_say ""
    rr_say "summary ($(rr_elapsed_s) s of a $((RR_BUDGET_MS / 1000)) s budget; logs in $RR_DIR):"
    for ((i = 0; i < ${#RR_IDS[@]}; i++)); do
        v=${RR_VERDICTS[i]:-not reached (budget)}
        case $v in FAIL*) fail=1 ;; esac
        rr_say "$(printf '  %-28s %s' "${RR_IDS[i]}" "$v")"
    done
    return $fail
}
