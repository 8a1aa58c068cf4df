"""scripts/gpu_check.sh's first stage: what this machine has for the check, as one JSON line.

    python scripts/gpu_preflight.py [--rehearsal] [--site /tmp/site] [--wheels .whl]

Reads versions and paths only (no kernel is built or run): Python, torch and its CUDA, the GPU,
Python.h (the extension build includes it), $CUDA_HOME/include/cuda_runtime.h, nvcc,
compute-sanitizer (and which kernel-filter option it takes), ninja, the C++ compiler, pytest,
and the wheel set installed into --site: whether the training stage's packages import from it,
and which of their declared requirements this machine's packages do not meet. `problems` names
what stops a stage; `ok` is true when there is none. scripts/gpu_check.sh installs the wheel set
just before and passes pip's exit status and time (--install-rc, --install-s). --rehearsal (a CPU machine rehearsing the
install) does not count a missing GPU, CUDA torch, CUDA toolkit or sanitizer as a problem.
Imports torch and, from --site, the service's packages; nothing of this repository.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

# Imported by the training stage (service.embedded: the API, a Celery worker, SQLite through
# SQLAlchemy and Alembic) and missing on the lent machine unless the wheel set brings them.
SERVICE_MODULES = (
    "fastapi",
    "starlette",
    "pydantic",
    "pydantic_settings",
    "uvicorn",
    "python_multipart",
    "sse_starlette",
    "pythonjsonlogger",
    "pillow_heif",
    "sqlalchemy",
    "alembic",
    "celery",
    "kombu",
)


def _run(cmd: list[str], timeout: float = 20) -> str:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"error: {exc}"
    return (r.stdout + r.stderr).strip()


def sanitizer_facts(path: str | None) -> dict:
    if not path:
        return {"compute_sanitizer": None}
    help_text = _run([path, "--help"])
    version = re.search(r"[Vv]ersion\s+(\S+)", _run([path, "--version"]))
    # --kernel-name (current releases) or --filter (older ones) limits instrumentation to the
    # kernels named (kns=<substring>).
    option = next((o for o in ("--kernel-name", "--filter") if o in help_text), None)
    return {
        "compute_sanitizer": path,
        "sanitizer_version": version.group(1) if version else None,
        "sanitizer_kernel_filter": option,
    }


def find_sanitizer(cuda_home: str | None) -> str | None:
    found = shutil.which("compute-sanitizer")
    for home in (cuda_home, "/usr/local/cuda"):
        if not found and home and (Path(home) / "bin" / "compute-sanitizer").exists():
            found = str(Path(home) / "bin" / "compute-sanitizer")
    return found


def wheel_facts(site: Path, wheels: Path) -> dict:
    files = sorted(wheels.glob("*.whl")) if wheels.is_dir() else []
    facts: dict = {
        "wheel_set": str(wheels),
        "wheels": len(files),
        "wheels_mib": round(sum(f.stat().st_size for f in files) / 2**20, 2),
        "site": str(site),
        "site_installed": site.is_dir() and any(site.iterdir()),
    }
    if facts["site_installed"]:
        sys.path.insert(0, str(site))
    missing = []
    for name in SERVICE_MODULES:
        try:
            importlib.import_module(name)
        except Exception as exc:  # ImportError, or a package that breaks on import
            missing.append(f"{name} ({type(exc).__name__}: {exc})"[:300])
    facts["service_packages"] = not missing
    if missing:
        facts["service_missing"] = missing
    facts["requirements_unmet"] = unmet_requirements(site) if facts["site_installed"] else []
    return facts


def unmet_requirements(site: Path) -> list[str] | str:
    """Each requirement a wheel-set distribution declares (no extras) that no installed
    distribution meets: the wheels were installed --no-deps beside the machine's own packages."""
    try:
        from importlib import metadata

        from packaging.requirements import Requirement
        from packaging.utils import canonicalize_name
    except ImportError:
        return "packaging is not installed: not checked"
    installed: dict[str, str] = {}
    for dist in metadata.distributions():  # sys.path, --site first
        name = canonicalize_name(dist.metadata["Name"] or "")
        installed.setdefault(name, dist.version)
    unmet = []
    for dist in metadata.distributions(path=[str(site)]):
        for spec in dist.requires or []:
            req = Requirement(spec)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            have = installed.get(canonicalize_name(req.name))
            if have is None or not req.specifier.contains(have, prereleases=True):
                unmet.append(f"{dist.metadata['Name']}: {req} (have {have or 'none'})")
    return sorted(set(unmet))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rehearsal", action="store_true", help="no GPU expected (a CPU machine)")
    ap.add_argument("--site", default="/tmp/site", help="where the wheel set was installed")
    ap.add_argument("--wheels", default=".whl", help="the wheel set's folder")
    ap.add_argument(
        "--install-rc", type=int, default=-1, help="pip's exit status installing it (-1: no set)"
    )
    ap.add_argument("--install-s", type=float, default=0, help="seconds the install took")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    d: dict = {"stage": "preflight", "mode": "rehearsal" if args.rehearsal else "gpu"}
    problems: list[str] = []
    d["python"] = sys.version.split()[0]
    d["executable"] = sys.executable
    include = sysconfig.get_paths().get("include") or ""
    d["python_h"] = str(Path(include) / "Python.h")
    d["python_h_found"] = (Path(include) / "Python.h").is_file()
    if not d["python_h_found"]:
        problems.append(f"no Python.h in {include!r}: the kernels' build needs Python's headers")
    try:
        import torch
    except Exception as exc:
        d.update(ok=False, problems=[f"torch does not import: {exc}"])
        print(json.dumps(d))
        return 1
    d["torch"] = torch.__version__
    d["torch_cuda"] = torch.version.cuda
    d["cuda_available"] = torch.cuda.is_available()
    if d["cuda_available"]:
        d["device"] = torch.cuda.get_device_name(0)
        d["capability"] = "{}.{}".format(*torch.cuda.get_device_capability(0))
        d["device_count"] = torch.cuda.device_count()
    smi = shutil.which("nvidia-smi")
    if smi:
        d["driver"] = _run([smi, "--query-gpu=driver_version", "--format=csv,noheader"]).split(
            "\n"
        )[0]
    try:
        import torch.utils.cpp_extension as cpp

        cuda_home = cpp.CUDA_HOME
    except Exception:
        cuda_home = None
    d["cuda_home"] = cuda_home
    header = Path(cuda_home or "/nonexistent") / "include" / "cuda_runtime.h"
    d["cuda_runtime_h_found"] = header.is_file()
    nvcc = Path(cuda_home) / "bin" / "nvcc" if cuda_home else None
    nvcc_path = str(nvcc) if nvcc and nvcc.exists() else shutil.which("nvcc")
    d["nvcc"] = nvcc_path
    if nvcc_path:
        release = re.search(r"release ([\d.]+)", _run([nvcc_path, "--version"]))
        d["nvcc_version"] = release.group(1) if release else None
    d.update(sanitizer_facts(find_sanitizer(cuda_home)))
    if not args.rehearsal:
        if torch.version.cuda is None:
            problems.append("torch has no CUDA (a CPU build)")
        elif not d["cuda_available"]:
            problems.append("torch sees no GPU")
        if not d["cuda_runtime_h_found"]:
            problems.append(f"no {header}: the CUDA library's build needs the toolkit's headers")
        if not nvcc_path:
            problems.append("no nvcc (CUDA_HOME or PATH)")
        if not d["compute_sanitizer"]:
            problems.append("no compute-sanitizer (CUDA toolkit bin)")
        elif not d.get("sanitizer_kernel_filter"):
            problems.append("compute-sanitizer takes neither --kernel-name nor --filter")
    d["ninja"] = shutil.which("ninja")
    cxx = os.environ.get("CXX", "c++")
    d["cxx"] = shutil.which(cxx)
    for tool, found in (("ninja", d["ninja"]), (f"C++ compiler {cxx!r}", d["cxx"])):
        if not found:
            problems.append(f"no {tool}: the kernels' build needs it")
    try:
        import pytest

        d["pytest"] = pytest.__version__
    except ImportError:
        d["pytest"] = None
        problems.append("pytest does not import: the kernel stages need it")
    d.update(wheel_facts(Path(args.site), Path(args.wheels)))
    d["wheels_install_rc"] = args.install_rc
    d["wheels_install_s"] = args.install_s
    if args.install_rc > 0:
        problems.append(
            f"the wheel set did not install offline (pip exit status {args.install_rc})"
        )
    if not d["service_packages"]:
        problems.append(
            "the training stage's packages do not import (carry the wheel set: scripts/gpu_wheels.sh)"
        )
    d["problems"] = problems
    d["ok"] = not problems
    d["seconds"] = round(time.monotonic() - t0, 1)
    print(json.dumps(d), flush=True)
    return 0 if d["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
