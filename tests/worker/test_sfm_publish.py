"""SfM's output through S3 (worker/sfm/stage.py `publish`): the dataset's cameras file is the
last object stored, so a dataset cut short reads as SfM not done (`needs_preprocess`), and the
capture's objects go once the dataset is in."""

from __future__ import annotations

import uuid

from core.s3_storage import S3Storage
from core.scene_format import CAMERAS_FILE
from worker.sfm import stage


class RecordingS3(S3Storage):
    """The real S3 backend, noting the keys it uploads in order."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.uploads: list[str] = []

    def put_file(self, job_id, key, src):
        super().put_file(job_id, key, src)
        self.uploads.append(key)


def test_publish_stores_the_cameras_file_last_and_drops_the_capture(s3_bucket, tmp_path):
    s = s3_bucket.settings(tmp_path)
    storage = RecordingS3(s.data_dir, s.storage_url, s.s3_endpoint_url, s.scratch_path)
    job_id = str(uuid.uuid4())
    storage.put_bytes(job_id, f"{stage.CAPTURE_DIR}/{stage.MANIFEST}", b"{}")
    storage.put_bytes(job_id, f"{stage.CAPTURE_DIR}/images/a.jpg", b"jpeg")
    assert stage.needs_preprocess(storage, job_id)

    work = storage.work_dir(job_id)
    (work.dataset / "images").mkdir(parents=True)
    for name in ("images/0000.png", "images/0001.png", "points3D.txt", CAMERAS_FILE):
        (work.dataset / name).write_bytes(name.encode())
    work.artifacts.mkdir()
    (work.artifacts / stage.TRANSFORMS_ARTIFACT).write_text("{}")

    stage.publish(storage, job_id)
    assert storage.uploads[-1] == f"dataset/{CAMERAS_FILE}"
    assert sorted(storage.uploads) == sorted(
        [
            f"artifacts/{stage.TRANSFORMS_ARTIFACT}",
            "dataset/images/0000.png",
            "dataset/images/0001.png",
            "dataset/points3D.txt",
            f"dataset/{CAMERAS_FILE}",
        ]
    )
    assert not stage.needs_preprocess(storage, job_id)
    assert not storage.list(job_id, f"{stage.CAPTURE_DIR}/")

    # a dataset whose cameras file never arrived is one SfM still has to make
    storage.put_bytes(job_id, f"{stage.CAPTURE_DIR}/{stage.MANIFEST}", b"{}")
    storage.delete(job_id, f"dataset/{CAMERAS_FILE}")
    assert stage.needs_preprocess(storage, job_id)
