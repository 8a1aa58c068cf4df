"""The compose files: valid for Compose, the topology the service needs, GPU and CPU variants in step."""

from __future__ import annotations

import copy
import os
import shutil
import subprocess

import pytest

from core.process import API_ONLY_ENV
from tests.support.compose_local import REPO, argv_of, environment_of, load_compose

GPU_FILE = REPO / "docker-compose.yml"
CPU_FILE = REPO / "docker-compose.cpu.yml"
GPU_WORKERS = ("worker-train", "worker-render")
WORKERS = (*GPU_WORKERS, "worker-preprocess")
INFRA = ("redis", "postgres", "minio", "minio-init")


def _gpu_devices(service: dict) -> list[dict]:
    return (((service.get("deploy") or {}).get("resources") or {}).get("reservations") or {}).get(
        "devices"
    ) or []


@pytest.mark.parametrize("path", [GPU_FILE, CPU_FILE], ids=["gpu", "cpu"])
def test_compose_config_validates(path, tmp_path):
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.skip(
            "docker-compose not installed (scripts/system_deps.sh installs Debian's package)"
        )
    # `config` resolves and validates the file against the Compose schema without an engine.
    r = subprocess.run(
        [exe, "-f", str(path), "config"], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert r.returncode == 0, r.stderr
    import yaml

    resolved = yaml.safe_load(r.stdout)
    assert set(resolved["services"]) == {*INFRA, "api", *WORKERS}


def test_multi_host_overrides_validate(tmp_path):
    """docker/compose.shared-redis.yml and docker/compose.shared-state.yml, as docs/deploy.md
    uses them on the host whose Redis, PostgreSQL and MinIO serve other hosts."""
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.skip(
            "docker-compose not installed (scripts/system_deps.sh installs Debian's package)"
        )
    import yaml

    files = [
        GPU_FILE,
        REPO / "docker" / "compose.shared-redis.yml",
        REPO / "docker" / "compose.shared-state.yml",
    ]
    args = [exe] + [a for f in files for a in ("-f", str(f))] + ["config"]
    env = {
        "PATH": os.environ["PATH"],
        "REDIS_PASSWORD": "s3cret",
        "POSTGRES_PASSWORD": "pg-s3cret",
        "AWS_ACCESS_KEY_ID": "nf-key",
        "AWS_SECRET_ACCESS_KEY": "s3-s3cret",
    }
    r = subprocess.run(args, capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    cfg = yaml.safe_load(r.stdout)
    assert "s3cret" in cfg["services"]["redis"]["command"]
    assert any(p["target"] == 6379 for p in cfg["services"]["redis"]["ports"])
    assert any(p["target"] == 5432 for p in cfg["services"]["postgres"]["ports"])
    assert cfg["services"]["postgres"]["environment"]["POSTGRES_PASSWORD"] == "pg-s3cret"
    minio = cfg["services"]["minio"]["environment"]
    assert (minio["MINIO_ROOT_USER"], minio["MINIO_ROOT_PASSWORD"]) == ("nf-key", "s3-s3cret")
    for name in ("api", *WORKERS):
        svc_env = cfg["services"][name]["environment"]
        assert svc_env["REDIS_URL"] == "redis://:s3cret@redis:6379/0"
        # The services log in with the same credentials the overridden servers were given.
        assert svc_env["PGPASSWORD"] == "pg-s3cret"
        assert (svc_env["AWS_ACCESS_KEY_ID"], svc_env["AWS_SECRET_ACCESS_KEY"]) == (
            "nf-key",
            "s3-s3cret",
        )
    assert "data" not in (cfg.get("volumes") or {})

    # Without a password each override refuses to publish its server.
    for unset in ("REDIS_PASSWORD", "POSTGRES_PASSWORD", "AWS_SECRET_ACCESS_KEY"):
        partial = {k: v for k, v in env.items() if k != unset}
        r = subprocess.run(
            args, capture_output=True, text=True, timeout=60, cwd=tmp_path, env=partial
        )
        assert r.returncode != 0 and unset in r.stderr, unset


def _volume_sources(service: dict) -> dict[str, str]:
    """Container path -> named volume."""
    out = {}
    for v in service.get("volumes") or []:
        src, target = (v["source"], v["target"]) if isinstance(v, dict) else str(v).split(":")[:2]
        out[target] = src
    return out


@pytest.mark.parametrize("path", [GPU_FILE, CPU_FILE], ids=["gpu", "cpu"])
def test_topology(path):
    services = load_compose(path, env={})["services"]

    redis = argv_of(services["redis"]["command"])
    assert redis[redis.index("--appendonly") + 1] == "yes"
    assert services["redis"]["healthcheck"]["test"]

    api = services["api"]
    assert argv_of(api["command"])[:2] == ["uvicorn", "service.app:app"]
    assert api["depends_on"]["redis"]["condition"] == "service_healthy"
    assert "/readyz" in " ".join(api["healthcheck"]["test"])
    assert any(str(p).endswith(":8000") for p in api["ports"])

    train = argv_of(services["worker-train"]["command"])
    assert train[train.index("-Q") + 1] == "train"
    assert train[train.index("-c") + 1] == "1"
    assert "--prefetch-multiplier=1" in train
    render = argv_of(services["worker-render"]["command"])
    assert render[render.index("-Q") + 1] == "render"
    preprocess = argv_of(services["worker-preprocess"]["command"])
    assert preprocess[preprocess.index("-Q") + 1] == "preprocess"

    # State in PostgreSQL, files in MinIO's bucket, both healthy before anything uses them.
    assert "pg_isready" in " ".join(services["postgres"]["healthcheck"]["test"])
    assert "/var/lib/postgresql/data" in _volume_sources(services["postgres"])
    assert services["minio"]["healthcheck"]["test"]
    assert "/data" in _volume_sources(services["minio"])
    init = services["minio-init"]
    assert init["depends_on"]["minio"]["condition"] == "service_healthy"
    assert "mc mb --ignore-existing" in " ".join(argv_of(init["command"]))
    assert environment_of(init)["STORAGE_URL"] == "s3://neural-field/nf"
    for name in ("api", *WORKERS):
        svc = services[name]
        env = environment_of(svc)
        assert env["DATA_DIR"] == "/data"
        assert env["REDIS_URL"] == "redis://redis:6379/0"
        assert env["DATABASE_URL"] == "postgresql+psycopg://nf@postgres:5432/nf"
        assert env["STORAGE_URL"] == environment_of(init)["STORAGE_URL"]
        assert env["S3_ENDPOINT_URL"] == "http://minio:9000"
        assert env["PGPASSWORD"] == environment_of(services["postgres"])["POSTGRES_PASSWORD"]
        minio_env = environment_of(services["minio"])
        assert (env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]) == (
            minio_env["MINIO_ROOT_USER"],
            minio_env["MINIO_ROOT_PASSWORD"],
        )
        assert svc["depends_on"]["redis"]["condition"] == "service_healthy"
        assert svc["depends_on"]["postgres"]["condition"] == "service_healthy"
        assert svc["depends_on"]["minio-init"]["condition"] == "service_completed_successfully"

    # No data volume is shared: API and workers meet only through Redis, PostgreSQL and the
    # bucket, so any of them can run on another host. The one volume they have in common is
    # the host's metric samples (PROMETHEUS_MULTIPROC_DIR), which holds no job data.
    apps = ("api", *WORKERS)
    for i, a in enumerate(apps):
        data_a = _volume_sources(services[a])["/data"]
        for b in apps[i + 1 :]:
            shared = set(_volume_sources(services[a]).values()) & set(
                _volume_sources(services[b]).values()
            )
            assert shared <= {"metrics"}, (a, b, shared)
            assert data_a != _volume_sources(services[b])["/data"]
    for name in apps:
        metrics_at = {t for t, s in _volume_sources(services[name]).items() if s == "metrics"}
        assert metrics_at == {environment_of(services[name])["PROMETHEUS_MULTIPROC_DIR"]}


def test_kernel_builds_come_from_the_image():
    """No volume over KERNELS_BUILD_DIR: it would keep an old build over a new image's (docs/deploy.md)."""
    for path in (GPU_FILE, CPU_FILE):
        services = load_compose(path, env={})["services"]
        for name in WORKERS:
            build_dir = environment_of(services[name])["KERNELS_BUILD_DIR"]
            targets = [str(v).split(":")[1] for v in services[name]["volumes"]]
            assert not any(
                build_dir == t or build_dir.startswith(t.rstrip("/") + "/") for t in targets
            ), name
    # ...and the image builds into the same directory that compose names.
    assert (
        "KERNELS_BUILD_DIR=/opt/kernels-build"
        in (REPO / "docker" / "worker.Dockerfile").read_text()
    )
    assert build_dir == "/opt/kernels-build"


def test_every_setting_reaches_every_service():
    """A setting added to core/settings.py must be forwarded by compose, or containers can't set it."""
    from core.settings import Settings

    # host/port are uvicorn's arguments; the polling interval is the embedded filesystem broker's.
    not_forwarded = {"host", "port", "broker_polling_interval_s"}
    wanted = {name.upper() for name in Settings.model_fields} - {n.upper() for n in not_forwarded}
    for path in (GPU_FILE, CPU_FILE):
        services = load_compose(path, env={})["services"]
        for name in ("api", *WORKERS):
            env = set(environment_of(services[name]))
            expected = wanted if name == "api" else wanted - set(API_ONLY_ENV)
            missing = expected - env
            assert not missing, f"{path.name}: {name} does not forward {sorted(missing)}"
            if name != "api":  # workers need no client key (core.process.API_ONLY_ENV)
                assert not env & set(API_ONLY_ENV), f"{path.name}: {name} gets the API's secrets"


def test_bare_settings_follow_the_host_environment():
    services = load_compose(GPU_FILE, env={"REDIS_URL": "redis://10.0.0.5:6379/2"})["services"]
    assert environment_of(services["worker-train"])["REDIS_URL"] == "redis://10.0.0.5:6379/2"
    assert environment_of(services["api"])["RENDER_TIMEOUT_S"] is None  # bare: passed through


def test_gpu_reservations():
    gpu = load_compose(GPU_FILE, env={})["services"]
    cpu = load_compose(CPU_FILE, env={})["services"]
    for name in GPU_WORKERS:
        devices = _gpu_devices(gpu[name])
        assert (
            devices and devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
        ), name
        assert not _gpu_devices(cpu[name]), name
    # Train replicas see every GPU and nf-gpu-slot gives each its own (see docker/bin/nf-gpu-slot).
    assert _gpu_devices(gpu["worker-train"])[0]["count"] == "all"
    assert argv_of(gpu["worker-train"]["command"])[0] == "nf-gpu-slot"
    for name in ("api", "redis", "worker-preprocess"):  # SfM runs on CPUs
        assert not _gpu_devices(gpu[name])


def test_cpu_file_is_the_gpu_file_without_gpus():
    """The CPU file is a copy (Compose overrides cannot remove a GPU reservation): keep it one."""

    def strip(services: dict) -> dict:
        out = copy.deepcopy(services)
        for name in WORKERS:
            out[name].pop("deploy", None)
            out[name]["build"].pop("args", None)
            out[name].pop("image", None)
        return out

    gpu = load_compose(GPU_FILE, env={})["services"]
    cpu = load_compose(CPU_FILE, env={})["services"]
    assert strip(gpu) == strip(cpu)
    assert cpu["worker-train"]["build"]["args"]["TORCH_INDEX_URL"].endswith("/cpu")
    assert "cuda" in gpu["worker-train"]["build"]["args"]["BASE_IMAGE"]
    assert "cuda" not in cpu["worker-train"]["build"]["args"]["BASE_IMAGE"]
    assert gpu["worker-train"]["image"] != cpu["worker-train"]["image"]
