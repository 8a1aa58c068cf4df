"""Occupancy grid with cascades, EMA density updates and a max-pooled bitfield (instant-ngp)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from . import _ext
from .hash_grid import _check_backend

MIN_OPTICAL_THICKNESS = 0.01  # NERF_MIN_OPTICAL_THICKNESS: cells below min(this, mean) are empty
# Density of a cell no training camera sees (instant-ngp's -1): every negative density means that.
UNSEEN = -1.0


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


def _pack(bits_bool: torch.Tensor) -> torch.Tensor:
    n = bits_bool.numel()
    padded = torch.zeros(max(8, -(-n // 8) * 8), dtype=torch.bool, device=bits_bool.device)
    padded[:n] = bits_bool
    weights = 1 << torch.arange(8, device=padded.device)  # made there: no copy to a GPU
    return (padded.view(-1, 8).long() * weights).sum(1).to(torch.uint8)


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
            # an index, not a mask, so no size waits for the data (distinct cells: no clash)
            occ = occ.index_put((moved,), occ[moved] | (prev_level0 != 0))
        level0 = _pack(occ)
        out[c, : layout[1]] = level0
        prev_level0 = level0
        cur = level0
        for m in range(1, len(layout) - 1):
            n = (res >> m) ** 3
            cur = _pack(cur[:n] != 0)
            out[c, layout[m] : layout[m + 1]] = cur
    return out


def frustum_planes(
    c2w: torch.Tensor,
    intrinsics: torch.Tensor,
    sizes: torch.Tensor,
    near: float | torch.Tensor = 0.0,
    margin: float = 0.0,
) -> torch.Tensor:
    """The five planes bounding each pinhole camera's view: four through the image's edges (grown
    by `margin`) and one at depth `near`.

    Args:
        c2w: (M, 3|4, 4) camera-to-world, OpenGL axes (x right, y up, looking down -z); an
            invertible rotation block (a non-rigid one is inverted, not assumed orthonormal).
        intrinsics: (M, 4) fx, fy, cx, cy in pixels, image y down.
        sizes: (M, 2) image width, height in pixels.
        near: depth in front of the camera where its view begins: one for all, or (M,).
        margin: fraction of the width (height) added to the left and right (top and bottom).

    Returns:
        (M, 5, 4) float64 planes (nx, ny, nz, d) with unit normals: a world point p is inside
        camera m's view when n . p + d <= 0 for all five, and n . p + d is its distance outside.

    Raises:
        ValueError: shapes do not match, or a focal length or image size is not positive.
    """
    m_n = c2w.shape[0]
    if (
        c2w.ndim != 3
        or tuple(c2w.shape[1:]) not in ((3, 4), (4, 4))
        or tuple(intrinsics.shape) != (m_n, 4)
        or tuple(sizes.shape) != (m_n, 2)
    ):
        raise ValueError(
            "expected c2w (M, 3|4, 4), intrinsics (M, 4) and sizes (M, 2); got "
            f"{tuple(c2w.shape)}, {tuple(intrinsics.shape)}, {tuple(sizes.shape)}"
        )
    c2w, intrinsics, sizes = c2w.double(), intrinsics.double(), sizes.double()
    fx, fy, cx, cy = intrinsics.unbind(1)
    w, h = sizes.unbind(1)
    if not ((fx > 0) & (fy > 0) & (w > 0) & (h > 0)).all():
        raise ValueError("focal lengths and image sizes must be positive")
    # Rows of the inverse rotation read a world offset q = p - eye in camera axes:
    # x = ax . q, y = ay . q, depth = -az . q.
    ax, ay, az = torch.linalg.inv(c2w[:, :3, :3]).unbind(1)
    eye = c2w[:, :3, 3]
    # Tangent bounds of the grown image: x / depth in [x0, x1], (image-down = -y) / depth in [y0, y1].
    x0, x1 = (-margin * w - cx) / fx, ((1 + margin) * w - cx) / fx
    y0, y1 = (-margin * h - cy) / fy, ((1 + margin) * h - cy) / fy
    normals = torch.stack(
        [
            ax + x1[:, None] * az,  # x - x1 * depth <= 0
            -ax - x0[:, None] * az,  # x0 * depth - x <= 0
            -ay + y1[:, None] * az,  # -y - y1 * depth <= 0
            ay - y0[:, None] * az,  # y0 * depth + y <= 0
            az,  # near - depth <= 0
        ],
        1,
    )
    offsets = -(normals * eye[:, None, :]).sum(-1)
    offsets[:, 4] += torch.as_tensor(near, dtype=offsets.dtype)
    length = normals.norm(dim=-1)
    return torch.cat([normals, offsets[..., None]], -1) / length[..., None]


class OccupancyGrid(nn.Module):
    """Cascaded occupancy grid over `aabb` (cascade 0); cascade c covers aabb scaled 2^c about its centre.

    Densities live in `density` (C, R^3, morton order) as optical thickness sigma * step; the
    bitfield `bits` (C, bytes) holds, per cascade, mip 0 and its max-pooled mips. A fresh grid
    is all occupied, so marching before the first update samples everywhere. `mark_unseen` gives
    the cells no training camera sees the density UNSEEN (negative): they stay empty, no update
    samples or raises them, and the threshold's mean leaves them out.
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
        chunk: int = 2**16,
    ) -> None:
        """One EMA update: density = max(density * decay, new samples) over the seen cells, then
        binarize.

        Warmup samples every cell; afterwards a quarter of the cells at random plus a quarter drawn
        from the currently occupied ones (instant-ngp), each point jittered inside its cell. Cells
        marked UNSEEN are neither drawn (the quarters are of the other cells) nor changed.

        Args:
            density_fn: (N, 3) world points -> sigma (N,) or (N, 1); called in chunks.
            warmup: sample every cell.
            decay: EMA factor applied to every cell first.
            threshold: optical thickness above which a cell is occupied (capped by the mean).
            chunk: points per density_fn call (2^16 keeps each call's buffers to a few MB, small
                enough for a process's allocator to reuse rather than map afresh).
        """
        dev = self.density.device
        fresh = torch.zeros_like(self.density)
        seen = self.density >= 0
        layout = bitfield_layout(self.resolution)
        for c in range(self.n_cascades):
            if dev.type != "cpu":
                cells = self._draw_cells_on_device(c, seen[c], warmup)
            elif warmup:
                cells = seen[c].nonzero().squeeze(1)
            else:
                live = seen[c].nonzero().squeeze(1)
                k = live.numel() // 4
                uniform = live[torch.randint(0, max(live.numel(), 1), (k,), device=dev)]
                # "Occupied" as the current bitfield says (density > min(threshold, mean)); a
                # finer cascade's pooled occupancy can set the bit of an unseen cell.
                occ = (_unpack(self.bits[c, : layout[1]], self.n_cells) & seen[c]).nonzero()
                occ = occ.squeeze(1)
                picked = (
                    occ[torch.randint(0, occ.numel(), (k,), device=dev)] if occ.numel() else occ
                )
                cells = torch.cat([uniform, picked])
            step = self.step_size * 2.0**c
            for s in range(0, cells.numel(), chunk):
                idx = cells[s : s + chunk]
                sigma = density_fn(self.cell_points(c, idx)).reshape(-1).float()
                fresh[c].scatter_reduce_(0, idx, sigma.clamp_min(0) * step, reduce="amax")
        self.density.copy_(
            torch.where(seen, torch.maximum(self.density * decay, fresh), self.density)
        )
        self.n_updates += 1
        self.binarize(threshold)

    def _draw_cells_on_device(self, c: int, seen: torch.Tensor, warmup: bool) -> torch.Tensor:
        # update's draws without `nonzero` (on a GPU its size waits for the device): every cell
        # in warmup, else a quarter of the cascade's cells drawn uniformly among the seen ones
        # and a quarter among the occupied ones, each as the (u + 1)-th set cell of a mask for
        # u uniform below the mask's count. Unseen cells drawn (warmup; a mask with no cell
        # set) are evaluated but never written: update keeps their density.
        dev = seen.device
        if warmup:
            return torch.arange(self.n_cells, device=dev)
        layout = bitfield_layout(self.resolution)
        occ = _unpack(self.bits[c, : layout[1]], self.n_cells) & seen
        k = self.n_cells // 4
        draws = []
        for mask in (seen, occ):
            cum = torch.cumsum(mask, 0)
            u = (torch.rand(k, device=dev, dtype=torch.float64) * cum[-1]).long()
            draws.append(torch.searchsorted(cum, u, right=True).clamp_max(self.n_cells - 1))
        return torch.cat(draws)

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

        The mean is over the cells some camera sees (density >= 0): counting UNSEEN cells as empty
        would pull it, and so the threshold, down as more of the box is unseen. UNSEEN cells are
        below any threshold, so they are empty.

        Args:
            threshold: optical-thickness threshold (instant-ngp's 0.01).
            backend: "ext" or "reference"; default the grid's.
        """
        seen = self.density >= 0
        mean = self.density.clamp_min(0).sum() / seen.sum().clamp_min(1)
        if self.density.device.type != "cpu":
            # the threshold stays on the device: the reference takes it as a tensor, where the
            # compiled op's float would be a read of the mean
            self.bits.copy_(bitfield_reference(self.density, mean.clamp_max(threshold)))
            return
        self._set_bits(self.density, min(threshold, float(mean)), backend)

    def _set_bits(self, density: torch.Tensor, thresh: float, backend: str | None) -> None:
        backend = backend or self.backend
        if backend == "reference":
            self.bits.copy_(bitfield_reference(density, thresh))
        else:
            self.bits.copy_(_ext.for_tensor(density).occ_bitfield(density.contiguous(), thresh))

    @torch.no_grad()
    def mark_unseen(
        self,
        c2w: torch.Tensor,
        intrinsics: torch.Tensor,
        sizes: torch.Tensor,
        *,
        near: float | torch.Tensor = 0.0,
        margin: float = 0.01,
        min_views: int = 1,
        chunk: int = 2**21,
    ) -> int:
        """Mark the cells fewer than `min_views` cameras see (1: no camera) as UNSEEN, so that
        they stay empty (instant-ngp's mark_untrained_density_grid, nerfacc's invisible cells).

        A cell is seen when its bounding sphere reaches into a camera's pinhole frustum (the image
        grown by `margin`, from depth `near` on; `frustum_planes`). The sphere keeps the test
        conservative: a cell that only grazes a frustum, or is wider than the frustum where it
        crosses it, counts as seen. Only cells no camera sees are marked; a cell marked before that
        a camera now sees gets density 0 and its bit set, to be sampled until an update decides.
        Marked cells lose their bit now (and the mips are rebuilt); the other bits are kept, so a
        fresh grid still samples every seen cell before its first update.

        Args:
            c2w: (M, 3|4, 4) camera-to-world in the grid's frame, OpenGL axes (x right, y up,
                looking down -z).
            intrinsics: (M, 4) fx, fy, cx, cy in pixels, image y down. A lens with distortion
                needs the pinhole image that holds all of its rays.
            sizes: (M, 2) image width, height in pixels.
            near: depth in front of each camera where its view begins: one for all, or (M,).
            margin: fraction of the width (height) added to each side of every image.
            min_views: how many cameras must see a cell for it to be trained; a cell one photo
                alone sees is free to hold whatever explains that photo (a floater in front of
                it) and no other photo says otherwise.
            chunk: cell-camera pairs tested at once (memory is ~20 bytes per pair).

        Returns:
            The number of UNSEEN cells after the call, out of n_cascades * resolution^3.
        """
        dev = self.density.device
        planes = frustum_planes(
            torch.as_tensor(c2w), torch.as_tensor(intrinsics), torch.as_tensor(sizes), near, margin
        )
        m_n = planes.shape[0]
        planes = planes.float().to(dev)
        normals = planes[..., :3].reshape(-1, 3).T.contiguous()  # (3, 5M)
        offsets = planes[..., 3].reshape(-1)  # (5M,)
        step = max(1, chunk // max(m_n, 1))
        levels = self.resolution.bit_length() - 1
        unseen = torch.ones_like(self.density, dtype=torch.bool)
        for c in range(self.n_cascades):
            ext = torch.tensor(self.half, device=dev) * 2.0**c
            low = torch.tensor(self.center, device=dev) - ext
            r_cell = float((ext / self.resolution).norm())
            # Coarse to fine over morton blocks (block b of a level holds cells [b k^3, (b+1) k^3)):
            # a block whose ball lies outside some plane of all but fewer than min_views cameras
            # leaves all its cells unseen, one that min_views cameras' planes hold with room for
            # each cell's ball makes them all seen; only the rest split into their 8 children.
            # Both shortcuts follow from the cell test (planes are 1-Lipschitz, a cell's ball sits
            # inside its block's), so the result is the cell-by-cell test's.
            blocks = torch.zeros(1, dtype=torch.int64, device=dev)
            for level in range(levels + 1):
                k = 1 << (levels - level)
                r_block = k * r_cell
                ijk = torch.stack([morton3d_invert(blocks >> s) for s in range(3)], 1)
                centres = low + (ijk.float() + 0.5) * (2 * k / self.resolution) * ext
                split = []
                for s in range(0, blocks.numel(), step):
                    ids = blocks[s : s + step]
                    dist = torch.addmm(offsets, centres[s : s + step], normals)
                    worst = dist.view(ids.numel(), m_n, 5).amax(2)  # (n, M): farthest outside
                    whole = (worst <= 2 * r_cell - r_block).sum(1) >= min_views
                    some = (worst <= r_block).sum(1) >= min_views
                    unseen[c].view(-1, k**3)[ids[whole]] = False
                    split.append(ids[some & ~whole])
                mixed = torch.cat(split)
                if not mixed.numel():
                    break
                blocks = (mixed[:, None] * 8 + torch.arange(8, device=dev)).reshape(-1)
        was = self.density < 0
        self.density[unseen] = UNSEEN
        self.density[was & ~unseen] = 0.0
        layout = bitfield_layout(self.resolution)
        occ = torch.stack([_unpack(b[: layout[1]], self.n_cells) for b in self.bits])
        keep = torch.where(unseen, UNSEEN, (occ | was).float())
        self._set_bits(keep, 0.5, None)
        return int(unseen.sum())

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
