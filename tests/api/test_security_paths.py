"""Client-supplied ids and names never reach a path unchecked, and checkpoints are never
unpickled: traversal ids and artifact names over real HTTP, planted files outside a job's
folder stay out of reach, and a pickle posing as a checkpoint is skipped, not executed."""

from __future__ import annotations

import json
import pickle
import re
import uuid
from pathlib import Path

import pytest
import torch

from core.settings import Settings
from service.auth import id_secret, key_id
from tests.support.stack import REPO, TEST_KEY, png_bytes
from worker.checkpoints import CheckpointManager

# Percent-encoded so no client library normalises them away; the server decodes them.
BAD_IDS = [
    "..",
    "%2e%2e",
    "..%2f..%2fsecret.txt",
    "%2e%2e%2f%2e%2e%2fsecret.txt",
    "evil",
    "not-a-uuid",
    "0" * 37,
    "a" * 4000,
    "%00",
    "%2fetc%2fpasswd",
    "12345678-1234-1234-1234-1234567890ab%2f..%2fx",
]
BAD_NAMES = [
    "%2e%2e",
    "..%2fjob.json",
    "%2e%2e%2fjob.json",
    "..%2f..%2f..%2fsecret.txt",
    ".hidden",
    "job.json",
    "link.png",
    "a%00b",
    "x" * 200,
    "%2fetc%2fpasswd",
    "sub%2fthing.png",
    "..%5cjob.json",
]


class Boom:
    """Unpickling this writes a marker file: the proof that something unpickled it."""

    marker: str = ""

    def __reduce__(self):
        return (Path.write_text, (Path(self.marker), "unpickled!"))


def _pickle_bomb(marker: Path) -> bytes:
    Boom.marker = str(marker)
    return pickle.dumps({"w": Boom()})


def _owner_id(stack) -> str:
    """The test key's id as this stack writes it (HMAC under the deployment's secret)."""
    return key_id(TEST_KEY, id_secret(Settings(data_dir=stack.data_dir, key_id_secret=None)))


@pytest.fixture(scope="module")
def trained(fs_stack):
    r = fs_stack.submit(png_bytes(20, 16), config={"steps": 30, "resolution": 16})
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    assert fs_stack.wait_status(job_id, "succeeded", "failed")["status"] == "succeeded"
    # Bait: a secret beside the jobs folder, and a job-looking folder with a non-UUID name that
    # even says it belongs to this key.
    (fs_stack.data_dir / "secret.txt").write_text("top secret")
    evil = fs_stack.data_dir / "jobs" / "evil"
    evil.mkdir(exist_ok=True)
    (evil / "job.json").write_text(json.dumps(fs_stack.client.get(f"/v1/jobs/{job_id}").json()))
    (evil / "owner").write_text(_owner_id(fs_stack))
    return job_id


def _routes(job_id: str):
    return [
        ("GET", f"/v1/jobs/{job_id}"),
        ("GET", f"/v1/jobs/{job_id}/events"),
        ("GET", f"/v1/jobs/{job_id}/artifacts"),
        ("GET", f"/v1/jobs/{job_id}/artifacts/reconstruction.png"),
        ("GET", f"/v1/jobs/{job_id}/checkpoint"),
        ("POST", f"/v1/jobs/{job_id}/render"),
        ("POST", f"/v1/jobs/{job_id}/render/path"),
        ("POST", f"/v1/jobs/{job_id}/cancel"),
        ("DELETE", f"/v1/jobs/{job_id}"),
    ]


def _refused(r, allowed=(404, 405, 422)):
    assert r.status_code in allowed, (r.request.url, r.status_code, r.text[:300])
    assert "top secret" not in r.text and b"top secret" not in r.content
    if r.headers.get("content-type", "").startswith("application/json"):
        assert isinstance(r.json()["detail"], str)


@pytest.mark.parametrize("bad", BAD_IDS)
def test_traversal_and_malformed_job_ids(fs_stack, trained, bad):
    before = sorted(
        p.relative_to(fs_stack.data_dir)
        for p in fs_stack.data_dir.rglob("*")
        if "broker" not in p.parts
    )
    for method, path in _routes(bad):
        body = (
            {"width": 8, "height": 8, "orbit": {"radius": 2, "n_frames": 2}}
            if method == "POST"
            else None
        )
        _refused(fs_stack.client.request(method, path, json=body))
    after = sorted(
        p.relative_to(fs_stack.data_dir)
        for p in fs_stack.data_dir.rglob("*")
        if "broker" not in p.parts
    )
    assert (fs_stack.data_dir / "secret.txt").read_text() == "top secret"
    assert [p for p in after if p not in before and "results" not in p.parts] == []


def test_non_uuid_folders_are_invisible(fs_stack, trained):
    assert fs_stack.client.get("/v1/jobs/evil").status_code == 404
    listed = [
        j["id"] for j in fs_stack.client.get("/v1/jobs", params={"limit": 500}).json()["items"]
    ]
    assert trained in listed and "evil" not in listed
    # Other spellings of the same UUID reach the same job, through its canonical folder only.
    for spelling in (trained.upper(), trained.replace("-", ""), f"urn:uuid:{trained}"):
        r = fs_stack.client.get(f"/v1/jobs/{spelling}")
        assert r.status_code == 200 and r.json()["id"] == trained


@pytest.mark.parametrize("name", BAD_NAMES)
def test_artifact_names(fs_stack, trained, name):
    artifacts = fs_stack.job_dir(trained) / "artifacts"
    link = artifacts / "link.png"
    if not link.is_symlink():
        link.symlink_to(fs_stack.data_dir / "secret.txt")
    (artifacts / ".hidden").write_text("top secret")
    _refused(fs_stack.client.get(f"/v1/jobs/{trained}/artifacts/{name}"))
    listed = [
        i["name"] for i in fs_stack.client.get(f"/v1/jobs/{trained}/artifacts").json()["items"]
    ]
    assert listed == ["reconstruction.png"]


def test_upload_filename_cannot_leave_the_job_folder(fs_stack):
    jobs = fs_stack.data_dir / "jobs"
    outside_before = {
        p for p in fs_stack.data_dir.rglob("*") if jobs not in p.parents and p != jobs
    }
    for evil in (
        "../../../escaped.png",
        "..\\..\\escaped.png",
        "/tmp/escaped.png",
        ".owner",
        "job.json",
    ):
        r = fs_stack.client.post(
            "/v1/jobs",
            data={"kind": "image", "config": json.dumps({"steps": 1, "resolution": 8})},
            files={"dataset": (evil, png_bytes(8, 8), "image/png")},
        )
        assert r.status_code == 202, r.text
        root = fs_stack.job_dir(r.json()["id"])
        assert not (root / "upload").exists()
        assert fs_stack.store().get(r.json()["id"]).id == r.json()["id"]
        assert fs_stack.store().owner_of(r.json()["id"]) == _owner_id(fs_stack)
    outside_after = {p for p in fs_stack.data_dir.rglob("*") if jobs not in p.parents and p != jobs}
    # broker/, results/ and the per-key index (keys/) are the service's own.
    new = {
        p
        for p in outside_after - outside_before
        if not {"broker", "results", "keys"} & set(p.parts)
    }
    assert new == set() and not Path("/tmp/escaped.png").exists()


def test_job_ids_are_made_by_the_server(fs_stack):
    chosen = str(uuid.uuid4())
    r = fs_stack.client.post(
        "/v1/jobs",
        data={
            "kind": "image",
            "id": chosen,
            "job_id": chosen,
            "config": json.dumps({"steps": 1, "resolution": 8}),
        },
        files={"dataset": ("p.png", png_bytes(8, 8), "image/png")},
    )
    assert r.status_code == 202
    made = r.json()["id"]
    assert made != chosen and uuid.UUID(made).version == 4 and not fs_stack.job_dir(chosen).exists()


def test_a_pickle_posing_as_a_checkpoint_is_never_unpickled(fs_stack, trained, tmp_path):
    folder = fs_stack.job_dir(trained) / "checkpoints"
    real = int((folder / "latest").read_text())
    marker = tmp_path / "unpickled"
    bomb = _pickle_bomb(marker)
    (folder / "step-999.json").write_text(json.dumps({"step": 999}))
    (folder / "step-999.safetensors").write_bytes(bomb)
    (folder / "latest").write_text("999")
    try:
        r = fs_stack.client.get(f"/v1/jobs/{trained}/checkpoint")
        assert r.status_code == 200 and r.headers["x-checkpoint-step"] == str(
            real
        )  # the API skipped it
        r = fs_stack.client.post(f"/v1/jobs/{trained}/render", json={"width": 8, "height": 8})
        assert (
            r.status_code == 200 and r.content[:4] == b"\x89PNG"
        )  # the worker fell back to the real step
        assert not marker.exists()
        # Same through the loader itself, with torch's own pickle format as the bait too.
        mgr = CheckpointManager(folder)
        assert mgr.load_latest().step == real
        torch.save({"w": Boom()}, folder / "step-999.safetensors")
        assert mgr.load_latest().step == real
        assert not marker.exists()
    finally:
        for p in ("step-999.json", "step-999.safetensors"):
            (folder / p).unlink(missing_ok=True)
        (folder / "latest").write_text(str(real))


def test_no_code_path_unpickles():
    """torch.load only with weights_only=True, no pickle/joblib/np allow_pickle, JSON-only Celery."""
    bad = []
    pattern = re.compile(
        r"torch\.load\(|pickle\.loads?\(|joblib\.load|allow_pickle\s*=\s*True|dill\."
    )
    for pkg in ("service", "worker", "kernels", "api_schemas"):
        for path in (REPO / pkg).rglob("*.py"):
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if pattern.search(line) and "weights_only=True" not in line:
                    bad.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert bad == []
    from core.celery_config import celery_config
    from core.settings import Settings

    cfg = celery_config(Settings(data_dir=REPO / "data"))
    assert (
        cfg["accept_content"] == ["json"]
        and cfg["task_serializer"] == cfg["result_serializer"] == "json"
    )
