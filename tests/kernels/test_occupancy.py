import pytest
import torch

import kernels


def blob_density(x):
    # Two blobs: one in cascade 0, one only the second cascade covers.
    return (
        50.0 * (x.norm(dim=-1) < 0.5).float()
        + 20.0 * ((x - torch.tensor([1.5, 0.0, 0.0])).norm(dim=-1) < 0.3).float()
    )


def test_morton_roundtrip_and_order():
    ijk = torch.randint(0, 1024, (1000, 3))
    code = kernels.morton3d(ijk[:, 0], ijk[:, 1], ijk[:, 2])
    back = torch.stack([kernels.morton3d_invert(code >> s) for s in range(3)], 1)
    assert torch.equal(back, ijk)
    # The 8 children of a 2x2x2 block are consecutive codes.
    base = kernels.morton3d(torch.tensor(6), torch.tensor(2), torch.tensor(4))
    kids = [
        int(kernels.morton3d(torch.tensor(6 + a), torch.tensor(2 + b), torch.tensor(4 + c)))
        for a in (0, 1)
        for b in (0, 1)
        for c in (0, 1)
    ]
    assert sorted(kids) == list(range(int(base), int(base) + 8))


@pytest.mark.parametrize("n_cascades", [1, 3])
def test_bitfield_matches_reference(cpu_ext, n_cascades):
    torch.manual_seed(0)
    g = kernels.OccupancyGrid([-1, -1, -1, 1, 1, 1], resolution=32, n_cascades=n_cascades)
    g.density.copy_(torch.rand_like(g.density) ** 8)  # sparse-ish occupancy
    g.binarize()
    ext = g.bits.clone()
    g.binarize(backend="reference")
    assert torch.equal(ext, g.bits)


def test_update_ema_threshold_and_mips(cpu_ext):
    torch.manual_seed(0)
    g = kernels.OccupancyGrid([-1, -1, -1, 1, 1, 1], resolution=32, n_cascades=2)
    assert g.occupancy(0).all(), "a fresh grid must not skip anything"
    assert g.update_every_n_steps(0, blob_density)
    assert not g.update_every_n_steps(5, blob_density)
    occ0 = g.occupancy(0)
    # Cell centres inside the blob are occupied, the far corner is not.
    assert occ0[16, 16, 16] and not occ0[0, 0, 0]
    frac = occ0.float().mean().item()
    assert 0.0 < frac < 0.2
    # The second blob lies outside cascade 0 but inside cascade 1.
    assert g.is_occupied(torch.tensor([[1.5, 0.0, 0.0]])).item()
    assert not g.is_occupied(torch.tensor([[-1.5, -1.5, -1.5]])).item()
    # Cascade 0 occupancy is pooled into the centre of cascade 1.
    occ1 = g.occupancy(1)
    pooled = occ0.reshape(16, 2, 16, 2, 16, 2).any(5).any(3).any(1)
    assert (occ1[8:24, 8:24, 8:24] | ~pooled).all()
    # Each mip is the max-pool of the one below.
    for m in range(1, 6):
        below = g.occupancy(0, m - 1)
        r = below.shape[0] // 2
        assert torch.equal(g.occupancy(0, m), below.reshape(r, 2, r, 2, r, 2).any(5).any(3).any(1))
    # EMA: with the density gone, values decay by 0.95 per update.
    before = g.density.clone()
    g.update(lambda x: torch.zeros(x.shape[0]))
    torch.testing.assert_close(g.density, before * 0.95)


def test_threshold_is_min_of_constant_and_mean(cpu_ext):
    g = kernels.OccupancyGrid([0, 0, 0, 1, 1, 1], resolution=8)
    g.density.fill_(0.001)
    g.density[0, 0] = 0.002  # mean ~0.001 < 0.01, so the threshold is the mean
    g.binarize()
    assert g.occupancy().sum() == 1


def test_query_matches_reference_including_boundaries(cpu_ext):
    torch.manual_seed(1)
    g = kernels.OccupancyGrid([-1, -1, -1, 1, 1, 1], resolution=16, n_cascades=2)
    g.density.copy_((torch.rand_like(g.density) > 0.7).float())
    g.binarize()
    faces = torch.linspace(-2, 2, 33)  # every cell face of both cascades, and the outer boundary
    grid_pts = torch.stack(torch.meshgrid(faces, faces, faces[::4], indexing="ij"), -1).reshape(
        -1, 3
    )
    pts = torch.cat([grid_pts, torch.rand(5000, 3) * 5 - 2.5])
    assert torch.equal(g.is_occupied(pts), g.is_occupied(pts, backend="reference"))
    assert not g.is_occupied(torch.tensor([[2.01, 0.0, 0.0]])).item()


def test_state_dict_roundtrip():
    g = kernels.OccupancyGrid([-1, -1, -1, 1, 1, 1], resolution=8)
    g.density.uniform_()
    g.binarize()
    h = kernels.OccupancyGrid([-1, -1, -1, 1, 1, 1], resolution=8)
    h.load_state_dict(g.state_dict())
    assert torch.equal(h.bits, g.bits)


@pytest.mark.parametrize(
    "kwargs", [dict(resolution=48), dict(aabb=[0, 0, 0, -1, 1, 1]), dict(n_cascades=0)]
)
def test_bad_arguments(kwargs):
    args = {"aabb": [-1, -1, -1, 1, 1, 1], **kwargs}
    with pytest.raises(ValueError):
        kernels.OccupancyGrid(**args)
