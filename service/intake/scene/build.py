"""The posed-photo upload skeleton shared by nerf and splat: config, archive, pose files, photo
checks, then `core.scene_build.write_scene` at the training resolution."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from core.scene_build import SceneFrame, write_scene
from core.scene_format import SceneError
from core.settings import get_settings
from service.intake import IntakeError, unposed
from service.intake.archive import extract_archive, limits_from_settings
from service.intake.scene.formats import parse_dataset
from service.intake.scene.images import ImageInfo, inspect_image, resolve_intrinsics


def effective_config(model: type[BaseModel], config: dict[str, Any] | None) -> BaseModel:
    """The job config as a model. The API validated it already (service.api.job_intake
    `parse_config`, the one validation); keys a direct caller leaves out take their defaults."""
    return model.model_construct(**(config or {}))


def build_dataset(
    root: Path, out_dir: Path, work_dir: Path, cfg: BaseModel, settings, keep_points: bool
) -> dict:
    """Parse and check the extracted upload at `root`; write the normal form to `out_dir`."""
    parsed = parse_dataset(root, work_dir, settings.max_archive_entries)
    frames = parsed.frames
    # A photo that several frames name is inspected once (WebP/HEIF/AVIF checks decode it).
    seen: dict[Path, ImageInfo] = {}
    infos = []
    for f in frames:
        key = f.image.resolve()
        if key not in seen:
            seen[key] = inspect_image(f.image, f.name, settings.max_image_pixels)
        infos.append(seen[key])
    sizes = {(i.w, i.h) for f, i in zip(frames, infos) if not f.own_intrinsics}
    if len(sizes) > 1:
        raise IntakeError(
            422,
            "images have different sizes ("
            + ", ".join(f"{w}x{h}" for w, h in sorted(sizes))
            + ") but the cameras share one set of intrinsics; give per-frame intrinsics "
            "(fl_x, fl_y, cx, cy, w, h) or resize the images",
        )
    masks = {f.mask.resolve(): f.mask for f in frames if f.mask is not None}
    for mask in masks.values():
        inspect_image(mask, str(mask.relative_to(root)), settings.max_image_pixels)
    scene = [
        SceneFrame(
            image=f.image,
            c2w=f.c2w,
            axes=f.axes,
            **resolve_intrinsics(f, i),
            camera_model=f.camera_model,
            distortion=f.distortion,
            split=f.split,
            name=f.name,
            mask=f.mask,
            mask_keeps_nonzero=f.mask_keeps_nonzero,
        )
        for f, i in zip(frames, infos)
    ]
    try:
        meta = write_scene(
            out_dir,
            scene,
            source_format=parsed.source_format,
            long_side=None if cfg.downscale else (cfg.long_side or settings.train_long_side),
            downscale=cfg.downscale,
            ngp_scale=parsed.ngp_scale,
            ngp_offset=parsed.ngp_offset,
            aabb_scale=cfg.aabb_scale or parsed.aabb_scale,
            points_xyz=parsed.points_xyz if keep_points else None,
            points_rgb=parsed.points_rgb,
            move_images=True,
        )
    except SceneError as exc:
        raise IntakeError(422, str(exc)) from None
    if parsed.missing:
        # Said in the job's dataset summary: the frames trained are not all the pose file lists.
        meta["missing_images"] = {"count": len(parsed.missing), "first": parsed.missing[:5]}
    return meta


def validate_scene_upload(
    src_path: Path,
    filename: str,
    config: dict[str, Any] | None,
    job_dir: Path,
    settings,
    *,
    config_model: type[BaseModel],
    keep_points: bool = False,
    check: Callable[[BaseModel, dict], None] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Validate an uploaded archive and write `job_dir/dataset/` in normal form.

    Returns (effective config, dataset summary). `check(cfg, meta)` may refuse what the kind
    cannot train. Raises IntakeError; on error nothing is left but the caller's upload (the
    extraction, scratch files and a partial dataset are removed).
    """
    cfg = effective_config(config_model, config)
    settings = settings or get_settings()
    job_dir = Path(job_dir).resolve()
    work = job_dir / "upload" / "extracted"
    scratch = job_dir / "upload" / "scratch"
    partial = job_dir / "dataset.partial"
    final = job_dir / "dataset"
    for p in (work, scratch, partial):
        shutil.rmtree(p, ignore_errors=True)
    try:
        if Path(src_path).stat().st_size == 0:
            raise IntakeError(422, "the uploaded file is empty")
        if unposed.is_video(Path(src_path), filename):  # SfM later, on the preprocess queue
            info = unposed.accept_video(Path(src_path), filename, job_dir, settings)
            return cfg.model_dump(mode="json"), info
        extract_archive(Path(src_path), work, limits_from_settings(settings))
        if not unposed.has_poses(work):
            info = unposed.accept_images(work, filename, job_dir, settings)
            return cfg.model_dump(mode="json"), info
        partial.mkdir(parents=True)
        meta = build_dataset(work, partial, scratch, cfg, settings, keep_points)
        if check is not None:
            check(cfg, meta)
        if final.exists():
            shutil.rmtree(final)
        os.replace(partial, final)
    finally:
        for p in (work, scratch, partial):
            shutil.rmtree(p, ignore_errors=True)
    splits = [f["split"] for f in meta["frames"]]
    summary = {
        "filename": filename,
        "source_format": meta["source_format"],
        "n_train": splits.count("train"),
        "n_test": splits.count("test"),
        "n_val": splits.count("val"),
        "sizes": sorted({f"{f['w']}x{f['h']}" for f in meta["frames"]}),
        "source_sizes": meta["source_sizes"],
        "n_masked": sum("mask" in f for f in meta["frames"]),
        "has_alpha": meta["has_alpha"],
        "normalization": meta["normalization"],
        "aabb_scale": meta["aabb"][1][0],  # the upload's, or chosen from its cameras and points
    }
    if meta.get("missing_images"):
        summary["missing_images"] = meta["missing_images"]
    if keep_points:
        summary["n_points3d"] = meta.get("n_points3d", 0)
    return cfg.model_dump(mode="json"), summary
