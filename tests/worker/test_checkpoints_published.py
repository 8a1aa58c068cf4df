"""Checkpoints through S3 (worker/checkpoints.py `Published`): each save uploads the meta and
tensor objects before the `latest` pointer, old steps are pruned in the bucket too, and another
host with an empty scratch folder resumes from what the pointer names."""

from __future__ import annotations

import uuid

import torch

from core.s3_storage import S3Storage
from worker.checkpoints import CheckpointManager, Published


class RecordingS3(S3Storage):
    """The real S3 backend, noting the keys it uploads in order."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.uploads: list[str] = []

    def put_file(self, job_id, key, src):
        super().put_file(job_id, key, src)
        self.uploads.append(key)


def _storage(cls, s3_bucket, data_dir):
    s = s3_bucket.settings(data_dir)
    return cls(s.data_dir, s.storage_url, s.s3_endpoint_url, s.scratch_path)


def test_pointer_uploaded_last_and_another_host_resumes_from_it(s3_bucket, tmp_path):
    job_id = str(uuid.uuid4())
    host_a = _storage(RecordingS3, s3_bucket, tmp_path / "a")
    work = host_a.work_dir(job_id)
    mgr = CheckpointManager(work.checkpoints, keep=2, published=Published(host_a, job_id))
    for step in (10, 20, 30):
        mgr.save(step, {"w": torch.full((4,), float(step))}, {"note": step})
    assert host_a.uploads == [
        key
        for step in (10, 20, 30)
        for key in (
            f"checkpoints/step-{step}.json",
            f"checkpoints/step-{step}.safetensors",
            "checkpoints/latest",
        )
    ]
    prefix = f"{s3_bucket.prefix}/jobs/{job_id}/checkpoints/"
    assert [k.removeprefix(prefix) for k in s3_bucket.keys()] == [
        "latest",
        "step-20.json",
        "step-20.safetensors",
        "step-30.json",
        "step-30.safetensors",
    ]

    host_b = _storage(S3Storage, s3_bucket, tmp_path / "b")
    published = Published(host_b, job_id)
    assert published.latest_step() == 30 and published.steps() == [30, 20]
    folder = host_b.work_dir(job_id).checkpoints
    assert published.pull_latest(folder) == 30
    ckpt = CheckpointManager(folder).load_latest()
    assert ckpt.step == 30 and ckpt.meta["note"] == 30
    assert torch.equal(ckpt.tensors["w"], torch.full((4,), 30.0))
    assert sorted(p.name for p in folder.iterdir()) == [
        "latest",
        "step-30.json",
        "step-30.safetensors",
    ]


def test_nothing_published_means_no_checkpoint(s3_bucket, tmp_path):
    job_id = str(uuid.uuid4())
    storage = _storage(S3Storage, s3_bucket, tmp_path)
    published = Published(storage, job_id)
    assert published.latest_step() is None
    assert published.pull_latest(storage.work_dir(job_id).checkpoints) is None
    # tensors without a pointer (an upload cut short) are not a checkpoint to resume from
    storage.put_bytes(job_id, "checkpoints/step-5.safetensors", b"partial")
    assert published.latest_step() is None
