"""`kind=nerf` intake: an archive of posed photos (service.intake.scene) and a NerfConfig."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from api_schemas.nerf import NerfConfig
from service.intake.scene.build import validate_scene_upload


def validate_upload(
    src_path: Path, filename: str, config: dict[str, Any] | None, job_dir: Path, settings
) -> tuple[dict[str, Any], dict[str, Any]]:
    return validate_scene_upload(
        src_path, filename, config, job_dir, settings, config_model=NerfConfig
    )
