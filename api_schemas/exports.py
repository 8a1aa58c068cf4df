"""Export wire types: what `POST /v1/jobs/{id}/exports` accepts and what it answers.

An export turns a trained scene into a file other tools open (a mesh, a point cloud, a splat
file). It runs on a worker; the answer is its state, and the file lands in the job's artifacts.
Everything exported is in the dataset's own world frame (the normalisation is undone)."""

from __future__ import annotations

from datetime import datetime
from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from api_schemas.jobs import JobKind


class ExportFormat(str, Enum):
    # nerf: a mesh, binary glTF 2.0 with vertex colours; splat: the Gaussians themselves in glTF
    # 2.0 with Khronos' KHR_gaussian_splatting extension (a point primitive)
    glb = "glb"
    ply = "ply"  # mesh, binary PLY with vertex colours
    obj = "obj"  # mesh, Wavefront OBJ (vertex colours as the common `v x y z r g b` extension)
    point_cloud = "point_cloud"  # coloured points, binary PLY
    gaussians = "gaussians"  # the 3D Gaussian splatting reference PLY (all SH coefficients)
    splat = "splat"  # antimatter15/splat's 32-byte-per-Gaussian layout, for web viewers
    spz = "spz"  # Niantic's compressed splat format (quantised; version 4 ZSTD or 3 gzip)
    sog = "sog"  # PlayCanvas' SOG: meta.json + lossless WebP textures, zipped (SuperSplat's .sog)
    compressed_ply = "compressed_ply"  # SuperSplat's chunked, quantised .compressed.ply
    mesh = "mesh"  # splat: a surface fused from rendered depth (TSDF), as GLB, PLY or OBJ


FORMATS_BY_KIND: dict[JobKind, tuple[ExportFormat, ...]] = {
    JobKind.nerf: (ExportFormat.glb, ExportFormat.ply, ExportFormat.obj, ExportFormat.point_cloud),
    JobKind.splat: (
        ExportFormat.gaussians,
        ExportFormat.splat,
        ExportFormat.spz,
        ExportFormat.sog,
        ExportFormat.compressed_ply,
        ExportFormat.glb,
        ExportFormat.mesh,
        ExportFormat.point_cloud,
    ),
    JobKind.image: (),
}
MESH_FORMATS = (ExportFormat.glb, ExportFormat.ply, ExportFormat.obj)
# Formats of the splat files (the Gaussians, written in another layout).
SPLAT_FILE_FORMATS = (
    ExportFormat.gaussians,
    ExportFormat.splat,
    ExportFormat.spz,
    ExportFormat.sog,
    ExportFormat.compressed_ply,
)
MESH_FILE_FORMATS = ("glb", "ply", "obj")
SPZ_VERSIONS = (3, 4)
# The option each format reads; any other option given is refused (422), so a typo or an option
# of another format never silently exports the default. A format whose meaning depends on the
# job's kind (glb: a nerf mesh, splat Gaussians) has its splat entry in OPTIONS_BY_KIND_FORMAT.
OPTIONS_BY_FORMAT: dict[ExportFormat, tuple[str, ...]] = {
    **{f: ("resolution", "threshold", "min_piece") for f in MESH_FORMATS},
    ExportFormat.point_cloud: ("n_points", "min_opacity"),
    ExportFormat.gaussians: (),
    ExportFormat.splat: ("min_opacity",),
    ExportFormat.spz: ("min_opacity", "version"),
    ExportFormat.sog: ("min_opacity",),
    ExportFormat.compressed_ply: ("min_opacity",),
    ExportFormat.mesh: ("format", "resolution", "target_faces", "min_piece"),
}
OPTIONS_BY_KIND_FORMAT: dict[tuple[JobKind, ExportFormat], tuple[str, ...]] = {
    (JobKind.splat, ExportFormat.glb): ("min_opacity",),
}
DEFAULT_RESOLUTION = 256
# Density (per normalised length; the scene box is [-1, 1]^3 at aabb_scale 1) of the level set
# a mesh follows. instant-ngp's default, 2.5 per unit of its [0, 1]^3 cube, is 1.25 here, which
# on short trainings wraps the floaters around a scene too; at 5 the synthetic scenes' meshes
# match their analytic bounds within a few hundredths (docs/exports.md).
DEFAULT_THRESHOLD = 5.0
# Connected pieces of a mesh with fewer faces than this share of the largest piece's are dropped:
# short trainings leave specks of density (floaters) that a level set turns into small closed
# blobs far from the scene, which no viewer wants and which spoil the mesh's bounds.
DEFAULT_MIN_PIECE = 0.01
DEFAULT_POINTS = 200_000
# Point clouds of splat jobs leave out Gaussians fainter than this: the faint ones are mostly
# floaters and the fading tails a densification leaves behind. Splat files keep every Gaussian
# (their viewers composite the faint ones as the trainer did).
DEFAULT_POINT_MIN_OPACITY = 0.05
DEFAULT_FILE_MIN_OPACITY = 0.0
# SPZ's current version (ZSTD streams), what SuperSplat writes and the PlayCanvas engine reads;
# version 3 (one gzip stream) for older readers.
DEFAULT_SPZ_VERSION = 4
# A splat job's mesh: TSDF voxels along the scene box's longest side, and the triangle count the
# mesh is decimated to (quadric edge collapse), so that a web viewer opens it.
DEFAULT_SPLAT_MESH_RESOLUTION = 256
DEFAULT_TARGET_FACES = 200_000
# What each format reads when an option is left out: the one statement of these defaults.
DEFAULTS_BY_FORMAT: dict[ExportFormat, dict[str, float | int]] = {
    **{
        f: {
            "resolution": DEFAULT_RESOLUTION,
            "threshold": DEFAULT_THRESHOLD,
            "min_piece": DEFAULT_MIN_PIECE,
        }
        for f in MESH_FORMATS
    },
    ExportFormat.point_cloud: {
        "n_points": DEFAULT_POINTS,
        "min_opacity": DEFAULT_POINT_MIN_OPACITY,
    },
    ExportFormat.gaussians: {},
    ExportFormat.splat: {"min_opacity": DEFAULT_FILE_MIN_OPACITY},
    ExportFormat.spz: {"min_opacity": DEFAULT_FILE_MIN_OPACITY, "version": DEFAULT_SPZ_VERSION},
    ExportFormat.sog: {"min_opacity": DEFAULT_FILE_MIN_OPACITY},
    ExportFormat.compressed_ply: {"min_opacity": DEFAULT_FILE_MIN_OPACITY},
    ExportFormat.mesh: {
        "format": "glb",
        "resolution": DEFAULT_SPLAT_MESH_RESOLUTION,
        "target_faces": DEFAULT_TARGET_FACES,
        "min_piece": DEFAULT_MIN_PIECE,
    },
}
DEFAULTS_BY_KIND_FORMAT: dict[tuple[JobKind, ExportFormat], dict[str, float | int]] = {
    (JobKind.splat, ExportFormat.glb): {"min_opacity": DEFAULT_FILE_MIN_OPACITY},
}
assert all(set(DEFAULTS_BY_FORMAT[f]) == set(OPTIONS_BY_FORMAT[f]) for f in ExportFormat)
assert all(set(DEFAULTS_BY_KIND_FORMAT[k]) == set(v) for k, v in OPTIONS_BY_KIND_FORMAT.items())


def options_for(fmt: ExportFormat, kind: JobKind | None = None) -> tuple[str, ...]:
    """The options `fmt` reads for a job of `kind` (None: the kind-independent table)."""
    fmt = ExportFormat(fmt)
    if kind is not None and (JobKind(kind), fmt) in OPTIONS_BY_KIND_FORMAT:
        return OPTIONS_BY_KIND_FORMAT[(JobKind(kind), fmt)]
    return OPTIONS_BY_FORMAT[fmt]


def defaults_for(fmt: ExportFormat, kind: JobKind | None = None) -> dict[str, Any]:
    fmt = ExportFormat(fmt)
    if kind is not None and (JobKind(kind), fmt) in DEFAULTS_BY_KIND_FORMAT:
        return DEFAULTS_BY_KIND_FORMAT[(JobKind(kind), fmt)]
    return DEFAULTS_BY_FORMAT[fmt]


class ExportOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    resolution: int | None = Field(
        None,
        ge=16,
        description=f"mesh: marching-cubes cells (nerf) or TSDF voxels (splat) along the scene "
        f"box's side (default {DEFAULT_RESOLUTION}, at most MAX_EXPORT_RESOLUTION)",
    )
    threshold: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description=f"mesh: the density level set extracted, in 1/normalised length (default "
        f"{DEFAULT_THRESHOLD})",
    )
    min_piece: float | None = Field(
        None,
        ge=0,
        le=1,
        description=f"mesh: connected pieces with fewer faces than this share of the largest "
        f"piece's are dropped (default {DEFAULT_MIN_PIECE}; 0 keeps every piece)",
    )
    n_points: int | None = Field(
        None,
        ge=1,
        le=10_000_000,
        description=f"point_cloud: at most this many points (default {DEFAULT_POINTS})",
    )
    min_opacity: float | None = Field(
        None,
        ge=0,
        lt=1,
        description="splat jobs: Gaussians fainter than this are left out (default "
        f"{DEFAULT_POINT_MIN_OPACITY} for point clouds, {DEFAULT_FILE_MIN_OPACITY} for .splat "
        "and the other splat files)",
    )
    version: Literal[3, 4] | None = Field(
        None,
        description="spz: the file version, 4 (ZSTD streams, default) or 3 (one gzip stream, "
        "for older readers)",
    )
    format: Literal["glb", "ply", "obj"] | None = Field(
        None, description="mesh (splat jobs): the mesh file written (default glb)"
    )
    target_faces: int | None = Field(
        None,
        ge=0,
        le=10_000_000,
        description=f"mesh (splat jobs): decimate to about this many triangles (default "
        f"{DEFAULT_TARGET_FACES}; 0 keeps every triangle)",
    )

    def with_defaults(self, fmt: ExportFormat, kind: JobKind | None = None) -> ExportOptions:
        """These options with the ones `fmt` reads (for a job of `kind`) and the request left
        out filled in from DEFAULTS_BY_FORMAT / DEFAULTS_BY_KIND_FORMAT."""
        given = self.model_dump(exclude_none=True)
        return self.model_copy(update={**defaults_for(fmt, kind), **given})


class ExportRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: ExportFormat
    options: ExportOptions = Field(default_factory=ExportOptions)


class ExportStatus(str, Enum):
    queued = "queued"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"

    @property
    def terminal(self) -> bool:
        return self in (ExportStatus.succeeded, ExportStatus.failed)


class Export(BaseModel):
    id: str = Field(..., description="the same format and options give the same id")
    job_id: str
    format: ExportFormat
    options: dict[str, Any] = Field(default_factory=dict, description="as given (no defaults)")
    status: ExportStatus = ExportStatus.queued
    created_at: datetime
    updated_at: datetime
    artifact: str | None = Field(None, description="file name in the job's artifacts when done")
    url: str | None = Field(None, description="where to download it (the artifact route)")
    size: int | None = None
    stats: dict[str, Any] = Field(
        default_factory=dict,
        description="what was written: vertices, faces, points, gaussians, bounds (world units)",
    )
    error: str | None = None


class ExportList(BaseModel):
    items: list[Export]
