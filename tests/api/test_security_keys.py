"""API keys over real HTTP: jobs belong to the key that made them, other keys get 404 on every
route, no key or a wrong one gets 401 with WWW-Authenticate, public paths stay public, and
render/path requests are capped and rate-limited per key."""

from __future__ import annotations

import json
import uuid

import httpx
import pytest
from httpx_sse import connect_sse

from tests.support.stack import auth_headers, png_bytes, stack_maker

KEY_A, KEY_B, KEY_C = "alpha-token-1111", "bravo-token-2222", "charlie-token-3333"
PIXEL_BURST = 3000
LIMITS = {
    "API_KEYS": f"alice:{KEY_A},bob:{KEY_B}",
    "RENDER_PIXEL_BURST": str(PIXEL_BURST),
    "RENDER_PIXELS_PER_MIN": "600",
}
ORBIT = {"radius": 2.0, "n_frames": 4}


@pytest.fixture(scope="module")
def keyed(tmp_path_factory):
    """A stack with alice and bob in API_KEYS and charlie in API_KEYS_FILE; alice owns one trained job."""
    keys_file = tmp_path_factory.mktemp("keys") / "keys.txt"
    keys_file.write_text(f"# comment lines and blanks are skipped\n\ncharlie:{KEY_C}\n")
    with stack_maker(tmp_path_factory) as make:
        stack = make(env={**LIMITS, "API_KEYS_FILE": str(keys_file)})
        a = httpx.Client(base_url=stack.base_url, headers=auth_headers(KEY_A), timeout=60)
        b = httpx.Client(base_url=stack.base_url, headers=auth_headers(KEY_B), timeout=60)
        c = httpx.Client(base_url=stack.base_url, headers=auth_headers(KEY_C), timeout=60)
        r = a.post(
            "/v1/jobs",
            data={"kind": "image", "config": json.dumps({"steps": 30, "resolution": 16})},
            files={"dataset": ("p.png", png_bytes(20, 16), "image/png")},
        )
        assert r.status_code == 202, r.text
        job_id = r.json()["id"]
        stack.client.headers.update(auth_headers(KEY_A))
        assert stack.wait_status(job_id, "succeeded", "failed")["status"] == "succeeded"
        yield stack, a, b, c, job_id
        for client in (a, b, c):
            client.close()


def job_routes(job_id: str) -> list[tuple[str, str, dict | None]]:
    """(method, path, json body) for every route that takes a job id."""
    return [
        ("GET", f"/v1/jobs/{job_id}", None),
        ("GET", f"/v1/jobs/{job_id}/events", None),
        ("GET", f"/v1/jobs/{job_id}/artifacts", None),
        ("GET", f"/v1/jobs/{job_id}/artifacts/reconstruction.png", None),
        ("GET", f"/v1/jobs/{job_id}/checkpoint", None),
        ("POST", f"/v1/jobs/{job_id}/render", {"width": 8, "height": 8}),
        ("POST", f"/v1/jobs/{job_id}/render/path", {"width": 8, "height": 8, "orbit": ORBIT}),
        ("POST", f"/v1/jobs/{job_id}/render_path", {"width": 8, "height": 8, "orbit": ORBIT}),
        ("POST", f"/v1/jobs/{job_id}/cancel", None),
        ("DELETE", f"/v1/jobs/{job_id}", None),
    ]


def all_routes(job_id: str) -> list[tuple[str, str, dict | None]]:
    return [("GET", "/v1/jobs", None), ("POST", "/v1/jobs", None), *job_routes(job_id)]


def test_the_owner_reaches_every_route(keyed):
    stack, a, _, _, job_id = keyed
    assert a.get(f"/v1/jobs/{job_id}").json()["status"] == "succeeded"
    assert [i["name"] for i in a.get(f"/v1/jobs/{job_id}/artifacts").json()["items"]] == [
        "reconstruction.png"
    ]
    assert (
        a.get(f"/v1/jobs/{job_id}/artifacts/reconstruction.png").content[:8] == b"\x89PNG\r\n\x1a\n"
    )
    assert a.get(f"/v1/jobs/{job_id}/checkpoint").status_code == 200
    assert a.post(f"/v1/jobs/{job_id}/render", json={"width": 8, "height": 8}).status_code == 200
    # The job's owner is the key's id, never the token.
    owner = stack.store().owner_of(job_id)
    assert owner.startswith("h-") and KEY_A not in owner


def test_other_keys_get_404_on_every_route(keyed):
    stack, _, b, c, job_id = keyed
    unknown = str(uuid.uuid4())
    for client in (b, c):
        for method, path, body in job_routes(job_id):
            r = client.request(method, path, json=body)
            assert r.status_code == 404, (method, path, r.status_code, r.text)
            # Same answer as for a job that does not exist: nothing tells them it is there.
            twin = client.request(method, path.replace(job_id, unknown), json=body)
            assert twin.status_code == 404 and r.json()["detail"] == twin.json()["detail"].replace(
                unknown, job_id
            )
    assert stack.job_dir(job_id).is_dir()  # bob's DELETE did not remove it


@pytest.mark.parametrize(
    "headers",
    [
        {},
        auth_headers("wrong-token-9999"),
        {"Authorization": KEY_A},
        {"Authorization": f"Basic {KEY_A}"},
        auth_headers(KEY_A + "x"),
        auth_headers(KEY_A[:-1]),
    ],
    ids=["none", "wrong", "no-scheme", "basic", "longer", "shorter"],
)
def test_missing_or_wrong_key_is_401(keyed, headers):
    stack, *_, job_id = keyed
    with httpx.Client(base_url=stack.base_url, headers=headers, timeout=30) as anon:
        for method, path, body in all_routes(job_id):
            r = anon.request(method, path, json=body)
            assert r.status_code == 401, (method, path, r.status_code, r.text)
            assert r.headers["www-authenticate"].lower().startswith("bearer")
            assert isinstance(r.json()["detail"], str)
    assert stack.job_dir(job_id).is_dir()


def test_list_shows_only_the_callers_jobs(keyed):
    stack, a, b, _, job_id = keyed
    r = b.post(
        "/v1/jobs",
        data={"kind": "image", "config": json.dumps({"steps": 200000, "resolution": 16})},
        files={"dataset": ("p.png", png_bytes(16, 16), "image/png")},
    )
    assert r.status_code == 202
    bobs = r.json()["id"]
    try:
        mine_a = a.get("/v1/jobs").json()
        mine_b = b.get("/v1/jobs").json()
        assert job_id in [j["id"] for j in mine_a["items"]] and bobs not in [
            j["id"] for j in mine_a["items"]
        ]
        assert [j["id"] for j in mine_b["items"]] == [bobs] and mine_b["total"] == 1
        # Filters and pagination count only the caller's jobs.
        assert b.get("/v1/jobs", params={"status": "succeeded"}).json()["total"] == 0
        assert a.get("/v1/jobs", params={"limit": 1, "offset": 5}).json() == {
            "items": [],
            "total": mine_a["total"],
            "limit": 1,
            "offset": 5,
            "next_cursor": None,
        }
        # Keyset pages: each of the caller's jobs once, then no cursor.
        seen, cursor = [], None
        while True:
            page = a.get("/v1/jobs", params={"limit": 1, "cursor": cursor or ""}).json()
            seen += [j["id"] for j in page["items"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert seen == [j["id"] for j in mine_a["items"]]
        bad = a.get("/v1/jobs", params={"cursor": "x" + (cursor or "")})
        assert bad.status_code == 422 and "cursor" in bad.json()["detail"]
        assert a.get(f"/v1/jobs/{bobs}").status_code == 404
    finally:
        assert b.post(f"/v1/jobs/{bobs}/cancel").status_code == 200
        _wait_cancelled(b, bobs)


def test_public_paths_need_no_key(keyed):
    stack, *_ = keyed
    with httpx.Client(base_url=stack.base_url, timeout=30) as anon:
        for path in ("/healthz", "/readyz", "/docs", "/openapi.json", "/", "/static/js/api.js"):
            assert anon.get(path).status_code == 200, path
        spec = anon.get("/openapi.json").json()
    scheme = spec["components"]["securitySchemes"]["ApiKey"]
    assert scheme["type"] == "http" and scheme["scheme"] == "bearer"
    for path, ops in spec["paths"].items():
        for op in ops.values():
            assert (op.get("security") == [{"ApiKey": []}]) == path.startswith("/v1"), path


def test_events_take_the_key_in_the_url(keyed):
    stack, *_, job_id = keyed
    with httpx.Client(base_url=stack.base_url, timeout=30) as anon:
        with connect_sse(
            anon, "GET", f"/v1/jobs/{job_id}/events", params={"access_token": KEY_A}
        ) as source:
            assert source.response.status_code == 200
            kinds = [ev.event for ev in source.iter_sse()]
        assert kinds[-1] == "end" and "status" in kinds
        assert (
            anon.get(f"/v1/jobs/{job_id}/events", params={"access_token": KEY_B}).status_code == 404
        )
        assert (
            anon.get(
                f"/v1/jobs/{job_id}/events", params={"access_token": "nope-nope-nope"}
            ).status_code
            == 401
        )
        # Only the event stream takes a key in the URL.
        assert anon.get(f"/v1/jobs/{job_id}", params={"access_token": KEY_A}).status_code == 401
        assert (
            anon.get(f"/v1/jobs/{job_id}/checkpoint", params={"access_token": KEY_A}).status_code
            == 401
        )


def test_tokens_never_reach_the_logs(keyed):
    stack, *_ = keyed
    logs = "".join(p.read_text(errors="replace") for p in stack.log_dir.glob("*.log"))
    assert logs, "no logs written"
    for token in (KEY_A, KEY_B, KEY_C):
        assert token not in logs


def test_render_and_path_caps(stack_factory):
    # API only: the caps are checked before anything is sent to a worker.
    stack = stack_factory(queues=None, env={"MAX_PATH_FRAMES": "50", "MAX_PATH_PIXELS": "20000"})
    job_id = stack.submit(png_bytes(16, 16)).json()["id"]
    a = stack.client
    r = a.post(
        f"/v1/jobs/{job_id}/render/path",
        json={"width": 8, "height": 8, "orbit": {**ORBIT, "n_frames": 51}},
    )
    assert r.status_code == 422 and "MAX_PATH_FRAMES" in r.json()["detail"]
    r = a.post(f"/v1/jobs/{job_id}/render/path", json={"width": 80, "height": 80, "orbit": ORBIT})
    assert r.status_code == 422 and "MAX_PATH_PIXELS" in r.json()["detail"]
    r = a.post(f"/v1/jobs/{job_id}/render", json={"width": 16384, "height": 16384})
    assert r.status_code == 422 and "MAX_RENDER_PIXELS" in r.json()["detail"]


def test_render_rate_limit_per_key(keyed):
    """charlie (from the keys file) spends his pixel burst; alice, on the same server, is not
    slowed by it. The bucket counts pixels: after two 32x32 frames (2048 of 3000 pixels) a third
    is refused, an 8x8 frame still passes."""
    stack, a, _, c, job_id = keyed
    r = c.post(
        "/v1/jobs",
        data={"kind": "image", "config": json.dumps({"steps": 200000, "resolution": 16})},
        files={"dataset": ("p.png", png_bytes(16, 16), "image/png")},
    )
    assert r.status_code == 202
    own = r.json()["id"]
    # A cancelled job: every render of it is a quick 409, unless the bucket is empty first.
    c.post(f"/v1/jobs/{own}/cancel")
    _wait_cancelled(c, own)
    big, small = {"width": 32, "height": 32}, {"width": 8, "height": 8}
    codes = []
    for body in (big, big, big, small):
        resp = c.post(f"/v1/jobs/{own}/render", json=body)
        codes.append(resp.status_code)
        if resp.status_code == 429:
            # (1024 - 952) pixels at 10 pixels/s
            assert 1 <= int(resp.headers["retry-after"]) <= 10
            assert "RENDER_PIXELS_PER_MIN" in resp.json()["detail"]
    assert codes == [409, 409, 429, 409], codes
    path = {"width": 8, "height": 8, "orbit": {**ORBIT, "n_frames": 40}}  # 2560 pixels
    assert c.post(f"/v1/jobs/{own}/render/path", json=path).status_code == 429
    # Once charlie's training has stopped (it holds the stack's one worker), alice renders.
    _wait_cancelled(c, own)
    assert a.post(f"/v1/jobs/{job_id}/render", json={"width": 8, "height": 8}).status_code == 200


def _wait_cancelled(client, job_id: str, timeout: float = 60) -> None:
    import time

    deadline = time.monotonic() + timeout
    while client.get(f"/v1/jobs/{job_id}").json()["status"] != "cancelled":
        assert time.monotonic() < deadline, "cancel did not land"
        time.sleep(0.1)


def test_bad_key_configuration_stops_the_api(tmp_path_factory):
    with stack_maker(tmp_path_factory) as make:
        with pytest.raises(
            RuntimeError, match=r"API_KEYS entry 2: a token needs at least 8 characters"
        ) as exc:
            make(queues=None, env={"API_KEYS": "ok:long-enough-token,bad:tiny5"})
        assert "tiny5" not in str(exc.value) and "long-enough-token" not in str(exc.value)


def test_access_log_redacts_the_url_key(tmp_path):
    """At uvicorn's default (info) level every request URL is logged: ?access_token= is masked."""
    import os
    import subprocess
    import sys
    import time

    from tests.support.stack import REPO, free_port

    port, log = free_port(), tmp_path / "api.log"
    env = {**os.environ, "DATA_DIR": str(tmp_path / "data"), "API_KEYS": f"a:{KEY_A}"}
    env.pop("REDIS_URL", None)
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "service.app:app",
                "--port",
                str(port),
                "--log-level",
                "info",
            ],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        job = str(uuid.uuid4())
        assert (
            httpx.get(f"{base}/v1/jobs/{job}/events", params={"access_token": KEY_A}).status_code
            == 404
        )
        assert (
            httpx.get(f"{base}/v1/jobs/{job}/events", params={"access_token": KEY_B}).status_code
            == 401
        )
        time.sleep(0.5)
    finally:
        proc.terminate()
        proc.wait(10)
    text = log.read_text()
    assert f"/v1/jobs/{job}/events?access_token=***" in text, text
    assert KEY_A not in text and KEY_B not in text


@pytest.mark.slow
def test_embedded_mode_uses_the_dev_key_and_says_so(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    from service.auth import DEV_KEY
    from tests.support.stack import REPO, free_port

    port, log = free_port(), tmp_path / "run.log"
    env = {
        k: v for k, v in os.environ.items() if k not in ("API_KEYS", "API_KEYS_FILE", "REDIS_URL")
    }
    env.update(DATA_DIR=str(tmp_path / "data"), PORT=str(port), TORCH_THREADS="1")
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "service.embedded"],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        assert httpx.get(base + "/v1/jobs", headers=auth_headers(DEV_KEY)).status_code == 200
        assert httpx.get(base + "/v1/jobs").status_code == 401
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = log.read_text()
    assert "WARNING" in text and DEV_KEY in text and "API_KEYS" in text
    # SIGTERM to `make run` stops its worker as well (it runs in a session of its own).
    import re

    worker_pid = int(re.search(r"worker pid (\d+)", text).group(1))
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            os.kill(worker_pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        os.kill(worker_pid, signal.SIGKILL)
        pytest.fail("the embedded worker outlived SIGTERM to `make run`")
