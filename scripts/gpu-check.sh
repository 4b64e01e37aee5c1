#!/usr/bin/env bash
# The one prepared GPU check. On the GPU machine (which has no Rust toolchain as far as we
# know) it runs test and bench binaries built on a CPU machine:
#
#   scripts/gpu-check.sh --build   # on a CPU machine: builds them into target/gpu-check/
#   scripts/gpu-check.sh           # on the GPU machine, with target/gpu-check/ carried along
#
# Without target/gpu-check/ it builds them itself with cargo, where cargo exists. It runs
# dp-mem's device-memory tests, dp-data's batches in page-locked memory, compiles dp-model's
# CUDA kernels with the machine's NVRTC, checks the GPU training step against the CPU's and
# what the CUDA libraries take from host memory, checks the image models' GPU steps against
# the CPU's (LeNet, the CNN, ResNet-20 and ResNet-18, f32 within 1e-4 and bf16) and a
# GPT's likewise, trains the default job on the GPU (at least
# 97% eval accuracy), measures the MLP step's samples/s against PyTorch eager on the same GPU
# (scripts/torch_mlp_step.py; target 1.5x at batch 4096) and its device memory (target 1.1x
# what it must hold), measures the ResNet-20 (batch 512) and ResNet-18 (batch 128) steps in
# f32 and bf16 against PyTorch eager (dp-model's cuda_image_step bench and
# scripts/torch_resnet_gpu_step.py; targets: at least 1.0x PyTorch's images/s, at most 0.7x
# its device memory, both by the allocator's peak and by the fall of the GPU's free memory),
# measures GPT-2 small's bf16 step (context 1024, batch 8) with and without recomputation
# against PyTorch eager with autocast and SDPA (dp-model's cuda_gpt_step bench and
# scripts/torch_gpt_gpu_step.py: tokens/s, MFU, device memory), finds the largest GPT each
# side trains within 16 GiB of the GPU (dp plan --largest gpt --device cuda, trained two steps
# under that budget; scripts/torch_gpt_largest_gpu.py; target 2x the parameters),
# trains gpt-mini on text (the repository's own Markdown) to a little above the CPU's eval
# loss with the same command, trains ResNet-20 on small images (the built-in digits) on the
# GPU to a little below the
# accuracy the CPU reaches with the same command, and runs dp-comm's NCCL tests and benchmark
# (world size 1: NCCL refuses two ranks on one GPU; set DP_COMM_NCCL_RANKS=N on a machine with
# N GPUs), then prints a short report. A GPU test that would skip fails here instead. Each
# step has a timeout (STEP_TIMEOUT, 150 s unless the step sets its own), so the whole check
# stays within minutes; GPU_CHECK_ONLY="NAME ..." runs only the steps named (the names `run`
# prints after "==>"), to split the check over several device calls.
#
# cudarc looks for NCCL as `libnccl.so` (and a few other names) but installs and the
# `nvidia-nccl-cu13` Python wheel ship `libnccl.so.2`; this script finds it and puts a
# `libnccl.so` symlink to it on LD_LIBRARY_PATH. Set NCCL_LIB=/path/to/libnccl.so.2 to choose.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
bin=target/gpu-check

step() { printf '\n==> %s\n' "$*"; }

# Builds the binaries the check runs and copies them to $bin under fixed names.
build() {
    mkdir -p "$bin"
    local built
    built=$(cargo test --release --no-run --message-format=json \
        -p dp-mem -p dp-data -p dp-model -p dp-comm --features dp-mem/cuda,dp-model/cuda,dp-comm/cuda \
        --test cuda --test pipeline --test cuda_kernels --test cuda_model --test cuda_image_model \
        --test cuda_gpt_model --test cuda_host_memory \
        --test nccl 2>/dev/null &&
        cargo bench --no-run --message-format=json -p dp-comm --features cuda \
            --bench collectives 2>/dev/null &&
        cargo bench --no-run --message-format=json -p dp-model --features cuda \
            --bench cuda_step --bench cuda_image_step --bench cuda_gpt_step 2>/dev/null) || return 1
    # The trainer with the GPU path (the `dp` binary users install), in a target directory of
    # its own.
    cargo build --release --quiet -p xtask --bin dp --features cuda --target-dir target/cuda ||
        return 1
    cp target/cuda/release/dp "$bin/dp-cuda" || return 1
    printf '%s\n' "$built" | python3 -c '
import json, shutil, sys
wanted = {"cuda": "dp-mem-cuda", "pipeline": "dp-data-pipeline",
          "cuda_kernels": "dp-model-cuda-kernels",
          "cuda_model": "dp-model-cuda-model", "cuda_image_model": "dp-model-cuda-image-model",
          "cuda_gpt_model": "dp-model-cuda-gpt-model",
          "cuda_host_memory": "dp-model-cuda-host-memory",
          "nccl": "dp-comm-nccl",
          "collectives": "dp-comm-collectives", "cuda_step": "dp-model-cuda-step",
          "cuda_image_step": "dp-model-cuda-image-step",
          "cuda_gpt_step": "dp-model-cuda-gpt-step"}
found = {}
for line in sys.stdin:
    try:
        message = json.loads(line)
    except ValueError:
        continue
    name = message.get("target", {}).get("name")
    if message.get("reason") == "compiler-artifact" and name in wanted and message.get("executable"):
        found[wanted[name]] = message["executable"]
missing = sorted(set(wanted.values()) - set(found))
if missing:
    sys.exit(f"not built: {missing}")
for name, path in found.items():
    shutil.copy(path, f"{sys.argv[1]}/{name}")
    print(f"{sys.argv[1]}/{name}")
' "$bin" || return 1
    # Without symbols they travel to the GPU machine in a third of the bytes.
    strip "$bin"/* 2>/dev/null || true
}

if [ "${1:-}" = "--build" ]; then
    step "building the GPU check's binaries into $bin"
    build || { echo "build failed" >&2; exit 1; }
    exit 0
fi

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

step "GPU, libraries and binaries"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -4
nccl=$(find_nccl | head -1)
if [ -n "$nccl" ]; then
    shim=$(mktemp -d)
    trap 'rm -rf "$shim"' EXIT
    ln -s "$nccl" "$shim/libnccl.so"
    ln -s "$nccl" "$shim/libnccl.so.2"
    LD_LIBRARY_PATH="$shim:$(dirname "$nccl")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export LD_LIBRARY_PATH
    echo "NCCL: $nccl (linked as libnccl.so in $shim)"
else
    echo "NCCL: libnccl.so.2 not found (pip install nvidia-nccl-cu13, or set NCCL_LIB)"
fi
# NVRTC, cuBLAS and cuDNN (cudarc opens them by name, as libnvrtc.so.13 and libcublas.so.13): where
# the loader does not know them, the CUDA toolkit's folders or the Python wheels that carry them.
find_cuda_lib() { # name, e.g. libnvrtc.so
    ldconfig -p 2>/dev/null | grep -q "$1" && return
    local found
    found=$( { ls /usr/local/cuda/lib64/"$1"* /usr/local/cuda/targets/x86_64-linux/lib/"$1"* 2>/dev/null
        python3 -c 'import glob, site, sys
for root in site.getsitepackages() + sys.path:
    print("\n".join(glob.glob(root + "/nvidia/**/" + sys.argv[1] + "*", recursive=True)))' "$1" 2>/dev/null
    } | grep -v '\.alt\.' | head -1)
    if [ -n "$found" ]; then
        LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$(dirname "$found")"
        export LD_LIBRARY_PATH
    fi
    echo "$1: ${found:-not found}"
}
find_cuda_lib libnvrtc.so
find_cuda_lib libcublas.so
# cuDNN, for the image models' convolutions, pooling and batch norm (PyTorch's wheels carry it).
find_cuda_lib libcudnn.so
if [ ! -x "$bin/dp-model-cuda-step" ] || [ ! -x "$bin/dp-model-cuda-image-step" ]; then
    command -v cargo >/dev/null || { echo "no $bin/ and no cargo: run --build elsewhere" >&2; exit 1; }
    build || { echo "build failed" >&2; exit 1; }
fi
ls -l "$bin"

log=$(mktemp)
# The largest GPT within 16 GiB on token dataset $1: our planner's pick (trained two steps
# under the budget, into runs directory $2), then PyTorch's by search.
largest_job() {
    local data=$1 runs=$2 model
    "$bin/dp-cuda" plan --largest gpt --device cuda --replicas 1 --memory-budget 16GiB \
        --context 128 --batch 16 --data "$data" | tee "$runs.plan" || return 1
    model=$(sed -n 's/^largest *--model \(gpt:[0-9,]*\).*/\1/p' "$runs.plan")
    [ -n "$model" ] || { echo "largest: the plan named no model"; return 1; }
    "$bin/dp-cuda" train --device cuda --replicas 1 --model "$model" --memory-budget 16GiB \
        --context 128 --batch 16 --steps 2 --data "$data" --out "$runs" --name largest \
        --no-plot || return 1
    python3 scripts/torch_gpt_largest_gpu.py --budget-gib 16 --vocab 256 --context 128 --batch 16
}
export -f largest_job
export bin
run() { # name, then the command
    local name=$1; shift
    step "$name"
    # GPU_CHECK_ONLY="gptstep torchgpt largest" runs only the steps named (a device call has
    # at most 10 minutes; the whole check may take more): the others say so and pass.
    if [ -n "${GPU_CHECK_ONLY:-}" ] && [[ " $GPU_CHECK_ONLY " != *" $name "* ]]; then
        echo "skipped: not in GPU_CHECK_ONLY" | tee -a "$log.$name"
        return 0
    fi
    # A step that hangs must not take the whole check with it.
    timeout "${STEP_TIMEOUT:-150}" "$@" 2>&1 | tee -a "$log.$name"
    return "${PIPESTATUS[0]}"
}
export DP_REQUIRE_GPU=1 DP_REQUIRE_NVRTC=1
run mem "$bin/dp-mem-cuda" --nocapture --test-threads 1; mem_status=$?
run pipeline "$bin/dp-data-pipeline" batches_for_a_gpu; pipeline_status=$?
run kernels "$bin/dp-model-cuda-kernels" --nocapture; kernel_status=$?
run model "$bin/dp-model-cuda-model" --nocapture --test-threads 1; model_status=$?
run image_model "$bin/dp-model-cuda-image-model" --nocapture --test-threads 1; image_model_status=$?
run gpt_model "$bin/dp-model-cuda-gpt-model" --nocapture --test-threads 1; gpt_model_status=$?
run host "$bin/dp-model-cuda-host-memory" --nocapture; host_status=$?
# The default job on the GPU: the built-in digits, to at least 97% evaluation accuracy.
job=$(mktemp -d)
run job bash -c "'$bin/dp-cuda' data gen --out '$job/digits' && '$bin/dp-cuda' train --device cuda \
    --data '$job/digits/train' --eval-data '$job/digits/eval' --out '$job/runs' --name gpu --no-plot"
job_status=$?
accuracy=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["eval_accuracy"])' \
    "$job/runs/gpu/summary.json" 2>/dev/null || echo 0)
python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) >= 0.97 else 1)' "$accuracy" || job_status=1
rm -rf "$job"
# The MLP step against PyTorch eager, measured alike, one after the other (PyTorch's batches
# are page-locked, as a DataLoader with pin_memory hands them over: ours are measured both so
# and from ordinary memory).
run step "$bin/dp-model-cuda-step" --bench --warm-up-time 1 --measurement-time 3; step_status=$?
run torch python3 scripts/torch_mlp_step.py; torch_status=$?
# ResNet-20 and ResNet-18 steps in f32 and bf16 against PyTorch eager, measured alike, one
# after the other (ours from page-locked batches, PyTorch's from device memory; each PyTorch
# case in a fresh process, so no case inherits another's cached memory).
STEP_TIMEOUT=180 run imagestep "$bin/dp-model-cuda-image-step" --bench --warm-up-time 1 \
    --measurement-time 2
imagestep_status=$?
STEP_TIMEOUT=180 run torchimage python3 scripts/torch_resnet_gpu_step.py; torchimage_status=$?
# GPT-2 small (context 1024, batch 8, bf16, AdamW) without and with recomputation per block,
# against PyTorch eager with autocast and scaled_dot_product_attention, each side's two cases
# in fresh processes.
STEP_TIMEOUT=300 run gptstep "$bin/dp-model-cuda-gpt-step" --bench --warm-up-time 1 \
    --measurement-time 2
gptstep_status=$?
STEP_TIMEOUT=240 run torchgpt bash -c 'python3 scripts/torch_gpt_gpu_step.py \
    && python3 scripts/torch_gpt_gpu_step.py --checkpoint'
torchgpt_status=$?
# ResNet-20 on small images on the GPU: the built-in digits (28x28 grey, taken as a 1x28x28
# image), 6,000 to train and 2,000 to evaluate, 3 epochs at batch 64 of the ResNet recipe's
# defaults (279 steps), to at least 98% eval accuracy: a little below the 99.2% that the CPU
# build reached with the same data and run (`dp data gen --out D --records 6000 --eval-records
# 2000`, then `dp train --model resnet20 --epochs 3 --batch 64 --replicas 1 --data D/train
# --eval-data D/eval --no-plot`, one replica of 64 as on one GPU; 75 s on a 2-core CPU machine).
IMAGE_CPU_ACCURACY=0.992 IMAGE_ACCURACY=0.98
imagejob=$(mktemp -d)
STEP_TIMEOUT=150 run imagejob bash -c "'$bin/dp-cuda' data gen --out '$imagejob/digits' \
    --records 6000 --eval-records 2000 && '$bin/dp-cuda' train --device cuda \
    --model resnet20 --epochs 3 --batch 64 --data '$imagejob/digits/train' \
    --eval-data '$imagejob/digits/eval' --out '$imagejob/runs' --name gpu --no-plot"
imagejob_status=$?
image_accuracy=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["eval_accuracy"])' \
    "$imagejob/runs/gpu/summary.json" 2>/dev/null || echo 0)
python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) >= float(sys.argv[2]) else 1)' \
    "$image_accuracy" "$IMAGE_ACCURACY" || imagejob_status=1
rm -rf "$imagejob"
# gpt-mini on text on the GPU: the repository's own Markdown (about 160 KB of English, byte
# tokens), 100 steps of 16 windows of 128 tokens, to an eval loss of at most 2.95: a little
# above the 2.891 that the CPU build reached with the same corpus and run (`dp data import
# --format text corpus.txt --out T`, then `dp train --model gpt-mini --context 128 --steps 100
# --batch 16 --replicas 1 --data T/train --eval-data T/eval --no-plot`; 122 s on one core);
# then `dp eval` and `dp sample` of the run on the GPU.
TEXT_CPU_LOSS=2.891 TEXT_LOSS=2.95
textjob=$(mktemp -d)
cat ./*.md ./*/README.md dp-data/FORMAT.md > "$textjob/corpus.txt"
STEP_TIMEOUT=150 run textjob bash -c "'$bin/dp-cuda' data import --format text \
    '$textjob/corpus.txt' --out '$textjob/text' && '$bin/dp-cuda' train --device cuda \
    --model gpt-mini --context 128 --steps 100 --batch 16 --data '$textjob/text/train' \
    --eval-data '$textjob/text/eval' --out '$textjob/runs' --name gpu --no-plot \
    && '$bin/dp-cuda' eval --device cuda '$textjob/runs/gpu' --data '$textjob/text/eval' \
    && '$bin/dp-cuda' sample --device cuda '$textjob/runs/gpu' --prompt 'The ' --tokens 256"
textjob_status=$?
# The largest GPT each side trains on this GPU within the same 16 GiB, both found by search on
# the text job's byte tokens (vocabulary 256, context 128, batch 16): ours by the planner,
# confirmed by training it two steps under that budget; PyTorch's by trying sizes (AdamW,
# autocast, SDPA). Target: ours at least 2x the parameters.
STEP_TIMEOUT=400 run largest bash -c 'largest_job "$0" "$1"' "$textjob/text/train" \
    "$textjob/runs"
largest_status=$?
text_loss=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["eval_loss"])' \
    "$textjob/runs/gpu/summary.json" 2>/dev/null || echo inf)
python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) <= float(sys.argv[2]) else 1)' \
    "$text_loss" "$TEXT_LOSS" || textjob_status=1
rm -rf "$textjob"
run nccl "$bin/dp-comm-nccl" --nocapture --test-threads 1; test_status=$?
run bench "$bin/dp-comm-collectives" --bench; bench_status=$?

step "report"
echo "NCCL library:  ${nccl:-not found}"
echo "device memory: $(grep -E '^test result:' "$log.mem" | tail -1) (exit $mem_status)"
grep -m1 'skipping CUDA memory test' "$log.mem" | sed 's/^/               /'
echo "pipeline:      page-locked batches: $(grep -E '^test result:' "$log.pipeline" | tail -1) (exit $pipeline_status)"
echo "kernels:       $(grep -E 'kernels compiled' "$log.kernels" | tail -1) (exit $kernel_status)"
echo "GPU model:     $(grep -E '^test result:' "$log.model" | tail -1) (exit $model_status)"
echo "image models:  $(grep -E '^test result:' "$log.image_model" | tail -1) (exit $image_model_status)"
grep -E 'gradients|parameters differ|bf16 step' "$log.image_model" | sed 's/^/               /'
echo "GPT model:     $(grep -E '^test result:' "$log.gpt_model" | tail -1) (exit $gpt_model_status)"
grep -E '^GPT' "$log.gpt_model" | sed 's/^/               /'
echo "host memory:   $(grep -E '^runtime' "$log.host" | tail -1) (exit $host_status)"
echo "default job:   eval accuracy $accuracy (>= 0.97), $(grep -E '^throughput' "$log.job" | tail -1) (exit $job_status)"
grep -E '^device memory' "$log.job" | sed 's/^/               /'
grep -E 'gradients differ|parameters differ' "$log.model" | sed 's/^/               /'
for batch in 256 4096; do
    theirs=$(sed -n "s/^torch step: batch $batch, \([0-9]*\) samples.*/\1/p" "$log.torch")
    for memory in page-locked pageable; do
        ours=$(sed -n "s/^cuda step: batch $batch, $memory batches, \([0-9]*\) samples.*/\1/p" "$log.step")
        ratio=$(python3 -c 'import sys; print(f"{float(sys.argv[1]) / float(sys.argv[2]):.2f}x")' \
            "$ours" "$theirs" 2>/dev/null || echo "n/a")
        echo "MLP step:      batch $batch, $memory: ${ours:-?} samples/s vs PyTorch eager ${theirs:-?}: $ratio"
    done
done
grep -E '^cuda step: batch 4096, page-locked' "$log.step" | sed 's/.*; /               /'
echo "               (target at batch 4096: 1.5x; memory 1.1x; exits $step_status, $torch_status)"
# Each image case: images/s ours against PyTorch's, and the device peak by the allocator and by
# the fall of the GPU's free memory, ours against PyTorch's (ratios from the two logs of this
# run; targets: >= 1.0x the speed, <= 0.7x the memory).
python3 - "$log.imagestep" "$log.torchimage" <<'PY'
import re, sys
line = re.compile(r"^(cuda|torch) image step: (\S+ \S+ batch \d+), (.*)$")
figures = re.compile(r"(\d+) images/s .*device peak ([\d.]+) MiB \(allocator\), ([\d.]+) MiB "
                     r"\(driver, free-memory drop\)(?:; (.*))?")
found = {"cuda": {}, "torch": {}}
# Where a side printed no line for a case, its log's last line says why.
last = {"cuda": "no log", "torch": "no log"}
for side, path in zip(("cuda", "torch"), sys.argv[1:]):
    try:
        text = open(path).read()
    except OSError:
        continue
    lines = [l for l in text.splitlines() if l.strip()] or ["empty log"]
    panic = [i for i, l in enumerate(lines[:-1]) if " panicked at " in l]
    last[side] = lines[panic[-1] + 1] if panic else lines[-1]
    for match in map(line.match, text.splitlines()):
        if match:
            found[side][match.group(2)] = match.group(3)
cases = [f"{model} {precision} batch {batch}" for precision in ("f32", "bf16")
         for model, batch in (("resnet20", 512), ("resnet18", 128))]
def ratio(a, b, better):
    value = float(a) / float(b) if float(b) > 0 else float("nan")
    return f"{value:.2f}x ({'met' if better(value) else 'missed'})"
for case in cases:
    ours = found["cuda"].get(case, f"no line ({last['cuda'][:150]})")
    theirs = found["torch"].get(case, f"no line ({last['torch'][:150]})")
    a, b = figures.match(ours), figures.match(theirs)
    if not (a and b):
        brief = lambda text, m: f"{m[1]} images/s, {m[2]} MiB (allocator)" if m else text[:200]
        print(f"image step:    {case}: ours: {brief(ours, a)}; PyTorch: {brief(theirs, b)}")
        continue
    print(f"image step:    {case}: {a[1]} images/s vs PyTorch eager {b[1]}: "
          f"{ratio(a[1], b[1], lambda r: r >= 1.0)}")
    print(f"               device peak, allocator: {a[2]} vs {b[2]} MiB: "
          f"{ratio(a[2], b[2], lambda r: r <= 0.7)}; driver (free-memory drop): "
          f"{a[3]} vs {b[3]} MiB: {ratio(a[3], b[3], lambda r: r <= 0.7)}")
    if b[4]:
        print(f"               PyTorch's process as NVML counts it (context included): {b[4]}")
PY
echo "               (targets: >= 1.0x images/s, <= 0.7x device memory; exits $imagestep_status, $torchimage_status)"
# GPT-2 small: tokens/s and device memory ours against PyTorch's, case by case; our MFU and
# recomputation's cost (targets: >= 1.0x the speed, <= 0.7x the memory; recomputation <= 1.3x
# the step time with >= 2.5x less activation memory).
python3 - "$log.gptstep" "$log.torchgpt" <<'PY'
import re, sys
line = re.compile(r"^(cuda|torch) gpt step: (gpt2-small [^,]*), (.*)$")
figures = re.compile(r"(\d+) tokens/s .*device peak ([\d.]+) MiB \(allocator\), ([\d.]+) MiB")
found = {"cuda": {}, "torch": {}}
for side, path in zip(("cuda", "torch"), sys.argv[1:]):
    try:
        text = open(path).read()
    except OSError:
        continue
    for l in text.splitlines():
        m = line.match(l)
        if m:
            found[side][m.group(2)] = m.group(3)
        elif l.startswith("cuda gpt step: recomputation") or "failed" in l:
            print(f"gpt step:      {l}")
for case in ("gpt2-small bf16 batch 8 context 1024",
             "gpt2-small bf16 batch 8 context 1024 recompute"):
    ours, theirs = found["cuda"].get(case, "no line"), found["torch"].get(case, "no line")
    a, b = figures.match(ours), figures.match(theirs)
    if not (a and b):
        print(f"gpt step:      {case}: ours: {ours[:200]}; PyTorch: {theirs[:200]}")
        continue
    speed, memory = float(a[1]) / float(b[1]), float(a[2]) / float(b[2])
    print(f"gpt step:      {case}: {a[1]} tokens/s vs PyTorch {b[1]}: {speed:.2f}x "
          f"({'met' if speed >= 1.0 else 'missed'}); allocator peak {a[2]} vs {b[2]} MiB: "
          f"{memory:.2f}x ({'met' if memory <= 0.7 else 'missed'}); driver {a[3]} vs {b[3]} MiB")
    mfu = re.search(r"(MFU .*?); device peak", ours)
    if mfu:
        print(f"               {mfu.group(1)}")
PY
echo "               (exits $gptstep_status, $torchgpt_status)"
echo "image job:     resnet20 on digits, eval accuracy $image_accuracy (>= $IMAGE_ACCURACY; CPU $IMAGE_CPU_ACCURACY), $(grep -E '^throughput' "$log.imagejob" | tail -1) (exit $imagejob_status)"
echo "text job:      gpt-mini on the repository's Markdown, eval loss $text_loss (<= $TEXT_LOSS; CPU $TEXT_CPU_LOSS), $(grep -E '^throughput' "$log.textjob" | tail -1) (exit $textjob_status)"
grep -E '^f32 |tokens after a prompt' "$log.textjob" | sed 's/^/               on the GPU: /'
python3 - "$log.largest" <<'PY'
import re, sys
text = open(sys.argv[1]).read() if len(sys.argv) > 1 else ""
ours = re.search(r"^largest\s+--model gpt:(\d+),(\d+),(\d+)", text, re.M)
theirs = re.search(r"^torch largest gpt: gpt:(\d+),\d+,\d+ \((\d+) parameters\)", text, re.M)
def params(n):  # gpt:n,n,64n at vocabulary 256, context 128, as gpt_model.py counts them
    c = 64 * n
    return n * (12 * c * c + 13 * c) + (256 + 128) * c + 2 * c
if ours and theirs:
    a, b = params(int(ours[1])), int(theirs[2])
    print(f"largest GPT:   within 16 GiB: ours gpt:{ours[1]},{ours[1]},{ours[3]} ({a} parameters) "
          f"vs PyTorch gpt:{theirs[1]} ({b}): {a / b:.2f}x ({'met' if a >= 2 * b else 'missed'}: >= 2x)")
else:
    print(f"largest GPT:   not measured: {(text.strip().splitlines() or ['no log'])[-1][:200]}")
PY
echo "               (exit $largest_status)"
echo "nccl tests:    $(grep -E '^test result:' "$log.nccl" | tail -1) (exit $test_status)"
skipped=$(grep -c 'skipping NCCL test' "$log.nccl")
[ "$skipped" -gt 0 ] && echo "               $skipped skipped: $(grep -m1 'skipping NCCL test' "$log.nccl")"
grep -E '^nccl host-staged|^NCCL not measured' "$log.bench" | sed 's/^/bench:         /'
grep -E '^memcpy bandwidth|^4 KiB latency' "$log.bench" | sed 's/^/cpu:           /'
echo "bench exit:    $bench_status"
rm -f "$log" "$log".*
[ "$mem_status" -eq 0 ] && [ "$kernel_status" -eq 0 ] && [ "$model_status" -eq 0 ] \
    && [ "$image_model_status" -eq 0 ] && [ "$gpt_model_status" -eq 0 ] \
    && [ "$host_status" -eq 0 ] && [ "$pipeline_status" -eq 0 ] \
    && [ "$job_status" -eq 0 ] && [ "$step_status" -eq 0 ] && [ "$test_status" -eq 0 ] \
    && [ "$bench_status" -eq 0 ] && [ "$imagestep_status" -eq 0 ] \
    && [ "$torchimage_status" -eq 0 ] && [ "$imagejob_status" -eq 0 ] && [ "$textjob_status" -eq 0 ] \
    && [ "$gptstep_status" -eq 0 ] && [ "$torchgpt_status" -eq 0 ] && [ "$largest_status" -eq 0 ]
