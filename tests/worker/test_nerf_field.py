"""NerfField's MLPs: the compiled fused op (backend "ext" on the CPU) against nn.Linear."""

import pytest
import torch

from api_schemas.nerf import NerfConfig
from kernels import mlp_bf16_supported
from worker.nerf import model as nerf_model
from worker.nerf.model import NerfField


def config(**kw):
    # A small hash table: the MLPs are what these tests compare.
    return NerfConfig(log2_hashmap_size=14, **kw).model_dump()


def pair(**kw):
    torch.manual_seed(0)
    ext = NerfField(config(**kw), backend="ext")
    ref = NerfField(config(**kw), backend="reference")
    assert list(ext.state_dict()) == list(ref.state_dict())  # checkpoints do not change
    ref.load_state_dict(ext.state_dict())
    with torch.no_grad():  # hash features large enough to move the MLPs
        ext.encoding.params.uniform_(-1, 1)
        ref.encoding.params.copy_(ext.encoding.params)
    return ext, ref


class _Calls(list):
    """The fused op's calls: their backends (the list itself) and their precisions."""

    def __init__(self):
        super().__init__()
        self.precisions: list[str] = []


@pytest.fixture
def fused_calls(monkeypatch):
    calls = _Calls()
    real = nerf_model.nerf_mlp

    def spy(*args, **kw):
        calls.append(kw.get("backend", "ext"))
        calls.precisions.append(kw.get("precision", "float32"))
        return real(*args, **kw)

    monkeypatch.setattr(nerf_model, "nerf_mlp", spy)
    return calls


def points(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 3, generator=g) * 2 - 1
    d = torch.nn.functional.normalize(torch.randn(n, 3, generator=g), dim=-1)
    return x, d


def close(a, b):
    a, b = a.detach(), b.detach()
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5 * max(1.0, float(b.abs().max())))


def test_ext_and_reference_fields_agree_with_gradients(fused_calls):
    ext, ref = pair(mlp_precision="float32")
    x, d = points(3000)
    w = torch.randn(3000, 3, generator=torch.Generator().manual_seed(2))
    outs = []
    for field in (ext, ref):
        sigma, rgb = field(x, d)
        ((sigma * 0.01).sum() + (rgb * w).sum()).backward()
        grads = {n: p.grad for n, p in field.named_parameters()}
        outs.append((sigma.detach(), rgb.detach(), grads))
    assert fused_calls == ["ext"]  # the ext field went through the fused op, once
    (s1, c1, g1), (s2, c2, g2) = outs
    close(s1, s2)
    close(c1, c2)
    assert set(g1) == set(g2)
    for name in g1:
        assert g1[name] is not None and g2[name] is not None, name
        close(g1[name], g2[name])


def test_density_paths_agree(fused_calls):
    ext, ref = pair(mlp_precision="float32")
    x, _ = points(2000)
    with torch.no_grad():
        close(ext.density(x), ref.density(x))
        enc = ext.encode(x)
        close(ext.density_from(enc), ref.density_from(enc))
        close(ext.density_float32(x), ref.density(x))
    assert fused_calls == ["ext"] * 3


def test_precomputed_features_are_attached(fused_calls):
    # rendering.py encodes once without gradients, then passes enc back in.
    ext, ref = pair(mlp_precision="float32")
    x, d = points(500)
    for field in (ext, ref):
        with torch.no_grad():
            enc = field.encode(x)
        sigma, rgb = field(x, d, enc=enc)
        (sigma.sum() + rgb.sum()).backward()
    close(ext.encoding.params.grad, ref.encoding.params.grad)
    close(ext.density_net[0].weight.grad, ref.density_net[0].weight.grad)


def test_other_layer_counts_and_widths(fused_calls):
    kw = dict(
        mlp_precision="float32",
        density_layers=2,
        density_hidden=32,
        geo_features=7,
        color_layers=1,
        color_hidden=48,
        sh_degree=3,
    )
    ext, ref = pair(**kw)
    x, d = points(700)
    (s1, c1), (s2, c2) = ext(x, d), ref(x, d)
    close(s1, s2)
    close(c1, c2)
    assert fused_calls == ["ext"]


@pytest.mark.parametrize("precision", ["auto", "bfloat16"])
def test_bfloat16_mlps(fused_calls, precision):
    ext, ref = pair(mlp_precision=precision)
    native = mlp_bf16_supported()
    x, d = points(64)
    sigma, rgb = ext(x, d)
    assert sigma.shape == (64,) and rgb.shape == (64, 3)
    if native:
        # The fused op's own bfloat16 products: close to float32, not equal to it.
        assert not ext.bf16_mlps and fused_calls.precisions == ["bfloat16"]
        s_ref, c_ref = ref(x, d)
        assert not torch.equal(sigma, s_ref)
        torch.testing.assert_close(rgb, c_ref, rtol=0.02, atol=0.02)
    elif precision == "auto":
        assert not ext.bf16_mlps and fused_calls.precisions == ["float32"]
    else:
        assert ext.bf16_mlps and fused_calls == []  # nn.Linear under autocast
    fused_calls.precisions.clear()
    ext.density_float32(x)  # the occupancy grid's densities are float32 whatever the precision
    assert fused_calls.precisions == ["float32"]


def test_float64_field_keeps_nn_linear(fused_calls):
    ext, ref = pair(mlp_precision="float32")
    ext, ref = ext.double(), ref.double()
    x, d = points(100)
    close(ext(x.double(), d.double())[1], ref(x.double(), d.double())[1])
    assert fused_calls == []
