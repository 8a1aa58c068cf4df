"""The worker image's stages and variants, read without an engine: the image is a runtime stage
with no CUDA toolkit, compiler or headers that holds the kernels the build stage compiled, and the
variants (CUDA 13.0 by default, CUDA 12.8 for drivers older than 580 through
docker/compose.cu128.yml, CPU) pair a devel and a runtime base of one CUDA release with the torch
build of that release."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import yaml

from tests.support.compose_local import REPO, load_compose

DOCKERFILE = REPO / "docker" / "worker.Dockerfile"
GPU_FILE = REPO / "docker-compose.yml"
CPU_FILE = REPO / "docker-compose.cpu.yml"
CU128_FILE = REPO / "docker" / "compose.cu128.yml"
WORKERS = ("worker-train", "worker-render", "worker-preprocess")
BUILD_TOOLS = {"g++", "gcc", "python3-dev", "ninja-build", "build-essential", "cuda-toolkit"}


def instructions(text: str) -> list[str]:
    """The Dockerfile's instructions, continuation lines joined, comments dropped."""
    out, cur = [], ""
    for line in text.splitlines():
        if not cur and (not line.strip() or line.lstrip().startswith("#")):
            continue
        cur += line.rstrip("\\").strip() + " "
        if not line.endswith("\\"):
            out.append(cur.strip())
            cur = ""
    return out


def stages() -> tuple[dict[str, str], dict[str, list[str]], dict[str, str]]:
    """(global ARG defaults, stage name -> its instructions, stage name -> its FROM image)."""
    global_args: dict[str, str] = {}
    body: dict[str, list[str]] = {}
    base: dict[str, str] = {}
    current = None
    for ins in instructions(DOCKERFILE.read_text()):
        m = re.match(r"FROM\s+(\S+)\s+AS\s+(\S+)$", ins, re.I)
        if m:
            current = m.group(2)
            base[current], body[current] = m.group(1), []
        elif current is None:
            name, _, default = ins.removeprefix("ARG ").partition("=")
            global_args[name] = default.strip('"')
        else:
            body[current].append(ins)
    return global_args, body, base


def apt_packages(lines: list[str]) -> set[str]:
    words = set()
    for ins in lines:
        for m in re.finditer(r"apt-get install ([^&]*)", ins):
            words |= {w for w in m.group(1).split() if not w.startswith("-")}
    return words


def test_the_image_is_a_runtime_stage_without_the_build_tools():
    _, body, base = stages()
    assert list(body) == ["build", "runtime"]  # the last stage is the image
    assert base == {"build": "${BASE_IMAGE}", "runtime": "${RUNTIME_IMAGE}"}
    build, runtime = body["build"], body["runtime"]
    assert {"g++", "python3-dev", "ninja-build"} <= apt_packages(build)
    assert not apt_packages(runtime) & BUILD_TOOLS, apt_packages(runtime)
    assert "libgomp1" in apt_packages(runtime)  # the CPU libraries' OpenMP runtime
    assert not any("nvcc" in ins or "pip install" in ins for ins in runtime)
    # the kernels compile in the build stage only, and the runtime stage gets them and the venv
    assert any(ins.startswith("RUN python -m kernels.build") for ins in build)
    assert not any("kernels.build" in ins for ins in runtime)
    assert "COPY --from=build /opt/venv /opt/venv" in runtime
    assert "COPY --from=build --chown=app:app /opt/kernels-build /opt/kernels-build" in runtime
    # ...and checks at image build that every library is complete there (no compiler needed)
    assert any("complete_build" in ins for ins in runtime if ins.startswith("RUN python -c"))
    # the same sources at the same paths (the editable install and the libraries' source hashes)
    copies = {
        stage: {ins for ins in lines if re.match(r"COPY (\w+) \./\1$", ins)}
        for stage, lines in body.items()
    }
    assert copies["build"] and copies["build"] == copies["runtime"]
    # the architectures the CUDA library was built for, and the build folder, in both stages
    for stage in ("build", "runtime"):
        env = " ".join(ins for ins in body[stage] if ins.startswith("ENV "))
        assert "TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST}" in env, stage
        assert "KERNELS_BUILD_DIR=/opt/kernels-build" in env, stage
        assert "ARG TORCH_CUDA_ARCH_LIST" in body[stage], stage


def _cuda_pair(args: dict[str, str]) -> tuple[str, str]:
    devel = re.fullmatch(r"nvidia/cuda:(\d+)\.(\d+)\.\d+-devel-(ubuntu[\d.]+)", args["BASE_IMAGE"])
    runtime = re.fullmatch(
        r"nvidia/cuda:(\d+)\.(\d+)\.\d+-runtime-(ubuntu[\d.]+)", args["RUNTIME_IMAGE"]
    )
    assert devel and runtime, args
    assert devel.groups() == runtime.groups(), args  # one CUDA release, one Ubuntu release
    assert args["TORCH_INDEX_URL"].endswith(f"/cu{devel.group(1)}{devel.group(2)}"), args
    return devel.group(1), devel.group(2)


def _override_args() -> dict[str, dict[str, str]]:
    raw = yaml.safe_load(CU128_FILE.read_text())
    return {name: raw["services"][name]["build"]["args"] for name in WORKERS}


def test_each_variant_pairs_a_devel_and_a_runtime_base_with_its_torch_build():
    defaults, _, _ = stages()
    build_defaults = dict(
        re.match(r"ARG (\w+)=\"?([^\"]*)\"?$", ins).groups()
        for ins in stages()[1]["build"]
        if re.match(r"ARG \w+=", ins)
    )
    assert _cuda_pair({**defaults, **build_defaults}) == ("13", "0")
    gpu = load_compose(GPU_FILE, env={})["services"]
    cpu = load_compose(CPU_FILE, env={})["services"]
    override = _override_args()
    for name in WORKERS:
        assert _cuda_pair(gpu[name]["build"]["args"]) == ("13", "0")
        assert _cuda_pair({**gpu[name]["build"]["args"], **override[name]}) == ("12", "8")
        args = cpu[name]["build"]["args"]
        assert args["BASE_IMAGE"] == args["RUNTIME_IMAGE"] == "ubuntu:24.04"
        assert args["TORCH_INDEX_URL"].endswith("/cpu")


def test_every_build_argument_compose_passes_is_declared():
    defaults, body, _ = stages()
    declared = set(defaults) | {
        ins.split()[1].split("=")[0]
        for lines in body.values()
        for ins in lines
        if ins.startswith("ARG ")
    }
    override = _override_args()
    for path in (GPU_FILE, CPU_FILE):
        for name in WORKERS:
            passed = set(load_compose(path, env={})["services"][name]["build"]["args"])
            assert passed <= declared, (path.name, name, passed - declared)
            assert set(override[name]) <= declared


def test_the_cu128_override_validates_and_changes_only_the_worker_images(tmp_path):
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.skip(
            "docker-compose not installed (scripts/system_deps.sh installs Debian's package)"
        )
    r = subprocess.run(
        [exe, "-f", str(GPU_FILE), "-f", str(CU128_FILE), "config"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    merged = yaml.safe_load(r.stdout)["services"]
    base = yaml.safe_load(
        subprocess.run(
            [exe, "-f", str(GPU_FILE), "config"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
            check=True,
        ).stdout
    )["services"]
    for name, service in merged.items():
        if name not in WORKERS:
            assert service == base[name], name
            continue
        build = service["build"]
        assert build["dockerfile"] == "docker/worker.Dockerfile"
        assert build["args"]["KERNELS_BUILD_ARGS"] == "--require-cuda"  # kept from the base file
        assert _cuda_pair(build["args"]) == ("12", "8")
        assert service["image"].endswith("-cu128") and service["image"] != base[name]["image"]
