#!/usr/bin/env bash
# torch2_check.sh — compile-checks trainyard's sources against a LibTorch 2.x include tree on a
# machine that has only Debian's LibTorch 1.13 (no 2.x libraries, no GPU): each translation unit
# of build/compile_commands.json is run through `g++ -fsyntax-only` with the 1.13 include path
# replaced by the 2.x tree's. It finds the API differences before a GPU machine's time is spent.
#
#   scripts/torch2_check.sh TORCH_INCLUDE [CUDA_INCLUDE] [REGEX]
#     TORCH_INCLUDE  a LibTorch 2.x include folder (python3 -c 'import torch,os;
#                    print(os.path.join(os.path.dirname(torch.__file__), "include"))')
#     CUDA_INCLUDE   CUDA's include folder, for the NCCL process group's headers (optional)
#     REGEX          only the sources whose path matches (default: every source)
#   JOBS=2 (parallel compilers); logs go to build/torch2-check/<source>.log.
set -euo pipefail
TI=${1:?usage: scripts/torch2_check.sh TORCH_INCLUDE [CUDA_INCLUDE] [REGEX]}
CI=${2:-}
RE=${3:-.}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DB=$ROOT/build/compile_commands.json
[[ -f $DB ]] || { echo "torch2_check: $DB is missing: build the 1.13 tree first (scripts/build.sh)" >&2; exit 2; }
OUTDIR=$ROOT/build/torch2-check
mkdir -p "$OUTDIR"
/usr/bin/python3 - "$DB" "$TI" "$CI" "$RE" "$OUTDIR" "${JOBS:-2}" <<'PY'
import json, re, shlex, subprocess, sys, os
from concurrent.futures import ThreadPoolExecutor
db, ti, ci, rx, outdir, jobs = sys.argv[1:]
cmds = []
for c in json.load(open(db)):
    f = c["file"]
    if not f.endswith(".cpp") or not re.search(rx, f) or "/build/" in f:
        continue
    args = shlex.split(c["command"])
    new = []
    skip = False
    for i, a in enumerate(args):
        if skip:
            skip = False
            continue
        if a in ("-include", "-o") or (a == "-isystem" and "torch" in args[i + 1]):
            skip = True
            continue
        if a in ("-c", "-Winvalid-pch"):
            continue
        new.append(a)
    # Note [System fmt first]: LibTorch 2.x ships fmt 12 in its include folder; spdlog needs the
    # system's fmt, so a folder holding only a link to it comes before LibTorch's.
    extra = ["-isystem", os.path.join(os.path.dirname(db), "system-fmt"), "-isystem", ti, "-isystem", os.path.join(ti, "torch/csrc/api/include")]
    if ci:
        extra += ["-isystem", ci, "-DUSE_C10D_NCCL"]
    cmds.append((f, [new[0]] + extra + new[1:-1] + ["-fsyntax-only", new[-1]], c["directory"]))
def run(item):
    f, argv, d = item
    log = os.path.join(outdir, os.path.relpath(f, os.path.dirname(outdir) + "/..").replace("/", "_") + ".log")
    r = subprocess.run(["nice", "-n", "10"] + argv, cwd=d, capture_output=True, text=True)
    open(log, "w").write(r.stderr)
    errors = r.stderr.count(" error: ")
    print(f"{'ok  ' if r.returncode == 0 else 'FAIL'} {errors:3d} errors  {os.path.relpath(f)}", flush=True)
    return r.returncode == 0
with ThreadPoolExecutor(int(jobs)) as ex:
    ok = list(ex.map(run, cmds))
print(f"{sum(ok)}/{len(ok)} translation units compile against {ti}")
sys.exit(0 if all(ok) else 1)
PY
