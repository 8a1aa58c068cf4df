"""Fake implementations of the compiled ops: output shapes, dtypes and devices from the inputs.

FakeTensorMode and torch.compile run these instead of the kernels, so tracing never touches data
and works for any device the tensors claim (a 'cuda' fake tensor on a CPU-only machine included).
The shapes mirror the allocations of `csrc/ops.h` and `csrc/cpu_ops.cpp`; `march_rays`' sample
count depends on the data and is a fresh symbolic size. `kernels._ext` registers one namespace's
fakes right after loading the library that defines its ops.
"""

from __future__ import annotations

import torch

_registered: set[str] = set()

SPLAT_GRADS = 11  # per splat: du dv dA dB dC dr dg db do |du| |dv| (csrc/splat.h)


def _occ_bytes_per_cascade(cells: int) -> int:
    """Bytes of one cascade's bitfield and mips (kn_bind::bit_layout) for R^3 cells."""
    res = round(cells ** (1 / 3))
    total, mip = 0, 0
    while res >> mip >= 1:
        total += max(1, (res >> mip) ** 3 // 8)
        mip += 1
    return total


def _nerf(reg) -> None:
    @reg("hash_grid_forward")
    def _(x, table, offsets, resolution, scale, hashed):
        return x.new_empty((x.shape[0], resolution.numel() * table.shape[1]))

    @reg("hash_grid_backward")
    def _(x, grad_out, n_rows, n_features, offsets, resolution, scale, hashed):
        return grad_out.new_empty((n_rows, n_features))

    @reg("hash_grid_backward_rows")
    def _(x, grad_out, grad_table, touched, offsets, resolution, scale, hashed):
        return None

    @reg("hash_grid_adam")
    def _(table, grad, touched, exp_avg, exp_avg_sq, steps, bc1, bc2_sqrt, lr, b1, b2, eps):
        return None

    @reg("sh_encode")
    def _(dirs, degree):
        return dirs.new_empty((dirs.shape[0], degree * degree))

    @reg("composite_forward")
    def _(sigmas, rgbs, t_starts, t_ends, offsets, stop_T):
        n = offsets.shape[0] - 1
        return sigmas.new_empty((n, 3)), sigmas.new_empty((n,)), sigmas.new_empty((n,))

    @reg("composite_backward")
    def _(sigmas, rgbs, t_starts, t_ends, offsets, stop_T, g_rgb, g_depth, g_opacity):
        return torch.empty_like(sigmas), torch.empty_like(rgbs)

    @reg("ray_offsets")
    def _(ray_indices, n_rays):
        return ray_indices.new_empty((n_rays + 1,))

    @reg("occ_bitfield")
    def _(density, threshold):
        per = _occ_bytes_per_cascade(int(density.shape[1]))
        return density.new_empty((density.shape[0], per), dtype=torch.uint8)

    @reg("occ_query")
    def _(points, bits, resolution, center, half):
        return points.new_empty((points.shape[0],), dtype=torch.bool)

    @reg("march_rays")
    def _(rays_o, rays_d, near, far, jitter, aabb, step, cone, max_step, max_samples, bits, *grid):
        n = rays_o.shape[0]
        s = torch.library.get_ctx().new_dynamic_size()
        long = dict(dtype=torch.int64)
        return (
            rays_o.new_empty((s,), **long),
            rays_o.new_empty((s,)),
            rays_o.new_empty((s,)),
            rays_o.new_empty((n + 1,), **long),
            rays_o.new_empty((n,), **long),
        )

    @reg("cull_round")
    def _(offsets, alive, sigma, t_starts, t_ends, tau, near, cap, tau_max, alpha_min):
        return (
            sigma.new_empty((sigma.shape[0],), dtype=torch.bool),
            sigma.new_empty((alive.shape[0],), dtype=torch.bool),
        )

    @reg("move_rows")
    def _(dst, dest, src, idx):
        return None

    @reg("nerf_mlp_forward")
    def _(enc, sh, density, color, shift, block, isa):
        n = enc.shape[0]
        return enc.new_empty((n,)), enc.new_empty((n if sh is not None else 0, 3))

    @reg("nerf_mlp_backward")
    def _(enc, sh, density, color, shift, sigma, rgb, g_sigma, g_rgb, need_enc, need_sh,
          need_params, block, isa):  # fmt: skip
        n = enc.shape[0]
        out = [
            enc.new_empty((n, enc.shape[1]) if need_enc else (0,)),
            enc.new_empty((n, sh.shape[1]) if need_sh else (0,)),
        ]
        if need_params:
            out += [torch.empty_like(p) for p in (*density, *color)]
        return out


def _splat(reg) -> None:
    def image(means2d, H, W):
        return (
            means2d.new_empty((H, W, 3)),
            means2d.new_empty((H, W)),
            means2d.new_empty((H, W), dtype=torch.int32),
        )

    @reg("naive_forward")
    def _(means2d, conics, colors, opacities, H, W, alpha_min, alpha_max, stop_T):
        return image(means2d, H, W)

    @reg("tiled_forward")
    def _(means2d, conics, colors, opacities, H, W, tile_offsets, tile_ids, *alphas):
        return image(means2d, H, W)

    @reg("naive_backward")
    def _(means2d, *rest):
        return means2d.new_empty((means2d.shape[0], SPLAT_GRADS))

    @reg("tiled_backward")
    def _(means2d, *rest):
        return means2d.new_empty((means2d.shape[0], SPLAT_GRADS))


_BY_NAMESPACE = {"nf": _nerf, "nf_splat": _splat}


def register(namespace: str) -> None:
    """Registers the fakes of `namespace`'s ops (once; its library must be loaded)."""
    if namespace in _registered:
        return

    def reg(op):
        return torch.library.register_fake(f"{namespace}::{op}")

    _BY_NAMESPACE[namespace](reg)
    _registered.add(namespace)
