"""strategy=mcmc (worker/splat/mcmc.py): the relocation keeps what N copies of a Gaussian render
equal to the one they replace, the trainer relocates dead Gaussians and grows to cap_max, never
past it."""

from __future__ import annotations

import math

import numpy as np
import torch

from tests.worker.test_splat_trainer import blender, intake  # noqa: F401 (fixture)
from worker.scene.dataset import Dataset, read_meta
from worker.splat import mcmc
from worker.splat.trainer import SplatTrainer


def test_relocation_keeps_the_rendered_profile():
    o = torch.tensor([0.3, 0.9, 0.05, 0.6])
    s = torch.tensor([[1.0, 2.0, 0.5]] * 4)
    copies = torch.tensor([1, 2, 5, 12])
    new_o, new_s = mcmc.relocated(o, s, copies, mcmc.binomial_table())
    torch.testing.assert_close(new_o[0], o[0])
    torch.testing.assert_close(new_s[0], s[0])
    x = np.linspace(-12, 12, 20001)
    for i, n in enumerate(copies.tolist()):
        # N copies composited at one point give the old opacity at the centre...
        assert abs((1 - (1 - float(new_o[i])) ** n) - float(o[i])) < 1e-5
        # ...and, along one axis, the same integral of alpha as the Gaussian they replace
        sig = float(new_s[i, 0])
        alpha = 1 - (1 - float(new_o[i]) * np.exp(-0.5 * (x / sig) ** 2)) ** n
        want = float(o[i]) * math.sqrt(2 * math.pi) * float(s[i, 0])
        assert abs(np.trapezoid(alpha, x) / want - 1) < 1e-3, (n, np.trapezoid(alpha, x), want)
        assert torch.allclose(new_s[i] / s[i], new_s[i, 0] / s[i, 0])  # all axes alike


def test_mcmc_training_relocates_and_stops_at_the_cap(tmp_path, blender):  # noqa: F811
    cfg, _, job = intake(
        tmp_path,
        blender,
        {
            "strategy": "mcmc",
            "n_init_points": 300,
            "cap_max": 330,
            "steps": 40,
            "densify_from": 0,
            "densify_every": 2,
            "densify_until": 0.9,
        },
    )
    meta = read_meta(job / "dataset")
    t = SplatTrainer(cfg, meta, torch.device("cpu"), Dataset(job / "dataset", "train", meta))
    assert t.n == 300
    with torch.no_grad():
        t.params["opacities"][:20] = -12.0  # dead: relocated at the next refinement
    for _ in range(2):
        t.train_step()
    assert t.counts["relocated"] >= 20 and t.n == 315
    assert (torch.sigmoid(t.params["opacities"][:20]) > cfg["prune_opacity"]).all()
    for _ in range(10):  # refinements at least MIN_REFINE_STEPS apart: the next at step 12
        assert np.isfinite(t.train_step()["loss"])
        assert t.n <= 330
    assert t.n == 330 and t.counts["densifications"] == 2
    for g in t.opt.param_groups:  # moments follow every edit
        st = t.opt.state[g["params"][0]]
        assert g["name"] == "sh_rest" or st["exp_avg"].shape == g["params"][0].shape
