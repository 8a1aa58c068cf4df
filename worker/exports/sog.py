"""SOG, PlayCanvas' splat format for the web (developer.playcanvas.com, "SOG format"), version 2,
as SuperSplat and splat-transform write it: a `meta.json` and lossless WebP textures, one texel per
Gaussian (in Morton order, row-major, the texture `ceil(sqrt(n) / 4) * 4` wide and a multiple of 4
high), zipped uncompressed into one `.sog` file.

    means_l.webp, means_u.webp  x, y, z each as 16 bits (low byte, high byte) of
                                (log1p-signed(v) - min) / (max - min); meta `means.mins/maxs`
    quats.webp                  the three smallest of the unit quaternion (w, x, y, z), largest
                                made positive, each as 255 * (c * sqrt 2 / 2 + 0.5); alpha = 252 +
                                the largest's index
    scales.webp                 per axis, an index into meta `scales.codebook` (256 log scales)
    sh0.webp                    per channel, an index into meta `sh0.codebook` (256 SH DC values);
                                alpha = sigmoid(opacity) * 255
    shN_labels.webp             (SH bands above 0) a 16-bit palette index (R low, G high)
    shN_centroids.webp          the palette: 64 entries a row, each `coefficients` texels wide,
                                RGB = indices into meta `shN.codebook` (256 values)

The codebooks are 1D k-means of the pooled values (each of the three axes or channels shares its
format's codebook); the SH palette is a k-means of each Gaussian's 3K SH coefficients with
splat-transform's palette size (64k entries at 64k Gaussians and over, fewer below). Coordinates
are those of the 3DGS PLY (the job's world frame), as SOG holds them; a job trained with the
antialiasing filter says so in meta `model: "antialiased"`."""

from __future__ import annotations

import io
import json
import math
import zipfile

import numpy as np
import torch

from worker.exports.splat_files import morton_order, nonempty_world_table

GENERATOR = "neural-field-service"
KMEANS_ITERATIONS = 6
KMEANS_CHUNK = 4096


def log_transform(v: np.ndarray) -> np.ndarray:
    return np.sign(v) * np.log1p(np.abs(v))


def quantize_1d(values: np.ndarray, k: int = 256, iterations: int = 20) -> tuple:
    """(codebook (k,) ascending, labels (values' shape, uint8)): Lloyd's k-means of all values
    pooled, started at their quantiles."""
    flat = np.asarray(values, np.float64).reshape(-1)
    if flat.size == 0:
        return np.zeros(k), np.zeros(values.shape, np.uint8)
    srt = np.sort(flat)
    csum = np.r_[0.0, np.cumsum(srt)]
    centres = np.unique(np.quantile(srt, (np.arange(k) + 0.5) / k))
    for _ in range(iterations):
        bounds = np.r_[0, np.searchsorted(srt, (centres[1:] + centres[:-1]) / 2), len(srt)]
        counts = np.diff(bounds)
        sums = csum[bounds[1:]] - csum[bounds[:-1]]
        # an empty bin keeps its centre
        new = np.where(counts > 0, sums / np.maximum(counts, 1), centres)
        new = np.unique(new)
        if len(new) == len(centres) and np.allclose(new, centres, rtol=0, atol=1e-12):
            break
        centres = new
    book = np.concatenate([centres, np.full(k - len(centres), centres[-1])])
    edges = (book[1:] + book[:-1]) / 2
    labels = np.searchsorted(edges, flat, side="right").astype(np.uint8)
    return book, labels.reshape(values.shape)


def palette_size(n: int) -> int:
    """splat-transform's SH palette size for n Gaussians: a power of two times 1024, at most 64k,
    never above n."""
    if n <= 0:
        return 0
    return max(1, min(n, int(min(64.0, 2.0 ** math.floor(math.log2(n / 1024))) * 1024)))


@torch.no_grad()
def kmeans(points: np.ndarray, k: int, iterations: int = KMEANS_ITERATIONS, seed: int = 0):
    """(centroids (k, D), labels (n,)): Lloyd's k-means started at k distinct points drawn with a
    fixed seed; the assignments are chunked matrix products (torch), so memory stays bounded."""
    x = torch.from_numpy(np.ascontiguousarray(points, np.float32))
    n = x.shape[0]
    if k >= n:
        return points.astype(np.float64), np.arange(n)
    g = torch.Generator().manual_seed(seed)
    c = x[torch.randperm(n, generator=g)[:k]].clone()
    labels = torch.zeros(n, dtype=torch.long)
    for it in range(iterations + 1):
        cn = (c * c).sum(1)
        for s in range(0, n, KMEANS_CHUNK):
            d = cn[None, :] - 2 * x[s : s + KMEANS_CHUNK] @ c.T
            labels[s : s + KMEANS_CHUNK] = d.argmin(1)
        if it == iterations:
            break
        sums = torch.zeros_like(c).index_add_(0, labels, x)
        counts = torch.bincount(labels, minlength=k).to(x.dtype)
        # an emptied centroid keeps its place
        c = torch.where(counts[:, None] > 0, sums / counts.clamp_min(1)[:, None], c)
    return c.double().numpy(), labels.numpy()


def _texture(width: int, height: int) -> np.ndarray:
    return np.zeros((height * width, 4), np.uint8)


def _webp(texels: np.ndarray, width: int, height: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    # exact: keep the RGB of texels whose alpha (an opacity) is 0
    Image.fromarray(texels.reshape(height, width, 4), "RGBA").save(
        buf, "WEBP", lossless=True, quality=100, method=4, exact=True
    )
    return buf.getvalue()


def pack_quats(wxyz: np.ndarray) -> np.ndarray:
    """(n, 4) uint8 texels of unit quaternions (w, x, y, z) as SOG's quats.webp holds them."""
    q = wxyz / np.clip(np.linalg.norm(wxyz, axis=1, keepdims=True), 1e-12, None)
    largest = np.abs(q).argmax(1)
    sign = np.where(q[np.arange(len(q)), largest] < 0, -1.0, 1.0)
    q = q * sign[:, None] * math.sqrt(2.0)
    out = np.zeros((len(q), 4), np.uint8)
    for m in range(4):
        rows = largest == m
        others = [i for i in range(4) if i != m]
        vals = np.clip(np.round(255 * (q[rows][:, others] * 0.5 + 0.5)), 0, 255)
        out[rows, :3] = vals.astype(np.uint8)
        out[rows, 3] = 252 + m
    return out


def sog_bytes(
    params: dict[str, torch.Tensor],
    normalization: dict | None,
    antialiased: bool = False,
    min_opacity: float = 0.0,
) -> tuple[bytes, int]:
    """(.sog bytes, number of Gaussians written)."""
    g = nonempty_world_table(params, normalization, min_opacity)
    n = len(g["means"])
    order = morton_order(g["means"])
    g = {k: (v[order] if isinstance(v, np.ndarray) else v) for k, v in g.items()}
    width = math.ceil(math.sqrt(n) / 4) * 4
    height = math.ceil(n / width / 4) * 4
    files: dict[str, bytes] = {}

    # means: log-signed positions, 16 bits a component, over each axis' range
    lt = log_transform(g["means"])
    mins, maxs = lt.min(0), lt.max(0)
    span = np.where(maxs - mins > 0, maxs - mins, 1.0)
    u16 = np.clip(np.round(65535 * (lt - mins) / span), 0, 65535).astype(np.uint32)
    lo, hi = _texture(width, height), _texture(width, height)
    lo[:n, :3], hi[:n, :3] = u16 & 0xFF, u16 >> 8
    lo[:, 3] = hi[:, 3] = 255
    files["means_l.webp"], files["means_u.webp"] = (
        _webp(lo, width, height),
        _webp(hi, width, height),
    )

    quats = _texture(width, height)
    quats[:n] = pack_quats(g["quats"])
    files["quats.webp"] = _webp(quats, width, height)

    scale_book, scale_labels = quantize_1d(g["log_scales"])
    scales = _texture(width, height)
    scales[:n, :3], scales[:, 3] = scale_labels, 255
    files["scales.webp"] = _webp(scales, width, height)

    dc_book, dc_labels = quantize_1d(g["sh_dc"])
    sh0 = _texture(width, height)
    sh0[:n, :3] = dc_labels
    sh0[:n, 3] = np.clip(np.round(g["opacity"] * 255), 0, 255).astype(np.uint8)
    files["sh0.webp"] = _webp(sh0, width, height)

    meta = {
        "version": 2,
        "asset": {"generator": GENERATOR},
        "count": n,
        **({"model": "antialiased"} if antialiased else {}),
        "means": {
            "mins": mins.tolist(),
            "maxs": maxs.tolist(),
            "files": ["means_l.webp", "means_u.webp"],
        },
        "scales": {"codebook": scale_book.tolist(), "files": ["scales.webp"]},
        "quats": {"files": ["quats.webp"]},
        "sh0": {"codebook": dc_book.tolist(), "files": ["sh0.webp"]},
    }
    if g["degree"] > 0:
        rest = g["sh_rest"]  # (n, K, 3)
        k = rest.shape[1]
        # channel-major (all of R's coefficients, then G's, then B's), as splat-transform's
        flat = rest.transpose(0, 2, 1).reshape(n, 3 * k)
        size = palette_size(n)
        centroids, labels = kmeans(flat, size)
        size = len(centroids)
        book, idx = quantize_1d(centroids)  # (size, 3k) uint8
        rows = math.ceil(size / 64)
        cen = np.zeros((rows * 64 * k, 4), np.uint8)
        cen[:, 3] = 255
        for c in range(3):
            cen[: size * k, c] = idx[:, c * k : (c + 1) * k].reshape(-1)
        files["shN_centroids.webp"] = _webp(cen, 64 * k, rows)
        lab = _texture(width, height)
        lab[:n, 0], lab[:n, 1], lab[:, 3] = labels & 0xFF, labels >> 8, 255
        files["shN_labels.webp"] = _webp(lab, width, height)
        meta["shN"] = {
            "count": size,
            "bands": g["degree"],
            "codebook": book.tolist(),
            "files": ["shN_centroids.webp", "shN_labels.webp"],
        }
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for name, data in files.items():
            zf.writestr(zipfile.ZipInfo(name, (1980, 1, 1, 0, 0, 0)), data)
        zf.writestr(zipfile.ZipInfo("meta.json", (1980, 1, 1, 0, 0, 0)), json.dumps(meta))
    return buf.getvalue(), n
