"""Upload validation for `kind=splat`: the NeRF dataset intake (same archive rules, same normal
form), a SplatConfig instead of a NerfConfig, and COLMAP's sparse points kept for initialisation.

A COLMAP upload that has `points3D.txt` beside `images.txt` gets it copied to
`dataset/points3D.txt` (world frame, as uploaded; the worker applies the stored normalisation).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from api_schemas.nerf import NerfConfig
from api_schemas.splat import SplatConfig
from service.intake import IntakeError
from service.intake import nerf as nerf_intake
from service.intake.archive import extract_archive, limits_from_settings

MAX_POINTS = 5_000_000


def parse_config(config: dict[str, Any] | None) -> SplatConfig:
    try:
        return SplatConfig.model_validate(config or {})
    except ValidationError as exc:
        msg = "; ".join(
            f"{'.'.join(str(x) for x in e['loc']) or 'config'}: {e['msg']}" for e in exc.errors()
        )
        raise IntakeError(422, f"invalid splat config: {msg}") from None


def count_points3d(path: Path) -> int:
    """Validate COLMAP points3D.txt (POINT3D_ID X Y Z R G B ERROR TRACK...) and count its points."""
    n = 0
    with open(path, encoding="utf-8", errors="replace") as fh:
        for ln, line in enumerate(fh, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split()
            try:
                xyz = [float(v) for v in parts[1:4]]
                rgb = [int(v) for v in parts[4:7]]
            except ValueError:
                raise IntakeError(
                    422, f"points3D.txt line {ln}: expected POINT3D_ID X Y Z R G B ..."
                ) from None
            if len(xyz) != 3 or len(rgb) != 3 or not all(abs(v) < 1e30 for v in xyz):
                raise IntakeError(
                    422, f"points3D.txt line {ln}: expected POINT3D_ID X Y Z R G B ..."
                )
            n += 1
            if n > MAX_POINTS:
                raise IntakeError(413, f"points3D.txt has more than {MAX_POINTS} points")
    return n


def validate_upload(
    src_path: Path, filename: str, config: dict[str, Any] | None, job_dir: Path, settings
) -> tuple[dict[str, Any], dict[str, Any]]:
    cfg = parse_config(config)
    job_dir = Path(job_dir).resolve()
    work = job_dir / "upload" / "extracted"
    partial = job_dir / "dataset.partial"
    final = job_dir / "dataset"
    for p in (work, partial):
        shutil.rmtree(p, ignore_errors=True)
    n_points = 0
    try:
        if Path(src_path).stat().st_size == 0:
            raise IntakeError(422, "the uploaded file is empty")
        extract_archive(Path(src_path), work, limits_from_settings(settings))
        partial.mkdir(parents=True)
        meta = nerf_intake.build_dataset(
            work, partial, NerfConfig(aabb_scale=cfg.aabb_scale), settings
        )
        images_txt = (
            nerf_intake._shallowest(work, "images.txt")
            if meta["source_format"] == "colmap"
            else None
        )
        if images_txt is not None and (images_txt.parent / "points3D.txt").is_file():
            n_points = count_points3d(images_txt.parent / "points3D.txt")
            shutil.copyfile(images_txt.parent / "points3D.txt", partial / "points3D.txt")
        if cfg.init == "points3d" and n_points == 0:
            raise IntakeError(
                422, "init=points3d needs a COLMAP upload with a non-empty points3D.txt"
            )
        if final.exists():
            shutil.rmtree(final)
        os.replace(partial, final)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(partial, ignore_errors=True)
    splits = [f["split"] for f in meta["frames"]]
    summary = {
        "filename": filename,
        "source_format": meta["source_format"],
        "n_train": splits.count("train"),
        "n_test": splits.count("test"),
        "n_val": splits.count("val"),
        "sizes": sorted({f"{f['w']}x{f['h']}" for f in meta["frames"]}),
        "has_alpha": meta["has_alpha"],
        "normalization": meta["normalization"],
        "n_points3d": n_points,
    }
    return cfg.model_dump(mode="json"), summary
