"""`Client`: the neural-field service's HTTP API as typed Python methods.

    from nf_client import Client

    with Client("http://127.0.0.1:8000", key="nf-dev-key") as nf:
        job = nf.submit("walkaround.mp4", kind="splat")
        job = nf.wait(job["id"], on_event=print)           # follows the event stream
        nf.export_file(job["id"], "spz", "scene.spz")      # export on a worker, then download
        png = nf.render(job["id"], 512, 512, look_at=([3, -2, 1.5], [0, 0, 0])).content

The base URL defaults to $NF_URL, else http://127.0.0.1:8000; the key to $NF_API_KEY (sent as
`Authorization: Bearer <key>`). Every answer of 400 or more raises `ApiError` with the server's
readable `detail`; an unreachable server raises `Unreachable`. The routes and fields used here
are checked against the committed OpenAPI document by tests/clients/test_contract.py.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import httpx

from nf_client import sse
from nf_client.types import (
    TERMINAL,
    Artifact,
    Event,
    Export,
    Job,
    JobList,
    Orbit,
    PathJob,
    Pose,
    Rendered,
    Upload,
)

DEFAULT_URL = "http://127.0.0.1:8000"
# (bytes done, bytes in all or None when unknown)
ByteProgress = Callable[[int, "int | None"], None]
# a render job's state, each time it is polled
RenderProgress = Callable[[PathJob], None]


class NfError(Exception):
    """Anything the client reports (a base for the two below)."""


class Unreachable(NfError):
    """The server did not answer (connection refused, DNS, timeout)."""


class ApiError(NfError):
    """The server answered with a status of 400 or more; `detail` is its readable message."""

    def __init__(self, status_code: int, detail: str, response: httpx.Response | None = None):
        super().__init__(f"HTTP {status_code}: {detail}")
        self.status_code = status_code
        self.detail = detail
        self.response = response


def _detail(resp: httpx.Response) -> str:
    try:
        detail = resp.json().get("detail")
    except (ValueError, AttributeError):
        detail = None
    if detail is None:
        return resp.text[:200] or resp.reason_phrase
    if isinstance(detail, list):  # FastAPI's list form, from servers that do not flatten it
        detail = "; ".join(
            ".".join(str(p) for p in d.get("loc", []) if p != "body") + ": " + d.get("msg", "")
            for d in detail
        )
    return str(detail)


class _CountingReader:
    """A binary file that reports how much of it has been read (upload progress)."""

    def __init__(self, fh: IO[bytes], total: int, on_progress: ByteProgress):
        self._fh, self._total, self._cb = fh, total, on_progress
        self.name = getattr(fh, "name", "upload")

    def fileno(self) -> int:  # lets httpx size the multipart body without reading it
        return self._fh.fileno()

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._fh.seek(offset, whence)

    def tell(self) -> int:
        return self._fh.tell()

    def read(self, n: int = -1) -> bytes:
        chunk = self._fh.read(n)
        self._cb(self._fh.tell(), self._total)
        return chunk


def look_at_pose(
    eye: Sequence[float], target: Sequence[float], up: Sequence[float] | None = None
) -> Pose:
    """A `camera` of render requests: looking from `eye` at `target` (dataset world frame)."""
    la: dict[str, Any] = {"eye": list(eye), "target": list(target)}
    if up is not None:
        la["up"] = list(up)
    return {"look_at": la}  # type: ignore[typeddict-item]


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


class Client:
    def __init__(
        self,
        url: str | None = None,
        key: str | None = None,
        *,
        timeout: float = 120.0,
        transport: httpx.BaseTransport | None = None,
    ):
        self.base_url = (url or os.environ.get("NF_URL") or DEFAULT_URL).rstrip("/")
        key = key if key is not None else os.environ.get("NF_API_KEY") or None
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._transport = transport  # also the object store's, for direct uploads (tests)
        self.http = httpx.Client(
            base_url=self.base_url,
            timeout=httpx.Timeout(timeout, connect=10.0),
            headers=headers,
            transport=transport,
        )

    # ---- plumbing ------------------------------------------------------------------------

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        """One request; raises ApiError on 4xx/5xx and Unreachable when nothing answers."""
        try:
            resp = self.http.request(method, path, **kw)
        except httpx.TransportError as exc:
            raise Unreachable(f"cannot reach {self.base_url}: {exc}") from None
        if resp.status_code >= 400:
            raise ApiError(resp.status_code, _detail(resp), resp)
        return resp

    def _json(self, method: str, path: str, **kw: Any) -> Any:
        return self.request(method, path, **kw).json()

    def viewer_url(self, job_id: str) -> str:
        """The web page with this job open (its viewer, plot and exports)."""
        return f"{self.base_url}/#job={job_id}"

    # ---- health --------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        return self._json("GET", "/healthz")

    def ready(self) -> dict[str, Any]:
        """Broker and storage reachable, and the kinds this deployment trains."""
        return self._json("GET", "/readyz")

    # ---- jobs ----------------------------------------------------------------------------

    def submit(
        self,
        path: str | os.PathLike[str],
        kind: str = "image",
        config: dict[str, Any] | None = None,
        *,
        callback_url: str | None = None,
        on_progress: ByteProgress | None = None,
    ) -> Job:
        """Upload a photo (image), or an archive of photos or a video (nerf, splat): the new job
        (202, queued). `on_progress(sent, total)` follows the upload."""
        path = Path(path)
        if not path.is_file():
            raise NfError(f"{path} is not a file")
        data: dict[str, str] = {"kind": kind}
        if config is not None:
            data["config"] = json.dumps(config)
        if callback_url is not None:
            data["callback_url"] = callback_url
        total = path.stat().st_size
        with path.open("rb") as fh:
            body: Any = _CountingReader(fh, total, on_progress) if on_progress else fh
            return self._json("POST", "/v1/jobs", data=data, files={"dataset": (path.name, body)})

    def submit_direct(
        self,
        path: str | os.PathLike[str],
        kind: str = "image",
        config: dict[str, Any] | None = None,
        *,
        callback_url: str | None = None,
        on_progress: ByteProgress | None = None,
    ) -> Job:
        """The file PUT in parts straight to the server's object store (deployments with
        STORAGE_URL=s3://...), then completed: the job. A failed part drops the upload."""
        path = Path(path)
        if not path.is_file():
            raise NfError(f"{path} is not a file")
        total = path.stat().st_size
        body = _drop_none(
            {
                "kind": kind,
                "filename": path.name,
                "size": total,
                "config": config,
                "callback_url": callback_url,
            }
        )
        up: Upload = self._json("POST", "/v1/uploads", json=body)
        n = len(up["part_urls"])
        try:
            # The part URLs carry their own permission: the API key never goes to the store.
            with (
                httpx.Client(timeout=self.http.timeout, transport=self._transport) as store,
                path.open("rb") as fh,
            ):
                for i, url in enumerate(up["part_urls"], 1):
                    try:
                        r = store.put(url, content=fh.read(up["part_size"]))
                    except httpx.TransportError as exc:
                        raise Unreachable(
                            f"part {i} of {n}: cannot reach the store: {exc}"
                        ) from None
                    if r.status_code >= 300:
                        raise ApiError(r.status_code, f"part {i} of {n}: the store refused it", r)
                    if on_progress:
                        on_progress(fh.tell(), total)
        except BaseException:
            try:
                self.request("DELETE", f"/v1/uploads/{up['id']}")
            except NfError:
                pass
            raise
        return self._json("POST", up["complete_url"])

    def job(self, job_id: str) -> Job:
        return self._json("GET", f"/v1/jobs/{job_id}")

    def jobs(
        self,
        *,
        limit: int = 50,
        offset: int | None = None,
        cursor: str | None = None,
        status: str | None = None,
        kind: str | None = None,
    ) -> JobList:
        """One page of this key's jobs, newest first; the next is `cursor=page["next_cursor"]`."""
        params = _drop_none(
            {"limit": limit, "offset": offset, "cursor": cursor, "status": status, "kind": kind}
        )
        return self._json("GET", "/v1/jobs", params=params)

    def iter_jobs(self, *, status: str | None = None, kind: str | None = None) -> Iterator[Job]:
        """Every job of this key, newest first, page after page."""
        cursor = None
        while True:
            page = self.jobs(limit=100, cursor=cursor, status=status, kind=kind)
            yield from page["items"]
            cursor = page.get("next_cursor")
            if not cursor:
                return

    def cancel(self, job_id: str) -> Job:
        return self._json("POST", f"/v1/jobs/{job_id}/cancel")

    def delete(self, job_id: str) -> None:
        """Remove a finished job and its files."""
        self.request("DELETE", f"/v1/jobs/{job_id}")

    # ---- the event stream ----------------------------------------------------------------

    def events(
        self, job_id: str, after: int | None = None, *, reconnects: int = 5
    ) -> Iterator[Event]:
        """The job's server-sent events (`status`, `progress`, ...) until its `end` event, whose
        data is the final job. A dropped connection is resumed with Last-Event-ID."""
        failures = 0
        while True:
            headers = {"Last-Event-ID": str(after)} if after is not None else {}
            try:
                with self.http.stream(
                    "GET",
                    f"/v1/jobs/{job_id}/events",
                    headers={"Accept": "text/event-stream", **headers},
                    timeout=httpx.Timeout(60.0, connect=10.0),  # the server pings every 10 s
                ) as resp:
                    if resp.status_code >= 400:
                        resp.read()
                        raise ApiError(resp.status_code, _detail(resp), resp)
                    for raw in sse.parse(resp.iter_lines()):
                        failures = 0
                        ev_id = int(raw.id) if raw.id and raw.id.isdigit() else None
                        if ev_id is not None:
                            after = ev_id
                        ev = Event(raw.event, json.loads(raw.data) if raw.data else None, ev_id)
                        yield ev
                        if ev.event == "end":
                            return
            except httpx.TransportError as exc:
                failures += 1
                if failures > reconnects:
                    raise Unreachable(f"event stream lost: {exc}") from None
                time.sleep(min(2.0, 0.2 * 2**failures))
                continue
            # The server closed without `end` (a restart): reconnect and carry on.
            failures += 1
            if failures > reconnects:
                raise NfError("the event stream closed repeatedly without an end event")
            time.sleep(0.5)

    def wait(
        self,
        job_id: str,
        *,
        on_event: Callable[[Event], None] | None = None,
        timeout: float | None = None,
    ) -> Job:
        """Follow the job's event stream until it is succeeded, failed or cancelled; the final
        job. `timeout` (seconds) raises TimeoutError with the job still going on."""
        started = time.monotonic()
        for ev in self.events(job_id):
            if on_event is not None:
                on_event(ev)
            if ev.event == "end":
                return ev.data
            if timeout is not None and time.monotonic() - started > timeout:
                raise TimeoutError(f"gave up waiting after {timeout:g} s; the job goes on")
        return self.job(job_id)  # not reached: events() ends with `end`

    # ---- rendering -----------------------------------------------------------------------

    def render(
        self,
        job_id: str,
        width: int = 256,
        height: int = 256,
        *,
        camera: Pose | None = None,
        look_at: tuple[Sequence[float], Sequence[float]]
        | tuple[Sequence[float], Sequence[float], Sequence[float]]
        | None = None,
        fov_x_deg: float | None = None,
        output: str | None = None,
        format: str | None = None,
        mode: str | None = None,
        on_progress: RenderProgress | None = None,
        **extra: Any,
    ) -> Rendered:
        """One frame (png, jpeg, png16 or npy). Scene jobs take a `camera` (or `look_at` as
        (eye, target[, up])); `extra` passes other RenderRequest fields (fov_y_deg, fx, fy,
        cx, cy, background). A frame the server turns into a render job (202) is polled until
        it is done, `on_progress` seeing each state."""
        if look_at is not None:
            camera = look_at_pose(*look_at)
        body = _drop_none(
            {
                "width": width,
                "height": height,
                "camera": camera,
                "fov_x_deg": fov_x_deg,
                "output": output,
                "format": format,
                "mode": mode,
                **extra,
            }
        )
        resp = self.request("POST", f"/v1/jobs/{job_id}/render", json=body)
        if resp.status_code == 202:
            return self.wait_render(resp.json(), on_progress=on_progress)
        return _rendered(resp)

    def render_path(
        self,
        job_id: str,
        *,
        width: int | None = None,
        height: int | None = None,
        orbit: Orbit | None = None,
        poses: Sequence[Pose] | None = None,
        camera_path: dict[str, Any] | None = None,
        frame: str | None = None,
        format: str = "webp",
        fps: int | None = None,
        fov_x_deg: float | None = None,
        output: str | None = None,
        mode: str | None = None,
        on_progress: RenderProgress | None = None,
        **extra: Any,
    ) -> Rendered:
        """An animation along a camera path: an `orbit`, a list of `poses`, or a nerfstudio
        `camera_path` (its camera_path.json, with `frame` world or nerfstudio), as webp, gif,
        mp4 or a zip of PNGs. A path job (202) is polled until it is done."""
        body = _drop_none(
            {
                "width": width,
                "height": height,
                "orbit": orbit,
                "poses": list(poses) if poses is not None else None,
                "camera_path": camera_path,
                "frame": frame,
                "format": format,
                "fps": fps,
                "fov_x_deg": fov_x_deg,
                "output": output,
                "mode": mode,
                **extra,
            }
        )
        resp = self.request("POST", f"/v1/jobs/{job_id}/render/path", json=body)
        if resp.status_code == 202:
            return self.wait_render(resp.json(), on_progress=on_progress)
        return _rendered(resp)

    def render_job(self, job_id: str, render_id: str) -> PathJob:
        return self._json("GET", f"/v1/jobs/{job_id}/renders/{render_id}")

    def wait_render(
        self,
        state: PathJob,
        *,
        on_progress: RenderProgress | None = None,
        poll_s: float = 0.5,
        timeout: float | None = None,
    ) -> Rendered:
        """Poll a render job (a path, or a frame too large for one HTTP wait) until it has
        succeeded; its file. Raises NfError when it failed."""
        started = time.monotonic()
        if on_progress:
            on_progress(state)
        while state["status"] not in ("succeeded", "failed"):
            if timeout is not None and time.monotonic() - started > timeout:
                raise TimeoutError(f"render job {state['id']} still {state['status']}")
            time.sleep(poll_s)
            state = self.render_job(state["job_id"], state["id"])
            if on_progress:
                on_progress(state)
        if state["status"] == "failed":
            raise NfError(f"render job {state['id']} failed: {state.get('error')}")
        url = state.get("artifact_url")
        if not url:
            raise NfError(f"render job {state['id']} succeeded without an artifact_url")
        return _rendered(self.request("GET", url, follow_redirects=True))

    def camera_path(self, job_id: str, split: str | None = None) -> dict[str, Any]:
        """The training cameras as a nerfstudio camera_path.json (scene jobs)."""
        params = {"split": split} if split else None
        return self._json("GET", f"/v1/jobs/{job_id}/camera_path", params=params)

    # ---- exports -------------------------------------------------------------------------

    def create_export(
        self, job_id: str, format: str, options: dict[str, Any] | None = None
    ) -> Export:
        """Start an export (a mesh, point cloud or splat file) on a worker; the same format
        and options again answer the same export."""
        body: dict[str, Any] = {"format": format}
        if options:
            body["options"] = options
        return self._json("POST", f"/v1/jobs/{job_id}/exports", json=body)

    def export(self, job_id: str, export_id: str) -> Export:
        return self._json("GET", f"/v1/jobs/{job_id}/exports/{export_id}")

    def exports(self, job_id: str) -> list[Export]:
        return self._json("GET", f"/v1/jobs/{job_id}/exports")["items"]

    def wait_export(
        self,
        export: Export,
        *,
        poll_s: float = 1.0,
        timeout: float | None = None,
        on_progress: Callable[[Export], None] | None = None,
    ) -> Export:
        """Poll an export until it has succeeded; raises NfError when it failed."""
        started = time.monotonic()
        while export.get("status") not in ("succeeded", "failed"):
            if on_progress:
                on_progress(export)
            if timeout is not None and time.monotonic() - started > timeout:
                raise TimeoutError(f"export {export['id']} still {export.get('status')}")
            time.sleep(poll_s)
            export = self.export(export["job_id"], export["id"])
        if on_progress:
            on_progress(export)
        if export["status"] == "failed":
            raise NfError(
                f"export {export['id']} ({export['format']}) failed: {export.get('error')}"
            )
        return export

    def export_file(
        self,
        job_id: str,
        format: str,
        out: str | os.PathLike[str] | None = None,
        options: dict[str, Any] | None = None,
        *,
        on_progress: ByteProgress | None = None,
        timeout: float | None = None,
    ) -> Path:
        """Export, wait for it, download it: the file written (default: the artifact's name in
        the current directory)."""
        export = self.wait_export(self.create_export(job_id, format, options), timeout=timeout)
        target = Path(out) if out is not None else Path(export.get("artifact") or export["id"])
        url = export.get("url") or f"/v1/jobs/{job_id}/artifacts/{export['artifact']}"
        return self.download(url, target, on_progress=on_progress)

    # ---- files ---------------------------------------------------------------------------

    def artifacts(self, job_id: str) -> list[Artifact]:
        """Files a job produced: test renders, results, exports, render-job results."""
        return self._json("GET", f"/v1/jobs/{job_id}/artifacts")["items"]

    def download(
        self,
        url: str,
        out: str | os.PathLike[str],
        *,
        on_progress: ByteProgress | None = None,
    ) -> Path:
        """Stream a file of the API (a path such as an export's `url`, or a full URL) to `out`,
        written whole or not at all. Redirects to the object store are followed (without the
        API key, which httpx drops on a change of origin)."""
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.part")
        try:
            with self.http.stream("GET", url, follow_redirects=True) as resp:
                if resp.status_code >= 400:
                    resp.read()
                    raise ApiError(resp.status_code, _detail(resp), resp)
                total = (
                    int(resp.headers["content-length"])
                    if "content-length" in resp.headers
                    else None
                )
                with tmp.open("wb") as fh:
                    for chunk in resp.iter_bytes(1 << 20):
                        fh.write(chunk)
                        if on_progress:
                            on_progress(resp.num_bytes_downloaded, total)
        except httpx.TransportError as exc:
            tmp.unlink(missing_ok=True)
            raise Unreachable(f"cannot reach {self.base_url}: {exc}") from None
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        os.replace(tmp, out)
        return out

    def download_artifact(
        self,
        job_id: str,
        name: str,
        out: str | os.PathLike[str] | None = None,
        *,
        on_progress: ByteProgress | None = None,
    ) -> Path:
        return self.download(
            f"/v1/jobs/{job_id}/artifacts/{name}",
            out if out is not None else Path(name).name,
            on_progress=on_progress,
        )

    def download_checkpoint(
        self,
        job_id: str,
        out: str | os.PathLike[str],
        *,
        on_progress: ByteProgress | None = None,
    ) -> Path:
        """The job's newest checkpoint (safetensors)."""
        return self.download(f"/v1/jobs/{job_id}/checkpoint", out, on_progress=on_progress)


def _rendered(resp: httpx.Response) -> Rendered:
    step = resp.headers.get("x-checkpoint-step")
    return Rendered(
        content=resp.content,
        content_type=resp.headers.get("content-type"),
        checkpoint_step=int(step) if step and step.isdigit() else None,
        headers=dict(resp.headers),
    )


__all__ = [
    "TERMINAL",
    "ApiError",
    "Client",
    "NfError",
    "Unreachable",
    "look_at_pose",
]
