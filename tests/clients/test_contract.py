"""The Python client (clients/python) against the committed OpenAPI document
(clients/openapi.json), with no server: every public method of `Client` is called through a
recording transport, and each request it sends must be a path and method of the document, with
only the query parameters, headers, multipart fields and JSON body fields the document declares
(bodies validated against its schemas). The client's TypedDicts must match the schemas they are
named after, field for field and type for type; the canned answers used here must too.

tests/clients/test_openapi_file.py keeps the document equal to the app's.
"""

from __future__ import annotations

import json
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal, get_args, get_origin, get_type_hints
from urllib.parse import parse_qsl, urlsplit

import httpx
import jsonschema
import nf_client  # noqa: E402  (on sys.path through tests/clients/conftest.py)
import pytest
from nf_client import Client
from nf_client import types as wire

from tests.support.stack import REPO

DOC = json.loads((REPO / "clients" / "openapi.json").read_text())
SCHEMAS = DOC["components"]["schemas"]
BASE = "http://nf.test"
STORE = "http://store.test"
JOB_ID = "3f0c2a4e-0000-4000-8000-000000000001"
# Headers every request may carry that no operation declares.
STANDARD_HEADERS = {
    "host",
    "accept",
    "accept-encoding",
    "connection",
    "user-agent",
    "authorization",
    "content-type",
    "content-length",
}
# TypedDict -> the schema it is named after (Artifact has none: its list answer is untyped).
TYPED = {
    wire.Job: "Job",
    wire.JobList: "JobList",
    wire.Progress: "Progress",
    wire.Upload: "Upload",
    wire.Export: "Export",
    wire.ExportList: "ExportList",
    wire.PathJob: "PathJob",
    wire.LookAt: "LookAt",
    wire.Pose: "Pose",
    wire.Orbit: "Orbit",
}

# ---- canned answers (each checked against its schema below) --------------------------

NOW = "2026-01-01T00:00:00Z"
JOB = {
    "id": JOB_ID,
    "kind": "splat",
    "status": "succeeded",
    "created_at": NOW,
    "updated_at": NOW,
    "config": {"steps": 30},
    "progress": {"step": 30, "total_steps": 30, "elapsed_s": 3.0, "psnr": 20.0},
    "metrics": {"test_psnr": 20.0},
    "error": None,
    "dataset": {},
}
EXPORT = {
    "id": "e1",
    "job_id": JOB_ID,
    "format": "spz",
    "options": {},
    "status": "succeeded",
    "created_at": NOW,
    "updated_at": NOW,
    "artifact": "scene.spz",
    "url": f"/v1/jobs/{JOB_ID}/artifacts/scene.spz",
    "size": 4,
    "stats": {"gaussians": 10},
    "error": None,
}


def path_job(kind: str, status: str) -> dict:
    return {
        "id": "r1",
        "job_id": JOB_ID,
        "kind": kind,
        "status": status,
        "format": "png" if kind == "frame" else "webp",
        "n_frames": 1,
        "frames_done": 1 if status == "succeeded" else 0,
        "n_pixels": 4 if kind == "frame" else None,
        "pixels_done": 4 if status == "succeeded" else 0,
        "checkpoint_step": 30,
        "artifact": "frame-r1.png" if status == "succeeded" else None,
        "artifact_url": f"/v1/jobs/{JOB_ID}/artifacts/frame-r1.png"
        if status == "succeeded"
        else None,
        "url": f"/v1/jobs/{JOB_ID}/renders/r1",
        "error": None,
        "created_at": NOW,
        "updated_at": NOW,
    }


UPLOAD = {
    "id": JOB_ID,
    "part_size": 3,
    "part_urls": [f"{STORE}/part/1", f"{STORE}/part/2"],
    "expires_in_s": 3600,
    "complete_url": f"/v1/uploads/{JOB_ID}/complete",
}
EVENTS = (
    'id: 1\nevent: status\ndata: {"status": "running"}\n\n'
    ": ping\n\n"
    'id: 2\nevent: progress\ndata: {"step": 30, "total_steps": 30}\n\n'
    f"event: end\ndata: {json.dumps(JOB)}\n\n"
)


class Recorder:
    """An httpx transport answering as the service would, keeping every request."""

    def __init__(self):
        self.requests: list[httpx.Request] = []
        self.render_202 = False

    def __call__(self, request: httpx.Request) -> httpx.Response:
        request.read()
        self.requests.append(request)
        url, m = request.url, request.method
        if url.host == "store.test":
            return httpx.Response(200)
        p = url.path
        j = f"/v1/jobs/{JOB_ID}"
        answers: dict[tuple[str, str], Any] = {
            ("GET", "/healthz"): {"status": "ok"},
            ("GET", "/readyz"): {"status": "ready", "kinds": ["image", "nerf", "splat"]},
            ("POST", "/v1/jobs"): (202, {**JOB, "status": "queued"}),
            ("POST", "/v1/uploads"): (201, UPLOAD),
            ("POST", f"/v1/uploads/{JOB_ID}/complete"): (202, {**JOB, "status": "queued"}),
            ("DELETE", f"/v1/uploads/{JOB_ID}"): 204,
            ("GET", "/v1/jobs"): {
                "items": [JOB],
                "total": 1,
                "limit": 100,
                "offset": 0,
                "next_cursor": None,
            },
            ("GET", j): JOB,
            ("DELETE", j): 204,
            ("POST", f"{j}/cancel"): {**JOB, "status": "cancelled"},
            ("GET", f"{j}/renders/r1"): path_job("frame", "succeeded"),
            ("GET", f"{j}/camera_path"): {
                "render_width": 4,
                "render_height": 4,
                "camera_path": [],
            },
            ("POST", f"{j}/exports"): (202, {**EXPORT, "status": "queued"}),
            ("GET", f"{j}/exports"): {"items": [EXPORT]},
            ("GET", f"{j}/exports/e1"): EXPORT,
            ("GET", f"{j}/artifacts"): {
                "items": [{"name": "scene.spz", "size": 4, "url": f"{j}/artifacts/scene.spz"}]
            },
        }
        if (m, p) == ("GET", f"{j}/events"):
            return httpx.Response(
                200, content=EVENTS.encode(), headers={"content-type": "text/event-stream"}
            )
        if m == "POST" and p in (f"{j}/render", f"{j}/render/path"):
            if self.render_202:
                return httpx.Response(202, json=path_job("frame", "queued"))
            return httpx.Response(
                200,
                content=b"\x89PNG",
                headers={"content-type": "image/png", "x-checkpoint-step": "30"},
            )
        if m == "GET" and (p.startswith(f"{j}/artifacts/") or p == f"{j}/checkpoint"):
            return httpx.Response(200, content=b"data", headers={"content-length": "4"})
        answer = answers.get((m, p))
        if answer is None:
            return httpx.Response(404, json={"detail": f"no canned answer for {m} {p}"})
        if isinstance(answer, int):
            return httpx.Response(answer)
        status, body = answer if isinstance(answer, tuple) else (200, answer)
        return httpx.Response(status, json=body)


# Every public method of Client, called once or more (plumbing aside).
PLUMBING = {"close", "request", "viewer_url"}


def exercise(client: Client, rec: Recorder, tmp: Path) -> set[str]:
    photo = tmp / "photo.png"
    photo.write_bytes(b"\x89PNG-not-really")
    poses = [{"look_at": {"eye": [3, 0, 1], "target": [0, 0, 0]}}, {"c2w": [[1, 0, 0, 0]] * 3}]
    calls = {
        "health": lambda: client.health(),
        "ready": lambda: client.ready(),
        "submit": lambda: client.submit(
            photo, "splat", {"steps": 30}, callback_url="https://hook.test/x", on_progress=print
        ),
        "submit_direct": lambda: client.submit_direct(
            photo, "nerf", {"steps": 30}, callback_url="https://hook.test/x"
        ),
        "job": lambda: client.job(JOB_ID),
        "jobs": lambda: (
            client.jobs(limit=5, offset=5, status="running", kind="nerf"),
            client.jobs(cursor="abc"),
        ),
        "iter_jobs": lambda: list(client.iter_jobs(status="succeeded", kind="splat")),
        "cancel": lambda: client.cancel(JOB_ID),
        "delete": lambda: client.delete(JOB_ID),
        "events": lambda: list(client.events(JOB_ID, after=1)),
        "wait": lambda: client.wait(JOB_ID),
        "render": lambda: (
            client.render(
                JOB_ID,
                64,
                48,
                look_at=([3, -2, 1.5], [0, 0, 0], [0, 0, 1]),
                fov_x_deg=40,
                output="depth",
                format="png16",
                mode="job",
                background="white",
                fy=40.0,
            ),
            client.render(JOB_ID, camera={"c2w": [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 4]]}),
        ),
        "render_path": lambda: (
            client.render_path(
                JOB_ID,
                width=32,
                height=32,
                orbit={"radius": 3, "elevation_deg": 30, "n_frames": 4, "center": [0, 0, 0]},
                format="mp4",
                fps=24,
                fov_x_deg=50,
                output="rgb",
                mode="job",
            ),
            client.render_path(JOB_ID, poses=poses, format="gif"),
            client.render_path(
                JOB_ID,
                camera_path={
                    "render_width": 8,
                    "render_height": 8,
                    "camera_path": [{"camera_to_world": [1.0] * 16, "fov": 50}],
                },
                frame="world",
                format="zip",
            ),
        ),
        "render_job": lambda: client.render_job(JOB_ID, "r1"),
        "wait_render": lambda: client.wait_render(path_job("frame", "queued"), poll_s=0),
        "camera_path": lambda: (client.camera_path(JOB_ID), client.camera_path(JOB_ID, "train")),
        "create_export": lambda: client.create_export(JOB_ID, "glb", {"resolution": 128}),
        "export": lambda: client.export(JOB_ID, "e1"),
        "exports": lambda: client.exports(JOB_ID),
        "wait_export": lambda: client.wait_export({**EXPORT, "status": "queued"}, poll_s=0),
        "export_file": lambda: client.export_file(JOB_ID, "spz", tmp / "scene.spz"),
        "artifacts": lambda: client.artifacts(JOB_ID),
        "download": lambda: client.download(f"/v1/jobs/{JOB_ID}/artifacts/x.ply", tmp / "x.ply"),
        "download_artifact": lambda: client.download_artifact(JOB_ID, "a.png", tmp / "a.png"),
        "download_checkpoint": lambda: client.download_checkpoint(JOB_ID, tmp / "c.safetensors"),
    }
    for fn in calls.values():
        fn()
    rec.render_202 = True  # the 202 branches: a render job polled to its file
    client.render(JOB_ID, 2000, 2000)
    client.render_path(JOB_ID, orbit={"radius": 2})
    return set(calls)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    rec = Recorder()
    with Client(BASE, key="k", transport=httpx.MockTransport(rec)) as client:
        called = exercise(client, rec, tmp_path_factory.mktemp("contract"))
    return rec, called


def test_every_public_method_is_exercised(recorded):
    _, called = recorded
    public = {n for n, v in vars(Client).items() if not n.startswith("_") and callable(v)}
    assert public - PLUMBING - called == set(), "add the new methods to exercise()"
    assert called - public == set()


# ---- requests against the document ---------------------------------------------------


def _operation(method: str, path: str) -> tuple[str, dict]:
    for template, item in DOC["paths"].items():
        pattern = "^" + re.sub(r"\\{[^}]+\\}", "[^/]+", re.escape(template)) + "$"
        if re.match(pattern, path):
            assert method.lower() in item, f"{method} {path}: {template} has no {method}"
            return template, item[method.lower()]
    raise AssertionError(f"{method} {path} is not a path of clients/openapi.json")


def _with_components(schema: dict) -> dict:
    return {**schema, "components": DOC["components"]}


def _resolve(schema: dict) -> dict:
    while "$ref" in schema:
        schema = SCHEMAS[schema["$ref"].rsplit("/", 1)[1]]
    return schema


def _objects(schema: dict) -> list[dict]:
    """The object schemas a value may match (through $ref and anyOf/oneOf)."""
    schema = _resolve(schema)
    variants = schema.get("anyOf") or schema.get("oneOf")
    if variants:
        return [o for v in variants for o in _objects(v)]
    return [schema] if schema.get("type") == "object" or "properties" in schema else []


def _unknown_keys(value: Any, schema: dict, where: str) -> list[str]:
    """Keys sent that the schema does not name (even where it would let them through)."""
    bad = []
    if isinstance(value, dict):
        objs = [o for o in _objects(schema) if "properties" in o]
        if not objs:
            return []  # a free-form object (config, options of old servers)
        props = {k: s for o in objs for k, s in o["properties"].items()}
        for k, v in value.items():
            if k not in props:
                bad.append(f"{where}.{k}")
            else:
                bad += _unknown_keys(v, props[k], f"{where}.{k}")
    elif isinstance(value, list):
        s = _resolve(schema)
        for variant in s.get("anyOf", [s]):
            variant = _resolve(variant)
            if variant.get("type") == "array" and "items" in variant:
                for i, v in enumerate(value):
                    bad += _unknown_keys(v, variant["items"], f"{where}[{i}]")
    return bad


def _multipart_fields(request: httpx.Request) -> dict[str, str]:
    boundary = request.headers["content-type"].split("boundary=")[1].encode()
    fields = {}
    for part in request.content.split(b"--" + boundary)[1:-1]:
        head, _, body = part.partition(b"\r\n\r\n")
        name = re.search(rb'name="([^"]+)"', head).group(1).decode()
        fields[name] = "<file>" if b"filename=" in head else body[:-2].decode()
    return fields


def test_every_request_is_in_the_document(recorded):
    rec, _ = recorded
    problems, seen = [], set()
    for req in rec.requests:
        if req.url.host == "store.test":
            assert req.method == "PUT" and "authorization" not in req.headers
            continue
        where = f"{req.method} {req.url.path}"
        template, op = _operation(req.method, req.url.path)
        seen.add((req.method, template))
        params = op.get("parameters", [])
        query = {p["name"]: p for p in params if p["in"] == "query"}
        for name, _value in parse_qsl(urlsplit(str(req.url)).query):
            if name not in query:
                problems.append(f"{where}: query parameter {name!r} is not declared")
        header_names = {p["name"].lower() for p in params if p["in"] == "header"}
        for name in req.headers:
            if name.lower() not in STANDARD_HEADERS | header_names:
                problems.append(f"{where}: header {name!r} is not declared")
        content = op.get("requestBody", {}).get("content", {})
        ctype = req.headers.get("content-type", "").split(";")[0]
        if not req.content:
            if op.get("requestBody", {}).get("required"):
                problems.append(f"{where}: sends no body, the document requires one")
            continue
        if ctype not in content:
            problems.append(f"{where}: sends {ctype}, the document takes {sorted(content)}")
            continue
        schema = content[ctype]["schema"]
        if ctype == "application/json":
            body = json.loads(req.content)
            problems += [
                f"{where}: {k} is not in the schema" for k in _unknown_keys(body, schema, "body")
            ]
        else:  # multipart: every field is a string (the file a binary one)
            body = _multipart_fields(req)
            problems += [
                f"{where}: form field {k!r} is not declared"
                for k in body
                if k not in _resolve(schema).get("properties", {})
            ]
        try:
            jsonschema.validate(body, _with_components(schema))
        except jsonschema.ValidationError as exc:
            problems.append(f"{where}: {exc.message} at {list(exc.absolute_path)}")
    assert not problems, "\n".join(problems)
    # every route the client is written for is reached at least once
    used = {(m, t) for m, t in seen}
    assert ("POST", "/v1/jobs/{job_id}/render/path") in used and (
        "GET",
        "/v1/jobs/{job_id}/events",
    ) in used


def test_the_202_answers_the_client_polls_are_documented():
    for path in ("/v1/jobs/{job_id}/render", "/v1/jobs/{job_id}/render/path"):
        answer = DOC["paths"][path]["post"]["responses"]["202"]
        assert answer["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/PathJob"
        }


# ---- the TypedDicts against the schemas ----------------------------------------------


def _ann_types(ann: Any) -> tuple[set[str], set | None]:
    """(JSON types, enum values or None) of a Python annotation."""
    origin = get_origin(ann)
    if ann is Any:
        return {"any"}, None
    if ann is type(None):
        return {"null"}, None
    if origin is Literal:
        return {"string"}, set(get_args(ann))
    if origin in (typing.Union, types.UnionType):
        found, enum = set(), None
        for a in get_args(ann):
            t, e = _ann_types(a)
            found |= t
            enum = e if e is not None else enum
        return found, enum
    if origin is list or ann is list:
        return {"array"}, None
    if origin is dict or ann is dict or typing.is_typeddict(ann):
        return {"object"}, None
    return {{str: "string", int: "integer", float: "number", bool: "boolean"}[ann]}, None


def _schema_types(schema: dict) -> tuple[set[str], set | None]:
    schema = _resolve(schema)
    for key in ("anyOf", "oneOf"):
        if key in schema:
            found, enum = set(), None
            for v in schema[key]:
                t, e = _schema_types(v)
                found |= t
                enum = e if e is not None else enum
            return found, enum
    if "enum" in schema:
        return {"string"}, set(schema["enum"])
    if "type" not in schema:
        return ({"object"} if "properties" in schema else {"any"}), None
    t = schema["type"]
    return (set(t) if isinstance(t, list) else {t}), None


def _compatible(ann: set[str], sch: set[str]) -> bool:
    if "any" in ann or "any" in sch:
        return True
    if "integer" in ann and "number" in sch and "integer" not in sch:
        return False  # a float field typed int
    fold = lambda ts: {"number" if t == "integer" else t for t in ts}  # noqa: E731
    return fold(ann) == fold(sch)


@pytest.mark.parametrize("typed", list(TYPED), ids=lambda t: t.__name__)
def test_typeddict_matches_its_schema(typed):
    schema = SCHEMAS[TYPED[typed]]
    props, required = schema.get("properties", {}), set(schema.get("required", []))
    hints = get_type_hints(typed)
    problems = []
    for name in sorted(set(props) - set(hints)):
        problems.append(f"{name}: in the schema, missing from nf_client.types.{typed.__name__}")
    for name in sorted(set(hints) - set(props)):
        problems.append(f"{name}: not a field of the schema {TYPED[typed]}")
    for name in sorted(required - typed.__required_keys__):
        problems.append(f"{name}: required by the schema, optional here")
    for name in sorted(typed.__required_keys__ - required - {"created_at", "updated_at"}):
        # (timestamps and ids the server always sends may be required here)
        if name not in required and "default" in props.get(name, {}):
            problems.append(f"{name}: required here, the schema has a default")
    for name in sorted(set(hints) & set(props)):
        a, a_enum = _ann_types(hints[name])
        s, s_enum = _schema_types(props[name])
        if not _compatible(a, s):
            problems.append(f"{name}: typed {sorted(a)} here, {sorted(s)} in the schema")
        if a_enum is not None and s_enum is not None and a_enum != s_enum:
            problems.append(f"{name}: values {sorted(a_enum)} here, {sorted(s_enum)} there")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    "name,value",
    [
        ("Job", JOB),
        ("Export", EXPORT),
        ("PathJob", path_job("frame", "succeeded")),
        ("PathJob", path_job("path", "queued")),
        ("Upload", UPLOAD),
    ],
)
def test_canned_answers_are_valid(name, value):
    jsonschema.validate(value, _with_components({"$ref": f"#/components/schemas/{name}"}))


def test_the_package_imports_only_httpx_and_the_standard_library():
    import ast
    import sys

    src = Path(nf_client.__file__).parent
    allowed = set(sys.stdlib_module_names) | {"httpx", "nf_client"}
    bad = []
    for path in sorted(src.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            bad += [f"{path.name}: {n}" for n in names if n.split(".")[0] not in allowed]
    assert not bad, bad
    meta = (REPO / "clients" / "python" / "pyproject.toml").read_text()
    assert re.search(r'^dependencies = \["httpx[^"]*"\]$', meta, re.M), "httpx only"
