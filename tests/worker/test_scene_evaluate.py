"""worker/scene/evaluate.py: a grey render of colourful photos is called out (PSNR alone scored
one 18.4 dB), and a plan's strides score the same pixels of the render and the photo."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from experiments.synthetic_scene import make_scene
from service.intake.nerf import validate_upload
from worker.budget import EvalPlan, TimeBudget
from worker.scene.dataset import Dataset, read_meta
from worker.scene.evaluate import colour_warning, evaluate, ground_truth


@pytest.fixture(scope="module")
def test_split(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("evaluate")
    z = make_scene(tmp / "scene.zip", size=64, n_train=3, n_test=3)
    job = tmp / "job"
    job.mkdir()
    validate_upload(z, "scene.zip", {}, job, None)
    meta = read_meta(job / "dataset")
    return Dataset(job / "dataset", "test", meta)


def test_grey_renders_are_called_out(test_split):
    white = torch.ones(3)

    def photo(i, stride=1):
        return ground_truth(test_split, i, white)[::stride, ::stride], None

    def grey(i, stride=1):
        rgb, _ = photo(i, stride)
        return np.repeat(rgb.mean(-1, keepdims=True), 3, -1), None

    exact, _ = evaluate(photo, test_split, white)
    assert exact["test_colour_ratio"] == pytest.approx(1.0) and colour_warning(exact) is None
    flat, _ = evaluate(grey, test_split, white)
    assert flat["test_colour_ratio"] < 0.01
    assert "grey" in colour_warning(flat)
    # Strided: every view still scored, at the stride the plan gave, on matching pixels.
    budget = TimeBudget(10.0)
    budget.eval_s_per_pixel = 1e-3  # 4096-pixel views in 10 s: stride 2 is what fits
    plan = EvalPlan(budget, [f.w * f.h for f in test_split.frames])
    views = []
    m, _ = evaluate(photo, test_split, white, plan=plan, on_view=views.append)
    assert m["n_test"] == 3 and [v.stride for v in views] == plan.strides
    assert plan.strides[0] == 2 and views[0].rgb.shape == (32, 32, 3)
    assert m["test_psnr"] == pytest.approx(100.0)
