"""A virtual environment holding the lent GPU machine's Python packages and nothing else, for the
rehearsal of scripts/gpu_check.sh on a CPU (tests/deploy/test_gpu_check.py).

The lent machine's packages are listed in scripts/gpu_machine_packages.txt. This environment
takes, of the distributions installed in the running one (the project's .venv: CPU torch 2.13.0
in place of that machine's CUDA torch), exactly those on the list, linked into its site-packages
file by top-level entry from each distribution's RECORD. Everything else (psycopg, FastAPI,
Celery, pydantic, the project itself) is absent: a stage that imports it fails here as it would
there. A top-level folder shared with a distribution off the list (`__pycache__`, a namespace
package) is made a real folder holding only the listed distributions' entries.

    python -m tests.support.gpu_machine /tmp/gpu-venv     # make one by hand
"""

from __future__ import annotations

import re
import subprocess
import sys
import sysconfig
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MACHINE_PACKAGES = REPO / "scripts" / "gpu_machine_packages.txt"


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def machine_packages() -> set[str]:
    lines = MACHINE_PACKAGES.read_text().splitlines()
    return {norm(x.split("#")[0].strip()) for x in lines if x.split("#")[0].strip()}


def _binaries(dist, source: Path) -> list[Path]:
    """A distribution's compiled programs in the environment's bin/ (ninja's, say); its Python
    scripts are left out, since their #! names the source environment's interpreter."""
    out = []
    for f in dist.files or ():
        if Path(str(f)).parts[:1] == ("..",):
            path = (source / str(f)).resolve()
            if path.parent.name == "bin" and path.is_file():
                with open(path, "rb") as fh:
                    if fh.read(4) == b"\x7fELF":
                        out.append(path)
    return out


def _entries(dist) -> set[tuple[str, ...]]:
    """The (top-level,) and (top-level, second-level) path parts of a distribution's files inside
    site-packages (scripts in ../../bin left out)."""
    out = set()
    for f in dist.files or ():
        parts = Path(str(f)).parts
        if not parts or parts[0] == "..":
            continue
        out.add(parts[:1])
        if len(parts) > 1:
            out.add(parts[:2])
    return out


def make(venv: Path, source_site: str | None = None) -> Path:
    """Creates `venv` (no pip of its own: the listed pip is linked in) and returns its python."""
    source = Path(source_site or sysconfig.get_paths()["purelib"])
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120
    )
    python = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout.strip()
    )
    wanted = machine_packages()
    owners: dict[tuple[str, ...], set[bool]] = {}
    keep: set[tuple[str, ...]] = set()
    for dist in metadata.distributions(path=[str(source)]):
        listed = norm(dist.metadata["Name"] or "") in wanted
        if listed:
            for program in _binaries(dist, source):
                if not (venv / "bin" / program.name).exists():
                    (venv / "bin" / program.name).symlink_to(program)
        for entry in _entries(dist):
            owners.setdefault(entry, set()).add(listed)
            if listed:
                keep.add(entry)
    for entry in sorted(e for e in keep if len(e) == 1):
        if owners[entry] == {True}:
            (site / entry[0]).symlink_to(source / entry[0])
        else:  # shared with a distribution off the list: only the listed ones' entries
            (site / entry[0]).mkdir(exist_ok=True)
            for sub in sorted(e for e in keep if len(e) == 2 and e[0] == entry[0]):
                if (source / Path(*sub)).exists() and not (site / Path(*sub)).exists():
                    (site / Path(*sub)).symlink_to(source / Path(*sub))
    return python


if __name__ == "__main__":
    print(make(Path(sys.argv[1])))
