"""Job kinds known to the API: `api_schemas.kinds` lists them with their config models; each
kind's intake is `service.intake.<kind>`, imported on first use."""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass
from types import ModuleType

from pydantic import BaseModel

from api_schemas.kinds import CONFIG_MODELS

log = logging.getLogger(__name__)

KINDS: dict[str, type[BaseModel]] = {kind.value: model for kind, model in CONFIG_MODELS.items()}


@dataclass(frozen=True)
class KindSpec:
    name: str
    intake: ModuleType
    config_model: type[BaseModel]


def get_kind(kind: str) -> KindSpec | None:
    config_model = KINDS.get(kind)
    if config_model is None:
        return None
    intake_name = f"service.intake.{kind}"
    try:
        intake = importlib.import_module(intake_name)
        if not hasattr(intake, "validate_upload"):
            raise AttributeError(f"{intake_name} has no validate_upload")
    except (ImportError, AttributeError) as exc:
        log.warning("job kind %r unavailable: %s", kind, exc)
        return None
    return KindSpec(kind, intake, config_model)


def available_kinds() -> list[str]:
    return [k for k in KINDS if get_kind(k) is not None]
