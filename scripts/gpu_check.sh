#!/usr/bin/env bash
# GPU check for kernels/: build the CUDA extension, run the CUDA parity tests, run the benchmark
# on the device. Prints JSON lines only on stdout (logs go to stderr). Needs a CUDA torch, pytest
# and nvcc on the machine; meant to finish in well under 5 minutes on one GPU.
#   scripts/gpu_check.sh            # from the repository root
#   PYTHON=/path/to/python scripts/gpu_check.sh
set -u
cd "$(dirname "$0")/.."
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ] && .venv/bin/python -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    PY=.venv/bin/python
  else
    PY=python3
  fi
fi
export KERNELS_BUILD_DIR="${KERNELS_BUILD_DIR:-/tmp/kernels-build}"
status=0

info=$("$PY" - <<'PYEOF' 2>/dev/null
import json, torch
d = {"stage": "env", "torch": torch.__version__, "cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available()}
if torch.cuda.is_available():
    d["device"] = torch.cuda.get_device_name(0)
    d["capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
print(json.dumps(d))
PYEOF
)
if [ -z "$info" ]; then
  echo "{\"stage\": \"env\", \"ok\": false, \"error\": \"python '$PY' cannot import torch\"}"
  exit 1
fi
echo "$info"

# build: one JSON line per backend; --require-cuda makes a CPU-only result a failure here
"$PY" -m kernels.build --require-cuda || status=1

# parity: the CUDA tests plus the CPU ones they are held against
t0=$(date +%s)
log=$(mktemp)
"$PY" -m pytest -q -p no:cacheprovider tests/kernels/test_cuda_parity.py tests/kernels/test_hash_grid.py \
  tests/kernels/test_composite.py tests/kernels/test_marching.py tests/kernels/test_occupancy.py \
  tests/kernels/test_splat.py >"$log" 2>&1
rc=$?
summary=$(tail -n 1 "$log" | tr -d '"=' | sed 's/^ *//; s/ *$//')
echo "{\"stage\": \"parity\", \"ok\": $([ $rc -eq 0 ] && echo true || echo false), \"pytest_rc\": $rc, \"summary\": \"$summary\", \"seconds\": $(( $(date +%s) - t0 ))}"
[ $rc -eq 0 ] || { status=1; tail -n 60 "$log" >&2; }
rm -f "$log"

# bench: JSON lines, reference vs ext on the GPU, then the CPU figures for comparison
"$PY" -m kernels.bench --device cuda || status=1
exit $status
