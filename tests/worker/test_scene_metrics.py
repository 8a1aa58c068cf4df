"""worker/scene/metrics.py: PSNR against its definition, SSIM bounds, and LPIPS only from a
TorchScript file that is present (never fetched), with a reason when it is absent."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from worker.scene.metrics import lpips_metric, psnr, psnr_from_mse, ssim

RNG = np.random.default_rng(0)


def test_psnr_and_ssim():
    a = RNG.random((16, 12, 3))
    b = np.clip(a + RNG.normal(0, 0.05, a.shape), 0, 1)
    mse = float(np.mean((a - b) ** 2))
    assert psnr(a, b) == pytest.approx(10 * math.log10(1 / mse))
    assert psnr(a, a) == pytest.approx(100.0) and math.isfinite(psnr_from_mse(0.0))
    assert ssim(a, a) == pytest.approx(1.0) and 0 < ssim(a, b) < 1


class MeanAbs(torch.nn.Module):
    """Stands in for LPIPS's network: same signature, a distance that is 0 for equal images."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (x - y).abs().mean(dim=(1, 2, 3), keepdim=True)


def test_lpips_only_from_a_file_on_the_worker(tmp_path):
    metric, why = lpips_metric(None)
    assert metric is None and "LPIPS_MODEL" in why
    metric, why = lpips_metric(tmp_path / "missing.pt")
    assert metric is None and "not a file" in why
    (tmp_path / "junk.pt").write_bytes(b"not torchscript")
    metric, why = lpips_metric(tmp_path / "junk.pt")
    assert metric is None and "could not be loaded" in why
    path = tmp_path / "lpips.pt"
    torch.jit.script(MeanAbs()).save(str(path))
    metric, why = lpips_metric(path)
    assert why is None
    a = RNG.random((8, 8, 3))
    assert metric(a, a) == pytest.approx(0.0)
    # images in [0, 1] reach the network in [-1, 1], as LPIPS expects
    assert metric(a, np.zeros_like(a)) == pytest.approx(2 * a.mean(), rel=1e-5)
