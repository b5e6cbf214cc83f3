#!/usr/bin/env bash
# The main job: installs what is needed, builds, and runs the single-machine
# CTR simulation (2 parameter servers, 4 workers) on generated data, printing
# progress and the held-out AUC beside the oracle AUC.
# Extra arguments go to fleetrun, e.g.  -o Distributed.mode=geo
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec bash examples/ctr_dnn/run.sh "$@"
