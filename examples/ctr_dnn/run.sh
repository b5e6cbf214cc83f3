#!/usr/bin/env bash
# CTR-DNN on the parameter server, simulated on this machine: builds what it
# needs, generates the synthetic Criteo-format data when absent, then runs
#   fleetrun --server_num=2 --worker_num=4 --config configs/ctr_dnn.yaml
# Extra arguments go to fleetrun, e.g.  -o Distributed.mode=async
#
# Environment: FLEET_BUILD_DIR (default build), FLEET_CTR_DATA (default
# data/ctr), FLEET_SERVERS_NUM / FLEET_WORKERS_NUM (default 2 / 4),
# FLEET_HETER_WORKERS_NUM (default 0; > 0 runs the dense part on that many
# heter workers with configs/ctr_dnn_heter.yaml), FLEET_CTR_CONFIG (another
# CTR model's config: configs/dnn.yaml, wide_deep.yaml, deepfm.yaml, dcn.yaml;
# its logs go to build/log/<its name>).
set -euo pipefail
cd "$(dirname "$0")/../.."
build="${FLEET_BUILD_DIR:-build}"
data="${FLEET_CTR_DATA:-data/ctr}"
heter="${FLEET_HETER_WORKERS_NUM:-0}"
config="${FLEET_CTR_CONFIG:-configs/ctr_dnn.yaml}"
targets="fleetrun ps_server ps_worker gen_ctr_data"
if [ "$heter" -gt 0 ]; then
  config="${FLEET_CTR_CONFIG:-configs/ctr_dnn_heter.yaml}"
  targets="$targets heter_worker"
fi
name="$(basename "$config" .yaml)"
name="${name%_heter}"

if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
cmake --build "$build" -j"$(nproc)" --target $targets >/dev/null

if [ ! -f "$data/oracle.txt" ]; then
  echo "run.sh: generating CTR data in $data (200k train, 50k test lines)"
  "$build/bin/gen_ctr_data" --out_dir="$data"
fi

# --http_port=0: the KV store takes a free port, so two jobs on one machine
# never clash. Worker 0's log is copied to this terminal.
exec "$build/bin/fleetrun" --server_num="${FLEET_SERVERS_NUM:-2}" --worker_num="${FLEET_WORKERS_NUM:-4}" \
  --heter_worker_num="$heter" --http_port=0 --log_dir="$build/log/$name" --config "$config" \
  -o "data.train=$data/train" -o "data.test=$data/test" -o "data.oracle=$data/oracle.txt" "$@"
