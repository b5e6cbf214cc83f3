#!/usr/bin/env bash
# Runs the main job (the README's first command: the 2-server, 4-worker CTR
# simulation) RUNS times on a machine kept loaded with BUSY busy processes
# (default: twice the cores), and says how many runs ended with exit 0 and
# the summary line. A run that fails keeps its fleetrun output in
# build/stress/run.<n>.out; the job's logs are in build/stress/log.<n>.
# Exit status: 0 when every run passed.
#
#   bash scripts/stress_demo.sh            # 50 runs, 2 x nproc busy loops
#   RUNS=5 BUSY=0 bash scripts/stress_demo.sh
# Extra arguments go to fleetrun (e.g. -o train.epochs=1 to shorten each run).
set -euo pipefail
cd "$(dirname "$0")/.."
runs="${RUNS:-50}"
busy="${BUSY:-$(( 2 * $(nproc) ))}"
build="${FLEET_BUILD_DIR:-build}"
data="${FLEET_CTR_DATA:-data/ctr}"
out="$build/stress"
mkdir -p "$out"

cmake --build "$build" -j"$(nproc)" --target fleetrun ps_server ps_worker gen_ctr_data >/dev/null
if [ ! -f "$data/oracle.txt" ]; then
  "$build/bin/gen_ctr_data" --out_dir="$data" >/dev/null
fi

loads=()
stop_load() {
  for pid in "${loads[@]}"; do kill "$pid" 2>/dev/null || true; done
}
trap stop_load EXIT
for _ in $(seq 1 "$busy"); do
  ( while :; do :; done ) &
  loads+=("$!")
done
echo "stress_demo: $runs runs of the CTR demo beside $busy busy processes on $(nproc) cores"

passed=0
for n in $(seq 1 "$runs"); do
  start=$(date +%s)
  if "$build/bin/fleetrun" --server_num=2 --worker_num=4 --http_port=0 \
      --log_dir="$out/log.$n" --config configs/ctr_dnn.yaml \
      -o "data.train=$data/train" -o "data.test=$data/test" -o "data.oracle=$data/oracle.txt" \
      "$@" >"$out/run.$n.out" 2>&1 && grep -q "summary: held-out" "$out/run.$n.out"; then
    passed=$((passed + 1))
    verdict=passed
    rm -rf "$out/log.$n" "$out/run.$n.out"
  else
    verdict="FAILED (output: $out/run.$n.out, logs: $out/log.$n)"
  fi
  echo "stress_demo: run $n: $verdict in $(( $(date +%s) - start )) s; load $(cut -d' ' -f1 /proc/loadavg)"
done
echo "stress_demo: $passed of $runs runs passed"
[ "$passed" -eq "$runs" ]
