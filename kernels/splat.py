"""Gaussian-splat compositing: seed 002's naive compositor, a 16x16 tiled one, and a pure-torch reference.

Splats are 2D: means (N, 2) in pixels (pixel (x, y) has its centre at (x + 0.5, y + 0.5)),
conics (N, 3) = (A, B, C) of the inverse 2D covariance, colours (N, 3), opacities (N,).
`rasterize` sorts them near to far by `depths` (or takes them as sorted), composites
alpha = min(o * exp(-0.5 (A dx^2 + C dy^2) - B dx dy), 0.99), skipping alpha < 1/255 and stopping
a pixel right after its transmittance drops below 1e-4, and returns the image and the final
transmittance. Differentiable w.r.t. means2d, conics, colours and opacities on every method.

The compiled methods live in their own extension (`kernels._ext.SPLAT`: csrc/splat_cpu.cpp and,
on CUDA machines, csrc/splat_cuda_binding.cpp + csrc/splat.cu, over csrc/splat.h), built on first
use by the same backend as the other kernels.
"""

from __future__ import annotations

import torch

from . import _ext

ALPHA_MIN = 1.0 / 255
ALPHA_MAX = 0.99
STOP_T = 1e-4
TILE = 16
METHODS = ("tiled", "naive", "reference")

# ------------------------------------------------------------------------------------ tiles


def tile_bins(
    means2d: torch.Tensor,
    conics: torch.Tensor,
    opacities: torch.Tensor,
    height: int,
    width: int,
    alpha_min: float = ALPHA_MIN,
):
    """Per-tile splat lists for the tiled compositor.

    Args:
        means2d: (N, 2) centres in pixels, in depth order.
        conics: (N, 3) inverse 2D covariances.
        opacities: (N,).
        height, width: image size in pixels.
        alpha_min: the alpha below which a splat does not count at a pixel.

    Returns:
        tile_offsets int64 (n_tiles + 1,) and tile_ids int32 (M,): tile t (row-major, 16x16 px)
        lists splats tile_ids[tile_offsets[t]:tile_offsets[t + 1]] in depth order.

    A splat can reach alpha >= alpha_min only where d^T conic d <= 2 ln(o / alpha_min); it goes
    to every tile its axis-aligned box of that ellipse (plus half a pixel against round-off)
    touches, so the tiled compositor reproduces the naive one. Each tile's run keeps the input
    (depth) order because the sort by tile is stable.
    """
    dev = means2d.device
    tx, ty = -(-width // TILE), -(-height // TILE)
    with torch.no_grad():
        m, c, o = means2d.double(), conics.double(), opacities.double()
        a, b, cc = c.unbind(-1)
        det = a * cc - b * b
        q = 2.0 * torch.log(torch.clamp(o, min=1e-30) / alpha_min)
        ok = (det > 0) & (a > 0) & (q > 0) & torch.isfinite(m).all(-1) & torch.isfinite(c).all(-1)
        safe_det = torch.where(ok, det, torch.ones_like(det))
        rx = torch.sqrt(torch.clamp(q * cc / safe_det, min=0)) + 0.5
        ry = torch.sqrt(torch.clamp(q * a / safe_det, min=0)) + 0.5
        # pixel x is touched when |x + 0.5 - u| <= rx
        x0 = torch.floor((m[:, 0] - rx - 0.5) / TILE).clamp(0, tx - 1)
        x1 = torch.floor((m[:, 0] + rx - 0.5) / TILE)
        y0 = torch.floor((m[:, 1] - ry - 0.5) / TILE).clamp(0, ty - 1)
        y1 = torch.floor((m[:, 1] + ry - 0.5) / TILE)
        ok = (
            ok
            & (x1 >= 0)
            & (y1 >= 0)
            & (m[:, 0] - rx - 0.5 < width)
            & (m[:, 1] - ry - 0.5 < height)
        )
        x1, y1 = x1.clamp(max=tx - 1), y1.clamp(max=ty - 1)
        nx = torch.where(ok, x1 - x0 + 1, torch.zeros_like(x0)).clamp(min=0).long()
        ny = torch.where(ok, y1 - y0 + 1, torch.zeros_like(y0)).clamp(min=0).long()
        counts = nx * ny
        sid = torch.repeat_interleave(torch.arange(means2d.shape[0], device=dev), counts)
        first = torch.cumsum(counts, 0) - counts
        k = torch.arange(sid.numel(), device=dev) - first[sid]
        w = nx[sid]
        tile = (y0.long()[sid] + k // w) * tx + (x0.long()[sid] + k % w)
        tile_sorted, perm = torch.sort(tile, stable=True)
        ids = sid[perm].to(torch.int32).contiguous()
        if dev.type != "cpu":  # bincount's size waits for the largest tile on a GPU
            tiles = torch.arange(tx * ty + 1, device=dev)
            offsets = torch.searchsorted(tile_sorted, tiles)
        else:
            offsets = torch.zeros(tx * ty + 1, dtype=torch.int64, device=dev)
            offsets[1:] = torch.cumsum(torch.bincount(tile_sorted, minlength=tx * ty), 0)
    return offsets, ids


# ------------------------------------------------------------------------------------ reference


def _reference_chunk(px, py, means2d, conics, colors, opacities, alpha_min, alpha_max, stop_T):
    # means2d is (N, 2), or (P, N, 2) with one copy per pixel (absgrad_reference's per-pixel grads)
    dx = px[:, None] - means2d[..., 0]
    dy = py[:, None] - means2d[..., 1]
    a, b, c = conics.unbind(-1)
    power = -0.5 * (a * dx * dx + c * dy * dy) - b * dx * dy
    raw = opacities * torch.exp(power)
    alpha = torch.where(
        (power <= 0) & (raw >= alpha_min), raw.clamp(max=alpha_max), torch.zeros_like(raw)
    )
    one_m = 1.0 - alpha
    trans = torch.cumprod(one_m, dim=1)
    before = torch.cat([torch.ones_like(trans[:, :1]), trans[:, :-1]], dim=1)
    alive = before >= stop_T  # a pixel composites splat i only while it has not stopped before i
    w = alpha * before * alive
    rgb = w @ colors
    final_T = torch.where(alive, one_m, torch.ones_like(one_m)).prod(dim=1)
    return rgb, final_T


def rasterize_reference(
    means2d,
    conics,
    colors,
    opacities,
    height,
    width,
    alpha_min=ALPHA_MIN,
    alpha_max=ALPHA_MAX,
    stop_T=STOP_T,
):
    """Pure torch, every pixel against every splat, in pixel chunks (re-computed in backward, so its
    memory stays bounded). Splats must be sorted near to far. -> (rgb (H, W, 3), T (H, W))."""
    dev, dt = means2d.device, means2d.dtype
    n = means2d.shape[0]
    ys, xs = torch.meshgrid(
        torch.arange(height, device=dev, dtype=dt),
        torch.arange(width, device=dev, dtype=dt),
        indexing="ij",
    )
    px, py = xs.reshape(-1) + 0.5, ys.reshape(-1) + 0.5
    if n == 0:
        return torch.zeros(height, width, 3, device=dev, dtype=dt), torch.ones(
            height, width, device=dev, dtype=dt
        )
    chunk = max(16, (1 << 22) // n)
    grad = torch.is_grad_enabled() and any(
        t.requires_grad for t in (means2d, conics, colors, opacities)
    )
    rgbs, ts = [], []
    for s in range(0, px.numel(), chunk):
        args = (
            px[s : s + chunk],
            py[s : s + chunk],
            means2d,
            conics,
            colors,
            opacities,
            alpha_min,
            alpha_max,
            stop_T,
        )
        if grad:
            r, t = torch.utils.checkpoint.checkpoint(_reference_chunk, *args, use_reentrant=False)
        else:
            r, t = _reference_chunk(*args)
        rgbs.append(r)
        ts.append(t)
    return torch.cat(rgbs).reshape(height, width, 3), torch.cat(ts).reshape(height, width)


# ------------------------------------------------------------------------------------ compiled


class _RasterizeFn(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        means2d,
        conics,
        colors,
        opacities,
        height,
        width,
        method,
        tile_offsets,
        tile_ids,
        prm,
        abs_sink,
    ):
        mod = _ext.for_tensor(means2d, _ext.SPLAT)
        if method == "naive":
            rgb, trans, n = mod.naive_forward(
                means2d, conics, colors, opacities, height, width, *prm
            )
        else:
            rgb, trans, n = mod.tiled_forward(
                means2d, conics, colors, opacities, height, width, tile_offsets, tile_ids, *prm
            )
        ctx.save_for_backward(means2d, conics, colors, opacities, tile_offsets, tile_ids, trans, n)
        ctx.args = (height, width, method, prm)
        ctx.abs_sink = abs_sink
        return rgb, trans

    @staticmethod
    def backward(ctx, g_rgb, g_trans):
        means2d, conics, colors, opacities, tile_offsets, tile_ids, trans, n = ctx.saved_tensors
        height, width, method, prm = ctx.args
        g_rgb = (
            torch.zeros(height, width, 3, dtype=means2d.dtype, device=means2d.device)
            if g_rgb is None
            else g_rgb.contiguous()
        )
        g_trans = (
            torch.zeros(height, width, dtype=means2d.dtype, device=means2d.device)
            if g_trans is None
            else g_trans.contiguous()
        )
        mod = _ext.for_tensor(means2d, _ext.SPLAT)
        if method == "naive":
            g = mod.naive_backward(
                means2d, conics, colors, opacities, height, width, *prm, trans, n, g_rgb, g_trans
            )
        else:
            g = mod.tiled_backward(
                means2d,
                conics,
                colors,
                opacities,
                height,
                width,
                tile_offsets,
                tile_ids,
                *prm,
                trans,
                n,
                g_rgb,
                g_trans,
            )
        if ctx.abs_sink is not None:
            _stash_absgrad(ctx.abs_sink, g[:, 9:11])
        return g[:, 0:2], g[:, 2:5], g[:, 5:8], g[:, 8], None, None, None, None, None, None, None


def _stash_absgrad(sink, abs_sorted):
    # gsplat's `means2d.absgrad`: set on the caller's tensor, in the caller's order
    target, order = sink
    if order is None:
        target.absgrad = abs_sorted.detach().clone()
    else:
        absgrad = torch.zeros_like(abs_sorted)
        absgrad[order] = abs_sorted
        target.absgrad = absgrad


def absgrad_reference(
    means2d,
    conics,
    colors,
    opacities,
    height,
    width,
    grad_rgb,
    grad_trans,
    alpha_min=ALPHA_MIN,
    alpha_max=ALPHA_MAX,
    stop_T=STOP_T,
):
    """Per-splat sum over pixels of |dL/dmean2d|, pure torch (the compiled methods' `absgrad`).

    Every pixel gets its own copy of the means, so autograd gives each pixel's contribution
    separately; costs H*W*N*2 memory, so small images only (tests).

    Args:
        means2d, conics, colors, opacities: as `rasterize_reference`, sorted near to far.
        height, width: image size H, W.
        grad_rgb: (H, W, 3) dL/drgb; grad_trans: (H, W) dL/dT.

    Returns:
        (N, 2): sum over pixels of |dL_p/du|, |dL_p/dv|.
    """
    dev, dt = means2d.device, means2d.dtype
    n = means2d.shape[0]
    ys, xs = torch.meshgrid(
        torch.arange(height, device=dev, dtype=dt),
        torch.arange(width, device=dev, dtype=dt),
        indexing="ij",
    )
    px, py = xs.reshape(-1) + 0.5, ys.reshape(-1) + 0.5
    per_pixel = means2d.detach()[None].expand(px.numel(), n, 2).clone().requires_grad_(True)
    with torch.enable_grad():
        rgb, final_T = _reference_chunk(
            px,
            py,
            per_pixel,
            conics.detach(),
            colors.detach(),
            opacities.detach(),
            alpha_min,
            alpha_max,
            stop_T,
        )
        loss = (rgb * grad_rgb.reshape(-1, 3)).sum() + (final_T * grad_trans.reshape(-1)).sum()
        (g,) = torch.autograd.grad(loss, per_pixel)
    return g.abs().sum(0)


def rasterize(
    means2d: torch.Tensor,
    conics: torch.Tensor,
    colors: torch.Tensor,
    opacities: torch.Tensor,
    height: int,
    width: int,
    background: torch.Tensor | float | None = None,
    *,
    depths: torch.Tensor | None = None,
    method: str = "tiled",
    alpha_min: float = ALPHA_MIN,
    alpha_max: float = ALPHA_MAX,
    stop_T: float = STOP_T,
):
    """Composite 2D splats front to back; differentiable w.r.t. means2d, conics, colors, opacities.

    The compiled methods' backward also sets `means2d.absgrad` (N, 2): the sum over pixels of
    each pixel's |dL/du|, |dL/dv| (gsplat's absgrad, for densification), replaced on every backward.

    Args:
        means2d: (N, 2) centres in pixels (pixel (x, y) has its centre at (x + 0.5, y + 0.5)).
        conics: (N, 3) (A, B, C) of the inverse 2D covariance.
        colors: (N, 3).
        opacities: (N,).
        height: image rows H.
        width: image columns W.
        background: None, a scalar or (3,); fills the remaining transmittance.
        depths: (N,) to sort near to far first; None: the input order is the depth order.
        method: "tiled" (16x16 tiles, shared-memory batches), "naive" (seed 002: every pixel walks
            every splat) or "reference" (pure torch).
        alpha_min: splats below this alpha at a pixel are skipped (1/255).
        alpha_max: alpha clamp (0.99).
        stop_T: a pixel stops after the splat that takes its transmittance below this.

    Returns:
        rgb (H, W, 3) and final transmittance (H, W), in the means' dtype.

    Raises:
        ValueError: mismatched shapes, a non-positive size, an unknown method, or (compiled) a
            dtype other than float32/float64.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    height, width = int(height), int(width)
    if height < 1 or width < 1:
        raise ValueError(f"image size must be positive, got {width}x{height}")
    n = means2d.shape[0]
    if (
        means2d.shape != (n, 2)
        or conics.shape != (n, 3)
        or colors.shape != (n, 3)
        or opacities.shape != (n,)
    ):
        raise ValueError(
            "expected means2d (N, 2), conics (N, 3), colors (N, 3), opacities (N,); got "
            f"{tuple(means2d.shape)}, {tuple(conics.shape)}, {tuple(colors.shape)}, "
            f"{tuple(opacities.shape)}"
        )
    caller_means, order = means2d, None
    if depths is not None:
        order = torch.argsort(depths.detach())
        means2d, conics, colors, opacities = (
            means2d[order],
            conics[order],
            colors[order],
            opacities[order],
        )
    dt = means2d.dtype
    conics, colors, opacities = conics.to(dt), colors.to(dt), opacities.to(dt)
    if method == "reference":
        rgb, trans = rasterize_reference(
            means2d, conics, colors, opacities, height, width, alpha_min, alpha_max, stop_T
        )
    else:
        if dt not in (torch.float32, torch.float64):
            raise ValueError(f"compiled compositors take float32 or float64, got {dt}")
        prm = (float(alpha_min), float(alpha_max), float(stop_T))
        if method == "tiled":
            offsets, ids = tile_bins(means2d, conics, opacities, height, width, alpha_min)
        else:
            offsets = torch.zeros(1, dtype=torch.int64, device=means2d.device)
            ids = torch.zeros(0, dtype=torch.int32, device=means2d.device)
        rgb, trans = _RasterizeFn.apply(
            means2d.contiguous(),
            conics.contiguous(),
            colors.contiguous(),
            opacities.contiguous(),
            height,
            width,
            method,
            offsets,
            ids,
            prm,
            (caller_means, order) if caller_means.requires_grad else None,
        )
    if background is not None:
        bg = torch.as_tensor(background, dtype=rgb.dtype, device=rgb.device)
        rgb = rgb + trans[..., None] * bg
    return rgb, trans


def n_tile_pairs(means2d, conics, opacities, height, width) -> int:
    """How many (tile, splat) pairs the tiled compositor walks at most (for benchmarks)."""
    return int(tile_bins(means2d, conics, opacities, height, width)[1].numel())


__all__ = [
    "rasterize",
    "rasterize_reference",
    "absgrad_reference",
    "tile_bins",
    "ALPHA_MIN",
    "ALPHA_MAX",
    "STOP_T",
    "TILE",
    "n_tile_pairs",
]
