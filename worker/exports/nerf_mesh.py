"""Meshes of a nerf job: marching cubes over the field's density in the scene box, vertex colours
from the field, written with trimesh in the dataset's own world frame.

The mesh is a level set of density, not a reconstructed surface: thin or semi-transparent
structures may vanish or thicken with the threshold, and where no camera saw the scene the
field's density is whatever training left there (docs/exports.md)."""

from __future__ import annotations

import numpy as np
import torch

from api_schemas.exports import ExportOptions
from worker.exports.common import ExportError, to_world
from worker.nerf.rendering import SAMPLE_CHUNK

# Boxes of the occupancy grid that stay around occupied ones: the grid only tells where renders
# look, so the mesh keeps every surface the renders show and drops floaters in space the grid
# marks empty, without cutting a surface at a cell edge.
MASK_DILATION_CELLS = 1


def occupied_mask(grid, res: int, device) -> torch.Tensor:
    """Cascade-0 occupancy dilated by MASK_DILATION_CELLS, resampled to a (res,)^3 lattice of
    points spanning the box (bool, indexed [x, y, z])."""
    occ = grid.occupancy(0).to(device=device, dtype=torch.float32)[None, None]
    k = 2 * MASK_DILATION_CELLS + 1
    occ = torch.nn.functional.max_pool3d(occ, k, stride=1, padding=MASK_DILATION_CELLS)[0, 0] > 0
    r = occ.shape[0]
    idx = torch.clamp((torch.linspace(0, 1, res, device=device) * r).long(), max=r - 1)
    return occ[idx][:, idx][:, :, idx]


@torch.no_grad()
def density_grid(field, grid, half: float, res: int, device) -> np.ndarray:
    """Density at a (res,)^3 lattice of points from -half to half, 0 where the grid is empty."""
    axis = torch.linspace(-half, half, res, device=device)
    mask = occupied_mask(grid, res, device).reshape(-1)
    out = torch.zeros(res**3, device=device)
    where = mask.nonzero().squeeze(1)
    for s in range(0, where.numel(), SAMPLE_CHUNK):
        ids = where[s : s + SAMPLE_CHUNK]
        ix, iy, iz = ids // (res * res), (ids // res) % res, ids % res
        pts = torch.stack([axis[ix], axis[iy], axis[iz]], 1)
        out[ids] = field.density(pts).float()
    return out.reshape(res, res, res).cpu().numpy()


@torch.no_grad()
def vertex_colors(model, verts: np.ndarray, normals: np.ndarray, offset: float) -> np.ndarray:
    """RGB in [0, 1] at each vertex as a camera straight outside it sees the surface: a ray from
    `offset` out along the normal, rendered back through the vertex. The field's own colour at
    the level set is what lies at the fringe of the surface, which renders barely weigh."""
    from worker.nerf.rendering import render_image

    device = model.device
    n = torch.as_tensor(normals, dtype=torch.float32, device=device)
    n = torch.nn.functional.normalize(n, dim=-1)
    bad = ~torch.isfinite(n).all(1)
    n[bad] = torch.tensor([0.0, 0.0, 1.0], device=device)
    o = torch.as_tensor(verts, dtype=torch.float32, device=device) + offset * n
    rgb, _, alpha, _ = render_image(
        model.field,
        model.grid,
        o.contiguous(),
        (-n).contiguous(),
        torch.zeros(3, device=device),
        step=model.step_size,
        cone_angle=model.cone_angle,
        max_samples=model.config.max_samples_per_ray,
        alpha_threshold=model.config.alpha_threshold,
    )
    return (rgb / alpha.clamp_min(1e-3)[:, None]).clamp(0, 1).cpu().numpy()


def extract(model, resolution: int, threshold: float):
    """Marching cubes over the density; returns vertices and normals (normalised frame, normals
    pointing out of the dense side) and faces."""
    from skimage.measure import marching_cubes

    half = float(model.grid.half[0])
    vol = density_grid(model.field, model.grid, half, resolution, model.device)
    peak = float(vol.max()) if vol.size else 0.0
    if not peak > threshold:
        raise ExportError(
            f"no surface: the density never reaches the threshold {threshold:g} in the scene box "
            f"(its maximum is {peak:.3g}); give a lower `threshold`"
        )
    # A zero border closes every surface at the box's faces, so the mesh is watertight.
    vol = np.pad(vol, 1)
    spacing = 2 * half / (resolution - 1)
    verts, faces, normals, _ = marching_cubes(
        vol, level=threshold, spacing=(spacing,) * 3, gradient_direction="ascent"
    )
    verts = verts - half - spacing  # undo the padding: lattice point 1 sits at -half
    return verts.astype(np.float64), faces.astype(np.int64), normals.astype(np.float64)


def drop_small_pieces(verts: np.ndarray, faces: np.ndarray, normals: np.ndarray, min_piece: float):
    """Keep the connected pieces (faces joined by shared edges) with at least `min_piece` times
    the largest piece's face count. Returns verts, faces (reindexed), normals and the number of
    pieces dropped; whole pieces go, so a watertight mesh stays watertight."""
    import trimesh

    if min_piece <= 0 or not len(faces):
        return verts, faces, normals, 0
    labels = trimesh.graph.connected_component_labels(
        trimesh.graph.face_adjacency(faces=faces), node_count=len(faces)
    )
    sizes = np.bincount(labels)
    big = sizes >= min_piece * sizes.max()
    faces = faces[big[labels]]
    used = np.unique(faces)
    remap = np.zeros(len(verts), dtype=np.int64)
    remap[used] = np.arange(len(used))
    return verts[used], remap[faces], normals[used], int((~big).sum())


def mesh_export(model, fmt: str, options: ExportOptions):
    """The mesh file of `fmt` and its stats; `options` with the mesh defaults filled in
    (ExportOptions.with_defaults)."""
    import trimesh

    resolution = int(options.resolution)
    threshold = float(options.threshold)
    min_piece = float(options.min_piece)
    verts, faces, normals = extract(model, resolution, threshold)
    verts, faces, normals, dropped = drop_small_pieces(verts, faces, normals, min_piece)
    # two lattice cells out: outside the level set, before any neighbouring surface
    rgb = vertex_colors(
        model, verts, normals, offset=2 * 2 * float(model.grid.half[0]) / (resolution - 1)
    )
    rgba = np.concatenate(
        [np.clip(np.round(rgb * 255), 0, 255), np.full((len(rgb), 1), 255)], 1
    ).astype(np.uint8)
    mesh = trimesh.Trimesh(
        vertices=to_world(verts, model.normalization),
        faces=faces,
        vertex_normals=normals,
        vertex_colors=rgba,
        process=False,
    )
    data = mesh.export(file_type=fmt)
    if isinstance(data, str):
        data = data.encode()
    stats = {
        "vertices": int(len(mesh.vertices)),
        "faces": int(len(mesh.faces)),
        "watertight": bool(mesh.is_watertight),
        "bounds": mesh.bounds.tolist(),
        "resolution": resolution,
        "threshold": threshold,
        "min_piece": min_piece,
        "pieces_dropped": dropped,
    }
    return data, stats
