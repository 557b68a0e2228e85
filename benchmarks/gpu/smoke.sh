#!/usr/bin/env bash
# Every GPU path of scalerepro once, on ONE GPU, with PASS/FAIL lines and figures (issue 11).
# Adapted from ../shared/gpu/gpu_smoke.sh (written against fd2c579) to the code as it is; each
# stage ends inside the device tool's 10-minute limit. Run from the repository root:
#
#   bash benchmarks/gpu/smoke.sh env      versions, peak table, NVML energy counter, matmul rate, SDPA kernels,
#                                          torch.compile, device loader == CPU loader, ncu metrics (~2 min)
#   bash benchmarks/gpu/smoke.sh bench1   benchmarks/trainer_throughput.py: resnet18_cifar, resnet50 (~6 min)
#   bash benchmarks/gpu/smoke.sh bench2   the same: vit_b_16, bert_base (~6 min)
#   bash benchmarks/gpu/smoke.sh bench3   GPT-2's loss eager vs compiled, then gpt2_small (~6 min)
#   bash benchmarks/gpu/smoke.sh record   1-GPU record via scalerepro.launch; NCCL + DDP at one rank
#                                          (--process-group-at-one-rank) with both probes; commbench's CUDA path (~5 min)
#   bash benchmarks/gpu/smoke.sh profile  the profile rule's script with ncu (and the torch.profiler fallback),
#                                          the project's ncu reader and roofline, the analysis summary (~6 min)
#   bash benchmarks/gpu/smoke.sh study    snakemake --cores all on the default config (needs snakemake:
#                                          benchmarks/gpu/wheels.py; SMOKE_STUDY_ARGS, default --config repeats=1)
#
# SMOKE_DEVICE=cpu rehearses every stage on a machine without a GPU (small models, gloo, the
# torch profiler only), so that a stage broken by a change fails here and not in device time.
# Outputs under $SMOKE_OUT (default results/gpu_smoke, git-ignored); PASS/FAIL lines are
# appended to summary.txt there. The exit code is the number of FAIL lines this call added.
set -uo pipefail
STAGE=${1:-env}
[ -f workflow/scalerepro/trainer.py ] || { echo "run this from the repository root"; exit 2; }
HERE=benchmarks/gpu
PY=${PYTHON:-python3}
DEVICE=${SMOKE_DEVICE:-cuda}
DIR=${SMOKE_OUT:-$PWD/results/gpu_smoke}
mkdir -p "$DIR"
# No network on the GPU machine, so no pip install of the project: it imports from workflow/.
export PYTHONPATH="$PWD/workflow${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR="$DIR/inductor-cache" LC_NUMERIC=C NCCL_DEBUG=${NCCL_DEBUG:-WARN}
SUMMARY="$DIR/summary.txt"
FAILS=0
note() { echo "== $*" | tee -a "$SUMMARY"; }
run() { local limit=$1; shift; echo "+ $*" >&2; timeout -k 20 "$limit" "$@"; local rc=$?; [ "$rc" -eq 124 ] && echo "!! timed out after ${limit}s: $1" >&2; return "$rc"; }
check() { local what=$1; shift; if "$@"; then note "PASS $what"; else note "FAIL $what (rc=$?)"; FAILS=$((FAILS + 1)); fi; }
gpu() { [ "$DEVICE" = cuda ]; }
record_check() { if gpu; then $PY $HERE/check_record.py "$1"; else $PY $HERE/check_record.py "$1" --cpu; fi; }

stage_env() {
  note "stage env on $DEVICE $(date -u +%FT%TZ)"
  if gpu; then
    nvidia-smi --query-gpu=name,uuid,driver_version,memory.total,power.limit,clocks.max.sm,mig.mode.current --format=csv
  fi
  df -h /dev/shm "$DIR" | sed 1d  # the DataLoader baseline moves large batches through /dev/shm
  for tool in cc gcc ncu nsys git snakemake; do printf '  %-9s %s\n' "$tool" "$(command -v "$tool" || echo MISSING)"; done
  $PY -c 'import sysconfig, os; p = sysconfig.get_paths()["include"]; print("  Python.h", "present" if os.path.exists(p + "/Python.h") else "MISSING (torch.compile needs it)", p)'
  check "environment (peak table$(gpu && echo ', NVML energy counter, matmul rate, SDPA kernels, torch.compile'))" run 280 $PY $HERE/env_check.py
  if gpu; then check "device loader == CPU loader, bit for bit" run 200 $PY $HERE/loader_check.py "$DIR/fakecifar"
  else check "device loader == CPU loader (CPU rehearsal: CPU against CPU)" run 200 $PY $HERE/loader_check.py "$DIR/fakecifar" 2048; fi
  if command -v ncu > /dev/null; then
    ncu --version | tail -1
    ncu --query-metrics --chip gh100 > "$DIR/ncu_metrics_gh100.txt" 2>&1
    # the metrics scalerepro.profile_rank asks for on a Hopper GPU: one that ncu does not know loses the whole profile
    for metric in $($PY -c 'from scalerepro.profile_rank import NCU_METRICS, TENSOR_PIPE_METRICS; print(*{m.split(".")[0] for m in (*NCU_METRICS, *TENSOR_PIPE_METRICS[9])})'); do
      grep -q "^$metric\b" "$DIR/ncu_metrics_gh100.txt" || note "FAIL ncu has no gh100 metric $metric"
    done
  fi
  if command -v nsys > /dev/null; then timeout 120 nsys status -e || note "INFO nsys status -e failed: nsys is not usable here"; fi
}

stage_bench() {  # one trainer_throughput.py process per model, so one hang cannot eat the rest
  local limit=${BENCH_LIMIT:-$((560 / $#))} model extra=()
  gpu || extra=(--steps 4 --warmup-steps 1)
  note "stage bench ($*) on $DEVICE $(date -u +%FT%TZ)"
  for model in "$@"; do
    rm -f "$DIR/bench_$model.json"
    run "$limit" $PY benchmarks/trainer_throughput.py --models "$model" "${extra[@]}" --json "$DIR/bench_$model.json" 2>&1 | tee "$DIR/bench_$model.log"
    if [ -f "$DIR/bench_$model.json" ]; then $PY $HERE/bench_report.py "$DIR/bench_$model.json" | tee -a "$SUMMARY"
    else note "FAIL benchmark $model (see $DIR/bench_$model.log)"; FAILS=$((FAILS + 1)); fi
  done
}

stage_record() {
  note "stage record on $DEVICE $(date -u +%FT%TZ)"
  [ -f "$DIR/fakecifar/manifest.json" ] || $PY $HERE/loader_check.py "$DIR/fakecifar" 2048 > /dev/null
  local model=resnet50 batch=256 steps=80 cifar_batch=512 compile=(--compile) profile=(--profile-mode cuda_api --profile-window-start 30 --profile-window-steps 2)
  gpu || { model=cnn; batch=64; steps=12; cifar_batch=32; compile=(); profile=(); }  # CPU rehearsal: small, eager, no CUDA profiler API
  # 1. a 1-GPU cell as the workflow runs it: scalerepro.launch -> torchrun, one rank, no process group
  rm -f "$DIR/record_g1.json"
  run 240 $PY -m scalerepro.launch --ranks-per-node 1 --name smoke -- -m scalerepro.train --model $model --batch-size $batch \
      --preset optimised --device "$DEVICE" --steps $steps --warmup-steps $((steps / 4)) --log-interval 10 --no-eval \
      --synthetic-samples $((batch * 8)) --comm-probe-steps 4 --bucket-probe-steps 3 --record "$DIR/record_g1.json" --progress off 2>&1 | tail -4
  local figures="NVML energy, power, utilisation, SM clock, MFU, CUDA-event steps, peak memory"
  gpu || figures="CPU rehearsal: status, throughput, step times"
  check "1-GPU record via scalerepro.launch ($figures)" record_check "$DIR/record_g1.json"
  # 2. a real communicator of one (NCCL on the GPU): DDP's reducer, compile with DDPOptimizer, the NVTX
  #    all-reduce hook, the device loader with CIFAR augmentation, evaluation, both probes
  rm -f "$DIR/record_ddp_w1.json"
  run 300 $PY -m scalerepro.train --process-group-at-one-rank --model resnet18_cifar --data "$DIR/fakecifar" \
      --batch-size $cifar_batch --precision bf16 --channels-last "${compile[@]}" --loader device \
      --optimizer-impl fused --device "$DEVICE" --steps 60 --warmup-steps 20 --log-interval 10 --eval-samples 1024 \
      --comm-probe-steps 4 --bucket-probe-steps 3 "${profile[@]}" --record "$DIR/record_ddp_w1.json" --progress off 2>&1 | tail -4
  check "one rank with a process group: DDP, both probes" record_check "$DIR/record_ddp_w1.json"
  # 3. the all-reduce benchmark's timing path (CUDA events on the GPU) on a communicator of one
  run 120 $PY -m scalerepro.commbench --process-group-at-one-rank --device "$DEVICE" --iterations 20 --warmup 5 \
      --sizes 1024 65536 4194304 268435456 --out "$DIR/comm_w1.json" 2>&1 | tail -4
  check "commbench at one rank wrote its table" test -s "$DIR/comm_w1.json"
}

stage_profile() {
  note "stage profile on $DEVICE $(date -u +%FT%TZ)"
  local prof="$DIR/profiles/smoke" model=resnet50 batch=128
  gpu || { model=cnn; batch=32; }
  local trainer=(--model $model --batch-size $batch --preset optimised --steps 12 --warmup-steps 10 --seed 1 --device "$DEVICE"
                 --synthetic-samples $((batch * 16)) --run-id smoke --no-eval --comm-probe-steps 0 --bucket-probe-steps 0 --no-resume --progress off)
  rm -rf "$prof"
  # the torch.profiler fallback (what the rule runs where Nsight is missing)
  run 200 $PY $HERE/run_profile_shim.py "$prof" torch 0 -- "${trainer[@]}" --record "$prof/torch/record.json"
  check "torch.profiler fallback wrote trace.json and operators.csv" test -s "$prof/torch/trace.json" -a -s "$prof/torch/operators.csv"
  if command -v ncu > /dev/null; then
    # ncu on the window's first 40 non-NCCL kernels (no nsys here to pick the top ones): the loader's,
    # then the forward's convolutions and GEMMs
    run 300 $PY $HERE/run_profile_shim.py "$prof" ncu 40 -- "${trainer[@]}" --record "$prof/ncu/record.json"
    note "INFO run_profile.py ncu exit $?; capture: $(tr -d '\n ' < "$prof/ncu/capture.json" 2> /dev/null | cut -c1-200)"
    tail -n 5 "$prof/ncu/profile.log" 2> /dev/null
    check "ncu CSV read by the project's reader, tensor-core kernels among the profiled" $PY $HERE/ncu_report.py "$prof/ncu/kernels.csv" bf16
  else
    note "INFO no ncu on PATH: the ncu reader rehearsed on the committed fixture"
    check "ncu reader and roofline on tests/fixtures/ncu/kernels.csv" $PY $HERE/ncu_report.py tests/fixtures/ncu/kernels.csv bf16
  fi
  check "analysis summary of the profiles" $PY -m scalerepro.analysis.profile summarize --run-dir "$prof" --run-id smoke \
      --references config/references.yaml --gpu-peaks h100_sxm --precision bf16 --thresholds '{}' --out "$prof/summary.json"
}

stage_study() {
  note "stage study on $DEVICE $(date -u +%FT%TZ)"
  command -v snakemake > /dev/null || { note "FAIL no snakemake: carry the wheels of benchmarks/gpu/wheels.py"; FAILS=$((FAILS + 1)); return; }
  # shellcheck disable=SC2086  # SMOKE_STUDY_ARGS is a list of flags
  run 560 snakemake --cores all --rerun-incomplete ${SMOKE_STUDY_ARGS:---config repeats=1} 2>&1 | tail -25
  check "the default study's report" test -s results/report/index.html
}

case "$STAGE" in
  env) stage_env ;;
  bench1) if gpu; then stage_bench resnet18_cifar resnet50; else stage_bench cnn; fi ;;
  bench2) if gpu; then stage_bench vit_b_16 bert_base; else stage_bench cnn; fi ;;
  bench3) run 150 $PY $HERE/ce_bench.py | tee -a "$SUMMARY"; if gpu; then BENCH_LIMIT=400 stage_bench gpt2_small; else stage_bench cnn; fi ;;
  record) stage_record ;;
  profile) stage_profile ;;
  study) stage_study ;;
  *) echo "usage: bash benchmarks/gpu/smoke.sh env|bench1|bench2|bench3|record|profile|study"; exit 2 ;;
esac
echo "---- $SUMMARY"
cat "$SUMMARY"
exit "$FAILS"
