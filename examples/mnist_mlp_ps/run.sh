#!/usr/bin/env bash
# The MNIST-format MLP (784-128-128-10) trained on the parameter server:
# 2 servers hold its parameters in one dense table, 2 workers train in sync
# mode on Fashion-MNIST (Debian package dataset-fashion-mnist, read from
# /usr/share/datasets/fashion-mnist; other MNIST-format files via
# -o data.train_images=... etc.). Extra arguments go to fleetrun.
set -euo pipefail
cd "$(dirname "$0")/../.."
build="${FLEET_BUILD_DIR:-build}"
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
cmake --build "$build" -j2 --target fleetrun ps_server ps_worker >/dev/null
exec "$build/bin/fleetrun" --server_num=2 --worker_num=2 --http_port=0 \
  --log_dir="$build/log/mnist_mlp_ps" --config configs/mnist_mlp_ps.yaml "$@"
