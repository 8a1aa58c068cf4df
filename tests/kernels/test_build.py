import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_py(code_or_args, env_extra, tmp_path):
    env = {**os.environ, "KERNELS_BUILD_DIR": str(tmp_path / "build"), **env_extra}
    args = [sys.executable, *code_or_args]
    return subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def test_missing_compiler_is_named(tmp_path):
    r = run_py(
        ["-c", "import kernels._ext as e; e.load_cpu()"], {"CXX": "no-such-cxx-1234"}, tmp_path
    )
    assert r.returncode != 0
    assert "KernelBuildError" in r.stderr and "no-such-cxx-1234" in r.stderr


def test_missing_ninja_is_named(tmp_path):
    # A PATH with only python: neither ninja nor the compiler can be found.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(sys.executable)
    r = run_py(["-c", "import kernels._ext as e; e.load_cpu()"], {"PATH": str(bin_dir)}, tmp_path)
    assert r.returncode != 0
    assert "KernelBuildError" in r.stderr and "ninja" in r.stderr


def test_compile_error_is_reported(tmp_path, monkeypatch):
    from kernels import _ext

    bad = tmp_path / "csrc"
    bad.mkdir()
    for src in _ext.CSRC.iterdir():
        (bad / src.name).write_text(src.read_text())
    (bad / "cpu_ops.cpp").write_text('#include "does_not_exist.h"\n')
    monkeypatch.setattr(_ext, "CSRC", bad)
    monkeypatch.setattr(_ext, "_loaded", {})
    monkeypatch.setenv("KERNELS_BUILD_DIR", str(tmp_path / "build"))
    with pytest.raises(_ext.KernelBuildError, match="does_not_exist.h"):
        _ext.load_cpu()


def test_build_entry_point(cpu_ext, splat_cpu_ext):
    # Uses the real cache (both extensions built by the fixtures), so this is a load plus a smoke
    # call of every op.
    env = {k: v for k, v in os.environ.items() if k != "KERNELS_BUILD_DIR"}
    r = subprocess.run(
        [sys.executable, "-m", "kernels.build"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    cpu = next(x for x in lines if x["backend"] == "cpu")
    assert cpu["ok"] and all(Path(m).exists() for m in cpu["modules"])
    assert any(x["backend"] == "cuda" for x in lines)


def test_stale_lock_of_a_killed_builder_does_not_block(cpu_ext):
    # cpp_extension's baton file, as a builder killed mid-build leaves it in the real cache.
    from kernels import _ext

    folder = Path(cpu_ext.__file__).parent
    (folder / "lock").touch()
    env = {k: v for k, v in os.environ.items() if k != "KERNELS_BUILD_DIR"}
    env["KERNELS_BUILD_DIR"] = str(_ext.build_dir())
    r = subprocess.run(
        [sys.executable, "-c", "import kernels._ext as e; print(e.load_cpu().__file__)"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == cpu_ext.__file__


def test_cuda_arch_list_becomes_gencode_flags(monkeypatch):
    from kernels import _ext

    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0;9.0+PTX")
    assert _ext.cuda_arch_flags() == [
        "-gencode=arch=compute_80,code=sm_80",
        "-gencode=arch=compute_90,code=sm_90",
        "-gencode=arch=compute_90,code=compute_90",
    ]
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "sm80")
    with pytest.raises(_ext.KernelBuildError, match="sm80"):
        _ext.cuda_arch_flags()
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST")
    import torch

    if not torch.cuda.is_available():
        with pytest.raises(_ext.KernelBuildError, match="TORCH_CUDA_ARCH_LIST"):
            _ext.cuda_arch_flags()
