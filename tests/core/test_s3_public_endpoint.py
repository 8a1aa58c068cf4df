"""S3_PUBLIC_ENDPOINT_URL: presigned download URLs name the endpoint clients reach (the compose
MinIO is `minio:9000` to the services and `localhost:9000` to a browser), and serve the object."""

from __future__ import annotations

import uuid
from urllib.parse import urlparse

import httpx

from core.s3_storage import s3_storage


def test_presigned_urls_name_the_public_endpoint_and_serve_the_object(s3_bucket, tmp_path):
    inner = urlparse(s3_bucket.endpoint)
    assert inner.hostname == "127.0.0.1"
    public = f"http://localhost:{inner.port}"
    job_id = str(uuid.uuid4())
    storage = s3_storage(s3_bucket.settings(tmp_path, s3_public_endpoint_url=public))
    storage.put_bytes(job_id, "artifacts/mesh.glb", b"glTF-bytes")

    url = storage.presigned_url(job_id, "artifacts/mesh.glb", filename="mesh.glb")
    assert urlparse(url).netloc == f"localhost:{inner.port}"
    r = httpx.get(url)
    assert r.status_code == 200 and r.content == b"glTF-bytes"
    assert "mesh.glb" in r.headers["content-disposition"]

    # Without it, URLs name the endpoint the services use.
    plain = s3_storage(s3_bucket.settings(tmp_path))
    assert urlparse(plain.presigned_url(job_id, "artifacts/mesh.glb")).netloc == inner.netloc
