"""pycolmap directly on experiments.sfm_capture's 200 px views (true cameras: no distortion):
an OPENCV camera, which is free to drift into distortion the views do not have, still maps
every view into one model, and the mapping with distortion held fixed then refined finds the
lens close to its true zero."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from experiments.sfm_capture import make_capture, similarity
from worker.sfm import colmap

N, SIZE = 24, 200


@pytest.fixture(scope="module")
def capture():
    return make_capture(N, SIZE, n_test=1)


@pytest.fixture(scope="module")
def images(tmp_path_factory, capture):
    d = tmp_path_factory.mktemp("views")
    names = []
    for i, im in enumerate(capture.rgb):
        names.append(f"IMG_{i:04d}.png")
        Image.fromarray(im).save(d / names[-1])
    return d, names


OPENCV = colmap.SfmOptions(camera_model="OPENCV", matcher="exhaustive", threads=2)


@pytest.mark.parametrize("run", range(3))
def test_opencv_on_small_views_maps_every_view(images, tmp_path, run):
    d, names = images
    r = colmap.run_sfm(d, names, tmp_path, OPENCV)
    assert len(r.registered) >= 0.9 * N, (len(r.registered), r.n_models, r.seconds)
    assert r.model_dir is not None and (r.model_dir / "cameras.bin").is_file()


def test_fixed_distortion_mapping_refines_it_at_the_end(images, tmp_path):

    d, names = images
    first = colmap.run_sfm(d, names, tmp_path / "first", OPENCV)
    db = tmp_path / "first" / "database.db"
    po = colmap._mapping_options(OPENCV, first.mean_keypoints, fix_distortion=True)
    models = colmap._map(db, d, tmp_path / "fixed", po, lambda: None, None)
    rec = colmap._largest(models)
    assert rec.num_reg_images() >= 0.9 * N
    (cam,) = rec.cameras.values()
    held = dict(zip(cam.params_info.split(", "), cam.params))
    assert all(held[k] == 0.0 for k in ("k1", "k2", "p1", "p2")), held
    before = rec.compute_mean_reprojection_error()
    colmap._refine_distortion(rec, 2, None)
    refined = dict(zip(cam.params_info.split(", "), rec.cameras[cam.camera_id].params))
    assert any(refined[k] != 0.0 for k in ("k1", "k2")), refined
    # The views were rendered with no distortion: what the refinement finds is small.
    assert np.abs([refined[k] for k in ("k1", "k2", "p1", "p2")]).max() < 0.1, refined
    assert rec.compute_mean_reprojection_error() <= before


def test_global_mapper_recovers_the_cameras(images, capture, tmp_path):
    """GLOMAP (sfm_mapper global) maps the same views into one model whose camera centres are
    the true ones up to a similarity."""
    d, names = images
    opts = colmap.SfmOptions(
        camera_model="SIMPLE_RADIAL", matcher="exhaustive", threads=2, mapper="global"
    )
    r = colmap.run_sfm(d, names, tmp_path, opts)
    assert len(r.registered) >= 0.9 * N, (len(r.registered), r.n_models, r.seconds)
    assert len(r.points_xyz) > 100
    est = np.stack([reg.world_from_cam[:, 3] for reg in r.registered])
    true = np.stack([capture.c2w[names.index(reg.name)][:3, 3] for reg in r.registered])
    s, rot, t = similarity(true, est)
    err = np.linalg.norm((s * (rot @ true.T)).T + t - est, axis=1) / (
        s * np.linalg.norm(true, axis=1)
    )
    assert np.median(err) < 0.02 and err.max() < 0.1, err


def test_auto_mapper_goes_global_from_the_threshold():
    from worker.sfm.stage import choose_mapper

    assert choose_mapper("auto", 499, 500) == "incremental"
    assert choose_mapper("auto", 500, 500) == "global"
    assert choose_mapper("incremental", 5000, 500) == "incremental"
    assert choose_mapper("global", 10, 500) == "global"
