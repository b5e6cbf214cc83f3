#!/usr/bin/env bash
# Runs every libFuzzer target (tests/fuzz/*_fuzz.cc) for a fixed time.
#   scripts/fuzz.sh [seconds_per_target] [target...]
# Builds them with clang (-fsanitize=fuzzer,address,undefined) in
# build-fuzz-clang (only the targets and the libraries they link), starts
# each from tests/fuzz/corpus/<name>/ and its regressions, and copies every
# crash, leak or timeout input into tests/fuzz/regressions/<name>/, where
# the default build's ctest (fuzz_<name>) replays it from then on.
# Installs clang and libclang-rt-14-dev (libFuzzer) with apt-get when they
# are missing; scripts/setup.sh does not need them. Exit 1 when any target
# found something.
set -euo pipefail

seconds="${1:-30}"
shift || true
root="$(cd "$(dirname "$0")/.." && pwd)"
build="$root/build-fuzz-clang"
all=(message ps_request ps_checkpoint trainer_checkpoint kv_http ctr_reader idx_reader job_config gpt_config
  openai_request)
targets=("$@")
[ $# -eq 0 ] && targets=("${all[@]}")

need=()
command -v clang++ >/dev/null || need+=(clang)
ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1 || need+=(libclang-rt-14-dev)
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "fuzz: installing ${need[*]}"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
CC=clang CXX=clang++ cmake -S "$root" -B "$build" -DFLEET_FUZZ=ON -DFLEET_WITH_CUDA=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo "${launcher[@]}" >/dev/null
cmake --build "$build" -j"${FLEET_FUZZ_JOBS:-2}" --target "${targets[@]/%/_fuzzer}"

found=0
for t in "${targets[@]}"; do
  corpus="$root/tests/fuzz/corpus/$t"
  regress="$root/tests/fuzz/regressions/$t"
  work="$build/work/$t"
  mkdir -p "$regress" "$work/corpus" "$work/artifacts"
  echo "fuzz: $t for ${seconds} s"
  # The working corpus grows in the build dir; the committed one stays small.
  set +e
  GLOG_minloglevel=2 ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$build/fuzz/${t}_fuzzer" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=3072 \
      -max_len=65536 -print_final_stats=1 -artifact_prefix="$work/artifacts/" \
      "$work/corpus" "$corpus" "$regress" >"$work/log" 2>&1
  rc=$?
  set -e
  grep -E "^stat::number_of_executed_units|^Done|SUMMARY" "$work/log" || true
  shopt -s nullglob
  for a in "$work"/artifacts/*; do
    cp "$a" "$regress/"
    echo "fuzz: $t: $(basename "$a") -> tests/fuzz/regressions/$t/ (log: $work/log)"
    rm "$a"
    found=1
  done
  shopt -u nullglob
  if [ $rc -ne 0 ] && [ $found -eq 0 ]; then
    echo "fuzz: $t exited $rc without an artifact; see $work/log"
    found=1
  fi
done
exit $found
