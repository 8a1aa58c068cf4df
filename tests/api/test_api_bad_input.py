"""Every bad input gets a clear 4xx with a JSON `detail`, leaves no job folder and enqueues nothing."""

from __future__ import annotations

import io
import struct
import uuid
import zlib

import httpx
import pytest
from PIL import Image

from tests.support.stack import png_bytes, stack_maker

MAX_UPLOAD_MB = 1


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    # API only: with no worker, anything enqueued would stay visible in the broker folder.
    with stack_maker(tmp_path_factory) as make:
        yield make(queues=None, env={"MAX_UPLOAD_MB": str(MAX_UPLOAD_MB)})


def _queued_messages(stack) -> list:
    q = stack.data_dir / "broker" / "queue"
    return sorted(q.iterdir()) if q.is_dir() else []


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def pixel_bomb(width: int = 30000, height: int = 30000) -> bytes:
    """A valid PNG header that claims width x height; the pixel data would inflate to ~2.7 GB."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\x00" * 1024)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", ihdr)
        + _png_chunk(b"IDAT", idat)
        + _png_chunk(b"IEND", b"")
    )


def jpeg_bytes() -> bytes:
    buf = io.BytesIO()
    Image.open(io.BytesIO(png_bytes(40, 30))).save(buf, format="JPEG")
    return buf.getvalue()


def gif_bytes() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 10, 10)).save(buf, format="GIF")
    return buf.getvalue()


def heic_bytes() -> bytes:
    buf = io.BytesIO()
    Image.open(io.BytesIO(png_bytes(64, 48))).save(buf, format="HEIF", quality=90)
    return buf.getvalue()


CASES = {
    "not an image": dict(data=b"just some text, certainly not a picture\n" * 10, expect=415),
    "empty file": dict(data=b"", expect=422),
    "truncated png": dict(data=png_bytes(64, 64)[:-300], expect=422),
    "png cut in the header": dict(data=png_bytes(64, 64)[:40], expect=(415, 422)),
    "pixel bomb 30000x30000": dict(data=pixel_bomb(), expect=422, says="MAX_IMAGE_PIXELS"),
    "truncated jpeg": dict(data=jpeg_bytes()[:-200], filename="p.jpg", expect=422),
    "truncated heic": dict(
        data=heic_bytes()[:-300], filename="IMG_0001.HEIC", expect=422, says="truncated"
    ),
    "gif": dict(data=gif_bytes(), filename="p.gif", expect=415),
    "unknown kind": dict(kind="sculpture", expect=422, says="kind"),
    "malformed config json": dict(config="{steps: 10", expect=422, says="JSON"),
    "config not an object": dict(config="[1, 2]", expect=422),
    "steps out of range": dict(config={"steps": 0}, expect=422, says="steps"),
    "lr negative": dict(config={"lr": -1}, expect=422, says="lr"),
    "unknown encoding": dict(config={"encoding": "wavelet"}, expect=422, says="encoding"),
    "resolution too big": dict(config={"resolution": 100000}, expect=422, says="resolution"),
    "typo in config key": dict(config={"stpes": 100}, expect=422, says="stpes"),
    "over the size limit": dict(
        data=b"\x89PNG" + b"\0" * (MAX_UPLOAD_MB * 1024 * 1024 + 200_000), expect=413
    ),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_bad_upload(api, case):
    c = CASES[case]
    data = c.get("data", png_bytes(32, 32))
    r = api.submit(
        data,
        filename=c.get("filename", "photo.png"),
        kind=c.get("kind", "image"),
        config=c.get("config"),
    )
    expect = c["expect"] if isinstance(c["expect"], tuple) else (c["expect"],)
    assert r.status_code in expect, (r.status_code, r.text)
    detail = r.json()["detail"]
    assert isinstance(detail, str) and detail
    if "says" in c:
        assert c["says"].lower() in detail.lower()
    assert api.job_dirs() == [], "a rejected upload left files behind"
    assert _queued_messages(api) == [], "a rejected upload was enqueued"
    assert api.client.get("/v1/jobs").json()["total"] == 0


def test_oversize_upload_without_content_length(api):
    # Chunked transfer: no Content-Length to reject early, so the cap must hold while streaming.
    def body():
        boundary = b"xyzBOUNDARY"
        yield b"--" + boundary + b'\r\nContent-Disposition: form-data; name="kind"\r\n\r\nimage\r\n'
        yield (
            b"--"
            + boundary
            + b'\r\nContent-Disposition: form-data; name="dataset"; filename="a.png"\r\n'
        )
        yield b"Content-Type: image/png\r\n\r\n"
        for _ in range(MAX_UPLOAD_MB * 4):
            yield b"\0" * (512 * 1024)
        yield b"\r\n--" + boundary + b"--\r\n"

    r = httpx.post(
        api.base_url + "/v1/jobs",
        content=body(),
        timeout=60,
        headers={"content-type": "multipart/form-data; boundary=xyzBOUNDARY", **api.headers},
    )
    assert r.status_code == 413, r.text
    assert "MAX_UPLOAD_MB" in r.json()["detail"]
    assert api.job_dirs() == [] and _queued_messages(api) == []


@pytest.mark.parametrize("missing", ["kind", "dataset"])
def test_missing_form_field(api, missing):
    form = {} if missing == "kind" else {"kind": "image"}
    name = "dataset" if missing == "kind" else "photo"
    r = api.client.post(
        "/v1/jobs", data=form, files={name: ("p.png", png_bytes(16, 16), "image/png")}
    )
    assert r.status_code == 422 and missing in r.json()["detail"]
    assert api.job_dirs() == []


def test_not_multipart(api):
    r = api.client.post("/v1/jobs", data={"kind": "image"})
    assert r.status_code == 415 and "multipart" in r.json()["detail"]
    r = api.client.post(
        "/v1/jobs",
        content=b"--x\r\ngarbage",
        headers={"content-type": "multipart/form-data; boundary=x"},
    )
    assert 400 <= r.status_code < 500 and r.json()["detail"]
    assert api.job_dirs() == []


@pytest.mark.parametrize("path", ["/v1/jobs/{id}", "/v1/jobs/{id}/cancel", "/v1/jobs/{id}/render"])
# A fixed id for the fresh uuid: every xdist worker must collect the same test names.
@pytest.mark.parametrize(
    "job_id", [pytest.param(str(uuid.uuid4()), id="unused-uuid"), "not-a-uuid", "..%2F..%2Fetc"]
)
def test_unknown_job_is_404(api, path, job_id):
    url = path.format(id=job_id)
    r = (
        api.client.get(url)
        if path == "/v1/jobs/{id}"
        else api.client.post(url, json={"width": 8, "height": 8})
    )
    assert r.status_code == 404, r.text
    assert isinstance(r.json()["detail"], str)


def test_render_requests_on_a_job_that_has_not_succeeded(api):
    job = api.submit(png_bytes(16, 16)).json()
    try:
        assert job["status"] == "queued"
        r = api.client.post(f"/v1/jobs/{job['id']}/render", json={"width": 8, "height": 8})
        assert r.status_code == 409 and "queued" in r.json()["detail"]
        r = api.client.post(f"/v1/jobs/{job['id']}/render", json={"width": 8000, "height": 8000})
        assert r.status_code == 422 and "MAX_RENDER_PIXELS" in r.json()["detail"]
        eye_is_target = {"look_at": {"eye": [1, 2, 3], "target": [1, 2, 3]}}
        for bad, says in (
            ({"width": 0, "height": 8}, "width"),
            ({"width": 8}, "height"),
            ({"width": 8, "height": 8, "zoom": 2}, "zoom"),
            ({"width": 8, "height": 8, "camera": eye_is_target}, "same point"),
            ({"width": 8, "height": 8, "fov_x_deg": 180}, "fov_x_deg"),
            ({"width": 8, "height": 8, "fov_y_deg": 0}, "fov_y_deg"),
            ({"width": 8, "height": 8, "camera": {"c2w": [[1, 0, 0]]}}, "c2w"),
        ):
            r = api.client.post(f"/v1/jobs/{job['id']}/render", json=bad)
            assert r.status_code == 422, (bad, r.text)
            assert isinstance(r.json()["detail"], str) and says in r.json()["detail"], r.json()
        r = api.client.post(f"/v1/jobs/{job['id']}/render/path", json={"width": 8, "height": 8})
        assert r.status_code == 422 and "poses or orbit" in r.json()["detail"]
    finally:
        assert api.client.post(f"/v1/jobs/{job['id']}/cancel").json()["status"] == "cancelled"
        assert api.client.delete(f"/v1/jobs/{job['id']}").status_code == 204
        for m in _queued_messages(api):
            m.unlink()  # the cancelled task's message; no worker will ever take it here


def test_client_disconnect_mid_upload_leaves_nothing(api):
    import socket
    import time

    boundary = "cutBOUNDARY"
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="kind"\r\n\r\nimage\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="dataset"; filename="a.png"\r\n'
        f"Content-Type: image/png\r\n\r\n"
    ).encode()
    body = head + png_bytes(64, 64)
    with socket.create_connection(("127.0.0.1", api.port)) as s:
        s.sendall(
            (
                f"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body) + 10_000}\r\n"
                f"Authorization: {api.headers['Authorization']}\r\n"
                f"Content-Type: multipart/form-data; boundary={boundary}\r\n\r\n"
            ).encode()
            + body
        )
        deadline = time.monotonic() + 5
        while not api.job_dirs() and time.monotonic() < deadline:
            time.sleep(0.02)  # the upload is being received into its job folder
        assert api.job_dirs(), "the partial upload never reached a job folder"
    deadline = time.monotonic() + 10
    while api.job_dirs() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert api.job_dirs() == [] and _queued_messages(api) == []


def test_jpeg_is_accepted_and_a_job_can_be_deleted_once_finished(api):
    r = api.submit(jpeg_bytes(), filename="photo.jpg", config={"steps": 10})
    assert r.status_code == 202, r.text
    job = r.json()
    assert job["dataset"]["format"] == "JPEG" and job["config"]["steps"] == 10
    assert (api.job_dir(job["id"]) / "dataset" / "image.jpg").is_file()
    assert not (api.job_dir(job["id"]) / "upload").exists()
    assert api.client.delete(f"/v1/jobs/{job['id']}").status_code == 409  # still queued
    api.client.post(f"/v1/jobs/{job['id']}/cancel")
    assert api.client.delete(f"/v1/jobs/{job['id']}").status_code == 204
    assert api.client.get(f"/v1/jobs/{job['id']}").status_code == 404
    assert api.job_dirs() == []
    for m in _queued_messages(api):
        m.unlink()
