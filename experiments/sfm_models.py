"""SfM camera models against the true poses, on the capture-like scene (phone lens, k1 = -0.08)
and on experiments/sfm_capture.py's undistorted views: registered images, mean reprojection
error, median and worst rotation error, median camera-centre error (share of the camera
distance), the fitted parameters.

    python -m experiments.sfm_models [--models PINHOLE,OPENCV:after,OPENCV] [--scenes capture,reordered,orbit]

`MODEL:after` maps pinhole cameras and fits MODEL's distortion in one bundle adjustment at the
end, kept where it lowers the reprojection error by 5 % (what `SFM_CAMERA_MODEL=auto`
does); `MODEL` alone refines it as the mapper goes.
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path

import numpy as np

from experiments.capture_scene import arc_poses, capture_files
from experiments.capture_table import reordered
from experiments.sfm_capture import _png, make_capture, similarity, to_frame


def scenes(which: list[str]) -> dict[str, dict[str, tuple[bytes, np.ndarray]]]:
    """{scene: {file name: (photo bytes, true OpenGL c2w)}}."""
    out = {}
    if {"capture", "reordered"} & set(which):
        photos = capture_files()["unposed"]
        poses = dict(zip(photos, arc_poses(len(photos))))
        if "capture" in which:
            out["capture"] = {Path(n).name: (b, poses[n]) for n, b in photos.items()}
        if "reordered" in which:
            by_bytes = {b: n for n, b in photos.items()}
            out["reordered"] = {
                Path(n).name: (b, poses[by_bytes[b]]) for n, b in reordered(photos).items()
            }
    if "orbit" in which:
        cap = make_capture()
        out["orbit"] = {
            f"IMG_{i:04d}.png": (_png(im), c) for i, (im, c) in enumerate(zip(cap.rgb, cap.c2w))
        }
    return out


def pose_errors(registered, true: dict[str, np.ndarray]) -> tuple[float, float, float]:
    """Median and worst rotation error (degrees), median centre error (share of the distance)."""
    from worker.sfm.stage import opengl_c2w

    est = np.stack([opengl_c2w(r.world_from_cam) for r in registered])
    gt = np.stack([true[r.name] for r in registered])
    s, rot, t = similarity(gt[:, :3, 3], est[:, :3, 3])
    deg, centre = [], []
    for e, g in zip(est, gt):
        moved = to_frame(g, s, rot, t)
        cos = (np.trace(moved[:3, :3].T @ e[:3, :3]) - 1) / 2
        deg.append(math.degrees(math.acos(np.clip(cos, -1, 1))))
        centre.append(np.linalg.norm(moved[:3, 3] - e[:3, 3]) / (s * np.linalg.norm(g[:3, 3])))
    return float(np.median(deg)), float(np.max(deg)), float(np.median(centre))


def main(argv=None) -> None:
    import pycolmap

    from worker.sfm.colmap import SfmOptions, run_sfm

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="PINHOLE,OPENCV:after,OPENCV")
    ap.add_argument("--scenes", default="capture,reordered,orbit")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    for scene, files in scenes(a.scenes.split(",")).items():
        true = {n: c for n, (_, c) in files.items()}
        for variant in a.models.split(","):
            model, _, when = variant.partition(":")
            with tempfile.TemporaryDirectory() as tmp:
                images = Path(tmp) / "images"
                images.mkdir()
                for n, (data, _) in files.items():
                    (images / n).write_bytes(data)
                opts = SfmOptions(
                    camera_model=model,
                    matcher="exhaustive",
                    threads=a.threads,
                    distortion_after_mapping=when == "after",
                )
                t0 = time.perf_counter()
                res = run_sfm(images, sorted(files), Path(tmp) / "work", opts)
                seconds = time.perf_counter() - t0
                if res.model_dir is None:
                    print(f"{scene:10s} {variant:14s} nothing registered")
                    continue
                rec = pycolmap.Reconstruction(res.model_dir)
                (cam,) = rec.cameras.values()
                med, worst, centre = pose_errors(res.registered, true)
                params = ", ".join(
                    f"{k.strip()} {v:.4g}" for k, v in zip(cam.params_info.split(","), cam.params)
                )
                print(
                    f"{scene:10s} {variant:14s} registered {len(res.registered)}/{len(files)}"
                    f"  reprojection {rec.compute_mean_reprojection_error():.3f} px"
                    f"  rotation {med:.3f} (worst {worst:.3f}) deg  centre {centre:.4f}"
                    f"  {seconds:.0f} s  [{params}]",
                    flush=True,
                )


if __name__ == "__main__":
    main()
