"""Celery client for the API: sends tasks by name so the API never imports worker code.

Render waits are asynchronous: one poller per API process reads every pending result in a
single batched call (Redis MGET, or the file backend's reads) and resolves the waiting
requests' futures, so a thousand waiting renders cost one thread-hop per tick, not a thread
each.

A render's result travels through storage: the worker stores the rendered bytes as an object of
the job (worker/tasks.py, `renders/results/`) and returns its key; `TaskQueue.render` reads it
and deletes it, and the poller deletes those whose caller stopped waiting."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from celery import Celery, states

from api_schemas.render import PathRequest, RenderRequest
from api_schemas.tasks import (
    ExportTask,
    PreprocessTask,
    RenderFrameJobTask,
    RenderPathJobTask,
    RenderPathTask,
    RenderTask,
    TrainTask,
)
from core.celery_config import (
    EXPORT_QUEUE,
    PREPROCESS_QUEUE,
    RENDER_QUEUE,
    TRAIN_QUEUE,
    broker_dirs,
    celery_config,
    send,
)
from core.settings import Settings, get_settings
from core.storage_factory import get_storage

log = logging.getLogger(__name__)
POLL_S = 0.02
MAX_POLL_S = 0.1


class RenderTimeout(Exception):
    pass


def make_client(settings: Settings) -> Celery:
    client = Celery("nf-api")
    client.conf.update(celery_config(settings))
    return client


@lru_cache
def get_client() -> Celery:
    return make_client(get_settings())


class ResultWaiter:
    """Futures for pending task results, resolved by one polling coroutine per event loop."""

    def __init__(self, backend, discard: Callable[[Any], None] | None = None):
        self.backend = backend
        self.discard = discard  # called (in a thread) with each result nobody waits for
        self._pending: dict[str, asyncio.Future] = {}
        self._abandoned: set[str] = set()
        self._task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._idle_rounds = 0

    def _ensure_running(self) -> None:
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done() or self._loop is not loop:
            self._loop = loop
            self._task = loop.create_task(self._poll(), name="render-result-poller")

    async def wait(self, task_id: str, timeout: float) -> dict[str, Any]:
        """The task's result meta ({'status', 'result', ...}); RenderTimeout after `timeout`."""
        fut = asyncio.get_running_loop().create_future()
        self._pending[task_id] = fut
        self._ensure_running()
        try:
            return await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            raise RenderTimeout(f"render did not finish within {timeout:g} s") from None
        finally:
            if self._pending.pop(task_id, None) is not None and (fut.cancelled() or not fut.done()):
                # Nobody reads this result any more: delete it when it lands (if it does).
                self._abandoned.add(task_id)

    def _fetch(self, ids: list[str], forget: list[str], unread: list[Any]) -> list[Any]:
        """Runs in a worker thread: one batched read, plus deleting results already consumed
        and what the `unread` ones (nobody waits for them) left in storage."""
        keys = [self.backend.get_key_for_task(i) for i in ids]
        values = list(self.backend.mget(keys)) if keys else []
        for task_id in forget:
            try:
                self.backend.delete(self.backend.get_key_for_task(task_id))
            except OSError:
                pass  # file:// backend: already gone
        for result in unread:
            try:
                self.discard(result)
            except Exception:
                log.warning("could not delete an abandoned render result", exc_info=True)
        return values

    async def _poll(self) -> None:
        delay = POLL_S
        forget: list[str] = []
        unread: list[Any] = []
        while self._pending or self._abandoned or forget or unread:
            ids = list(self._pending) + list(self._abandoned)
            try:
                values = await asyncio.to_thread(self._fetch, ids, forget, unread)
            except Exception:
                log.exception("reading render results failed; retrying")
                values = [None] * len(ids)
            forget, unread = [], []
            got_any = False
            for task_id, raw in zip(ids, values, strict=True):
                if raw is None:
                    continue
                try:
                    meta = self.backend.decode_result(raw)
                except Exception:  # kombu DecodeError: a result file caught half written
                    continue
                if meta.get("status") not in states.READY_STATES:
                    continue
                got_any = True
                forget.append(task_id)
                self._abandoned.discard(task_id)
                fut = self._pending.pop(task_id, None)
                if fut is not None and not fut.done():
                    fut.set_result(meta)
                elif self.discard is not None and meta.get("status") == states.SUCCESS:
                    unread.append(meta.get("result"))
            delay = POLL_S if got_any else min(delay * 1.5, MAX_POLL_S)
            if self._pending or forget or unread:
                self._idle_rounds = 0
            else:
                # Only abandoned ids left: look once a second, and give up on them after two
                # minutes (the worker drops results finished past their deadline anyway).
                self._idle_rounds += 1
                if not self._abandoned or self._idle_rounds > 120:
                    self._abandoned.clear()
                    self._idle_rounds = 0
                    return
                delay = 1.0
            await asyncio.sleep(delay)


class TaskQueue:
    def __init__(self, client: Celery, settings: Settings):
        self.client = client
        self.settings = settings
        self.storage = get_storage(settings)
        self.waiter = ResultWaiter(client.backend, discard=self.delete_result)

    def send_train(self, job_id: str) -> None:
        # task_id == job_id, so cancelling a queued job can revoke it without extra state.
        send(
            self.client,
            TrainTask(job_id=job_id),
            TRAIN_QUEUE,
            task_id=job_id,
            ignore_result=True,
        )

    def send_export(self, job_id: str, export_id: str) -> None:
        send(
            self.client,
            ExportTask(job_id=job_id, export_id=export_id),
            EXPORT_QUEUE,
            ignore_result=True,
        )

    def send_preprocess(self, job_id: str) -> None:
        """Structure from motion first (CPU workers); that task sends the training on."""
        send(
            self.client,
            PreprocessTask(job_id=job_id),
            PREPROCESS_QUEUE,
            task_id=job_id,
            ignore_result=True,
        )

    def send_first(self, job) -> None:
        """The job's first task: SfM for a capture without poses, else training."""
        if job.dataset.get("sfm") == "pending":
            self.send_preprocess(job.id)
        else:
            self.send_train(job.id)

    def send_path_job(self, job_id: str, render_id: str, request: PathRequest) -> None:
        task = RenderPathJobTask(job_id=job_id, render_id=render_id, request=request)
        send(self.client, task, RENDER_QUEUE, ignore_result=True)

    def send_frame_job(self, job_id: str, render_id: str, request: RenderRequest) -> None:
        task = RenderFrameJobTask(job_id=job_id, render_id=render_id, request=request)
        send(self.client, task, RENDER_QUEUE, ignore_result=True)

    def revoke(self, job_id: str) -> None:
        try:
            self.client.control.revoke(job_id)
        except Exception:  # best effort: the worker also re-checks the job's status before training
            pass

    def send_render(self, job_id: str, request: RenderRequest | PathRequest):
        """Queue a render that nobody will wait for past RENDER_TIMEOUT_S: it expires unstarted,
        is killed at the time limit, and the worker drops a result finished after the deadline.
        A PathRequest is a path render (nf.render_path), a RenderRequest one frame."""
        timeout = self.settings.render_timeout_s
        task = (
            RenderPathTask(job_id=job_id, request=request)
            if isinstance(request, PathRequest)
            else RenderTask(job_id=job_id, request=request)
        )
        return send(
            self.client,
            task,
            RENDER_QUEUE,
            expires=timeout,  # seconds from now
            soft_time_limit=timeout,
            time_limit=timeout + 5,
        )

    async def render(self, job_id: str, request: RenderRequest | PathRequest) -> dict[str, Any]:
        res = await asyncio.to_thread(self.send_render, job_id, request)
        # No revoke on timeout: the task's `expires` already stops an unstarted one, and its
        # time limit a started one, without a broadcast per abandoned render.
        meta = await self.waiter.wait(res.id, self.settings.render_timeout_s)
        if meta.get("status") != states.SUCCESS:
            exc = self.client.backend.exception_to_python(meta.get("result"))
            raise RuntimeError(str(exc)) if not isinstance(exc, BaseException) else exc
        result = meta["result"]
        if "key" in result:
            result["data"] = await asyncio.to_thread(self.take_result, result)
        return result

    def take_result(self, result: dict[str, Any]) -> bytes:
        """The bytes of a stored render result, deleted once read."""
        try:
            return self.storage.get_bytes(result["job_id"], result["key"])
        finally:
            self.delete_result(result)

    def delete_result(self, result: Any) -> None:
        """Delete the object a render result names (nothing for an error result)."""
        if isinstance(result, dict) and "key" in result:
            self.storage.delete(result["job_id"], result["key"])

    def ping(self, timeout: float = 2.0) -> bool:
        """Broker reachable (a worker need not be up)."""
        try:
            if self.settings.redis_url:
                import redis

                return bool(
                    redis.Redis.from_url(
                        self.settings.redis_url,
                        socket_timeout=timeout,
                        socket_connect_timeout=timeout,
                    ).ping()
                )
            queue_dir = broker_dirs(self.settings)["queue"]
            return os.access(queue_dir, os.W_OK)
        except Exception:
            return False
