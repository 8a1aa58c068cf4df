"""The one build backend for every compiled extension (JIT, cached).

Each extension (`NERF`, `SPLAT`) is a torch.library namespace (`torch.ops.nf`,
`torch.ops.nf_splat`) whose op schemas and argument checks are written once (`csrc/ops.h`). Two
shared libraries register kernels for it: the CPU library (one translation unit, g++ -O3 +
OpenMP), which also defines the schemas and so is always loaded first, and the CUDA library (only
where torch has CUDA), which registers the CUDA dispatch key. The dispatcher then picks the kernel
by the tensors' real device. The CUDA library links the extension's `.cu` launchers, which this
module compiles with nvcc itself: they include no torch header, and each source carries its own
flags (`--fmad=false` only where bit parity with the reference needs it). The CPU library and the
CUDA link go through `torch.utils.cpp_extension.load` + ninja. After the CPU library loads,
`kernels/_fake.py` registers every op's fake implementation (shapes, dtypes, devices) for
FakeTensor tracing and torch.compile.

Build outputs live in `$KERNELS_BUILD_DIR` or `<repo>/.kernels-build/`, one folder per source
version: the module name carries a hash of every file and flag of the extension, so an edited
header is never served from a stale cache. A build that finished leaves `complete.json` beside
its library (the torch build and, for CUDA, the architectures it was made for); a later process
with the same torch loads that library directly, with no compiler, ninja or nvcc: the worker
image compiles at image build and its runtime stage has no CUDA toolkit.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sysconfig
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

CSRC = Path(__file__).resolve().parent / "csrc"

# -ffp-contract=off: no fused multiply-add, so cell indices, march positions and early stops round
# like the pure-torch references. No -march=native: the images run on other machines.
CPU_CFLAGS = ("-O3", "-fopenmp", "-ffp-contract=off")
CPU_LDFLAGS = ("-fopenmp",)
# -lineinfo: source lines for compute-sanitizer and ncu reports; the machine code is the same.
NVCC_FLAGS = ("-O3", "-std=c++17", "-lineinfo", "-Xcompiler", "-fPIC")
# The CUDA counterpart of -ffp-contract=off, for the sources whose results must equal the reference
# bit for bit (march positions, occupancy cells); elsewhere FMA is faster and as accurate.
EXACT_FLAGS = ("--fmad=false",)


@dataclass(frozen=True)
class CudaSource:
    """One `.cu` file; `exact` compiles it without FMA contraction."""

    name: str
    exact: bool = False

    def flags(self) -> tuple[str, ...]:
        return NVCC_FLAGS + (EXACT_FLAGS if self.exact else ())


@dataclass(frozen=True)
class Extension:
    """A compiled extension: its op namespace, its CPU and CUDA libraries and the launchers the
    CUDA one links."""

    name: str
    namespace: str
    cpu_binding: str
    cuda_binding: str
    cuda_sources: tuple[CudaSource, ...]

    def files(self) -> list[str]:
        # Every header counts: the libraries share ops.h and binding_checks.h, which include the others.
        headers = {p.name for p in CSRC.iterdir() if p.suffix in (".h", ".cuh")}
        return sorted(
            {self.cpu_binding, self.cuda_binding, *headers} | {s.name for s in self.cuda_sources}
        )

    def source_hash(self) -> str:
        # Only this extension's files and flags: another extension's edit must not rebuild it.
        h = hashlib.sha256()
        for name in self.files():
            h.update(name.encode())
            h.update((CSRC / name).read_bytes())
        for s in self.cuda_sources:
            h.update(" ".join((s.name, *s.flags())).encode())
        h.update(" ".join(CPU_CFLAGS + CPU_LDFLAGS).encode())
        return h.hexdigest()[:12]


NERF = Extension(
    name="kernels",
    namespace="nf",
    cpu_binding="cpu_ops.cpp",
    cuda_binding="cuda_binding.cpp",
    cuda_sources=(
        CudaSource("hash_grid.cu"),
        CudaSource("sh.cu"),
        CudaSource("composite.cu"),
        CudaSource("occupancy.cu", exact=True),
        CudaSource("marching.cu", exact=True),
    ),
)

SPLAT = Extension(
    name="kernels_splat",
    namespace="nf_splat",
    cpu_binding="splat_cpu.cpp",
    cuda_binding="splat_cuda_binding.cpp",
    # No FMA ban: the splat parity tests compare with a tolerance, and cut-offs (alpha >= 1/255,
    # T < 1e-4) are tested on values FMA moves by an ulp at most.
    cuda_sources=(CudaSource("splat.cu"),),
)

EXTENSIONS = (NERF, SPLAT)

_lock = threading.Lock()
_loaded: dict[tuple[str, str], Ops] = {}


class KernelBuildError(RuntimeError):
    """The compiled backend could not be built; the message names what is missing."""


class Ops:
    """The ops of one extension, `torch.ops.<namespace>.<op>`, as attributes (`ops.sh_encode(...)`).

    Held once the library that registers them is loaded. The dispatcher picks each call's kernel
    by the tensors' device, whichever library's `Ops` the call went through; `__file__` is the
    library's path.
    """

    def __init__(self, ext: Extension, path: str):
        import torch

        self.__file__ = path
        ns = getattr(torch.ops, ext.namespace)
        for name in torch._C._dispatch_get_all_op_names():
            prefix, _, op = name.partition("::")
            if prefix == ext.namespace:
                setattr(self, op.split(".")[0], getattr(ns, op.split(".")[0]))


def build_dir() -> Path:
    env = os.environ.get("KERNELS_BUILD_DIR")
    return Path(env) if env else Path(__file__).resolve().parent.parent / ".kernels-build"


def library_dir(ext: Extension, device_type: str) -> Path:
    """The build folder of `ext`'s library for `device_type` ('cpu' or 'cuda') at this source
    version (its name is the library's: extension, device type, source hash)."""
    return build_dir() / device_type / f"{ext.name}_{device_type}_{ext.source_hash()}"


COMPLETE = "complete.json"


def _build_stamp(device_type: str, arch_flags: list[str] | None) -> dict:
    import torch

    stamp = {"torch": torch.__version__, "cuda": torch.version.cuda}
    if device_type == "cuda":
        stamp["arch"] = arch_flags
    return stamp


def complete_build(ext: Extension, device_type: str) -> str | None:
    """The library of a finished build of `ext` for `device_type` that this process can load as it
    is (same sources, same torch build, for CUDA the same architecture list), else None.

    Such a library is loaded without compiler, ninja or nvcc."""
    out = library_dir(ext, device_type)
    try:
        stamp = json.loads((out / COMPLETE).read_text())
    except (OSError, ValueError):
        return None
    arch = None
    if device_type == "cuda":
        try:
            arch = cuda_arch_flags()
        except KernelBuildError:
            return None
    library = out / str(stamp.get("library", ""))
    if {k: v for k, v in stamp.items() if k != "library"} != _build_stamp(device_type, arch):
        return None
    return str(library) if library.is_file() else None


def _write_stamp(out: Path, library: str, device_type: str, arch_flags: list[str] | None) -> None:
    stamp = {"library": Path(library).name, **_build_stamp(device_type, arch_flags)}
    tmp = out / f"{COMPLETE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(stamp))
    os.replace(tmp, out / COMPLETE)  # atomic: a reader sees the whole stamp or none


def _require_tools() -> None:
    missing = []
    try:
        import ninja  # noqa: F401  (the pip package puts the binary on PATH for cpp_extension)
    except ImportError:
        pass
    if shutil.which("ninja") is None:
        missing.append("ninja (pip install ninja, or apt-get install ninja-build)")
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        missing.append(f"C++ compiler '{cxx}' (apt-get install g++, or set $CXX)")
    include = sysconfig.get_paths().get("include")
    if not include or not (Path(include) / "Python.h").exists():
        missing.append(
            f"Python headers (Python.h not found in {include}; apt-get install python3-dev)"
        )
    if missing:
        raise KernelBuildError("cannot build the kernels extension, missing: " + "; ".join(missing))


def nvcc_path() -> str | None:
    """The nvcc of $CUDA_HOME (as torch finds it), else the one on PATH."""
    try:
        import torch.utils.cpp_extension as cpp

        home = cpp.CUDA_HOME
    except Exception:  # a broken torch install: fall back to PATH
        home = None
    if home and (Path(home) / "bin" / "nvcc").exists():
        return str(Path(home) / "bin" / "nvcc")
    return shutil.which("nvcc") or shutil.which("nvcc", path="/usr/local/cuda/bin")


def cuda_arch_flags() -> list[str]:
    """-gencode flags from $TORCH_CUDA_ARCH_LIST ("8.0;9.0", "+PTX" allowed), else the visible GPUs."""
    spec = os.environ.get("TORCH_CUDA_ARCH_LIST", "").replace(",", ";").replace(" ", ";")
    archs = [a for a in spec.split(";") if a]
    if not archs:
        import torch

        if not torch.cuda.is_available():
            raise KernelBuildError(
                "no GPU visible to pick the CUDA architecture: set TORCH_CUDA_ARCH_LIST "
                '(e.g. "8.0;9.0")'
            )
        caps = {torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())}
        archs = [f"{a}.{b}" for a, b in sorted(caps)]
    flags = []
    for a in archs:
        ptx = a.endswith("+PTX")
        num = a.removesuffix("+PTX").replace(".", "")
        if not num.isdigit():
            raise KernelBuildError(f"TORCH_CUDA_ARCH_LIST entry {a!r} is not like 8.0 or 9.0+PTX")
        flags.append(f"-gencode=arch=compute_{num},code=sm_{num}")
        if ptx:
            flags.append(f"-gencode=arch=compute_{num},code=compute_{num}")
    return flags


def nvcc_command(source: CudaSource, out: Path, arch_flags: list[str]) -> list[str]:
    """The nvcc command line that compiles one launcher source to an object file."""
    nvcc = nvcc_path()
    if nvcc is None:
        raise KernelBuildError("cannot build the CUDA kernels, missing: nvcc (set CUDA_HOME)")
    cmd = [nvcc, "-c", *source.flags(), *arch_flags, f"-I{CSRC}", str(CSRC / source.name)]
    return [*cmd, "-o", str(out)]


def _compile_objects(ext: Extension, out: Path, arch: list[str] | None = None) -> list[str]:
    arch = cuda_arch_flags() if arch is None else arch
    # Per architecture list: objects built for another GPU must not be linked for this one.
    objs = out / ("objects-" + hashlib.sha256(" ".join(arch).encode()).hexdigest()[:8])
    objs.mkdir(parents=True, exist_ok=True)

    def one(src: CudaSource) -> str:
        obj = objs / (src.name + ".o")
        if obj.exists():
            return str(obj)
        tmp = objs / f"{src.name}.{os.getpid()}.{threading.get_ident()}.tmp.o"
        r = subprocess.run(nvcc_command(src, tmp, arch), capture_output=True, text=True)
        if r.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise KernelBuildError(f"nvcc failed on {src.name}:\n{r.stderr[-4000:]}")
        os.replace(tmp, obj)  # atomic: a concurrent builder sees the whole object or none
        return str(obj)

    with ThreadPoolExecutor(
        max_workers=max(1, min(len(ext.cuda_sources), os.cpu_count() or 1))
    ) as ex:
        return list(ex.map(one, ext.cuda_sources))


def load(ext: Extension, device_type: str) -> Ops:
    """The ops of `ext` with the library for 'cpu' or 'cuda' tensors loaded, built on first use.

    The CUDA library registers kernels for ops the CPU library defines: it loads that one first.
    """
    key = (ext.name, device_type)
    ops = _loaded.get(key)  # without the lock: torch.compile traces this lookup, not a lock
    if ops is not None:
        return ops
    if device_type == "cuda":
        load(ext, "cpu")
    with _lock:
        if key in _loaded:
            return _loaded[key]
        if device_type not in ("cpu", "cuda"):
            raise KernelBuildError(
                f"no compiled kernels for device type {device_type!r} (use backend='reference')"
            )
        import torch

        if device_type == "cuda" and torch.version.cuda is None:
            raise KernelBuildError(
                "cannot build the CUDA kernels: this torch build has no CUDA (torch.version.cuda is None)"
            )
        # A finished build loads as it is: no compiler, ninja or nvcc is asked for.
        path = complete_build(ext, device_type)
        if path is not None:
            try:
                torch.ops.load_library(path)
            except OSError as exc:
                raise KernelBuildError(
                    f"the built {device_type.upper()} {ext.name} library {path} does not load "
                    f"({exc}); delete its folder to rebuild it"
                ) from exc
        else:
            path = _build(ext, device_type)
        if device_type == "cpu":
            from kernels import _fake

            _fake.register(ext.namespace)
        ops = Ops(ext, str(path))
        _loaded[key] = ops
        return ops


def _build(ext: Extension, device_type: str) -> str:
    """Builds (or lets ninja find up to date) and loads `ext`'s library for `device_type`; returns
    its path. Called with `_lock` held."""
    if device_type == "cuda" and nvcc_path() is None:
        raise KernelBuildError(
            "cannot build the CUDA kernels, missing: nvcc (set CUDA_HOME to a CUDA toolkit)"
        )
    _require_tools()
    import torch.utils.cpp_extension as cpp

    # One folder per source version: processes holding different checkouts never share objects.
    out = library_dir(ext, device_type)
    name = out.name
    out.mkdir(parents=True, exist_ok=True)
    arch = cuda_arch_flags() if device_type == "cuda" else None
    common = dict(
        name=name,
        extra_include_paths=[str(CSRC)],
        build_directory=str(out),
        verbose=bool(os.environ.get("KERNELS_VERBOSE")),
    )
    # cpp_extension serialises builders with a baton file that a killed builder leaves
    # behind, after which every later build waits forever. An flock dies with its holder:
    # whoever holds it is the only builder, so a baton it finds is stale.
    lock = open(out / "build.flock", "w")  # held until the build ends
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        (out / "lock").unlink(missing_ok=True)
        # is_python_module=False: torch.ops.load_library runs the registrations; no pybind.
        if device_type == "cpu":
            path = cpp.load(
                sources=[str(CSRC / ext.cpu_binding)],
                extra_cflags=list(CPU_CFLAGS),
                extra_ldflags=list(CPU_LDFLAGS),
                is_python_module=False,
                **common,
            )
        else:
            objects = _compile_objects(ext, out, arch)
            path = cpp.load(
                sources=[str(CSRC / ext.cuda_binding)],
                extra_cflags=["-O3"],
                extra_ldflags=objects,
                with_cuda=True,
                is_python_module=False,
                **common,
            )
        _write_stamp(out, str(path), device_type, arch)
    except KernelBuildError:
        raise
    except Exception as exc:  # cpp_extension raises RuntimeError/OSError/CalledProcessError
        raise KernelBuildError(
            f"building the {device_type.upper()} {ext.name} extension failed "
            f"({type(exc).__name__}): {exc}"
        ) from exc
    finally:
        lock.close()
    return str(path)


def load_cpu(ext: Extension = NERF):
    return load(ext, "cpu")


def load_cuda(ext: Extension = NERF):
    return load(ext, "cuda")


def for_tensor(t, ext: Extension = NERF) -> Ops:
    """The ops of `ext`, with the library that runs tensors like `t` loaded.

    The kernel is not chosen here: the dispatcher picks it by the tensors' real device. `t`'s
    device only says which library must be loaded. Fake and meta tensors run the fake
    implementations, registered with the CPU library: a fake 'cuda' tensor on a torch without
    CUDA needs no CUDA build.
    """
    ops = _loaded.get((ext.name, t.device.type))
    if ops is not None:
        return ops
    device_type = t.device.type
    if device_type == "meta" or (device_type == "cuda" and _fake_without_cuda(t)):
        device_type = "cpu"
    return load(ext, device_type)


def _fake_without_cuda(t) -> bool:
    import torch
    from torch._subclasses.fake_tensor import is_fake

    return torch.version.cuda is None and is_fake(t)


def cuda_op_names(ext: Extension) -> set[str]:
    """The ops the CUDA library of `ext` registers (the others run on the CPU only).

    Read from the source (`impl_nerf` / `impl_splat` in `csrc/ops.h`), so that it is known where
    the CUDA library cannot be built or loaded.
    """
    import re

    kind = "nerf" if ext is NERF else "splat"
    text = (CSRC / "ops.h").read_text()
    body = re.search(r"void impl_" + kind + r"\(torch::Library& m\) \{(.*?)\n\}", text, re.S)
    if body is None:
        raise KernelBuildError(f"csrc/ops.h has no impl_{kind}")
    return set(re.findall(r'm\.impl\("(\w+)"', body.group(1)))


def compiled_available(device: torch.device | str, ext: Extension = NERF) -> bool:
    """Whether the compiled kernels run on `device`, building them on first use.

    Args:
        device: a torch device or its name ("cpu", "cuda:1").
        ext: the extension to check (default: the NeRF ops).

    Returns:
        True when the extension builds or loads from the cache for that device type; False when
        the build fails (the failure is a KernelBuildError from any op called with backend="ext").
    """
    import torch

    try:
        load(ext, torch.device(device).type)
    except KernelBuildError:
        return False
    return True
