#!/usr/bin/env bash
# Fetches into .whl/ (gitignored) the wheels that scripts/gpu_check.sh's training stage needs on a
# GPU machine whose Python holds torch, numpy, scikit-image, safetensors and ninja but not the
# service's own packages (FastAPI, Celery, pydantic, ...). gpu_check.sh installs .whl/*.whl into
# /tmp/site and puts it on PYTHONPATH when the folder is there. Run it where pip reaches PyPI:
#   scripts/gpu_wheels.sh                 # wheels for CPython 3.12 on x86-64 Linux
#   PYVER=3.11 scripts/gpu_wheels.sh
# Left behind, to stay small (~20 MB instead of ~100): numpy, and the video and COLMAP readers
# (av, pycolmap: ~70 MB), which the check's posed synthetic upload never imports.
set -euo pipefail
cd "$(dirname "$0")/.."
PYVER=${PYVER:-3.12}
PIP=${PIP:-.venv/bin/pip}
SKIP="torch numpy av pycolmap scikit-image safetensors ninja"

reqs=$(python3 - "$SKIP" <<'PYEOF'
import re, sys, tomllib
skip = set(sys.argv[1].split())
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
for req in project["dependencies"] + project["optional-dependencies"]["worker"]:
    name = re.split(r"[\[<>=!~; ]", req, maxsplit=1)[0].lower()
    if name not in skip:
        print(req)
PYEOF
)
rm -rf .whl
mkdir .whl
platforms=()
for p in manylinux_2_34_x86_64 manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 \
  manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
# shellcheck disable=SC2086
"$PIP" download -q --only-binary=:all: --python-version "$PYVER" --implementation cp \
  "${platforms[@]}" -d .whl $reqs
for name in $SKIP; do
  rm -f .whl/"${name//-/_}"-[0-9]*.whl
done
ls .whl | sed 's/-[0-9].*//' | sort | uniq -d | grep . && { echo "two versions of one package in .whl" >&2; exit 1; }
du -sh .whl
