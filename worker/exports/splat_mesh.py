"""Meshes of a splat job: depth and colour rendered from the training cameras, fused into a
truncated signed distance volume (TSDF, Curless & Levoy 1996, as KinectFusion and Open3D's
ScalableTSDFVolume integrate depth maps), meshed by marching cubes at its zero level, decimated
to a triangle budget (quadric edge collapse, fast-simplification) and written with trimesh in the
dataset's world frame, as the nerf meshes are.

1. Every training camera (at most MAX_VIEWS, evenly spread) renders the Gaussians: the expected
   distance along each pixel's ray (kernels' depth, as the render API's) and the colour, with
   the alpha the Gaussians cover the pixel with.
2. The volume spans the points those depths put on the surface (pixels at least MIN_ALPHA
   covered; the 0.5 / 99.5 percentiles per axis, grown by a tenth), `resolution` voxels along
   its longest side; the truncation is TRUNCATION_VOXELS voxels.
3. Each view updates every voxel in front of its surface or within the truncation behind it:
   signed distance along the ray (rendered distance minus the voxel's), divided by the
   truncation and capped at 1, averaged over the views with weight 1; pixels the Gaussians do
   not cover (alpha under EMPTY_ALPHA: background) mark the voxels they see as empty, those
   between (silhouette edges) leave them alone. Colours are averaged likewise where the voxel is
   within the truncation.
4. Marching cubes (scikit-image) at 0, keeping the faces in cubes some view saw at every corner
   (inside a solid, past the truncation, nothing is known: no surface is made there); small pieces dropped as for nerf
   meshes (`min_piece`); decimated to about `target_faces`; vertex colours sampled from the
   colour volume (trilinear) at the final vertices.
"""

from __future__ import annotations

import numpy as np
import torch

from api_schemas.exports import ExportOptions
from worker.exports.common import ExportError, to_world
from worker.scene.cameras import RenderCamera

MAX_VIEWS = 64
MAX_RENDER_SIDE = 512
MIN_ALPHA = 0.5
EMPTY_ALPHA = 0.05  # a pixel covered less than this sees through: the voxels it sees are empty
TRUNCATION_VOXELS = 3.0
VOXEL_CHUNK = 1 << 21


def _views(meta: dict) -> list[dict]:
    frames = [f for f in meta["frames"] if f.get("split", "train") == "train"] or meta["frames"]
    if len(frames) > MAX_VIEWS:
        frames = [frames[i] for i in np.linspace(0, len(frames) - 1, MAX_VIEWS).round().astype(int)]
    return frames


def _camera(frame: dict) -> RenderCamera:
    s = min(1.0, MAX_RENDER_SIDE / max(frame["w"], frame["h"]))
    w, h = max(1, round(frame["w"] * s)), max(1, round(frame["h"] * s))
    sx, sy = w / frame["w"], h / frame["h"]
    c2w = np.eye(4)
    c2w[:3] = np.asarray(frame["c2w"], np.float64)[:3, :4]
    return RenderCamera(
        torch.tensor(c2w, dtype=torch.float32),
        float(frame["fx"]) * sx,
        float(frame["fy"]) * sy,
        float(frame["cx"]) * sx,
        float(frame["cy"]) * sy,
        w,
        h,
    )


@torch.no_grad()
def render_views(
    model, meta: dict
) -> list[tuple[RenderCamera, torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(camera, distance along the ray (H, W), colour (H, W, 3), alpha (H, W)) per view, in the
    normalised frame, on the CPU."""
    from worker.splat import model as gm

    black = torch.zeros(3, device=model.device)
    out = []
    for frame in _views(meta):
        cam = _camera(frame)
        r = gm.render(model.params, cam, black, model.degree, "tiled", model.antialiased)
        depth = gm.render_depth(model.params, cam, r)
        alpha = r.alpha.detach()
        rgb = (r.rgb.detach() / alpha.clamp_min(1e-4)[..., None]).clamp(0, 1)
        out.append((cam, depth.float().cpu(), rgb.float().cpu(), alpha.float().cpu()))
    return out


def _rays(cam: RenderCamera) -> torch.Tensor:
    """Unit ray directions (H, W, 3) of a camera's pixel centres, in the world (normalised) frame."""
    x = (torch.arange(cam.width) + 0.5 - cam.cx) / cam.fx
    y = (torch.arange(cam.height) + 0.5 - cam.cy) / cam.fy
    d = torch.stack(torch.broadcast_tensors(x[None, :], -y[:, None], -torch.ones(1, 1)), -1)
    d = torch.nn.functional.normalize(d, dim=-1)  # OpenGL camera axes
    return d @ cam.c2w[:3, :3].T.cpu()


def surface_bounds(views) -> tuple[np.ndarray, np.ndarray]:
    pts = []
    for cam, depth, _, alpha in views:
        hit = (alpha >= MIN_ALPHA) & (depth > 0)
        if hit.any():
            pts.append(cam.c2w[:3, 3].cpu() + _rays(cam)[hit] * depth[hit, None])
    if not pts:
        raise ExportError(
            "no surface: no training view sees the Gaussians cover a pixel "
            f"(alpha {MIN_ALPHA:g} or more)"
        )
    p = torch.cat(pts).double().numpy()
    lo, hi = np.percentile(p, 0.5, axis=0), np.percentile(p, 99.5, axis=0)
    pad = 0.1 * (hi - lo).max() + 1e-6
    return lo - pad, hi + pad


def fuse(views, lo: np.ndarray, hi: np.ndarray, resolution: int):
    """(tsdf (X, Y, Z), weight, colour (X, Y, Z, 3), voxel size): the views fused on a lattice of
    points from `lo` with `resolution` voxels along the longest side."""
    voxel = float((hi - lo).max()) / resolution
    dims = tuple(int(np.ceil((hi[i] - lo[i]) / voxel)) + 1 for i in range(3))
    trunc = TRUNCATION_VOXELS * voxel
    n = dims[0] * dims[1] * dims[2]
    tsdf = torch.ones(n)
    weight = torch.zeros(n)
    colour = torch.zeros(n, 3)
    cweight = torch.zeros(n)
    origin = torch.tensor(lo, dtype=torch.float32)
    for cam, depth, rgb, alpha in views:
        rot, eye = cam.c2w[:3, :3].cpu(), cam.c2w[:3, 3].cpu()
        for s in range(0, n, VOXEL_CHUNK):
            ids = torch.arange(s, min(n, s + VOXEL_CHUNK))
            ijk = torch.stack(
                [ids // (dims[1] * dims[2]), (ids // dims[2]) % dims[1], ids % dims[2]], 1
            )
            p = origin + ijk.float() * voxel
            local = (p - eye) @ rot  # OpenGL camera axes: x right, y up, looking along -z
            z = -local[:, 2]
            front = z > 1e-3
            u = torch.floor(cam.fx * local[:, 0] / z.clamp_min(1e-3) + cam.cx).long()
            v = torch.floor(-cam.fy * local[:, 1] / z.clamp_min(1e-3) + cam.cy).long()
            seen = front & (u >= 0) & (u < cam.width) & (v >= 0) & (v < cam.height)
            if not seen.any():
                continue
            idx, uu, vv = ids[seen], u[seen], v[seen]
            a, d = alpha[vv, uu], depth[vv, uu]
            dist = local[seen].norm(dim=1)
            surface = (a >= MIN_ALPHA) & (d > 0)
            sdf = torch.where(surface, d - dist, torch.full_like(d, float("inf")))
            # pixels the Gaussians half cover (silhouettes) say neither surface nor empty
            upd = (sdf >= -trunc) & (surface | (a < EMPTY_ALPHA))
            idx, sdf, uu, vv = idx[upd], sdf[upd], uu[upd], vv[upd]
            val = (sdf / trunc).clamp(max=1.0)
            w = weight[idx]
            tsdf[idx] = (tsdf[idx] * w + val) / (w + 1)
            weight[idx] = w + 1
            near = sdf.abs() < trunc
            cidx = idx[near]
            cw = cweight[cidx]
            colour[cidx] = (colour[cidx] * cw[:, None] + rgb[vv[near], uu[near]]) / (cw + 1)[
                :, None
            ]
            cweight[cidx] = cw + 1
    shape = dims
    return (
        tsdf.reshape(shape).numpy(),
        weight.reshape(shape).numpy(),
        colour.reshape(*shape, 3).numpy(),
        voxel,
    )


def observed_cells(seen: np.ndarray) -> np.ndarray:
    """True at the lattice points whose cube (the point and its 7 neighbours up each axis) some
    view saw at every corner: a cube reaching into the unseen inside of a solid (past the
    truncation) would close a second, inner shell against the volume's default value."""
    cells = seen.copy()
    for dx in (0, 1):
        for dy in (0, 1):
            for dz in (0, 1):
                cells[: -1 or None, : -1 or None, : -1 or None] &= seen[
                    dx : seen.shape[0] - 1 + dx,
                    dy : seen.shape[1] - 1 + dy,
                    dz : seen.shape[2] - 1 + dz,
                ]
    cells[-1], cells[:, -1], cells[:, :, -1] = False, False, False
    return cells


def _sample_colours(colour: np.ndarray, lattice_pts: np.ndarray) -> np.ndarray:
    from scipy.ndimage import map_coordinates

    coords = lattice_pts.T
    return np.stack(
        [map_coordinates(colour[..., c], coords, order=1, mode="nearest") for c in range(3)], 1
    ).clip(0, 1)


def decimate(verts: np.ndarray, faces: np.ndarray, target: int):
    """Quadric edge collapse (fast-simplification) to about `target` faces; unchanged at or
    under it (or with target 0)."""
    if not target or len(faces) <= target:
        return verts, faces
    import fast_simplification

    v, f = fast_simplification.simplify(
        verts.astype(np.float64), faces.astype(np.int64), target_reduction=1 - target / len(faces)
    )
    return np.asarray(v, np.float64), np.asarray(f, np.int64)


def splat_mesh_export(model, meta: dict, options: ExportOptions):
    """The mesh file of options.format (glb, ply, obj) and its stats; `options` with the mesh
    defaults filled in (ExportOptions.with_defaults(mesh, splat))."""
    import trimesh
    from skimage.measure import marching_cubes

    from worker.exports.nerf_mesh import drop_small_pieces

    resolution, target = int(options.resolution), int(options.target_faces)
    views = render_views(model, meta)
    lo, hi = surface_bounds(views)
    tsdf, weight, colour, voxel = fuse(views, lo, hi, resolution)
    seen = weight > 0
    if not (tsdf[seen] < 0).any() or not (tsdf[seen] > 0).any():
        raise ExportError("no surface: the fused depth maps never cross the volume's zero level")
    verts, faces, normals, _ = marching_cubes(tsdf, level=0.0)
    # faces only in cubes some view saw at every corner (each face lies in one cube)
    cube = np.floor(verts[faces].mean(1)).astype(np.int64)
    faces = faces[observed_cells(seen)[cube[:, 0], cube[:, 1], cube[:, 2]]]
    verts, faces, normals, dropped = drop_small_pieces(
        verts.astype(np.float64), faces.astype(np.int64), normals, float(options.min_piece)
    )
    before = int(len(faces))
    verts, faces = decimate(verts, faces, target)  # lattice units
    rgb = _sample_colours(colour, verts)
    rgba = np.concatenate(
        [np.clip(np.round(rgb * 255), 0, 255), np.full((len(rgb), 1), 255)], 1
    ).astype(np.uint8)
    mesh = trimesh.Trimesh(
        vertices=to_world(lo + verts * voxel, model.normalization),
        faces=faces,
        vertex_colors=rgba,
        process=False,
    )
    # marching cubes winds faces with the gradient; the TSDF grows outwards, so flip if inverted
    if mesh.is_volume and mesh.volume < 0:
        mesh.invert()
    data = mesh.export(file_type=options.format)
    if isinstance(data, str):
        data = data.encode()
    scale = float(model.normalization["scale"]) if model.normalization else 1.0
    stats = {
        "vertices": int(len(mesh.vertices)),
        "faces": int(len(mesh.faces)),
        "faces_before_decimation": before,
        "watertight": bool(mesh.is_watertight),
        "bounds": mesh.bounds.tolist(),
        "resolution": resolution,
        "voxel_size": voxel / scale,
        "views": len(views),
        "target_faces": target,
        "pieces_dropped": dropped,
        "format": options.format,
    }
    return data, stats
