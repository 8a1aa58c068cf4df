"""service/quotas.py on SQLite and PostgreSQL: uploads all admitted before any is charged (each
told the whole room left) keep exactly as many as fit; a check held open for longer than any
lock timeout still keeps a parallel admission of the same key waiting, then counts what it
admitted; deleted jobs stop counting."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from core.settings import Settings
from core.storage import LocalStorage
from core.store import JobStore
from service.auth import ApiKey
from service.quotas import QuotaExceeded, Quotas, lock_owner

KEY = ApiKey("k-quota", "quota")
MB = 1024 * 1024


@pytest.fixture
def quotas(db_url, tmp_path):
    settings = Settings(
        data_dir=tmp_path, database_url=db_url, quota_stored_mb=1, quota_active_jobs=50
    )
    storage = LocalStorage(tmp_path)
    return Quotas(storage, JobStore(storage, url=db_url), settings)


def test_uploads_admitted_together_share_the_room_left(quotas):
    size = 300_000  # 3 fit in 1 MiB, 6 are admitted
    admitted = threading.Barrier(6)

    def upload(_):
        job_id, _paths, room = quotas.admit(KEY)
        assert room == MB
        admitted.wait(30)  # every one admitted before any is charged
        try:
            quotas.charge(KEY, job_id, size)
            return job_id
        except QuotaExceeded as exc:
            assert exc.status_code == 413 and "QUOTA_STORED_MB" in exc.detail
            return None

    with ThreadPoolExecutor(6) as pool:
        kept = [j for j in pool.map(upload, range(6)) if j]
    assert len(kept) == 3
    assert quotas.stored_bytes(KEY.id) == 3 * size
    late = quotas.admit(KEY)
    assert late.room_bytes == MB - 3 * size
    with pytest.raises(QuotaExceeded):
        quotas.charge(KEY, late.job_id, size)
    # A deleted job's bytes count no more.
    quotas.store.delete(kept[0])
    assert quotas.stored_bytes(KEY.id) == 2 * size


def test_a_long_check_keeps_a_parallel_admission_waiting(quotas):
    """The key's row stays locked for as long as the transaction holding it lasts."""
    from core.db.engine import session

    quotas.settings = quotas.settings.model_copy(update={"quota_active_jobs": 1})
    held, done = threading.Event(), []

    def long_check():
        with session(engine=quotas.store.engine, write=True) as s:
            lock_owner(s, KEY.id)
            held.set()
            time.sleep(2.0)  # longer than the check itself ever takes
        done.append(time.monotonic())

    t = threading.Thread(target=long_check)
    t.start()
    assert held.wait(10)
    first = quotas.admit(KEY)  # waits for the lock, then admits (nothing active yet)
    assert done and time.monotonic() >= done[0]
    t.join()
    with pytest.raises(QuotaExceeded) as exc:
        quotas.admit(KEY)
    assert exc.value.status_code == 429 and "QUOTA_ACTIVE_JOBS" in exc.value.detail
    quotas.store.delete(first.job_id)
    assert quotas.admit(KEY).job_id != first.job_id
