"""Trainers, renderers and exports read typed configs (worker/configs.py): no worker module looks
a config, request or option up by a string key (where a default would be restated); every field
of the config schemas is read by the worker from the model, so the schema's defaults are the
ones that train; job configs and checkpoint configs stored in an older shape still load."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from api_schemas.exports import (
    DEFAULT_POINT_MIN_OPACITY,
    DEFAULTS_BY_FORMAT,
    OPTIONS_BY_FORMAT,
    ExportFormat,
    ExportOptions,
)
from api_schemas.image import ImageConfig
from api_schemas.jobs import Job, JobKind
from api_schemas.nerf import NerfConfig
from api_schemas.render import RenderRequest
from api_schemas.splat import SplatConfig
from experiments.synthetic_scene import make_scene
from worker.checkpoints import CheckpointManager
from worker.configs import ConfigError, job_config, stored_config, trained_config
from worker.exports import export_options

WORKER = Path(__file__).resolve().parents[2] / "worker"
# Names (and attributes) the worker gives configs, render requests and export options.
HOLDER_NAMES = {"config", "cfg", "c", "conf", "request", "req", "options", "opts", "orbit"}
HOLDER_ATTRS = {"config", "request", "options"}

SMALL_NERF = dict(
    steps=6,
    samples_per_step=2048,
    max_rays_per_step=256,
    log2_hashmap_size=14,
    n_levels=4,
    max_resolution=64,
    occupancy_resolution=16,
    occupancy_update_every=2,
    occupancy_warmup_steps=2,
    max_samples_per_ray=64,
    checkpoint_every=3,
    n_test_renders=1,
)


def _holder(node: ast.AST) -> bool:
    if isinstance(node, ast.Name):
        return node.id in HOLDER_NAMES
    return isinstance(node, ast.Attribute) and node.attr in HOLDER_ATTRS


def _string_lookups(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for n in ast.walk(tree):
        if (
            isinstance(n, ast.Subscript)
            and _holder(n.value)
            and isinstance(n.slice, ast.Constant)
            and isinstance(n.slice.value, str)
        ) or (
            isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute)
            and n.func.attr == "get"
            and _holder(n.func.value)
            and n.args
            and isinstance(n.args[0], ast.Constant)
            and isinstance(n.args[0].value, str)
        ):
            found.append((n.lineno, ast.unparse(n)))
    return found


def test_the_scan_finds_string_lookups():
    tree = ast.parse(
        "a = config['steps']\nb = self.config.get('seed', 0)\nc = request['width']\n"
        "d = opts.get('n_points')\ne = meta['config']\nf = config.steps\n"
    )
    assert [code for _, code in _string_lookups(tree)] == [
        "config['steps']",
        "self.config.get('seed', 0)",
        "request['width']",
        "opts.get('n_points')",
    ]


def test_no_worker_module_reads_a_config_by_string_key():
    offenders = [
        f"{path.relative_to(WORKER.parent)}:{line}: {code}"
        for path in sorted(WORKER.rglob("*.py"))
        for line, code in _string_lookups(ast.parse(path.read_text(), str(path)))
    ]
    assert not offenders, "read the typed config's attribute instead:\n" + "\n".join(offenders)


# -- stored configs in older shapes --------------------------------------------------------------
def _job(kind: str, config: dict) -> Job:
    now = "2026-01-01T00:00:00Z"
    return Job(id="j1", kind=kind, created_at=now, updated_at=now, config=config)


def test_a_job_config_in_an_older_shape_validates_and_a_bad_value_names_its_field():
    stored = NerfConfig(steps=77).model_dump(mode="json")
    del stored["pixel_jitter"], stored["error_map_share"]  # keys a later schema added
    stored["a_dropped_option"] = 3  # a key a later schema no longer has
    cfg = job_config(_job("nerf", stored))
    assert isinstance(cfg, NerfConfig) and cfg.steps == 77
    assert cfg.pixel_jitter == NerfConfig().pixel_jitter
    assert cfg.error_map_share == NerfConfig().error_map_share
    assert isinstance(job_config(_job("splat", {"steps": 5})), SplatConfig)
    assert job_config(_job("image", {"hidden": 16})) == ImageConfig(hidden=16)
    with pytest.raises(ConfigError, match="steps"):
        job_config(_job("nerf", {**stored, "steps": 0}))


def test_a_checkpoint_config_keeps_values_the_schema_now_refuses():
    # log2_hashmap_size 12 passed the schema of the release that trained it (ge=10 then)
    saved = {"steps": 100, "log2_hashmap_size": 12, "sh_degree": 3, "old_key": True}
    cfg = trained_config(NerfConfig, saved)
    assert cfg.log2_hashmap_size == 12 and cfg.sh_degree == 3 and cfg.steps == 100
    assert cfg.lr == NerfConfig().lr  # absent: the schema's default
    assert not hasattr(cfg, "old_key")
    with pytest.raises(ConfigError):
        stored_config(NerfConfig, saved)


def _nerf_dataset(tmp_path: Path) -> Path:
    from service.intake.nerf import validate_upload

    z = make_scene(tmp_path / "scene.zip", size=16, n_train=6, n_test=2)
    job = tmp_path / "job"
    job.mkdir()
    validate_upload(z, "scene.zip", {}, job, None)
    return job / "dataset"


def test_a_checkpoint_written_with_an_older_config_shape_renders_and_resumes(tmp_path):
    """The meta of a checkpoint as worker/checkpoints.py writes it (step + the trainer's state
    meta), with its config in the shape of an older release: keys added since missing, a key
    since removed present. It renders, and a job whose config is that one filled with today's
    defaults resumes from it instead of starting over."""
    from worker.jobs.nerf import JOB, NerfModel
    from worker.nerf.trainer import NerfTrainer
    from worker.scene.dataset import Dataset, read_meta

    ds = _nerf_dataset(tmp_path)
    meta = read_meta(ds)
    job_cfg = NerfConfig(**SMALL_NERF)
    trainer = NerfTrainer(job_cfg, meta, "cpu", Dataset(ds, "train", meta))
    for _ in range(2):
        trainer.train_step()
    tensors, state_meta = trainer.state()
    old = job_cfg.model_dump(mode="json")
    for added in ("pixel_jitter", "error_map_share", "mlp_precision", "long_side", "downscale"):
        del old[added]
    old["max_train_rays"] = 4096  # an option an older release had
    state_meta["config"] = old
    mgr = CheckpointManager(tmp_path / "job" / "checkpoints")
    mgr.save(trainer.step, tensors, state_meta)

    ckpt = CheckpointManager(tmp_path / "job" / "checkpoints").load_latest()
    assert ckpt.meta["config"] == old and ckpt.meta["step"] == 2
    model = NerfModel(ckpt, torch.device("cpu"))
    assert model.config.max_samples_per_ray == 64 and model.config.pixel_jitter == 1.0
    assert torch.equal(model.field.encoding.params, trainer.field.encoding.params)
    request = RenderRequest.model_validate(
        {"width": 8, "height": 6, "camera": {"look_at": {"eye": [0, -3, 1], "target": [0, 0, 0]}}}
    )
    png, content_type = JOB.render(None, ckpt, request)
    assert content_type == "image/png" and png[:4] == b"\x89PNG"

    resumed = NerfTrainer(job_cfg, meta, "cpu", Dataset(ds, "train", meta))
    ctx = SimpleNamespace(
        config=job_cfg,
        checkpoints=SimpleNamespace(load_latest=lambda: ckpt, saved_step=None),
        job=SimpleNamespace(id="j1"),
    )
    JOB.resume(ctx, resumed)
    assert resumed.step == 2
    other = NerfTrainer(job_cfg.model_copy(update={"lr": 2 * job_cfg.lr}), meta, "cpu")
    ctx.config = other.requested_config
    JOB.resume(ctx, other)
    assert other.step == 0  # another config: the checkpoint is not this run's


# -- every schema default reaches the worker -------------------------------------------------------
def test_a_changed_schema_default_reaches_the_trainers(tmp_path):
    """Defaults are stated once, in the schema: a copy of a schema with other defaults trains
    with those."""
    from worker.jobs.image import model_from_config
    from worker.nerf.trainer import NerfTrainer

    class OtherNerf(NerfConfig):
        lr: float = 0.0123
        pixel_jitter: float = 0.25
        max_rays_per_step: int = 100

    meta = {"aabb": [[-1.0] * 3, [1.0] * 3], "frames": []}
    t = NerfTrainer(OtherNerf(log2_hashmap_size=14, n_levels=2), meta, "cpu")
    assert t.lr_at(0) == pytest.approx(0.0123) and t.n_rays == 100
    assert t.config.pixel_jitter == 0.25

    class OtherImage(ImageConfig):
        hidden: int = 24
        encoding: str = "none"

    net = model_from_config(OtherImage())
    assert net.mlp[0].out_features == 24 and isinstance(net.encoder, torch.nn.Identity)


def _recording(model: type) -> tuple[type, set[str]]:
    """A subclass of `model` that notes each field read through an attribute."""
    read: set[str] = set()
    fields = set(model.model_fields)

    class Recording(model):
        def __getattribute__(self, name):
            if name in fields:
                read.add(name)
            return super().__getattribute__(name)

    return Recording, read


class _Progress:
    start_step = 0

    def report(self, *args, **kwargs):
        pass

    def set_deadline(self, *args):
        pass

    def due(self, *args):
        return True


def _ctx(tmp_path: Path, config, device="cpu"):
    from core.settings import Settings

    job_dir = tmp_path / "job"
    return SimpleNamespace(
        config=config,
        job=SimpleNamespace(id="j1"),
        paths=SimpleNamespace(
            dataset=job_dir / "dataset", artifacts=job_dir / "artifacts", root=job_dir
        ),
        settings=Settings(data_dir=tmp_path),
        progress=_Progress(),
        checkpoints=CheckpointManager(job_dir / "checkpoints"),
        device=torch.device(device),
        raise_if_cancelled=lambda: None,
    )


# Fields read before any trainer, where the dataset is written (the API's intake, and the SfM
# stage for uploads without poses: worker/sfm/stage.py): the size photos are stored at and the
# scene box (the nerf trainer reads the box again; the splat trainer takes the dataset's).
BEFORE_TRAINING = {"long_side", "downscale", "aabb_scale"}


def test_the_sfm_stage_reads_the_fields_read_before_training():
    tree = ast.parse((WORKER / "sfm" / "stage.py").read_text())
    read = {
        n.attr
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "config"
    }
    assert BEFORE_TRAINING <= read


def test_every_nerf_config_field_is_read_by_the_nerf_job(tmp_path):
    from worker.jobs.nerf import JOB

    _nerf_dataset(tmp_path)
    Recording, read = _recording(NerfConfig)
    metrics = JOB.train(
        _ctx(tmp_path, Recording(**SMALL_NERF, error_map_share=0.5, appearance=True))
    )
    assert metrics["steps"] == SMALL_NERF["steps"]
    missing = set(NerfConfig.model_fields) - BEFORE_TRAINING - read
    assert not missing, f"NerfConfig fields the nerf job never reads: {sorted(missing)}"


def test_every_splat_config_field_is_read_by_the_splat_job(tmp_path):
    """Two runs (the default strategy with its densification, appearance and absgrad; mcmc)
    read every field between them; seed triangulation's two through its own functions."""
    from service.intake.splat import validate_upload
    from worker.jobs.splat import JOB, seed_cap_s, wants_triangulation

    z = make_scene(tmp_path / "scene.zip", size=16, n_train=6, n_test=2)
    (tmp_path / "job").mkdir()
    validate_upload(z, "scene.zip", {}, tmp_path / "job", None)
    Recording, read = _recording(SplatConfig)
    small = dict(
        steps=24,
        n_init_points=300,
        densify_from=0,
        densify_every=11,
        opacity_reset_every=12,
        sh_increase_every=4,
        seed_points="random",
        n_test_renders=1,
        checkpoint_every=10,
    )
    # densifying to the end: large splats are pruned only after the first opacity reset
    cfg = Recording(**small, appearance=True, absgrad=True, densify_until=1.0)
    ctx = _ctx(tmp_path, cfg)
    assert not wants_triangulation(cfg, ctx.paths.dataset)
    seed_cap_s(cfg, ctx.settings)
    JOB.train(ctx)
    for d in ("checkpoints", "artifacts"):
        for f in (tmp_path / "job" / d).iterdir():
            f.unlink()
    JOB.train(_ctx(tmp_path, Recording(**small, strategy="mcmc", cap_max=400)))
    missing = set(SplatConfig.model_fields) - BEFORE_TRAINING - read
    assert not missing, f"SplatConfig fields the splat job never reads: {sorted(missing)}"


def test_every_image_config_field_is_read_by_the_image_job(tmp_path):
    from PIL import Image

    from worker.jobs import image

    (tmp_path / "job" / "dataset").mkdir(parents=True)
    Image.new("RGB", (12, 9), (200, 40, 90)).save(tmp_path / "job" / "dataset" / "image.png")
    Recording, read = _recording(ImageConfig)
    metrics = image.train(_ctx(tmp_path, Recording(steps=3, resolution=8, hidden=8, layers=2)))
    assert (metrics["train_width"], metrics["train_height"]) == (8, 6)
    missing = set(ImageConfig.model_fields) - read
    assert not missing, f"ImageConfig fields the image job never reads: {sorted(missing)}"


# -- export options --------------------------------------------------------------------------------
def test_export_options_take_the_schemas_defaults_for_their_format():
    for fmt in ExportFormat:
        filled = ExportOptions().with_defaults(fmt)
        assert set(filled.model_dump(exclude_none=True)) == set(OPTIONS_BY_FORMAT[fmt])
    cloud = export_options(ExportFormat.point_cloud, {"n_points": 10})
    assert cloud.n_points == 10 and cloud.min_opacity == DEFAULT_POINT_MIN_OPACITY
    assert export_options(ExportFormat.splat, {}).min_opacity == 0.0
    mesh = export_options(ExportFormat.glb, {"threshold": 2.0, "retired_option": 1})
    assert mesh.threshold == 2.0
    assert mesh.resolution == DEFAULTS_BY_FORMAT[ExportFormat.glb]["resolution"]
    with pytest.raises(ConfigError, match="n_points"):
        export_options(ExportFormat.point_cloud, {"n_points": 0})


def test_the_kinds_config_models_are_the_ones_the_worker_reads():
    from api_schemas.kinds import CONFIG_MODELS

    assert CONFIG_MODELS == {
        JobKind.image: ImageConfig,
        JobKind.nerf: NerfConfig,
        JobKind.splat: SplatConfig,
    }
