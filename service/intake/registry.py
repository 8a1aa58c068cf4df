"""Job kinds known to the API, resolved lazily: a kind whose modules are not importable (yet)
is simply unknown, so kinds can land independently."""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass
from types import ModuleType

from pydantic import BaseModel

log = logging.getLogger(__name__)

# kind -> (intake module, "module:ConfigClass")
KINDS: dict[str, tuple[str, str]] = {
    "image": ("service.intake.image", "api_schemas.image:ImageConfig"),
    "nerf": ("service.intake.nerf", "api_schemas.nerf:NerfConfig"),
    "splat": ("service.intake.splat", "api_schemas.splat:SplatConfig"),
}


@dataclass(frozen=True)
class KindSpec:
    name: str
    intake: ModuleType
    config_model: type[BaseModel]


def _load_attr(ref: str):
    mod_name, attr = ref.split(":")
    return getattr(importlib.import_module(mod_name), attr)


def get_kind(kind: str) -> KindSpec | None:
    entry = KINDS.get(kind)
    if entry is None:
        return None
    intake_name, config_ref = entry
    try:
        intake = importlib.import_module(intake_name)
        config_model = _load_attr(config_ref)
        if not hasattr(intake, "validate_upload"):
            raise AttributeError(f"{intake_name} has no validate_upload")
    except (ImportError, AttributeError) as exc:
        log.warning("job kind %r unavailable: %s", kind, exc)
        return None
    return KindSpec(kind, intake, config_model)


def available_kinds() -> list[str]:
    return [k for k in KINDS if get_kind(k) is not None]
