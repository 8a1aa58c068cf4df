"""Export in the PLY layout of the 3DGS reference implementation, which common viewers read
(SuperSplat, antimatter15/splat, the SIBR viewer): x y z nx ny nz f_dc_0..2 f_rest_0..(3K-1)
opacity scale_0..2 rot_0..3, binary little-endian float32; f_rest channel-major (all of R's
coefficients, then G's, then B's); opacity as a logit, scales as logs, rot = (w, x, y, z).
A model trained with the antialiasing filter says so in a header comment (`comment antialiased
1`), since PLY has no field for it; readers that do not know it ignore comments.
"""

from __future__ import annotations

import numpy as np
import torch


def ply_bytes(
    p: dict[str, torch.Tensor], normalization: dict | None = None, antialiased: bool = False
) -> bytes:
    """Gaussians -> PLY bytes. With `normalization`, positions and sizes go back to world units."""
    means = p["means"].detach().cpu().double()
    log_scales = p["scales"].detach().cpu().double()
    if normalization is not None:
        s = float(normalization["scale"])
        means = means / s + torch.tensor(normalization["offset"], dtype=torch.float64)
        log_scales = log_scales - np.log(s)
    n = means.shape[0]
    rest = p["sh_rest"].detach().cpu().double()  # (N, K, 3)
    k = rest.shape[1]
    cols = [
        means,
        torch.zeros(n, 3, dtype=torch.float64),
        p["sh_dc"].detach().cpu().double(),
        rest.transpose(1, 2).reshape(n, 3 * k),
        p["opacities"].detach().cpu().double()[:, None],
        log_scales,
        p["quats"].detach().cpu().double(),
    ]
    data = torch.cat(cols, 1).numpy().astype("<f4")
    names = (
        ["x", "y", "z", "nx", "ny", "nz"]
        + [f"f_dc_{i}" for i in range(3)]
        + [f"f_rest_{i}" for i in range(3 * k)]
        + ["opacity"]
        + [f"scale_{i}" for i in range(3)]
        + [f"rot_{i}" for i in range(4)]
    )
    assert data.shape[1] == len(names)
    header = ["ply", "format binary_little_endian 1.0"]
    header += ["comment antialiased 1"] if antialiased else []
    header += [f"element vertex {n}"]
    header += [f"property float {name}" for name in names] + ["end_header"]
    return ("\n".join(header) + "\n").encode("ascii") + data.tobytes()


def read_ply(data: bytes) -> dict[str, np.ndarray]:
    """Column name -> values of a binary float PLY as written above (for tests and tools)."""
    end = data.index(b"end_header\n") + len(b"end_header\n")
    lines = data[:end].decode("ascii").splitlines()
    if lines[0] != "ply" or lines[1] != "format binary_little_endian 1.0":
        raise ValueError("not a binary little-endian PLY")
    n = int(next(ln.split()[2] for ln in lines if ln.startswith("element vertex")))
    names = [ln.split()[2] for ln in lines if ln.startswith("property float")]
    arr = np.frombuffer(data[end:], dtype="<f4").reshape(n, len(names))
    return {name: arr[:, i] for i, name in enumerate(names)}


def ply_antialiased(data: bytes) -> bool:
    """Whether a PLY written by ply_bytes carries the antialiasing comment."""
    head = data[: data.index(b"end_header\n")].decode("ascii")
    return "comment antialiased 1" in head.splitlines()
