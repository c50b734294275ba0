#!/usr/bin/env bash
# Quick start 1: install dependencies, build, and run the seed's job: ResNet18 on FashionMNIST,
# data-parallel across 2 local worker processes, 10 epochs, results in ./results/fashion-mnist/.
# Extra arguments go to the recipe (e.g. --epochs 1 --limit 3000 for a short run).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
exec build/trainyard train fashion-mnist --workers 2 --epochs 10 --batch-size 128 --lr 0.001 \
  --storage results "$@"
