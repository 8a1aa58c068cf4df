"""Direct upload wire types: a dataset sent straight to the object store in parts, for uploads
too large to stream through the API (`POST /v1/uploads`, docs/api.md).

The client asks for an upload (kind, config, file name and size), PUTs each part of the file to
its presigned URL (part i holds bytes [(i-1)*part_size, i*part_size)), then completes it; the
API checks the file exactly as a multipart `POST /v1/jobs` would and answers the job."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class UploadRequest(BaseModel):
    kind: str = Field(description="job kind (as the `kind` form field of POST /v1/jobs)")
    filename: str = Field(min_length=1, max_length=255, description="the file's name")
    size: int = Field(gt=0, description="the file's size in bytes")
    config: dict[str, Any] = Field(default_factory=dict, description="the job's config")
    callback_url: str | None = Field(
        None, max_length=2048, description="webhook URL for the job's events (docs/webhooks.md)"
    )


class Upload(BaseModel):
    id: str = Field(description="the id of the job the upload becomes")
    part_size: int = Field(description="bytes of every part but the last")
    part_urls: list[str] = Field(
        description="presigned PUT URL of each part, in order; keep no headers of your own"
    )
    expires_in_s: int = Field(
        description="the part URLs lapse after this; the upload (its reservation) lapses after "
        "twice this unless completed"
    )
    complete_url: str = Field(description="POST here once every part is in")
