"""A finished build loads as it is: no compiler, ninja or nvcc (the worker image's runtime stage
has none of them), as long as the sources, the torch build and, for CUDA, the architectures are
the ones it was built for."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernels import _ext

REPO = Path(__file__).resolve().parents[2]


def test_a_finished_cpu_build_loads_with_no_compiler_ninja_or_nvcc(
    cpu_ext, splat_cpu_ext, tmp_path
):
    # A PATH holding only python: no ninja, no c++, no nvcc; CXX names no compiler either.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(sys.executable)
    env = {
        **os.environ,
        "PATH": str(bin_dir),
        "CXX": "no-such-cxx-1234",
        "CUDA_HOME": str(tmp_path / "no-cuda"),
        "KERNELS_BUILD_DIR": str(_ext.build_dir()),
    }
    code = "import kernels._ext as e; print(e.load_cpu().__file__); print(e.load(e.SPLAT, 'cpu').__file__)"
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=240
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == [cpu_ext.__file__, splat_cpu_ext.__file__]


def test_the_stamp_names_the_library_and_the_torch_build(cpu_ext):
    out = _ext.library_dir(_ext.NERF, "cpu")
    stamp = json.loads((out / _ext.COMPLETE).read_text())
    assert stamp == {
        "library": Path(cpu_ext.__file__).name,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }
    assert _ext.complete_build(_ext.NERF, "cpu") == cpu_ext.__file__


@pytest.fixture
def claimed_cuda(monkeypatch, tmp_path, cpu_ext):
    """This CPU torch claiming a CUDA build, with no nvcc anywhere, an empty build folder and
    torch.ops.load_library recording what it is asked to load."""
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(_ext, "nvcc_path", lambda: None)
    monkeypatch.setattr(_ext, "_loaded", dict(_ext._loaded))  # the CPU library stays loaded
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    loaded = []
    monkeypatch.setattr(torch.ops, "load_library", loaded.append)
    # library_dir reads KERNELS_BUILD_DIR: the CPU entries above are already in _loaded
    monkeypatch.setenv("KERNELS_BUILD_DIR", str(tmp_path / "build"))
    return loaded


def fake_cuda_build(arch_list: str) -> Path:
    """A CUDA build folder as a finished build under TORCH_CUDA_ARCH_LIST=arch_list leaves it."""
    out = _ext.library_dir(_ext.NERF, "cuda")
    out.mkdir(parents=True)
    library = out / f"{out.name}.so"
    library.write_bytes(b"\x7fELF")
    old = os.environ["TORCH_CUDA_ARCH_LIST"]
    os.environ["TORCH_CUDA_ARCH_LIST"] = arch_list
    try:
        _ext._write_stamp(out, str(library), "cuda", _ext.cuda_arch_flags())
    finally:
        os.environ["TORCH_CUDA_ARCH_LIST"] = old
    return library


def test_a_complete_cuda_build_loads_with_no_nvcc(claimed_cuda):
    library = fake_cuda_build("9.0")
    ops = _ext.load(_ext.NERF, "cuda")
    assert claimed_cuda == [str(library)]
    assert ops.__file__ == str(library)


def test_without_a_complete_build_nvcc_is_demanded(claimed_cuda):
    with pytest.raises(_ext.KernelBuildError, match="nvcc"):
        _ext.load(_ext.NERF, "cuda")
    # a build for other architectures is not complete for these
    fake_cuda_build("8.0")
    with pytest.raises(_ext.KernelBuildError, match="nvcc"):
        _ext.load(_ext.NERF, "cuda")
    assert claimed_cuda == []


def test_a_build_for_another_torch_is_not_complete(claimed_cuda, monkeypatch):
    fake_cuda_build("9.0")
    monkeypatch.setattr(torch, "__version__", "0.0.0+other")
    assert _ext.complete_build(_ext.NERF, "cuda") is None
    with pytest.raises(_ext.KernelBuildError, match="nvcc"):
        _ext.load(_ext.NERF, "cuda")


def test_cuda_objects_carry_line_info_for_the_sanitizer_reports(tmp_path):
    for ext in _ext.EXTENSIONS:
        for src in ext.cuda_sources:
            assert "-lineinfo" in src.flags()
            if _ext.nvcc_path() is not None:
                assert "-lineinfo" in _ext.nvcc_command(src, tmp_path / "x.o", ["-arch=sm_90"])
