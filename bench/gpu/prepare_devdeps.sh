#!/usr/bin/env bash
# prepare_devdeps.sh — fills .devdeps/ (git-ignored) with what bench/gpu/device_check.sh needs on
# the device machine and cannot fetch there: Debian 12's .deb files of the -dev packages that
# machine lacks (it has spdlog, CLI11, nlohmann-json, OpenSSL, libpng, zlib, GoogleTest), a small
# FashionMNIST (its test set, named as both splits) and a slice of the fortunes corpus. Run it
# here, from anywhere, then call the device tool with carry [".devdeps"] (about 30 MB).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
D=$ROOT/.devdeps
mkdir -p "$D/fmnist"
grep -qx '/.devdeps/' "$(git -C "$ROOT" rev-parse --absolute-git-dir)/info/exclude" 2>/dev/null ||
  echo '/.devdeps/' >>"$(git -C "$ROOT" rev-parse --absolute-git-dir)/info/exclude"
(cd "$D" && apt-get download libgloo-dev libicu-dev libicu72 libcurl4-openssl-dev \
  libmicrohttpd-dev libmicrohttpd12 libsqlite3-dev libturbojpeg0-dev libturbojpeg0 \
  libjpeg62-turbo-dev libjpeg62-turbo libjs-chart.js)
F=/usr/share/datasets/fashion-mnist
for kind in images-idx3 labels-idx1; do
  cp "$F/t10k-$kind-ubyte.gz" "$D/fmnist/t10k-$kind-ubyte.gz"
  cp "$F/t10k-$kind-ubyte.gz" "$D/fmnist/train-$kind-ubyte.gz"
done
head -c 60000 /usr/share/games/fortunes/fortunes >"$D/fortunes.txt"
du -sh "$D"
