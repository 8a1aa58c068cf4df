#!/usr/bin/env bash
# Builds the wheel set that scripts/gpu_check.sh's training stage installs on the lent GPU
# machine, which reaches no package index and lacks the service's packages: exactly the pins of
# scripts/gpu_wheels.txt, `pip download --no-deps` each, the pure-python wheel where one exists.
# Run it where pip reaches PyPI; the folder (default .whl/, gitignored) then travels with the
# device tool's `carry`, and gpu_check.sh installs it offline into /tmp/site.
#   scripts/gpu_wheels.sh                              # .whl/ for CPython 3.12 on x86-64 Linux
#   WHEEL_DIR=/tmp/w PYVER=3.11 scripts/gpu_wheels.sh  # for another interpreter (the CI rehearsal)
#   scripts/gpu_wheels.sh --check [DIR]                # the checks alone, on a folder already filled
# Prints one JSON line (wheels, mib, cap_mib, binary: the wheels that are not pure python, errors)
# and exits non-zero when a pin got no wheel or another version, a wheel is not in the list or is
# of a package the machine has (scripts/gpu_machine_packages.txt), or the set is over
# GPU_WHEELS_CAP_MIB (25).
set -euo pipefail
cd "$(dirname "$0")/.."
LIST=scripts/gpu_wheels.txt
MACHINE=scripts/gpu_machine_packages.txt
CAP=${GPU_WHEELS_CAP_MIB:-25}
PYVER=${PYVER:-3.12}
DIR=${WHEEL_DIR:-.whl}
# the interpreter whose pip downloads (any; the wheels are chosen by PYVER, not by it)
PIP_PY=${PIP_PYTHON:-}
if [ -z "$PIP_PY" ]; then
  if [ -x .venv/bin/python ]; then PIP_PY=.venv/bin/python; else PIP_PY=python3; fi
fi

check() {
  "$PIP_PY" - "$1" "$LIST" "$MACHINE" "$CAP" <<'PYEOF'
import json, re, sys
from pathlib import Path

folder, list_path, machine_path, cap = Path(sys.argv[1]), sys.argv[2], sys.argv[3], float(sys.argv[4])
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
lines = lambda p: [x.split("#")[0].strip() for x in open(p)]
pins = {}
for line in lines(list_path):
    if line:
        name, _, version = line.partition("==")
        pins[norm(name)] = version
machine = {norm(x) for x in lines(machine_path) if x}
errors = []
wheels = sorted(folder.glob("*.whl")) if folder.is_dir() else []
found = {}
for w in wheels:
    name, version = w.name.split("-")[:2]
    found.setdefault(norm(name), []).append(version)
for name, version in pins.items():
    got = found.get(name, [])
    if got != [version]:
        errors.append(f"{name}=={version}: found {got or 'no wheel'}")
for name in sorted(set(found) - set(pins)):
    errors.append(f"{name}: not in {list_path}")
for name in sorted(set(found) & machine):
    errors.append(f"{name}: the GPU machine has it ({machine_path})")
for name in sorted(set(pins) & machine):
    errors.append(f"{name}: pinned in {list_path}, but the GPU machine has it")
size = sum(w.stat().st_size for w in wheels)
mib = size / 2**20
if mib > cap:
    errors.append(f"the set is {mib:.1f} MiB, over its cap of {cap:g} MiB (GPU_WHEELS_CAP_MIB)")
binary = [w.name for w in wheels if not w.name.endswith("-none-any.whl")]
print(json.dumps({"wheel_set": str(folder), "ok": not errors, "wheels": len(wheels),
                  "bytes": size, "mib": round(mib, 2), "cap_mib": cap, "binary": binary,
                  "errors": errors}))
sys.exit(1 if errors else 0)
PYEOF
}

if [ "${1:-}" = "--check" ]; then
  check "${2:-$DIR}"
  exit $?
fi

platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
  manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
common=(-m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER"
  --implementation cp -d "$DIR")
rm -rf "$DIR"
mkdir -p "$DIR"
pure=()
while read -r pin; do
  pin=${pin%%#*}
  pin=${pin// /}
  [ -n "$pin" ] && pure+=("$pin")
done <"$LIST"
# Two pip runs: the pins that have a pure-python wheel (tagged none-any, it matches the platform
# `any`), then the manylinux wheels for PYVER of those that have none, which the first run names
# one at a time ("No matching distribution found for X").
binary=()
for _ in $(seq 0 "${#pure[@]}"); do
  [ ${#pure[@]} -gt 0 ] || break
  if log=$("$PIP_PY" "${common[@]}" --platform any "${pure[@]}" 2>&1); then
    break
  fi
  bad=$(grep -o "No matching distribution found for [^ ]*" <<<"$log" | awk '{print $NF}' | head -n 1)
  if [ -z "$bad" ]; then
    echo "$log" >&2
    echo "{\"wheel_set\": \"$DIR\", \"ok\": false, \"errors\": [\"pip download failed\"]}"
    exit 1
  fi
  binary+=("$bad")
  rest=()
  for p in "${pure[@]}"; do [ "$p" = "$bad" ] || rest+=("$p"); done
  pure=("${rest[@]}")
done
if [ ${#binary[@]} -gt 0 ] && ! "$PIP_PY" "${common[@]}" "${platforms[@]}" "${binary[@]}" >&2; then
  echo "{\"wheel_set\": \"$DIR\", \"ok\": false, \"errors\": [\"no wheel for ${binary[*]}\"]}"
  exit 1
fi
check "$DIR"
