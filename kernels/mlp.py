"""The NeRF field's density and colour MLPs, fused over blocks of samples (CPU)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from . import _ext
from .hash_grid import _check_backend

Layers = Sequence[tuple[torch.Tensor, torch.Tensor]]

_ISA_NAMES = {512: "avx512", 256: "avx2", 0: "portable"}
ISA_BF16 = 1024  # the compiled op's bfloat16-product instruction set (AVX-512 BF16)
PRECISIONS = ("float32", "bfloat16")


class _TruncExp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.exp(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * torch.exp(x.clamp(-15.0, 15.0))


def trunc_exp(x: torch.Tensor) -> torch.Tensor:
    """exp(x), with the gradient of exp(clamp(x, -15, 15)) (instant-ngp's density activation):
    one large pre-activation cannot blow up the update of the hash-table entries feeding it."""
    return _TruncExp.apply(x)


def _mlp_reference(x: torch.Tensor, layers: Layers) -> torch.Tensor:
    for i, (w, b) in enumerate(layers):
        x = F.linear(x, w, b)
        if i + 1 < len(layers):
            x = torch.relu(x)
    return x


def nerf_mlp_reference(
    enc: torch.Tensor,
    density: Layers,
    sh: torch.Tensor | None = None,
    color: Layers | None = None,
    *,
    density_shift: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Pure-torch `nerf_mlp` (any float dtype and device); the arguments are the same."""
    h = _mlp_reference(enc, density)
    sigma = trunc_exp(h[:, 0] - density_shift)
    if sh is None:
        return sigma, None
    return sigma, torch.sigmoid(_mlp_reference(torch.cat([sh, h[:, 1:]], dim=1), color))


class _NerfMlpFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, enc, sh, shift, n_density, block, isa, *params):
        dens, col = list(params[:n_density]), list(params[n_density:])
        sigma, rgb = _ext.load_cpu().nerf_mlp_forward(enc, sh, dens, col, shift, block, isa)
        rgb = None if sh is None else rgb  # the op returns (0, 3) without a colour network
        # The inputs and outputs, no activations: the backward recomputes each block's hidden
        # layers; sigma and rgb spare it the heads' exponentials and the last layer.
        ctx.save_for_backward(enc, sh, sigma, rgb, *params)
        ctx.meta = (shift, n_density, block, isa)
        return sigma if rgb is None else (sigma, rgb)

    @staticmethod
    @once_differentiable
    def backward(ctx, g_sigma, g_rgb=None):
        enc, sh, sigma, rgb, *params = ctx.saved_tensors
        shift, n_density, block, isa = ctx.meta
        need = ctx.needs_input_grad
        need_params = any(need[6:])
        g_enc, g_sh, *g_params = _ext.load_cpu().nerf_mlp_backward(
            enc,
            sh,
            params[:n_density],
            params[n_density:],
            shift,
            sigma,
            rgb,
            None if g_sigma is None else g_sigma.contiguous(),
            None if g_rgb is None else g_rgb.contiguous(),
            need[0],
            need[1],
            need_params,
            block,
            isa,
        )
        if not need_params:
            g_params = [None] * len(params)
        g_enc = g_enc if need[0] else None  # the op returns (0,) for gradients not asked for
        g_sh = g_sh if need[1] else None
        return (g_enc, g_sh, None, None, None, None, *g_params)


def _flat(layers: Layers) -> list[torch.Tensor]:
    return [t.contiguous() for wb in layers for t in wb]


def _nerf_mlp_ext(enc, density, sh, color, density_shift, block=0, isa=-1):
    # block (rows per block, 0: automatic) and isa (0, 256, 512, 1024 for bfloat16 products; -1:
    # the best float32 one the CPU has) are for the tests and benchmarks.
    if enc.device.type != "cpu":
        raise ValueError(
            f"nerf_mlp: the compiled op runs on the CPU only, got {enc.device} "
            "(use backend='reference')"
        )
    dens = _flat(density)
    col = _flat(color) if color is not None else []
    out = _NerfMlpFn.apply(
        enc.contiguous(),
        None if sh is None else sh.contiguous(),
        float(density_shift),
        len(dens),
        int(block),
        int(isa),
        *dens,
        *col,
    )
    return (out, None) if sh is None else out


def nerf_mlp(
    enc: torch.Tensor,
    density: Layers,
    sh: torch.Tensor | None = None,
    color: Layers | None = None,
    *,
    density_shift: float = 1.0,
    backend: str = "ext",
    precision: str = "float32",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The NeRF field's MLPs: h = density(enc), sigma = trunc_exp(h[:, 0] - density_shift),
    rgb = sigmoid(color([sh, h[:, 1:]])). Every layer but a network's last is Linear + ReLU.

    The compiled op (CPU, float32) runs both networks on blocks of rows that stay in cache, and
    its backward recomputes each block's activations instead of keeping them; the pure-torch
    reference runs nn.functional.linear layer by layer. Differentiable w.r.t. enc, sh and every
    weight and bias (double backward is not supported by the compiled op).

    Args:
        enc: (N, n_in) features (the hash-grid encoding).
        density: the density network as (weight (out, in), bias (out,)) pairs, nn.Linear's
            layout, from n_in to 1 + G outputs (G >= 0 geometry features); 1 to 16 layers.
        sh: (N, S) direction encoding, or None for sigma alone (no colour network).
        color: the colour network's pairs, from S + G inputs to 3 outputs; needed with sh.
        density_shift: subtracted from h[:, 0] before trunc_exp.
        backend: "ext" (compiled, CPU float32 only) or "reference" (pure torch).
        precision: "float32", or "bfloat16": the compiled op multiplies operands rounded to
            bfloat16 and sums the products in float32 (inputs, outputs, gradients and the weights
            stay float32), twice the multiply-adds per instruction of float32 on CPUs with AVX-512
            BF16 (`mlp_bf16_supported()`; elsewhere a ValueError). The reference ignores it.

    Returns:
        sigma (N,), and rgb (N, 3) in (0, 1) or None when sh is None.

    Raises:
        ValueError: shapes that do not chain, sh without color (or the reverse), or (compiled)
            a dtype other than float32 or a tensor off the CPU.
    """
    _check_backend(backend)
    if (sh is None) != (color is None):
        raise ValueError("nerf_mlp: pass sh and color together (or neither, for sigma alone)")
    if not density:
        raise ValueError("nerf_mlp: the density network needs at least one layer")
    if precision not in PRECISIONS:
        raise ValueError(f"nerf_mlp: precision must be one of {PRECISIONS}, got {precision!r}")
    if backend == "reference":
        return nerf_mlp_reference(enc, density, sh, color, density_shift=density_shift)
    if precision == "bfloat16":
        if not mlp_bf16_supported():
            raise ValueError("nerf_mlp: bfloat16 products need a CPU with AVX-512 BF16")
        return _nerf_mlp_ext(enc, density, sh, color, density_shift, isa=ISA_BF16)
    return _nerf_mlp_ext(enc, density, sh, color, density_shift)


def mlp_bf16_supported() -> bool:
    """Whether this CPU runs nerf_mlp's bfloat16 products (AVX-512 BF16). Builds the extension."""
    return bool(_ext.load_cpu().mlp_bf16_supported())


def mlp_isa() -> str:
    """The instruction set the compiled nerf_mlp uses on this CPU: "avx512", "avx2" or
    "portable" (plain C++, compiled without vector extensions). Builds the extension."""
    return _ISA_NAMES[int(_ext.load_cpu().mlp_isa())]
