#!/usr/bin/env bash
# GPU check, sized for the lent machine (one H100 or H200, Python 3.12 with torch cu130, nvcc,
# compute-sanitizer and pytest, no package index, none of the service's packages): its stage
# limits add up to 355 s (wheel install 15, preflight 15, build 105, parity 25, train 75, side_stream
# 20, memcheck 60, racecheck 20, bench 20), builds included, so one run ends within 6 minutes and
# a second one fits the same 15-minute lease.
#   scripts/gpu_check.sh                 # from the repository root, the wheel set in .whl/
#   PYTHON=/path/to/python scripts/gpu_check.sh
#   scripts/gpu_check.sh --rehearsal     # a CPU machine: every stage that needs no GPU
# Stages, each printing one JSON line on stdout as it ends (and appending it to
# $OUT/gpu_check.jsonl when OUT is set; every stage's output goes to $OUT/gpu_check.log, the tail
# of a failed one to stderr), so a run cut short still says what it reached:
#   preflight   the wheel set (scripts/gpu_wheels.sh, carried as .whl/) installed offline into
#               /tmp/site, which only the training stage puts on PYTHONPATH, then
#               scripts/gpu_preflight.py: Python, torch, CUDA, the GPU, Python.h, cuda_runtime.h,
#               nvcc, compute-sanitizer, ninja, c++, pytest, the wheel set's install and imports
#   build       both extensions' CPU and CUDA libraries for this GPU's architecture alone (sm_90
#               on an H100/H200), built by three processes at once, then `kernels.build
#               --require-cuda` loads them and smoke-tests every op (CUDA_LAUNCH_BLOCKING=1)
#   parity      the CUDA tests against the references and the CPU build, CUDA_LAUNCH_BLOCKING=1
#               and NF_KERNEL_CHECKS=1 (the front ends also check offsets and index ranges)
#   train       experiments/gpu_train_check.py: a nerf and a splat job of 200 steps through the
#               real API and a Celery worker on the GPU (steps/s, samples/s, PSNR; its own lines)
#   side_stream the CUDA tests with every op on a side stream
#   memcheck    compute-sanitizer memcheck of the CUDA tests, instrumenting our kernels only
#   racecheck   compute-sanitizer racecheck of the tiled splat kernels
#   bench       experiments.kernels_bench and experiments.splat_bench on the GPU (their own lines)
# --rehearsal runs the same commands where no GPU is needed (preflight without GPU
# requirements, the CPU build, the pytest stages' collection, the training stage on the CPU with
# a few steps, the benchmarks' imports) and marks the rest "rehearsed"; the CI test
# tests/deploy/test_gpu_check.py runs it in a virtual environment holding only the lent
# machine's packages. The kernel stages import nothing of the service.
set -u
cd "$(dirname "$0")/.."
REHEARSAL=0
[ "${1:-}" = "--rehearsal" ] && REHEARSAL=1
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ] && .venv/bin/python -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    PY=.venv/bin/python
  else
    PY=python3
  fi
fi
export KERNELS_BUILD_DIR="${KERNELS_BUILD_DIR:-/tmp/kernels-build}"
export PYTHONUNBUFFERED=1
WHEELS="${WHEEL_DIR:-.whl}"
SITE="${GPU_CHECK_SITE:-/tmp/site}"
BASE_PYTHONPATH="${PYTHONPATH:-}"
# ninja and the scripts of the interpreter's environment (its bin/ need not be on PATH)
PATH="$("$PY" -c 'import os, sys; print(os.path.dirname(sys.executable))' 2>/dev/null):$PATH"
NINJA_BIN=$("$PY" -c 'import ninja; print(ninja.BIN_DIR)' 2>/dev/null) && PATH="$NINJA_BIN:$PATH"
export PATH
JSONL=""
LOG=""
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  JSONL="$OUT/gpu_check.jsonl"
  LOG="$OUT/gpu_check.log"
  : >"$JSONL"
  : >"$LOG"
fi
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
T_START=$(date +%s)
status=0

emit() { # one JSON line: stdout, and $OUT/gpu_check.jsonl
  printf '%s\n' "$1"
  [ -z "$JSONL" ] || printf '%s\n' "$1" >>"$JSONL"
}

keep_log() { # NAME FILE OK: all of it into $OUT/gpu_check.log; the tail on stderr if it failed
  if [ -n "$LOG" ]; then
    { echo "===== $1"; cat "$2"; } >>"$LOG"
  fi
  [ "$3" = true ] || { echo "----- $1 (tail)" >&2; tail -n 60 "$2" >&2; }
}

# stage_line NAME RC T0 LIMIT LOGFILE [EXTRA_JSON]: the stage's line, with pytest's and the
# sanitizer's counts read from its log
stage_line() {
  "$PY" - "$@" <<'PYEOF'
import json, re, sys, time
name, rc, t0, limit, log = sys.argv[1:6]
extra = json.loads(sys.argv[6]) if len(sys.argv) > 6 and sys.argv[6] else {}
rc = int(rc)
d = {"stage": name, "ok": rc == 0, "rc": rc, "seconds": int(time.time()) - int(t0), "limit_s": int(limit)}
if rc in (124, 137):
    d["timed_out"] = True
text = open(log, errors="replace").read()
summary = [l for l in text.splitlines() if re.search(r"\d+ (passed|failed|error|errors|skipped|deselected|tests? collected)", l)]
if summary:
    last = summary[-1].strip("= ")
    d["summary"] = last[:300]
    for key in ("passed", "failed", "skipped", "deselected", "errors", "error"):
        m = re.search(rf"(\d+) {key}\b", last)
        if m:
            d["errors" if key == "error" else key] = int(m.group(1))
    m = re.search(r"(\d+) tests? collected", last) or re.search(r"^(\d+)/\d+ tests? collected", last)
    if m:
        d["collected"] = int(m.group(1))
san = re.findall(r"ERROR SUMMARY: (\d+) error", text)
if san:
    d["sanitizer_errors"] = sum(int(x) for x in san)
d.update(extra)
print(json.dumps(d))
PYEOF
}

# run_stage NAME LIMIT CMD...: runs CMD under `timeout LIMIT`, then its stage line
run_stage() {
  local name=$1 limit=$2
  shift 2
  local t0 log rc line
  t0=$(date +%s)
  log="$TMP/$name.log"
  timeout -k 5 "$limit" "$@" >"$log" 2>&1
  rc=$?
  line=$(stage_line "$name" "$rc" "$t0" "$limit" "$log" "${STAGE_EXTRA:-}")
  emit "$line"
  case "$line" in *'"ok": true'*) keep_log "$name" "$log" true ;; *) status=1; keep_log "$name" "$log" false ;; esac
}

# ---------------------------------------------------------------------------------- preflight
# First the wheel set, offline, --no-deps, into a folder of its own: the machine's packages stay
# as they are, and the kernel stages (PYTHONPATH without it) prove they need none of these. Its
# result is part of the preflight line, the run's first.
t0=$(date +%s)
WHEELS_RC=-1
if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
  rm -rf "$SITE"
  timeout -k 5 15 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --disable-pip-version-check --target "$SITE" "$WHEELS"/*.whl >"$TMP/wheels.log" 2>&1
  WHEELS_RC=$?
  keep_log wheels "$TMP/wheels.log" "$([ $WHEELS_RC -eq 0 ] && echo true || echo false)"
fi
WHEELS_S=$(($(date +%s) - t0))
TRAIN_PYTHONPATH="$SITE${BASE_PYTHONPATH:+:$BASE_PYTHONPATH}"
REH_FLAG=()
[ $REHEARSAL -eq 1 ] && REH_FLAG=(--rehearsal)
pre=$(timeout -k 5 15 "$PY" scripts/gpu_preflight.py "${REH_FLAG[@]}" --site "$SITE" --wheels "$WHEELS" \
  --install-rc "$WHEELS_RC" --install-s "$WHEELS_S" 2>"$TMP/preflight.log")
rc=$?
if [ -z "$pre" ]; then
  pre="{\"stage\": \"preflight\", \"ok\": false, \"rc\": $rc, \"error\": \"python '$PY' printed nothing (see the log)\"}"
fi
emit "$pre"
case "$pre" in *'"ok": true'*) keep_log preflight "$TMP/preflight.log" true ;; *) status=1; keep_log preflight "$TMP/preflight.log" false ;; esac
field() { "$PY" -c 'import json, sys; v = json.loads(sys.argv[1]).get(sys.argv[2]); print("" if v is None else v)' "$pre" "$1" 2>/dev/null; }
ARCH=$(field capability)
FILTER=$(field sanitizer_kernel_filter)
SAN=$(field compute_sanitizer)
CUDA_HOME_FOUND=$(field cuda_home)
[ -z "${CUDA_HOME:-}" ] && [ -n "$CUDA_HOME_FOUND" ] && export CUDA_HOME="$CUDA_HOME_FOUND"

# ---------------------------------------------------------------------------------- build
# The CUDA launchers' objects (nvcc, one thread per source) and each extension's libraries (the
# CPU one, then the CUDA one linking those objects) in three processes at once, for this GPU's
# architecture alone; then one process loads every library from the cache and smoke-tests each op.
t0=$(date +%s)
BUILD_LIMIT=105
if [ $REHEARSAL -eq 1 ]; then
  run_stage build $BUILD_LIMIT "$PY" -m kernels.build
else
  export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-${ARCH:-9.0}}"
  timeout -k 5 $((BUILD_LIMIT - 25)) "$PY" -c '
from kernels import _ext
for ext in _ext.EXTENSIONS:
    _ext._compile_objects(ext, _ext.library_dir(ext, "cuda"))
' >"$TMP/build_objects.log" 2>&1 &
p_obj=$!
for ext in NERF SPLAT; do
  timeout -k 5 $((BUILD_LIMIT - 20)) "$PY" -c "from kernels import _ext; _ext.load(_ext.$ext, 'cuda')" \
    >"$TMP/build_$ext.log" 2>&1 &
  eval "p_$ext=$!"
done
  wait $p_obj; rc_obj=$?
  wait "$p_NERF"; rc_nerf=$?
  wait "$p_SPLAT"; rc_splat=$?
  cat "$TMP"/build_objects.log "$TMP"/build_NERF.log "$TMP"/build_SPLAT.log >"$TMP/build_parallel.log"
  left=$((BUILD_LIMIT - ($(date +%s) - t0)))
  [ $left -lt 15 ] && left=15
  keep_log build_parallel "$TMP/build_parallel.log" true
  STAGE_EXTRA="{\"arch\": \"$TORCH_CUDA_ARCH_LIST\", \"parallel_rc\": {\"objects\": $rc_obj, \"nerf\": $rc_nerf, \"splat\": $rc_splat}, \"parallel_s\": $(($(date +%s) - t0))}" \
    run_stage build "$left" env CUDA_LAUNCH_BLOCKING=1 "$PY" -m kernels.build --require-cuda
fi
# kernels.build's own lines (one per backend: modules, seconds, smoke_tested)
grep -h '^{"backend"' "$TMP/build.log" 2>/dev/null | while read -r l; do emit "$l"; done

# ---------------------------------------------------------------------------------- tests
CUDA_TESTS=(tests/kernels/test_cuda_parity.py "tests/kernels/test_splat.py::test_cuda_matches_cpu_reference" tests/kernels/test_bindings.py)
TILED=("tests/kernels/test_splat.py::test_cuda_matches_cpu_reference[tiled]")
PYTEST=("$PY" -m pytest -q -p no:cacheprovider -k cuda)
if [ $REHEARSAL -eq 1 ]; then
  # tests/kernels collected as a whole (every module imported, as the GPU stages import them),
  # and the GPU stages' tests found among them
  run_stage collect 60 "$PY" -m pytest -q -p no:cacheprovider --collect-only tests/kernels
  ids="$TMP/collect.log"
  n=$(grep -E '^tests/kernels/(test_cuda_parity\.py|test_splat\.py::test_cuda_matches_cpu_reference|test_bindings\.py)' "$ids" | grep -c cuda)
  for s in parity side_stream memcheck; do
    emit "{\"stage\": \"$s\", \"ok\": $([ "$n" -gt 0 ] && echo true || echo false), \"tests\": $n, \"rehearsed\": \"collected only (no GPU)\"}"
  done
  [ "$n" -gt 0 ] || status=1
else
  run_stage parity 25 env CUDA_LAUNCH_BLOCKING=1 NF_KERNEL_CHECKS=1 "${PYTEST[@]}" "${CUDA_TESTS[@]}"
fi

# ---------------------------------------------------------------------------------- train
# A nerf and a splat job through `python -m service.embedded` (API + Celery worker, the
# filesystem broker, SQLite), the only stage with the wheel set on PYTHONPATH. The splat job
# seeds random points: triangulating seeds needs pycolmap, which the wheel set leaves out.
t0=$(date +%s)
if [ $REHEARSAL -eq 1 ]; then
  TRAIN_LIMIT=120
  TRAIN_ARGS=(--device cpu --steps 5 --size 24 --views 6 --timeout 100
    --nerf-config '{"samples_per_step": 1024, "occupancy_resolution": 32, "max_samples_per_ray": 64}'
    --splat-config '{"seed_points": "random", "n_init_points": 500}')
else
  TRAIN_LIMIT=75
  TRAIN_ARGS=(--device cuda --steps 200 --timeout 55 --splat-config '{"seed_points": "random"}')
fi
PYTHONPATH="$TRAIN_PYTHONPATH" timeout -k 5 $TRAIN_LIMIT "$PY" -m experiments.gpu_train_check "${TRAIN_ARGS[@]}" \
  >"$TMP/train.out" 2>"$TMP/train.log"
rc=$?
while read -r l; do case "$l" in '{'*) emit "$l" ;; esac; done <"$TMP/train.out"
cat "$TMP/train.out" >>"$TMP/train.log"
run_stage_done=$(stage_line train "$rc" "$t0" "$TRAIN_LIMIT" "$TMP/train.log" "{\"device\": \"${TRAIN_ARGS[1]}\"}")
emit "$run_stage_done"
if [ $rc -eq 0 ]; then keep_log train "$TMP/train.log" true; else status=1; keep_log train "$TMP/train.log" false; fi

# ---------------------------------------------------------------------------------- sanitizers
if [ $REHEARSAL -eq 1 ]; then
  found=$(grep -cxF "${TILED[0]}" "$ids")
  emit "{\"stage\": \"racecheck\", \"ok\": $([ "$found" -eq 1 ] && echo true || echo false), \"tests\": $found, \"rehearsed\": \"collected only (no GPU)\"}"
  [ "$found" -eq 1 ] || status=1
else
  run_stage side_stream 20 env KERNELS_TEST_STREAM=side "${PYTEST[@]}" "${CUDA_TESTS[@]}"
  if [ -n "$SAN" ] && [ -n "$FILTER" ]; then
    # No caching allocator: each tensor is its own allocation, so a read past it is caught. Only
    # our kernels (namespace kn_cuda) are instrumented; torch's, the references' among them, run
    # at full speed.
    run_stage memcheck 60 env PYTORCH_NO_CUDA_MEMORY_CACHING=1 "$SAN" --tool memcheck \
      "$FILTER" kns=kn_cuda --error-exitcode 1 --report-api-errors no --target-processes all \
      "${PYTEST[@]}" "${CUDA_TESTS[@]}"
    run_stage racecheck 20 "$SAN" --tool racecheck "$FILTER" kns=tiled_ --error-exitcode 1 \
      --target-processes all "${PYTEST[@]}" "${TILED[@]}"
  else
    emit '{"stage": "sanitizer", "ok": false, "error": "compute-sanitizer or its kernel filter not found (preflight)"}'
    status=1
  fi
fi

# ---------------------------------------------------------------------------------- bench
t0=$(date +%s)
OPS=hash_grid,hash_grid_2d,sh,composite,march,bitfield
if [ $REHEARSAL -eq 1 ]; then
  # both modules imported, the ops named here known to the benchmark
  BENCH=("$PY" -c "import sys, experiments.kernels_bench as k, experiments.splat_bench; u = set('$OPS'.split(',')) - set(k.BENCHES); sys.exit(f'kernels_bench has no {sorted(u)}' if u else 0)")
  SBENCH=(true)
else
  BENCH=("$PY" -m experiments.kernels_bench --device cuda --ops $OPS)
  SBENCH=("$PY" -m experiments.splat_bench --device cuda --sizes 2500,40000)
fi
timeout -k 5 12 "${BENCH[@]}" >"$TMP/bench.out" 2>"$TMP/bench.log"
rc1=$?
timeout -k 5 8 "${SBENCH[@]}" >>"$TMP/bench.out" 2>>"$TMP/bench.log"
rc2=$?
while read -r l; do case "$l" in '{'*) emit "$l" ;; esac; done <"$TMP/bench.out"
rc=$((rc1 != 0 ? rc1 : rc2))
emit "$(stage_line bench "$rc" "$t0" 20 "$TMP/bench.log" "{\"kernels_bench_rc\": $rc1, \"splat_bench_rc\": $rc2}")"
if [ $rc -eq 0 ]; then keep_log bench "$TMP/bench.log" true; else status=1; keep_log bench "$TMP/bench.log" false; fi

emit "{\"stage\": \"done\", \"ok\": $([ $status -eq 0 ] && echo true || echo false), \"mode\": \"$([ $REHEARSAL -eq 1 ] && echo rehearsal || echo gpu)\", \"seconds\": $(($(date +%s) - T_START))}"
exit $status
