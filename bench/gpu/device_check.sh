#!/usr/bin/env bash
# device_check.sh — issue 14's checks on a GPU machine whose python3 has a pip PyTorch (LibTorch 2.x
# with CUDA and NCCL), in one call of the device tool: build trainyard against that LibTorch, run
# the GPU tests, train fashion-mnist and causal-lm on the GPU, and measure GPT-NeoX training
# (trainyard FSDP FULL_SHARD and DDP, bf16-mixed, sequence 2048) next to PyTorch's own FSDP2 and
# DDP from the same install (bench/gpu/pytorch_peer.py). Logs go to $OUT (or /tmp/device-check).
#
#   bash bench/gpu/device_check.sh [STAGES]    # STAGES: build,tests,bench,peer,recipes (default all,
#                                              # in that order)
#
# The machine lacks some of trainyard's Debian -dev packages: they travel as .deb files in
# .devdeps/ (git-ignored; bench/gpu/prepare_devdeps.sh fills it, about 30 MB) and are
# unpacked under /tmp/deps, never into /. Also there: fmnist/ (FashionMNIST's test set, named as
# both splits) and fortunes.txt.
set -uo pipefail
OUT=${OUT:-/tmp/device-check}
mkdir -p "$OUT"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
STAGES=${1:-build,tests,bench,peer,recipes}
DEPS=/tmp/deps
B=/tmp/ty-build
L=$DEPS/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH=$L:${LD_LIBRARY_PATH:-}
has() { [[ ",$STAGES," == *",$1,"* ]]; }
stamp() { echo "== $(date +%T) $*"; }

if has build; then
  stamp unpack
  for f in "$ROOT"/.devdeps/*.deb; do dpkg -x "$f" "$DEPS"; done
  sed -i "s|/usr/lib/x86_64-linux-gnu|$L|g" "$L"/cmake/libjpeg-turbo/*.cmake
  rm -f "$L/libcurl.so" "$L/libsqlite3.so"  # links to libraries the machine has itself
  TORCH_CMAKE=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
  stamp configure
  # File by file (Note [Unity build]): the 2.x-only code has never compiled in batches, and the
  # device's 16 cores do not need them.
  cmake -S "$ROOT" -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$TORCH_CMAKE;$DEPS/usr" -DTORCH_CUDA_ARCH_LIST=9.0 \
    -DTRAINYARD_BUILD_TESTS=OFF -DTRAINYARD_BUILD_GPU_TESTS=ON -DTRAINYARD_BUILD_BENCH=OFF \
    -DTRAINYARD_UNITY_BUILD=OFF \
    -DICU_ROOT=$DEPS/usr -DGLOO_INCLUDE_DIR=$DEPS/usr/include \
    -DCURL_INCLUDE_DIR=$DEPS/usr/include/x86_64-linux-gnu \
    -DCURL_LIBRARY=/usr/lib/x86_64-linux-gnu/libcurl.so.4 \
    -DSQLite3_INCLUDE_DIR=$DEPS/usr/include \
    -DSQLite3_LIBRARY=/usr/lib/x86_64-linux-gnu/libsqlite3.so.0 \
    -DTRAINYARD_CHARTJS_PATH=$DEPS/usr/share/javascript/chart.js/chart.min.js \
    >"$OUT/configure.log" 2>&1 || { tail -60 "$OUT/configure.log"; exit 1; }
  grep -E "trainyard|\[.\]" "$OUT/configure.log"
  stamp build
  ninja -C $B -k 0 trainyard_cli train_gpt_fsdp gpu_tests >"$OUT/build.log" 2>&1
  rc=$?
  grep -E "error|FAILED" "$OUT/build.log" | head -40
  stamp "build rc=$rc"
  [[ $rc == 0 ]] || exit 1
fi

if has tests; then
  stamp gpu_tests
  timeout 150 $B/tests/gpu/gpu_tests 2>&1 | tee "$OUT/gpu_tests.log" | grep -E "^\[ *(OK|FAILED|SKIPPED|PASSED) |Failure|error|Expected|Which is|rel" | head -60
fi


if has bench; then
  for preset in pythia-70m pythia-1b; do
    for strategy in full_shard ddp; do
      stamp "trainyard $preset $strategy"
      timeout 75 $B/trainyard run --nproc-per-node 1 -- $B/examples/train_gpt_fsdp --device cuda \
        --preset $preset --strategy $strategy --precision bf16-mixed --seq-len 2048 --batch-size 8 \
        --steps 12 --warmup-steps 2 2>&1 | grep -E "step (0|11) loss|tokens/s|rror" | tee -a "$OUT/bench.log"
    done
  done
fi

if has peer; then
  stamp "pytorch peer"
  PYTHONUNBUFFERED=1 timeout 120 python3 "$ROOT/bench/gpu/pytorch_peer.py" --steps 10 2>&1 \
    | grep -E "^peer|^torch" | tee "$OUT/peer.log"
fi
if has recipes; then
  stamp fashion-mnist
  timeout 60 $B/trainyard train fashion-mnist --device cuda --workers 1 --data-dir "$ROOT/.devdeps/fmnist" \
    --epochs 1 --batch-size 128 --storage /tmp/runs --name fm-gpu --no-progress 2>&1 | tail -12 | tee "$OUT/fashion_mnist.log"
  stamp "fashion-mnist, 2 CPU ranks (the 2.x line's CPU path, shared memory included)"
  timeout 60 $B/trainyard train fashion-mnist --workers 2 --threads 4 --limit 4000 \
    --data-dir "$ROOT/.devdeps/fmnist" --epochs 1 --storage /tmp/runs --name fm-cpu --no-progress 2>&1 | tail -6 | tee "$OUT/fashion_mnist_cpu.log"
  stamp causal-lm
  timeout 60 $B/trainyard train causal-lm --device cuda --workers 1 --model pythia-70m \
    --data "$ROOT/.devdeps/fortunes.txt" --strategy full_shard --precision bf16-mixed \
    --seq-len 256 --batch-size 16 --epochs 1 --storage /tmp/runs --name lm-gpu --no-progress 2>&1 | tail -12 | tee "$OUT/causal_lm.log"
  stamp "causal-lm resumed on the GPU for a second epoch"
  timeout 60 $B/trainyard train causal-lm --device cuda --workers 1 --model pythia-70m \
    --data "$ROOT/.devdeps/fortunes.txt" --strategy full_shard --precision bf16-mixed \
    --seq-len 256 --batch-size 16 --epochs 2 --storage /tmp/runs --name lm-gpu --no-progress 2>&1 | grep -E "Resuming|train_loss|rror" | tail -4 | tee -a "$OUT/causal_lm.log"
fi

stamp done
