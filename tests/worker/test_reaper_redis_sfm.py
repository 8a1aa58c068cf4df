"""The reaper on the Redis broker with a scene job waiting for its SfM (issue 28): rounds every
half second never take the job in the preprocess queue for lost, so nothing is re-sent and the
train worker never sees it; the preprocess queue holds its one message throughout."""

from __future__ import annotations

import io
import time
import zipfile

import pytest
import redis

from tests.support.stack import png_bytes

pytestmark = pytest.mark.slow  # `make test-fast` leaves it out


def _photos_zip(n: int = 8) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for i in range(n):
            z.writestr(f"photos/{i:03d}.png", png_bytes(64, 48, seed=i))
    return buf.getvalue()


def test_a_job_waiting_in_preprocess_is_not_resent(stack_factory):
    env = {"REAPER_INTERVAL_S": "0.5", "QUEUED_GRACE_S": "1", "LEASE_TTL_S": "2"}
    stack = stack_factory(queues="train", redis_db=15, env=env)  # no SfM worker
    r = stack.submit(_photos_zip(), "photos.zip", kind="nerf", config={"steps": 10})
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    assert stack.store().get(job_id).dataset.get("sfm") == "pending"

    client = redis.Redis.from_url(stack.env["REDIS_URL"])

    def preprocess_messages() -> int:
        return sum(
            client.llen(k)
            for k in client.scan_iter(match="preprocess*")
            if client.type(k) == b"list"
        )

    deadline = time.monotonic() + 60
    while " ready." not in stack.logs(tail=10**6):
        assert time.monotonic() < deadline, stack.logs()
        time.sleep(0.2)
    time.sleep(5)  # ten reaper rounds
    assert preprocess_messages() == 1
    logs = stack.logs(tail=10**6)
    assert f"nf.train[{job_id}]" not in logs, logs[-3000:]
    assert "re-sent" not in logs, logs[-3000:]
    assert stack.store().get(job_id).status.value == "queued"
