"""The GPU code path of every trainer, renderer and export, run on the fake CUDA device
(tests/support/fake_cuda.py): tensors stay on this CPU but carry the device they would have on a GPU, so
a CPU tensor meeting a CUDA one fails here as it would on the first GPU run. Each test prints the
host synchronisations a training step makes on that path (`pytest -m fake_cuda -s`)."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from api_schemas.image import ImageConfig
from api_schemas.nerf import NerfConfig
from core.settings import Settings
from experiments.synthetic_scene import scene_files
from tests.service.test_nerf_intake import to_colmap, zip_bytes
from tests.support.fake_cuda import FakeCudaError, fake_cuda, is_cuda
from worker.checkpoints import CheckpointManager
from worker.scene.dataset import Dataset, read_meta

pytestmark = pytest.mark.fake_cuda
CUDA = torch.device("cuda")

NERF = dict(
    steps=60,
    samples_per_step=4096,
    max_rays_per_step=256,
    log2_hashmap_size=14,
    n_levels=4,
    max_resolution=64,
    occupancy_resolution=16,
    occupancy_update_every=4,
    occupancy_warmup_steps=8,
    max_samples_per_ray=64,
    aabb_scale=4,  # a box larger than the views: cells no camera sees
    occupancy_threshold=1e-5,  # 50 steps leave density to mesh
)
SPLAT = dict(
    steps=30,
    sh_degree=1,
    densify_from=5,
    densify_every=10,
    opacity_reset_every=25,
    densify_until=0.9,
    init="points3d",
)
RENDER = {
    "width": 24,
    "height": 16,
    "camera": {"look_at": {"eye": [0.0, -3.0, 1.0], "target": [0.0, 0.0, 0.0], "up": [0, 0, 1]}},
}
PATH = {
    "width": 16,
    "height": 12,
    "format": "gif",
    "orbit": {"center": [0, 0, 0], "radius": 3.0, "elevation_deg": 20, "n_frames": 3},
}


POINTS = "# 3D point list\n1 0.1 0.2 0.3 255 0 0 0.5\n2 -0.4 0.0 0.25 0 255 0 0.1\n3 0.0 -0.3 -0.2 0 0 255 0.2\n"


def intake(tmp_path, files, config, kind: str):
    """The upload through the API's own intake: the job folder with its normal-form dataset."""
    from service.intake.nerf import validate_upload as nerf
    from service.intake.splat import validate_upload as splat

    job = tmp_path / "job"
    (job / "upload").mkdir(parents=True)
    src = job / "upload" / "scene.zip"
    src.write_bytes(zip_bytes(files))
    validate = nerf if kind == "nerf" else splat
    cfg, _ = validate(src, "scene.zip", config, job, Settings(data_dir=tmp_path))
    return cfg, job


# Host synchronisations of every kind (explicit reads and data-dependent sizes) a training step
# may make on the GPU path: nerf, the march's sample count and the loss read back; splat, the
# tile lists' size and the loss. A refinement (densify and prune) adds at most REFINE_SYNCS.
STEP_SYNCS = 2
REFINE_SYNCS = 4


def all_syncs(spent) -> int:
    return spent.syncs + spent.implicit


@pytest.fixture(autouse=True)
def one_thread():
    # As the stacks' workers (TORCH_THREADS=1): two threads on a loaded 2-core machine spin.
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def report(kind: str, before, steps: int) -> None:
    from tests.support.fake_cuda import counts

    spent = counts.since(before)
    print(f"\n[fake cuda] {kind} training step: {spent.summary(steps)}")
    for (what, name, site), n in spent.where.most_common(12):
        print(f"    {n / steps:6.2f}/step  {what:8} {name:24} {site}")


# -- the mode itself ------------------------------------------------------------------------
def test_a_cpu_tensor_meeting_a_cuda_one_fails():
    with fake_cuda():
        planes = torch.ones(3, 3, device="cuda")
        planted = torch.ones(3, 1)  # "forgot" .to(device)
        with pytest.raises(FakeCudaError, match=r"mul: CPU \(3, 1\) meets CUDA \(3, 3\)"):
            planted * planes
        with pytest.raises(FakeCudaError, match="cat"):
            torch.cat([planes, torch.zeros(1, 3)])
        with pytest.raises(FakeCudaError, match="numpy"):
            planes.numpy()


def test_the_known_mark_unseen_mix_up_is_caught():
    # frustum_planes with the cameras on the device and their intrinsics on the host: the bug
    # the first GPU job would have hit (worker/nerf/trainer.py moved only c2w).
    from kernels.occupancy import frustum_planes

    c2w = torch.eye(4)[None].repeat(2, 1, 1)
    intrinsics = torch.tensor([[50.0, 50.0, 20.0, 15.0]] * 2)
    sizes = torch.tensor([[40.0, 30.0]] * 2)
    with fake_cuda():
        frustum_planes(c2w, intrinsics, sizes)  # all on the host: fine
        with pytest.raises(FakeCudaError, match="meets CUDA"):
            frustum_planes(c2w.to("cuda"), intrinsics, sizes)


def test_a_correct_mixed_program_passes_and_sees_cuda():
    with fake_cuda() as counts:
        before = counts.snapshot()
        assert torch.cuda.is_available()
        x = torch.rand(8, 3).to("cuda")
        assert x.device.type == "cuda" and x.is_cuda
        scale = torch.tensor(2.0)  # a 0-dim host tensor is fine with CUDA ones, as on a GPU
        net = torch.nn.Linear(3, 2).to(x.device)
        y = net(x * scale)
        y.sum().backward()
        assert net.weight.grad.device.type == "cuda"
        idx = torch.tensor([0, 2])  # a host index into a CUDA tensor: indexing moves it
        picked = y[idx]
        assert is_cuda(picked) and not is_cuda(idx)
        host = picked.detach().cpu()
        assert host.device.type == "cpu" and is_cuda(picked)
        assert host.numpy().shape == (2, 2)
        assert float(picked.detach().sum()) == pytest.approx(float(host.sum()))
        spent = counts.since(before)
    # cpu() and float() of a GPU value; x's and the module's two tensors' copies to the GPU
    assert spent.syncs == 2 and spent.h2d == 3
    assert not torch.cuda.is_available()


def test_compiled_ops_run_the_cpu_build_and_refuse_a_host_tensor():
    import kernels

    with fake_cuda():
        grid = kernels.OccupancyGrid([-1, -1, -1, 1, 1, 1], resolution=16).to("cuda")
        inside = grid.is_occupied(torch.zeros(4, 3, device="cuda"))
        assert is_cuda(inside) and inside.all()
        with pytest.raises(FakeCudaError, match="occ_query .*CPU"):
            from kernels import _ext

            _ext.for_tensor(grid.bits).occ_query(
                torch.zeros(4, 3), grid.bits, 16, grid.center, grid.half
            )
        with pytest.raises(FakeCudaError, match="cull_round has no CUDA implementation"):
            _ext.for_tensor(grid.bits).cull_round(grid.bits)  # compiled for the CPU only


def test_our_ops_as_torch_library_ops_are_checked_too():
    # The kernels as torch.library ops (issue 26, part 1): the dispatcher runs the CPU kernel;
    # the mode still checks the devices and counts march_rays' read-back.
    with torch.library._scoped_library("nf_fake_cuda_test", "DEF") as lib, fake_cuda() as counts:
        lib.define("march_rays(Tensor o, Tensor d) -> Tensor")
        lib.impl("march_rays", lambda o, d: o + d, "CPU")
        before = counts.snapshot()
        o = torch.ones(3, device="cuda")
        assert is_cuda(torch.ops.nf_fake_cuda_test.march_rays(o, o))
        assert counts.since(before).implicit == 1
        with pytest.raises(FakeCudaError, match="march_rays"):
            torch.ops.nf_fake_cuda_test.march_rays(o, torch.ones(3))


# -- nerf -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def blender():
    return scene_files(size=32, n_train=12, n_test=2, seed=3)


def test_nerf_trains_resumes_renders_and_exports_on_cuda(tmp_path, blender, monkeypatch):
    from api_schemas.exports import ExportOptions
    from tests.support.fake_cuda import counts
    from worker.exports.nerf_mesh import mesh_export
    from worker.exports.nerf_points import nerf_point_cloud
    from worker.jobs.nerf import JOB, NerfModel
    from worker.nerf.trainer import NerfTrainer, samples_per_step

    cfg, job = intake(tmp_path, blender, NERF, "nerf")
    meta = read_meta(job / "dataset")
    data = Dataset(job / "dataset", "train", meta)
    with fake_cuda():
        trainer = NerfTrainer(cfg, meta, CUDA, data)  # marks the cells no camera sees
        assert is_cuda(trainer.grid.density) and trainer.unseen_fraction > 0
        updates = int(trainer.grid.n_updates)
        before = counts.snapshot()
        for _ in range(50):
            last = trainer.train_step()
        report("nerf", before, 50)
        # The march's sample count and the loss read back: no marching round, compaction,
        # table optimiser or occupancy update waits for the device (they were 17 a step more).
        spent = counts.since(before)
        assert all_syncs(spent) <= 50 * STEP_SYNCS, spent.where
        assert int(trainer.grid.n_updates) - updates >= 10  # occupancy updates ran
        assert last["marched_per_ray"] > 0 and np.isfinite(last["loss"])

        # resume: the checkpoint's host tensors into a new trainer on the device
        manager = CheckpointManager(job / "checkpoints")
        manager.save(trainer.step, *trainer.state())
        ckpt = manager.load_latest()
        # (without samples_per_step: instant-ngp's 2^18 on a GPU, 2^16 on a CPU)
        resumed = NerfTrainer({**cfg, "samples_per_step": None}, meta, CUDA, data)
        assert resumed.config.samples_per_step == 1 << 18
        assert samples_per_step(NerfConfig(samples_per_step=None), torch.device("cpu")) == 1 << 16
        resumed.load_state(ckpt.tensors, ckpt.meta)
        assert resumed.step == 50 and is_cuda(resumed.field.encoding.params)
        for _ in range(3):
            resumed.train_step()

        model = NerfModel(ckpt, CUDA)
        ckpt.cache["nerf"] = model
        png, content_type = JOB.render(None, ckpt, RENDER)
        assert content_type == "image/png" and Image.open(io.BytesIO(png)).size == (24, 16)
        gif, content_type = JOB.render_path(None, ckpt, PATH)
        assert content_type == "image/gif" and Image.open(io.BytesIO(gif)).n_frames == 3
        with open(tmp_path / "path.mp4", "wb") as out:  # a path job's file
            frames = []
            JOB.render_path_to(
                None, ckpt, {**PATH, "format": "mp4"}, out, lambda done, n: frames.append(done)
            )
        assert len(frames) == 3 and (tmp_path / "path.mp4").stat().st_size > 0
        mesh = {"resolution": 24, "threshold": 0.01, "min_piece": 0.0}
        data_, _ = mesh_export(model, "ply", ExportOptions(**mesh))
        assert data_[:3] == b"ply"
        # 53 steps make no opaque surface yet; the device path is the same at any threshold
        monkeypatch.setattr("worker.exports.nerf_points.MIN_OPACITY", 0.01)
        cloud, stats = nerf_point_cloud(model, data, 200)
        assert cloud[:3] == b"ply" and stats["points"] > 0


def test_a_sync_planted_in_the_nerf_hot_loop_fails_the_bound(tmp_path, blender, monkeypatch):
    # What the bound above is for: a read of one device value per composite (a `float()` of a
    # debugging aid, an `if tensor:`) makes a step wait three times, not two.
    import worker.nerf.rendering as rendering
    from tests.support.fake_cuda import counts
    from worker.nerf.trainer import NerfTrainer

    composite = rendering.composite

    def reads_one(sigma, *args, **kwargs):
        if float(sigma.detach().sum()) < 0:
            raise AssertionError
        return composite(sigma, *args, **kwargs)

    cfg, job = intake(tmp_path, blender, NERF, "nerf")
    meta = read_meta(job / "dataset")
    with fake_cuda():
        trainer = NerfTrainer(cfg, meta, CUDA, Dataset(job / "dataset", "train", meta))
        before = counts.snapshot()
        for _ in range(4):
            trainer.train_step()
        assert all_syncs(counts.since(before)) <= 4 * STEP_SYNCS
        monkeypatch.setattr(rendering, "composite", reads_one)
        before = counts.snapshot()
        for _ in range(4):
            trainer.train_step()
        assert all_syncs(counts.since(before)) > 4 * STEP_SYNCS


# -- the GPU path's fixed-size replacements give the host path's results ----------------------
def test_nerf_masked_samples_render_and_train_as_the_compacted_ones():
    # render_rays on a GPU marches once and zeroes the density of the samples the host path's
    # rounds cull; colour, depth, opacity and every gradient must be the same.
    from api_schemas.nerf import NerfConfig
    from kernels import OccupancyGrid
    from worker.nerf import rendering
    from worker.nerf.model import NerfField

    torch.manual_seed(0)
    field = NerfField(NerfConfig(log2_hashmap_size=14, n_levels=4, max_resolution=64))
    with torch.no_grad():  # dense enough that rays go opaque: samples behind them are culled
        field.density_net[-1].bias[0] += 5.0
    grid = OccupancyGrid([-1.0] * 3 + [1.0] * 3, resolution=16)
    o = torch.nn.functional.normalize(torch.randn(64, 3), dim=1) * 2.5
    d = torch.nn.functional.normalize(-o + 0.3 * torch.randn(64, 3), dim=1)
    bg = torch.ones(64, 3)
    march = dict(step=2 * 3**0.5 / 64, max_samples=64, alpha_threshold=0.01)
    params = [p for p in field.parameters() if p.requires_grad]

    def run(render):
        color, depth, opacity, stats = render()
        loss = (color**2).sum() + depth.sum() + opacity.sum()
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        return (color, depth, opacity), grads, stats

    host, host_grads, host_stats = run(
        lambda: rendering.render_rays(field, grid, o, d, bg, **march)
    )
    masked, masked_grads, masked_stats = run(
        lambda: rendering._render_masked(field, grid, o, d, bg, False, march)
    )
    assert int(masked_stats.kept) == host_stats.kept < masked_stats.marched
    for a, b in zip(host, masked):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    for a, b in zip(host_grads, masked_grads):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_the_tables_masked_adam_step_is_the_row_sparse_one():
    from kernels import HashGrid, HashGridAdam

    torch.manual_seed(0)
    grids = [HashGrid(3, 2, 2, 14, 4, finest_resolution=32, backend="reference") for _ in range(2)]
    grids[1].load_state_dict(grids[0].state_dict())
    opts = [HashGridAdam(g, 1e-2) for g in grids]
    for _ in range(3):
        g = torch.randn_like(grids[0].params)
        g[torch.rand(g.shape[0]) < 0.5] = 0  # untouched rows
        opts[0]._n_steps += 1
        opts[0]._dense_step(g)
        opts[1]._n_steps += 1
        opts[1]._masked_step(g)
    torch.testing.assert_close(grids[0].params, grids[1].params, atol=1e-7, rtol=1e-6)
    for k in ("exp_avg", "exp_avg_sq", "steps"):
        torch.testing.assert_close(getattr(opts[0], k), getattr(opts[1], k))


def test_splats_out_of_view_masked_render_and_train_as_the_compacted_ones(tmp_path, blender):
    from worker.splat import model as gm
    from worker.splat.trainer import SplatTrainer

    files = {**to_colmap(blender), "sparse/0/points3D.txt": POINTS.encode()}
    cfg, job = intake(tmp_path, files, {**SPLAT, "init": "random", "n_init_points": 300}, "splat")
    meta = read_meta(job / "dataset")
    trainer = SplatTrainer(cfg, meta, "cpu", Dataset(job / "dataset", "train", meta))
    cam = trainer.images.cams[0]
    base = {k: v.detach().clone() for k, v in trainer.params.items()}
    base["means"][:30] += 50.0  # far outside the view

    def run(device):
        p = {k: torch.nn.Parameter(v.to(device)) for k, v in base.items()}
        out = gm.render(p, cam, torch.ones(3, device=device), 1, "tiled")
        (out.rgb**2).sum().backward()
        return out, {k: v.grad for k, v in p.items()}

    host, host_grads = run("cpu")
    with fake_cuda():
        masked, masked_grads = run(CUDA)
    assert host.shown is None and masked.visible.numel() == trainer.n
    assert int(masked.shown.sum()) == host.visible.numel() < trainer.n
    torch.testing.assert_close(host.rgb, masked.rgb, atol=1e-6, rtol=1e-5)
    for k in gm.NAMES:
        torch.testing.assert_close(host_grads[k], masked_grads[k], atol=1e-6, rtol=1e-5)


# -- splat ----------------------------------------------------------------------------------
def test_splat_trains_densifies_renders_and_exports_on_cuda(tmp_path, blender):
    from tests.support.fake_cuda import counts
    from worker.exports.splat_files import read_splat, splat_bytes, splat_point_cloud
    from worker.jobs.splat import JOB
    from worker.splat.ply import ply_bytes, read_ply
    from worker.splat.trainer import SplatTrainer

    files = {**to_colmap(blender), "sparse/0/points3D.txt": POINTS.encode()}
    cfg, job = intake(tmp_path, files, SPLAT, "splat")
    meta = read_meta(job / "dataset")
    data = Dataset(job / "dataset", "train", meta)
    with fake_cuda():
        trainer = SplatTrainer(cfg, meta, CUDA, data, job / "dataset")  # from the SfM points
        assert trainer.n == 3 and is_cuda(trainer.params["means"])
        before = counts.snapshot()
        for _ in range(SPLAT["steps"]):
            trainer.train_step()
        report("splat", before, SPLAT["steps"])
        # The tile lists' size and the loss read back (with the MSE) each step; each
        # refinement reads its masks once.
        spent = counts.since(before)
        refines = trainer.counts["densifications"]
        bound = STEP_SYNCS * SPLAT["steps"] + REFINE_SYNCS * refines
        assert all_syncs(spent) <= bound, spent.where
        assert trainer.counts["densifications"] >= 1 and trainer.counts["opacity_resets"] == 1

        manager = CheckpointManager(job / "checkpoints")
        manager.save(trainer.step, *trainer.state())
        ckpt = manager.load_latest()
        model = JOB.model_class(ckpt, CUDA)
        ckpt.cache["splat"] = model
        png, _ = JOB.render(None, ckpt, RENDER)
        assert Image.open(io.BytesIO(png)).size == (24, 16)
        data_, n = splat_bytes(model.params, model.normalization)
        assert n == trainer.n and len(read_splat(data_)["position"]) == n
        ply = ply_bytes(model.params, model.normalization, model.antialiased)
        assert len(read_ply(ply)["x"]) == n
        cloud, stats = splat_point_cloud(model.params, model.normalization, 100, 0.0)
        assert cloud[:3] == b"ply" and stats["points"] > 0


@pytest.mark.parametrize(
    "kind, options",
    [
        ("splat", {"strategy": "mcmc", "init": "random", "n_init_points": 200, "cap_max": 400}),
        ("splat", {"appearance": True, "antialiased": True, "method": "naive"}),
        ("nerf", {"error_map_share": 0.5, "train_background": "random"}),
        ("nerf", {"mlp_precision": "bfloat16"}),
    ],
)
def test_training_options_on_cuda(tmp_path, blender, kind, options):
    from worker.nerf.trainer import NerfTrainer
    from worker.splat.trainer import SplatTrainer

    if kind == "nerf":
        cfg, job = intake(tmp_path, blender, {**NERF, **options}, "nerf")
    else:
        files = {**to_colmap(blender), "sparse/0/points3D.txt": POINTS.encode()}
        cfg, job = intake(tmp_path, files, {**SPLAT, **options}, "splat")
    meta = read_meta(job / "dataset")
    data = Dataset(job / "dataset", "train", meta)
    with fake_cuda():
        if kind == "nerf":
            trainer = NerfTrainer(cfg, meta, CUDA, data)
        else:
            trainer = SplatTrainer(cfg, meta, CUDA, data, job / "dataset")
        for _ in range(11):  # through one refinement (densify_every 10)
            assert np.isfinite(trainer.train_step()["loss"])


# -- image ----------------------------------------------------------------------------------
def test_image_trains_and_renders_on_cuda():
    from tests.support.fake_cuda import counts
    from worker.jobs.image import _sample, fit

    cfg = ImageConfig(steps=20, hidden=32, layers=2, resolution=16).model_dump(mode="json")
    target = np.random.default_rng(0).random((12, 16, 3), dtype=np.float32)
    with fake_cuda():
        before = counts.snapshot()
        model, _, psnr = fit(target, cfg, device=CUDA)
        report("image", before, cfg["steps"])
        assert np.isfinite(psnr) and is_cuda(next(model.parameters()))
        pixels = _sample(model, 20, 10, CUDA)
        assert pixels.shape == (10, 20, 3) and pixels.dtype == np.uint8


def test_a_host_tensor_planted_in_a_trainer_fails_it(monkeypatch):
    # The image trainer's pixel grid left on the host, as a forgotten `device=` would leave it.
    import worker.jobs.image as image

    grid = image.pixel_grid
    monkeypatch.setattr(image, "pixel_grid", lambda w, h, device=None: grid(w, h))
    cfg = ImageConfig(steps=2, hidden=16, layers=2, resolution=8).model_dump(mode="json")
    target = np.zeros((8, 8, 3), dtype=np.float32)
    image.fit(target, cfg, device=torch.device("cpu"))  # on the CPU nothing is wrong
    with fake_cuda(), pytest.raises(FakeCudaError, match="meets CUDA"):
        image.fit(target, cfg, device=CUDA)
