"""Celery configuration shared by the API (client) and the worker, built from Settings.

REDIS_URL set → Redis broker + result backend. Unset → Celery's filesystem transport under
DATA_DIR/broker and the file:// result backend under DATA_DIR/results (embedded mode: no
services needed)."""

from __future__ import annotations

from typing import Any

from api_schemas import tasks
from core import fs_transport
from core.settings import Settings

TRAIN_QUEUE = "train"
RENDER_QUEUE = "render"
# Structure from motion for uploads without poses: CPU work, kept off the (GPU) train workers.
PREPROCESS_QUEUE = "preprocess"
# Task names and payloads: api_schemas/tasks.py.
TASK_PREPROCESS = tasks.PreprocessTask.name
TASK_TRAIN = tasks.TrainTask.name
TASK_RENDER = tasks.RenderTask.name
TASK_RENDER_PATH = tasks.RenderPathTask.name
# Exports share the render workers: they already hold trained models, and a deployment needs no
# new worker to offer them. The task publishes no result (state lives in <job>/exports/).
TASK_EXPORT = tasks.ExportTask.name
EXPORT_QUEUE = RENDER_QUEUE
TASK_RENDER_PATH_JOB = tasks.RenderPathJobTask.name  # a path rendered to an artifact
TASK_RENDER_FRAME_JOB = tasks.RenderFrameJobTask.name  # one large frame, in tiles, to an artifact


def broker_dirs(settings: Settings) -> dict[str, Any]:
    root = settings.data_dir.resolve()
    dirs = {
        "queue": root / "broker" / "queue",
        "processed": root / "broker" / "processed",
        "control": root / "broker" / "control",
        "results": root / "results",
    }
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    return dirs


def celery_config(settings: Settings) -> dict[str, Any]:
    conf: dict[str, Any] = {
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        "task_routes": {
            TASK_TRAIN: {"queue": TRAIN_QUEUE},
            TASK_PREPROCESS: {"queue": PREPROCESS_QUEUE},
            "nf.render*": {"queue": RENDER_QUEUE},
            TASK_EXPORT: {"queue": EXPORT_QUEUE},
        },
        "task_default_queue": TRAIN_QUEUE,
        # A training survives a worker crash: the message is acked only when the task ends,
        # and the redelivered task resumes from the latest checkpoint.
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        # How long a pool process that died is waited on before its task counts as lost and is
        # requeued (default 10 s). Train tasks publish no result, so nothing is lost by hurrying.
        "worker_lost_wait": 2.0,
        "result_expires": 3600,
        "broker_connection_retry_on_startup": True,
        "worker_hijack_root_logger": False,
        "task_track_started": False,
    }
    if settings.redis_url:
        conf["broker_url"] = settings.redis_url
        conf["result_backend"] = settings.redis_url
        conf["broker_transport_options"] = {"visibility_timeout": settings.visibility_timeout_s}
        conf["result_backend_transport_options"] = {
            "visibility_timeout": settings.visibility_timeout_s
        }
    else:
        d = broker_dirs(settings)
        conf["broker_url"] = f"{fs_transport.ALIAS}://"
        conf["broker_transport_options"] = {
            "data_folder_in": str(d["queue"]),
            "data_folder_out": str(d["queue"]),
            "processed_folder": str(d["processed"]),
            "control_folder": str(d["control"]),
            "store_processed": False,
            "polling_interval": settings.broker_polling_interval_s,
        }
        conf["result_backend"] = "file://" + str(d["results"])
    return conf


def task_id_for(task: tasks.Task) -> str | None:
    """The id a background task is sent under: the job id for its training and SfM, one per
    export and render job. The reaper tells from these ids what the broker still holds."""
    if isinstance(task, tasks.TrainTask | tasks.PreprocessTask):
        return task.job_id
    if isinstance(task, tasks.ExportTask):
        return f"{task.job_id}.export.{task.export_id}"
    if isinstance(task, tasks.RenderPathJobTask | tasks.RenderFrameJobTask):
        return f"{task.job_id}.render.{task.render_id}"
    return None


def send(client, task: tasks.Task, queue: str, **options):
    """Queue `task` by its name, its payload as keyword arguments (api_schemas/tasks.py); the
    Celery `headers` (the request id) are added by core.logs.put_request_id as for any send."""
    if options.get("task_id") is None and (tid := task_id_for(task)) is not None:
        options["task_id"] = tid
    return client.send_task(task.name, kwargs=tasks.payload(task), queue=queue, **options)
