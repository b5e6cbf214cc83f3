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
  libcpp-httplib-dev libssl-dev
  libabsl-dev libdivide-dev
  zlib1g-dev
  libzip-dev
  python3-numpy
  dataset-fashion-mnist
  procps iproute2
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

echo "setup: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: done"
