"""Per-image appearance compensation (`appearance: true`): photos of one scene taken at two
exposures; each photo's affine colour transform learns its own, the Gaussians keep one colour."""

from __future__ import annotations

import io

import numpy as np
import torch
from PIL import Image

from experiments.synthetic_scene import scene_files
from tests.worker.test_splat_trainer import intake
from worker.scene.dataset import Dataset, read_meta
from worker.splat.trainer import SplatTrainer

DARK = 0.5


def darkened(files: dict[str, bytes]) -> tuple[dict[str, bytes], set[str]]:
    """Every other training photo at half the exposure (RGB x 0.5, alpha kept)."""
    out, dark = dict(files), set()
    for k, name in enumerate(sorted(n for n in files if n.startswith("train/"))):
        if k % 2:
            im = np.asarray(Image.open(io.BytesIO(files[name])).convert("RGBA")).astype(np.float64)
            im[..., :3] *= DARK
            buf = io.BytesIO()
            Image.fromarray(np.round(im).astype(np.uint8)).save(buf, "PNG")
            out[name] = buf.getvalue()
            dark.add(name.split("/", 1)[1].rsplit(".", 1)[0])
    return out, dark


def test_each_photo_learns_its_exposure(tmp_path):
    files, dark = darkened(scene_files(size=24, n_train=8, n_test=1, seed=3))
    config = {
        "appearance": True,
        "lr_appearance": 0.05,
        "n_init_points": 800,
        "steps": 60,
        "sh_degree": 0,
        "train_background": "black",
    }
    cfg, _, job = intake(tmp_path, files, config)
    meta = read_meta(job / "dataset")
    data = Dataset(job / "dataset", "train", meta)
    t = SplatTrainer(cfg, meta, torch.device("cpu"), data)
    assert t.appearance.shape == (8, 3, 4)
    for _ in range(60):
        t.train_step()
    a = t.appearance.detach()
    gain = (a[:, :, :3].sum(2) * 0.5 + a[:, :, 3]).mean(1) / 0.5  # (8,) what it does to grey
    is_dark = torch.tensor([any(d in (f.source or f.file) for d in dark) for f in data.frames])
    assert is_dark.sum() == 4
    ratio = float(gain[is_dark].mean() / gain[~is_dark].mean())
    assert ratio < 0.85, (gain, is_dark)  # towards DARK; the Gaussians stay in between
    assert abs(float(gain.mean()) - 1) < 0.1  # the mean transform stays the identity
    tensors, _ = t.state()
    assert torch.equal(tensors["appearance"], t.appearance.detach())
