"""worker/scratch.py: a worker host's working copies of S3 job files stay within SCRATCH_MAX_GB,
least recently used first, never one a running task holds; with local storage nothing is
deleted."""

from __future__ import annotations

import os
import time
import uuid

from core.s3_storage import s3_storage
from core.storage import LocalStorage
from worker.scratch import job_work_dir

MB = 1 << 20


def _fill(root, n_bytes: int) -> None:
    (root / "dataset").mkdir(parents=True, exist_ok=True)
    (root / "dataset" / "blob.bin").write_bytes(os.urandom(n_bytes))


def _use(
    storage, job_id: str, n_bytes: int = 0, max_bytes: int | None = None, evict_every_s=0.0
) -> None:
    with job_work_dir(storage, job_id, max_bytes, evict_every_s) as paths:
        if n_bytes:
            _fill(paths.root, n_bytes)
    time.sleep(0.02)  # distinct last-use times


def test_least_recently_used_unheld_folders_are_evicted_first(s3_bucket, tmp_path):
    storage = s3_storage(s3_bucket.settings(tmp_path))
    a, b, c, d = (str(uuid.uuid4()) for _ in range(4))
    with job_work_dir(storage, a, None) as held:  # the oldest, but a task still uses it
        _fill(held.root, MB)
        time.sleep(0.02)
        _use(storage, b, MB)
        _use(storage, c, MB)
        _use(storage, b)  # b used again: c is now the least recently used unheld folder
        with job_work_dir(storage, d, int(2.5 * MB)) as paths:
            assert paths.root.is_dir()
            assert held.root.is_dir() and (held.root / "dataset" / "blob.bin").is_file()
            assert storage.work_dir(b).root.is_dir()
            assert not storage.work_dir(c).root.exists()
        # over the bound with only held folders left: they stay
        with job_work_dir(storage, d, 0):
            assert held.root.is_dir()
    assert not storage.work_dir(b).root.exists()  # evicted by the second entry of d
    # a freed folder is fair game, and an evicted job's folder is made again on its next use
    _use(storage, d, max_bytes=0)
    assert not held.root.exists()
    with job_work_dir(storage, a, 0) as again:
        assert again.root.is_dir() and not (again.root / "dataset").exists()


def test_local_storage_work_dir_is_the_job_folder_and_never_evicted(tmp_path):
    storage = LocalStorage(tmp_path)
    jobs = [str(uuid.uuid4()) for _ in range(2)]
    for job_id in jobs:
        storage.paths(job_id).root.mkdir(parents=True)
        _fill(storage.paths(job_id).root, MB)
    with job_work_dir(storage, jobs[1], 0) as paths:
        assert paths == storage.paths(jobs[1])
    assert all((storage.paths(j).root / "dataset" / "blob.bin").is_file() for j in jobs)
    assert not any(p.name.startswith(".") for p in storage.paths(jobs[0]).root.iterdir())


def test_a_process_measures_the_cache_at_most_once_per_interval(s3_bucket, tmp_path):
    storage = s3_storage(s3_bucket.settings(tmp_path))
    a, b = (str(uuid.uuid4()) for _ in range(2))
    _use(storage, a, MB)
    _use(storage, b, max_bytes=0, evict_every_s=60)
    assert not storage.work_dir(a).root.exists()
    _use(storage, a, MB)
    _use(storage, b, max_bytes=0, evict_every_s=60)  # within the interval: not measured
    assert storage.work_dir(a).root.is_dir()
