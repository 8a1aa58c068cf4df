"""The package arrows of docs/architecture.md and no import circle inside a package, checked on
the source (an AST walk over every import, function-level ones included), and the style the tree
is kept in (ruff)."""

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


def module_graph(root: Path, package: str) -> dict[str, set[str]]:
    """module -> the package's modules it imports (function-level and relative imports too):
    `from a import b` points at a.b where that is a module, else at a."""
    paths = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        paths[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for module, path in paths.items():
        here = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = ".".join(
                    [*here[: len(here) - node.level + 1], node.module or ""]
                    if node.level
                    else [node.module or ""]
                ).strip(".")
                targets |= {
                    f"{base}.{a.name}" if f"{base}.{a.name}" in paths else base for a in node.names
                }
        graph[module] = {t for t in targets if t in paths and t != module}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_import_cycles_within_a_package(package):
    """A lazy import inside a function counts: it only moves the circle to run time."""
    graph = module_graph(REPO, package)
    assert sum(map(len, graph.values())) > (10 if package == "core" else 0)  # the walk sees them
    cycles = import_cycles(graph)
    assert not cycles, "\n".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_check_finds_lazy_and_relative_circles(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    for name, text in {
        "__init__.py": "",
        "a.py": "from pkg import b\n",
        "b.py": "def f():\n    from pkg.a import x\n",
        "c.py": "import pkg.a\nfrom pkg.sub import d\n",
        "sub/__init__.py": "",
        "sub/d.py": "from .. import c\n",
        "sub/e.py": "from . import d\nfrom pkg import a\n",
    }.items():
        (pkg / name).write_text(text)
    graph = module_graph(tmp_path, "pkg")
    assert graph["pkg.sub.d"] == {"pkg.c"} and graph["pkg.sub.e"] == {"pkg.sub.d", "pkg.a"}
    assert import_cycles(graph) == [["pkg.a", "pkg.b"], ["pkg.c", "pkg.sub.d"]]


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
