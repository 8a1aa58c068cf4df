"""docker/bin/nf-gpu-slot: scaled train workers on one host each get their own GPU.

The GPUs are a stand-in `nvidia-smi` on PATH that lists them (the real one needs a GPU); the
wrapper, the locks and the exec into the worker command are the real ones."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.compose_local import REPO

WRAPPER = REPO / "docker" / "bin" / "nf-gpu-slot"

NVIDIA_SMI_L = """\
GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0a1b2c3d-0000-0000-0000-000000000000)
GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-0a1b2c3d-1111-1111-1111-111111111111)
"""

# Print the GPU this worker got, then hold it until the file named by argv[1] exists.
HOLDER = (
    "import os, sys, time\n"
    "print(os.environ['CUDA_VISIBLE_DEVICES'], flush=True)\n"
    "while not os.path.exists(sys.argv[1]): time.sleep(0.05)\n"
)


def _load_wrapper():
    loader = importlib.machinery.SourceFileLoader("nf_gpu_slot", str(WRAPPER))
    spec = importlib.util.spec_from_loader("nf_gpu_slot", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


@pytest.fixture
def gpu_host(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    smi = bindir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\ncat <<'EOF'\n{NVIDIA_SMI_L}EOF\n")
    smi.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env.update(
        PATH=f"{bindir}{os.pathsep}{env['PATH']}",
        GPU_SLOT_DIR=str(tmp_path / "slots"),
        GPU_SLOT_POLL_S="0.1",
    )
    return env, tmp_path


def _worker(env, release: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(WRAPPER), sys.executable, "-c", HOLDER, str(release)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_each_replica_gets_its_own_gpu_and_extra_ones_wait(gpu_host):
    env, tmp = gpu_host
    first, second = _worker(env, tmp / "release-1"), _worker(env, tmp / "release-2")
    third = None
    try:
        gpu_first, gpu_second = first.stdout.readline().strip(), second.stdout.readline().strip()
        assert {gpu_first, gpu_second} == {
            "GPU-0a1b2c3d-0000-0000-0000-000000000000",
            "GPU-0a1b2c3d-1111-1111-1111-111111111111",
        }

        # Both GPUs are held: a third replica waits instead of doubling up on one.
        third = _worker(env, tmp / "release-3")
        assert "waiting" in third.stderr.readline()
        assert third.poll() is None

        # The first worker exits (however it ends, the kernel drops its lock): the waiting
        # replica takes exactly the GPU that was freed.
        (tmp / "release-1").touch()
        first.wait(10)
        assert third.stdout.readline().strip() == gpu_first
        assert second.poll() is None
    finally:
        for name in ("release-1", "release-2", "release-3"):
            (tmp / name).touch()
        for p in (first, second, third):
            if p is not None:
                p.wait(10)


def test_no_gpu_or_explicit_pin_runs_the_command_unchanged(gpu_host, tmp_path):
    env, _ = gpu_host
    show = [
        sys.executable,
        "-c",
        "import os; print(os.environ.get('CUDA_VISIBLE_DEVICES', 'unset'))",
    ]
    pinned = subprocess.run(
        [sys.executable, str(WRAPPER), *show],
        env={**env, "CUDA_VISIBLE_DEVICES": "3"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert pinned.stdout.strip() == "3"

    # No nvidia-smi at all (CPU hosts, the CPU image): no pinning, no slot files.
    cpu_env = {
        **env,
        "PATH": os.pathsep.join(
            p for p in env["PATH"].split(os.pathsep) if not (Path(p) / "nvidia-smi").exists()
        ),
    }
    cpu = subprocess.run(
        [sys.executable, str(WRAPPER), *show],
        env=cpu_env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert cpu.returncode == 0 and cpu.stdout.strip() == "unset"
    assert not Path(env["GPU_SLOT_DIR"]).exists()


def test_partitioned_gpus_offer_their_mig_instances():
    listing = (
        "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-aaaa)\n"
        "  MIG 3g.40gb     Device  0: (UUID: MIG-1111)\n"
        "  MIG 3g.40gb     Device  1: (UUID: MIG-2222)\n"
        "GPU 1: NVIDIA A100-SXM4-80GB (UUID: GPU-bbbb)\n"
    )
    assert _load_wrapper().compute_devices(listing) == ["MIG-1111", "MIG-2222", "GPU-bbbb"]
