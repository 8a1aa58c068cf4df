"""The API's file routes over both storage backends, through the real HTTP stack: the upload's
dataset stored through storage, artifacts listed and downloaded (local: served by the API;
S3: 302 to a presigned URL that serves the bytes), the checkpoint streamed with its meta in the
header, and a deleted job's files gone. The S3 side is boto3 against moto's server (a bucket of
its own, tests/support/s3.py); the API process shares no file with the bucket."""

from __future__ import annotations

import json
import os
import struct

import httpx
import pytest

from tests.support.stack import TEST_KEY, auth_headers, png_bytes

BOB = "bob-key-0123456789"
TENSOR = b"\x00\x00\x80\x3f\x00\x00\x00\x40"  # two float32: 1.0, 2.0


def _safetensors() -> bytes:
    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header + TENSOR


class Files:
    """Writes and lists a job's stored files the way a worker would leave them."""

    def __init__(self, stack, bucket=None):
        self.stack, self.bucket = stack, bucket

    def name(self, job_id: str, key: str) -> str:
        return f"{self.bucket.prefix}/jobs/{job_id}/{key}"

    def put(self, job_id: str, key: str, data: bytes) -> None:
        if self.bucket is None:
            path = self.stack.job_dir(job_id) / key
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        else:
            self.bucket.client.put_object(
                Bucket=self.bucket.bucket, Key=self.name(job_id, key), Body=data
            )

    def keys(self, job_id: str) -> list[str]:
        if self.bucket is None:
            root = self.stack.job_dir(job_id)
            return (
                sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
                if root.is_dir()
                else []
            )
        start = f"{self.bucket.prefix}/jobs/{job_id}/"
        return [k[len(start) :] for k in self.bucket.keys() if k.startswith(start)]


@pytest.fixture(params=["local", "s3"])
def files(request, stack_factory) -> Files:
    if request.param == "local":
        return Files(stack_factory(queues=None))
    bucket = request.getfixturevalue("s3_bucket")
    return Files(stack_factory(queues=None, env=bucket.env), bucket)


def test_upload_artifacts_checkpoint_and_delete(files):
    stack = files.stack
    photo = png_bytes(16, 16)
    r = stack.submit(photo, config={"steps": 20, "resolution": 16})
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    assert "dataset/image.png" in files.keys(job_id)
    if files.bucket is not None:
        body = files.bucket.client.get_object(
            Bucket=files.bucket.bucket, Key=files.name(job_id, "dataset/image.png")
        )["Body"].read()
        assert body == photo  # the stored upload, byte for byte
        # The API kept no copy: a worker elsewhere reads the bucket.
        assert not (stack.data_dir / "scratch" / "jobs" / job_id).exists()
        assert not (stack.job_dir(job_id) / "dataset").exists()

    # Artifacts as a worker leaves them.
    render = os.urandom(3000)
    files.put(job_id, "artifacts/reconstruction.png", render)
    files.put(job_id, "artifacts/sub/nested.png", b"not listed")
    listed = stack.client.get(f"/v1/jobs/{job_id}/artifacts").json()["items"]
    assert listed == [
        {
            "name": "reconstruction.png",
            "size": 3000,
            "url": f"/v1/jobs/{job_id}/artifacts/reconstruction.png",
        }
    ]
    r = stack.client.get(f"/v1/jobs/{job_id}/artifacts/reconstruction.png")
    if files.bucket is None:
        assert r.status_code == 200 and r.content == render
        assert 'filename="reconstruction.png"' in r.headers["content-disposition"]
    else:
        assert r.status_code == 302, r.text
        location = r.headers["location"]
        assert location.startswith(files.bucket.endpoint)
        got = httpx.get(location)  # no API key: the signature is the permission
        assert got.status_code == 200 and got.content == render
        assert 'filename="reconstruction.png"' in got.headers["content-disposition"]
        assert got.headers["content-type"] == "image/png"
    missing = stack.client.get(f"/v1/jobs/{job_id}/artifacts/nothing.png")
    assert missing.status_code == 404

    # The checkpoint: the newest readable step, meta moved into the safetensors header.
    assert stack.client.get(f"/v1/jobs/{job_id}/checkpoint").status_code == 404
    files.put(job_id, "checkpoints/step-5.json", json.dumps({"step": 5}).encode())
    files.put(job_id, "checkpoints/step-5.safetensors", _safetensors())
    files.put(job_id, "checkpoints/step-9.json", json.dumps({"step": 9}).encode())
    files.put(job_id, "checkpoints/step-9.safetensors", _safetensors()[:20])  # torn
    files.put(job_id, "checkpoints/latest", b"9")
    r = stack.client.get(f"/v1/jobs/{job_id}/checkpoint")
    assert r.status_code == 200 and r.headers["x-checkpoint-step"] == "5"
    assert int(r.headers["content-length"]) == len(r.content)
    (n,) = struct.unpack("<Q", r.content[:8])
    header = json.loads(r.content[8 : 8 + n])
    assert json.loads(header["__metadata__"]["nf_meta"]) == {"step": 5}
    assert r.content[8 + n :] == TENSOR
    # An image job has no cameras.
    assert stack.client.get(f"/v1/jobs/{job_id}/camera_path").status_code == 409

    assert stack.client.post(f"/v1/jobs/{job_id}/cancel").status_code == 200
    assert stack.client.delete(f"/v1/jobs/{job_id}").status_code == 204
    assert files.keys(job_id) == []
    assert not stack.job_dir(job_id).exists()
    assert stack.client.get(f"/v1/jobs/{job_id}").status_code == 404


def test_local_artifacts_never_follow_links(stack_factory):
    stack = stack_factory(queues=None)
    job_id = stack.submit(png_bytes(16, 16), config={"steps": 20}).json()["id"]
    artifacts = stack.job_dir(job_id) / "artifacts"
    artifacts.mkdir()
    (stack.data_dir / "secret.txt").write_text("top secret")
    (artifacts / "link.png").symlink_to(stack.data_dir / "secret.txt")
    (artifacts / ".hidden").write_text("top secret")
    for name in ("link.png", ".hidden", "..%2Fsecret.txt"):
        r = stack.client.get(f"/v1/jobs/{job_id}/artifacts/{name}")
        assert r.status_code in (404, 422) and "top secret" not in r.text
    assert stack.client.get(f"/v1/jobs/{job_id}/artifacts").json()["items"] == []


@pytest.mark.slow
def test_a_trained_job_on_s3_serves_its_render_from_the_bucket(stack_factory, s3_bucket):
    stack = stack_factory(env=s3_bucket.env)
    job_id = stack.submit(png_bytes(16, 16), config={"steps": 20, "resolution": 16}).json()["id"]
    assert stack.wait_status(job_id, "succeeded", "failed")["status"] == "succeeded"
    items = stack.client.get(f"/v1/jobs/{job_id}/artifacts").json()["items"]
    assert items, "the worker stored no artifact"
    name = items[0]["name"]
    assert f"nf/jobs/{job_id}/artifacts/{name}" in s3_bucket.keys()
    r = stack.client.get(f"/v1/jobs/{job_id}/artifacts/{name}")
    assert r.status_code == 302
    got = httpx.get(r.headers["location"])
    assert got.status_code == 200 and len(got.content) == items[0]["size"]
    r = stack.client.get(f"/v1/jobs/{job_id}/checkpoint")
    assert r.status_code == 200 and int(r.headers["x-checkpoint-step"]) > 0


def _start(stack, size: int, **extra):
    body = {"kind": "image", "filename": "photo.png", "size": size, "config": {"steps": 20}}
    return stack.client.post("/v1/uploads", json={**body, **extra})


def test_direct_upload_straight_to_the_bucket_becomes_a_job(stack_factory, s3_bucket):
    keys = f"{TEST_KEY},bob:{BOB}"
    stack = stack_factory(
        queues=None, env={**s3_bucket.env, "MAX_UPLOAD_MB": "1", "API_KEYS": keys}
    )
    photo = png_bytes(32, 32)
    assert _start(stack, 2 << 20).status_code == 413  # over MAX_UPLOAD_MB
    assert _start(stack, 10, kind="nope").status_code == 422
    r = _start(stack, len(photo))
    assert r.status_code == 201, r.text
    up = r.json()
    job_id = up["id"]
    assert len(up["part_urls"]) == 1 and up["complete_url"] == f"/v1/uploads/{job_id}/complete"
    assert stack.client.get(f"/v1/jobs/{job_id}").status_code == 404  # not a job yet

    r = stack.client.post(up["complete_url"])
    assert r.status_code == 409 and "0 of 1 parts" in r.text
    put = httpx.put(up["part_urls"][0], content=photo)  # straight to the bucket, no API key
    assert put.status_code == 200
    r = stack.client.post(up["complete_url"])
    assert r.status_code == 202, r.text
    job = r.json()
    assert job["id"] == job_id and job["status"] == "queued"
    assert job["dataset"]["width"] == 32 and job["dataset"]["filename"] == "photo.png"
    keys = [k for k in s3_bucket.keys() if f"/jobs/{job_id}/" in k]
    assert keys == [f"nf/jobs/{job_id}/dataset/image.png"]  # the raw upload is not kept
    assert stack.client.post(up["complete_url"]).status_code == 404  # done once
    assert stack.client.get(f"/v1/jobs/{job_id}").json()["status"] == "queued"

    # A file the intake refuses: the job never exists and its objects go.
    bad = _start(stack, 100).json()
    assert httpx.put(bad["part_urls"][0], content=b"x" * 100).status_code == 200
    r = stack.client.post(bad["complete_url"])
    assert r.status_code in (415, 422), r.text
    assert not [k for k in s3_bucket.keys() if f"/jobs/{bad['id']}/" in k]

    # Cancelled: its parts are dropped and the reservation is freed.
    dropped = _start(stack, len(photo)).json()
    assert httpx.put(dropped["part_urls"][0], content=photo).status_code == 200
    assert stack.client.delete(f"/v1/uploads/{dropped['id']}").status_code == 204
    assert stack.client.post(dropped["complete_url"]).status_code == 404
    assert not s3_bucket.client.list_multipart_uploads(Bucket=s3_bucket.bucket).get("Uploads")

    # Another key cannot complete or cancel it.
    other = _start(stack, len(photo)).json()
    bob = httpx.Client(base_url=stack.base_url, headers=auth_headers(BOB))
    assert bob.post(other["complete_url"]).status_code == 404
    assert bob.delete(f"/v1/uploads/{other['id']}").status_code == 404
    assert stack.client.delete(f"/v1/uploads/{other['id']}").status_code == 204


def test_direct_uploads_need_object_storage(stack_factory):
    stack = stack_factory(queues=None)
    r = _start(stack, 100)
    assert r.status_code == 409 and "POST /v1/jobs" in r.text
    assert stack.client.get("/v1/jobs").json()["total"] == 0


@pytest.mark.slow
def test_cli_submit_direct_sends_the_parts_to_the_bucket(stack_factory, s3_bucket, tmp_path):
    from tests.clients.test_cli import nf

    photo = tmp_path / "photo.png"
    photo.write_bytes(png_bytes(24, 24))
    stack = stack_factory(queues=None, env=s3_bucket.env)
    sub = nf("submit", "--direct", str(photo), "--config", '{"steps": 20}', url=stack.base_url)
    assert sub.returncode == 0, sub.stderr
    job_id = sub.stdout.strip()
    assert stack.client.get(f"/v1/jobs/{job_id}").json()["status"] == "queued"
    assert f"nf/jobs/{job_id}/dataset/image.png" in s3_bucket.keys()

    local = stack_factory(queues=None)
    sub = nf("submit", "--direct", str(photo), url=local.base_url)
    assert sub.returncode != 0 and "POST /v1/jobs" in sub.stderr
