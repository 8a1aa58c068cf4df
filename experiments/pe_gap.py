"""Seed 001's finding on real photos: Fourier features vs no encoding, same MLP and budget.

    python -m experiments.pe_gap                 # 64x64, 2000 steps, six photos
    python -m experiments.pe_gap --size 32 --steps 300 --photos astronaut coffee

Uses the service's own training code (worker.jobs.image.fit) on photos scikit-image ships.
Exits non-zero when the mean gap is under --min-gap dB.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import torch
from PIL import Image

from worker.jobs.image import fit

PHOTOS = ["astronaut", "coffee", "chelsea", "rocket", "camera", "immunohistochemistry"]


def photo(name: str, size: int) -> np.ndarray:
    """A scikit-image photo, centre-cropped square, resized to size x size, float RGB in [0, 1]."""
    from skimage import data

    arr = getattr(data, name)()
    img = Image.fromarray(arr).convert("RGB")
    s = min(img.size)
    left, top = (img.width - s) // 2, (img.height - s) // 2
    img = img.crop((left, top, left + s, top + s)).resize((size, size), Image.Resampling.LANCZOS)
    return np.asarray(img, dtype=np.float32) / 255.0


def gap_table(photos: list[str], size: int, steps: int, seed: int = 0) -> list[dict]:
    rows = []
    for name in photos:
        target = photo(name, size)
        row = {"photo": name}
        for encoding in ("fourier", "none"):
            cfg = {
                "encoding": encoding,
                "steps": steps,
                "num_frequencies": 6,
                "hidden": 128,
                "layers": 4,
                "lr": 5e-4,
            }
            t0 = time.perf_counter()
            _, _, psnr = fit(target, cfg, seed=seed)
            row[encoding] = psnr
            row[f"{encoding}_s"] = time.perf_counter() - t0
        row["gap"] = row["fourier"] - row["none"]
        rows.append(row)
    return rows


def format_table(rows: list[dict], size: int, steps: int) -> str:
    lines = [
        f"PSNR (dB) after {steps} full-batch AdamW steps at {size}x{size}, hidden 128 x 4, L=6",
        f"{'photo':<22}{'fourier':>9}{'none':>9}{'gap':>8}{'time s':>9}",
        "-" * 57,
    ]
    for r in rows:
        lines.append(
            f"{r['photo']:<22}{r['fourier']:>9.2f}{r['none']:>9.2f}{r['gap']:>+8.2f}"
            f"{r['fourier_s'] + r['none_s']:>9.1f}"
        )
    gaps = [r["gap"] for r in rows]
    lines.append("-" * 57)
    lines.append(
        f"{'mean':<22}{np.mean([r['fourier'] for r in rows]):>9.2f}{np.mean([r['none'] for r in rows]):>9.2f}"
        f"{np.mean(gaps):>+8.2f}   (min gap {min(gaps):+.2f})"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--photos", nargs="+", default=PHOTOS)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--min-gap", type=float, default=8.0, help="required mean gap in dB")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = gap_table(args.photos, args.size, args.steps)
    print(format_table(rows, args.size, args.steps))
    mean_gap = float(np.mean([r["gap"] for r in rows]))
    ok = mean_gap >= args.min_gap
    print(
        f"{'PASS' if ok else 'FAIL'}: mean gap {mean_gap:+.2f} dB (required {args.min_gap:+.1f} dB)"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
