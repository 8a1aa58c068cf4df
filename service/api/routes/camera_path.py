"""A scene job's training cameras as nerfstudio's camera_path.json, in the dataset's own world
frame: what `render/path` takes back (`frame: world`) and `ns-render camera-path` reads."""

from __future__ import annotations

import json
import math

from fastapi import APIRouter, HTTPException

from core.scene_format import CAMERAS_FILE
from service.api.deps import JOB_GUARDS, StorageDep, StoreDep, load_job

router = APIRouter(prefix="/v1/jobs", tags=["render"], dependencies=JOB_GUARDS)
FPS = 24


def _world_c2w(c2w: list[list[float]], normalization: dict) -> list[float]:
    """Row-major 16 floats: the stored (normalised) pose moved back to the world frame,
    p_world = p_n / scale + offset (docs/architecture.md, normal form)."""
    s, off = float(normalization["scale"]), normalization["offset"]
    rows = [list(map(float, r)) for r in c2w[:3]]
    for i in range(3):
        rows[i][3] = rows[i][3] / s + float(off[i])
    return [v for r in rows for v in r] + [0.0, 0.0, 0.0, 1.0]


@router.get(
    "/{job_id}/camera_path",
    summary="The training cameras as a nerfstudio camera_path.json (dataset world frame)",
    responses={409: {"description": "not a scene job"}},
)
def training_camera_path(
    job_id: str,
    store: StoreDep,
    storage: StorageDep,
    split: str = "train",
) -> dict:
    job = load_job(store, job_id)
    try:
        meta = json.loads(storage.get_bytes(job.id, f"dataset/{CAMERAS_FILE}"))
    except FileNotFoundError:
        raise HTTPException(409, f"{job.kind.value} jobs have no cameras") from None
    frames = [f for f in meta["frames"] if f.get("split", "train") == split]
    if not frames:
        raise HTTPException(404, f"the dataset has no {split!r} cameras")
    w, h = int(frames[0]["w"]), int(frames[0]["h"])
    return {
        "camera_type": "perspective",
        "render_width": w,
        "render_height": h,
        "fps": FPS,
        "seconds": len(frames) / FPS,
        "frame": "world",
        "camera_path": [
            {
                "camera_to_world": _world_c2w(f["c2w"], meta["normalization"]),
                # nerfstudio's fov is vertical, over the image height
                "fov": math.degrees(2 * math.atan(0.5 * h / float(f["fy"]))),
                "aspect": w / h,
                "file": f.get("source") or f["file"],
            }
            for f in frames
        ],
    }
