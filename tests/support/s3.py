"""An S3-compatible HTTP server for tests: moto's ThreadedMotoServer on 127.0.0.1.

The code under test is plain boto3 talking HTTP to it, exactly as to AWS or MinIO.

    def test_x(s3_bucket):
        s3_bucket.env            # STORAGE_URL, S3_ENDPOINT_URL, AWS_* for a stack (env=...)
        s3_bucket.settings(tmp_path)   # Settings with STORAGE_URL=s3://<bucket>/<prefix>
        s3_bucket.client         # a boto3 client on the server, to look at the bucket
        s3_bucket.keys()         # every object name in the bucket

`s3_server` (one per test session) is the server; `s3_bucket` makes a new bucket per test and
sets dummy AWS credentials in this process's environment (boto3's standard chain reads them).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

# moto accepts any credentials; these only have to be present for boto3's chain.
DUMMY_AWS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@dataclass
class S3Server:
    endpoint: str


@dataclass
class S3Bucket:
    endpoint: str
    bucket: str
    prefix: str
    client: Any = field(repr=False)

    @property
    def url(self) -> str:
        """STORAGE_URL for this bucket and prefix."""
        return f"s3://{self.bucket}/{self.prefix}"

    @property
    def env(self) -> dict[str, str]:
        """Environment for a process (stack) that stores its job files here."""
        return {**DUMMY_AWS, "STORAGE_URL": self.url, "S3_ENDPOINT_URL": self.endpoint}

    def settings(self, data_dir: Path, **overrides: Any):
        """Settings with DATA_DIR=data_dir storing job files in this bucket."""
        from core.settings import Settings

        return Settings(
            data_dir=data_dir,
            storage_url=self.url,
            s3_endpoint_url=self.endpoint,
            **overrides,
        )

    def keys(self) -> list[str]:
        """Every object name in the bucket, sorted."""
        names = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket):
            names += [o["Key"] for o in page.get("Contents", ())]
        return sorted(names)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """moto's S3 server on 127.0.0.1, a free port, for the whole session."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield S3Server(f"http://{host}:{port}")
    finally:
        server.stop()


@pytest.fixture
def s3_bucket(s3_server: S3Server, monkeypatch) -> S3Bucket:
    """A new, empty bucket on the session's server (prefix `nf/`), and dummy AWS credentials in
    this process's environment."""
    import boto3

    for name, value in DUMMY_AWS.items():
        monkeypatch.setenv(name, value)
    client = boto3.client("s3", endpoint_url=s3_server.endpoint)
    bucket = f"nf-test-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=bucket)
    return S3Bucket(s3_server.endpoint, bucket, "nf", client)
