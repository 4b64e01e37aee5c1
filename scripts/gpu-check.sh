#!/usr/bin/env bash
# Builds and runs dp-mem's device-memory tests, compiles dp-model's CUDA kernels with the
# machine's NVRTC, and runs dp-comm's NCCL tests and benchmark on a machine with an NVIDIA
# GPU, and prints a short report. World size 1: NCCL refuses two ranks on one GPU, so one GPU allows one rank
# (set DP_COMM_NCCL_RANKS=N on a machine with N GPUs).
#
# cudarc looks for NCCL as `libnccl.so` (and a few other names) but installs and the
# `nvidia-nccl-cu13` Python wheel ship `libnccl.so.2`; this script finds it and puts a
# `libnccl.so` symlink to it on LD_LIBRARY_PATH. Set NCCL_LIB=/path/to/libnccl.so.2 to choose.
set -uo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

find_nccl() {
    if [ -n "${NCCL_LIB:-}" ]; then echo "$NCCL_LIB"; return; fi
    ldconfig -p 2>/dev/null | awk '/libnccl\.so\.2 /{print $NF; exit}' | grep . && return
    python3 - <<'PY' 2>/dev/null
import glob, os, site, sys
roots = site.getsitepackages() + [site.getusersitepackages()] + sys.path
for root in roots:
    for path in glob.glob(os.path.join(root, "nvidia", "nccl", "lib", "libnccl.so*")):
        print(path); raise SystemExit
PY
}

step "GPU and libraries"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -4
nccl=$(find_nccl | head -1)
if [ -n "$nccl" ]; then
    shim=$(mktemp -d)
    trap 'rm -rf "$shim"' EXIT
    ln -s "$nccl" "$shim/libnccl.so"
    ln -s "$nccl" "$shim/libnccl.so.2"
    export LD_LIBRARY_PATH="$shim:$(dirname "$nccl")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "NCCL: $nccl (linked as libnccl.so in $shim)"
else
    echo "NCCL: libnccl.so.2 not found (pip install nvidia-nccl-cu13, or set NCCL_LIB)"
fi

step "cargo test -p dp-mem --features cuda --test cuda"
mem_log=$(mktemp)
cargo test -p dp-mem --features cuda --release --test cuda -- --nocapture --test-threads 1 2>&1 | tee "$mem_log"
mem_status=${PIPESTATUS[0]}

step "cargo test -p dp-model --features cuda --test cuda_kernels (NVRTC of this machine's CUDA)"
DP_REQUIRE_NVRTC=1 cargo test -p dp-model --features cuda --release --test cuda_kernels -- --nocapture 2>&1 | tee -a "$mem_log"
kernel_status=${PIPESTATUS[0]}

step "cargo test -p dp-comm --features cuda --test nccl"
test_log=$(mktemp)
cargo test -p dp-comm --features cuda --release --test nccl -- --nocapture --test-threads 1 2>&1 | tee "$test_log"
test_status=${PIPESTATUS[0]}

step "cargo bench -p dp-comm --features cuda"
bench_log=$(mktemp)
cargo bench -p dp-comm --features cuda --bench collectives -- --bench 2>&1 | tee "$bench_log"
bench_status=${PIPESTATUS[0]}

step "report"
echo "NCCL library:  ${nccl:-not found}"
echo "device memory: $(grep -E '^test result:' "$mem_log" | tail -1) (exit $mem_status)"
grep -m1 'skipping CUDA memory test' "$mem_log" | sed 's/^/               /'
echo "kernels:       $(grep -E 'kernels compiled' "$mem_log" | tail -1) (exit $kernel_status)"
echo "tests:         $(grep -E '^test result:' "$test_log" | tail -1) (exit $test_status)"
skipped=$(grep -c 'skipping NCCL test' "$test_log")
[ "$skipped" -gt 0 ] && echo "               $skipped skipped: $(grep -m1 'skipping NCCL test' "$test_log")"
grep -E '^nccl host-staged|^NCCL not measured' "$bench_log" | sed 's/^/bench:         /'
grep -E '^memcpy bandwidth|^4 KiB latency' "$bench_log" | sed 's/^/cpu:           /'
echo "bench exit:    $bench_status"
rm -f "$mem_log" "$test_log" "$bench_log"
[ "$mem_status" -eq 0 ] && [ "$kernel_status" -eq 0 ] && [ "$test_status" -eq 0 ] \
    && [ "$bench_status" -eq 0 ]
