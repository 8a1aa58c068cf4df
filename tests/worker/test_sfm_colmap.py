"""pycolmap directly on experiments.sfm_capture's 200 px views (true cameras: no distortion):
an OPENCV camera, which is free to drift into distortion the views do not have, still maps
every view into one model, and the mapping with distortion held fixed then refined finds the
lens close to its true zero."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from experiments.sfm_capture import make_capture
from worker.sfm import colmap

N, SIZE = 24, 200


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    d = tmp_path_factory.mktemp("views")
    names = []
    for i, im in enumerate(make_capture(N, SIZE, n_test=1).rgb):
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
