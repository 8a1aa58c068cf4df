"""Streaming multipart/form-data reader: the file part goes straight to disk in chunks, under a
size cap, instead of being spooled whole before the route sees it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.requests import Request

from service.intake import IntakeError

MAX_FIELD_BYTES = 1024 * 1024
MAX_FIELDS = 16


@dataclass
class UploadedFile:
    field: str
    filename: str
    path: Path
    size: int = 0


@dataclass
class Form:
    fields: dict[str, str] = field(default_factory=dict)
    files: list[UploadedFile] = field(default_factory=list)


def boundary_of(request: Request) -> bytes:
    ctype, params = parse_options_header(request.headers.get("content-type", ""))
    if ctype != b"multipart/form-data" or not params.get(b"boundary"):
        raise IntakeError(
            415, "send the upload as multipart/form-data (fields kind, dataset, config)"
        )
    return params[b"boundary"]


async def read_form(
    request: Request,
    file_path: Callable[[str, str], Path],
    max_file_bytes: int,
    limit_name: str = "MAX_UPLOAD_MB",
) -> Form:
    """Parse the body; each file part is written to file_path(field, filename). A file over
    `max_file_bytes` is a 413 naming `limit_name`, the setting that set it."""
    form = Form()
    state: dict = {"headers": {}, "name": b"", "value": b"", "buf": None, "fh": None, "file": None}

    def on_part_begin():
        state.update(headers={}, buf=None, fh=None, file=None)

    def on_header_field(data, start, end):
        state["name"] += data[start:end]

    def on_header_value(data, start, end):
        state["value"] += data[start:end]

    def on_header_end():
        state["headers"][state["name"].decode("latin-1").lower()] = state["value"]
        state["name"], state["value"] = b"", b""

    def on_headers_finished():
        _, opts = parse_options_header(state["headers"].get("content-disposition", b""))
        name = opts.get(b"name", b"").decode("utf-8", "replace")
        if b"filename" in opts:
            filename = opts[b"filename"].decode("utf-8", "replace")
            if form.files:
                raise IntakeError(422, "send exactly one file (the `dataset` field)")
            path = file_path(name, filename)
            state["file"] = UploadedFile(name, filename, path)
            state["fh"] = open(path, "wb")
            form.files.append(state["file"])
        else:
            if len(form.fields) >= MAX_FIELDS:
                raise IntakeError(422, "too many form fields")
            state["buf"] = bytearray()
            state["field"] = name

    def on_part_data(data, start, end):
        chunk = data[start:end]
        if state["fh"] is not None:
            state["file"].size += len(chunk)
            if state["file"].size > max_file_bytes:
                raise IntakeError(
                    413, f"upload exceeds the limit of {max_file_bytes} bytes ({limit_name})"
                )
            state["fh"].write(chunk)
        elif state["buf"] is not None:
            state["buf"] += chunk
            if len(state["buf"]) > MAX_FIELD_BYTES:
                raise IntakeError(
                    413, f"form field {state['field']!r} is over {MAX_FIELD_BYTES} bytes"
                )

    def on_part_end():
        if state["fh"] is not None:
            state["fh"].close()
            state["fh"] = None
        elif state["buf"] is not None:
            form.fields[state["field"]] = state["buf"].decode("utf-8", "replace")
            state["buf"] = None

    parser = MultipartParser(
        boundary_of(request),
        {
            "on_part_begin": on_part_begin,
            "on_header_field": on_header_field,
            "on_header_value": on_header_value,
            "on_header_end": on_header_end,
            "on_headers_finished": on_headers_finished,
            "on_part_data": on_part_data,
            "on_part_end": on_part_end,
        },
    )
    try:
        async for chunk in request.stream():
            parser.write(chunk)
        parser.finalize()
    except MultipartParseError as exc:
        raise IntakeError(400, f"malformed multipart body: {exc}") from None
    finally:
        if state["fh"] is not None:
            state["fh"].close()
    return form
