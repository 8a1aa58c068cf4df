"""The package arrows of docs/architecture.md, checked on the source (an AST walk over every
import, function-level ones included), and the style the tree is kept in (ruff)."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
OURS = {"api_schemas", "core", "service", "worker", "kernels", "experiments", "tests"}

# package -> top-level modules it must never import (ours or third-party).
FORBIDDEN = {
    "api_schemas": {
        "core",
        "service",
        "worker",
        "kernels",
        "experiments",
        "tests",
        "torch",
        "fastapi",
    },
    "core": {"service", "worker", "kernels", "experiments", "tests", "torch", "fastapi"},
    "service": {"worker", "kernels", "experiments", "tests", "torch"},
    "worker": {"service", "experiments", "tests", "fastapi"},
    "kernels": {"api_schemas", "core", "service", "worker", "experiments", "tests"},
}


def imported_roots(path: Path) -> set[tuple[str, int]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {(a.name.split(".")[0], node.lineno) for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add((node.module.split(".")[0], node.lineno))
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_follow_the_arrows(package):
    bad = []
    for path in sorted((REPO / package).rglob("*.py")):
        for root, line in imported_roots(path):
            if root in FORBIDDEN[package]:
                bad.append(f"{path.relative_to(REPO)}:{line} imports {root}")
    assert not bad, "\n".join(bad)


def test_the_walk_sees_function_level_imports(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from worker.jobs import x\n    import torch.nn\n")
    assert {root for root, _ in imported_roots(probe)} == {"worker", "torch"}


def test_installed_packages_are_the_ones_the_arrows_cover():
    import tomllib

    include = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"
    ]["find"]["include"]
    assert {p.rstrip("*") for p in include} == set(FORBIDDEN)


def _ruff() -> list[str]:
    exe = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if exe is None:
        pytest.skip("ruff is not installed (pip install '.[dev]')")
    return [exe]


def test_ruff_lint():
    r = subprocess.run([*_ruff(), "check", "."], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


def test_ruff_format():
    r = subprocess.run(
        [*_ruff(), "format", "--check", "."], cwd=REPO, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
