"""The compiled ops as torch.library ops: one schema each, a CPU kernel and a fake implementation
each, FakeTensor tracing on a claimed CUDA device, and a NeRF training step under torch.compile."""

import pytest
import torch
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv

import kernels
from kernels import _ext

# Ops that take no tensor (nothing to fake) and so run the same everywhere.
NO_TENSORS = {"nf::mlp_isa", "nf::mlp_bf16_supported"}


def op_names(namespace):
    return sorted(
        n.split(".")[0]
        for n in torch._C._dispatch_get_all_op_names()
        if n.startswith(namespace + "::")
    )


@pytest.mark.parametrize("ext", _ext.EXTENSIONS, ids=lambda e: e.namespace)
def test_every_op_has_one_schema_a_cpu_kernel_and_a_fake(ext, cpu_ext, splat_cpu_ext):
    names = op_names(ext.namespace)
    assert len(names) >= 4
    ops = _ext.load(ext, "cpu")
    for name in names:
        op = getattr(torch.ops, ext.namespace).__getattr__(name.split("::")[1]).default
        assert op._schema.name == name  # declared once: one overload, the default
        if name in NO_TENSORS:
            continue
        assert torch._C._dispatch_has_kernel_for_dispatch_key(name, "CPU"), name
        assert torch._C._dispatch_has_kernel_for_dispatch_key(name, "Meta"), f"{name}: no fake"
        assert hasattr(ops, name.split("::")[1])
    assert isinstance(ops.mlp_isa(), int) if ext is _ext.NERF else True


def test_the_cuda_library_registers_every_op_but_the_cpu_only_ones(cpu_ext):
    # Read from ops.h (the CUDA library cannot load here); the fake-CUDA mode relies on it.
    cpu_only = {"hash_grid_backward_rows", "hash_grid_adam", "ray_offsets", "cull_round",
                "move_rows", "nerf_mlp_forward", "nerf_mlp_backward", "mlp_isa",
                "mlp_bf16_supported"}  # fmt: skip
    names = {n.split("::")[1] for n in op_names("nf")}
    assert _ext.cuda_op_names(_ext.NERF) == names - cpu_only
    assert _ext.cuda_op_names(_ext.SPLAT) == {
        "naive_forward",
        "naive_backward",
        "tiled_forward",
        "tiled_backward",
    }


def fake_cuda(mode, *shape, dtype=torch.float32):
    with mode:
        return torch.empty(*shape, dtype=dtype, device="cuda")


def test_fake_implementations_give_shapes_dtypes_and_a_cuda_device(cpu_ext, splat_cpu_ext):
    nf, sp = torch.ops.nf, torch.ops.nf_splat
    # A shape environment: march_rays' sample count is a fresh symbol in it.
    mode = FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv())
    s, n = 40, 8
    # The grid's level tables stay on the CPU as the module keeps them; the output follows x.
    grid = kernels.HashGrid(3, n_levels=4, log2_hashmap_size=14, backend="ext")
    occ_shape = kernels.OccupancyGrid([-1, -1, -1, 1, 1, 1], 32, 2).bits.shape
    sig, t0, t1 = (fake_cuda(mode, s) for _ in range(3))
    rgb = fake_cuda(mode, s, 3)
    off = fake_cuda(mode, n + 1, dtype=torch.int64)
    with mode:
        out_rgb, depth, opac = nf.composite_forward(sig, rgb, t0, t1, off, 1e-4)
        assert out_rgb.shape == (n, 3) and depth.shape == (n,) and opac.shape == (n,)
        assert all(t.device.type == "cuda" and t.dtype == torch.float32 for t in (out_rgb, depth))
        gs, gc = nf.composite_backward(sig, rgb, t0, t1, off, 1e-4, out_rgb, depth, opac)
        assert gs.shape == (s,) and gc.shape == (s, 3) and gc.device.type == "cuda"

        dirs = torch.empty(s, 3, device="cuda", dtype=torch.float64)
        enc = nf.sh_encode(dirs, 3)
        assert enc.shape == (s, 9) and enc.dtype == torch.float64 and enc.device.type == "cuda"

        x = torch.empty(s, 3, device="cuda")
        table = torch.empty(grid.params.shape, device="cuda")
        meta = (grid.offsets, grid.resolution, grid.scales, grid.hashed)
        feats = nf.hash_grid_forward(x, table, *meta)
        assert feats.shape == (s, 4 * 2) and feats.device.type == "cuda"
        assert nf.hash_grid_backward(x, feats, table.shape[0], 2, *meta).shape == table.shape

        density = torch.empty(2, 32**3, device="cuda")
        bits = nf.occ_bitfield(density, 0.01)
        assert bits.dtype == torch.uint8 and bits.device.type == "cuda"
        assert bits.shape == occ_shape
        assert nf.occ_query(x, bits, 32, [0.0] * 3, [1.0] * 3).dtype == torch.bool

        o, d = torch.empty(n, 3, device="cuda"), torch.empty(n, 3, device="cuda")
        near, far, jit = (torch.empty(n, device="cuda") for _ in range(3))
        ri, a, b, offsets, counts = nf.march_rays(
            o, d, near, far, jit, [-1.0] * 3 + [1.0] * 3, 0.01, 0.0, 1e10, 64, None, 0,
            [0.0] * 3, [1.0] * 3,
        )  # fmt: skip
        assert isinstance(ri.shape[0], torch.SymInt)  # the sample count depends on the data
        assert ri.dtype == torch.int64 and a.shape == ri.shape and a.device.type == "cuda"
        assert offsets.shape == (n + 1,) and counts.shape == (n,)

        means = torch.empty(5, 2, device="cuda")
        img, trans, cnt = sp.naive_forward(
            means, torch.empty(5, 3, device="cuda"), torch.empty(5, 3, device="cuda"),
            torch.empty(5, device="cuda"), 12, 20, 1 / 255, 0.99, 1e-4,
        )  # fmt: skip
        assert img.shape == (12, 20, 3) and trans.shape == (12, 20) and cnt.dtype == torch.int32
        assert img.device.type == "cuda"


def test_fake_cuda_tensors_pass_through_the_public_ops(cpu_ext):
    # The Python wrappers pick no build by device: fake CUDA tensors on a CPU-only torch reach the
    # fakes. (Eager autograd is left out: torch's engine itself needs CUDA for a cuda tensor.)
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode, torch.no_grad():
        out = kernels.sh_encode(torch.empty(10, 3, device="cuda"), 4)
        assert out.shape == (10, 16) and out.device.type == "cuda"
        s, n = 12, 3
        sig, t0 = torch.empty(s, device="cuda"), torch.empty(s, device="cuda")
        rgb = torch.empty(s, 3, device="cuda")
        ri = torch.empty(s, dtype=torch.int64, device="cuda")
        off = torch.empty(n + 1, dtype=torch.int64, device="cuda")
        color, depth, opacity = kernels.composite(sig, rgb, t0, t0, ri, n, offsets=off)
        assert color.shape == (n, 3) and depth.shape == (n,) and color.device.type == "cuda"


def packed_rays(n_rays=16, per_ray=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    s = n_rays * per_ray
    x = torch.rand(s, 3, generator=g) * 1.6 - 0.8
    d = torch.nn.functional.normalize(torch.randn(s, 3, generator=g), dim=-1)
    t0 = (torch.arange(s) % per_ray).float() * 0.05
    ri = torch.arange(n_rays).repeat_interleave(per_ray)
    offsets = torch.arange(0, s + 1, per_ray)
    target = torch.rand(n_rays, 3, generator=g)
    return x, d, t0, t0 + 0.05, ri, offsets, target


def test_a_compiled_nerf_training_step_runs_our_ops(cpu_ext):
    """torch.compile of a step (field forward, compositing, loss, backward) traces our ops through
    their fake implementations into forward and backward graphs, and matches the eager step."""
    # The job's own field (pydantic config): imported here, so that collecting tests/kernels
    # needs torch and pytest alone (scripts/gpu_check.sh on a machine without the service).
    pytest.importorskip("pydantic")
    from api_schemas.nerf import NerfConfig
    from worker.nerf.model import NerfField

    cfg = NerfConfig(log2_hashmap_size=14, n_levels=8).model_dump()
    torch.manual_seed(0)
    field = NerfField(cfg, backend="ext")
    x, d, t0, t1, ri, offsets, target = packed_rays()
    n_rays = target.shape[0]

    def step():
        field.zero_grad(set_to_none=True)
        sigma, rgb = field(x, d)
        out, _, _ = kernels.composite(sigma, rgb, t0, t1, ri, n_rays, offsets=offsets)
        loss = ((out - target) ** 2).mean()
        loss.backward()
        return loss.detach()

    loss_eager = step()
    grads_eager = {k: p.grad.clone() for k, p in field.named_parameters() if p.grad is not None}
    assert grads_eager

    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm.code)
        return make_boxed_func(gm.forward)

    torch._dynamo.reset()
    compiled = torch.compile(step, backend=aot_autograd(fw_compiler=keep, bw_compiler=keep))
    loss_compiled = compiled()
    torch.testing.assert_close(loss_compiled, loss_eager)
    for k, p in field.named_parameters():
        if k in grads_eager:
            torch.testing.assert_close(p.grad, grads_eager[k], rtol=1e-5, atol=1e-7, msg=k)
    code = "\n".join(graphs)
    for op in ("hash_grid_forward", "hash_grid_backward", "sh_encode", "nerf_mlp_forward",
               "nerf_mlp_backward", "composite_forward", "composite_backward"):  # fmt: skip
        assert f"torch.ops.nf.{op}" in code, op
