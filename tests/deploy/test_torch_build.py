"""`make install` picks the torch build for the host (Makefile + scripts/torch_pip_args.sh).

Each case runs the real Makefile with `make -n` (print, do not run) against a throwaway venv
whose python has no torch, with pip's configuration replaced by a find-links folder of named
(empty) wheel files and `nvidia-smi` replaced by a script on PATH, then reads the pip command
make would run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PIP = Path(sys.executable).parent / "pip"
VERSION = "2.13.0"
PYTORCH_INDEX = "https://download.pytorch.org/whl"

pytestmark = pytest.mark.skipif(
    shutil.which("make") is None or not PIP.exists(), reason="needs make and the venv's pip"
)

SMI_HEADER = (
    "| NVIDIA-SMI 580.65.06   Driver Version: 580.65.06   CUDA Version: {cuda}     |\n"
    "| GPU  Name                 Persistence-M | Bus-Id        Disp.A |\n"
)


def _host(tmp_path: Path, *, smi: str | None, wheels: tuple[str, ...], has_torch=False) -> dict:
    """A fake venv, a find-links folder holding `wheels`, and `nvidia-smi` printing `smi` (None: a
    driver that finds no GPU, as `nvidia-smi` does on a host without one)."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    # python: the real one when torch is to be found, else one that fails `import torch`
    python = venv / "bin" / "python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable if has_torch else "false"} "$@"\n')
    python.chmod(0o755)
    (venv / "bin" / "pip").symlink_to(PIP)
    links = tmp_path / "wheelhouse"
    links.mkdir()
    for name in wheels:
        (links / name).touch()  # pip reads versions from the names only
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi_script = bin_dir / "nvidia-smi"
    if smi is None:
        smi_script.write_text(
            "#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.'\nexit 9\n"
        )
    else:
        smi_script.write_text(f"#!/bin/sh\ncat <<'EOF'\n{smi}EOF\n")
    smi_script.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "TORCH_"))}
    env.update(
        PATH=f"{bin_dir}:{os.environ['PATH']}",
        PIP_CONFIG_FILE=os.devnull,  # no pip.conf of this machine
        PIP_NO_INDEX="1",
        PIP_FIND_LINKS=str(links),
        PIP_DISABLE_PIP_VERSION_CHECK="1",
    )
    return {"venv": venv, "env": env}


def _make(host: dict, *args: str, dry_run: bool = True) -> subprocess.CompletedProcess:
    cmd = ["make", "-C", str(REPO), *(["-n"] if dry_run else []), "install", f"VENV={host['venv']}"]
    return subprocess.run(
        [*cmd, *args], env=host["env"], capture_output=True, text=True, timeout=60
    )


def _torch_line(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stdout.splitlines() if " install " in ln and "torch" in ln]
    assert len(lines) == 1, r.stdout
    return lines[0].split(" install ", 1)[1].strip()


def test_cpu_host_takes_the_cpu_release_the_configured_sources_carry(tmp_path):
    # This machine and CI: the +cpu wheel lies in a wheelhouse pip is configured with.
    host = _host(
        tmp_path,
        smi=None,
        wheels=(f"torch-{VERSION}-py3-none-any.whl", f"torch-{VERSION}+cpu-py3-none-any.whl"),
    )
    assert _torch_line(_make(host)) == f"torch=={VERSION}+cpu"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PyPI's Linux wheels are CUDA")
def test_cpu_host_with_only_pypi_wheels_takes_pytorch_cpu_index(tmp_path):
    host = _host(tmp_path, smi=None, wheels=(f"torch-{VERSION}-py3-none-any.whl",))
    assert _torch_line(_make(host)) == f"torch=={VERSION} --index-url {PYTORCH_INDEX}/cpu"


def test_cpu_host_keeps_a_configured_index(tmp_path):
    # An operator's mirror named as pip's index is used as it is, not bypassed.
    host = _host(tmp_path, smi=None, wheels=())
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    host["env"].pop("PIP_NO_INDEX")
    host["env"]["PIP_INDEX_URL"] = mirror.as_uri()
    assert _torch_line(_make(host)) == f"torch=={VERSION}"


@pytest.mark.parametrize(
    "driver_cuda, build", [("13.0", "cu130"), ("12.9", "cu128"), ("12.4", "cu126")]
)
def test_gpu_host_takes_the_cuda_build_its_driver_runs(tmp_path, driver_cuda, build):
    host = _host(
        tmp_path,
        smi=SMI_HEADER.format(cuda=driver_cuda),
        wheels=(f"torch-{VERSION}+cpu-py3-none-any.whl",),
    )
    assert _torch_line(_make(host)) == f"torch=={VERSION} --index-url {PYTORCH_INDEX}/{build}"


def test_sources_that_cannot_be_listed_leave_the_choice_to_pip(tmp_path):
    # Offline, or no torch at all in the sources: the plain pin, as before this choice existed,
    # rather than an index that may be out of reach.
    host = _host(tmp_path, smi=None, wheels=())
    assert _torch_line(_make(host)) == f"torch=={VERSION}"


def test_make_variables_override_the_detection(tmp_path):
    host = _host(
        tmp_path, smi=SMI_HEADER.format(cuda="13.0"), wheels=(f"torch-{VERSION}-py3-none-any.whl",)
    )
    assert _torch_line(_make(host, "TORCH_BUILD=cpu")) == (
        f"torch=={VERSION} --index-url {PYTORCH_INDEX}/cpu"
        if sys.platform.startswith("linux")
        else f"torch=={VERSION}"
    )
    cpu_host = _host(tmp_path / "cpu", smi=None, wheels=())
    assert _torch_line(_make(cpu_host, "TORCH_BUILD=cu126")) == (
        f"torch=={VERSION} --index-url {PYTORCH_INDEX}/cu126"
    )
    assert _torch_line(
        _make(cpu_host, "TORCH_INDEX_URL=https://mirror.example/torch", "TORCH_VERSION=2.12.0")
    ) == ("torch==2.12.0 --index-url https://mirror.example/torch")


def test_unknown_build_stops_make_with_the_choices(tmp_path):
    host = _host(tmp_path, smi=None, wheels=())
    r = _make(host, "TORCH_BUILD=rocm", dry_run=False)
    assert r.returncode != 0
    assert "TORCH_BUILD must be auto, cpu or a CUDA wheel index name" in r.stderr
    assert "install -e" not in r.stdout  # nothing was installed


def test_torch_already_in_the_venv_is_kept(tmp_path):
    host = _host(tmp_path, smi=SMI_HEADER.format(cuda="13.0"), wheels=(), has_torch=True)
    r = _make(host)
    assert r.returncode == 0, r.stderr
    assert "already installed" in r.stdout
    assert not [ln for ln in r.stdout.splitlines() if "install torch" in ln]
