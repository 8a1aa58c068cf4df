"""`kind=splat` intake: the posed-photo intake of service.intake.scene with a SplatConfig; the
sparse points of a COLMAP upload are kept (world frame, `dataset/points3D.txt`) to seed the
Gaussians."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from api_schemas.splat import SplatConfig
from core.scene_format import FISHEYE
from service.intake import IntakeError
from service.intake.scene.build import validate_scene_upload


def _check(cfg: SplatConfig, meta: dict) -> None:
    if any(f.get("camera_model") == FISHEYE for f in meta["frames"]):
        raise IntakeError(
            422,
            "kind=splat rasterises pinhole cameras; OPENCV_FISHEYE captures train with kind=nerf",
        )
    if cfg.init == "points3d" and not meta.get("n_points3d"):
        raise IntakeError(422, "init=points3d needs a COLMAP upload with sparse points (points3D)")


def validate_upload(
    src_path: Path, filename: str, config: dict[str, Any] | None, job_dir: Path, settings
) -> tuple[dict[str, Any], dict[str, Any]]:
    return validate_scene_upload(
        src_path,
        filename,
        config,
        job_dir,
        settings,
        config_model=SplatConfig,
        keep_points=True,
        check=_check,
    )
