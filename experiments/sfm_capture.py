"""A capture without poses, rendered by experiments.synthetic_scene with exact ground truth:
the textured scene seen from a video-like loop of cameras, as plain photos (zip), as a video
(H.264 MP4 via PyAV) and, for comparison, as the same photos with their true poses (Blender
layout); plus held-out poses and their true images for evaluation.

Used by tests/worker/test_sfm_job.py and experiments/sfm_table.py, which also share the
evaluation here: align the recovered cameras to the true ones, render held-out poses.
"""

from __future__ import annotations

import io
import json
import math
import zipfile
from dataclasses import dataclass

import numpy as np
from PIL import Image

from experiments.synthetic_scene import FOV_X_DEG, orbit_poses, render, textured_scene

# Closer than the posed scenes' 3.5: the scene fills more of the frame, so SIFT has pixels.
DISTANCE = 2.8


@dataclass
class Capture:
    size: int
    fx: float
    c2w: list[np.ndarray]  # true poses of the frames, OpenGL axes
    rgb: list[np.ndarray]  # (size, size, 3) uint8 on black
    test_c2w: list[np.ndarray]  # held out: never uploaded
    test_rgb: list[np.ndarray]

    def photos_zip(self) -> bytes:
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as zf:
            for i, im in enumerate(self.rgb):
                zf.writestr(f"capture/IMG_{i:04d}.png", _png(im))
        return buf.getvalue()

    def posed_zip(self) -> bytes:
        """The same photos with their true poses (Blender transforms_train.json; every
        TEST_EVERY-th frame is held out by intake exactly as for the unposed upload)."""
        frames = [
            {"file_path": f"./capture/IMG_{i:04d}", "transform_matrix": c.tolist()}
            for i, c in enumerate(self.c2w)
        ]
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as zf:
            for i, im in enumerate(self.rgb):
                zf.writestr(f"capture/IMG_{i:04d}.png", _png(im))
            zf.writestr(
                "transforms.json",
                json.dumps({"camera_angle_x": math.radians(FOV_X_DEG), "frames": frames}),
            )
        return buf.getvalue()

    def video(self, repeat: int = 2, fps: int = 24, crf: int = 16) -> bytes:
        """The frames as an H.264 MP4, each shown `repeat` times (so frame selection has runs
        to choose from)."""
        import av

        buf = io.BytesIO()
        with av.open(buf, "w", format="mp4") as out:
            stream = out.add_stream("libx264", rate=fps)
            stream.width = stream.height = self.size
            stream.pix_fmt = "yuv420p"
            stream.options = {"crf": str(crf)}
            for im in self.rgb:
                for _ in range(repeat):
                    for pkt in stream.encode(av.VideoFrame.from_ndarray(im, format="rgb24")):
                        out.mux(pkt)
            for pkt in stream.encode():
                out.mux(pkt)
        return buf.getvalue()


def _png(rgb: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, "PNG")
    return buf.getvalue()


def _on_black(c2w: np.ndarray, size: int, scene) -> np.ndarray:
    rgba = render(c2w, size, size, scene=scene, supersample=2)["rgba"]
    return np.round(np.clip(rgba[..., :3] * rgba[..., 3:], 0, 1) * 255).astype(np.uint8)


def make_capture(n: int = 24, size: int = 200, n_test: int = 4, seed: int = 0) -> Capture:
    scene = textured_scene(seed)
    poses = orbit_poses(n, radius=DISTANCE)
    # Held-out views between the capture's cameras, a little higher up.
    test = orbit_poses(n_test, radius=DISTANCE, elevation_deg=28.0, wobble_deg=0.0)
    shift = np.eye(4)
    a = math.pi / n  # half a step around the loop
    shift[:2, :2] = [[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]]
    test = [shift @ t for t in test]
    fx = 0.5 * size / math.tan(math.radians(FOV_X_DEG) / 2)
    return Capture(
        size=size,
        fx=fx,
        c2w=poses,
        rgb=[_on_black(c, size, scene) for c in poses],
        test_c2w=test,
        test_rgb=[_on_black(c, size, scene) for c in test],
    )


def similarity(src: np.ndarray, dst: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """Umeyama's least-squares similarity dst ~ s * R @ src + t for (N, 3) point sets."""
    mu_s, mu_d = src.mean(0), dst.mean(0)
    a, b = src - mu_s, dst - mu_d
    u, d, vt = np.linalg.svd(b.T @ a / len(src))
    e = np.eye(3)
    if np.linalg.det(u) * np.linalg.det(vt) < 0:
        e[2, 2] = -1
    r = u @ e @ vt
    s = float(np.trace(np.diag(d) @ e) / a.var(0).sum())
    return s, r, mu_d - s * r @ mu_s


def to_frame(c2w: np.ndarray, s: float, r: np.ndarray, t: np.ndarray) -> np.ndarray:
    """A camera moved by the similarity (rotation and translation; scale moves its centre)."""
    out = np.eye(4)
    out[:3, :3] = r @ c2w[:3, :3]
    out[:3, 3] = s * r @ c2w[:3, 3] + t
    return out


def align(transforms: dict, capture: Capture, index_of) -> tuple[np.ndarray, np.ndarray, tuple]:
    """Recovered c2w (from a job's transforms.json artifact) and true c2w of the registered
    frames, and the similarity true -> SfM frame fitted to the camera centres. `index_of`
    maps a frame's file_path to its capture index."""
    est = np.stack([np.array(f["transform_matrix"]) for f in transforms["frames"]])
    true = np.stack([capture.c2w[index_of(f["file_path"])] for f in transforms["frames"]])
    return est, true, similarity(true[:, :3, 3], est[:, :3, 3])


def pose_errors(est: np.ndarray, true: np.ndarray, sim: tuple) -> tuple[float, float]:
    """Median rotation error (degrees) and camera-centre error (share of the camera distance)
    of recovered poses against true ones moved by `sim`."""
    s, r, t = sim
    rot, centre = [], []
    for e, g in zip(est, true):
        moved = to_frame(g, s, r, t)
        cos = (np.trace(moved[:3, :3].T @ e[:3, :3]) - 1) / 2
        rot.append(math.degrees(math.acos(np.clip(cos, -1, 1))))
        centre.append(np.linalg.norm(moved[:3, 3] - e[:3, 3]) / (s * np.linalg.norm(g[:3, 3])))
    return float(np.median(rot)), float(np.median(centre))


def render_held_out(client, job_id: str, capture: Capture, sim: tuple | None = None) -> list:
    """The job's renders (HTTP render API) of the held-out true poses, moved into the job's
    frame by `sim` (None: the job's frame is the true one); (H, W, 3) floats in [0, 1]."""
    out = []
    for c2w in capture.test_c2w:
        pose = c2w if sim is None else to_frame(c2w, *sim)
        body = {
            "width": capture.size,
            "height": capture.size,
            "fx": capture.fx,
            "fy": capture.fx,
            "camera": {"c2w": pose.tolist()},
            "background": "black",
        }
        r = client.post(f"/v1/jobs/{job_id}/render", json=body)
        if r.status_code != 200:
            raise RuntimeError(f"render failed: {r.status_code} {r.text}")
        out.append(np.asarray(Image.open(io.BytesIO(r.content)).convert("RGB"), np.float64) / 255)
    return out


def psnr(pred: np.ndarray, gt_uint8: np.ndarray) -> float:
    mse = float(np.mean((pred - gt_uint8.astype(np.float64) / 255) ** 2))
    return -10 * math.log10(max(mse, 1e-10))
