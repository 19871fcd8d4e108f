# shellcheck shell=bash disable=SC2154  # py, kvf, bundle, B: set by run.sh
# The preflight of tests/gpu/run.sh (sourced, not run): in seconds, what this machine has for
# the GPU table (driver, GPUs, cuBLAS/cuBLASLt, NCCL, torch, a NIXL package or wheel, UCX's
# transports) and which rows each missing piece will skip or fail, before any row spends the
# window. Every probe has its own timeout (a wedged driver or a slow torch import cannot eat
# the budget). Lines go through rr_say (terminal and results file).
#
# Needs: $bundle, $B (bundle root), $kvf, $py (the Python), $nixl_wheel, $ngpu (set here).

# soname: prints the folder holding it ($KVF_CUDA_LIBS, the Python's nvidia-* wheels, the CUDA
# toolkit, the library cache; the first wins)
find_lib() {
    local n=$1 d found
    local libs_env=${KVF_CUDA_LIBS:-}
    for d in ${libs_env//:/ }; do [ -e "$d/$n" ] && { echo "$d"; return 0; }; done
    found=$(timeout 10 "$py" - "$n" 2>/dev/null <<'PY'
import glob, os, site, sys
roots = site.getsitepackages() + [site.getusersitepackages()]
for r in roots:
    for f in glob.glob(os.path.join(r, "nvidia", "**", sys.argv[1]), recursive=True):
        print(os.path.dirname(f)); sys.exit(0)
PY
)
    [ -n "$found" ] && { echo "$found"; return 0; }
    for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
        [ -e "$d/$n" ] && { echo "$d"; return 0; }
    done
    d=$(ldconfig -p 2>/dev/null | awk -v n="$n" '$1 == n { print $NF; exit }')
    [ -n "$d" ] && { dirname "$d"; return 0; }
    return 1
}

# the CUDA libraries kvf loads but the bundle does not carry; exports KVF_CUDA_LIBS
pf_cuda_libs() {
    local n d libs="" elf=$kvf missing=""
    [ -n "$bundle" ] && elf="$B/libexec/kvf"
    for n in libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
        d=""
        # a built kvf says which soname it needs and where the loader finds it
        if [ -z "$bundle" ] && [ -x "$elf" ] && ldd "$elf" >/dev/null 2>&1; then
            d=$(ldd "$elf" 2>/dev/null | awk -v p="${n%%.so*}.so" 'index($1, p) == 1 {
                    print ($3 == "not" ? "NOT FOUND" : $3); exit }')
            [ -n "$d" ] && { rr_say "preflight: $n (as kvf links it): $d"; }
            [ "$d" = "NOT FOUND" ] && missing="$missing $n"
            [ -n "$d" ] && continue
        fi
        if d=$(find_lib "$n"); then
            case ":$libs:" in *":$d:"*) ;; *) libs="${libs:+$libs:}$d" ;; esac
            rr_say "preflight: $n: $d"
        else
            rr_say "preflight: $n: NOT FOUND"
            missing="$missing $n"
        fi
    done
    [ -n "$bundle" ] && export KVF_CUDA_LIBS="$libs"
    case $missing in
    *cublas*) rr_say "  -> without cuBLAS/cuBLASLt the CUDA programs do not load: every kernel," \
                     "generate, engine and pull row FAILs (set KVF_CUDA_LIBS to their folder)" ;;
    esac
    case $missing in
    *nccl*) rr_say "  -> without NCCL a program linked with it does not load (the same rows" \
                   "FAIL); the TP 2 rows need it in any case" ;;
    esac
}

pf_python() {
    local t n
    t=$(timeout 30 "$py" -c 'import torch; print(torch.__version__, "cuda", torch.cuda.is_available())' 2>/dev/null)
    if [ -n "$t" ]; then
        rr_say "preflight: torch $t ($py)"
    else
        rr_say "preflight: torch: not importable by $py (KVF_GPU_PYTHON picks another)"
        rr_say "  -> engine row: transformers cells empty; nixl row skipped (it needs torch)"
    fi
    if [ -n "$nixl_wheel" ]; then
        rr_say "preflight: NIXL: wheel $nixl_wheel (unpacked by the nixl row)"
        return
    fi
    n=$(timeout 20 "$py" -c '
import importlib
for m in ("nixl_cu13", "nixl_cu12", "nixl"):
    try:
        importlib.import_module(m); print(m); break
    except Exception:
        pass' 2>/dev/null)
    if [ -n "$n" ]; then
        rr_say "preflight: NIXL: package $n"
    else
        rr_say "preflight: NIXL: no package, no --nixl-wheel -> nixl row skipped"
    fi
}

pf_ucx() {
    local mods t
    if [ -n "$bundle" ]; then
        mods=$(cd "$B/lib/ucx" 2>/dev/null && echo *)
        rr_say "preflight: UCX modules in the bundle: ${mods:-none}"
        case $mods in
        *libuct_cuda.so*) ;;
        *) rr_say "  -> no cuda module: the UCX path's GPU pulls FAIL (the IPC path still runs)" ;;
        esac
        return
    fi
    if command -v ucx_info >/dev/null 2>&1; then
        t=$(timeout 15 ucx_info -d 2>/dev/null | sed -n 's/^#[[:space:]]*Transport: //p' |
            sort -u | tr '\n' ' ')
        rr_say "preflight: UCX transports (ucx_info -d): ${t:-none}"
        case " $t" in
        *" cuda_ipc "*|*" cuda_copy "*) ;;
        *) rr_say "  -> no cuda_copy/cuda_ipc: the UCX path's GPU pulls FAIL (the IPC path still runs)" ;;
        esac
    else
        rr_say "preflight: UCX transports: no ucx_info on PATH (the pull rows say what ran)"
    fi
}

# Prints what the machine has; sets and exports ngpu (GPUs nvidia-smi lists).
preflight() {
    local l drv
    ngpu=$(timeout 10 nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
    export ngpu
    drv=$(timeout 10 nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -1)
    while read -r l; do
        rr_say "preflight: GPU: $l"
    done < <(timeout 10 nvidia-smi --query-gpu=index,name,driver_version,memory.total \
                 --format=csv,noheader 2>/dev/null)
    rr_say "preflight: $ngpu GPU(s), driver's CUDA ${drv:-unknown}"
    [ "$ngpu" -lt 2 ] && rr_say "  -> one GPU: the TP 2 rows are skipped"
    if [ -n "$bundle" ]; then
        sed -n 's/^\(commit\|UCX\|built\): /preflight: bundle \1: /p' "$B/MANIFEST" |
            while read -r l; do rr_say "$l"; done
    fi
    pf_cuda_libs
    pf_python
    pf_ucx
    rr_say "preflight: done in $(rr_elapsed_s) s"
}
