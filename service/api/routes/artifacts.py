"""Files a job produced: artifacts (test renders, animations) and the latest checkpoint.

Artifact names are validated strictly (one plain file name inside the job's `artifacts/`,
no paths, no dot files, no links). The checkpoint download is the newest `step-<n>.safetensors`
with its JSON meta (config, normalisation, ...) moved into the safetensors header's
`__metadata__["nf_meta"]`, so the one file is self-describing; the tensor bytes are streamed
unchanged.
"""

from __future__ import annotations

import json
import mimetypes
import re
import struct
from collections.abc import Iterator
from pathlib import Path

from fastapi import APIRouter, Depends, HTTPException
from fastapi.responses import FileResponse, StreamingResponse

from core.storage import LocalStorage, checkpoint_meta, checkpoint_order, checkpoint_tensors
from core.store import JobStore
from service.api.deps import JOB_GUARDS, get_storage, get_store, load_job

router = APIRouter(prefix="/v1/jobs", tags=["files"], dependencies=JOB_GUARDS)
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
CHUNK = 1 << 20


def _artifact_files(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(
        p for p in folder.iterdir() if NAME_RE.match(p.name) and p.is_file() and not p.is_symlink()
    )


@router.get("/{job_id}/artifacts", summary="List the job's artifacts (test renders, animations)")
def list_artifacts(
    job_id: str, store: JobStore = Depends(get_store), storage: LocalStorage = Depends(get_storage)
):
    job = load_job(store, job_id)
    folder = storage.paths(job.id).artifacts
    return {
        "items": [
            {
                "name": p.name,
                "size": p.stat().st_size,
                "url": f"/v1/jobs/{job.id}/artifacts/{p.name}",
            }
            for p in _artifact_files(folder)
        ]
    }


@router.get(
    "/{job_id}/artifacts/{name}", summary="Download one artifact", response_class=FileResponse
)
def get_artifact(
    job_id: str,
    name: str,
    store: JobStore = Depends(get_store),
    storage: LocalStorage = Depends(get_storage),
):
    job = load_job(store, job_id)
    if not NAME_RE.match(name) or ".." in name:
        raise HTTPException(
            422,
            "artifact name must be a plain file name (letters, digits, '.', '_', '-'; "
            "no paths, at most 128 characters)",
        )
    folder = storage.paths(job.id).artifacts
    path = folder / name
    if path.is_symlink() or not path.is_file() or path.resolve().parent != folder.resolve():
        raise HTTPException(404, f"job {job.id} has no artifact {name!r}")
    media = mimetypes.guess_type(name)[0] or "application/octet-stream"
    return FileResponse(path, media_type=media, filename=name)


def _with_metadata(tensors, meta_text: str) -> tuple[bytes, int]:
    """New safetensors header carrying the meta, and where the tensor bytes start in the old file."""
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
    size = tensors.seek(0, 2)
    if size < 8 + n + end:
        raise ValueError("truncated safetensors data")
    tensors.seek(8 + n)
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
def get_checkpoint(
    job_id: str, store: JobStore = Depends(get_store), storage: LocalStorage = Depends(get_storage)
):
    job = load_job(store, job_id)
    folder = storage.paths(job.id).checkpoints
    opened = None
    # A torn or truncated file (crash mid-write, full disk) is skipped for the previous step, as
    # the worker's loader does. Open both now: training may prune a step while it streams.
    for step in checkpoint_order(folder):
        try:
            meta_text = checkpoint_meta(folder, step).read_text()
            fh = open(checkpoint_tensors(folder, step), "rb")
        except OSError:
            continue
        try:
            header, data_start = _with_metadata(fh, meta_text)
        except (ValueError, KeyError, TypeError, IndexError, struct.error):
            fh.close()
            continue
        opened = step, meta_text, fh, header, data_start
        break
    if opened is None:
        raise HTTPException(404, f"job {job.id} has no readable checkpoint yet")
    step, meta_text, fh, header, data_start = opened
    size = fh.seek(0, 2)

    def body() -> Iterator[bytes]:
        try:
            yield header
            fh.seek(data_start)
            while chunk := fh.read(CHUNK):
                yield chunk
        finally:
            fh.close()

    return StreamingResponse(
        body(),
        media_type="application/octet-stream",
        headers={
            "Content-Disposition": f'attachment; filename="{job.id}-step-{step}.safetensors"',
            "Content-Length": str(len(header) + size - data_start),
            "X-Checkpoint-Step": str(step),
        },
    )
