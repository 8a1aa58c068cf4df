"""The field: multi-resolution hash grid -> density MLP -> colour MLP with SH view directions."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn

from api_schemas.nerf import NerfConfig
from kernels import HashGrid, mlp_bf16_supported, nerf_mlp, sh_encode, trunc_exp

DENSITY_SHIFT = 1.0


def _mlp(n_in: int, hidden: int, n_hidden_layers: int, n_out: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    width = n_in
    for _ in range(n_hidden_layers):
        layers += [nn.Linear(width, hidden), nn.ReLU(inplace=True)]
        width = hidden
    layers.append(nn.Linear(width, n_out))
    return nn.Sequential(*layers)


def _layers(net: nn.Sequential) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(m.weight, m.bias) for m in net if isinstance(m, nn.Linear)]


class NerfField(nn.Module):
    """Density and colour over the box [-half, half]^3 (normalised scene coordinates)."""

    def __init__(
        self,
        config: NerfConfig | dict[str, Any],
        aabb_half: float = 1.0,
        backend: str | None = None,
    ):
        """`config` with its table size resolved (worker.nerf.trainer.table_log2); a dict
        (scripts, tests) is validated first."""
        super().__init__()
        config = NerfConfig.model_validate(config)
        if config.log2_hashmap_size is None:
            raise ValueError("NerfField needs log2_hashmap_size resolved (trainer.table_log2)")
        self.backend = backend or config.backend
        self.aabb_half = float(aabb_half)
        self.sh_degree = int(config.sh_degree)
        self.geo_features = int(config.geo_features)
        # ngp: the finest level resolves 2048 cells per unit of aabb_scale.
        self.encoding = HashGrid(
            3,
            config.n_levels,
            config.features_per_level,
            config.log2_hashmap_size,
            config.base_resolution,
            finest_resolution=config.max_resolution * self.aabb_half,
            backend=self.backend,
        )
        self.density_net = _mlp(
            self.encoding.n_output_dims,
            config.density_hidden,
            config.density_layers,
            1 + self.geo_features,
        )
        self.color_net = _mlp(
            self.sh_degree**2 + self.geo_features, config.color_hidden, config.color_layers, 3
        )
        # Where the CPU has AVX-512 BF16 the fused op multiplies in bfloat16 itself, 1.5x its
        # float32 speed at the same test PSNR (docs/nerf.md): the default there. `bfloat16` on
        # other CPUs runs nn.Linear under bfloat16 autocast, slower than the fused float32 op (a
        # training step on the quality-bar scene, Sapphire Rapids with AMX, 2 threads: 137 ms
        # against 84 ms), so `auto` is float32 there.
        precision = config.mlp_precision
        native = self.backend == "ext" and mlp_bf16_supported()
        self.fused_precision = (
            "bfloat16" if native and precision in ("auto", "bfloat16") else "float32"
        )
        self.bf16_mlps = self.backend == "ext" and precision == "bfloat16" and not native

    def _unit(self, x: torch.Tensor) -> torch.Tensor:
        return (x + self.aabb_half) / (2.0 * self.aabb_half)

    def _mlp_precision(self, x: torch.Tensor):
        if self.bf16_mlps and x.device.type == "cpu":
            return torch.autocast("cpu", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _fused(self, *inputs: torch.Tensor) -> bool:
        # kernels.nerf_mlp runs both networks over cache-sized blocks of samples (CPU, float32);
        # bfloat16 autocast and CUDA keep nn.Linear.
        return (
            self.backend == "ext"
            and not self.bf16_mlps
            and self.density_net[0].weight.dtype == torch.float32
            and all(t.device.type == "cpu" and t.dtype == torch.float32 for t in inputs)
        )

    def _geometry(self, enc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with self._mlp_precision(enc):
            h = self.density_net(enc).float()
        # The -1 shift starts the field nearly transparent (sigma ~ 0.37), so the occupancy
        # grid begins pruning empty space within its first updates instead of after many decays.
        return trunc_exp(h[:, 0] - DENSITY_SHIFT), h[:, 1:]

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Hash-grid features (N, n_levels * F) at points (N, 3)."""
        return self.encoding(self._unit(x))

    def density(self, x: torch.Tensor) -> torch.Tensor:
        """sigma (N,) at points (N, 3)."""
        return self.density_from(self.encode(x))

    def density_float32(self, x: torch.Tensor) -> torch.Tensor:
        """sigma (N,) with the MLP in float32 whatever the precision. The occupancy grid needs
        it: a fresh field's densities differ by less than a bfloat16 step, so rounded they are
        all equal, none exceeds their mean (the grid's threshold) and every cell would be culled."""
        saved = self.bf16_mlps, self.fused_precision
        self.bf16_mlps, self.fused_precision = False, "float32"
        try:
            return self.density(x)
        finally:
            self.bf16_mlps, self.fused_precision = saved

    def density_from(self, enc: torch.Tensor) -> torch.Tensor:
        """sigma (N,) from features `encode` returned."""
        if self._fused(enc):
            return nerf_mlp(
                enc,
                _layers(self.density_net),
                density_shift=DENSITY_SHIFT,
                precision=self.fused_precision,
            )[0]
        return self._geometry(enc)[0]

    def forward(
        self, x: torch.Tensor, dirs: torch.Tensor, enc: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """sigma (N,), rgb (N, 3) at points (N, 3) seen along unit directions (N, 3).

        `enc`: the features `encode(x)` already gave without gradients; they are reused (and
        wired to the table's gradient) instead of encoding x a second time.
        """
        if enc is None:
            enc = self.encode(x)
        else:
            enc = self.encoding.attach(self._unit(x), enc)
        sh = sh_encode(dirs, self.sh_degree, backend=self.backend)
        if self._fused(enc, sh):
            sigma, rgb = nerf_mlp(
                enc,
                _layers(self.density_net),
                sh,
                _layers(self.color_net),
                density_shift=DENSITY_SHIFT,
                precision=self.fused_precision,
            )
            return sigma, rgb
        sigma, geo = self._geometry(enc)
        with self._mlp_precision(sh):
            rgb = torch.sigmoid(self.color_net(torch.cat([sh, geo], dim=1)).float())
        return sigma, rgb

    def mlp_param_groups(self, weight_decay: float) -> list[dict[str, Any]]:
        """The networks' parameters (the hash table has its own row-sparse optimiser), with weight
        decay on the weight matrices only."""
        mlp = [(n, p) for n, p in self.named_parameters() if not n.startswith("encoding.")]
        return [
            {"params": [p for n, p in mlp if not n.endswith("weight")], "weight_decay": 0.0},
            {"params": [p for n, p in mlp if n.endswith("weight")], "weight_decay": weight_decay},
        ]
