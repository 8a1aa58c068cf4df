"""The image field itself: seed 001's encoder and MLP, and the Fourier-vs-none gap (short version)."""

from __future__ import annotations

import math

import pytest
import torch

from experiments.pe_gap import format_table, gap_table
from worker.jobs.image import CoordMLP, FourierFeatures, pixel_grid, training_size
from worker.scene.metrics import psnr_from_mse


def test_fourier_features_frequencies_and_layout():
    enc = FourierFeatures(input_dim=2, num_freqs=6)
    assert torch.allclose(enc.freqs, torch.tensor([1, 2, 4, 8, 16, 32.0]) * math.pi)
    assert list(enc.parameters()) == []  # fixed basis, nothing trainable
    x = torch.rand(5, 2) * 2 - 1
    out = enc(x)
    assert out.shape == (5, enc.out_dim) == (5, 2 + 2 * 6 * 2)
    assert torch.equal(out[:, :2], x)  # raw input kept
    feats = out[:, 2:].reshape(5, 2, 6, 2)  # (D, L, sin|cos)
    angle = x[:, 1] * 8 * math.pi  # dim y, k=3
    assert torch.allclose(feats[:, 1, 3, 0], torch.sin(angle), atol=1e-5)
    assert torch.allclose(feats[:, 1, 3, 1], torch.cos(angle), atol=1e-5)


def test_coord_mlp_shapes_and_range():
    pe = CoordMLP(hidden=32, n_layers=4, use_pe=True, num_freqs=6)
    raw = CoordMLP(hidden=32, n_layers=4, use_pe=False)
    linears = [m for m in pe.mlp if isinstance(m, torch.nn.Linear)]
    assert len(linears) == 4 and linears[0].in_features == 26 and linears[-1].out_features == 3
    assert [m for m in raw.mlp if isinstance(m, torch.nn.Linear)][0].in_features == 2
    with torch.no_grad():
        y = pe(torch.rand(100, 2) * 40 - 20)
    assert y.shape == (100, 3) and float(y.min()) >= 0 and float(y.max()) <= 1


def test_pixel_grid_is_pixel_centres():
    g = pixel_grid(4, 2)
    assert g.shape == (8, 2)
    assert torch.allclose(g[:4, 0], torch.tensor([-0.75, -0.25, 0.25, 0.75]))
    assert torch.allclose(g[::4, 1], torch.tensor([-0.5, 0.5]))
    assert training_size(600, 400, 64) == (64, 43)
    assert psnr_from_mse(0.01) == pytest.approx(20.0)


@pytest.mark.slow
def test_fourier_beats_no_encoding_on_real_photos():
    # Short version of `python -m experiments.pe_gap` (64x64, 2000 steps there).
    torch.set_num_threads(1)
    rows = gap_table(["astronaut", "coffee"], size=32, steps=300)
    print(format_table(rows, 32, 300))
    for r in rows:
        assert r["gap"] >= 8.0, format_table(rows, 32, 300)


def test_load_target_orientation_alpha_and_size(tmp_path):
    import numpy as np
    from PIL import Image

    from worker.jobs.image import load_target

    # Transparent left half over white; opaque red right half; 40x20 -> trained at 16x8.
    rgba = np.zeros((20, 40, 4), dtype=np.uint8)
    rgba[:, 20:] = (255, 0, 0, 255)
    Image.fromarray(rgba, "RGBA").save(tmp_path / "a.png")
    t = load_target(tmp_path / "a.png", 16)
    assert t.shape == (8, 16, 3)
    assert np.allclose(t[:, :6], 1.0, atol=0.02) and np.allclose(
        t[:, 10:], [1.0, 0.0, 0.0], atol=0.02
    )

    # EXIF orientation 6 (rotate 90° clockwise when shown): a 40x20 file is a 20x40 photo.
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(rgba[..., :3]).save(tmp_path / "r.jpg", exif=exif.tobytes())
    assert load_target(tmp_path / "r.jpg", 16).shape == (16, 8, 3)
