"""`nf`: the neural-field service from a shell (HTTP only, through nf_client.Client).

    JOB=$(nf submit walkaround.mp4 --kind splat)   # upload (progress on stderr); prints the id
    nf wait $JOB                                   # follows the event stream; exit 0 on success
    nf export $JOB spz --out scene.spz             # export on a worker, then download
    nf open $JOB                                   # the web page's viewer of the job

The base URL comes from --url, else $NF_URL, else http://127.0.0.1:8000; the API key from --key,
else $NF_API_KEY. Results go to stdout (ids, JSON with --json), progress and notes to stderr.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import sys
import time
import webbrowser
from pathlib import Path
from typing import Any, TextIO

from nf_client.client import DEFAULT_URL, Client, NfError, look_at_pose
from nf_client.types import Event, PathJob, Rendered

PATH_FORMATS = {".webp": "webp", ".gif": "gif", ".mp4": "mp4", ".zip": "zip"}
STATUSES = ["queued", "running", "succeeded", "failed", "cancelled"]


class CliError(Exception):
    """Something to tell the user and exit 1 on (no traceback)."""


# ---- output ---------------------------------------------------------------------------


def _fmt(v: Any, nd: int = 4) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.{nd}g}"
    return str(v)


def _dump(obj: Any) -> None:
    print(json.dumps(obj, indent=2))


def _table(header: list[str] | None, rows: list[list[str]]) -> None:
    cols = ([header] if header else []) + rows
    if not cols:
        return
    widths = [max(len(r[i]) for r in cols) for i in range(len(cols[0]))]
    for r in cols:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())


def _size(n: int | None) -> str:
    if n is None:
        return "?"
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


class Bar:
    """One progress line on stderr: redrawn in place on a terminal; elsewhere (logs, pipes)
    printed when its label changes, at most every 10 s otherwise, and once more at the end.
    `after_s`: nothing is shown before this long (a quick upload or download says nothing)."""

    WIDTH = 24

    def __init__(self, enabled: bool = True, stream: TextIO | None = None, after_s: float = 0.0):
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.after_s = after_s
        self.tty = self.stream.isatty()
        self.started = time.monotonic()
        self.line = ""
        self.label = None
        self.printed = ""
        self.printed_at = 0.0

    def update(
        self, label: str, done: float | None = None, total: float | None = None, extra: str = ""
    ):
        if not self.enabled:
            return
        parts = [f"{label:<14}"]
        if total:
            share = max(0.0, min(1.0, (done or 0) / total))
            filled = round(share * self.WIDTH)
            parts.append("[" + "#" * filled + "-" * (self.WIDTH - filled) + f"] {share:4.0%}")
        if extra:
            parts.append(extra)
        el = int(time.monotonic() - self.started)
        parts.append(f"{el // 60}:{el % 60:02d}")
        line = "  ".join(parts)
        if time.monotonic() - self.started < self.after_s:
            return
        if self.tty:
            cols = shutil.get_terminal_size((100, 20)).columns - 1
            self.stream.write("\r" + line[:cols].ljust(min(cols, len(self.line))))
            self.stream.flush()
        elif label != self.label or time.monotonic() - self.printed_at >= 10:
            self._print(line)
        self.line, self.label = line, label

    def _print(self, line: str) -> None:
        self.stream.write(line + "\n")
        self.stream.flush()
        self.printed, self.printed_at = line, time.monotonic()

    def close(self) -> None:
        if not self.enabled or not self.line:
            return
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
        elif self.line != self.printed:
            self._print(self.line)

    def __enter__(self) -> Bar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _bytes_bar(bar: Bar, label: str):
    def cb(done: int, total: int | None) -> None:
        bar.update(label, done, total, f"{_size(done)} of {_size(total)}")

    return cb


def _render_bar(bar: Bar):
    def cb(state: PathJob) -> None:
        if state.get("kind") == "frame":
            done, total, what = state.get("pixels_done") or 0, state.get("n_pixels"), "pixels"
        else:
            done, total, what = state.get("frames_done") or 0, state.get("n_frames"), "frames"
        bar.update(f"render {state['status']}", done, total, f"{done}/{total or '?'} {what}")

    return cb


def _note(text: str) -> None:
    print(text, file=sys.stderr)


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.part")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _wrote(path: Path, r: Rendered) -> None:
    _write(path, r.content)
    _note(f"wrote {path} ({len(r.content)} bytes, {r.content_type})")


# ---- argument types -------------------------------------------------------------------


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


def option_arg(text: str) -> tuple[str, Any]:
    """KEY=VALUE, the value read as JSON when it is (numbers), else kept as text."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--option wants KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value


def camera_body(args) -> dict | None:
    if args.c2w is not None:
        return {"c2w": args.c2w}
    if args.look_at is not None:
        if len(args.look_at) not in (2, 3):
            raise CliError("--look-at takes EYE TARGET [UP], each as x,y,z")
        up = args.look_at[2] if len(args.look_at) == 3 else [0.0, 0.0, 1.0]
        return dict(look_at_pose(args.look_at[0], args.look_at[1], up))
    return None


# ---- commands -------------------------------------------------------------------------


def cmd_submit(nf: Client, args) -> int:
    path: Path = args.path
    if not path.is_file():
        raise CliError(f"{path} is not a file")
    with Bar(enabled=not args.json, after_s=1.0) as bar:
        upload = nf.submit_direct if args.direct else nf.submit
        job = upload(
            path,
            args.kind,
            args.config,
            callback_url=args.callback_url,
            on_progress=_bytes_bar(bar, "uploading"),
        )
    if args.json:
        _dump(job)
    else:
        _note(f"job {job['id']} {job['status']} ({job['kind']})")
        print(job["id"], flush=True)
    if args.wait:
        return wait_for(nf, job["id"], quiet=args.json)
    return 0


def cmd_status(nf: Client, args) -> int:
    job = nf.job(args.id)
    if args.json:
        _dump(job)
        return 0
    p = job.get("progress") or {}
    rows = [["id", job["id"]], ["kind", job["kind"]], ["status", job.get("status", "?")]]
    if p.get("total_steps"):
        rows.append(
            [
                "progress",
                f"{p.get('stage') + ': ' if p.get('stage') else ''}"
                f"step {p.get('step')}/{p.get('total_steps')}  loss {_fmt(p.get('loss'))}  "
                f"psnr {_fmt(p.get('psnr'))}  elapsed {_fmt(p.get('elapsed_s'), 3)} s  "
                f"eta {_fmt(p.get('eta_s'), 3)} s",
            ]
        )
    if job.get("metrics"):
        rows.append(["metrics", json.dumps(job["metrics"])])
    if job.get("error"):
        rows.append(["error", str(job["error"])])
    rows += [
        ["created", job.get("created_at", "")],
        ["updated", job.get("updated_at", "")],
        ["config", json.dumps(job.get("config", {}))],
        ["viewer", nf.viewer_url(job["id"])],
    ]
    _table(None, rows)
    return 0


def wait_for(nf: Client, job_id: str, quiet: bool = False, timeout: float | None = None) -> int:
    with Bar(enabled=not quiet) as bar:
        last: list[Any] = [None, None, ""]  # the latest progress shown: step, total, text

        def progress(data: dict) -> None:
            total = data.get("total_steps") or None
            eta = data.get("eta_s")
            step = data.get("step", 0)
            last[:] = [
                step,
                total,
                f"step {step}/{total or '?'}  loss {_fmt(data.get('loss'))}  "
                f"psnr {_fmt(data.get('psnr'))}  "
                f"eta {f'{eta:.0f}s' if isinstance(eta, (int, float)) else '–'}",
            ]

        def show(ev: Event) -> None:
            data = ev.data or {}
            if ev.event == "progress":
                progress(data)
                bar.update(f"running: {data['stage']}" if data.get("stage") else "running", *last)
            elif ev.event in ("status", "end"):
                if ev.event == "end" and (data.get("progress") or {}).get("total_steps"):
                    progress(data["progress"])
                bar.update(data.get("status", "?"), *last)  # the new status, the last step

        try:
            final = nf.wait(job_id, on_event=show, timeout=timeout)
        except TimeoutError as exc:
            raise CliError(str(exc)) from None
    status = final.get("status")
    if quiet:
        _dump(final)
    else:
        line = f"job {job_id} {status}"
        numbers = {
            k: v
            for k, v in (final.get("metrics") or {}).items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        if numbers:  # the scalar metrics (the rest: nf status)
            line += "  " + "  ".join(f"{k}={_fmt(v)}" for k, v in numbers.items())
        if final.get("error"):
            line += f"  error: {final['error']}"
        print(line, flush=True)
    return 0 if status == "succeeded" else 1


def cmd_wait(nf: Client, args) -> int:
    return wait_for(nf, args.id, quiet=args.json, timeout=args.max_wait)


def cmd_events(nf: Client, args) -> int:
    for ev in nf.events(args.id, after=args.after):
        print(json.dumps({"id": ev.id, "event": ev.event, "data": ev.data}), flush=True)
    return 0


def cmd_render(nf: Client, args) -> int:
    fmt = args.format or ("jpeg" if args.out.suffix.lower() in (".jpg", ".jpeg") else None)
    if fmt is None and args.out.suffix.lower() == ".npy":
        fmt = "npy"
    with Bar(enabled=not args.json) as bar:
        r = nf.render(
            args.id,
            args.width,
            args.height,
            camera=camera_body(args),
            fov_x_deg=args.fov,
            output=args.output,
            format=fmt,
            mode=args.mode,
            on_progress=_render_bar(bar),
        )
    _wrote(args.out, r)
    return 0


def cmd_path(nf: Client, args) -> int:
    fmt = args.format or PATH_FORMATS.get(args.out.suffix.lower())
    if fmt is None:
        raise CliError(
            f"cannot tell the format from {args.out.name}; use --format or one of "
            f"{', '.join(PATH_FORMATS)}"
        )
    kw: dict[str, Any] = {}
    if args.orbit is not None:
        kw["orbit"] = {**args.orbit, "center": args.center, "up": args.up}
    elif args.poses is not None:
        kw["poses"] = json.loads(args.poses.read_text())
    elif args.camera_path is not None:
        kw["camera_path"] = json.loads(args.camera_path.read_text())
        kw["frame"] = args.frame
    else:
        raise CliError(
            "give --orbit RADIUS[,ELEVATION_DEG[,N_FRAMES]], --poses FILE.json or "
            "--camera-path camera_path.json"
        )
    width, height = args.width, args.height
    if "camera_path" in kw:  # the file's render size unless given
        width = width if args.width_given else None
        height = height if args.height_given else None
    with Bar(enabled=not args.json) as bar:
        r = nf.render_path(
            args.id,
            width=width,
            height=height,
            format=fmt,
            fps=args.fps,
            fov_x_deg=args.fov,
            output=args.output,
            mode=args.mode,
            on_progress=_render_bar(bar),
            **kw,
        )
    _wrote(args.out, r)
    return 0


def cmd_list(nf: Client, args) -> int:
    page = nf.jobs(
        limit=args.limit,
        offset=None if args.cursor else args.offset,
        cursor=args.cursor,
        status=args.status,
        kind=args.kind,
    )
    if args.json:
        _dump(page)
        return 0
    rows = []
    for job in page["items"]:
        p = job.get("progress") or {}
        metrics = job.get("metrics") or {}
        prog = f"{p.get('step', 0)}/{p.get('total_steps')}" if p.get("total_steps") else ""
        psnr = metrics.get("psnr", metrics.get("test_psnr", p.get("psnr")))
        created = job.get("created_at", "")[:19].replace("T", " ")
        rows.append([job["id"], job["kind"], job.get("status", "?"), prog, _fmt(psnr), created])
    _table(["id", "kind", "status", "progress", "psnr", "created"], rows)
    _note(f"{len(page['items'])} of {page.get('total', len(page['items']))} jobs")
    if page.get("next_cursor"):
        _note(f"more: nf list --cursor {page['next_cursor']}")
    return 0


def cmd_cancel(nf: Client, args) -> int:
    job = nf.cancel(args.id)
    if args.json:
        _dump(job)
    else:
        print(f"job {job['id']} {job['status']}")
    return 0


def cmd_delete(nf: Client, args) -> int:
    nf.delete(args.id)
    _note(f"job {args.id} deleted")
    return 0


def cmd_export(nf: Client, args) -> int:
    options = dict(args.option or [])
    export = nf.create_export(args.id, args.format, options or None)
    if args.no_wait:
        if args.json:
            _dump(export)
        else:
            print(export["id"])
        return 0
    with Bar(enabled=not args.json) as bar:
        export = nf.wait_export(
            export,
            timeout=args.max_wait,
            on_progress=lambda e: bar.update(f"export {e.get('status')}"),
        )
        target = args.out or Path(export.get("artifact") or f"{export['id']}.{args.format}")
        url = export.get("url") or f"/v1/jobs/{args.id}/artifacts/{export['artifact']}"
        path = nf.download(url, target, on_progress=_bytes_bar(bar, "downloading"))
    if args.json:
        _dump(export)
    else:
        stats = export.get("stats") or {}
        counts = "  ".join(
            f"{k}={v}" for k, v in stats.items() if isinstance(v, (int, float)) and k != "bounds"
        )
        _note(f"export {export['id']} {export['format']} {counts}".rstrip())
        print(path)
    return 0


def cmd_exports(nf: Client, args) -> int:
    items = nf.exports(args.id)
    if args.json:
        _dump({"items": items})
        return 0
    rows = [
        [e["id"], e["format"], e.get("status", "?"), e.get("artifact") or "", _size(e.get("size"))]
        for e in items
    ]
    _table(["id", "format", "status", "artifact", "size"], rows)
    return 0


def cmd_artifacts(nf: Client, args) -> int:
    items = nf.artifacts(args.id)
    if args.json:
        _dump({"items": items})
        return 0
    _table(["name", "size"], [[a["name"], _size(a.get("size"))] for a in items])
    return 0


def cmd_download(nf: Client, args) -> int:
    with Bar(enabled=not args.json, after_s=1.0) as bar:
        progress = _bytes_bar(bar, "downloading")
        if args.name:
            path = nf.download_artifact(args.id, args.name, args.out, on_progress=progress)
        else:
            out = args.out or Path(f"{args.id}.safetensors")
            path = nf.download_checkpoint(args.id, out, on_progress=progress)
    _note(f"wrote {path} ({path.stat().st_size} bytes)")
    return 0


def cmd_camera_path(nf: Client, args) -> int:
    doc = nf.camera_path(args.id)
    text = json.dumps(doc, indent=2)
    if args.out:
        _write(args.out, text.encode())
        _note(f"wrote {args.out} ({len(doc.get('camera_path', []))} cameras)")
    else:
        print(text)
    return 0


def cmd_open(nf: Client, args) -> int:
    nf.job(args.id)  # 404 here rather than an empty page
    url = nf.viewer_url(args.id)
    print(url)
    if not args.print_only:
        try:
            webbrowser.open(url)
        except webbrowser.Error:
            pass
    return 0


def cmd_db(nf: Client, args) -> int:
    # The operator's command of the server package, run beside the service with its settings.
    try:
        server_cli = importlib.import_module("service.cli")
    except ImportError:
        raise CliError(
            "`nf db` is the service's own command: run it where the server package is "
            "installed (python -m core.db upgrade)"
        ) from None
    return server_cli.main(["db", *args.db_args])


# ---- entry point ----------------------------------------------------------------------


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
        prog="nf",
        description="Client of the neural-field service (HTTP only): upload photos or a video, "
        "follow the training, render, export, download.",
        parents=[common],
    )
    subparsers = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def sub_add(name, **kw):
        return subparsers.add_parser(name, parents=[common], **kw)

    s = sub_add("submit", help="upload a dataset and start training; prints the job id")
    s.add_argument(
        "path",
        type=Path,
        help="image: a photo; nerf, splat: a .zip of photos (posed or not) or a video",
    )
    s.add_argument("--kind", default="image", help="job kind: image (default), nerf or splat")
    s.add_argument("--config", type=config_arg, help="JSON object, or @file.json")
    s.add_argument("--callback-url", default=None, help="webhook URL for the job's events")
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

    class _Given(argparse.Action):
        def __call__(self, parser, namespace, values, option_string=None):
            setattr(namespace, self.dest, values)
            setattr(namespace, f"{self.dest}_given", True)

    def view_args(s, width, height):
        s.add_argument("--width", type=int, default=width, action=_Given)
        s.add_argument("--height", type=int, default=height, action=_Given)
        s.set_defaults(width_given=False, height_given=False)
        s.add_argument("--fov", type=float, default=None, help="horizontal field of view, degrees")
        s.add_argument("--output", choices=["rgb", "depth", "alpha"], default=None)
        s.add_argument("--format", default=None, help="output format (default: from --out)")
        s.add_argument("--out", type=Path, required=True)
        s.add_argument(
            "--mode",
            choices=["wait", "job"],
            default=None,
            help="job: render in the background and wait for it here (default: the server "
            "decides by size)",
        )

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
    view_args(s, 256, 256)
    s.set_defaults(fn=cmd_render)

    s = sub_add("path", help="render an animation (webp, gif, mp4, zip) along a camera path")
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
    s.add_argument("--poses", type=Path, default=None, help="JSON file with a list of cameras")
    s.add_argument(
        "--camera-path",
        type=Path,
        default=None,
        help="nerfstudio camera_path.json (its size unless --width/--height)",
    )
    s.add_argument(
        "--frame",
        choices=["world", "nerfstudio"],
        default="world",
        help="--camera-path poses are in the dataset's world frame (default) or nerfstudio's",
    )
    s.add_argument("--fps", type=int, default=None)
    view_args(s, 200, 200)
    s.set_defaults(fn=cmd_path)

    s = sub_add("list", help="list jobs, newest first")
    s.add_argument("--status", choices=STATUSES)
    s.add_argument("--kind")
    s.add_argument("--limit", type=int, default=20)
    s.add_argument("--offset", type=int, default=0)
    s.add_argument("--cursor", help="the next page: the cursor the previous `nf list` printed")
    s.set_defaults(fn=cmd_list)

    s = sub_add("cancel", help="cancel a queued or running job")
    s.add_argument("id")
    s.set_defaults(fn=cmd_cancel)

    s = sub_add("delete", help="remove a finished job and its files")
    s.add_argument("id")
    s.set_defaults(fn=cmd_delete)

    s = sub_add(
        "export",
        help="export a trained scene on a worker and download it: splat jobs spz, splat, "
        "gaussians, point_cloud; nerf jobs glb, ply, obj, point_cloud (docs/exports.md)",
    )
    s.add_argument("id")
    s.add_argument("format")
    s.add_argument(
        "--option",
        "-o",
        type=option_arg,
        action="append",
        metavar="KEY=VALUE",
        help="an export option, e.g. -o resolution=256 (repeatable)",
    )
    s.add_argument("--out", type=Path, default=None, help="file to write (default: its name)")
    s.add_argument("--no-wait", action="store_true", help="start it, print its id, return")
    s.add_argument("--max-wait", type=float, default=None, help="give up after this many seconds")
    s.set_defaults(fn=cmd_export)

    s = sub_add("exports", help="list a job's exports")
    s.add_argument("id")
    s.set_defaults(fn=cmd_exports)

    s = sub_add("artifacts", help="list the files a job produced")
    s.add_argument("id")
    s.set_defaults(fn=cmd_artifacts)

    s = sub_add(
        "download",
        help="download one of the job's artifacts, or without NAME its latest checkpoint",
    )
    s.add_argument("id")
    s.add_argument("name", nargs="?", default=None, help="artifact name (see `nf artifacts`)")
    s.add_argument("--out", type=Path, default=None)
    s.set_defaults(fn=cmd_download)

    s = sub_add("camera-path", help="the training cameras as a nerfstudio camera_path.json")
    s.add_argument("id")
    s.add_argument("--out", type=Path, default=None, help="file (default: stdout)")
    s.set_defaults(fn=cmd_camera_path)

    s = sub_add("open", help="open the job in the web page's viewer (prints its URL)")
    s.add_argument("id")
    s.add_argument("--print", dest="print_only", action="store_true", help="only print the URL")
    s.set_defaults(fn=cmd_open)

    s = subparsers.add_parser(
        "db",
        help="the server's database (operators; needs the server package): upgrade|current|import",
    )
    s.add_argument("db_args", nargs=argparse.REMAINDER, metavar="upgrade|current|import")
    s.set_defaults(fn=cmd_db)
    return p


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
    nf = Client(args.url, key=args.key or "", timeout=args.http_timeout)
    try:
        return args.fn(nf, args)
    except (CliError, NfError) as exc:
        _note(f"error: {exc}")
        return 1
    except KeyboardInterrupt:
        _note("interrupted")
        return 130
    finally:
        nf.close()


if __name__ == "__main__":
    sys.exit(main())
