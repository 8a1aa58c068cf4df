"""The images hold what the processes compose starts in them need (checked without building them).

The API image installs the base dependencies only and copies only some packages; the API is
imported and served here with everything else made unimportable, as it is in that image."""

from __future__ import annotations

import fnmatch
import re
import subprocess
import sys
import tomllib

import pytest

from tests.support.compose_local import REPO, argv_of, load_compose

API_DOCKERFILE = REPO / "docker" / "api.Dockerfile"
WORKER_DOCKERFILE = REPO / "docker" / "worker.Dockerfile"
PROJECT_PACKAGES = {"api_schemas", "core", "service", "worker", "kernels"}
# Distribution name -> import name, where they differ.
IMPORT_NAMES = {"scikit-image": "skimage", "pyyaml": "yaml"}

# Runs in a fresh interpreter: refuse the blocked modules, import the API the way uvicorn does,
# and serve a few requests in-process.
API_PROBE = r"""
import importlib, importlib.abc, sys
blocked = set(sys.argv[1].split(","))

class NotInImage(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in blocked:
            raise ModuleNotFoundError(f"No module named {name!r} (not in the API image)")

sys.meta_path.insert(0, NotInImage())
module, attr = sys.argv[2].split(":")
app = getattr(importlib.import_module(module), attr)
from fastapi.testclient import TestClient
with TestClient(app) as client:
    for path in ("/healthz", "/readyz", "/", "/openapi.json"):
        r = client.get(path)
        assert r.status_code == 200, (path, r.status_code, r.text[:300])
leaked = sorted(blocked & {m.split(".")[0] for m in sys.modules})
assert not leaked, leaked
print("ok")
"""


def _copied_packages(dockerfile) -> set[str]:
    return {
        m.group(1) for m in re.finditer(r"^COPY\s+(\w+)\s+\./\1\s*$", dockerfile.read_text(), re.M)
    }


def _extras_modules() -> set[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    base = {re.split(r"[\[<>=!~; ]", d, maxsplit=1)[0].lower() for d in project["dependencies"]}
    names = set()
    for deps in project.get("optional-dependencies", {}).values():
        for dep in deps:
            name = re.split(r"[\[<>=!~; ]", dep, maxsplit=1)[0].lower()
            if name not in base:
                names.add(IMPORT_NAMES.get(name, name.replace("-", "_")))
    return names


def test_api_image_serves_without_torch_or_worker_code(tmp_path):
    copied = _copied_packages(API_DOCKERFILE)
    assert copied and copied <= PROJECT_PACKAGES
    blocked = (PROJECT_PACKAGES - copied) | _extras_modules()
    assert {"torch", "worker"} <= blocked

    command = argv_of(
        load_compose(REPO / "docker-compose.yml", env={})["services"]["api"]["command"]
    )
    assert command[0] == "uvicorn"
    target = command[1]
    env = {"PATH": "/usr/bin:/bin", "DATA_DIR": str(tmp_path / "data"), "HOME": str(tmp_path)}
    r = subprocess.run(
        [sys.executable, "-c", API_PROBE, ",".join(sorted(blocked)), target],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


def test_worker_image_copies_every_package_but_the_api():
    assert _copied_packages(WORKER_DOCKERFILE) == PROJECT_PACKAGES - {"service"}


@pytest.mark.parametrize("dockerfile", [API_DOCKERFILE, WORKER_DOCKERFILE], ids=["api", "worker"])
def test_copied_paths_exist_and_reach_the_build_context(dockerfile):
    ignored = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    sources = []
    for line in dockerfile.read_text().splitlines():
        if line.startswith("COPY ") and "--from" not in line:
            sources += line.split()[1:-1]
    assert sources
    for src in sources:
        assert (REPO / src).exists(), f"{dockerfile.name}: COPY {src}: no such path"
        assert not any(fnmatch.fnmatch(src.rstrip("/"), pat) for pat in ignored), (
            f"{src} is in .dockerignore"
        )


def test_worker_image_build_step_accepts_what_compose_passes():
    """`RUN python -m kernels.build ${KERNELS_BUILD_ARGS}`: the module exists and takes the flags
    the GPU and CPU compose files pass (its --help, so nothing is compiled here)."""
    steps = re.findall(r"^RUN\s+python3?\s+-m\s+([\w.]+)(.*)$", WORKER_DOCKERFILE.read_text(), re.M)
    assert [name for name, _ in steps] == ["kernels.build"]
    assert "${KERNELS_BUILD_ARGS}" in steps[0][1]
    r = subprocess.run(
        [sys.executable, "-m", "kernels.build", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    for path in (REPO / "docker-compose.yml", REPO / "docker-compose.cpu.yml"):
        args = load_compose(path, env={})["services"]["worker-train"]["build"]["args"]
        for flag in str(args.get("KERNELS_BUILD_ARGS", "")).split():
            assert flag in r.stdout, (
                f"{path.name} passes {flag} to kernels.build, which does not take it"
            )
