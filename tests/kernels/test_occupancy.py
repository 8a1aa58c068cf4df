import pytest
import torch

import kernels
from kernels.occupancy import UNSEEN


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


# -- cells no camera sees ---------------------------------------------------------------------


def _pose(eye, rot=None) -> torch.Tensor:
    """c2w (4, 4): OpenGL axes (looking down -z), rotation `rot` (default identity)."""
    m = torch.eye(4, dtype=torch.float64)
    if rot is not None:
        m[:3, :3] = torch.as_tensor(rot, dtype=torch.float64)
    m[:3, 3] = torch.as_tensor(eye, dtype=torch.float64)
    return m


# Camera A, at z = 3 looking down -z at the box with a narrow view (|x|, |y| <= 1/6 of the depth),
# and camera B inside the box at z = 0.25 looking up +z (turned about y) with a wide one.
CAM_A = (_pose([0.0, 0.0, 3.0]), [192.0, 192.0, 32.0, 32.0], [64.0, 64.0])
CAM_B = (
    _pose([0.0, 0.0, 0.25], [[-1, 0, 0], [0, 1, 0], [0, 0, -1]]),
    [16.0, 16.0, 32.0, 32.0],
    [64.0, 64.0],
)


def _cams(*cams):
    c2w = torch.stack([c[0] for c in cams]).float()
    return c2w, torch.tensor([c[1] for c in cams]), torch.tensor([c[2] for c in cams])


def _cells(res, lo=-1.0, hi=1.0):
    """(code, centre (3,), half side) of every cell of a cube grid, by loops."""
    side = (hi - lo) / res
    for i in range(res):
        for j in range(res):
            for k in range(res):
                centre = torch.tensor(
                    [lo + (i + 0.5) * side, lo + (j + 0.5) * side, lo + (k + 0.5) * side],
                    dtype=torch.float64,
                )
                code = int(kernels.morton3d(torch.tensor(i), torch.tensor(j), torch.tensor(k)))
                yield code, centre, side / 2


def _camera_coords(cam, p):
    """(x, y, depth) of world point p in the camera's frame (rotation inverted by transpose)."""
    c2w = cam[0]
    q = c2w[:3, :3].T @ (p - c2w[:3, 3])
    return float(q[0]), float(q[1]), float(-q[2])


def _projects_inside(cam, p, margin=0.01):
    fx, fy, cx, cy = cam[1]
    w, h = cam[2]
    x, y, depth = _camera_coords(cam, p)
    if depth <= 0:
        return False
    u, v = cx + fx * x / depth, cy - fy * y / depth
    return -margin * w <= u <= (1 + margin) * w and -margin * h <= v <= (1 + margin) * h


def _box_corners(centre, half):
    signs = torch.tensor([[a, b, c] for a in (-1, 1) for b in (-1, 1) for c in (-1, 1)])
    return centre + half * signs


def _surely_outside(cam, centre, half, margin=0.01):
    """Whether a cube around the cell holding its bounding ball lies wholly behind the camera or
    wholly past one edge of its image: then no part of the cell can be seen."""
    fx, fy, cx, cy = cam[1]
    w, h = cam[2]
    r = half * 3**0.5
    pts = [_camera_coords(cam, p) for p in _box_corners(centre, r + 1e-6)]
    edges = [
        lambda x, y, d: d < 0,
        lambda x, y, d: x > ((1 + margin) * w - cx) / fx * d,
        lambda x, y, d: x < (-margin * w - cx) / fx * d,
        lambda x, y, d: -y > ((1 + margin) * h - cy) / fy * d,
        lambda x, y, d: -y < (-margin * h - cy) / fy * d,
    ]
    return any(all(e(*p) for p in pts) for e in edges)


@pytest.mark.parametrize("cam", [CAM_A, CAM_B], ids=["outside", "inside"])
def test_mark_unseen_marks_what_the_camera_cannot_see(cpu_ext, cam):
    res = 8
    g = kernels.OccupancyGrid([-1, -1, -1, 1, 1, 1], resolution=res)
    n = g.mark_unseen(*_cams(cam))
    marked = g.density[0] < 0
    assert n == int(marked.sum())
    in_view, out_of_view = [], []
    for code, centre, half in _cells(res):
        if any(_projects_inside(cam, p) for p in [centre, *_box_corners(centre, half)]):
            in_view.append(code)
        elif _surely_outside(cam, centre, half):
            out_of_view.append(code)
    assert len(in_view) > 20 and len(out_of_view) > 20
    assert not marked[in_view].any(), "a cell the camera sees was marked"
    assert marked[out_of_view].all(), "a cell out of view was not marked"
    # Conservative, not loose: few cells are neither clearly seen nor clearly unseen.
    assert n - len(out_of_view) <= 0.1 * res**3


def _ball_reaches(cam, centre, r, margin=0.01, near=0.0):
    """Whether the ball reaches into the camera's frustum, each plane written in camera axes, and
    how far that decision is from flipping."""
    (fx, fy, cx, cy), (w, h) = cam[1], cam[2]
    x, y, d = _camera_coords(cam, centre)
    x0, x1 = (-margin * w - cx) / fx, ((1 + margin) * w - cx) / fx
    y0, y1 = (-margin * h - cy) / fy, ((1 + margin) * h - cy) / fy
    outside = max(
        (x - x1 * d) / (1 + x1 * x1) ** 0.5,
        (x0 * d - x) / (1 + x0 * x0) ** 0.5,
        (-y - y1 * d) / (1 + y1 * y1) ** 0.5,
        (y0 * d + y) / (1 + y0 * y0) ** 0.5,
        near - d,
    )
    return outside <= r, abs(outside - r)


@pytest.mark.parametrize(
    "min_views, near",
    [(1, 0.0), (2, 0.0), (3, 0.0), (2, 0.6), (2, (0.6, 0.3, 0.9, 0.2))],
    ids=["1", "2", "3", "2-near", "2-near-each"],
)
def test_mark_unseen_coarse_to_fine_equals_the_cell_by_cell_test(cpu_ext, min_views, near):
    # `near`: a camera sees a cell only from that depth on, one for all or one each
    # (NerfConfig.occupancy_view_share).
    # Random cameras in and around the box aimed at random points of it, with a random roll;
    # every cell against every camera in a loop.
    g = torch.Generator().manual_seed(3)
    cams = []
    for _ in range(3):
        eye = (torch.rand(3, generator=g, dtype=torch.float64) * 2 - 1) * 2.5
        target = torch.rand(3, generator=g, dtype=torch.float64) * 2 - 1
        back = torch.nn.functional.normalize(eye - target, dim=0)  # camera +z
        right = torch.nn.functional.normalize(
            torch.linalg.cross(torch.randn(3, generator=g, dtype=torch.float64), back), dim=0
        )
        rot = torch.stack([right, torch.linalg.cross(back, right), back], 1)
        f = float(40 + 80 * torch.rand(1, generator=g))
        cams.append((_pose(eye, rot), [f, f * 1.1, 24.0, 18.0], [48.0, 40.0]))
    cams.append((_pose([0.2, -0.1, 0.25], CAM_B[0][:3, :3]), [48.0, 48.0, 32.0, 32.0], CAM_B[2]))
    res = 16
    grid = kernels.OccupancyGrid([-1, -1, -1, 1, 1, 1], resolution=res)
    nears = near if isinstance(near, tuple) else (near,) * len(cams)
    grid.mark_unseen(
        *_cams(*cams),
        near=torch.tensor(nears) if isinstance(near, tuple) else near,
        min_views=min_views,
    )
    marked = grid.density[0] < 0
    r = 3**0.5 / res  # the cells' half diagonal
    wrong = []
    for code, centre, _ in _cells(res):
        tests = [_ball_reaches(cam, centre, r, near=n) for cam, n in zip(cams, nears)]
        if min(gap for _, gap in tests) < 1e-4:
            continue  # float32 against float64 may decide either way
        if bool(marked[code]) == (sum(inside for inside, _ in tests) >= min_views):
            wrong.append(code)
    share = float(marked.float().mean())
    assert 0.1 < share < 0.9 if min_views == 1 else 0.0 < share < 1.0
    assert wrong == []


def _cell_of(points, res):
    """Morton code of the cell of [-1, 1]^3 holding each point."""
    ijk = ((points + 1) / 2 * res).floor().long().clamp(0, res - 1)
    return kernels.morton3d(ijk[:, 0], ijk[:, 1], ijk[:, 2])


def test_unseen_cells_stay_empty_and_cost_no_density_evaluations(cpu_ext):
    res = 16
    g = kernels.OccupancyGrid([-1, -1, -1, 1, 1, 1], resolution=res)
    n = g.mark_unseen(*_cams(CAM_A))
    marked = g.density[0] < 0
    assert 0 < n < res**3
    # Before any update the seen cells are still all occupied; the marked ones are empty now.
    flat = g.occupancy().reshape(-1)
    ijk = torch.stack(torch.meshgrid(*[torch.arange(res)] * 3, indexing="ij"), -1).reshape(-1, 3)
    occ = torch.zeros(res**3, dtype=torch.bool)
    occ[kernels.morton3d(ijk[:, 0], ijk[:, 1], ijk[:, 2])] = flat
    assert torch.equal(occ, ~marked)

    asked = []

    def dense(x):
        asked.append(x)
        return torch.full((x.shape[0],), 1e3)

    g.update(dense, warmup=True)
    assert sum(len(x) for x in asked) == res**3 - n  # every seen cell once, no marked one
    for _ in range(3):
        g.update(dense)
    cells = _cell_of(torch.cat(asked), res)
    assert not marked[cells].any(), "a density evaluation landed in a marked cell"
    assert (g.density[0][marked] == UNSEEN).all()
    assert (g.density[0][~marked] > 0.01).all()
    flat = g.occupancy().reshape(-1)
    occ[kernels.morton3d(ijk[:, 0], ijk[:, 1], ijk[:, 2])] = flat
    assert torch.equal(occ, ~marked)
    # Points in marked cells are empty for marching.
    centres = torch.stack([c for _, c, _ in _cells(res)]).float()
    codes = torch.tensor([code for code, _, _ in _cells(res)])
    assert torch.equal(g.is_occupied(centres), ~marked[codes])


def test_threshold_mean_leaves_unseen_cells_out(cpu_ext):
    g = kernels.OccupancyGrid([0, 0, 0, 1, 1, 1], resolution=8)
    g.density.fill_(0.003)
    g.density[0, 256:] = UNSEEN
    g.density[0, 7] = 0.005
    # Mean over the seen half ~0.003 < 0.01: only the one cell above it is occupied. Counting the
    # unseen half as zeros would halve the mean and occupy every seen cell.
    g.binarize()
    assert int(g.occupancy().sum()) == 1
    g.binarize(backend="reference")
    assert int(g.occupancy().sum()) == 1


def test_unseen_cells_round_trip_and_can_be_seen_again(cpu_ext):
    g = kernels.OccupancyGrid([-1, -1, -1, 1, 1, 1], resolution=8, n_cascades=2)
    n = g.mark_unseen(*_cams(CAM_A))
    assert n > 0 and (g.density[1] < 0).sum() > (g.density[0] < 0).sum()
    g.update(lambda x: torch.full((x.shape[0],), 1e3), warmup=True)
    h = kernels.OccupancyGrid([-1, -1, -1, 1, 1, 1], resolution=8, n_cascades=2)
    h.load_state_dict(g.state_dict())
    assert torch.equal(h.density, g.density) and torch.equal(h.bits, g.bits)
    h.update(lambda x: torch.full((x.shape[0],), 1e3))
    assert torch.equal(h.density < 0, g.density < 0)
    # A camera that sees the whole box takes cascade 0's marks back: density 0, sampled again.
    wide = (_pose([0.0, 0.0, 3.0]), [8.0, 8.0, 32.0, 32.0], [64.0, 64.0])
    left = h.mark_unseen(*_cams(wide))
    assert not (h.density[0] < 0).any() and h.occupancy(0).all()
    assert left == int((h.density < 0).sum()) < n


def test_update_skips_unseen_cells_whose_bits_a_finer_cascade_sets(cpu_ext):
    g = kernels.OccupancyGrid([-1, -1, -1, 1, 1, 1], resolution=8, n_cascades=2)
    g.update(lambda x: torch.full((x.shape[0],), 1e3), warmup=True)
    # Cascade 1: its centre block (cells 2..5, where cascade 0's occupancy is pooled) unseen, the
    # rest seen and empty; so its only set bits are of unseen cells.
    ijk = torch.stack(torch.meshgrid(*[torch.arange(8)] * 3, indexing="ij"), -1).reshape(-1, 3)
    centre = ((ijk >= 2) & (ijk < 6)).all(1)
    g.density[1] = 0.0
    g.density[1, kernels.morton3d(*ijk[centre].T)] = UNSEEN
    g.binarize()
    assert g.occupancy(1)[2:6, 2:6, 2:6].all() and int(g.occupancy(1).sum()) == 64
    calls = []
    g.update(lambda x: calls.append(x) or torch.full((x.shape[0],), 1e3))
    assert len(calls) == 2  # one call per cascade
    cells = ((calls[1] + 2) / 4 * 8).floor().long()
    assert not ((cells >= 2) & (cells < 6)).all(1).any(), "cascade 1 evaluated an unseen cell"
    assert (g.density[1, kernels.morton3d(*ijk[centre].T)] == UNSEEN).all()
