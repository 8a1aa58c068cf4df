"""Files a job produced: artifacts (test renders, animations) and the latest checkpoint.

Artifact names are validated strictly (one plain file name inside the job's `artifacts/`,
no paths, no dot files, no links). The checkpoint download is the newest `step-<n>.safetensors`
with its JSON meta (config, normalisation, ...) moved into the safetensors header's
`__metadata__["nf_meta"]`, so the one file is self-describing; the tensor bytes are streamed
unchanged. Where storage hands out presigned URLs (S3), an artifact download answers 302 to one.
"""

from __future__ import annotations

import json
import mimetypes
import re
import struct
from collections.abc import Iterator

from fastapi import APIRouter, HTTPException
from fastapi.responses import FileResponse, RedirectResponse, StreamingResponse

from core.storage import ObjectInfo, Storage, stored_checkpoints
from service.api.deps import JOB_GUARDS, StorageDep, StoreDep, load_job

router = APIRouter(prefix="/v1/jobs", tags=["files"], dependencies=JOB_GUARDS)
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
CHUNK = 1 << 20
ARTIFACTS = "artifacts/"
# How long a presigned artifact URL stays valid (the download must start within it).
PRESIGNED_S = 900


def _artifact_objects(storage: Storage, job_id: str) -> list[ObjectInfo]:
    """The plain files directly in the job's artifacts (no sub-folders, no odd names)."""
    return [
        o
        for o in storage.list(job_id, ARTIFACTS)
        if NAME_RE.match(o.key.removeprefix(ARTIFACTS)) and o.key.count("/") == 1
    ]


@router.get("/{job_id}/artifacts", summary="List the job's artifacts (test renders, animations)")
def list_artifacts(job_id: str, store: StoreDep, storage: StorageDep):
    job = load_job(store, job_id)
    items = []
    for o in _artifact_objects(storage, job.id):
        name = o.key.removeprefix(ARTIFACTS)
        items.append({"name": name, "size": o.size, "url": f"/v1/jobs/{job.id}/artifacts/{name}"})
    return {"items": items}


@router.get(
    "/{job_id}/artifacts/{name}",
    summary="Download one artifact",
    response_class=FileResponse,
    responses={302: {"description": "object storage: a presigned URL that serves the file"}},
)
def get_artifact(job_id: str, name: str, store: StoreDep, storage: StorageDep):
    job = load_job(store, job_id)
    if not NAME_RE.match(name) or ".." in name:
        raise HTTPException(
            422,
            "artifact name must be a plain file name (letters, digits, '.', '_', '-'; "
            "no paths, at most 128 characters)",
        )
    key = ARTIFACTS + name
    missing = HTTPException(404, f"job {job.id} has no artifact {name!r}")
    media = mimetypes.guess_type(name)[0] or "application/octet-stream"
    path = storage.local_path(job.id, key)
    if path is not None:
        folder = storage.work_dir(job.id).artifacts
        if (folder / name).is_symlink() or path.parent != folder.resolve():
            raise missing
        return FileResponse(path, media_type=media, filename=name)
    if not storage.exists(job.id, key):
        raise missing
    url = storage.presigned_url(job.id, key, expires_s=PRESIGNED_S, filename=name)
    if url is not None:
        return RedirectResponse(url, status_code=302)
    fh = storage.open_read(job.id, key)
    headers = {"Content-Disposition": f'attachment; filename="{name}"'}
    return StreamingResponse(_chunks(fh), media_type=media, headers=headers)


def _chunks(fh, first: bytes = b"") -> Iterator[bytes]:
    """`first`, then the rest of `fh` in CHUNK pieces; `fh` closed at the end."""
    try:
        if first:
            yield first
        while chunk := fh.read(CHUNK):
            yield chunk
    finally:
        fh.close()


def _with_metadata(tensors, meta_text: str, size: int) -> tuple[bytes, int]:
    """New safetensors header carrying the meta, and where the tensor bytes start in the old file
    (`size` bytes long); `tensors` is left at that point (read forward only: it may be a network
    stream)."""
    head = tensors.read(8)
    if len(head) != 8:
        raise ValueError("truncated safetensors file")
    (n,) = struct.unpack("<Q", head)
    if n > 100 << 20:
        raise ValueError("implausible safetensors header size")
    raw = tensors.read(n)
    if len(raw) != n:
        raise ValueError("truncated safetensors header")
    header = json.loads(raw)
    if not isinstance(header, dict):
        raise ValueError("safetensors header is not an object")
    # Every tensor's bytes must be in the file: a file cut short after the header is torn too.
    end = max(
        (int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0
    )
    if size < 8 + n + end:
        raise ValueError("truncated safetensors data")
    header["__metadata__"] = {**header.get("__metadata__", {}), "nf_meta": meta_text}
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # keep the tensor data 8-byte aligned
    return struct.pack("<Q", len(blob)) + blob, 8 + n


@router.get(
    "/{job_id}/checkpoint",
    summary="Download the latest checkpoint (.safetensors, meta in its header)",
    response_class=StreamingResponse,
    responses={
        200: {"content": {"application/octet-stream": {}}},
        404: {"description": "no checkpoint yet"},
    },
)
def get_checkpoint(job_id: str, store: StoreDep, storage: StorageDep):
    job = load_job(store, job_id)
    opened = None
    # A torn or truncated file (crash mid-write, full disk) is skipped for the previous step, as
    # the worker's loader does. Open both now: training may prune a step while it streams.
    for step, size in stored_checkpoints(storage, job.id):
        try:
            meta_text = storage.get_bytes(job.id, f"checkpoints/step-{step}.json").decode()
            fh = storage.open_read(job.id, f"checkpoints/step-{step}.safetensors")
        except (OSError, UnicodeDecodeError):
            continue
        try:
            header, data_start = _with_metadata(fh, meta_text, size)
        except (ValueError, KeyError, TypeError, IndexError, struct.error):
            fh.close()
            continue
        opened = step, fh, header, data_start, size
        break
    if opened is None:
        raise HTTPException(404, f"job {job.id} has no readable checkpoint yet")
    step, fh, header, data_start, size = opened
    return StreamingResponse(
        _chunks(fh, header),
        media_type="application/octet-stream",
        headers={
            "Content-Disposition": f'attachment; filename="{job.id}-step-{step}.safetensors"',
            "Content-Length": str(len(header) + size - data_start),
            "X-Checkpoint-Step": str(step),
        },
    )
