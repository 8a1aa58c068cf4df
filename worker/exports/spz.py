"""`.spz`, Niantic's open compressed splat format (github.com/nianticlabs/spz, load-spz.cc),
version 4 (its ZSTD container, the default: what SuperSplat writes and the PlayCanvas engine
reads) or version 3 (one gzip stream, for older readers). The sections are the same in both:

    positions  3 x 24-bit signed fixed point per Gaussian (value * 2^fractional_bits)
    alphas     u8 = sigmoid(opacity) * 255
    colours    u8 = SH DC * 0.15 * 255 + 127.5 (per channel)
    scales     u8 = (log scale + 10) * 16
    rotations  u32 "smallest three": the index of the largest |component| of (x, y, z, w) in the
               top 2 bits, then the other three (sign bit + 9-bit magnitude of c * sqrt 2), the
               first in the highest bits; the largest is recovered from the unit norm
    SH         u8 per coefficient and channel (coefficient-major, RGB inner) = c * 128 + 128,
               rounded to 5 bits for band 1 and 4 bits above (as Niantic's packer)

Version 3: a 16-byte header (little-endian: magic 0x5053474e "NGSP", version u32 = 3, points
u32, SH degree u8, fractional bits u8, flags u8 (0x1: trained with the antialiasing filter),
reserved u8 = 0), then the sections in that order, the whole stream gzip'd.

Version 4: a 32-byte header, not compressed (magic, version u32 = 4, points u32, SH degree u8,
fractional bits u8, flags u8, number of streams u8 (5, or 6 with SH), byte offset of the table of
contents u32 = 32 (no header extensions), 12 reserved bytes = 0), the table of contents (per
stream: compressed size u64, uncompressed size u64), then each section as its own ZSTD frame
(level 12, as Niantic's writer), in section order.

SPZ holds scenes in RUB axes (OpenGL/three.js); a 3DGS PLY is read as
RDF, so the Gaussians are converted as Niantic's tools convert a PLY (y and z negated; rotations
and SH bands to match): a viewer shows the .spz as it shows point_cloud.ply.
"""

from __future__ import annotations

import gzip
import math
import struct

import numpy as np
import torch
import zstandard

from worker.exports.splat_files import world_gaussians

MAGIC = 0x5053474E
VERSION = 4
VERSIONS = (3, 4)
HEADER_V4_BYTES = 32
ZSTD_LEVEL = 12  # Niantic's writer's level
FLAG_ANTIALIASED = 0x1
COLOR_SCALE = 0.15
# Sign of each SH coefficient (band order 1..3, as the model stores them) under (x, y, z) ->
# (x, -y, -z): the basis functions' parity in y and z.
SH_FLIP_RDF_RUB = np.array(
    [-1, -1, 1] + [-1, 1, 1, -1, 1] + [-1, 1, -1, -1, 1, -1, 1], dtype=np.float64
)


def fractional_bits(max_abs: float) -> int:
    """The finest fixed point (at most Niantic's 12 bits) whose 24-bit range holds max_abs."""
    bits = 12
    while bits > 1 and max_abs * (1 << bits) >= (1 << 23) - 1:
        bits -= 1
    return bits


def _quantize_sh(x: np.ndarray, bits: int) -> np.ndarray:
    bucket = 1 << (8 - bits)
    q = np.round(x * 128.0) + 128.0
    q = np.floor((q + bucket / 2) / bucket) * bucket
    return np.clip(q, 0, 255).astype(np.uint8)


def _smallest_three(q_xyzw: np.ndarray) -> np.ndarray:
    q = q_xyzw / np.clip(np.linalg.norm(q_xyzw, axis=1, keepdims=True), 1e-12, None)
    largest = np.abs(q).argmax(1)
    q = np.where(q[np.arange(len(q)), largest][:, None] < 0, -q, q)
    packed = np.zeros(len(q), np.uint32)
    for axis in range(4):
        skip = largest == axis
        v = q[:, axis] * math.sqrt(2.0)
        mag = np.clip(np.round(np.abs(v) * 511), 0, 511).astype(np.uint32)
        bits = (mag | ((v < 0).astype(np.uint32) << 9)).astype(np.uint32)
        packed = np.where(skip, packed, (packed << 10) | bits)
    return packed | (largest.astype(np.uint32) << 30)


def spz_bytes(
    params: dict[str, torch.Tensor],
    normalization: dict | None,
    antialiased: bool = False,
    min_opacity: float = 0.0,
    version: int = VERSION,
) -> tuple[bytes, int]:
    """(.spz bytes of `version` 4 or 3, number of Gaussians written)."""
    if version not in VERSIONS:
        raise ValueError(f"spz version {version} is not written (only {VERSIONS})")
    g = world_gaussians(params, normalization)
    keep = np.flatnonzero(g["opacity"] >= min_opacity)
    n = len(keep)
    flip = np.array([1.0, -1.0, -1.0])
    means = g["means"][keep] * flip
    # q -> q_x(180) q q_x(180)^-1: (w, x, y, z) -> (w, x, -y, -z)
    wxyz = g["quats"][keep] * np.array([1.0, 1.0, -1.0, -1.0])
    xyzw = wxyz[:, [1, 2, 3, 0]]
    rest = params["sh_rest"].detach().cpu().double().numpy()[keep]  # (n, K, 3)
    k = rest.shape[1]
    degree = {0: 0, 3: 1, 8: 2, 15: 3}[k]
    rest = rest * SH_FLIP_RDF_RUB[:k, None]

    bits = fractional_bits(float(np.abs(means).max(initial=0.0)))
    fixed = np.round(means * (1 << bits)).astype(np.int64) & 0xFFFFFF
    pos = np.stack([(fixed >> s) & 0xFF for s in (0, 8, 16)], -1).astype(np.uint8)  # (n, 3, 3)
    alphas = np.clip(np.round(g["opacity"][keep] * 255), 0, 255).astype(np.uint8)
    dc = params["sh_dc"].detach().cpu().double().numpy()[keep]
    colours = np.clip(np.round(dc * COLOR_SCALE * 255 + 127.5), 0, 255).astype(np.uint8)
    scales = np.clip(np.round((g["log_scales"][keep] + 10) * 16), 0, 255).astype(np.uint8)
    rots = _smallest_three(xyzw).astype("<u4")
    sh = np.concatenate([_quantize_sh(rest[:, :3], 5), _quantize_sh(rest[:, 3:], 4)], 1).reshape(
        n, -1
    )
    flags = FLAG_ANTIALIASED if antialiased else 0
    sections = [a.tobytes() for a in (pos, alphas, colours, scales, rots, sh.astype(np.uint8))]
    if version == 3:
        header = struct.pack("<IIIBBBB", MAGIC, 3, n, degree, bits, flags, 0)
        # level 6 (zlib's default): 3 % larger than 9 on trained models, 14x faster to write
        return gzip.compress(header + b"".join(sections), compresslevel=6, mtime=0), n
    if degree == 0:
        sections = sections[:5]  # no SH stream when there are no SH bands
    zstd = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
    frames = [zstd.compress(sec) for sec in sections]
    header = struct.pack(
        "<IIIBBBBI12x", MAGIC, 4, n, degree, bits, flags, len(frames), HEADER_V4_BYTES
    )
    toc = b"".join(struct.pack("<QQ", len(f), len(sec)) for f, sec in zip(frames, sections))
    return header + toc + b"".join(frames), n
