"""Job configs as their kind's typed model (api_schemas.kinds.CONFIG_MODELS), read from what was
stored: a job's `config` (its row in the database's jobs table, written by the API of whichever
release took the job) and the `config` a checkpoint's meta recorded (written by the trainer of
whichever release trained it). The worker validates a config here once and hands the model on;
defaults are the schema's.

Stored configs outlive the schema they were written with, so both readers drop keys the schema
no longer has and fill keys it gained with their defaults. A checkpoint's config also keeps
values the schema now refuses (a range that narrowed since): the model was trained with them,
and rendering it needs them as they were."""

from __future__ import annotations

import logging
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from api_schemas.image import ImageConfig
from api_schemas.jobs import Job, JobKind
from api_schemas.kinds import CONFIG_MODELS
from api_schemas.nerf import NerfConfig
from api_schemas.splat import SplatConfig

log = logging.getLogger(__name__)
Config = ImageConfig | NerfConfig | SplatConfig
M = TypeVar("M", bound=BaseModel)


class ConfigError(ValueError):
    """A job's stored config does not validate against its kind's schema."""


def _known(model: type[BaseModel], data: dict[str, Any], where: str) -> dict[str, Any]:
    known = {k: v for k, v in data.items() if k in model.model_fields}
    dropped = sorted(set(data) - set(known))
    if dropped:
        log.info("%s: config keys %s are not %s fields; ignored", where, dropped, model.__name__)
    return known


def stored_config(model: type[M], data: dict[str, Any] | BaseModel, where: str = "config") -> M:
    """`data` (a stored config dict, or a model already) as `model`, validated; keys the schema
    does not have are dropped, missing ones get the schema's defaults. ConfigError (naming the
    fields) when a value is invalid."""
    if isinstance(data, model):
        return data
    if isinstance(data, BaseModel):
        data = data.model_dump()
    try:
        return model.model_validate(_known(model, data, where))
    except ValidationError as exc:
        errors = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'config'}: {e['msg']}"
            for e in exc.errors(include_url=False)
        )
        raise ConfigError(f"{where} does not validate: {errors}") from None


def trained_config(
    model: type[M], data: dict[str, Any] | BaseModel, where: str = "checkpoint"
) -> M:
    """The config a checkpoint was trained with (its meta's `config`), as `model`: as
    stored_config, but a value the schema now refuses is kept as it was (unvalidated), since the
    checkpoint's tensors were shaped by it."""
    try:
        return stored_config(model, data, where)
    except ConfigError as exc:
        log.warning("%s; keeping the values it was trained with", exc)
        known = _known(model, data if isinstance(data, dict) else data.model_dump(), where)
        return model.model_construct(**known)


def checkpoint_config(model: type[M], checkpoint) -> M | None:
    """The config `checkpoint` (worker.checkpoints.Checkpoint) was trained with, as `model`
    (trained_config); None where its meta records none."""
    saved = checkpoint.meta.get("config")
    if not isinstance(saved, dict):
        return None
    return trained_config(model, saved, f"checkpoint {checkpoint.step}")


def job_config(job: Job) -> Config:
    """The job's config as its kind's model: the worker's one validation of it."""
    return stored_config(CONFIG_MODELS[JobKind(job.kind)], job.config, f"job {job.id}'s config")


def config_dict(config: BaseModel) -> dict[str, Any]:
    """A config as checkpoint meta stores it (JSON, every field, defaults included)."""
    return config.model_dump(mode="json")
