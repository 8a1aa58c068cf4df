"""Render results travel through storage (service/queue.py): the API reads the object a
result names and deletes it, and the object of a result whose caller gave up is deleted by the
poller when that result lands. Real Celery file result backend, real local storage."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from celery import states

from core.settings import Settings
from core.storage import LocalStorage
from service.queue import RenderTimeout, TaskQueue, make_client


def _queue(tmp_path) -> tuple[TaskQueue, LocalStorage]:
    settings = Settings(data_dir=tmp_path, redis_url=None, storage_url=None)
    return TaskQueue(make_client(settings), settings), LocalStorage(tmp_path)


def _stored(storage: LocalStorage, job_id: str, data: bytes) -> dict:
    key = f"renders/results/{uuid.uuid4()}.png"
    storage.put_bytes(job_id, key, data)
    return {"content_type": "image/png", "job_id": job_id, "key": key, "size": len(data)}


def test_a_result_is_read_once_and_its_object_deleted(tmp_path):
    queue, storage = _queue(tmp_path)
    job_id = str(uuid.uuid4())
    result = _stored(storage, job_id, b"\x89PNG frame")
    assert queue.take_result(result) == b"\x89PNG frame"
    assert not storage.exists(job_id, result["key"])
    with pytest.raises(FileNotFoundError):
        queue.take_result(result)


def test_the_object_of_a_result_nobody_waits_for_is_deleted_when_it_lands(tmp_path):
    queue, storage = _queue(tmp_path)
    job_id, task_id = str(uuid.uuid4()), str(uuid.uuid4())
    result = _stored(storage, job_id, b"late frame")
    backend = queue.client.backend

    async def scenario() -> None:
        with pytest.raises(RenderTimeout):
            await queue.waiter.wait(task_id, timeout=0.05)
        backend.store_result(task_id, result, states.SUCCESS)
        for _ in range(100):
            if not storage.exists(job_id, result["key"]):
                return
            await asyncio.sleep(0.05)
        raise AssertionError("the abandoned result's object is still stored")

    asyncio.run(scenario())
    assert backend.get(backend.get_key_for_task(task_id)) is None  # the result went too
