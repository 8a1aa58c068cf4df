"""scripts/gpu_check.sh rehearsed on this CPU against the lent GPU machine as it is.

The lent machine (scripts/gpu_machine_packages.txt) reaches no package index and holds torch,
pytest and numpy but none of the service's packages. The rehearsal builds a virtual environment
holding exactly that machine's packages (tests/support/gpu_machine.py: this .venv's CPU torch in
place of its CUDA one), the wheel set scripts/gpu_wheels.sh downloads (for this interpreter; the
cp312 set that travels is checked against its cap), and runs `gpu_check.sh --rehearsal` in it:
the wheel set installed offline (--no-index --no-deps --target), the preflight, the CPU build,
tests/kernels collected, the training stage on the CPU through the real API and Celery worker,
the benchmarks' imports. It fails when the wheel set grows past its cap or holds a package that
machine has, and when a stage imports something that machine lacks (psycopg at collection, say).
Downloads the wheels from the package index (about 13 MiB, twice).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import gpu_machine

REPO = Path(__file__).resolve().parents[2]
CAP_MIB = 25
HERE = f"{sys.version_info.major}.{sys.version_info.minor}"
# The stages of a rehearsal, in order (gpu_train_check's own lines inside `train`'s).
REHEARSAL_STAGES = [
    "preflight",
    "build",
    "collect",
    "parity",
    "side_stream",
    "memcheck",
    "service",
    "nerf_upload",
    "nerf_train",
    "nerf_render",
    "splat_upload",
    "splat_train",
    "splat_render",
    "train",
    "racecheck",
    "bench",
    "done",
]


def wheels_script(*args: str, **env: str) -> tuple[int, dict, str]:
    r = subprocess.run(
        ["bash", "scripts/gpu_wheels.sh", *args],
        cwd=REPO,
        env={**os.environ, "PIP_PYTHON": sys.executable, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [x for x in r.stdout.splitlines() if x.startswith("{")]
    return r.returncode, json.loads(lines[-1]) if lines else {}, r.stderr[-3000:]


@pytest.fixture(scope="module")
def machine_wheels(tmp_path_factory) -> Path:
    """The wheel set as it travels: CPython 3.12 on x86-64 Linux."""
    folder = tmp_path_factory.mktemp("gpu-wheels") / "cp312"
    rc, info, err = wheels_script(WHEEL_DIR=str(folder), PYVER="3.12")
    assert rc == 0 and info.get("ok"), (info, err)
    return folder


@pytest.fixture(scope="module")
def local_wheels(tmp_path_factory, machine_wheels) -> Path:
    """The same pins for this interpreter, which the rehearsal installs."""
    if HERE == "3.12":
        return machine_wheels
    folder = tmp_path_factory.mktemp("gpu-wheels-here") / f"cp{HERE.replace('.', '')}"
    rc, info, err = wheels_script(WHEEL_DIR=str(folder), PYVER=HERE)
    assert rc == 0 and info.get("ok"), (info, err)
    return folder


@pytest.fixture(scope="module")
def machine_python(tmp_path_factory) -> Path:
    return gpu_machine.make(tmp_path_factory.mktemp("gpu-machine") / "venv")


@pytest.mark.slow
def test_the_wheel_set_holds_only_what_the_machine_lacks_under_its_cap(machine_wheels, tmp_path):
    rc, info, err = wheels_script("--check", str(machine_wheels))
    assert rc == 0 and info["ok"], (info, err)
    assert 0 < info["mib"] <= CAP_MIB and info["cap_mib"] == CAP_MIB
    assert not set(info["binary"]) - {
        w.name
        for w in machine_wheels.glob("*.whl")
        if "pydantic_core" in w.name or "pillow_heif" in w.name
    }, info["binary"]  # everything else pure python

    # the cap holds: the same set against a smaller one fails
    rc, info, _ = wheels_script(
        "--check", str(machine_wheels), GPU_WHEELS_CAP_MIB=str(info["mib"] / 2)
    )
    assert rc == 1 and any("over its cap" in e for e in info["errors"]), info

    # a wheel of a package the machine has, or one not pinned, is refused
    grown = tmp_path / "grown"
    shutil.copytree(machine_wheels, grown)
    (grown / "numpy-2.5.2-cp312-cp312-manylinux_2_28_x86_64.whl").write_bytes(b"")
    (grown / "boto3-1.44.18-py3-none-any.whl").write_bytes(b"")
    rc, info, _ = wheels_script("--check", str(grown))
    assert rc == 1, info
    assert any(e.startswith("numpy: the GPU machine has it") for e in info["errors"]), info
    assert any(e.startswith("boto3: not in") for e in info["errors"]), info


@pytest.mark.slow
def test_the_machine_environment_lacks_what_the_machine_lacks(machine_python, tmp_path):
    code = (
        "import importlib.util as u; "
        "print([m for m in ('psycopg', 'fastapi', 'celery', 'pydantic', 'sqlalchemy', 'boto3', "
        "'api_schemas') if u.find_spec(m)], [m for m in ('torch', 'pytest', 'numpy', 'PIL', "
        "'skimage', 'safetensors', 'httpx', 'prometheus_client', 'ninja') if not u.find_spec(m)])"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    r = subprocess.run(
        [str(machine_python), "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[] []"  # nothing of the service there; everything the list names


def test_db_kinds_at_collection_are_the_support_modules():
    from tests.conftest import DB_KINDS
    from tests.support.databases import KINDS

    assert DB_KINDS == KINDS


# Every stage runs under the lent machine's time limit (the preflight's 15 s, say): judged with
# nothing of ours beside it (`make test`), as its first stage timed out beside three workers.
@pytest.mark.slow
@pytest.mark.alone
def test_gpu_check_rehearsal_runs_every_stage_that_needs_no_gpu(
    machine_python, local_wheels, tmp_path
):
    from kernels import _ext

    # The CPU build, once, in this process: the rehearsal's build stage loads it from the cache
    # (same torch, same sources), as the lent machine's second run would.
    _ext.load_cpu()
    _ext.load(_ext.SPLAT, "cpu")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(
        PYTHON=str(machine_python),
        WHEEL_DIR=str(local_wheels),
        GPU_CHECK_SITE=str(tmp_path / "site"),
        OUT=str(tmp_path / "out"),
        KERNELS_BUILD_DIR=str(_ext.build_dir()),
    )
    r = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--rehearsal"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=480,
    )
    lines = [x for x in r.stdout.splitlines() if x.startswith("{")]
    rows = [json.loads(x) for x in lines]
    stages = [d for d in rows if "stage" in d]
    failed = [d for d in stages if not d.get("ok")]
    assert r.returncode == 0 and not failed, (failed, r.stderr[-6000:])
    assert [d["stage"] for d in stages] == REHEARSAL_STAGES
    # every line also in $OUT as its stage ends
    assert (tmp_path / "out" / "gpu_check.jsonl").read_text().splitlines() == lines
    pre = next(d for d in stages if d["stage"] == "preflight")
    assert pre["mode"] == "rehearsal" and pre["python_h_found"] and pre["service_packages"]
    assert pre["requirements_unmet"] == [] and pre["problems"] == []
    assert pre["wheels_install_rc"] == 0 and pre["site_installed"]
    by = {d["stage"]: d for d in stages}
    assert by["collect"]["collected"] > 100 and by["parity"]["tests"] > 10
    assert by["nerf_train"]["status"] == by["splat_train"]["status"] == "succeeded"
    assert any(d.get("backend") == "cpu" and d["ok"] for d in rows)
