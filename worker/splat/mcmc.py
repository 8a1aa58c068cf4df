"""3DGS as Markov chain Monte Carlo (Kheradmand et al. 2024), as gsplat's MCMCStrategy does it:
Gaussians are samples, so densification is relocation, not cloning. Every refinement moves the
dead ones (opacity <= min_opacity) onto live ones drawn in proportion to opacity, adds up to 5 %
more the same way until a hard cap, and every step nudges the faint ones with noise shaped by
their covariance. A Gaussian that N samples now share gets the opacity and scale that keep the
sum of the N renders equal to the one before (the paper's eq. 9, the binomial table).
"""

from __future__ import annotations

import math

import torch

N_MAX = 51  # most copies of one Gaussian the relocation formula accounts for (gsplat's table)


def binomial_table(n_max: int = N_MAX) -> torch.Tensor:
    """(n_max, n_max) float table, [n, k] = C(n, k) (zero above the diagonal)."""
    t = torch.zeros(n_max, n_max, dtype=torch.float64)
    for n in range(n_max):
        for k in range(n + 1):
            t[n, k] = math.comb(n, k)
    return t


def relocated(
    opacities: torch.Tensor, scales: torch.Tensor, copies: torch.Tensor, binoms: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Opacity and scale of each of `copies` Gaussians that replace one (eq. 9 of the paper).

    Args:
        opacities: (M,) opacities in (0, 1) of the Gaussians sampled.
        scales: (M, 3) their linear scales.
        copies: (M,) int, how many Gaussians each one becomes (clamped to 1..N_MAX).
        binoms: binomial_table().

    Returns:
        new opacities (M,) = 1 - (1 - o)^(1/N), and scales (M, 3) = s * o / sum_{i=1..N}
        sum_{k<i} C(i-1, k) (-1)^k o_new^(k+1) / sqrt(k+1).
    """
    n = copies.clamp(1, binoms.shape[0]).to(torch.float64)
    o = opacities.to(torch.float64)
    new_o = 1.0 - torch.pow(1.0 - o, 1.0 / n)
    k = torch.arange(binoms.shape[0], dtype=torch.float64, device=o.device)
    # term[m, k] = (-1)^k o_new^(k+1) / sqrt(k+1); the double sum weights it by sum_i C(i-1, k)
    term = (-1.0) ** k / torch.sqrt(k + 1) * torch.pow(new_o[:, None], k + 1)
    b = binoms.to(o.device)
    i = torch.arange(1, b.shape[0] + 1, device=o.device)
    rows = (i[None, :] <= n[:, None]).to(torch.float64)  # (M, n_max): which i of 1..N count
    weights = rows @ b  # (M, n_max): sum over i <= N of C(i-1, k)
    denom = (weights * term).sum(-1)
    new_s = scales.to(torch.float64) * (o / denom)[:, None]
    return new_o.to(opacities.dtype), new_s.to(scales.dtype)


def position_noise(
    means: torch.Tensor,
    log_scales: torch.Tensor,
    quats: torch.Tensor,
    opacity_logits: torch.Tensor,
    scale: float,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """The step's perturbation of the means: N(0, I) through each Gaussian's covariance, times
    sigmoid(-100 (o - 0.005)) (faint ones move, opaque ones stay) and `scale` (lr x noise_lr).

    Returns:
        (N, 3) offsets to add to the means.
    """
    from kernels.splat_project import covariance_3d

    with torch.no_grad():
        o = torch.sigmoid(opacity_logits)
        gate = torch.sigmoid(-100.0 * (o - 0.005))
        eps = torch.randn(means.shape, generator=generator, dtype=means.dtype).to(means.device)
        cov = covariance_3d(torch.exp(log_scales), quats)
        return (cov @ (eps * gate[:, None] * scale)[..., None])[..., 0]


def sample_sources(
    opacities: torch.Tensor, n: int, generator: torch.Generator | None = None
) -> torch.Tensor:
    """n indices drawn with replacement in proportion to opacity (on the generator's CPU)."""
    idx = torch.multinomial(opacities.detach().float().cpu(), n, True, generator=generator)
    return idx.to(opacities.device)
