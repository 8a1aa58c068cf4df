"""The field: multi-resolution hash grid -> density MLP -> colour MLP with SH view directions."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from kernels import HashGrid, sh_encode

DENSITY_SHIFT = 1.0


class _TruncExp(torch.autograd.Function):
    # instant-ngp's density activation: exp forward, gradient clamped so one large
    # pre-activation cannot blow up the update of the hash table entries feeding it.
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.exp(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * torch.exp(x.clamp(-15.0, 15.0))


def trunc_exp(x: torch.Tensor) -> torch.Tensor:
    return _TruncExp.apply(x)


def _mlp(n_in: int, hidden: int, n_hidden_layers: int, n_out: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    width = n_in
    for _ in range(n_hidden_layers):
        layers += [nn.Linear(width, hidden), nn.ReLU(inplace=True)]
        width = hidden
    layers.append(nn.Linear(width, n_out))
    return nn.Sequential(*layers)


class NerfField(nn.Module):
    """Density and colour over the box [-half, half]^3 (normalised scene coordinates)."""

    def __init__(self, config: dict[str, Any], aabb_half: float = 1.0, backend: str | None = None):
        super().__init__()
        self.backend = backend or config.get("backend", "ext")
        self.aabb_half = float(aabb_half)
        self.sh_degree = int(config["sh_degree"])
        self.geo_features = int(config["geo_features"])
        # ngp: the finest level resolves 2048 cells per unit of aabb_scale.
        self.encoding = HashGrid(
            3,
            config["n_levels"],
            config["features_per_level"],
            config["log2_hashmap_size"],
            config["base_resolution"],
            finest_resolution=config["max_resolution"] * self.aabb_half,
            backend=self.backend,
        )
        self.density_net = _mlp(
            self.encoding.n_output_dims,
            config["density_hidden"],
            config["density_layers"],
            1 + self.geo_features,
        )
        self.color_net = _mlp(
            self.sh_degree**2 + self.geo_features, config["color_hidden"], config["color_layers"], 3
        )

    def _unit(self, x: torch.Tensor) -> torch.Tensor:
        return (x + self.aabb_half) / (2.0 * self.aabb_half)

    def _geometry(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.density_net(self.encoding(self._unit(x)))
        # The -1 shift starts the field nearly transparent (sigma ~ 0.37), so the occupancy
        # grid begins pruning empty space within its first updates instead of after many decays.
        return trunc_exp(h[:, 0] - DENSITY_SHIFT), h[:, 1:]

    def density(self, x: torch.Tensor) -> torch.Tensor:
        """sigma (N,) at points (N, 3)."""
        return self._geometry(x)[0]

    def forward(self, x: torch.Tensor, dirs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """sigma (N,), rgb (N, 3) at points (N, 3) seen along unit directions (N, 3)."""
        sigma, geo = self._geometry(x)
        sh = sh_encode(dirs, self.sh_degree, backend=self.backend)
        rgb = torch.sigmoid(self.color_net(torch.cat([sh, geo], dim=1)))
        return sigma, rgb

    def param_groups(self, weight_decay: float) -> list[dict[str, Any]]:
        """Weight decay on MLP weights only: decaying hash entries would erase rarely seen detail."""
        mlp_w = [
            p
            for n, p in self.named_parameters()
            if not n.startswith("encoding.") and n.endswith("weight")
        ]
        rest = [
            p
            for n, p in self.named_parameters()
            if n.startswith("encoding.") or not n.endswith("weight")
        ]
        return [
            {"params": rest, "weight_decay": 0.0},
            {"params": mlp_w, "weight_decay": weight_decay},
        ]
