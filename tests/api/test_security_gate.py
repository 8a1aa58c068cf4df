"""The /v1 gate: the key is checked before any body byte is read, bodies are capped (small for
JSON, MAX_UPLOAD_MB only on the upload), and every route under /v1, enumerated from the app
itself so a new one is covered, refuses a missing key and another key's job."""

from __future__ import annotations

import socket
import sys
import time
import uuid

import httpx
import pytest
from fastapi import APIRouter, FastAPI

from core.settings import Settings
from service.app import _check_guards, _include_routes, api_routes, create_app
from tests.support.stack import auth_headers, png_bytes

KEY_A, KEY_B = "alpha-token-1111", "bravo-token-2222"
HALF_GIB = 512 * 1024 * 1024


@pytest.fixture(scope="module")
def gated(tmp_path_factory):
    from tests.support.stack import stack_maker

    with stack_maker(tmp_path_factory) as make:
        stack = make(queues=None, env={"API_KEYS": f"alice:{KEY_A},bob:{KEY_B}"})
        r = stack.submit(png_bytes(16, 16))
        assert r.status_code == 202, r.text
        yield stack, r.json()["id"]


def _raw_post(port: int, path: str, headers: dict[str, str], chunks, chunked: bool = False):
    """Send a request over a plain socket, body chunk by chunk, stopping as soon as the server
    answers; returns (status line, seconds to the answer, body bytes sent)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    if chunked:
        head += "Transfer-Encoding: chunked\r\n"
    sock.sendall((head + "\r\n").encode())
    t0, sent = time.monotonic(), 0
    sock.setblocking(False)
    try:
        for chunk in chunks:
            try:
                data = sock.recv(4096)
                if data:
                    return data.split(b"\r\n", 1)[0].decode(), time.monotonic() - t0, sent
            except BlockingIOError:
                pass
            frame = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n" if chunked else chunk
            try:
                sock.sendall(frame)
            except (BlockingIOError, BrokenPipeError, ConnectionResetError):
                break
            sent += len(chunk)
        sock.settimeout(10)
        data = sock.recv(4096)
        return data.split(b"\r\n", 1)[0].decode(), time.monotonic() - t0, sent
    finally:
        sock.close()


def _json_array(total: int, chunk: int = 64 * 1024):
    yield b"[" + b"0," * (chunk // 2 - 1)
    for _ in range(total // chunk - 2):
        yield b"0," * (chunk // 2)
        time.sleep(0.001)


# The answers' 1 s bounds are wall time: run with nothing beside them (`make test`).
@pytest.mark.alone
def test_unauthenticated_half_gib_json_is_refused_unread(gated):
    stack, job_id = gated
    status, took, sent = _raw_post(
        stack.port,
        f"/v1/jobs/{job_id}/render",
        {"Content-Length": str(HALF_GIB)},
        _json_array(HALF_GIB),
    )
    assert " 401 " in status and took < 1.0, (status, took)
    assert sent < 16 * 1024 * 1024, f"{sent} bytes went in before the answer"
    # Chunked (no length up front): the same, before the body is read.
    status, took, sent = _raw_post(
        stack.port, f"/v1/jobs/{job_id}/render", {}, _json_array(HALF_GIB), chunked=True
    )
    assert " 401 " in status and took < 1.0 and sent < 16 * 1024 * 1024, (status, took, sent)


@pytest.mark.alone
def test_json_bodies_are_capped_small_and_only_the_upload_is_large(gated):
    stack, job_id = gated
    key = auth_headers(KEY_A)
    status, took, sent = _raw_post(
        stack.port,
        f"/v1/jobs/{job_id}/render",
        {**key, "Content-Length": str(HALF_GIB)},
        _json_array(HALF_GIB),
    )
    assert " 413 " in status and took < 1.0 and sent < 16 * 1024 * 1024, (status, took, sent)
    status, took, sent = _raw_post(
        stack.port, f"/v1/jobs/{job_id}/render", key, _json_array(HALF_GIB), chunked=True
    )
    assert " 413 " in status and sent < 16 * 1024 * 1024, (status, sent)
    r = httpx.post(f"{stack.base_url}/v1/jobs/{job_id}/cancel", headers=key, content=b" " * 70_000)
    assert r.status_code == 413 and "MAX_JSON_BODY_KB" in r.json()["detail"]
    # 200 kB is fine for an upload (MAX_UPLOAD_MB), not for JSON.
    r = stack.submit(png_bytes(16, 16) + b"\0" * 200_000)
    assert r.status_code != 413, r.text


def _request_for(route, job_id: str) -> list[tuple[str, str]]:
    path = route.path.replace("{job_id}", job_id)
    for name in route.param_convertors:
        path = path.replace("{" + name + "}", "x")
    return [(m, path) for m in sorted(route.methods - {"HEAD"})]


def test_every_v1_route_refuses_a_missing_key_and_a_foreign_job(gated):
    stack, job_id = gated
    app = create_app(Settings(data_dir=stack.data_dir, api_keys=f"alice:{KEY_A}"))
    routes = [r for r in api_routes(app) if r.path.startswith("/v1")]
    assert len(routes) >= 10
    unknown = str(uuid.uuid4())
    anon = httpx.Client(base_url=stack.base_url, timeout=30)
    bob = httpx.Client(base_url=stack.base_url, timeout=30, headers=auth_headers(KEY_B))
    checked = 0
    for route in routes:
        for method, path in _request_for(route, job_id):
            r = anon.request(method, path, json={})
            assert r.status_code == 401, (method, path, r.status_code)
            # The URL key opens the event stream (the job is queued: it would not end) alone.
            with anon.stream(method, path, params={"access_token": KEY_A}, json={}) as r:
                expect = 200 if path.endswith("/events") else 401
                assert r.status_code == expect, (method, path, r.status_code)
            if "{job_id}" in route.path:
                r = bob.request(method, path, json={})
                twin = bob.request(method, path.replace(job_id, unknown), json={})
                assert r.status_code == twin.status_code == 404, (method, path, r.status_code)
                assert r.json()["detail"] == twin.json()["detail"].replace(unknown, job_id)
            checked += 1
    assert checked >= 10
    assert stack.job_dir(job_id).is_dir()


def test_a_route_without_guards_stops_the_app():
    app = FastAPI()
    bare = APIRouter(prefix="/v1/things")

    @bare.get("/{thing_id}")
    def thing(thing_id: str):
        return {}

    app.include_router(bare)
    with pytest.raises(RuntimeError, match="declares no API key"):
        _check_guards(app)


def test_a_route_module_that_fails_to_import_stops_the_app(tmp_path, monkeypatch):
    pkg = tmp_path / "broken_routes"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "fine.py").write_text("from fastapi import APIRouter\nrouter = APIRouter()\n")
    (pkg / "oops.py").write_text("import no_such_module_anywhere\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import broken_routes

    try:
        with pytest.raises(ModuleNotFoundError, match="no_such_module_anywhere"):
            _include_routes(FastAPI(), broken_routes)
    finally:
        sys.modules.pop("broken_routes", None)
