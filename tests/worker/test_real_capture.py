"""A real phone capture end to end: instant-ngp's fox (`../shared/captures/fox`, uploaded as the
folder is, its transforms.json listing frames whose photo is absent) at a 120-px long side, as
nerf and as splat through the real API and a Celery worker, default config and a minute each.

The NeRF must generalise to the held-out photos, not only fit its training photos: its held-out
PSNR stays above a floor and within a stated gap of the splat's on the same upload (the splats
match the photos; a NeRF that explains each training photo with floaters does not)."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest

FOX = Path(__file__).resolve().parents[3] / "shared" / "captures" / "fox"
BUDGET_S = 60.0
LONG_SIDE = 120
# Measured alone on this 2-core machine at 120 px and 60 s each: nerf 20.27 dB held-out at its
# defaults (417 steps), splat 18.34 (338 steps); CI's machine gave splat 20.16. The NeRF's former
# rate (1e-2 decaying to 0.03 of it) scored 14.2 here and 15.63 in CI: under this floor. The
# budget is wall time, so the machine's speed moves the figure: on a later day here the same
# defaults made 341 steps and 17.89 dB, with gradient scaling near the cameras 18.23.
NERF_FLOOR_DB = 17.0
MAX_GAP_DB = 2.0  # the aim: nerf within 2 dB of splat on a real capture

pytestmark = [
    pytest.mark.skipif(
        not (FOX / "transforms.json").is_file(), reason=f"the fox capture is not at {FOX}"
    ),
    pytest.mark.slow,
]


def fox_zip() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for p in sorted(FOX.rglob("*")):
            if p.is_file():
                zf.write(p, p.relative_to(FOX).as_posix())
    return buf.getvalue()


@pytest.fixture(scope="module")
def jobs(fs_stack):
    # One after the other: two trainings at once would halve each other's budget.
    data = fox_zip()
    out = {}
    for kind in ("nerf", "splat"):
        config = {"time_limit_s": BUDGET_S, "long_side": LONG_SIDE}
        r = fs_stack.submit(data, "fox.zip", kind=kind, config=config)
        assert r.status_code == 202, r.text
        out[kind] = fs_stack.wait_status(
            r.json()["id"], "succeeded", "failed", timeout=6 * BUDGET_S + 300
        )
    return out


# The trainings are judged on what 60 s of wall time bought: nothing may run beside them.
@pytest.mark.alone
def test_the_upload_as_it_is_trains_the_photos_it_has(jobs):
    ds = jobs["nerf"]["dataset"]
    assert ds["missing_images"]["count"] == 17  # transforms.json lists 67 frames, 50 are there
    assert ds["n_train"] + ds["n_test"] == 50 and ds["n_test"] == 7


@pytest.mark.alone
def test_nerf_generalises_as_the_splats_do(jobs):
    for kind, job in jobs.items():
        assert job["status"] == "succeeded", (kind, job["error"])
    nerf, splat = jobs["nerf"]["metrics"], jobs["splat"]["metrics"]
    report = (
        f"nerf {nerf['test_psnr']:.2f} dB (eval scale {nerf['eval_scale']}, {nerf['steps']} steps), "
        f"splat {splat['test_psnr']:.2f} dB (eval scale {splat['eval_scale']}, {splat['steps']} steps)"
    )
    print(report)
    for m in (nerf, splat):  # every held-out view, at the training size
        assert m["n_test"] == 7 and m["eval_scale"] == 1, report
    assert nerf["test_psnr"] >= NERF_FLOOR_DB, report
    assert splat["test_psnr"] - nerf["test_psnr"] <= MAX_GAP_DB, report


def test_no_point_a_training_camera_sees_is_culled_as_unseen(tmp_path):
    """The occupancy grid's unseen marks (cells no training camera sees stay empty) on the real
    capture's portrait, distorted photos and its aabb_scale-4 box: every point of every sampled
    training ray inside the box lies in a cell still marked seen, so the field can fit every
    training photo, the views from above included."""
    import torch

    from api_schemas.nerf import NerfConfig
    from core.settings import Settings
    from service.intake.nerf import validate_upload
    from worker.nerf.trainer import NerfTrainer
    from worker.scene.dataset import Dataset, read_meta

    job = tmp_path / "job"
    (job / "upload").mkdir(parents=True)
    src = job / "upload" / "fox.zip"
    src.write_bytes(fox_zip())
    validate_upload(src, "fox.zip", {"long_side": 64}, job, Settings(data_dir=tmp_path))
    meta = read_meta(job / "dataset")
    train = Dataset(job / "dataset", "train", meta)
    # One view is enough to be seen: the default's two views keep the cells a lone photo sees
    # empty, and two views each from occupancy_view_share of the camera's distance on also those
    # only the cameras right behind them see.
    config = NerfConfig(occupancy_min_views=1)
    trainer = NerfTrainer(config, meta, "cpu", train)
    assert 0.05 < trainer.unseen_fraction < 0.95  # the marks exist and are not everything
    o, d, _ = train.sample(20_000, torch.Generator().manual_seed(0), jitter=1.0)
    t = torch.linspace(0.01, 2 * trainer.half * 3**0.5, 200)
    points = (o[:, None] + t[None, :, None] * d[:, None]).reshape(-1, 3)
    points = points[(points.abs() < trainer.half).all(1)]
    assert len(points) > 100_000
    assert bool(trainer.grid.is_occupied(points).all())
    two = NerfTrainer(NerfConfig(), meta, "cpu", train)
    far = NerfTrainer(NerfConfig(occupancy_view_share=0.6), meta, "cpu", train)
    assert trainer.unseen_fraction < two.unseen_fraction < far.unseen_fraction < 0.95
