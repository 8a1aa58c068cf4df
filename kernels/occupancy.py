"""Occupancy grid with cascades, EMA density updates and a max-pooled bitfield (instant-ngp)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from . import _ext
from .hash_grid import _check_backend

MIN_OPTICAL_THICKNESS = 0.01  # NERF_MIN_OPTICAL_THICKNESS: cells below min(this, mean) are empty


def _expand_bits(v: torch.Tensor) -> torch.Tensor:
    v = (v * 0x00010001) & 0xFF0000FF
    v = (v * 0x00000101) & 0x0F00F00F
    v = (v * 0x00000011) & 0xC30C30C3
    v = (v * 0x00000005) & 0x49249249
    return v


def morton3d(x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """30-bit morton code of integer cell coordinates (< 1024), int64."""
    return _expand_bits(x.long()) | (_expand_bits(y.long()) << 1) | (_expand_bits(z.long()) << 2)


def morton3d_invert(code: torch.Tensor) -> torch.Tensor:
    x = code.long() & 0x49249249
    x = (x | (x >> 2)) & 0xC30C30C3
    x = (x | (x >> 4)) & 0x0F00F00F
    x = (x | (x >> 8)) & 0xFF0000FF
    x = (x | (x >> 16)) & 0x0000FFFF
    return x


def bitfield_layout(res: int) -> list[int]:
    """Byte offsets of mips 0..log2(res) inside one cascade, plus the total at the end."""
    offsets, m = [0], 0
    while res >> m >= 1:
        offsets.append(offsets[-1] + max(1, (res >> m) ** 3 // 8))
        m += 1
    return offsets


_BIT_WEIGHTS = 1 << torch.arange(8)


def _pack(bits_bool: torch.Tensor) -> torch.Tensor:
    n = bits_bool.numel()
    padded = torch.zeros(max(8, -(-n // 8) * 8), dtype=torch.bool, device=bits_bool.device)
    padded[:n] = bits_bool
    return (padded.view(-1, 8).long() * _BIT_WEIGHTS.to(padded.device)).sum(1).to(torch.uint8)


def _unpack(bytes_: torch.Tensor, n: int) -> torch.Tensor:
    return (
        ((bytes_.long()[:, None] >> torch.arange(8, device=bytes_.device)) & 1)
        .bool()
        .reshape(-1)[:n]
    )


def bitfield_reference(density: torch.Tensor, thresh: float) -> torch.Tensor:
    """(C, R^3) morton-ordered densities -> (C, bytes) bitfield with mips, pure torch."""
    c_n, cells = density.shape
    res = round(cells ** (1 / 3))
    layout = bitfield_layout(res)
    out = torch.zeros(c_n, layout[-1], dtype=torch.uint8, device=density.device)
    coarse = torch.arange(cells // 8, device=density.device)
    moved = morton3d(
        morton3d_invert(coarse) + res // 4,
        morton3d_invert(coarse >> 1) + res // 4,
        morton3d_invert(coarse >> 2) + res // 4,
    )
    prev_level0 = None
    for c in range(c_n):
        occ = density[c] > thresh
        if prev_level0 is not None:
            occ = occ.clone()
            occ[moved[prev_level0 != 0]] = True
        level0 = _pack(occ)
        out[c, : layout[1]] = level0
        prev_level0 = level0
        cur = level0
        for m in range(1, len(layout) - 1):
            n = (res >> m) ** 3
            cur = _pack(cur[:n] != 0)
            out[c, layout[m] : layout[m + 1]] = cur
    return out


class OccupancyGrid(nn.Module):
    """Cascaded occupancy grid over `aabb` (cascade 0); cascade c covers aabb scaled 2^c about its centre.

    Densities live in `density` (C, R^3, morton order) as optical thickness sigma * step; the
    bitfield `bits` (C, bytes) holds, per cascade, mip 0 and its max-pooled mips. A fresh grid
    is all occupied, so marching before the first update samples everywhere.
    """

    def __init__(
        self,
        aabb,
        resolution: int = 128,
        n_cascades: int = 1,
        *,
        step_size: float | None = None,
        backend: str = "ext",
    ):
        super().__init__()
        _check_backend(backend)
        aabb = torch.as_tensor(aabb, dtype=torch.float32).reshape(-1)
        if aabb.numel() != 6 or not (aabb[3:] > aabb[:3]).all():
            raise ValueError("aabb must be [xmin, ymin, zmin, xmax, ymax, zmax] with max > min")
        if resolution < 2 or resolution > 1024 or resolution & (resolution - 1):
            raise ValueError(f"resolution must be a power of two in 2..1024, got {resolution}")
        if not 1 <= n_cascades <= 16:
            raise ValueError(f"n_cascades must be in 1..16, got {n_cascades}")
        self.resolution = resolution
        self.n_cascades = n_cascades
        self.backend = backend
        self.center = ((aabb[:3] + aabb[3:]) / 2).tolist()
        self.half = ((aabb[3:] - aabb[:3]) / 2).tolist()
        side = float((aabb[3:] - aabb[:3]).max())
        # instant-ngp's MIN_CONE_STEPSIZE: sqrt(3)/1024 of the cascade-0 box side.
        self.step_size = step_size if step_size is not None else math.sqrt(3) * side / 1024
        self.n_cells = resolution**3
        layout = bitfield_layout(resolution)
        self.register_buffer("aabb", aabb)
        self.register_buffer("density", torch.zeros(n_cascades, self.n_cells))
        self.register_buffer("bits", torch.full((n_cascades, layout[-1]), 255, dtype=torch.uint8))
        self.register_buffer("n_updates", torch.zeros((), dtype=torch.int64))

    @property
    def outer_aabb(self) -> list[float]:
        s = 2.0 ** (self.n_cascades - 1)
        return [c - s * h for c, h in zip(self.center, self.half)] + [
            c + s * h for c, h in zip(self.center, self.half)
        ]

    def _cell_coords(self) -> torch.Tensor:
        code = torch.arange(self.n_cells, device=self.density.device)
        return torch.stack(
            [morton3d_invert(code), morton3d_invert(code >> 1), morton3d_invert(code >> 2)], 1
        )

    def cell_points(self, cascade: int, cells: torch.Tensor, jitter: bool = True) -> torch.Tensor:
        """World positions inside the given morton cells of a cascade (jittered within the cell)."""
        ijk = torch.stack(
            [morton3d_invert(cells), morton3d_invert(cells >> 1), morton3d_invert(cells >> 2)], 1
        )
        u = ijk.float() + (torch.rand(ijk.shape, device=ijk.device) if jitter else 0.5)
        center = torch.tensor(self.center, device=ijk.device)
        half = torch.tensor(self.half, device=ijk.device) * 2.0**cascade
        return center - half + u / self.resolution * 2 * half

    @torch.no_grad()
    def update(
        self,
        density_fn: Callable[[torch.Tensor], torch.Tensor],
        *,
        warmup: bool = False,
        decay: float = 0.95,
        threshold: float = MIN_OPTICAL_THICKNESS,
        chunk: int = 2**18,
    ) -> None:
        """One EMA update: density = max(density * decay, new samples) over every cell, then binarize.

        Warmup samples every cell; afterwards a quarter of the cells at random plus a quarter drawn
        from the currently occupied ones (instant-ngp), each point jittered inside its cell.

        Args:
            density_fn: (N, 3) world points -> sigma (N,) or (N, 1); called in chunks.
            warmup: sample every cell.
            decay: EMA factor applied to every cell first.
            threshold: optical thickness above which a cell is occupied (capped by the mean).
            chunk: points per density_fn call.
        """
        dev = self.density.device
        fresh = torch.zeros_like(self.density)
        for c in range(self.n_cascades):
            if warmup:
                cells = torch.arange(self.n_cells, device=dev)
            else:
                k = self.n_cells // 4
                uniform = torch.randint(0, self.n_cells, (k,), device=dev)
                # "Occupied" as the current bitfield says (density > min(threshold, mean)).
                layout = bitfield_layout(self.resolution)
                occ = _unpack(self.bits[c, : layout[1]], self.n_cells).nonzero().squeeze(1)
                picked = (
                    occ[torch.randint(0, occ.numel(), (k,), device=dev)] if occ.numel() else occ
                )
                cells = torch.cat([uniform, picked])
            step = self.step_size * 2.0**c
            for s in range(0, cells.numel(), chunk):
                idx = cells[s : s + chunk]
                sigma = density_fn(self.cell_points(c, idx)).reshape(-1).float()
                fresh[c].scatter_reduce_(0, idx, sigma.clamp_min(0) * step, reduce="amax")
        self.density.copy_(torch.maximum(self.density * decay, fresh))
        self.n_updates += 1
        self.binarize(threshold)

    def update_every_n_steps(
        self,
        step: int,
        density_fn,
        *,
        n: int = 16,
        warmup_steps: int = 256,
        decay: float = 0.95,
        threshold: float = MIN_OPTICAL_THICKNESS,
    ) -> bool:
        """Call every training step; updates when step % n == 0. Returns whether it updated."""
        if step % n:
            return False
        self.update(density_fn, warmup=step < warmup_steps, decay=decay, threshold=threshold)
        return True

    @torch.no_grad()
    def binarize(
        self, threshold: float = MIN_OPTICAL_THICKNESS, backend: str | None = None
    ) -> None:
        """Recompute the bitfield `bits` (C, bytes): occupied where density > min(threshold, mean).

        Args:
            threshold: optical-thickness threshold (instant-ngp's 0.01).
            backend: "ext" or "reference"; default the grid's.
        """
        backend = backend or self.backend
        thresh = min(threshold, float(self.density.clamp_min(0).mean()))
        if backend == "reference":
            self.bits.copy_(bitfield_reference(self.density, thresh))
        else:
            self.bits.copy_(
                _ext.for_tensor(self.density).occ_bitfield(self.density.contiguous(), thresh)
            )

    def occupancy(self, cascade: int = 0, mip: int = 0) -> torch.Tensor:
        """Occupancy of one cascade and mip, to inspect or save.

        Args:
            cascade: 0 (the aabb) .. n_cascades - 1.
            mip: 0 (full resolution) .. log2(resolution).

        Returns:
            bool (r, r, r) indexed [x, y, z], r = resolution >> mip.
        """
        layout = bitfield_layout(self.resolution)
        r = self.resolution >> mip
        flat = _unpack(self.bits[cascade, layout[mip] : layout[mip + 1]], r**3)
        code = torch.arange(r**3, device=flat.device)
        out = torch.zeros(r, r, r, dtype=torch.bool, device=flat.device)
        out[morton3d_invert(code), morton3d_invert(code >> 1), morton3d_invert(code >> 2)] = flat
        return out

    def is_occupied(self, points: torch.Tensor, backend: str | None = None) -> torch.Tensor:
        """Whether world points lie in an occupied cell of the finest cascade containing them.

        Args:
            points: (..., 3) world points (cast to float32).
            backend: "ext" or "reference"; default the grid's.

        Returns:
            (N,) bool, N = points.numel() // 3; False outside every cascade.
        """
        backend = backend or self.backend
        _check_backend(backend)
        pts = points.reshape(-1, 3).float().contiguous()
        if backend == "reference":
            return occupied_reference(self, pts)
        return _ext.for_tensor(pts).occ_query(
            pts, self.bits, self.resolution, self.center, self.half
        )


def locate_reference(grid: OccupancyGrid, p: torch.Tensor):
    """(inside, cascade, ijk) per point, mirroring kn::locate_cell operation by operation."""
    center = torch.tensor(grid.center, device=p.device)
    half = torch.tensor(grid.half, device=p.device)
    r = ((p - center).abs() / half).max(dim=1).values
    _, e = torch.frexp(r)
    c = torch.where(r >= 1, e.long(), torch.zeros_like(e, dtype=torch.long))
    n_c = grid.n_cascades
    inside = ~((c >= n_c) & (r > 2.0 ** (n_c - 1)))
    c = c.clamp(max=n_c - 1)
    ext = half[None, :] * torch.pow(2.0, c.float())[:, None]
    u = (p - center) / ext
    v = (u * 0.5 + 0.5) * float(grid.resolution)
    ijk = torch.floor(v).long().clamp(0, grid.resolution - 1)
    return inside, c, ijk


def occupied_at_reference(grid: OccupancyGrid, c, mip, ijk):
    layout = torch.tensor(bitfield_layout(grid.resolution), device=ijk.device)
    code = morton3d(ijk[:, 0] >> mip, ijk[:, 1] >> mip, ijk[:, 2] >> mip)
    byte = grid.bits.reshape(-1)[c * layout[-1] + layout[mip] + (code >> 3)].long()
    return ((byte >> (code & 7)) & 1).bool()


def occupied_reference(grid: OccupancyGrid, points: torch.Tensor) -> torch.Tensor:
    inside, c, ijk = locate_reference(grid, points)
    return inside & occupied_at_reference(grid, c, 0, ijk)
