"""`pip install ./clients/python` in a fresh virtual environment, as a user of the service does:
it brings httpx and nothing of the server (no torch, pycolmap, PyAV, boto3 or psycopg), and the
`nf` it installs runs a job end to end against the real stack (API + worker subprocesses)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import venv

import numpy as np
import pytest
from PIL import Image

from tests.support.stack import REPO, TEST_KEY, png_bytes

pytestmark = pytest.mark.slow  # `make test-fast` leaves it out

SERVER_ONLY = ["torch", "pycolmap", "av", "boto3", "psycopg", "fastapi", "celery", "sqlalchemy"]
# What httpx brings (and what a fresh venv has); anything else came from somewhere it should not.
EXPECTED = {
    "neural-field-client",
    "httpx",
    "httpcore",
    "h11",
    "anyio",
    "idna",
    "certifi",
    "sniffio",
    "typing-extensions",
    "exceptiongroup",
    "pip",
    "setuptools",
}


@pytest.fixture(scope="module")
def client_venv(tmp_path_factory):
    """A fresh venv (no system site packages) with the client installed; its bin/ folder."""
    root = tmp_path_factory.mktemp("client-venv")
    # A copy, so the build's build/ and egg-info folders land outside the checkout.
    src = root / "python"
    shutil.copytree(
        REPO / "clients" / "python",
        src,
        ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"),
    )
    env_dir = root / "venv"
    venv.EnvBuilder(with_pip=True, system_site_packages=False).create(env_dir)
    bindir = env_dir / "bin"
    r = subprocess.run(
        [
            str(bindir / "python"),
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "-q",
            str(src),
        ],
        cwd=root,
        env=_clean_env(bindir),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return bindir


def _clean_env(bindir) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "NF_URL", "NF_API_KEY")
    }
    env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
    return env


def test_the_client_brings_nothing_of_the_server(client_venv, tmp_path):
    probe = (
        "import importlib.util, json, importlib.metadata as md;"
        f"mods = {SERVER_ONLY!r} + ['service', 'core', 'worker', 'kernels', 'api_schemas'];"
        "print(json.dumps({'found': [m for m in mods if importlib.util.find_spec(m)],"
        " 'dists': sorted({d.metadata['Name'].lower().replace('_', '-')"
        " for d in md.distributions()})}))"
    )
    r = subprocess.run(
        [str(client_venv / "python"), "-c", probe],
        cwd=tmp_path,  # not the checkout, whose packages would import from the current folder
        env=_clean_env(client_venv),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["found"] == [], f"importable in the client's venv: {got['found']}"
    assert set(got["dists"]) <= EXPECTED, f"unexpected packages: {set(got['dists']) - EXPECTED}"
    assert "httpx" in got["dists"] and "neural-field-client" in got["dists"]


def test_its_nf_runs_a_job_end_to_end(client_venv, fs_stack, tmp_path):
    env = _clean_env(client_venv)
    env.update(NF_URL=fs_stack.base_url, NF_API_KEY=TEST_KEY)
    nf = shutil.which("nf", path=str(client_venv))
    assert nf and nf.startswith(str(client_venv))

    def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            [nf, *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )

    photo = tmp_path / "photo.png"
    photo.write_bytes(png_bytes(40, 30))
    sub = run("submit", str(photo), "--config", '{"steps": 200, "resolution": 32}', "--wait")
    assert sub.returncode == 0, sub.stderr + fs_stack.logs()
    job_id = sub.stdout.splitlines()[0].strip()
    assert f"job {job_id} succeeded" in sub.stdout and "psnr=" in sub.stdout
    assert "step 200/200" in sub.stderr, sub.stderr  # the progress line, from the event stream

    st = run("status", job_id, "--json")
    assert st.returncode == 0 and json.loads(st.stdout)["status"] == "succeeded", st.stderr
    assert job_id in run("list").stdout

    frame = tmp_path / "frame.png"
    r = run("render", job_id, "--width", "80", "--height", "60", "--out", str(frame))
    assert r.returncode == 0, r.stderr
    img = np.asarray(Image.open(frame).convert("RGB"))
    assert img.shape == (60, 80, 3) and img.std() > 10

    ckpt = tmp_path / "job.safetensors"
    d = run("download", job_id, "--out", str(ckpt))
    assert d.returncode == 0 and ckpt.stat().st_size > 1000, d.stderr

    db = run("db", "upgrade")  # the server's command: not in the client's venv
    assert db.returncode == 1 and "server package" in db.stderr, db.stderr
    assert "Traceback" not in db.stderr
