"""COLMAP models (text or binary: cameras, images, points3D) read with pycolmap.

pycolmap trusts the counts in a binary model, so a hostile file can ask it for gigabytes; it
runs in a child process with an address-space cap and a time limit, and hands back plain JSON
and numpy arrays. Run as `python -m service.intake.scene.colmap MODEL_DIR OUT_DIR` it is that
child.
"""

from __future__ import annotations

import json
import resource
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from core.process import child_env, child_pythonpath
from service.intake import IntakeError

CHILD_MEMORY_BYTES = 4 << 30
CHILD_TIMEOUT_S = 120

# COLMAP camera model -> its parameter names, in COLMAP's order. The fisheye models are all the
# equidistant (Kannala-Brandt) family: OPENCV_FISHEYE's k1..k4 with the missing ones zero.
MODELS = {
    "SIMPLE_PINHOLE": ("f", "cx", "cy"),
    "PINHOLE": ("fx", "fy", "cx", "cy"),
    "SIMPLE_RADIAL": ("f", "cx", "cy", "k1"),
    "RADIAL": ("f", "cx", "cy", "k1", "k2"),
    "OPENCV": ("fx", "fy", "cx", "cy", "k1", "k2", "p1", "p2"),
    "OPENCV_FISHEYE": ("fx", "fy", "cx", "cy", "k1", "k2", "k3", "k4"),
    "SIMPLE_RADIAL_FISHEYE": ("f", "cx", "cy", "k1"),
    "RADIAL_FISHEYE": ("f", "cx", "cy", "k1", "k2"),
}
FISHEYE_MODELS = ("OPENCV_FISHEYE", "SIMPLE_RADIAL_FISHEYE", "RADIAL_FISHEYE")


@dataclass
class ColmapModel:
    cameras: dict[int, dict]  # id -> {model, w, h, fx, fy, cx, cy, fisheye, distortion}
    images: list[dict]  # {name, camera_id, cam_from_world: 3x4}
    points_xyz: np.ndarray  # (N, 3) world frame
    points_rgb: np.ndarray  # (N, 3) uint8


def read_model(model_dir: Path, work_dir: Path, where: str) -> ColmapModel:
    """Read the model in `model_dir` (files of one kind: *.txt or *.bin); `work_dir` receives the
    child's output and is removed by the caller. IntakeError names `where` on failure."""
    work_dir.mkdir(parents=True, exist_ok=True)
    ext = "bin" if (model_dir / "cameras.bin").is_file() else "txt"
    if not (model_dir / f"points3D.{ext}").is_file():
        # pycolmap wants all three files; a model without sparse points is still a posed capture.
        copy = work_dir / "model"
        copy.mkdir()
        for name in ("cameras", "images"):
            shutil.copyfile(model_dir / f"{name}.{ext}", copy / f"{name}.{ext}")
        (copy / f"points3D.{ext}").write_bytes(b"\0" * 8 if ext == "bin" else b"")
        model_dir = copy
    pkg_root = Path(__file__).resolve().parents[3]
    env = {**child_env(), "PYTHONPATH": child_pythonpath(pkg_root)}
    try:
        r = subprocess.run(
            [sys.executable, "-m", "service.intake.scene.colmap", str(model_dir), str(work_dir)],
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT_S,
            env=env,
        )
    except subprocess.TimeoutExpired:
        raise IntakeError(422, f"the COLMAP model in {where} took too long to read") from None
    if r.returncode != 0:
        lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
        reason = lines[-1] if lines else f"exit status {r.returncode}"
        if "MemoryError" in reason or "bad_alloc" in reason:
            reason = "its counts ask for more memory than the files can hold"
        raise IntakeError(422, f"the COLMAP model in {where} is unreadable: {reason}")
    data = json.loads((work_dir / "model.json").read_text())
    pts = np.load(work_dir / "points.npz")
    return ColmapModel(
        {int(k): v for k, v in data["cameras"].items()},
        data["images"],
        pts["xyz"],
        pts["rgb"],
    )


def _camera(cam) -> dict:
    name = cam.model.name
    if name not in MODELS:
        return {"model": name}
    vals = dict(zip(MODELS[name], (float(v) for v in cam.params)))
    f = vals.pop("f", None)
    fx, fy = (f, f) if f is not None else (vals.pop("fx"), vals.pop("fy"))
    return {
        "model": name,
        "w": int(cam.width),
        "h": int(cam.height),
        "fx": fx,
        "fy": fy,
        "cx": vals.pop("cx"),
        "cy": vals.pop("cy"),
        "fisheye": name in FISHEYE_MODELS,
        "distortion": vals,
    }


def _child(model_dir: str, out_dir: str) -> None:
    import pycolmap

    class ModelError(Exception):
        pass

    try:
        rec = pycolmap.Reconstruction(model_dir)
    except Exception as exc:  # pycolmap raises ValueError/IndexError/RuntimeError with COLMAP text
        msg = str(exc).split("] ", 1)[-1].strip() or type(exc).__name__
        raise ModelError(msg) from None
    cameras = {str(cid): _camera(c) for cid, c in rec.cameras.items()}
    images = []
    for _, img in sorted(rec.images.items()):
        if not img.has_pose:
            continue
        images.append(
            {
                "name": img.name,
                "camera_id": int(img.camera_id),
                "cam_from_world": np.asarray(img.cam_from_world().matrix()).tolist(),
            }
        )
    pts = [p for _, p in sorted(rec.points3D.items())]
    xyz = np.array([p.xyz for p in pts], dtype=np.float64).reshape(-1, 3)
    rgb = np.array([p.color for p in pts], dtype=np.uint8).reshape(-1, 3)
    out = Path(out_dir)
    (out / "model.json").write_text(json.dumps({"cameras": cameras, "images": images}))
    np.savez(out / "points.npz", xyz=xyz, rgb=rgb)


if __name__ == "__main__":
    # Set here rather than in a preexec_fn: the API forks this from a thread pool.
    # Under the intake child (service/intake/sandbox.py) the inherited cap may be lower already.
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = CHILD_MEMORY_BYTES if hard == resource.RLIM_INFINITY else min(hard, CHILD_MEMORY_BYTES)
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    try:
        _child(sys.argv[1], sys.argv[2])
    except MemoryError:
        print("MemoryError", file=sys.stderr)
        sys.exit(2)
    except Exception as exc:
        print(str(exc), file=sys.stderr)
        sys.exit(1)
