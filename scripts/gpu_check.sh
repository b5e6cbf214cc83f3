#!/usr/bin/env bash
# The one GPU check: the CUDA tests and GPT-2 training throughput, run on the
# GPU machine from a bundle made by ../shared/gpu/pack.sh (see its header).
#
#   here:  cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="80;90"
#          cmake --build build-gpu -j2 &&
#          bash ../shared/gpu/pack.sh build-gpu 'cuda|nccl|gpu|heter_dense|mnist_mlp_test|gpt_generate_test|gpt_serve_test'
#          (pack.sh's default leaves gpt_serve_test out)
#   there: tar -xJf .gpu/bundle.tar.xz -C .gpu && . .gpu/fleetgpu/env.sh &&
#          cd .gpu/fleetgpu/src && bash scripts/gpu_check.sh
#
# Writes under $OUT (default ./gpu_check_out): the card (nvidia-smi), one log
# per test, benchmark and training run, and summary.txt (each step's exit status,
# the tests' verdict lines and the runs' last throughput lines). Steps go on
# after a failure so one run reports everything; the exit status is that of
# the first failing step. A tool that brings back only a few files (the
# device tool: 8) gets them as one archive: OUT=/tmp/gc bash
# scripts/gpu_check.sh; tar -czf "$TOOL_OUT/gc.tar.gz" -C /tmp gc.
# GPU_CHECK_STEPS (default 30) sets the steps per
# training run, GPU_CHECK_SECONDS (default 10) the timed seconds per benchmark
# case; GPU_CHECK_SKIP_TRAIN=1 runs the tests only; GPU_CHECK_QUICK=1 the
# tests and the main figures only (124M with its PyTorch reference, 345M,
# 1.3B: no variants, no gpt_pretrain runs); GPU_CHECK_NCU=1 adds Nsight
# Compute's view of one 124M step (below).
set -uo pipefail
OUT=${OUT:-./gpu_check_out}
mkdir -p "$OUT"
: "${BIN:?source env.sh of the bundle first}"
TESTS=$(dirname "$BIN")/tests
summary=$OUT/summary.txt
: > "$summary"
status=0

step() {  # step NAME TIMEOUT_S COMMAND...: runs it, logs to $OUT/NAME.log
  local name=$1 limit=$2; shift 2
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name: exit $rc" >> "$summary"
  [ "$rc" -eq 0 ] || { [ "$status" -ne 0 ] || status=$rc; }
}

nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
for t in trainer_gpt_cuda_kernels_test trainer_cuda_backend_test heter_dense_section_test \
    gpt_generate_test gpt_serve_test; do
  if [ -x "$TESTS/$t" ]; then
    step "$t" 300 "$TESTS/$t"
    grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/$t.log" | sed "s|^|  |" >> "$summary"
  else
    echo "$t: not in the bundle" >> "$summary"
  fi
done

# gpt_bench on the GPU: tokens/s, MFU against the same run's cuBLAS bf16
# GEMM rate, GPU time by kernel kind, device memory (bench/README.md). 124M
# and its PyTorch reference first, so that a short lease gets the main figure.
secs=${GPU_CHECK_SECONDS:-10}
bench() {  # bench NAME PRESET RECOMPUTE [GPT_BENCH FLAGS...]
  local name=$1 preset=$2 recompute=$3; shift 3
  step "$name" 300 "$BIN/gpt_bench" --device=cuda:0 --preset="$preset" --seconds="$secs" \
    --recompute="$recompute" "$@"
  grep -E 'tokens/s at p50|MFU|VERIFY|^    [a-z]+ +[0-9.]+%|device memory in use' "$OUT/$name.log" |
    sed "s|^|  |" >> "$summary"
}
quick=${GPU_CHECK_QUICK:-0}
if [ "${GPU_CHECK_SKIP_TRAIN:-0}" != 1 ]; then
  bench gpt_bench_124m 124m off
  # The same with the earlier wmma attention (gpt_cuda_flash_tc.h; the
  # default until an H200 run showed the mma kernels faster).
  [ "$quick" = 1 ] || bench gpt_bench_124m_wmma 124m off --attention=wmma
  # The mma kernels with ldmatrix in place of transposed copies
  # (MmaTransposes::kLdMatrix): the default once a run shows it passes the
  # attention tests and is faster.
  bench gpt_bench_124m_ldmatrix 124m off --attention=mma_ldmatrix
  # The PyTorch eager reference of the same model and step, right after.
  if python3 -c 'import torch' 2> /dev/null; then
    step torch_124m 300 python3 bench/torch_gpt_reference.py --preset=124m --seconds="$secs"
    grep -h 'tokens/s\|device memory' "$OUT"/torch_124m.log | sed "s|^|  |" >> "$summary"
  else
    echo "torch reference: python3 cannot import torch here" >> "$summary"
  fi
  if [ "$quick" != 1 ]; then
    # The GEMMs fed float32 operands (cuBLAS rounds them inside its kernels).
    bench gpt_bench_124m_in_kernel 124m off --gemm_operands=in_kernel
    bench gpt_bench_124m_recompute 124m on
  fi
  bench gpt_bench_345m 345m off
  bench gpt_bench_1.3b 1.3b on
fi

# GPU_CHECK_NCU=1: Nsight Compute on gpt_bench 124m's profiled step (the one
# between cudaProfilerStart / Stop): every kernel's duration as CSV
# (ncu_step.csv; bench/ncu_step_summary.py groups it), then the attention
# kernels' occupancy, stall reasons and throughput (ncu_attention.log).
# Clocks as the card has them (--clock-control none).
if [ "${GPU_CHECK_NCU:-0}" = 1 ]; then
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2> /dev/null | head -1)
  if [ -n "$NCU" ]; then
    ncu_run() {  # ncu_run NAME NCU_FLAGS...
      local name=$1; shift
      step "$name" 300 "$NCU" --clock-control none --profile-from-start off "$@" \
        "$BIN/gpt_bench" --device=cuda:0 --preset=124m --seconds=0.5 --recompute=off
    }
    ncu_run ncu_step --csv --metrics gpu__time_duration.sum
    grep -E '^"' "$OUT/ncu_step.log" > "$OUT/ncu_step.csv"
    python3 bench/ncu_step_summary.py "$OUT/ncu_step.csv" >> "$summary" 2>&1
    # The first launch of each attention kernel (forward, dK/dV, dQ).
    ncu_run ncu_attention --kernel-id ::regex:Flash:1 --section SpeedOfLight \
      --section Occupancy --section LaunchStats --section WarpStateStats \
      --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis
  else
    echo "ncu: not found" >> "$summary"
  fi
fi

# GPT-2 124M (bf16, micro batch 16 x 1024 tokens, one micro-batch per step),
# with and without recompute, and the 345M single-card config as written
# started by hand (no FLEET_DEVICE: a single process takes cuda:0), on the
# fortunes tokens pack.sh made (llm.c .bin shards: TokenBinDataset).
# gpt_pretrain logs tokens/s per step.
if [ "${GPU_CHECK_SKIP_TRAIN:-0}" != 1 ] && [ "$quick" != 1 ]; then
  steps=${GPU_CHECK_STEPS:-30}
  common=(-o "Engine.max_steps=$steps" -o "Optimizer.lr.decay_steps=$steps"
          -o Engine.eval_freq=1000000 -o Engine.save_load.save_steps=1000000
          -o Data.Train.dataset.name=TokenBinDataset -o Data.Eval.dataset.name=TokenBinDataset
          -o "Data.Train.dataset.input_dir=$GPU_DATA/gptbin"
          -o "Data.Eval.dataset.input_dir=$GPU_DATA/gptbin")
  run() {  # run NAME CONFIG OVERRIDES...
    local name=$1 config=$2; shift 2
    step "$name" 600 env ${UNSET_DEVICE:+-u FLEET_DEVICE} "$BIN/gpt_pretrain" -c "$config" \
      "${common[@]}" \
      -o "Engine.save_load.output_dir=$OUT/$name.ckpt" "$@"
    grep -E 'tokens/s' "$OUT/$name.log" | tail -1 | sed "s|^|  |" >> "$summary"
    rm -rf "$OUT/$name.ckpt"
  }
  run gpt2_124m_bf16 configs/gpt/pretrain_gpt2_124M.yaml -o Global.global_batch_size=16
  run gpt2_124m_bf16_recompute configs/gpt/pretrain_gpt2_124M.yaml \
    -o Global.global_batch_size=16 -o Model.use_recompute=True
  UNSET_DEVICE=1 run gpt_345m_single_card configs/gpt/pretrain_gpt_345M_single_card.yaml
fi
cat "$summary"
exit "$status"
