"""Multi-resolution hash encoding (instant-ngp), 2D or 3D."""

from __future__ import annotations

import math

import torch
from torch import nn

from . import _ext

PRIMES = (1, 2654435761, 805459861)


def level_layout(
    n_input_dims: int,
    n_levels: int,
    log2_hashmap_size: int,
    base_resolution: float,
    per_level_scale: float,
):
    """Per-level scale (float32 values), grid resolution, row offsets and hashed flag.

    scale_l = base * per_level_scale^l - 1 and a point maps to scale_l * x + 0.5 (tiny-cuda-nn).
    The resolution is floor(scale_l + 0.5) + 2, so the upper corner of x = 1.0 still lies inside
    the dense grid (tiny-cuda-nn's ceil(scale) + 1 aliases it into the next row).
    """
    table = 1 << log2_hashmap_size
    scales, res, offsets, hashed = [], [], [0], []
    for level in range(n_levels):
        s = float(torch.tensor(base_resolution * per_level_scale**level - 1.0, dtype=torch.float32))
        r = int(math.floor(s + 0.5)) + 2
        dense = r**n_input_dims
        if dense <= table:
            rows = min(-(-dense // 8) * 8, table)
            hashed.append(False)
        else:
            rows = table
            hashed.append(True)
        scales.append(s)
        res.append(r)
        offsets.append(offsets[-1] + rows)
    return (
        torch.tensor(scales, dtype=torch.float32),
        torch.tensor(res, dtype=torch.int64),
        torch.tensor(offsets, dtype=torch.int64),
        torch.tensor(hashed, dtype=torch.bool),
    )


def hash_grid_reference(
    x: torch.Tensor, table: torch.Tensor, scales, resolution, offsets, hashed
) -> torch.Tensor:
    """Pure-torch encoding, differentiable w.r.t. the table through autograd."""
    n, d = x.shape
    f = table.shape[1]
    xc = torch.nan_to_num(x, nan=0.0).clamp(0.0, 1.0)
    outs = []
    for level in range(len(resolution)):
        scale = torch.tensor(float(scales[level]), dtype=torch.float32).to(x.dtype)
        pos = xc * scale.to(x.device) + 0.5
        fl = torch.floor(pos)
        base = fl.long()
        frac = pos - fl
        res = int(resolution[level])
        rows = int(offsets[level + 1] - offsets[level])
        idxs, ws = [], []
        for corner in range(1 << d):
            w = torch.ones(n, dtype=x.dtype, device=x.device)
            g = []
            for dim in range(d):
                hi = (corner >> dim) & 1
                g.append(base[:, dim] + hi)
                w = w * (frac[:, dim] if hi else 1.0 - frac[:, dim])
            if bool(hashed[level]):
                h = torch.zeros_like(g[0])
                for dim in range(d):
                    h = h ^ ((g[dim] * PRIMES[dim]) & 0xFFFFFFFF)
                idx = h % rows
            else:
                idx = torch.zeros_like(g[0])
                stride = 1
                for dim in range(d):
                    idx = idx + g[dim] * stride
                    stride *= res
            idxs.append(idx)
            ws.append(w)
        # One gather per level; index_select's backward is an index_add (the fastest torch scatter).
        rows_idx = torch.stack(idxs, 1).reshape(-1) + int(offsets[level])
        corners = table.index_select(0, rows_idx).view(n, 1 << d, f)
        feat = (torch.stack(ws, 1)[:, :, None] * corners).sum(1)
        outs.append(feat)
    return torch.cat(outs, dim=1)


class _HashGridFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, table, scales, resolution, offsets, hashed, encoded=None, row_grad=None):
        if encoded is None:
            mod = _ext.for_tensor(x)
            encoded = mod.hash_grid_forward(x, table, offsets, resolution, scales, hashed)
        ctx.save_for_backward(x)
        ctx.meta = (scales, resolution, offsets, hashed, table.shape[0], table.shape[1])
        ctx.row_grad = row_grad
        return encoded

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        scales, resolution, offsets, hashed, rows, f = ctx.meta
        mod = _ext.for_tensor(x)
        if ctx.row_grad is not None:
            # Into the optimiser's persistent gradient; the table itself gets no dense .grad.
            ctx.row_grad.accumulate(
                mod, x, grad_out.contiguous(), offsets, resolution, scales, hashed
            )
            return (None,) * 8
        grad_table = mod.hash_grid_backward(
            x, grad_out.contiguous(), rows, f, offsets, resolution, scales, hashed
        )
        return None, grad_table, None, None, None, None, None, None


class RowGrad:
    """A table gradient kept between steps: dense (rows, F) values plus a touched flag per row.

    The backward adds into it and flags rows; HashGridAdam updates the flagged rows and clears them,
    so a step costs what the batch touched, not the table size.
    """

    def __init__(self, table: torch.Tensor):
        self.values = torch.zeros_like(table)
        self.touched = torch.zeros(table.shape[0], dtype=torch.uint8, device=table.device)

    def accumulate(self, mod, x, grad_out, offsets, resolution, scales, hashed) -> None:
        mod.hash_grid_backward_rows(
            x, grad_out, self.values, self.touched, offsets, resolution, scales, hashed
        )


class HashGrid(nn.Module):
    """Multi-resolution hash encoding: input in [0, 1]^d (clamped) -> (N, n_levels * n_features_per_level).

    per_level_scale defaults to the value that makes the finest level reach `finest_resolution`
    (instant-ngp uses 2048 x aabb scale). Parameters start uniform in +-1e-4.
    """

    def __init__(
        self,
        n_input_dims: int = 3,
        n_levels: int = 16,
        n_features_per_level: int = 2,
        log2_hashmap_size: int = 19,
        base_resolution: float = 16,
        per_level_scale: float | None = None,
        *,
        finest_resolution: float = 2048,
        backend: str = "ext",
        dtype: torch.dtype = torch.float32,
    ):
        super().__init__()
        if n_input_dims not in (2, 3):
            raise ValueError(f"n_input_dims must be 2 or 3, got {n_input_dims}")
        if not 14 <= log2_hashmap_size <= 24:
            raise ValueError(f"log2_hashmap_size must be in 14..24, got {log2_hashmap_size}")
        if not 1 <= n_levels <= 32:
            raise ValueError(f"n_levels must be in 1..32, got {n_levels}")
        if n_features_per_level not in (1, 2, 4, 8):
            raise ValueError(
                f"n_features_per_level must be 1, 2, 4 or 8, got {n_features_per_level}"
            )
        _check_backend(backend)
        if per_level_scale is None:
            per_level_scale = math.exp(
                math.log(finest_resolution / base_resolution) / max(n_levels - 1, 1)
            )
        self.n_input_dims = n_input_dims
        self.n_levels = n_levels
        self.n_features_per_level = n_features_per_level
        self.log2_hashmap_size = log2_hashmap_size
        self.base_resolution = base_resolution
        self.per_level_scale = per_level_scale
        self.backend = backend
        scales, res, offsets, hashed = level_layout(
            n_input_dims, n_levels, log2_hashmap_size, base_resolution, per_level_scale
        )
        # Plain CPU tensors, not buffers: kernels read them on the host, so .to("cuda") must not move them.
        self.scales, self.resolution, self.offsets, self.hashed = scales, res, offsets, hashed
        self.params = nn.Parameter(torch.empty(int(offsets[-1]), n_features_per_level, dtype=dtype))
        # Set by HashGridAdam on CPU: the compiled backward then writes into it (row-sparse).
        self.row_grad: RowGrad | None = None
        self.reset_parameters()

    @property
    def n_output_dims(self) -> int:
        return self.n_levels * self.n_features_per_level

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.params.uniform_(-1e-4, 1e-4)

    def forward(self, x: torch.Tensor, backend: str | None = None) -> torch.Tensor:
        """Encode points; gradients flow to the table `params` only.

        Args:
            x: (N, n_input_dims) points in [0, 1]^d (clamped; NaN -> 0), cast to the table dtype.
            backend: "ext" or "reference"; default the module's.

        Returns:
            (N, n_levels * n_features_per_level) features, level-major.
        """
        backend = backend or self.backend
        _check_backend(backend)
        x = self._check_input(x)
        meta = (self.scales, self.resolution, self.offsets, self.hashed)
        if backend == "reference":
            return hash_grid_reference(x, self.params, *meta)
        return _HashGridFn.apply(x.detach().contiguous(), self.params, *meta, None, self._sink())

    def attach(self, x: torch.Tensor, encoded: torch.Tensor) -> torch.Tensor:
        """`encoded` (N, n_output_dims), computed earlier by this grid at x (N, d) without
        gradients, returned as if `self(x)` had produced it: the backward scatters into the
        table at x. Spares the second forward when samples are encoded once for culling and the
        kept ones then need gradients. The reference backend recomputes instead."""
        x = self._check_input(x)
        if self.backend == "reference" or not torch.is_grad_enabled():
            return self(x) if self.backend == "reference" else encoded
        meta = (self.scales, self.resolution, self.offsets, self.hashed)
        return _HashGridFn.apply(
            x.detach().contiguous(), self.params, *meta, encoded.detach(), self._sink()
        )

    def _check_input(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2 or x.shape[1] != self.n_input_dims:
            raise ValueError(
                f"HashGrid expects (N, {self.n_input_dims}) inputs, got {tuple(x.shape)}"
            )
        return x.to(self.params.dtype)

    def _sink(self) -> RowGrad | None:
        rg = self.row_grad
        return (
            rg if rg is not None and torch.is_grad_enabled() and self.params.requires_grad else None
        )

    def extra_repr(self) -> str:
        return (
            f"n_input_dims={self.n_input_dims}, n_levels={self.n_levels}, "
            f"n_features_per_level={self.n_features_per_level}, log2_hashmap_size={self.log2_hashmap_size}, "
            f"base_resolution={self.base_resolution}, per_level_scale={self.per_level_scale:.5f}"
        )


def _check_backend(backend: str) -> None:
    if backend not in ("ext", "reference"):
        raise ValueError(f"backend must be 'ext' or 'reference', got {backend!r}")


class HashGridAdam:
    """Adam for a HashGrid's table that updates only the rows a batch touched.

    tiny-cuda-nn's Adam (instant-ngp) skips hash entries whose gradient is zero and keeps a step
    count per entry for the bias correction; this does the same per row, with torch.optim.Adam's
    update formula. On CPU with the compiled backend the backward adds into a persistent RowGrad
    and the step visits only the flagged rows (no dense gradient, zero-fill or optimiser pass per
    step); elsewhere (CUDA, the reference backend) the table's dense `.grad` is used and rows
    whose gradient is all zero are left alone, which is the same update.
    """

    def __init__(
        self,
        grid: HashGrid,
        lr: float,
        betas: tuple[float, float] = (0.9, 0.99),
        eps: float = 1e-15,
    ):
        self.grid = grid
        self.lr = float(lr)
        self.betas = (float(betas[0]), float(betas[1]))
        self.eps = float(eps)
        p = grid.params
        self.exp_avg = torch.zeros_like(p, memory_format=torch.contiguous_format)
        self.exp_avg_sq = torch.zeros_like(p, memory_format=torch.contiguous_format)
        self.steps = torch.zeros(p.shape[0], dtype=torch.int32, device=p.device)
        self._n_steps = 0  # step() calls: no row's count exceeds it
        self._bias = (torch.zeros(0), torch.zeros(0))
        if p.device.type == "cpu" and grid.backend == "ext":
            grid.row_grad = RowGrad(p.detach())

    def zero_grad(self) -> None:
        self.grid.params.grad = None

    def _bias_tables(self, max_step: int, like: torch.Tensor):
        # bc1[t] = 1 - b1^t, sqrt(1 - b2^t) for t = 0..; grown by doubling, in float64 then cast.
        if self._bias[0].numel() <= max_step + 1 or self._bias[0].dtype != like.dtype:
            n = max(1024, 2 * (max_step + 2))
            t = torch.arange(n, dtype=torch.float64)
            b1, b2 = self.betas
            self._bias = (
                (1 - b1**t).to(like.dtype).to(like.device),
                torch.sqrt(1 - b2**t).to(like.dtype).to(like.device),
            )
        return self._bias

    @torch.no_grad()
    def step(self) -> None:
        p = self.grid.params
        b1, b2 = self.betas
        rg = self.grid.row_grad
        # Per-row counts never exceed the number of steps taken, which bounds the lookups
        # without scanning every row's count (on a GPU, without waiting for it).
        self._n_steps += 1
        if rg is not None:
            bc1, bc2 = self._bias_tables(self._n_steps, p)
            _ext.for_tensor(p).hash_grid_adam(
                p.data,
                rg.values,
                rg.touched,
                self.exp_avg,
                self.exp_avg_sq,
                self.steps,
                bc1,
                bc2,
                self.lr,
                b1,
                b2,
                self.eps,
            )
        if p.grad is not None:
            self._dense_step(p.grad)
            p.grad = None

    def _dense_step(self, g: torch.Tensor) -> None:
        if g.device.type != "cpu":
            return self._masked_step(g)
        p = self.grid.params
        b1, b2 = self.betas
        rows = (g != 0).any(1).nonzero().squeeze(1)
        if rows.numel() == 0:
            return
        t = self.steps[rows].long() + 1
        self.steps[rows] = t.to(torch.int32)
        bc1, bc2 = self._bias_tables(self._n_steps, p)
        gr = g[rows]
        m = self.exp_avg[rows] * b1 + (1 - b1) * gr
        v = self.exp_avg_sq[rows] * b2 + (1 - b2) * gr * gr
        self.exp_avg[rows] = m
        self.exp_avg_sq[rows] = v
        denom = v.sqrt() / bc2[t][:, None] + self.eps
        p.data[rows] -= (self.lr / bc1[t])[:, None] * m / denom

    def _masked_step(self, g: torch.Tensor) -> None:
        # `_dense_step` over every row with the untouched ones masked out: the same update, with
        # no `nonzero` (on a GPU its size is a host synchronisation) and elementwise passes a GPU
        # runs in a few hundred microseconds over the largest table.
        p = self.grid.params
        b1, b2 = self.betas
        touched = (g != 0).any(1)
        t = self.steps.long() + touched.long()
        self.steps.copy_(t)
        bc1, bc2 = self._bias_tables(self._n_steps, p)
        m = torch.where(touched[:, None], self.exp_avg * b1 + (1 - b1) * g, self.exp_avg)
        v = torch.where(touched[:, None], self.exp_avg_sq * b2 + (1 - b2) * g * g, self.exp_avg_sq)
        self.exp_avg.copy_(m)
        self.exp_avg_sq.copy_(v)
        denom = v.sqrt() / bc2[t][:, None] + self.eps
        update = (self.lr / bc1[t])[:, None] * m / denom
        p.data.sub_(torch.where(touched[:, None], update, torch.zeros_like(update)))

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"exp_avg": self.exp_avg, "exp_avg_sq": self.exp_avg_sq, "steps": self.steps}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        for k in ("exp_avg", "exp_avg_sq", "steps"):
            getattr(self, k).copy_(state[k])
        self._n_steps = int(self.steps.max()) if self.steps.numel() else 0
