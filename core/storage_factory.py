"""`get_storage`: the job-file backend STORAGE_URL names. A module of its own, so that the backends
import only the interface (core/storage.py) and never each other."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlparse

from core.storage import LocalStorage, Storage


def get_storage(settings) -> Storage:
    """The backend STORAGE_URL names: unset -> LocalStorage under DATA_DIR, `file:///root` ->
    LocalStorage under root, `s3://bucket/prefix` -> S3Storage (one per process and URL)."""
    url = settings.storage_url
    if not url:
        return LocalStorage(settings.data_dir)
    parsed = urlparse(url)
    if parsed.scheme == "file":
        return LocalStorage(settings.data_dir, Path(unquote(parsed.path)))
    if parsed.scheme == "s3":
        from core.s3_storage import s3_storage  # boto3 only where S3 is configured

        return s3_storage(settings)
    raise ValueError(f"STORAGE_URL {url!r}: use file:///path or s3://bucket/prefix")
