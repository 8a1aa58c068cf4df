"""The one list of job kinds: each kind's config model. The API's intake (`service.intake.<kind>`)
and the worker's trainer (`worker.jobs.<kind>`) are found by the kind's name."""

from __future__ import annotations

from pydantic import BaseModel

from api_schemas.image import ImageConfig
from api_schemas.jobs import JobKind
from api_schemas.nerf import NerfConfig
from api_schemas.splat import SplatConfig

CONFIG_MODELS: dict[JobKind, type[BaseModel]] = {
    JobKind.image: ImageConfig,
    JobKind.nerf: NerfConfig,
    JobKind.splat: SplatConfig,
}
assert set(CONFIG_MODELS) == set(JobKind), "every JobKind needs a config model"
