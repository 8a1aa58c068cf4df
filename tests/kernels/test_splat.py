import pytest
import torch

from kernels import splat
from kernels.splat_project import covariance_3d, project_gaussians


@pytest.fixture(scope="module")
def splat_ext(splat_cpu_ext):
    # A broken build must fail the tests, not skip them.
    return splat_cpu_ext


def random_splats(n, width, height, dtype=torch.float32, seed=0, opacity=(0.05, 0.95), spread=3.0):
    g = torch.Generator().manual_seed(seed)
    means = torch.rand(n, 2, generator=g) * torch.tensor([width + 8.0, height + 8.0]) - 4.0
    lower = torch.randn(n, 2, 2, generator=g) * spread
    cov = lower @ lower.mT + 0.3 * torch.eye(2)
    inv = torch.linalg.inv(cov)
    conics = torch.stack([inv[:, 0, 0], inv[:, 0, 1], inv[:, 1, 1]], -1)
    colors = torch.rand(n, 3, generator=g)
    lo, hi = opacity
    opac = torch.rand(n, generator=g) * (hi - lo) + lo
    depths = torch.rand(n, generator=g)
    return [t.to(dtype) for t in (means, conics, colors, opac, depths)]


def run(method, params, depths, height, width, weights, bg=0.3):
    ps = [p.clone().requires_grad_(True) for p in params]
    rgb, trans = splat.rasterize(*ps, height, width, background=bg, depths=depths, method=method)
    loss = (rgb * weights[0]).sum() + (trans * weights[1]).sum()
    return rgb.detach(), trans.detach(), torch.autograd.grad(loss, ps)


@pytest.mark.parametrize("method", ["naive", "tiled"])
@pytest.mark.parametrize(
    "dtype,fwd_tol,grad_rtol", [(torch.float32, 2e-3, 1e-3), (torch.float64, 1e-10, 1e-8)]
)
@pytest.mark.parametrize("size", [(37, 50), (64, 64)])  # one size not a multiple of the tile
def test_matches_reference(splat_ext, method, dtype, fwd_tol, grad_rtol, size):
    h, w = size
    *params, depths = random_splats(300, w, h, dtype)
    gen = torch.Generator().manual_seed(1)
    weights = (
        torch.randn(h, w, 3, generator=gen, dtype=dtype),
        torch.randn(h, w, generator=gen, dtype=dtype),
    )
    rgb_r, t_r, g_r = run("reference", params, depths, h, w, weights)
    rgb, t, g = run(method, params, depths, h, w, weights)
    assert (rgb - rgb_r).abs().max() < fwd_tol
    assert (t - t_r).abs().max() < fwd_tol
    assert t_r.min() < 0.5 and rgb_r.std() > 0.05  # the scene actually covers the image
    for name, a, b in zip(("means2d", "conics", "colors", "opacities"), g, g_r):
        assert b.abs().max() > 0, name
        err = (a - b).abs().max() / b.abs().max()
        assert err < grad_rtol, f"{name}: relative error {err:.3g}"


@pytest.mark.parametrize("method", ["naive", "tiled"])
def test_absgrad_matches_reference(splat_ext, method):
    # means2d.absgrad sums each pixel's |dL/dmean2d| (gsplat's absgrad), in the caller's order
    # although the splats are composited in depth order.
    h, w = 21, 35
    *params, depths = random_splats(60, w, h, torch.float64, seed=5)
    gen = torch.Generator().manual_seed(2)
    g_rgb = torch.randn(h, w, 3, generator=gen, dtype=torch.float64)
    g_t = torch.randn(h, w, generator=gen, dtype=torch.float64)
    means = params[0].clone().requires_grad_(True)
    rgb, trans = splat.rasterize(means, *params[1:], h, w, depths=depths, method=method)
    ((rgb * g_rgb).sum() + (trans * g_t).sum()).backward()
    order = torch.argsort(depths)
    sorted_params = [p[order] for p in params]
    expected = torch.zeros_like(means)
    expected[order] = splat.absgrad_reference(*sorted_params, h, w, g_rgb, g_t)
    assert expected.abs().max() > 0
    torch.testing.assert_close(means.absgrad, expected, rtol=1e-8, atol=1e-10)
    # the sum of absolute values is not the absolute value of the sum
    assert (means.absgrad >= means.grad.abs() - 1e-12).all()
    assert (means.absgrad > means.grad.abs() * 1.5 + 1e-6).any()


def test_tiled_equals_naive_with_large_and_opaque_splats(splat_ext):
    # Splats spanning many tiles and stopping most pixels early: the tile lists must not drop any
    # contribution the naive kernel sees.
    h, w = 70, 90
    *params, depths = random_splats(400, w, h, spread=12.0, opacity=(0.5, 1.0), seed=3)
    weights = (torch.randn(h, w, 3), torch.randn(h, w))
    rgb_n, t_n, g_n = run("naive", params, depths, h, w, weights)
    rgb_t, t_t, g_t = run("tiled", params, depths, h, w, weights)
    assert (t_n < splat.STOP_T).float().mean() > 0.3  # many pixels did stop early
    torch.testing.assert_close(rgb_t, rgb_n, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(t_t, t_n, atol=1e-6, rtol=1e-5)
    for a, b in zip(g_t, g_n):
        torch.testing.assert_close(a, b, atol=1e-4 * b.abs().max().item(), rtol=1e-3)


@pytest.mark.parametrize("method", ["naive", "tiled"])
def test_gradcheck(splat_ext, method):
    h, w = 9, 20  # two tiles wide
    *params, depths = random_splats(6, w, h, torch.float64, seed=5, spread=2.0, opacity=(0.2, 0.8))
    order = torch.argsort(depths)
    params = [p[order].clone().requires_grad_(True) for p in params]

    # alpha_min is a cut (a jump of 1/255 where a footprint ends): lowered here so that finite
    # differences see only the smooth part; the cut itself is covered by the parity tests.
    def f(m, c, col, o):
        return splat.rasterize(m, c, col, o, h, w, background=0.5, method=method, alpha_min=1e-9)

    # The backward sums per-splat gradients over pixels from several threads, so the float64 sum
    # order (and its last bits) varies between runs: allow that, far below the check's atol.
    assert torch.autograd.gradcheck(
        f, params, eps=1e-6, atol=1e-5, fast_mode=True, nondet_tol=1e-12
    )


@pytest.mark.parametrize("method", splat.METHODS)
def test_no_splats_gives_background(splat_ext, method):
    z = torch.zeros(0, requires_grad=True)
    rgb, trans = splat.rasterize(
        torch.zeros(0, 2),
        torch.zeros(0, 3),
        torch.zeros(0, 3),
        z,
        20,
        30,
        background=torch.tensor([0.1, 0.2, 0.3]),
        method=method,
    )
    assert rgb.shape == (20, 30, 3) and (trans == 1).all()
    torch.testing.assert_close(rgb, torch.tensor([0.1, 0.2, 0.3]).expand(20, 30, 3))


@pytest.mark.parametrize("method", splat.METHODS)
def test_early_stop_and_alpha_clamp(splat_ext, method):
    # Pixel (3, 3): splat 0 clamps to 0.99 (T = 1e-2), splat 1 has alpha 0.98 (T = 2e-4, still on),
    # splat 2 clamps again (T = 2e-6 < 1e-4: stop), splat 3 must add nothing.
    means = torch.full((4, 2), 4.0, requires_grad=True)
    conics = torch.tensor([[0.01, 0.0, 0.01]] * 4, requires_grad=True)
    gauss = torch.exp(torch.tensor(-0.5 * 0.01 * 0.5))
    opac = torch.tensor([5.0, float(0.98 / gauss), 5.0, 5.0], requires_grad=True)
    colors = torch.tensor(
        [[1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0], [1.0, 1.0, 1.0]], requires_grad=True
    )
    rgb, trans = splat.rasterize(means, conics, colors, opac, 8, 8, method=method)
    expected = torch.tensor([0.99, 0.01 * 0.98, 0.01 * 0.02 * 0.99])
    torch.testing.assert_close(rgb[3, 3], expected, rtol=1e-4, atol=1e-7)
    assert trans[3, 3] < splat.STOP_T
    # per-pixel gradients of pixel (3, 3) only
    gm, gc, gcol, go = torch.autograd.grad(rgb[3, 3].sum(), [means, conics, colors, opac])
    assert (gcol[3] == 0).all() and (go[3] == 0) and (gm[3] == 0).all()  # after the stop
    assert go[0] == 0 and go[2] == 0  # clamped alphas pass no gradient to opacity
    assert go[1] != 0 and gcol[2].abs().sum() > 0


def test_faint_splats_below_alpha_min_are_skipped(splat_ext):
    means = torch.tensor([[5.0, 5.0]])
    conics = torch.tensor([[0.1, 0.0, 0.1]])
    for method in splat.METHODS:
        rgb, trans = splat.rasterize(
            means, conics, torch.ones(1, 3), torch.tensor([0.9 / 255]), 10, 10, method=method
        )
        assert (rgb == 0).all() and (trans == 1).all()


def test_tile_bins_are_depth_ordered_and_cover_the_footprint():
    h, w = 48, 64
    *params, depths = random_splats(50, w, h, seed=7)
    m, c, col, o = params
    off, ids = splat.tile_bins(m, c, o, h, w)
    assert off.numel() == 4 * 3 + 1 and off[-1] == ids.numel()
    for t in range(12):
        run_ids = ids[off[t] : off[t + 1]]
        assert (run_ids[1:] > run_ids[:-1]).all()  # input order kept within a tile
    # every pixel a splat reaches with alpha >= alpha_min lies in one of its tiles
    ys, xs = torch.meshgrid(torch.arange(h) + 0.5, torch.arange(w) + 0.5, indexing="ij")
    for i in range(50):
        dx, dy = xs - m[i, 0], ys - m[i, 1]
        alpha = o[i] * torch.exp(-0.5 * (c[i, 0] * dx * dx + c[i, 2] * dy * dy) - c[i, 1] * dx * dy)
        tiles = {
            int(t)
            for t in ((ys[alpha >= splat.ALPHA_MIN] // 16) * 4 + xs[alpha >= splat.ALPHA_MIN] // 16)
        }
        listed = {t for t in range(12) if (ids[off[t] : off[t + 1]] == i).any()}
        assert tiles <= listed


def test_bad_inputs_are_rejected():
    with pytest.raises(ValueError):
        splat.rasterize(
            torch.zeros(3, 2), torch.zeros(3, 3), torch.zeros(3, 3), torch.zeros(2), 4, 4
        )
    with pytest.raises(ValueError):
        splat.rasterize(
            torch.zeros(0, 2),
            torch.zeros(0, 3),
            torch.zeros(0, 3),
            torch.zeros(0),
            4,
            4,
            method="x",
        )


# ---------------------------------------------------------------------------------- projection


def look_at(eye, target, up):
    """c2w (4x4 float64), OpenGL axes: columns right, up, back (the convention project_gaussians takes)."""
    eye, target, up = (torch.tensor(v, dtype=torch.float64) for v in (eye, target, up))
    fwd = torch.nn.functional.normalize(target - eye, dim=0)
    right = torch.nn.functional.normalize(torch.linalg.cross(fwd, up), dim=0)
    m = torch.eye(4, dtype=torch.float64)
    m[:3, 0], m[:3, 1], m[:3, 2], m[:3, 3] = right, torch.linalg.cross(right, fwd), -fwd, eye
    return m


def project_points(points, c2w, fx, fy, cx, cy):
    """Pinhole: world (N, 3) -> pixels (N, 2) (v grows downwards) and depth along the view axis."""
    local = (points - c2w[:3, 3]) @ c2w[:3, :3]
    z = -local[:, 2]
    return torch.stack([cx + fx * local[:, 0] / z, cy - fy * local[:, 1] / z], -1), z


def test_projection_matches_pinhole_and_ewa():
    c2w = look_at([0.3, -2.5, 0.8], [0.0, 0.0, 0.0], [0.0, 0.0, 1.0])
    fx, fy, cx, cy, w, h = 120.0, 110.0, 64.0, 48.0, 128, 96
    g = torch.Generator().manual_seed(0)
    means = torch.rand(40, 3, generator=g, dtype=torch.float64) - 0.5
    s = 0.01
    cov = torch.eye(3, dtype=torch.float64).expand(40, 3, 3) * s * s
    proj = project_gaussians(means, cov, c2w, fx, fy, cx, cy, w, h)
    uv, z = project_points(means, c2w, fx, fy, cx, cy)
    torch.testing.assert_close(proj.means2d, uv)
    torch.testing.assert_close(proj.depths, z)
    assert proj.visible.all()
    # An isotropic Gaussian seen head-on: variance (f s / z)^2 plus the dilation, to first order.
    centre = torch.zeros(1, 3, dtype=torch.float64)
    p0 = project_gaussians(centre, cov[:1], c2w, fx, fy, cx, cy, w, h)
    d = float(torch.tensor([0.3, -2.5, 0.8]).norm())
    torch.testing.assert_close(
        1 / p0.conics[0, 0], torch.tensor((fx * s / d) ** 2 + 0.3, dtype=torch.float64)
    )
    torch.testing.assert_close(
        p0.conics[0, 1], torch.tensor(0.0, dtype=torch.float64), atol=1e-9, rtol=0
    )


def test_all_behind_camera_renders_background(splat_ext):
    c2w = look_at([0.0, -3.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 1.0])
    means = torch.tensor(
        [[0.0, -3.5, 0.0], [0.1, -3.02, 0.0]], requires_grad=True
    )  # behind / inside near
    cov = covariance_3d(torch.full((2, 3), 0.1), torch.tensor([[1.0, 0, 0, 0]] * 2))
    proj = project_gaussians(means, cov, c2w, 50.0, 50.0, 16.0, 16.0, 32, 32)
    assert not proj.visible.any()
    v = proj.visible
    rgb, trans = splat.rasterize(
        proj.means2d[v],
        proj.conics[v],
        torch.ones(2, 3)[v],
        torch.ones(2)[v] * 0.9,
        32,
        32,
        background=1.0,
        depths=proj.depths[v],
    )
    assert (trans == 1).all() and (rgb == 1).all()


# ---------------------------------------------------------------------------------- CUDA


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("method", ["naive", "tiled"])
def test_cuda_matches_cpu_reference(method):
    h, w = 70, 90
    *params, depths = random_splats(500, w, h, seed=11)
    weights = (torch.randn(h, w, 3), torch.randn(h, w))
    rgb_r, t_r, g_r = run("reference", params, depths, h, w, weights)
    cuda = [p.cuda() for p in params]
    rgb, t, g = run(method, cuda, depths.cuda(), h, w, tuple(x.cuda() for x in weights))
    assert (rgb.cpu() - rgb_r).abs().max() < 2e-3 and (t.cpu() - t_r).abs().max() < 2e-3
    for a, b in zip(g, g_r):
        assert ((a.cpu() - b).abs().max() / b.abs().max()) < 1e-3
    # absgrad: the CUDA warps' sums of |dL/dmean2d| against the CPU build's
    absg = {}
    for dev in ("cpu", "cuda"):
        m = params[0].to(dev).clone().requires_grad_(True)
        rest = [p.to(dev) for p in params[1:]]
        rgb, t = splat.rasterize(m, *rest, h, w, depths=depths.to(dev), method=method)
        ((rgb * weights[0].to(dev)).sum() + (t * weights[1].to(dev)).sum()).backward()
        absg[dev] = m.absgrad.cpu()
    assert ((absg["cuda"] - absg["cpu"]).abs().max() / absg["cpu"].abs().max()) < 1e-3
