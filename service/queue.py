"""Celery client for the API: sends tasks by name so the API never imports worker code."""

from __future__ import annotations

import os
import time
from functools import lru_cache
from typing import Any

from celery import Celery

from core.celery_config import (
    EXPORT_QUEUE,
    RENDER_QUEUE,
    TASK_EXPORT,
    TASK_RENDER,
    TASK_RENDER_PATH,
    TASK_TRAIN,
    TRAIN_QUEUE,
    broker_dirs,
    celery_config,
)
from core.settings import Settings, get_settings


class RenderTimeout(Exception):
    pass


def make_client(settings: Settings) -> Celery:
    client = Celery("nf-api")
    client.conf.update(celery_config(settings))
    return client


@lru_cache
def get_client() -> Celery:
    return make_client(get_settings())


class TaskQueue:
    def __init__(self, client: Celery, settings: Settings):
        self.client = client
        self.settings = settings

    def send_train(self, job_id: str) -> None:
        # task_id == job_id, so cancelling a queued job can revoke it without extra state.
        self.client.send_task(
            TASK_TRAIN, args=[job_id], queue=TRAIN_QUEUE, task_id=job_id, ignore_result=True
        )

    def send_export(self, job_id: str, export_id: str) -> None:
        self.client.send_task(
            TASK_EXPORT, args=[job_id, export_id], queue=EXPORT_QUEUE, ignore_result=True
        )

    def revoke(self, job_id: str) -> None:
        try:
            self.client.control.revoke(job_id)
        except Exception:  # best effort: the worker also re-checks job.json before training
            pass

    def render(self, job_id: str, request: dict[str, Any], path: bool = False) -> dict[str, Any]:
        name = TASK_RENDER_PATH if path else TASK_RENDER
        res = self.client.send_task(name, args=[job_id, request], queue=RENDER_QUEUE)
        # Poll rather than res.get(): the Redis backend's pub/sub result consumer is not safe
        # to share between the threads FastAPI runs sync routes on.
        deadline = time.monotonic() + self.settings.render_timeout_s
        delay = 0.01
        try:
            while not self._ready(res):
                if time.monotonic() > deadline:
                    res.revoke()
                    raise RenderTimeout(
                        f"render did not finish within {self.settings.render_timeout_s:g} s"
                    )
                time.sleep(delay)
                delay = min(delay * 1.5, 0.1)
            if res.failed():
                raise RuntimeError(str(res.result))
            return res.result
        finally:
            try:
                res.forget()
            except OSError:
                pass  # file:// backend: the result file is already gone; nothing left to free

    @staticmethod
    def _ready(res) -> bool:
        try:
            return res.ready()
        except ValueError:
            # Celery's file:// backend rewrites result files in place: a read can catch one
            # half written. The next poll sees it whole.
            return False

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
