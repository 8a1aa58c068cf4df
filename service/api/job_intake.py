"""What both job-creating routes (the multipart POST /v1/jobs and a finished direct upload,
routes/uploads.py) do with an upload: parse and check its config, name it, run the intake,
store its output and create the job, or discard the admitted job."""

from __future__ import annotations

import json
import re
import shutil
from typing import Any

from fastapi import HTTPException
from pydantic import ValidationError

from api_schemas.jobs import Job
from core.settings import Settings
from core.storage import JobPaths, Storage
from core.store import JobStore, ReservationGone
from service.intake import IntakeError
from service.intake.sandbox import run_intake


def validation_detail(exc: ValidationError) -> str:
    """A 422 detail naming each invalid config field."""
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "config"
        parts.append(f"{loc}: {err['msg']}")
    return "invalid config: " + "; ".join(parts)


def parse_config(spec, raw: str | None) -> dict[str, Any]:
    """The `config` form field validated by the kind's model, with defaults filled (422 else)."""
    if raw is None or raw.strip() == "":
        data: Any = {}
    else:
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise HTTPException(422, f"config is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise HTTPException(422, "config must be a JSON object")
    try:
        return spec.config_model.model_validate(data).model_dump(mode="json")
    except ValidationError as exc:
        raise HTTPException(422, validation_detail(exc)) from None


def check_budget(cfg: dict[str, Any], settings: Settings) -> None:
    """422 for steps or a time limit over the deployment's training ceilings."""
    steps = cfg.get("steps")
    if isinstance(steps, int) and steps > settings.max_train_steps:
        raise HTTPException(
            422,
            f"config.steps: {steps} is over the training ceiling of {settings.max_train_steps} "
            f"(MAX_TRAIN_STEPS)",
        )
    limit = cfg.get("time_limit_s")
    if isinstance(limit, int | float) and limit > settings.max_train_s:
        raise HTTPException(
            422,
            f"config.time_limit_s: {limit:g} is over the training ceiling of "
            f"{settings.max_train_s:g} s (MAX_TRAIN_S)",
        )


def safe_name(filename: str | None) -> str:
    """The client's file name reduced to a safe base name (never a path, never hidden)."""
    base = re.sub(
        r"[^A-Za-z0-9._-]", "_", (filename or "upload").rsplit("/", 1)[-1].rsplit("\\", 1)[-1]
    )
    return base.lstrip(".")[:120] or "upload"


def finish_intake(
    spec,
    cfg: dict,
    upload,
    job_id: str,
    work: JobPaths,
    storage: Storage,
    store: JobStore,
    settings: Settings,
) -> Job:
    """Run the intake on the upload, store what it wrote and make the job from its reserved row,
    kept fresh meanwhile (410 when that row is gone: the reaper found the upload abandoned)."""
    try:
        with store.keep_reserved(job_id, settings.stale_upload_s):
            # Parsing the upload happens in a limited child process, never in this one, on the
            # local working copy; what it wrote (dataset/, capture/) is stored before the job
            # exists.
            effective, info = run_intake(
                spec.name,
                upload.path,
                upload.filename or upload.path.name,
                cfg,
                work.root,
                settings,
            )
            shutil.rmtree(work.upload, ignore_errors=True)
            store_intake(storage, job_id, work)
            return store.create(job_id, spec.name, effective, info, reserved=True)
    except ReservationGone:
        raise reservation_gone(settings) from None


def reservation_gone(settings: Settings) -> IntakeError:
    return IntakeError(
        410,
        "this upload's reservation lapsed (idle past STALE_UPLOAD_S = "
        f"{settings.stale_upload_s:g} s) and was removed; upload it again",
    )


def store_intake(storage: Storage, job_id: str, work: JobPaths) -> None:
    """Push the intake's output folders and files to storage (a no-op for local storage, where
    the working copy is the job's folder), then drop the API's working copy."""
    for entry in sorted(work.root.iterdir()):
        if not entry.name.startswith(".") and not entry.is_symlink():
            storage.push(job_id, entry.name)
    storage.evict(job_id)


def discard(store: JobStore, storage: Storage, job_id: str) -> None:
    """Undo an admission: the job's row (reserved or made) and its files."""
    try:
        store.delete(job_id)
    finally:
        storage.delete_job(job_id)
