"""Command-line client for the neural-field service. Talks HTTP only (httpx), never imports
service internals, so it works against any deployment: `python -m service.cli --help`. The one
exception, `nf db`, is an operator's command run beside the service (core/db/__main__.py).

The base URL comes from --url, else $NF_URL, else http://127.0.0.1:8000; the API key from
--key, else $NF_API_KEY (sent as `Authorization: Bearer <key>`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from httpx_sse import SSEError, connect_sse
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

DEFAULT_URL = "http://127.0.0.1:8000"
TERMINAL = {"succeeded", "failed", "cancelled"}
PATH_FORMATS = {".webp": "webp", ".gif": "gif", ".mp4": "mp4", ".zip": "zip"}

# Piped output keeps whole rows (ids!) instead of wrapping at rich's 80-column default.
out = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, highlight=False, soft_wrap=True)


class CliError(Exception):
    """Something to tell the user and exit 1 on (no traceback)."""


# ---- HTTP ---------------------------------------------------------------------------


def _detail(resp: httpx.Response) -> str:
    try:
        detail = resp.json().get("detail")
    except (ValueError, AttributeError):
        detail = None
    if detail is None:
        return f"HTTP {resp.status_code}: {resp.text[:200] or resp.reason_phrase}"
    if isinstance(detail, list):  # FastAPI validation errors
        detail = "; ".join(
            ".".join(str(p) for p in d.get("loc", []) if p != "body") + ": " + d.get("msg", "")
            for d in detail
        )
    return f"HTTP {resp.status_code}: {detail}"


class Api:
    def __init__(self, base_url: str, timeout: float = 120.0, key: str | None = None):
        self.base_url = base_url.rstrip("/")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.client = httpx.Client(
            base_url=self.base_url, timeout=httpx.Timeout(timeout, connect=10.0), headers=headers
        )

    def request(self, method: str, path: str, **kw) -> httpx.Response:
        try:
            resp = self.client.request(method, path, **kw)
        except httpx.TransportError as exc:
            raise CliError(f"cannot reach {self.base_url}: {exc}") from None
        if resp.status_code >= 400:
            raise CliError(_detail(resp))
        return resp

    def json(self, method: str, path: str, **kw) -> Any:
        return self.request(method, path, **kw).json()

    def post_path_render(self, job_id: str, body: dict) -> httpx.Response:
        # `/render/path` is the documented route; `/render_path` is what early servers had.
        last = None
        for route in (f"/v1/jobs/{job_id}/render/path", f"/v1/jobs/{job_id}/render_path"):
            try:
                return self.request("POST", route, json=body)
            except CliError as exc:
                last = exc
                if not str(exc).endswith(": Not Found") and "405" not in str(exc):
                    raise
        raise last  # type: ignore[misc]

    def events(
        self, job_id: str, after: int | None = None
    ) -> Iterator[tuple[str, dict, int | None]]:
        """(event, data, id) from the job's SSE stream until its `end` event; reconnects with
        Last-Event-ID after a dropped connection."""
        retries = 0
        while True:
            headers = {"Last-Event-ID": str(after)} if after is not None else {}
            try:
                with connect_sse(
                    self.client,
                    "GET",
                    f"/v1/jobs/{job_id}/events",
                    headers=headers,
                    timeout=httpx.Timeout(60.0, connect=10.0),
                ) as source:
                    if source.response.status_code >= 400:
                        source.response.read()
                        raise CliError(_detail(source.response))
                    for sse in source.iter_sse():
                        retries = 0
                        if not sse.data and sse.event == "message":
                            continue  # a keep-alive comment, which httpx-sse hands over empty
                        data = json.loads(sse.data) if sse.data else {}
                        ev_id = int(sse.id) if sse.id else None
                        if ev_id is not None:
                            after = ev_id
                        yield sse.event, data, ev_id
                        if sse.event == "end":
                            return
            except (httpx.TransportError, SSEError) as exc:
                retries += 1
                if retries > 5:
                    raise CliError(f"event stream lost: {exc}") from None
                time.sleep(min(2.0, 0.2 * 2**retries))
                continue
            # The server closed without `end` (restart): reconnect and carry on.
            retries += 1
            if retries > 5:
                raise CliError("event stream closed repeatedly without an end event")
            time.sleep(0.5)


# ---- argument parsing helpers -------------------------------------------------------


def vec3(text: str) -> list[float]:
    try:
        vals = [float(v) for v in text.replace(" ", ",").split(",") if v != ""]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not three numbers like 1,2,3") from None
    if len(vals) != 3:
        raise argparse.ArgumentTypeError(f"{text!r} is not three numbers like 1,2,3")
    return vals


def config_arg(text: str) -> dict:
    """Inline JSON, or @file.json."""
    raw = Path(text[1:]).read_text() if text.startswith("@") else text
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--config is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise argparse.ArgumentTypeError("--config must be a JSON object")
    return data


def orbit_arg(text: str) -> dict:
    """RADIUS[,ELEVATION_DEG[,N_FRAMES]]"""
    parts = [p for p in text.split(",") if p.strip()]
    try:
        radius = float(parts[0])
        elevation = float(parts[1]) if len(parts) > 1 else 30.0
        frames = int(parts[2]) if len(parts) > 2 else 36
    except (ValueError, IndexError):
        raise argparse.ArgumentTypeError(
            f"--orbit wants RADIUS[,ELEVATION_DEG[,N_FRAMES]], got {text!r}"
        ) from None
    if len(parts) > 3:
        raise argparse.ArgumentTypeError(f"--orbit wants at most 3 values, got {text!r}")
    return {"radius": radius, "elevation_deg": elevation, "n_frames": frames}


def camera_body(args) -> dict | None:
    if args.c2w is not None:
        cam: dict[str, Any] = {"c2w": args.c2w}
    elif args.look_at is not None:
        if len(args.look_at) not in (2, 3):
            raise CliError("--look-at takes EYE TARGET [UP], each as x,y,z")
        eye, target = args.look_at[0], args.look_at[1]
        up = args.look_at[2] if len(args.look_at) == 3 else [0.0, 0.0, 1.0]
        cam = {"look_at": {"eye": eye, "target": target, "up": up}}
    else:
        return None
    return cam


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.part")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _fmt(v: Any, nd: int = 4) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.{nd}g}"
    return str(v)


def _dump(obj: Any) -> None:
    out.print_json(json.dumps(obj))


# ---- commands -----------------------------------------------------------------------


def _direct_upload(api: Api, path: Path, kind: str, config: Any) -> dict:
    """The file PUT in parts straight to the object store (POST /v1/uploads), then completed:
    the job. A failed part cancels the upload."""
    body: dict[str, Any] = {"kind": kind, "filename": path.name, "size": path.stat().st_size}
    if config is not None:
        body["config"] = config
    up = api.json("POST", "/v1/uploads", json=body)
    n = len(up["part_urls"])
    try:
        # The URLs carry their own permission: the API key never goes to the store.
        with httpx.Client(timeout=api.client.timeout) as store, path.open("rb") as fh:
            for i, url in enumerate(up["part_urls"], 1):
                try:
                    r = store.put(url, content=fh.read(up["part_size"]))
                except httpx.TransportError as exc:
                    raise CliError(f"part {i} of {n}: cannot reach the store: {exc}") from None
                if r.status_code >= 300:
                    raise CliError(f"part {i} of {n}: the store answered HTTP {r.status_code}")
    except BaseException:
        try:
            api.request("DELETE", f"/v1/uploads/{up['id']}")
        except CliError:
            pass
        raise
    return api.json("POST", up["complete_url"])


def cmd_submit(api: Api, args) -> int:
    path: Path = args.path
    if not path.is_file():
        raise CliError(f"{path} is not a file")
    if args.direct:
        job = _direct_upload(api, path, args.kind, args.config)
    else:
        data = {"kind": args.kind}
        if args.config is not None:
            data["config"] = json.dumps(args.config)
        with path.open("rb") as fh:
            job = api.json("POST", "/v1/jobs", data=data, files={"dataset": (path.name, fh)})
    if args.json:
        _dump(job)
    else:
        err.print(f"job {job['id']} {job['status']} ({job['kind']})")
        out.print(job["id"])
    if args.wait:
        return wait_for(api, job["id"], quiet=args.json)
    return 0


def cmd_status(api: Api, args) -> int:
    job = api.json("GET", f"/v1/jobs/{args.id}")
    if args.json:
        _dump(job)
        return 0
    p = job.get("progress") or {}
    t = Table(show_header=False, box=None)
    t.add_row("id", job["id"])
    t.add_row("kind", job["kind"])
    t.add_row("status", job["status"])
    if p.get("total_steps"):
        t.add_row(
            "progress",
            f"step {p.get('step')}/{p.get('total_steps')}  loss {_fmt(p.get('loss'))}  "
            f"psnr {_fmt(p.get('psnr'))}  elapsed {_fmt(p.get('elapsed_s'), 3)} s  "
            f"eta {_fmt(p.get('eta_s'), 3)} s",
        )
    if job.get("metrics"):
        t.add_row("metrics", json.dumps(job["metrics"]))
    if job.get("error"):
        t.add_row("error", job["error"])
    t.add_row("created", job.get("created_at", ""))
    t.add_row("updated", job.get("updated_at", ""))
    t.add_row("config", json.dumps(job.get("config", {})))
    out.print(t)
    return 0


def wait_for(api: Api, job_id: str, quiet: bool = False, timeout: float | None = None) -> int:
    started = time.monotonic()
    columns = [
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        TextColumn("step {task.fields[steps]}"),
        TextColumn("loss {task.fields[loss]}  psnr {task.fields[psnr]}"),
        TextColumn("eta {task.fields[eta]}"),
        TimeElapsedColumn(),
    ]
    final: dict = {}
    with Progress(*columns, console=err, disable=quiet, transient=False) as bar:
        task = bar.add_task("queued", total=None, steps="–", loss="–", psnr="–", eta="–")
        for event, data, _ in api.events(job_id):
            if timeout is not None and time.monotonic() - started > timeout:
                raise CliError(f"gave up waiting after {timeout:g} s; the job goes on")
            if event == "progress":
                total = data.get("total_steps") or None
                eta = data.get("eta_s")
                bar.update(
                    task,
                    description=f"running: {data['stage']}" if data.get("stage") else "running",
                    total=total,
                    completed=data.get("step", 0),
                    steps=f"{data.get('step', 0)}/{total or '?'}",
                    loss=_fmt(data.get("loss")),
                    psnr=_fmt(data.get("psnr")),
                    eta=f"{eta:.0f}s" if isinstance(eta, (int, float)) else "–",
                )
            elif event == "status":
                bar.update(task, description=data.get("status", "?"))
            elif event == "end":
                final = data
                bar.update(task, description=data.get("status", "?"))
    status = final.get("status")
    if quiet:
        _dump(final)
    else:
        line = f"job {job_id} {status}"
        if final.get("metrics"):
            line += "  " + "  ".join(f"{k}={_fmt(v)}" for k, v in final["metrics"].items())
        if final.get("error"):
            line += f"  error: {final['error']}"
        out.print(line)
    return 0 if status == "succeeded" else 1


def cmd_wait(api: Api, args) -> int:
    return wait_for(api, args.id, quiet=args.json, timeout=args.max_wait)


def cmd_events(api: Api, args) -> int:
    for event, data, ev_id in api.events(args.id, after=args.after):
        out.print(json.dumps({"id": ev_id, "event": event, "data": data}))
    return 0


def cmd_render(api: Api, args) -> int:
    body: dict[str, Any] = {"width": args.width, "height": args.height}
    cam = camera_body(args)
    if cam is not None:
        body["camera"] = cam
    if args.fov is not None:
        body["fov_x_deg"] = args.fov
    if args.output is not None:
        body["output"] = args.output
    fmt = args.format or ("jpeg" if args.out.suffix.lower() in (".jpg", ".jpeg") else None)
    if fmt:
        body["format"] = fmt
    if args.mode:
        body["mode"] = args.mode
    resp = api.request("POST", f"/v1/jobs/{args.id}/render", json=body)
    if resp.status_code == 202:  # a frame too large for one HTTP wait: a render job to poll
        resp = wait_render_job(api, resp.json(), quiet=getattr(args, "json", False))
    _write(args.out, resp.content)
    err.print(f"wrote {args.out} ({len(resp.content)} bytes, {resp.headers.get('content-type')})")
    return 0


def wait_render_job(api: Api, state: dict, quiet: bool = False) -> httpx.Response:
    """Polls a render job (POST render or render/path answered 202) with a progress bar until it
    succeeds; returns the response carrying its file."""
    frame = state.get("kind") == "frame"
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        TimeElapsedColumn(),
        console=err,
        disable=quiet,
    ) as bar:
        task = bar.add_task(f"render job {state['id']}", total=None)
        while state["status"] not in ("succeeded", "failed"):
            time.sleep(0.5)
            state = api.json("GET", state["url"])
            done, total = (
                (state.get("pixels_done") or 0, state.get("n_pixels"))
                if frame
                else (state.get("frames_done", 0), state.get("n_frames"))
            )
            bar.update(task, completed=done, total=total, description=state["status"])
    if state["status"] == "failed":
        raise CliError(f"render job {state['id']} failed: {state.get('error')}")
    return api.request("GET", state["artifact_url"])


def cmd_path(api: Api, args) -> int:
    fmt = args.format or PATH_FORMATS.get(args.out.suffix.lower())
    if fmt is None:
        raise CliError(
            f"cannot tell the format from {args.out.name}; use --format or one of "
            f"{', '.join(PATH_FORMATS)}"
        )
    body: dict[str, Any] = {"width": args.width, "height": args.height, "format": fmt}
    if args.orbit is not None:
        orbit = dict(args.orbit)
        orbit["center"] = args.center
        orbit["up"] = args.up
        body["orbit"] = orbit
    elif args.poses is not None:
        body["poses"] = json.loads(args.poses.read_text())
    else:
        raise CliError("give --orbit RADIUS[,ELEVATION_DEG[,N_FRAMES]] or --poses FILE.json")
    if args.fov is not None:
        body["fov_x_deg"] = args.fov
    if args.output is not None:
        body["output"] = args.output
    resp = api.post_path_render(args.id, body)
    _write(args.out, resp.content)
    err.print(f"wrote {args.out} ({len(resp.content)} bytes, {resp.headers.get('content-type')})")
    return 0


def cmd_list(api: Api, args) -> int:
    params: dict[str, Any] = {"limit": args.limit, "offset": args.offset}
    if args.cursor:
        params = {"limit": args.limit, "cursor": args.cursor}
    if args.status:
        params["status"] = args.status
    if args.kind:
        params["kind"] = args.kind
    page = api.json("GET", "/v1/jobs", params=params)
    if args.json:
        _dump(page)
        return 0
    t = Table("id", "kind", "status", "progress", "psnr", "created")
    for job in page["items"]:
        p = job.get("progress") or {}
        prog = f"{p.get('step', 0)}/{p.get('total_steps')}" if p.get("total_steps") else ""
        psnr = (job.get("metrics") or {}).get(
            "psnr", (job.get("metrics") or {}).get("test_psnr", p.get("psnr"))
        )
        t.add_row(
            job["id"],
            job["kind"],
            job["status"],
            prog,
            _fmt(psnr),
            job.get("created_at", "")[:19].replace("T", " "),
        )
    out.print(t)
    err.print(f"{len(page['items'])} of {page.get('total', len(page['items']))} jobs")
    if page.get("next_cursor"):
        err.print(f"more: nf list --cursor {page['next_cursor']}", markup=False)
    return 0


def cmd_cancel(api: Api, args) -> int:
    job = api.json("POST", f"/v1/jobs/{args.id}/cancel")
    if args.json:
        _dump(job)
    else:
        out.print(f"job {job['id']} {job['status']}")
    return 0


def cmd_download(api: Api, args) -> int:
    resp = api.request("GET", f"/v1/jobs/{args.id}/checkpoint")
    _write(args.out, resp.content)
    err.print(f"wrote {args.out} ({len(resp.content)} bytes)")
    return 0


# ---- entry point --------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    # Shared flags work before or after the command; SUPPRESS keeps a subcommand's unset
    # flag from overwriting one given before it.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--url",
        default=argparse.SUPPRESS,
        help=f"service base URL (env NF_URL; default {DEFAULT_URL})",
    )
    common.add_argument(
        "--key",
        default=argparse.SUPPRESS,
        help="API key (env NF_API_KEY); prefer the env var, argv is visible to other users",
    )
    common.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS,
        help="print raw JSON instead of tables",
    )
    common.add_argument(
        "--http-timeout",
        type=float,
        default=argparse.SUPPRESS,
        help="HTTP timeout per request, seconds (120)",
    )
    p = argparse.ArgumentParser(
        prog="nf", description="Client for the neural-field service (HTTP only).", parents=[common]
    )
    subparsers = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def sub_add(name, **kw):
        return subparsers.add_parser(name, parents=[common], **kw)

    s = sub_add("submit", help="upload a dataset and start training; prints the job id")
    s.add_argument("path", type=Path, help="image (PNG/JPEG) or dataset archive (.zip)")
    s.add_argument("--kind", default="image", help="job kind: image (default) or nerf")
    s.add_argument("--config", type=config_arg, help="JSON object, or @file.json")
    s.add_argument("--wait", action="store_true", help="then wait for it with a progress bar")
    s.add_argument(
        "--direct",
        action="store_true",
        help="send the file in parts straight to the server's object storage (S3 deployments)",
    )
    s.set_defaults(fn=cmd_submit)

    s = sub_add("status", help="show one job")
    s.add_argument("id")
    s.set_defaults(fn=cmd_status)

    s = sub_add("wait", help="follow a job with a progress bar; exit 0 only if it succeeded")
    s.add_argument("id")
    s.add_argument("--max-wait", type=float, default=None, help="give up after this many seconds")
    s.set_defaults(fn=cmd_wait)

    s = sub_add("events", help="print the job's event stream as JSON lines until it ends")
    s.add_argument("id")
    s.add_argument("--after", type=int, default=None, help="replay only events after this id")
    s.set_defaults(fn=cmd_events)

    def view_args(s, width, height):
        s.add_argument("--width", type=int, default=width)
        s.add_argument("--height", type=int, default=height)
        s.add_argument("--fov", type=float, default=None, help="horizontal field of view, degrees")
        s.add_argument("--output", choices=["rgb", "depth", "alpha"], default=None)
        s.add_argument("--format", default=None, help="output format (default: from --out)")
        s.add_argument("--out", type=Path, required=True)

    s = sub_add("render", help="render one frame to a file")
    s.add_argument("id")
    s.add_argument(
        "--look-at",
        dest="look_at",
        nargs="+",
        type=vec3,
        metavar="X,Y,Z",
        help="EYE TARGET [UP] in the dataset's world frame (UP defaults to 0,0,1)",
    )
    s.add_argument("--c2w", type=json.loads, default=None, help="camera-to-world 4x4 as JSON")
    s.add_argument(
        "--mode",
        choices=["wait", "job"],
        default=None,
        help="job: render in the background and wait for it here (default: the server decides "
        "by size; a large frame is a render job either way)",
    )
    view_args(s, 256, 256)
    s.set_defaults(fn=cmd_render)

    s = sub_add("path", help="render an animation along a camera path to a file")
    s.add_argument("id")
    s.add_argument(
        "--orbit",
        type=orbit_arg,
        metavar="R[,ELEV[,N]]",
        help="orbit radius, elevation in degrees (30) and frame count (36)",
    )
    s.add_argument("--center", type=vec3, default=[0.0, 0.0, 0.0], metavar="X,Y,Z")
    s.add_argument(
        "--up",
        type=vec3,
        default=[0.0, 0.0, 1.0],
        metavar="X,Y,Z",
        help="orbit axis (default 0,0,1 as render's --look-at)",
    )
    s.add_argument(
        "--poses", type=Path, default=None, help="JSON file with a list of cameras instead"
    )
    view_args(s, 200, 200)
    s.set_defaults(fn=cmd_path)

    s = sub_add("list", help="list jobs, newest first")
    s.add_argument("--status", choices=["queued", "running", "succeeded", "failed", "cancelled"])
    s.add_argument("--kind")
    s.add_argument("--limit", type=int, default=20)
    s.add_argument("--offset", type=int, default=0)
    s.add_argument("--cursor", help="the next page: the cursor the previous `nf list` printed")
    s.set_defaults(fn=cmd_list)

    s = sub_add("cancel", help="cancel a queued or running job")
    s.add_argument("id")
    s.set_defaults(fn=cmd_cancel)

    s = subparsers.add_parser(
        "db",
        help="the service's own database, run beside the service with its environment "
        "(DATABASE_URL or DATA_DIR): `nf db upgrade` applies the migrations",
    )
    s.add_argument("db_args", nargs=argparse.REMAINDER, metavar="upgrade|current|import")
    s.set_defaults(fn=cmd_db)

    s = sub_add("download", help="download the job's latest checkpoint")
    s.add_argument("id")
    s.add_argument("--out", type=Path, required=True)
    s.set_defaults(fn=cmd_download)
    return p


def cmd_db(api: Api, args) -> int:
    # The one command that is not an HTTP client: it needs the service's packages installed.
    from core.db.__main__ import main as db_main

    return db_main(args.db_args)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Filled in here, not with set_defaults: parents share action objects, so a default set
    # on the top parser would reach every subcommand and overwrite a flag given before it.
    for name, default in (
        ("url", os.environ.get("NF_URL") or DEFAULT_URL),
        ("json", False),
        ("http_timeout", 120.0),
        ("key", os.environ.get("NF_API_KEY") or None),
    ):
        if not hasattr(args, name):
            setattr(args, name, default)
    api = Api(args.url, timeout=args.http_timeout, key=args.key)
    try:
        return args.fn(api, args)
    except CliError as exc:
        err.print(f"error: {exc}", markup=False)
        return 1
    except KeyboardInterrupt:
        err.print("interrupted")
        return 130
    finally:
        api.client.close()


if __name__ == "__main__":
    sys.exit(main())
