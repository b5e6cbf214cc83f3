#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite (CTest + GoogleTest).
# Usage: bash scripts/test.sh [extra ctest args]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
# Multi-process tests measure failure-detection times; two at a time keeps
# them honest on a 2-core machine.
ctest --test-dir build --output-on-failure --no-tests=error -j2 "$@"
