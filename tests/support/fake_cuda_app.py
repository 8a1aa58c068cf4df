"""The worker's Celery app on the fake CUDA device (tests/support/fake_cuda.py): the test stack
(tests/support/stack.py) starts `celery -A tests.support.fake_cuda_app worker` for a worker whose
environment sets NF_FAKE_CUDA=1, so the Celery task path runs on it end to end. Fake CUDA is on
before the worker's modules load, in the worker and in every pool process it forks."""

from __future__ import annotations

from tests.support import fake_cuda

fake_cuda.enable_from_env()

from worker.app import app  # noqa: E402  (after fake CUDA is on)

__all__ = ["app"]
