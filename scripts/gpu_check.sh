#!/usr/bin/env bash
# GPU check: build the CUDA extensions, run the CUDA parity tests (first with
# CUDA_LAUNCH_BLOCKING=1, so a fault names its kernel), train a nerf and a splat job of 200 steps
# through the real API and a real Celery worker on the GPU and render them
# (experiments/gpu_train_check.py), repeat the parity tests on a side stream, under
# compute-sanitizer memcheck and (the shared-memory splat kernels) racecheck, then benchmark the
# ops on the device. Each stage prints one JSON line on stdout as it ends, so a run cut short still
# says what it reached (logs go to stderr). Needs a CUDA torch, pytest and nvcc
# (compute-sanitizer ships with the toolkit); sized for 10 minutes of one GPU including the builds.
#   scripts/gpu_check.sh            # from the repository root
#   PYTHON=/path/to/python scripts/gpu_check.sh
# On a GPU machine whose Python has torch but not the service's packages, carry the wheels that
# scripts/gpu_wheels.sh fetched into .whl/: they are installed into /tmp/site for this run.
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

if ls .whl/*.whl >/dev/null 2>&1 && ! "$PY" -c "import fastapi, celery, pydantic_settings" 2>/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl >&2 && export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi

info=$("$PY" - <<'PYEOF' 2>/dev/null
import json, torch
d = {"stage": "env", "torch": torch.__version__, "cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available()}
try:
    import celery, fastapi, pydantic_settings  # the training stage's service
    d["service_packages"] = True
except ImportError as exc:
    d["service_packages"] = f"missing: {exc.name} (scripts/gpu_wheels.sh)"
if torch.cuda.is_available():
    d["device"] = torch.cuda.get_device_name(0)
    d["capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
    d["device_count"] = torch.cuda.device_count()
print(json.dumps(d))
PYEOF
)
if [ -z "$info" ]; then
  echo "{\"stage\": \"env\", \"ok\": false, \"error\": \"python '$PY' cannot import torch\"}"
  exit 1
fi
echo "$info"

# build: one JSON line per backend; --require-cuda makes a CPU-only result a failure here. Without
# TORCH_CUDA_ARCH_LIST the backend compiles for the visible GPUs only. Its smoke calls are the
# first CUDA launches, hence synchronous.
t0=$(date +%s)
CUDA_LAUNCH_BLOCKING=1 timeout 190 "$PY" -m kernels.build --require-cuda
rc=$?
echo "{\"stage\": \"build\", \"ok\": $([ $rc -eq 0 ] && echo true || echo false), \"rc\": $rc, \"seconds\": $(( $(date +%s) - t0 ))}"
[ $rc -eq 0 ] || status=1

# -k cuda: the CUDA cases of these files (test_bindings.py runs each check on cpu, cuda, cuda:1)
CUDA_TESTS="tests/kernels/test_cuda_parity.py tests/kernels/test_splat.py::test_cuda_matches_cpu_reference tests/kernels/test_bindings.py"
SPLAT_CUDA="tests/kernels/test_splat.py::test_cuda_matches_cpu_reference"

# stage NAME LIMIT_S CMD...: runs CMD, prints one JSON line with its pytest summary
stage() {
  local name=$1 limit=$2
  shift 2
  local t0 log rc summary
  t0=$(date +%s)
  log=$(mktemp)
  timeout "$limit" "$@" >"$log" 2>&1
  rc=$?
  summary=$(grep -E "passed|failed|error|ERROR SUMMARY" "$log" | tail -n 2 | tr -d '"=\\' | tr '\n' ' ' | sed 's/^ *//; s/ *$//')
  echo "{\"stage\": \"$name\", \"ok\": $([ $rc -eq 0 ] && echo true || echo false), \"rc\": $rc, \"summary\": \"$summary\", \"seconds\": $(( $(date +%s) - t0 ))}"
  [ $rc -eq 0 ] || { status=1; tail -n 60 "$log" >&2; }
  rm -f "$log"
}

PYTEST=("$PY" -m pytest -q -p no:cacheprovider -k cuda)
# The stage limits add up to 10 minutes. parity: the CUDA tests, each held against the references
# and the CPU build within the tolerances test_cuda_parity.py states (the CPU tests themselves run
# in CI); the first pass, so launches are synchronous and a fault names its kernel.
stage parity 50 env CUDA_LAUNCH_BLOCKING=1 "${PYTEST[@]}" $CUDA_TESTS

# train: a nerf and a splat job of 200 steps each, uploaded over HTTP to `python -m
# service.embedded` (API + Celery worker, DEVICE=cuda, the filesystem broker, or Redis where
# REDIS_URL is set), trained, then one held-out view rendered over HTTP. Its JSON lines (service,
# <kind>_upload, <kind>_train with steps_per_s, samples_per_s and test_psnr, <kind>_render with
# psnr) go straight to stdout as each ends; then one line for the stage.
t0=$(date +%s)
# (--timeout bounds the jobs; stopping the service takes up to 20 s more)
timeout -k 5 130 "$PY" -m experiments.gpu_train_check --device cuda --steps 200 --timeout 100
rc=$?
echo "{\"stage\": \"train\", \"ok\": $([ $rc -eq 0 ] && echo true || echo false), \"rc\": $rc, \"seconds\": $(( $(date +%s) - t0 ))}"
[ $rc -eq 0 ] || status=1

# the same CUDA tests with every op issued on a side stream (tests/kernels/conftest.py)
stage side_stream 35 env KERNELS_TEST_STREAM=side "${PYTEST[@]}" $CUDA_TESTS

SAN=$(command -v compute-sanitizer || true)
if [ -z "$SAN" ] && [ -n "${CUDA_HOME:-}" ] && [ -x "$CUDA_HOME/bin/compute-sanitizer" ]; then SAN="$CUDA_HOME/bin/compute-sanitizer"; fi
if [ -z "$SAN" ] && [ -x /usr/local/cuda/bin/compute-sanitizer ]; then SAN=/usr/local/cuda/bin/compute-sanitizer; fi
if [ -n "$SAN" ]; then
  # No caching allocator: each tensor is its own allocation, so memcheck sees a read past it.
  stage memcheck 75 env PYTORCH_NO_CUDA_MEMORY_CACHING=1 "$SAN" --tool memcheck --error-exitcode 1 --report-api-errors no \
    --target-processes all "${PYTEST[@]}" $CUDA_TESTS
  stage racecheck 40 "$SAN" --tool racecheck --error-exitcode 1 --target-processes all \
    "${PYTEST[@]}" $SPLAT_CUDA
else
  echo '{"stage": "sanitizer", "ok": false, "error": "compute-sanitizer not found (CUDA toolkit bin)"}'
  status=1
fi

# bench: JSON lines, references vs tuned baselines vs ext on the GPU, then the splat compositors
timeout 50 "$PY" -m experiments.kernels_bench --device cuda --ops hash_grid,hash_grid_2d,sh,composite,march,bitfield || status=1
timeout 20 "$PY" -m experiments.splat_bench --device cuda --sizes 2500,40000 || status=1
exit $status
