"""Job files in an S3-compatible bucket (`STORAGE_URL=s3://bucket/prefix`) through boto3.

Objects are `<prefix>/jobs/<job id>/<key>`. Credentials come from boto3's standard chain
(environment, ~/.aws, instance roles); `S3_ENDPOINT_URL` points the same client at MinIO, R2 or
any other S3 API. Large files move as multipart transfers (boto3's transfer manager).

The working copy of a job is `<SCRATCH_DIR>/jobs/<job id>/`. A manifest there
(`.storage-manifest.json`) remembers the size and ETag of each object pulled or pushed, so a
pull downloads only what is missing or changed, and removes the local files of objects that
were deleted from the bucket since (files made locally and not pushed yet are kept).
"""

from __future__ import annotations

import json
import mimetypes
import os
import re
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import quote, urlparse

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import ClientError

from core.storage import (
    DirectUpload,
    JobPaths,
    ObjectInfo,
    Storage,
    atomic_write_json,
    check_key,
    check_prefix,
    parse_job_id,
)

MANIFEST = ".storage-manifest.json"
# Part size of multipart transfers; files under the threshold go in one request.
MULTIPART_THRESHOLD = 16 << 20
MULTIPART_CHUNK = 16 << 20
DELETE_BATCH = 1000  # DeleteObjects' limit per request
# S3's multipart rules: parts of 5 MiB at least (the last apart), 10,000 parts at most.
MIN_PART = 5 << 20
MAX_PARTS = 10_000
_MISSING = {"404", "NoSuchKey", "NotFound"}
_UNSAFE_FILENAME = re.compile(r"[^A-Za-z0-9._ -]")


def _missing(exc: ClientError) -> bool:
    return str(exc.response.get("Error", {}).get("Code")) in _MISSING


def parse_s3_url(url: str) -> tuple[str, str]:
    """`s3://bucket/some/prefix` -> ("bucket", "some/prefix/"); the prefix may be empty."""
    parsed = urlparse(url)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise ValueError(f"STORAGE_URL {url!r} is not s3://bucket/prefix")
    prefix = parsed.path.strip("/")
    return parsed.netloc, f"{prefix}/" if prefix else ""


def content_disposition(filename: str) -> str:
    """An attachment header naming `filename`: an ASCII fallback plus the RFC 5987 form."""
    fallback = _UNSAFE_FILENAME.sub("_", filename) or "download"
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{quote(filename, safe='')}"


class S3Storage(Storage):
    """Job files as objects in a bucket; work_dir is a local scratch copy."""

    direct_uploads = True

    def __init__(
        self,
        data_dir: Path,
        url: str,
        endpoint_url: str | None = None,
        scratch_dir: Path | None = None,
        public_endpoint_url: str | None = None,
    ):
        super().__init__(data_dir)
        self.bucket, self.prefix = parse_s3_url(url)
        self.scratch_dir = Path(scratch_dir or self.data_dir / "scratch").resolve()
        config = Config(
            signature_version="s3v4",
            retries={"max_attempts": 5, "mode": "standard"},
            # Checksums only where S3 demands them: some S3 APIs (GCS's, older MinIO and Ceph
            # releases) refuse the CRC trailers and chunked bodies boto3 sends by default.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        self.client = boto3.client("s3", endpoint_url=endpoint_url, config=config)
        # A signature covers the host, so URLs for clients are signed for the host they use.
        self.presigner = (
            boto3.client("s3", endpoint_url=public_endpoint_url, config=config)
            if public_endpoint_url
            else self.client
        )
        self.transfer = TransferConfig(
            multipart_threshold=MULTIPART_THRESHOLD, multipart_chunksize=MULTIPART_CHUNK
        )
        self._manifest_lock = threading.Lock()

    # -- naming --------------------------------------------------------------------------------
    def _job_prefix(self, job_id: str) -> str:
        return f"{self.prefix}jobs/{parse_job_id(job_id)}/"

    def _name(self, job_id: str, key: str) -> str:
        return self._job_prefix(job_id) + check_key(key)

    # -- objects -------------------------------------------------------------------------------
    def put_file(self, job_id: str, key: str, src: Path) -> None:
        self.client.upload_file(
            str(src), self.bucket, self._name(job_id, key), Config=self.transfer
        )

    def put_bytes(self, job_id: str, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self._name(job_id, key), Body=data)

    def _get(self, job_id: str, key: str) -> dict[str, Any]:
        try:
            return self.client.get_object(Bucket=self.bucket, Key=self._name(job_id, key))
        except ClientError as exc:
            if _missing(exc):
                raise FileNotFoundError(f"{key}: no such object") from None
            raise

    def get_bytes(self, job_id: str, key: str) -> bytes:
        body = self._get(job_id, key)["Body"]
        try:
            return body.read()
        finally:
            body.close()

    def download(self, job_id: str, key: str, dest: Path) -> None:
        self._download(self._name(job_id, key), Path(dest), key)

    def _download(self, name: str, dest: Path, key: str) -> None:
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp")
        os.close(fd)
        try:
            self.client.download_file(self.bucket, name, tmp, Config=self.transfer)
            os.replace(tmp, dest)
        except ClientError as exc:
            Path(tmp).unlink(missing_ok=True)
            if _missing(exc):
                raise FileNotFoundError(f"{key}: no such object") from None
            raise
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def open_read(self, job_id: str, key: str) -> BinaryIO:
        return self._get(job_id, key)["Body"]

    def _objects(self, job_id: str, prefix: str = "") -> list[dict[str, Any]]:
        """Raw listing entries (Key relative to the job, Size, ETag, LastModified)."""
        base = self._job_prefix(job_id)
        out = []
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=base + check_prefix(prefix)
        )
        for page in pages:
            for obj in page.get("Contents", ()):
                out.append({**obj, "Key": obj["Key"][len(base) :]})
        return out

    def list(self, job_id: str, prefix: str = "") -> list[ObjectInfo]:
        return sorted(
            (
                ObjectInfo(o["Key"], int(o["Size"]), o["LastModified"].timestamp())
                for o in self._objects(job_id, prefix)
            ),
            key=lambda o: o.key,
        )

    def exists(self, job_id: str, key: str) -> bool:
        try:
            self.client.head_object(Bucket=self.bucket, Key=self._name(job_id, key))
        except ClientError as exc:
            if _missing(exc):
                return False
            raise
        return True

    def delete(self, job_id: str, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self._name(job_id, key))

    def delete_job(self, job_id: str) -> None:
        base = self._job_prefix(job_id)
        # Parts of unfinished direct uploads are no objects, yet they are stored (and billed).
        pages = self.client.get_paginator("list_multipart_uploads").paginate(
            Bucket=self.bucket, Prefix=base
        )
        for page in pages:
            for up in page.get("Uploads", ()):
                self.abort_upload(job_id, up["Key"][len(base) :], up["UploadId"])
        names = [base + o["Key"] for o in self._objects(job_id)]
        for i in range(0, len(names), DELETE_BATCH):
            batch = [{"Key": n} for n in names[i : i + DELETE_BATCH]]
            answer = self.client.delete_objects(
                Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True}
            )
            if answer.get("Errors"):
                err = answer["Errors"][0]
                raise OSError(f"could not delete {err.get('Key')}: {err.get('Code')}")
        self.evict(job_id)
        shutil.rmtree(self.paths(job_id).root, ignore_errors=True)

    def presigned_url(
        self, job_id: str, key: str, expires_s: int = 900, filename: str | None = None
    ) -> str | None:
        params: dict[str, Any] = {"Bucket": self.bucket, "Key": self._name(job_id, key)}
        if filename:
            params["ResponseContentDisposition"] = content_disposition(filename)
        media = mimetypes.guess_type(filename or key)[0]
        if media:
            params["ResponseContentType"] = media
        return self.presigner.generate_presigned_url(
            "get_object", Params=params, ExpiresIn=int(expires_s)
        )

    # -- direct uploads ------------------------------------------------------------------------
    def start_upload(self, job_id: str, key: str, size: int, expires_s: int = 3600) -> DirectUpload:
        if size <= 0:
            raise ValueError("a direct upload needs a size above 0")
        part_size = max(MULTIPART_CHUNK, -(-size // MAX_PARTS))
        part_size = -(-part_size // MIN_PART) * MIN_PART
        name = self._name(job_id, key)
        upload_id = self.client.create_multipart_upload(Bucket=self.bucket, Key=name)["UploadId"]
        urls = [
            self.presigner.generate_presigned_url(
                "upload_part",
                Params={"Bucket": self.bucket, "Key": name, "UploadId": upload_id, "PartNumber": i},
                ExpiresIn=int(expires_s),
            )
            for i in range(1, -(-size // part_size) + 1)
        ]
        return DirectUpload(upload_id, part_size, urls)

    def upload_parts(self, job_id: str, key: str, upload_id: str) -> list[str]:
        found = {}
        pages = self.client.get_paginator("list_parts").paginate(
            Bucket=self.bucket, Key=self._name(job_id, key), UploadId=upload_id
        )
        try:
            for page in pages:
                for part in page.get("Parts", ()):
                    found[int(part["PartNumber"])] = part["ETag"]
        except ClientError as exc:
            if str(exc.response.get("Error", {}).get("Code")) == "NoSuchUpload":
                raise FileNotFoundError(f"{key}: no such upload") from None
            raise
        etags = []
        while len(etags) + 1 in found:
            etags.append(found[len(etags) + 1])
        return etags

    def finish_upload(self, job_id: str, key: str, upload_id: str, etags: list[str]) -> ObjectInfo:
        name = self._name(job_id, key)
        parts = [{"PartNumber": i, "ETag": etag} for i, etag in enumerate(etags, 1)]
        try:
            self.client.complete_multipart_upload(
                Bucket=self.bucket, Key=name, UploadId=upload_id, MultipartUpload={"Parts": parts}
            )
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code"))
            if code == "NoSuchUpload":
                raise FileNotFoundError(f"{key}: no such upload") from None
            if code in {"InvalidPart", "InvalidPartOrder", "EntityTooSmall"}:
                raise ValueError(f"the upload's parts do not add up ({code})") from None
            raise
        head = self.client.head_object(Bucket=self.bucket, Key=name)
        return ObjectInfo(key, int(head["ContentLength"]), head["LastModified"].timestamp())

    def abort_upload(self, job_id: str, key: str, upload_id: str) -> None:
        try:
            self.client.abort_multipart_upload(
                Bucket=self.bucket, Key=self._name(job_id, key), UploadId=upload_id
            )
        except ClientError as exc:
            if str(exc.response.get("Error", {}).get("Code")) != "NoSuchUpload":
                raise

    def stored_bytes(self, job_id: str) -> int:
        return sum(int(o["Size"]) for o in self._objects(job_id))

    def writable(self) -> bool:
        if not super().writable():
            return False
        probe = f"{self.prefix}.probe"
        try:
            self.client.put_object(Bucket=self.bucket, Key=probe, Body=b"ok")
            self.client.delete_object(Bucket=self.bucket, Key=probe)
        except Exception:
            return False
        return True

    # -- the working copy ----------------------------------------------------------------------
    def work_dir(self, job_id: str) -> JobPaths:
        return JobPaths(self.scratch_dir / "jobs" / parse_job_id(job_id))

    def _read_manifest(self, root: Path) -> dict[str, dict[str, Any]]:
        try:
            data = json.loads((root / MANIFEST).read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _record(self, root: Path, changes: dict[str, dict[str, Any] | None]) -> None:
        """Merge `changes` (None: forget the key) into the manifest; concurrent pulls of one job
        in this process take turns, across processes the last writer wins (at worst one more
        download later)."""
        with self._manifest_lock:
            manifest = self._read_manifest(root)
            for key, entry in changes.items():
                if entry is None:
                    manifest.pop(key, None)
                else:
                    manifest[key] = entry
            atomic_write_json(root / MANIFEST, manifest)

    def pull(self, job_id: str, prefix: str) -> None:
        root = self.work_dir(job_id).root
        manifest = self._read_manifest(root)
        remote = {o["Key"]: o for o in self._objects(job_id, prefix)}
        changes: dict[str, dict[str, Any] | None] = {}
        for key, obj in remote.items():
            try:
                check_key(key)
            except ValueError:
                continue  # not written by this service: never a path outside the copy
            entry = {"size": int(obj["Size"]), "etag": obj["ETag"]}
            local = root / key
            if (
                manifest.get(key) == entry
                and local.is_file()
                and local.stat().st_size == entry["size"]
            ):
                continue
            self._download(self._job_prefix(job_id) + key, local, key)
            changes[key] = entry
        for key in manifest:
            if key.startswith(prefix) and key not in remote:
                (root / key).unlink(missing_ok=True)
                changes[key] = None
        if changes or not (root / MANIFEST).exists():
            root.mkdir(parents=True, exist_ok=True)
            self._record(root, changes)

    def push(self, job_id: str, relpath: str) -> None:
        root = self.work_dir(job_id).root
        path = root / check_key(relpath)
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.is_file() and not p.is_symlink())
        elif path.is_file():
            files = [path]
        else:
            raise FileNotFoundError(f"{relpath}: not in the job's working copy")
        changes: dict[str, dict[str, Any] | None] = {}
        for file in files:
            key = file.relative_to(root).as_posix()
            if key == MANIFEST:
                continue
            self.put_file(job_id, key, file)
            head = self.client.head_object(Bucket=self.bucket, Key=self._name(job_id, key))
            changes[key] = {"size": int(head["ContentLength"]), "etag": head["ETag"]}
        if changes:
            self._record(root, changes)

    def evict(self, job_id: str) -> None:
        shutil.rmtree(self.work_dir(job_id).root, ignore_errors=True)
        # The job's local folder (made at admission) holds nothing once its files are stored.
        try:
            self.paths(job_id).root.rmdir()
        except OSError:
            pass


_CACHE: dict[tuple, S3Storage] = {}
_CACHE_LOCK = threading.Lock()


def s3_storage(settings) -> S3Storage:
    """The S3Storage for these settings, one per process (a boto3 client is thread-safe and
    slow to make)."""
    key = (
        str(Path(settings.data_dir).resolve()),
        settings.storage_url,
        settings.s3_endpoint_url,
        str(settings.scratch_path),
        settings.s3_public_endpoint_url,
    )
    with _CACHE_LOCK:
        if key not in _CACHE:
            _CACHE[key] = S3Storage(
                settings.data_dir,
                settings.storage_url,
                settings.s3_endpoint_url,
                settings.scratch_path,
                settings.s3_public_endpoint_url,
            )
        return _CACHE[key]
