"""The Celery app: `celery -A worker.app worker -Q train,render`."""

from __future__ import annotations

from celery import Celery
from celery.signals import worker_process_init

import worker.observability  # noqa: F401  (log and metrics signals, before the worker starts)
from core.celery_config import celery_config
from core.settings import get_settings

app = Celery("nf-worker", include=["worker.tasks", "worker.render_jobs"])
app.conf.update(celery_config(get_settings()))


def limit_torch_threads() -> None:
    # Several workers (and the API) share few cores; torch's default of one thread per core
    # makes them fight. TORCH_THREADS=0 keeps torch's default.
    import torch

    n = get_settings().torch_threads
    if n > 0:
        torch.set_num_threads(n)


@worker_process_init.connect
def _init_pool_process(**_):
    limit_torch_threads()  # forked prefork children re-apply it
