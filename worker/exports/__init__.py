"""Exports of trained scenes (task `nf.export`): meshes and point clouds of nerf jobs; the 3DGS
PLY, `.splat`, `.spz`, SOG, compressed PLY and glTF files, meshes and point clouds of splat jobs. The API has validated the format against the
job's kind and the options against the format (api_schemas/exports.py); state is kept in
the exports table (core/exports.py) and the file is written to the job's artifacts."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from api_schemas.exports import MESH_FORMATS, ExportFormat, ExportOptions, ExportStatus
from api_schemas.jobs import JobKind
from core.exports import ExportNotFound, ExportStore
from core.leases import LeaseLost
from core.storage import without_paths
from core.store import JobNotFound, JobStore
from worker.configs import stored_config
from worker.exports.common import ExportError

log = logging.getLogger(__name__)
STEMS = {
    ExportFormat.glb: ("mesh", "glb"),
    ExportFormat.ply: ("mesh", "ply"),
    ExportFormat.obj: ("mesh", "obj"),
    ExportFormat.point_cloud: ("points", "ply"),
    ExportFormat.gaussians: ("gaussians", "ply"),
    ExportFormat.splat: ("scene", "splat"),
    ExportFormat.spz: ("scene", "spz"),
    ExportFormat.sog: ("scene", "sog"),
    ExportFormat.compressed_ply: ("scene", "compressed.ply"),
    ExportFormat.mesh: ("mesh", "glb"),  # the extension is options.format's
}
# formats whose file differs by the job's kind: a splat job's glb holds its Gaussians
STEMS_BY_KIND = {(JobKind.splat, ExportFormat.glb): ("scene", "glb")}


def artifact_name(
    export_id: str,
    fmt: ExportFormat,
    kind: JobKind | str | None = None,
    options: dict[str, Any] | None = None,
) -> str:
    fmt = ExportFormat(fmt)
    stem, ext = STEMS_BY_KIND.get((JobKind(kind) if kind else None, fmt), STEMS[fmt])
    if fmt == ExportFormat.mesh:
        ext = (options or {}).get("format") or ext
    return f"{stem}-{export_id[:8]}.{ext}"


def export_options(
    fmt: ExportFormat, stored: dict[str, Any], kind: JobKind | str | None = None
) -> ExportOptions:
    """An export's options as stored (as the client gave them), validated once, with each option
    the format reads (for a job of `kind`) and the client left out filled in from the schema's
    defaults."""
    kind = JobKind(kind) if kind else None
    return stored_config(ExportOptions, stored, "export options").with_defaults(fmt, kind)


def _nerf(job, checkpoint, paths, fmt: ExportFormat, stored: dict[str, Any]):
    from worker.jobs.nerf import JOB

    options = export_options(fmt, stored, JobKind.nerf)
    model, _ = JOB.model_for(checkpoint)
    if fmt in MESH_FORMATS:
        from worker.exports.nerf_mesh import mesh_export

        return mesh_export(model, fmt.value, options)
    from worker.exports.nerf_points import nerf_point_cloud
    from worker.scene.dataset import Dataset, read_meta

    dataset = Dataset(paths.dataset, "train", read_meta(paths.dataset))
    return nerf_point_cloud(model, dataset, int(options.n_points))


def _splat(job, checkpoint, paths, fmt: ExportFormat, stored: dict[str, Any]):
    from worker.exports.splat_files import splat_bytes, splat_point_cloud
    from worker.jobs.splat import JOB

    options = export_options(fmt, stored, JobKind.splat)

    model, _ = JOB.model_for(checkpoint)
    if fmt == ExportFormat.gaussians:
        from worker.splat.ply import ply_bytes

        return ply_bytes(model.params, model.normalization, model.antialiased), {
            "gaussians": len(model.params["means"])
        }
    if fmt == ExportFormat.splat:
        data, n = splat_bytes(model.params, model.normalization, options.min_opacity)
        return data, {"gaussians": n}
    if fmt == ExportFormat.spz:
        from worker.exports.spz import spz_bytes

        data, n = spz_bytes(
            model.params,
            model.normalization,
            model.antialiased,
            options.min_opacity,
            int(options.version),
        )
        stats = {"gaussians": n, "antialiased": model.antialiased, "version": int(options.version)}
        return data, stats
    writers = {
        ExportFormat.sog: ("worker.exports.sog", "sog_bytes"),
        ExportFormat.compressed_ply: ("worker.exports.compressed_ply", "compressed_ply_bytes"),
        ExportFormat.glb: ("worker.exports.gltf_splat", "glb_bytes"),
    }
    if fmt in writers:
        import importlib

        module, name = writers[fmt]
        write = getattr(importlib.import_module(module), name)
        data, n = write(model.params, model.normalization, model.antialiased, options.min_opacity)
        return data, {"gaussians": n, "antialiased": model.antialiased}
    if fmt == ExportFormat.mesh:
        from worker.exports.splat_mesh import splat_mesh_export
        from worker.scene.dataset import read_meta

        return splat_mesh_export(model, read_meta(paths.dataset), options)
    return splat_point_cloud(
        model.params,
        model.normalization,
        int(options.n_points),
        float(options.min_opacity),
    )


MAKERS: dict[str, Callable] = {"nerf": _nerf, "splat": _splat}
# (kind, format) of the exports that read the training photos besides the checkpoint
NEEDS_DATASET = {("nerf", ExportFormat.point_cloud), ("splat", ExportFormat.mesh)}


def short_error(exc: BaseException) -> str:
    if isinstance(exc, ExportError):
        return str(exc)
    msg = without_paths(str(exc).strip())  # job.error-like text reaches the client
    return f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__


def execute(
    store: JobStore, job_id: str, export_id: str, load_checkpoint: Callable, work_dir: Callable
) -> None:
    """Run one export to the end: running -> succeeded (artifact stored) or failed (error).
    `work_dir(storage, job_id)` holds the job's working copy, `load_checkpoint(job_id, paths,
    storage)` brings the newest checkpoint into it and loads it (worker.tasks)."""
    exports = ExportStore(store.storage)
    try:
        job = store.get(job_id)
        exports.get(job_id, export_id)
    except (JobNotFound, ExportNotFound, ValueError):
        log.warning("nf.export: job %s has no export %s (deleted?)", job_id, export_id)
        return
    with exports.running(job_id, export_id) as claim:
        if claim is None:  # a second delivery while a live worker runs it
            log.info("nf.export: %s/%s is being run by another worker", job_id, export_id)
            return
        export = exports.get(job_id, export_id)
        if export.status in (ExportStatus.succeeded, ExportStatus.failed):
            return
        cap = exports.settings.max_worker_losses
        if claim.losses >= cap:
            exports.update(
                job_id,
                export_id,
                status=ExportStatus.failed,
                error=f"worker lost {claim.losses} times (MAX_WORKER_LOSSES={cap}): the export "
                "process died each time (out of memory? a crash?)",
            )
            return
        exports.update(job_id, export_id, status=ExportStatus.running, error=None)
        _run(store, exports, job, export, load_checkpoint, work_dir, claim)


def _run(
    store: JobStore,
    exports: ExportStore,
    job,
    export,
    load_checkpoint: Callable,
    work_dir: Callable,
    claim=None,
) -> None:
    """The export under its lease's `claim`: every update of its row is fenced by it (core/
    exports.py), and one whose lease was lost (`claim.lost`) stores no file and writes nothing
    (LeaseLost, the export is its new holder's)."""
    job_id, export_id = job.id, export.id
    storage = store.storage
    try:
        maker = MAKERS.get(job.kind.value)
        if maker is None:
            raise ExportError(f"{job.kind.value} jobs have no exports")
        with work_dir(storage, job_id) as paths:
            checkpoint = load_checkpoint(job_id, paths, storage)
            if (job.kind.value, export.format) in NEEDS_DATASET:
                storage.pull(job_id, "dataset/")
            data, stats = maker(job, checkpoint, paths, export.format, export.options)
        name = artifact_name(export_id, export.format, job.kind, export.options)
        if claim is not None and claim.lost.is_set():
            raise LeaseLost(f"the export lease of {job_id}/{export_id} was lost")
        storage.put_bytes(job_id, f"artifacts/{name}", data)
    except LeaseLost:
        raise
    except Exception as exc:
        if not isinstance(exc, ExportError):
            log.exception("export %s of job %s failed", export_id, job_id)
        exports.update(job_id, export_id, status=ExportStatus.failed, error=short_error(exc))
        return
    exports.update(
        job_id,
        export_id,
        status=ExportStatus.succeeded,
        artifact=name,
        url=f"/v1/jobs/{job_id}/artifacts/{name}",
        size=len(data),
        stats=stats,
    )
