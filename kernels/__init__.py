"""Compute ops for the NeRF job: one source for CPU (C++/OpenMP) and CUDA, plus pure-torch references.

See docs/kernels.md for signatures and a training-step example.
"""

from ._ext import KernelBuildError, compiled_available
from .composite import composite, composite_reference, ray_offsets, render_weights_reference
from .hash_grid import HashGrid, HashGridAdam, hash_grid_reference
from .marching import PackedSamples, march_rays, march_reference
from .mlp import mlp_bf16_supported, mlp_isa, nerf_mlp, nerf_mlp_reference, trunc_exp
from .occupancy import OccupancyGrid, bitfield_reference, morton3d, morton3d_invert
from .rounds import cull_round, cull_round_reference, move_rows
from .sh import sh_encode, sh_reference
from .splat import rasterize, rasterize_reference, tile_bins
from .splat_project import covariance_3d, project_gaussians

__all__ = [
    "HashGrid",
    "HashGridAdam",
    "hash_grid_reference",
    "sh_encode",
    "sh_reference",
    "composite",
    "composite_reference",
    "render_weights_reference",
    "ray_offsets",
    "KernelBuildError",
    "compiled_available",
    "OccupancyGrid",
    "bitfield_reference",
    "morton3d",
    "morton3d_invert",
    "march_rays",
    "march_reference",
    "PackedSamples",
    "cull_round",
    "cull_round_reference",
    "move_rows",
    "nerf_mlp",
    "nerf_mlp_reference",
    "trunc_exp",
    "mlp_bf16_supported",
    "mlp_isa",
    "rasterize",
    "rasterize_reference",
    "tile_bins",
    "project_gaussians",
    "covariance_3d",
]
