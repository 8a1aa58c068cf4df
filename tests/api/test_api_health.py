"""Probes, OpenAPI, the API's import boundary, and a broker outage."""

from __future__ import annotations

import subprocess
import sys

from tests.support.stack import REPO, TEST_KEY, Stack, free_port, png_bytes


def test_probes_and_openapi(stack_factory):
    stack = stack_factory(queues=None)
    assert stack.client.get("/healthz").json() == {"status": "ok"}
    ready = stack.client.get("/readyz").json()
    assert ready["checks"] == {"broker": True, "storage": True} and "image" in ready["kinds"]
    assert stack.client.get("/docs").status_code == 200
    paths = stack.client.get("/openapi.json").json()["paths"]
    for p in (
        "/v1/jobs",
        "/v1/jobs/{job_id}",
        "/v1/jobs/{job_id}/cancel",
        "/v1/jobs/{job_id}/render",
        "/healthz",
        "/readyz",
    ):
        assert p in paths, p
    upload = paths["/v1/jobs"]["post"]["requestBody"]["content"]["multipart/form-data"]["schema"]
    assert set(upload["required"]) == {"kind", "dataset"}


def test_api_never_imports_torch_or_worker():
    code = (
        "import sys, service.app; bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')"
        " or m == 'worker' or m.startswith('worker.')); print(bad); sys.exit(1 if bad else 0)"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "DATA_DIR": str(REPO / "data")},
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_broker_down_means_not_ready_and_nothing_kept(tmp_path):
    dead = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    (tmp_path / "data").mkdir()
    (tmp_path / "logs").mkdir()
    import os

    env = {
        **os.environ,
        "DATA_DIR": str(tmp_path / "data"),
        "REDIS_URL": dead,
        "API_KEYS": f"test:{TEST_KEY}",
    }
    stack = Stack(data_dir=tmp_path / "data", log_dir=tmp_path / "logs", env=env, port=free_port())
    try:
        stack.start_api(ready_path="/healthz")
        r = stack.client.get("/readyz")
        assert r.status_code == 503 and r.json()["checks"]["broker"] is False
        up = stack.submit(png_bytes(16, 16))
        assert up.status_code == 503 and "queue" in up.json()["detail"]
        assert stack.job_dirs() == []
    finally:
        stack.stop()
