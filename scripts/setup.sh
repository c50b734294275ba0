#!/usr/bin/env bash
# Installs everything trainyard needs to build, test and benchmark on Debian 12.
# Idempotent: when every package is already present it touches nothing.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libtorch-dev libgloo-dev libopenblas0-pthread   # LibTorch, Gloo headers, a fast BLAS
  nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev libcpp-httplib-dev
  libcurl4-openssl-dev libsqlite3-dev zlib1g-dev
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  dataset-fashion-mnist fortunes                   # data sets
  python3-torch python3-torchvision                # the Python peer for comparisons
  iproute2 procps
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

echo "setup: installing ${missing[*]}"
sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -q
"${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
