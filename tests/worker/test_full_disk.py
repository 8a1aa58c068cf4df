"""A real full file system (a small tmpfs as DATA_DIR, filled by a file) under a running
training: the job cannot even record its failure while the disk is full, and ends `failed` with
a readable error as soon as space is back; no event lost, no temp file is left."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from tests.support.stack import png_bytes

pytestmark = pytest.mark.slow  # `make test-fast` leaves it out


@pytest.fixture
def small_fs(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mnt)], capture_output=True
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (root needed): {r.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(path) -> int:
    written = 0
    with open(path, "wb") as fh:
        try:
            while True:
                fh.write(b"\0" * (256 * 1024))
                fh.flush()
                written += 256 * 1024
        except OSError:
            pass
    return written


def test_a_full_disk_fails_the_job_readably_once_space_is_back(stack_factory, small_fs):
    data = small_fs / "data"
    stack = stack_factory(
        queues="train",
        redis_db=9,  # broker and results in Redis: only the job files are on the small disk
        env={"DATA_DIR": str(data), "CHECKPOINT_INTERVAL_S": "0.3", "PROGRESS_INTERVAL_S": "0.2"},
    )
    try:
        r = stack.submit(png_bytes(16, 16), config={"steps": 200000, "resolution": 16})
        job_id = r.json()["id"]
        job_dir = data / "jobs" / job_id
        stack.wait_for(job_id, lambda j: (j["progress"] or {}).get("step", 0) > 50, 60, "steps")

        filler = small_fs / "filler"
        assert _fill(filler) > 0
        # The training hits ENOSPC; recording the failure needs space too.
        log = stack.log_dir / "worker-0.log"
        deadline = time.monotonic() + 30
        while "cannot record its failure yet" not in log.read_text():
            assert time.monotonic() < deadline, stack.logs()
            time.sleep(0.1)
        job = stack.client.get(f"/v1/jobs/{job_id}").json()
        assert job["status"] == "running", job  # could not be written yet

        filler.unlink()
        job = stack.wait_status(job_id, "failed", timeout=30)
        assert "No space left on device" in job["error"], job["error"]
        events = stack.events(job_id)
        assert [e["id"] for e in events] == list(range(1, len(events) + 1))
        assert events[-1]["data"]["status"] == "failed"
        leftovers = [p for p in job_dir.rglob("*") if p.name.endswith(".tmp")]
        assert leftovers == []
        assert os.statvfs(small_fs).f_bavail > 0
    finally:
        stack.stop()
