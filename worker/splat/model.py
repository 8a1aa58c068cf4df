"""Gaussians as optimisable tensors and their rendering through kernels.splat.

Storage follows the 3DGS reference (and its PLY): log scales, unnormalised quaternions (w, x, y,
z), opacity logits, SH coefficients with the DC band apart (colour = SH . coeffs + 0.5).
Everything lives in the dataset's normalised frame.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels import splat
from kernels.sh import sh_reference
from kernels.splat_project import covariance_3d, project_gaussians
from worker.scene.cameras import RenderCamera

SH_C0 = 0.28209479177387814
NAMES = ("means", "scales", "quats", "opacities", "sh_dc", "sh_rest")


def n_rest(degree: int) -> int:
    return (degree + 1) ** 2 - 1


def rgb_to_sh_dc(rgb: torch.Tensor) -> torch.Tensor:
    return (rgb - 0.5) / SH_C0


def inverse_sigmoid(x: torch.Tensor) -> torch.Tensor:
    return torch.log(x / (1 - x))


def knn_scale(points: torch.Tensor, k: int = 3, chunk: int = 2048) -> torch.Tensor:
    """Mean distance to the k nearest other points (3DGS's initial scale), chunked to bound memory."""
    n = points.shape[0]
    if n <= 1:
        return torch.full((n,), 0.01, dtype=points.dtype)
    k = min(k, n - 1)
    out = []
    for s in range(0, n, chunk):
        d = torch.cdist(points[s : s + chunk], points)
        out.append(d.topk(k + 1, largest=False).values[:, 1:].mean(-1))
    return torch.cat(out).clamp(min=1e-4)


def init_tensors(points: torch.Tensor, colors: torch.Tensor, degree: int, opacity: float = 0.1):
    n = points.shape[0]
    return {
        "means": points.float().clone(),
        "scales": torch.log(knn_scale(points.float()))[:, None].repeat(1, 3),
        "quats": torch.tensor([1.0, 0.0, 0.0, 0.0]).repeat(n, 1),
        "opacities": inverse_sigmoid(torch.full((n,), opacity)),
        "sh_dc": rgb_to_sh_dc(colors.float()),
        "sh_rest": torch.zeros(n, n_rest(degree), 3),
    }


@dataclass
class RenderOut:
    rgb: torch.Tensor  # (H, W, 3), background included
    alpha: torch.Tensor  # (H, W) = 1 - transmittance
    means2d: torch.Tensor  # (M, 2) of the visible splats (retains grad for densification)
    visible: torch.Tensor  # (M,) indices of those splats
    radii: torch.Tensor  # (M,) pixel radii
    depths: torch.Tensor  # (M,)
    conics: torch.Tensor
    opacities: torch.Tensor
    # (M,) bool: which of the `visible` splats are in view, where those are every splat
    # (training on a GPU: render's mask instead of a compaction); None: all of them are
    shown: torch.Tensor | None = None


def colors_of(
    p: dict[str, torch.Tensor], idx: torch.Tensor, cam_center: torch.Tensor, degree: int
) -> torch.Tensor:
    k = n_rest(degree)
    dc = p["sh_dc"][idx]
    if degree == 0:
        return torch.clamp(SH_C0 * dc + 0.5, min=0.0)
    dirs = torch.nn.functional.normalize(p["means"][idx].detach() - cam_center, dim=-1)
    basis = sh_reference(dirs, degree + 1)  # (M, (d+1)^2), band 0 first
    coeffs = torch.cat([dc[:, None, :], p["sh_rest"][idx, :k]], 1)
    return torch.clamp((basis[:, :, None] * coeffs).sum(1) + 0.5, min=0.0)


def render(
    p: dict[str, torch.Tensor],
    cam: RenderCamera,
    background: torch.Tensor,
    degree: int,
    method: str = "tiled",
    antialiased: bool = False,
) -> RenderOut:
    """One view of the Gaussians; `antialiased`: mip-splatting's 2D filter (kernels.splat_project)."""
    c2w = cam.c2w.to(p["means"].device, p["means"].dtype)
    cov = covariance_3d(torch.exp(p["scales"]), p["quats"])
    proj = project_gaussians(
        p["means"],
        cov,
        c2w,
        cam.fx,
        cam.fy,
        cam.cx,
        cam.cy,
        cam.width,
        cam.height,
        antialiased=antialiased,
    )
    training = torch.is_grad_enabled()
    with torch.no_grad():
        r = proj.radii
        u, v = proj.means2d[:, 0], proj.means2d[:, 1]
        on_screen = (u + r > 0) & (u - r < cam.width) & (v + r > 0) & (v - r < cam.height)
        shown = proj.visible & on_screen
        # Training on a GPU keeps every splat and gives those out of view zero opacity, which
        # no compositor bins or blends: the image and gradients of the compaction, without the
        # host synchronisation `nonzero` is there.
        masked = shown.device.type != "cpu" and training
        idx = torch.arange(shown.numel(), device=shown.device) if masked else None
        if idx is None:
            idx = shown.nonzero().squeeze(1)
    means2d = proj.means2d[idx]
    if means2d.requires_grad:
        means2d.retain_grad()
    colors = colors_of(p, idx, c2w[:3, 3], degree)
    opac = torch.sigmoid(p["opacities"][idx])
    if antialiased:
        opac = opac * proj.compensations[idx]
    if masked:
        opac = torch.where(shown, opac, torch.zeros_like(opac))
    rgb, trans = splat.rasterize(
        means2d,
        proj.conics[idx],
        colors,
        opac,
        cam.height,
        cam.width,
        background=background,
        depths=proj.depths[idx].detach(),
        method=method,
    )
    return RenderOut(
        rgb,
        1.0 - trans,
        means2d,
        idx,
        proj.radii[idx],
        proj.depths[idx],
        proj.conics[idx],
        opac,
        shown if masked else None,
    )


def render_depth(
    p: dict[str, torch.Tensor], cam: RenderCamera, out: RenderOut, method: str = "tiled"
) -> torch.Tensor:
    """Expected distance of the visible surface along each pixel's unit ray, as kind=nerf's depth
    (alpha-weighted view-axis depth divided by alpha, times the length of the pixel centre's ray
    per unit of view axis); 0 where empty."""
    z = out.depths.detach()[:, None].expand(-1, 3).contiguous()
    acc, _ = splat.rasterize(
        out.means2d.detach(),
        out.conics.detach(),
        z,
        out.opacities.detach(),
        cam.height,
        cam.width,
        depths=out.depths.detach(),
        method=method,
    )
    a = out.alpha.detach()
    axis = torch.where(a > 1e-4, acc[..., 0] / a.clamp(min=1e-4), torch.zeros_like(a))
    x = (torch.arange(cam.width, device=a.device) + 0.5 - cam.cx) / cam.fx
    y = (torch.arange(cam.height, device=a.device) + 0.5 - cam.cy) / cam.fy
    return axis * torch.sqrt(1 + x[None, :] ** 2 + y[:, None] ** 2)
