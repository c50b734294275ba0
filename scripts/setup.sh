#!/usr/bin/env bash
# Installs everything trainyard needs to build, test and benchmark on Debian 12: Debian packages
# through apt-get, and one Python environment, /opt/trainyard/venv, with pinned packages from PyPI
# (scripts/requirements.txt under scripts/constraints.txt): PyTorch's own wheel, whose LibTorch the
# build uses, and the libraries and clients the tests use as oracles (transformers, peft,
# tokenizers, ray, boto3, moto's S3 server).
# Idempotent: when everything is already present it touches nothing.
# `setup.sh --image` installs only what building and running trainyard needs (the Dockerfile's
# case): no test, benchmark or comparison tools; torch alone in the venv.
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
  libgloo-dev                                      # Gloo's headers (LibTorch ships none)
  python3-venv                                     # the venv PyTorch's wheel goes into
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
if [ "$image_only" = false ]; then
  packages+=("${dev_packages[@]}")
fi

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

# The venv: Debian's Python (not whichever python3 comes first on PATH), PyPI's packages at the
# pinned versions. A stamp holding the hash of the files it was made from makes a second run
# quick; a changed pin reinstalls.
venv=/opt/trainyard/venv
scripts=$(cd "$(dirname "$0")" && pwd)
requirements=$scripts/requirements.txt
[ "$image_only" = true ] && requirements=$scripts/requirements-image.txt
want=$(cat "$scripts/requirements-image.txt" "$requirements" "$scripts/constraints.txt" \
  | sha256sum | cut -d' ' -f1)
stamp=$venv/.trainyard-$(basename "$requirements" .txt)
if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
  echo "setup: $venv holds $(basename "$requirements")'s pins"
else
  echo "setup: installing $(basename "$requirements") into $venv (PyTorch's wheel is gigabytes)"
  [ -x "$venv/bin/python" ] || "${sudo_cmd[@]}" /usr/bin/python3 -m venv "$venv"
  "${sudo_cmd[@]}" "$venv/bin/pip" install --quiet --disable-pip-version-check --no-input \
    -r "$requirements" -c "$scripts/constraints.txt"
  echo "$want" | "${sudo_cmd[@]}" tee "$stamp" >/dev/null
fi
