"""Readers of splat files that we did not write, for the export tests: npm packages installed from
tools/splat-readers/package-lock.json (PlayCanvas' splat-transform for ply, compressed ply, sog
and spz; Niantic's spz library in its WebAssembly build; glTF-Transform and Khronos'
glTF-Validator for the glb), run through tools/splat-readers/read.mjs.

    from tests.support.splat_readers import read
    got = read("splat-transform", path)   # -> what read.mjs prints (a dict)

`read` installs the packages on first use (`npm ci`, once per lock file: the lock's copy in
node_modules says they are current) and skips the test, with the reason, where node or npm is
absent; a failing install fails the test."""

from __future__ import annotations

import fcntl
import filecmp
import hashlib
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.support.stack import REPO

READERS = REPO / "tools" / "splat-readers"
NPM_CI_TIMEOUT_S = 600
READ_TIMEOUT_S = 120


def installed() -> Path:
    """tools/splat-readers with its node_modules current (npm ci when the lock file changed)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip(
            "node/npm are not installed (scripts/system_deps.sh installs them): the splat "
            "exports' npm readers cannot run"
        )
    # One install at a time (xdist workers, another run of this checkout): concurrent `npm ci`s
    # into one node_modules break each other; the one that waited then finds it current.
    with open(Path(tempfile.gettempdir()) / f"nf-splat-readers-{_checkout_tag()}.lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        _install(npm)
    return READERS


def _checkout_tag() -> str:
    return hashlib.sha256(str(READERS.resolve()).encode()).hexdigest()[:12]


def _install(npm: str) -> None:
    lock, stamp = READERS / "package-lock.json", READERS / "node_modules" / ".package-lock.json"
    current = stamp.exists() and (READERS / "node_modules" / ".nf-lock").exists()
    if current:
        current = filecmp.cmp(lock, READERS / "node_modules" / ".nf-lock", shallow=False)
    if not current:
        r = subprocess.run(
            [npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund"],
            cwd=READERS,
            capture_output=True,
            text=True,
            timeout=NPM_CI_TIMEOUT_S,
        )
        if r.returncode != 0:
            pytest.fail(f"npm ci in {READERS} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
        shutil.copyfile(lock, READERS / "node_modules" / ".nf-lock")


def read(reader: str, path: Path | str) -> dict:
    """What `node read.mjs <reader> <path>` found in the file (tools/splat-readers/read.mjs)."""
    cwd = installed()
    r = subprocess.run(
        [shutil.which("node"), "read.mjs", reader, str(path)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=READ_TIMEOUT_S,
    )
    assert r.returncode == 0, f"{reader} could not read {path}:\n{r.stderr[-3000:]}"
    return json.loads(r.stdout)
