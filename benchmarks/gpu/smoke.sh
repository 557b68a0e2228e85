#!/usr/bin/env bash
# Every GPU path of scalerepro once, on ONE GPU, with PASS/FAIL/SKIP lines and figures (issue 24).
# Run from the repository root, one or more stages per device call:
#
#   bash benchmarks/gpu/smoke.sh env frontier      (call 1 of benchmarks/README.md's plan)
#
#   env       versions, peak table, NVML energy counter, matmul rate, SDPA kernels, torch.compile,
#             device loader == CPU loader and its cost, ncu reads every metric asked for (59 s on
#             an H100, 2026-11-25), the prescreen's node check (scalerepro.training.node_check)
#   frontier  one record per model (benchmarks/trainer_throughput.py, optimised preset, bf16,
#             synthetic): resnet50, gpt2_small, resnet18_cifar, bert_base, vit_b_16, llama_1b;
#             each record checked for every figure, the goal table (~75 s a model with a cold
#             compile, llama_1b ~120 s; SMOKE_MODELS="vit_b_16 llama_1b" runs only those); each
#             run profiles 5 steps after its window (--kernel-profile-steps: its kernels and the
#             GPU's idle time in the record) and keeps its compile cache in $SMOKE_COMPILE_CACHE
#             (default $SMOKE_OUT/compile-cache; a carried folder of an earlier call's caches makes
#             the compile warm once signed with this machine's key: scalerepro.training.cache_trust
#             sign, docs/trainer.md), packed into $OUT/compile-cache.tgz where it is under 15 MiB
#   record    1-GPU record via scalerepro.launching.launch; NCCL + DDP at one rank (--process-group-at-one-rank)
#             with both probes; the comm benchmark's CUDA path (~110 s)
#   onecard   two ranks on the one card over gloo (--dist-backend gloo; NCCL refuses two ranks on one
#             device): resnet18_cifar under DDP with both probes, a shrunk gpt2_small under FSDP, each
#             record checked as a two-rank record, then the analysis of both (rebuild --records; its
#             jsonschema comes with the wheels of wheels.py). Code paths only: no NCCL, no scaling figure
#             (CPU rehearsal 44-85 s on 2 cores; not yet timed on a GPU)
#   profile   the profile rule's script: torch.profiler fallback, then ncu (where it reads counters)
#             on the window's first kernels, the project's ncu reader and roofline (~160 s)
#   ce        GPT-2's loss eager vs compiled (~20 s)
#   levers    each lever of the optimised preset changed alone: resnet18_cifar, resnet50, gpt2_small;
#             issue 51's: the ResNets' stem padded (stem4, stem8), each transformer compiled a block at
#             a time (blocks), GPT-2's attention kernel (cudnn-attention, flash-attention)
#             (~50-75 s a lever; SMOKE_MODELS selects models here too, SMOKE_LABELS levers by label)
#   ncu       the ncu probe alone: does the real ncu read every metric the project asks for (~11 s)
#   cells     the study's one-GPU scaling cells alone (the one-H100 study's frontier), before the rest
#   study     snakemake --cores all on $SMOKE_STUDY_CONFIG (default benchmarks/gpu/study.yaml; the
#             one-H100 study is benchmarks/gpu/h100-study.yaml); needs the wheels of wheels.py;
#             results/ packed into $OUT/study-results.tgz every 20 s while it runs
#   curve     ResNet-50's step time at batches 400 200 100 50 256 (benchmarks/gpu/batch_curve.py, a compile
#             a batch: ~5 min cold on an H100)
#
# benchmarks/README.md plans the calls of one session's device time and holds what they measured.
# One call must end inside the device tool's 10-minute limit, or a killed stage loses its lines:
# SMOKE_BUDGET_S (default 540) is this call's whole budget; each command's timeout is cut to what
# is left less SMOKE_RESERVE_S (default 25, for packing), and a command that would get less than
# its minimum is SKIPPED with a line saying so. Outputs go to $SMOKE_OUT (default
# results/gpu_smoke, git-ignored); summary.txt collects the PASS/FAIL/SKIP lines. Under the device
# tool ($OUT set) summary.txt is copied to $OUT after every line and the outputs (no compile
# cache) are packed into $OUT/smoke.tgz on exit. The exit code is the number of FAIL lines.
#
# SMOKE_DEVICE=cpu rehearses every stage on a machine without a GPU (small models, gloo, eager,
# the torch profiler only), so that a stage broken by a change fails here and not in device time.
set -uo pipefail
[ -f workflow/scalerepro/training/trainer.py ] || { echo "run this from the repository root"; exit 2; }
[ $# -gt 0 ] || set -- env
HERE=benchmarks/gpu
PY=${PYTHON:-python3}
DEVICE=${SMOKE_DEVICE:-cuda}
DIR=${SMOKE_OUT:-$PWD/results/gpu_smoke}
BUDGET=${SMOKE_BUDGET_S:-540}
RESERVE=${SMOKE_RESERVE_S:-25}
mkdir -p "$DIR"
# No network on the GPU machine, so no pip install of the project: it imports from workflow/.
export PYTHONPATH="$PWD/workflow${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR="$DIR/inductor-cache" LC_NUMERIC=C NCCL_DEBUG=${NCCL_DEBUG:-WARN}
SUMMARY="$DIR/summary.txt"
FAILS=0
declare -A CHECKED=()  # study records already checked in this call
note() {
  echo "== $*" | tee -a "$SUMMARY"
  if [ -n "${OUT:-}" ]; then cp "$SUMMARY" "$OUT/summary.txt"; fi
}
# a study's whole results/ (records, logs, tables, plots, report, inventory, profiles, store),
# without this script's own folder and any checkpoint, written whole or not at all
pack_study() {
  [ -n "${OUT:-}" ] && [ -d results/runs ] || return 0
  tar czf "$OUT/.study-results.tgz" --exclude gpu_smoke --exclude checkpoints --exclude '*.pt' --exclude '*.dcp' results 2> /dev/null \
    && mv "$OUT/.study-results.tgz" "$OUT/study-results.tgz"
}
COMPILE_CACHE=${SMOKE_COMPILE_CACHE:-$DIR/compile-cache}
# the frontier's compile caches, for a later call to start warm (the device tool returns files of
# at most 16 MiB: a larger pack is left behind, with a line saying so)
pack_compile_cache() {
  [ -n "${OUT:-}" ] && [ -n "$(ls "$COMPILE_CACHE"/*.bin 2> /dev/null)" ] || return 0
  tar czf "$OUT/.compile-cache.tgz" -C "$COMPILE_CACHE" . 2> /dev/null || return 0
  local bytes
  bytes=$(stat -c %s "$OUT/.compile-cache.tgz")
  if [ "$bytes" -le $((15 * 1024 * 1024)) ]; then
    mv "$OUT/.compile-cache.tgz" "$OUT/compile-cache.tgz"
  else
    rm -f "$OUT/.compile-cache.tgz"
    echo "== compile caches not packed: $bytes bytes compressed, over the 15 MiB a returned file may hold" | tee -a "$SUMMARY"
  fi
}
pack() {  # on exit, also after a FAIL: what ran comes back through the device tool's $OUT
  if [ -n "${OUT:-}" ]; then
    tar czf "$OUT/smoke.tgz" --exclude inductor-cache --exclude compile-cache --exclude fakecifar -C "$(dirname "$DIR")" "$(basename "$DIR")"
    pack_compile_cache
    pack_study
    cp "$SUMMARY" "$OUT/summary.txt"
  fi
}
trap pack EXIT
left() { echo $((BUDGET - SECONDS - RESERVE)); }
# run MIN LIMIT COMMAND...: COMMAND under a timeout of LIMIT seconds, cut to what the budget has
# left; skipped (exit 125) when that is under MIN.
run() {
  local min=$1 limit=$2 rest
  shift 2
  rest=$(left)
  if [ "$rest" -lt "$min" ]; then
    note "SKIP $1 ... (needs ${min}s, ${rest}s of the call's budget left)"
    return 125
  fi
  [ "$limit" -le "$rest" ] || limit=$rest
  echo "+ [${limit}s] $*" >&2
  timeout -s "${RUN_SIGNAL:-TERM}" -k 30 "$limit" "$@"
  local rc=$?
  [ "$rc" -eq 124 ] && echo "!! timed out after ${limit}s: $1" >&2
  return "$rc"
}
# check WHAT COMMAND...: PASS, FAIL (counted in the exit code) or SKIP (the budget ran out)
check() {
  local what=$1 rc
  shift
  "$@"
  rc=$?
  if [ "$rc" -eq 0 ]; then
    note "PASS $what"
  elif [ "$rc" -eq 125 ]; then
    note "SKIP $what"
  else
    note "FAIL $what (rc=$rc)"
    FAILS=$((FAILS + 1))
  fi
}
gpu() { [ "$DEVICE" = cuda ]; }
# record_check RECORD [check_record.py flags...]
record_check() {
  local record=$1
  shift
  if gpu; then $PY $HERE/check_record.py "$record" "$@"; else $PY $HERE/check_record.py "$record" --cpu "$@"; fi
}

# Whether ncu can read here every metric scalerepro.launching.nsight asks for on this GPU, on a tiny
# CUDA program: the real tool's answer, not its --query-metrics list (which omits derived metrics
# such as sm__maximum_warps_per_active_cycle_pct). The H200 kind's gVisor machines read no
# counter at all ("LibraryNotLoaded"). The answer is kept for the call's later stages.
ncu_usable() {
  command -v ncu > /dev/null || { echo "no ncu on PATH" > "$DIR/ncu_usable.txt"; return 1; }
  if [ ! -f "$DIR/ncu_usable.txt" ]; then
    local metrics
    metrics=$($PY -c 'from scalerepro.launching import nsight as p; print(",".join((*p.NCU_METRICS, *p.tensor_pipe_metrics(p.gpu_compute_major()))))')
    if timeout 120 ncu --metrics "$metrics" --csv --print-units base --print-metric-name name $PY -c \
        'import torch; x = torch.ones(1 << 20, device="cuda"); torch.cuda.synchronize(); print(float((x * 2).sum()))' \
        > "$DIR/ncu_probe.txt" 2>&1 && [ "$(grep -c '"Command line profiler metrics"' "$DIR/ncu_probe.txt")" -ge "$(echo "$metrics" | tr , '\n' | wc -l)" ]; then
      echo yes > "$DIR/ncu_usable.txt"
    elif grep -qE 'LibraryNotLoaded|ERR_NVGPUCTRPERM' "$DIR/ncu_probe.txt"; then
      echo "ncu reads no hardware counter here: $(grep -m1 -E 'LibraryNotLoaded|ERR_NVGPUCTRPERM' "$DIR/ncu_probe.txt" | cut -c1-200)" > "$DIR/ncu_usable.txt"
    else
      echo "ncu cannot read every metric here: $(grep -m2 -iE 'error|fail|unknown|not found' "$DIR/ncu_probe.txt" | tr '\n' ' ' | cut -c1-300)" > "$DIR/ncu_usable.txt"
    fi
  fi
  case "$(cat "$DIR/ncu_usable.txt")" in
    yes) return 0 ;;
    "ncu reads no hardware counter"*) return 125 ;;  # the H200 kind's gVisor: skipped, and said so
    *) return 1 ;;
  esac
}

stage_env() {
  note "stage env on $DEVICE $(date -u +%FT%TZ)"
  if gpu; then
    nvidia-smi --query-gpu=name,uuid,driver_version,memory.total,power.limit,clocks.max.sm,mig.mode.current --format=csv
    uname -r
  fi
  df -h /dev/shm "$DIR" | sed 1d  # the DataLoader baseline moves large batches through /dev/shm
  for tool in cc gcc ncu nsys git snakemake; do printf '  %-9s %s\n' "$tool" "$(command -v "$tool" || echo MISSING)"; done
  $PY -c 'import sysconfig, os; p = sysconfig.get_paths()["include"]; print("  Python.h", "present" if os.path.exists(p + "/Python.h") else "MISSING (torch.compile needs it)", p)'
  check "environment (peak table$(gpu && echo ', NVML energy counter, matmul rate, SDPA kernels, torch.compile'))" run 60 200 $PY $HERE/env_check.py
  # the prescreen's check of this node (issue 68): matmul, memory copy, clock and temperature at the
  # end, beside the kept records' figures; its record kept with the call's outputs
  mkdir -p "$DIR/prescreen"
  check "prescreen node check (bf16 matmul, memory copy, the device's state at the end)" \
    run 20 90 $PY -m scalerepro.training.node_check --out "$DIR/prescreen/node.json" --device "$DEVICE" --precision bf16 --seconds 4
  if [ -n "${OUT:-}" ] && [ -f "$DIR/prescreen/node.json" ]; then cp "$DIR/prescreen/node.json" "$OUT/prescreen-node.json"; fi
  if gpu; then check "device loader == CPU loader, bit for bit, and its cost per batch" run 30 150 $PY $HERE/loader_check.py "$DIR/fakecifar"
  else check "device loader == CPU loader (CPU rehearsal: CPU against CPU)" run 30 150 $PY $HERE/loader_check.py "$DIR/fakecifar" 2048; fi
  if command -v ncu > /dev/null; then
    ncu --version | tail -1
    ncu --query-metrics --chip gh100 > "$DIR/ncu_metrics_gh100.txt" 2>&1  # kept for reference
    # every metric scalerepro.launching.nsight asks for, read by the real tool: one it does not know loses a whole profile
    check "ncu reads every metric scalerepro.launching.nsight asks for on this GPU" ncu_usable
    note "INFO ncu: $(cat "$DIR/ncu_usable.txt")"
  else
    note "SKIP ncu checks: no ncu on PATH"
  fi
  if command -v nsys > /dev/null; then timeout 60 nsys status -e || note "INFO nsys status -e failed: nsys is not usable here"; fi
}

# model:steps:min_seconds. Steps give each measured window about 5 s on an H100 (NVML samples every
# 0.1 s); min_seconds is what a cold compile and the run need, under which the model is skipped.
FRONTIER=(resnet50:60:90 gpt2_small:60:70 resnet18_cifar:300:60 bert_base:80:60 vit_b_16:60:60 llama_1b:40:90)
bench() {  # bench LABEL MIN LIMIT MODEL STEPS [trainer_throughput flags...]: one process, one model
  local label=$1 min=$2 limit=$3 model=$4 steps=$5 json
  shift 5
  json="$DIR/bench/$model-$label.json"
  mkdir -p "$DIR/bench"
  rm -f "$json"
  run "$min" "$limit" $PY benchmarks/trainer_throughput.py --models "$model" --steps "$steps" --warmup-steps 15 \
      --records "$DIR/bench" --json "$json" "$@" 2>&1 | tee "$DIR/bench/$model-$label.log"
  local rc=${PIPESTATUS[0]}
  [ "$rc" -eq 125 ] && return 125
  if [ -f "$json" ]; then $PY $HERE/bench_report.py "$json" | tee -a "$SUMMARY"; else return 1; fi
}

stage_frontier() {
  note "stage frontier on $DEVICE $(date -u +%FT%TZ)"
  local entry model steps min
  for entry in "${FRONTIER[@]}"; do
    IFS=: read -r model steps min <<< "$entry"
    # SMOKE_MODELS="vit_b_16 llama_1b": only these (the frontier split over two calls)
    [[ " ${SMOKE_MODELS:-$model} " == *" $model "* ]] || continue
    if gpu; then
      mkdir -p "$COMPILE_CACHE"
      check "record $model, optimised preset" bench frontier "$min" 240 "$model" "$steps" --presets optimised --label frontier \
          --flags="--kernel-profile-steps 5 --compile-cache $COMPILE_CACHE/$model.bin"
    else  # CPU rehearsal: two models, small steps
      case "$model" in resnet18_cifar | gpt2_small) ;; *) continue ;; esac
      check "record $model, optimised preset (CPU rehearsal)" bench frontier 30 240 "$model" 4 --presets optimised --label frontier --warmup-steps 1 \
          --flags="--compile none --kernel-profile-steps 2"
    fi
    [ -f "$DIR/bench/$model-optimised-frontier.json" ] && check "record $model has every figure" record_check "$DIR/bench/$model-optimised-frontier.json"
  done
}

# Each lever of the optimised preset changed alone (one flag against the preset), and the fp32
# eager baseline; levers that keep the compiled graph (optimizer, loader) hit the compile cache.
# Entries are MODEL:LABEL:FLAGS, FLAGS split on spaces (a trainer flag's value joins it with "=").
# ResNet-18 first: it misses its goal, launch-bound (GPU utilisation ~50 % at 14 ms a step).
LEVERS=("resnet18_cifar:baseline:--presets baseline" "resnet18_cifar:eager:--flags=--compile=none"
        "resnet18_cifar:cudagraphs:--flags=--compile=reduce-overhead" "resnet18_cifar:batch1024:--per-gpu-batch 1024"
        "resnet18_cifar:dataloader:--flags=--loader=dataloader"
        "resnet50:baseline:--presets baseline" "resnet50:fp16:--flags=--precision=fp16" "resnet50:nchw:--flags=--no-channels-last"
        "resnet50:eager:--flags=--compile=none" "resnet50:foreach:--flags=--optimizer-impl=foreach" "resnet50:batch512:--per-gpu-batch 512"
        "gpt2_small:baseline:--presets baseline" "gpt2_small:foreach:--flags=--optimizer-impl=foreach" "gpt2_small:batch64:--per-gpu-batch 64"
        # issue 51's levers, each against the preset: the ResNets' stem padded (the stem ran on CUDA
        # cores), each transformer compiled a block at a time (cold compiles), GPT-2's attention kernel
        "resnet18_cifar:stem4:--flags=--stem-channels=4" "resnet18_cifar:stem8:--flags=--stem-channels=8"
        "resnet50:stem4:--flags=--stem-channels=4" "resnet50:stem8:--flags=--stem-channels=8"
        "gpt2_small:blocks:--flags=--compile-scope=blocks" "gpt2_small:cudnn-attention:--flags=--attention-backend=cudnn"
        "gpt2_small:flash-attention:--flags=--attention-backend=flash" "bert_base:blocks:--flags=--compile-scope=blocks"
        "vit_b_16:blocks:--flags=--compile-scope=blocks" "llama_1b:blocks:--flags=--compile-scope=blocks")
stage_levers() {
  note "stage levers on $DEVICE $(date -u +%FT%TZ)"
  local lever model label flags steps
  for lever in "${LEVERS[@]}"; do
    IFS=: read -r model label flags <<< "$lever"
    [[ " ${SMOKE_MODELS:-$model} " == *" $model "* ]] || continue
    [[ " ${SMOKE_LABELS:-$label} " == *" $label "* ]] || continue  # SMOKE_LABELS="stem4 blocks": only those levers
    steps=60
    [ "$model" = resnet18_cifar ] && steps=300
    if ! gpu; then  # CPU rehearsal: the small CNN for the image models (ResNet-18 where the stem is the lever), GPT-2 for the transformers, four steps
      case "$model:$label" in
        resnet*:stem*) model=resnet18_cifar ;;
        gpt2_small:* | bert_base:* | vit_b_16:* | llama_1b:*) model=gpt2_small ;;
        *) model=cnn ;;
      esac
      flags=${flags//--attention-backend=cudnn/--attention-backend=math}  # the CPU has no cuDNN attention
      steps=4 flags="$flags --warmup-steps 1"
    fi
    # shellcheck disable=SC2086  # flags is a list of trainer_throughput flags
    check "lever $model $label" bench "$label" 40 200 "$model" "$steps" --label "$label" $([[ $flags == --presets* ]] || echo --presets optimised) $flags
  done
}

stage_record() {
  note "stage record on $DEVICE $(date -u +%FT%TZ)"
  [ -f "$DIR/fakecifar/manifest.json" ] || $PY $HERE/loader_check.py "$DIR/fakecifar" 2048 > /dev/null
  local model=resnet50 batch=256 steps=60 cifar_batch=512 compile=(--compile) profile=(--profile-mode cuda_api --profile-window-start 30 --profile-window-steps 2)
  gpu || { model=cnn; batch=64; steps=12; cifar_batch=32; compile=(); profile=(); }  # CPU rehearsal: small, eager, no CUDA profiler API
  # 1. a 1-GPU cell as the workflow runs it: scalerepro.launching.launch -> torchrun, one rank, no process group
  rm -f "$DIR/record_g1.json"
  run 60 200 $PY -m scalerepro.launching.launch --ranks-per-node 1 --name smoke -- -m scalerepro.training.train --model $model --per-gpu-batch $batch \
      --preset optimised --device "$DEVICE" --steps $steps --warmup-steps $((steps / 4)) --log-interval 10 --no-eval \
      --synthetic-samples $((batch * 8)) --comm-probe-steps 4 --bucket-probe-steps 3 --purpose smoke --record "$DIR/record_g1.json" --progress off 2>&1 | tail -4
  local figures="NVML energy, power, utilisation, SM clock, MFU, CUDA-event steps, peak memory"
  gpu || figures="CPU rehearsal: status, throughput, step times"
  check "1-GPU record via scalerepro.launching.launch ($figures)" record_check "$DIR/record_g1.json"
  # 2. a real communicator of one (NCCL on the GPU): DDP's reducer, compile with DDPOptimizer, the NVTX
  #    all-reduce hook, the device loader with CIFAR augmentation, evaluation, both probes
  rm -f "$DIR/record_ddp_w1.json"
  run 60 200 $PY -m scalerepro.training.train --process-group-at-one-rank --model resnet18_cifar --data "$DIR/fakecifar" \
      --per-gpu-batch $cifar_batch --precision bf16 --channels-last "${compile[@]}" --loader device \
      --optimizer-impl fused --device "$DEVICE" --steps 60 --warmup-steps 20 --log-interval 10 --eval-samples 1024 \
      --comm-probe-steps 4 --bucket-probe-steps 3 "${profile[@]}" --purpose smoke --record "$DIR/record_ddp_w1.json" --progress off 2>&1 | tail -4
  check "one rank with a process group: DDP, both probes" record_check "$DIR/record_ddp_w1.json"
  # 3. the all-reduce benchmark's timing path (CUDA events on the GPU) on a communicator of one
  rm -f "$DIR/comm_w1.json"
  run 20 90 $PY -m scalerepro.training.commbench --process-group-at-one-rank --device "$DEVICE" --iterations 20 --warmup 5 \
      --sizes 1024 65536 4194304 268435456 --out "$DIR/comm_w1.json" 2>&1 | tail -4
  check "commbench at one rank wrote its table" test -s "$DIR/comm_w1.json"
}

# Two ranks on the one card, over gloo: NCCL refuses two ranks on one device, gloo lets them share
# it (scalerepro.training.distributed.card_of_rank). What no one-card session ran before: DDP at
# world size 2 on CUDA with the all-reduce timing hook's CUDA events and the window split over both
# ranks, FSDP2's collectives on CUDA tensors, a two-rank record and its analysis. Not NCCL, NVLink
# or any scaling figure: gloo copies through the host and both ranks share one card's SMs (the
# record counts the card once: its gpus, NVML energy and power, and MFU's peak).
stage_onecard() {
  note "stage onecard on $DEVICE $(date -u +%FT%TZ)"
  local out="$DIR/onecard" cnn_batch=256 gpt_batch=8 steps=60 warmup=20 shape=(--num-layers 2 --seq-len 256)
  # --compile default on the GPU: the preset would give the DDP CNN CUDA graphs, under which the timing hook is not installed
  local compile=(--compile default)
  gpu || { cnn_batch=8; gpt_batch=4; steps=12; warmup=3; compile=(--compile none); shape=(--num-layers 2 --seq-len 64 --hidden-size 64 --num-heads 4 --vocab-size 512); }
  rm -rf "$out" "$DIR/onecard-analysis"
  mkdir -p "$out"
  local common=(--dist-backend gloo --preset optimised "${compile[@]}" --device "$DEVICE" --steps $steps --warmup-steps $warmup --log-interval 10
                --no-eval --comm-probe-steps 4 --bucket-probe-steps 3 --purpose smoke --progress off)
  run 60 240 $PY -m scalerepro.launching.launch --ranks-per-node 2 --name onecard -- -m scalerepro.training.train --model resnet18_cifar --parallel ddp \
      --per-gpu-batch $cnn_batch --synthetic-samples $((cnn_batch * 16)) "${common[@]}" --record "$out/ddp.json" 2>&1 | tail -4
  check "two ranks on one card over gloo: resnet18_cifar DDP, both probes, the window split over both ranks" record_check "$out/ddp.json" --world-size 2
  run 60 240 $PY -m scalerepro.launching.launch --ranks-per-node 2 --name onecard -- -m scalerepro.training.train --model gpt2_small "${shape[@]}" \
      --parallel fsdp --per-gpu-batch $gpt_batch --synthetic-samples $((gpt_batch * 16)) "${common[@]}" --record "$out/fsdp.json" 2>&1 | tail -4
  check "two ranks on one card over gloo: gpt2_small FSDP, the sharded record" record_check "$out/fsdp.json" --world-size 2
  check "the analysis reads both two-rank runs: ok, world size 2" onecard_analysis "$out" "$DIR/onecard-analysis"
}
# onecard_analysis RECORDS OUT: the tables of the records in RECORDS as the workflow's aggregation
# builds them (rebuild --records: a matrix made from the records, then aggregate, plots, report);
# both runs must read as ok at world size 2, each under its own strategy
onecard_analysis() {
  $PY -c 'import jsonschema' 2> /dev/null || { echo "no jsonschema: carry the wheels of benchmarks/gpu/wheels.py (benchmarks/README.md)"; return 1; }
  run 20 120 $PY -m scalerepro.analysis.rebuild --records "$1" --out "$2" 2>&1 | tail -3
  local rc=${PIPESTATUS[0]}
  [ "$rc" -eq 0 ] || return "$rc"
  $PY - "$2/tables/runs.csv" << 'PYEOF'
import sys

import pandas as pd

runs = pd.read_csv(sys.argv[1]).set_index("run_id")
print(runs[["status", "world_size_recorded", "parallel_recorded", "consistent", "samples_per_s", "device_type"]].to_string())
wrong = [
    f"{run}: {what}"
    for run, strategy in (("ddp", "ddp"), ("fsdp", "fsdp"))
    for what, ok in (
        ("no row", run in runs.index),
        ("status not ok", run in runs.index and runs.at[run, "status"] == "ok"),
        ("world size not 2", run in runs.index and runs.at[run, "world_size_recorded"] == 2),
        (f"strategy not {strategy}", run in runs.index and runs.at[run, "parallel_recorded"] == strategy),
        ("not consistent with its matrix row", run in runs.index and bool(runs.at[run, "consistent"])),
    )
    if not ok
]
print("  CHECK " + ("OK" if not wrong and len(runs) == 2 else "FAILED: " + "; ".join(wrong or [f"{len(runs)} runs, not 2"])))
sys.exit(1 if wrong or len(runs) != 2 else 0)
PYEOF
}

stage_profile() {
  note "stage profile on $DEVICE $(date -u +%FT%TZ)"
  # resnet50 at the frontier's batch: a compile cache from the frontier stage is hit
  local prof="$DIR/profiles/smoke" model=resnet50 batch=256
  gpu || { model=cnn; batch=32; }
  local trainer=(--model $model --per-gpu-batch $batch --preset optimised --steps 12 --warmup-steps 10 --seed 1 --device "$DEVICE"
                 --synthetic-samples $((batch * 16)) --run-id smoke --purpose smoke --no-eval --comm-probe-steps 0 --bucket-probe-steps 0 --no-resume --progress off)
  rm -rf "$prof"
  # the torch.profiler fallback (what the rule runs where Nsight is missing)
  run 40 150 $PY -m scalerepro.launching.profile_job --tool torch --capture "$prof/torch/capture.json" --log "$prof/torch/profile.log" \
    --window-start 10 --window-steps 2 --launch --nodes=1 --ranks-per-node=1 --cpus-per-node=8 --port=29400 --name=profile_smoke -- "${trainer[@]}" --record "$prof/torch/record.json"
  check "torch.profiler fallback wrote trace.json and operators.csv" test -s "$prof/torch/trace.json" -a -s "$prof/torch/operators.csv"
  if gpu && ncu_usable; then
    # ncu on the window's first 40 non-NCCL kernels (no nsys here to pick the top ones): the loader's,
    # then the forward's convolutions and GEMMs
    run 90 300 $PY -m scalerepro.launching.profile_job --tool ncu --capture "$prof/ncu/capture.json" --log "$prof/ncu/profile.log" \
      --window-start 10 --window-steps 2 --ncu-kernels 40 --launch --nodes=1 --ranks-per-node=1 --cpus-per-node=8 --port=29400 --name=profile_smoke -- "${trainer[@]}" --record "$prof/ncu/record.json"
    note "INFO profile_job ncu exit $?; capture: $(tr -d '\n ' < "$prof/ncu/capture.json" 2> /dev/null | cut -c1-200)"
    tail -n 5 "$prof/ncu/profile.log" 2> /dev/null
    check "ncu CSV read by the project's reader, tensor-core kernels among the profiled" $PY $HERE/ncu_report.py "$prof/ncu/kernels.csv" bf16
  else
    note "SKIP ncu profile: $(cat "$DIR/ncu_usable.txt" 2> /dev/null || echo 'CPU rehearsal'); the ncu reader rehearsed on the committed fixture"
    check "ncu reader and roofline on tests/fixtures/ncu/kernels.csv" $PY $HERE/ncu_report.py tests/fixtures/ncu/kernels.csv bf16
  fi
  check "analysis summary of the profiles" $PY -m scalerepro.analysis.profiles.captures summarize --run-dir "$prof" --run-id smoke \
      --references config/references.yaml --gpu-peaks h100_sxm --precision bf16 --thresholds '{}' --out "$prof/summary.json"
}

stage_ce() {
  if gpu; then
    check "GPT-2 loss, eager vs compiled" run 30 150 $PY $HERE/ce_bench.py > "$DIR/ce.log" 2>&1
    grep "GPT-2 loss" "$DIR/ce.log" | tee -a "$SUMMARY"
  else note "SKIP ce: needs CUDA"; fi
}

# snakemake_study WHAT TARGET...: Snakemake on the study config, towards TARGET... (none: the
# whole study), with results/ packed into $OUT every 20 s; the record check of each scaling cell
study_snakemake() {
  local what=$1
  shift
  note "stage $what on $DEVICE $(date -u +%FT%TZ)"
  command -v snakemake > /dev/null || { note "FAIL no snakemake: carry the wheels of benchmarks/gpu/wheels.py"; FAILS=$((FAILS + 1)); return 1; }
  # SMOKE_STUDY_CONFIG: benchmarks/gpu/h100-study.yaml, the one-H100 study (default: the small smoke study)
  local config=${SMOKE_STUDY_CONFIG:-$HERE/study.yaml} record
  gpu || config=${SMOKE_STUDY_CONFIG_CPU:-config/config.yaml}  # the README's study: synthetic, no download
  # --keep-going: one failed cell must not stop the others; the report says which failed.
  # Under the call's budget Snakemake is stopped by SIGINT (it stops its jobs and marks their
  # outputs incomplete); a second call continues with --rerun-incomplete.
  # Each record comes back as soon as it is written: the results are packed into $OUT every 20 s
  # while Snakemake runs. A call the device tool stops at its limit (which it cuts to the device
  # time left, whatever SMOKE_BUDGET_S says) runs no exit trap, and on 2026-11-26 a call stopped
  # so lost the eight ablation and reproduce records it had measured.
  local packer=
  if [ -n "${OUT:-}" ]; then
    (while sleep 20; do pack_study; cp "$SUMMARY" "$DIR/study.log" "$OUT/" 2> /dev/null; done) &
    packer=$!
  fi
  # shellcheck disable=SC2086  # SMOKE_STUDY_ARGS is a list of flags
  # 45 s: one ablation cell with a warm start; Snakemake stopped by SIGINT keeps every finished record
  # the targets first: --configfile takes every word after it
  RUN_SIGNAL=INT run 45 600 snakemake "$@" --cores all --keep-going --rerun-incomplete --configfile "$config" ${SMOKE_STUDY_ARGS:-} >> "$DIR/study.log" 2>&1
  local rc=$?
  [ -n "$packer" ] && kill "$packer" 2> /dev/null
  case $rc in
    0) note "PASS snakemake $what" ;;
    124) note "INFO snakemake $what stopped by the call's budget (a later call continues it)" ;;
    125) ;;  # skipped, said so by run
    *) note "FAIL snakemake $what (rc=$rc; $DIR/study.log)"; FAILS=$((FAILS + 1)) ;;
  esac
  grep -E "^(Error|Finished|Complete log|[0-9]+ of [0-9]+ steps)|Exiting because" "$DIR/study.log" | tail -15
  for record in results/runs/strong_*/record.json; do  # the scaling cells: DDP's figures (the FSDP/TP cells have no DDP probes)
    # each record once a call: `cells study` checks in the study stage only what it added
    [ -f "$record" ] && [ -z "${CHECKED[$record]:-}" ] || continue
    CHECKED[$record]=1
    check "$what: record $(basename "$(dirname "$record")") has every figure" record_check "$record"
  done
}

# The study's one-GPU scaling cells alone (the one-H100 study's six optimised cells are the
# frontier): what a call must bring back before anything else, so that `cells curve study` puts
# the frontier, then the batch curve, then the rest of the study.
stage_cells() {
  local cells=() model
  if gpu; then
    for model in ${SMOKE_MODELS:-resnet50 gpt2_small resnet18_cifar bert_base vit_b_16 llama_1b}; do cells+=("results/runs/strong_${model}_g1_r1/record.json"); done
  else
    cells=(results/runs/strong_resnet18_cifar_g1_r1/record.json)  # CPU rehearsal: the README study's one-rank cell
  fi
  study_snakemake cells "${cells[@]}"
}

stage_study() {
  study_snakemake study
  check "the study's report" test -s results/report/index.html
  pack_study
}

# ResNet-50's step time at several per-GPU batches (benchmarks/gpu/batch_curve.py: a static compile
# a batch, as the trainer compiles; batch 256 again as the calibration against the frontier's
# record). On 2026-11-27 one dynamic-batch compile took over 93 s cold and ran 24.5 % slower than
# the trainer; five static compiles need about 50 s each cold.
stage_curve() {
  note "stage curve on $DEVICE $(date -u +%FT%TZ)"
  [ -s "$DIR/batch_curve.json" ] && { note "SKIP curve: $DIR/batch_curve.json is there from an earlier call"; return; }
  local model=resnet50 batches=(400 200 100 50 256) extra=()
  gpu || { model=cnn; batches=(64 32 16); extra=(--device cpu --warmup 2 --window-s 0.5); }
  curve() {
    run 150 420 $PY $HERE/batch_curve.py --model $model --batches "${batches[@]}" "${extra[@]}" --json "$DIR/batch_curve.json" 2>&1 | tee "$DIR/batch_curve.log"
    return "${PIPESTATUS[0]}"
  }
  check "batch curve $model ${batches[*]}" curve
  grep -h "^CURVE" "$DIR/batch_curve.log" 2> /dev/null >> "$SUMMARY"
}

# The probe alone: whether the real ncu reads every metric the project asks for (the first thing
# a session with a GPU runs, before any stage that profiles)
stage_ncu() {
  note "stage ncu on $DEVICE $(date -u +%FT%TZ)"
  if command -v ncu > /dev/null; then
    ncu --version | tail -1 | tee -a "$SUMMARY"
    check "ncu reads every metric scalerepro.launching.nsight asks for on this GPU" ncu_usable
    note "INFO ncu: $(cat "$DIR/ncu_usable.txt")"
  else
    note "SKIP ncu: no ncu on PATH"
  fi
}

for stage in "$@"; do
  case "$stage" in
    env | ncu | frontier | levers | record | onecard | profile | ce | cells | study | curve) "stage_$stage" ;;
    *) echo "usage: bash benchmarks/gpu/smoke.sh STAGE... (env ncu frontier levers record onecard profile ce cells study curve)"; exit 2 ;;
  esac
done
note "done in ${SECONDS}s of a ${BUDGET}s budget; $FAILS FAIL"
echo "---- $SUMMARY"
cat "$SUMMARY"
exit "$FAILS"
