"""Builds and loads the compiled backends (JIT, cached).

The CPU extension is one translation unit compiled with g++ -O3 and OpenMP through
`torch.utils.cpp_extension.load` + ninja. The CUDA extension (only where torch has CUDA)
compiles the `.cu` launchers plus a torch binding. Build outputs live in `$KERNELS_BUILD_DIR`
or `<repo>/.kernels-build/`; the module name carries a hash of every source file, so an edited
header can never be served from a stale cache.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import sysconfig
import threading
from pathlib import Path

CSRC = Path(__file__).resolve().parent / "csrc"
CPU_SOURCES = ["cpu_ops.cpp"]
CUDA_SOURCES = [
    "cuda_binding.cpp",
    "hash_grid.cu",
    "sh.cu",
    "composite.cu",
    "occupancy.cu",
    "marching.cu",
]
HEADERS = [
    "common.h",
    "hash_grid.h",
    "sh.h",
    "composite.h",
    "occupancy.h",
    "marching.h",
    "launchers.h",
    "cuda_common.cuh",
]

_lock = threading.Lock()
_loaded: dict[str, object] = {}


class KernelBuildError(RuntimeError):
    """The compiled backend could not be built; the message names what is missing."""


def build_dir() -> Path:
    env = os.environ.get("KERNELS_BUILD_DIR")
    root = Path(env) if env else Path(__file__).resolve().parent.parent / ".kernels-build"
    return root


def _source_hash() -> str:
    # Only this extension's files: other extensions living in csrc/ must not force a rebuild.
    h = hashlib.sha256()
    for name in sorted(set(CPU_SOURCES + CUDA_SOURCES + HEADERS)):
        h.update(name.encode())
        h.update((CSRC / name).read_bytes())
    return h.hexdigest()[:12]


def _require_tools(compiler_env: str, default: str) -> None:
    missing = []
    try:
        import ninja  # noqa: F401  (the pip package puts the binary on PATH for cpp_extension)
    except ImportError:
        pass
    if shutil.which("ninja") is None:
        missing.append("ninja (pip install ninja, or apt-get install ninja-build)")
    cxx = os.environ.get(compiler_env, default)
    if shutil.which(cxx) is None:
        missing.append(f"C++ compiler '{cxx}' (apt-get install g++, or set ${compiler_env})")
    include = sysconfig.get_paths().get("include")
    if not include or not (Path(include) / "Python.h").exists():
        missing.append(
            f"Python headers (Python.h not found in {include}; apt-get install python3-dev)"
        )
    if missing:
        raise KernelBuildError("cannot build the kernels extension, missing: " + "; ".join(missing))


def load_cpu():
    """The CPU extension module, built on first use."""
    with _lock:
        if "cpu" in _loaded:
            return _loaded["cpu"]
        _require_tools("CXX", "c++")
        import torch.utils.cpp_extension as cpp

        name = f"kernels_cpu_{_source_hash()}"
        # One folder per source version: processes holding different checkouts never share objects.
        out = build_dir() / "cpu" / name
        out.mkdir(parents=True, exist_ok=True)
        try:
            mod = cpp.load(
                name=name,
                sources=[str(CSRC / s) for s in CPU_SOURCES],
                # -ffp-contract=off: no fused multiply-add, so cell indices and early stops match the
                # pure-torch reference exactly at boundaries. No -march=native: images run elsewhere.
                extra_cflags=["-O3", "-fopenmp", "-ffp-contract=off"],
                extra_ldflags=["-fopenmp"],
                extra_include_paths=[str(CSRC)],
                build_directory=str(out),
                verbose=bool(os.environ.get("KERNELS_VERBOSE")),
            )
        except Exception as exc:  # cpp_extension raises RuntimeError/OSError/CalledProcessError
            raise KernelBuildError(
                f"building the CPU kernels extension failed ({type(exc).__name__}): {exc}"
            ) from exc
        _loaded["cpu"] = mod
        return mod


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available() and torch.version.cuda is not None


def load_cuda():
    """The CUDA extension module (GPU machines only)."""
    with _lock:
        if "cuda" in _loaded:
            return _loaded["cuda"]
        import torch

        if torch.version.cuda is None:
            raise KernelBuildError(
                "cannot build the CUDA kernels: this torch build has no CUDA (torch.version.cuda is None)"
            )
        import torch.utils.cpp_extension as cpp

        if cpp.CUDA_HOME is None or shutil.which(str(Path(cpp.CUDA_HOME) / "bin" / "nvcc")) is None:
            raise KernelBuildError(
                "cannot build the CUDA kernels, missing: nvcc (set CUDA_HOME to a CUDA toolkit)"
            )
        _require_tools("CXX", "c++")
        name = f"kernels_cuda_{_source_hash()}"
        out = build_dir() / "cuda" / name
        out.mkdir(parents=True, exist_ok=True)
        try:
            mod = cpp.load(
                name=name,
                sources=[str(CSRC / s) for s in CUDA_SOURCES],
                extra_cflags=["-O3"],
                # --fmad=false for the same reason as -ffp-contract=off on the CPU.
                extra_cuda_cflags=["-O3", "--fmad=false", "-std=c++17"],
                extra_include_paths=[str(CSRC)],
                build_directory=str(out),
                verbose=bool(os.environ.get("KERNELS_VERBOSE")),
            )
        except Exception as exc:
            raise KernelBuildError(
                f"building the CUDA kernels extension failed ({type(exc).__name__}): {exc}"
            ) from exc
        _loaded["cuda"] = mod
        return mod


def for_tensor(t):
    """The compiled module that handles tensors on t's device."""
    if t.device.type == "cpu":
        return load_cpu()
    if t.device.type == "cuda":
        return load_cuda()
    raise KernelBuildError(
        f"no compiled kernels for device type '{t.device.type}' (use backend='reference')"
    )


if __name__ == "__main__":  # pragma: no cover
    print(load_cpu(), file=sys.stderr)
