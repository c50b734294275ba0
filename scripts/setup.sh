#!/usr/bin/env bash
# Installs everything trainyard needs to build, test and benchmark on Debian 12, plus s3rver (an
# S3-compatible server the S3 checkpoint storage tests run against) and Hugging Face's tokenizers
# (the tokenizer tests' oracle) from the npm registry.
# Idempotent: when everything is already present it touches nothing.
# `setup.sh --image` installs only what building and running trainyard needs (the Dockerfile's
# case): no test, benchmark or comparison tools, nothing from npm.
set -euo pipefail

image_only=false
case "${1:-}" in
  --image) image_only=true ;;
  "") ;;
  *) echo "setup: unknown option '$1'; the only option is --image (build and run only)" >&2
     exit 2 ;;
esac

# Building and running trainyard.
packages=(
  build-essential cmake ninja-build pkg-config
  libtorch-dev libgloo-dev libopenblas0-pthread   # LibTorch, Gloo headers, a fast BLAS
  nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev libcpp-httplib-dev
  libcurl4-openssl-dev libssl-dev libsqlite3-dev zlib1g-dev libmicrohttpd-dev
  ca-certificates                                  # TLS to S3 and STS
  libicu-dev                                       # Unicode for the tokenizer (NFC, classes)
  libturbojpeg0-dev libpng-dev                     # JPEG and PNG for the ImageFolder dataset
  dataset-fashion-mnist                            # the fashion-mnist recipe's data
  iproute2 procps
  curl jq                                          # bench/cluster.sh talks to the head
  libjs-chart.js                                   # Chart.js, embedded into the head's dashboard
)
# Testing, benchmarking and comparing.
dev_packages=(
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  fortunes                                         # a text corpus
  python3-torch python3-torchvision                # the Python peer for comparisons
  python3-requests python3-aiohttp                 # Ray's Jobs client calls replayed in the cluster tests
  etcd-server etcd-client                          # etcd for the etcd rendezvous tests
  prometheus                                       # Prometheus and promtool for the /metrics tests
  chromium chromium-driver                         # the dashboard's browser test
  libyaml-cpp-dev                                  # the Kubernetes manifests' tests parse them
  slurmctld slurmd slurm-client munge              # a real Slurm cluster for the Slurm tests
  golang-go golang-github-hashicorp-hcl-v2-dev     # Terraform's HCL parser, for the deploy/terraform test
)
# kubectl (Debian's kubernetes-client) checks the Kubernetes manifests client-side. Another
# package's kubectl (e.g. Google Cloud SDK's) owns /usr/bin/kubectl and conflicts with it, so
# Debian's is asked for only when there is no kubectl at all.
if ! command -v kubectl >/dev/null 2>&1; then
  dev_packages+=(kubernetes-client)
fi
# Node.js and npm run s3rver. A nodejs package that bundles npm (NodeSource's) provides and
# conflicts with Debian's npm, so Debian's pair is asked for only when there is no npm at all.
if ! command -v npm >/dev/null 2>&1; then
  dev_packages+=(nodejs npm)
fi
if [ "$image_only" = false ]; then
  packages+=("${dev_packages[@]}")
fi

# s3rver lives outside the git tree; tests/CMakeLists.txt points the tests at this prefix.
s3rver_prefix=/opt/trainyard/node
s3rver_version=3.7.1

sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
else
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -q
  "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

if [ "$image_only" = true ]; then
  exit 0
fi

# The installed s3rver's version, or nothing; any 3.7.x counts as present.
installed=$(node -p "require('${s3rver_prefix}/node_modules/s3rver/package.json').version" \
  2>/dev/null || true)
if [[ "$installed" == 3.7.* && -x "${s3rver_prefix}/node_modules/.bin/s3rver" ]]; then
  echo "setup: s3rver ${installed} present in ${s3rver_prefix}"
else
  echo "setup: installing s3rver@${s3rver_version} into ${s3rver_prefix}"
  "${sudo_cmd[@]}" mkdir -p "$s3rver_prefix"
  "${sudo_cmd[@]}" npm install --prefix "$s3rver_prefix" --no-audit --no-fund \
    "s3rver@${s3rver_version}"
fi

# Hugging Face's tokenizers as a Node package (its native binaries ship inside it): the oracle the
# tokenizer tests compare ids with. tests/CMakeLists.txt points them at this prefix.
tokenizers_prefix=/opt/trainyard/node-tokenizers
tokenizers_version=0.23.2
installed=$(node -p "require('${tokenizers_prefix}/node_modules/tokenizers/package.json').version" \
  2>/dev/null || true)
if [[ "$installed" == "$tokenizers_version" ]]; then
  echo "setup: tokenizers ${installed} present in ${tokenizers_prefix}"
else
  echo "setup: installing tokenizers@${tokenizers_version} into ${tokenizers_prefix}"
  "${sudo_cmd[@]}" mkdir -p "$tokenizers_prefix"
  "${sudo_cmd[@]}" npm install --prefix "$tokenizers_prefix" --no-audit --no-fund \
    "tokenizers@${tokenizers_version}"
fi
