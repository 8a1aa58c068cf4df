"""SfM on a real phone capture: instant-ngp's fox (`../shared/captures/fox`, 50 photos at
1080x1920 of a fox on a wall of repeating roses) with the options the SfM stage chooses, against
COLMAP's reference poses in its transforms.json. Repeated texture is where a mapper can place a
group of cameras against the wrong copy of the pattern; every camera must land where the
reference puts it, not only most of them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from core.settings import Settings
from experiments.sfm_capture import similarity
from worker.sfm import colmap
from worker.sfm.stage import sfm_options

FOX = Path(__file__).resolve().parents[3] / "shared" / "captures" / "fox"
# Share of the cameras' spread (mean distance from their centroid) a camera centre may be off
# after a similarity fit: measured 0.16 % median, 0.42 % worst; the free OPENCV fit put 9 cameras
# 225 % off.
MAX_CENTRE_ERROR = 0.05

pytestmark = [
    pytest.mark.skipif(
        not (FOX / "transforms.json").is_file(), reason=f"the fox capture is not at {FOX}"
    ),
    pytest.mark.slow,
]


def test_every_fox_camera_lands_where_colmaps_reference_puts_it(tmp_path):
    names = sorted(p.name for p in (FOX / "images").glob("*.jpg"))
    opts = sfm_options(Settings(data_dir=tmp_path / "data"), "photos", len(names), True)
    result = colmap.run_sfm(FOX / "images", names, tmp_path / "sfm", opts)
    assert len(result.registered) == len(names), (len(result.registered), result.n_models)

    frames = json.loads((FOX / "transforms.json").read_text())["frames"]
    ref = {Path(f["file_path"]).name: np.array(f["transform_matrix"])[:3, 3] for f in frames}
    got = np.stack([r.world_from_cam[:, 3] for r in result.registered])
    want = np.stack([ref[r.name] for r in result.registered])
    # Fitted on the cameras that agree, as a misplaced group would drag a fit over all of them.
    keep = np.ones(len(got), bool)
    for _ in range(5):
        s, rot, t = similarity(got[keep], want[keep])
        err = np.linalg.norm((s * (rot @ got.T)).T + t - want, axis=1)
        keep = err <= np.quantile(err, 0.75)
    spread = np.linalg.norm(want - want.mean(0), axis=1).mean()
    off = {r.name: round(float(e / spread), 3) for r, e in zip(result.registered, err)}
    bad = {k: v for k, v in off.items() if v > MAX_CENTRE_ERROR}
    assert not bad, f"cameras off the reference (share of the spread): {bad}"
