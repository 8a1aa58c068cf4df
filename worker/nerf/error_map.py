"""instant-ngp's error map: training pixels drawn where the field is still wrong.

Every training image is split into CELLS x CELLS cells, each holding a running mean of the
squared error of the rays drawn from it. A batch takes `share` of its rays from cells in
proportion to that error (a uniform pixel inside the cell, and the same jitter as uniform rays),
the rest uniformly over all pixels, so no pixel is ever starved. The loss is not reweighted
(instant-ngp's choice): hard pixels weigh more while they are hard, and the map evens out as
they are learned. Cells start at error 1, so the first draws are uniform.
"""

from __future__ import annotations

import torch

from worker.scene.dataset import Dataset

CELLS = 32
DECAY = 0.8  # a cell's error keeps this much of its old value each time its rays are scored


class ErrorMap:
    def __init__(self, data: Dataset, share: float, cells: int = CELLS):
        if data.keep is not None:
            raise ValueError("the error map does not draw around masks; use uniform sampling")
        self.data = data
        self.share = float(share)
        self.g = cells
        n = len(data)
        self.error = torch.ones(n * cells * cells)
        self.heights = torch.tensor([f.h for f in data.frames], dtype=torch.int64)

    def sample(self, n: int, generator: torch.Generator, jitter: float = 0.0):
        """n rays as Dataset.sample draws them, and their global pixel indices (n,)."""
        k = int(n * self.share)
        uniform = torch.randint(0, self.data.n_pixels, (n - k,), generator=generator)
        cell = torch.multinomial(self.error + 1e-8, k, replacement=True, generator=generator)
        g = self.g
        img, cy, cx = cell // (g * g), (cell // g) % g, cell % g
        w, h = self.data.widths[img], self.heights[img]
        x0, x1 = cx * w // g, (cx + 1) * w // g
        y0, y1 = cy * h // g, (cy + 1) * h // g
        u = torch.rand(k, 2, generator=generator)
        # a cell of an image smaller than CELLS pixels across may be empty: clamp into the image
        px = torch.minimum(x0 + (u[:, 0] * (x1 - x0).clamp(min=1)).long(), w - 1)
        py = torch.minimum(y0 + (u[:, 1] * (y1 - y0).clamp(min=1)).long(), h - 1)
        idx = torch.cat([uniform, self.data.starts[img] + py * w + px])
        at = 0.5 + (torch.rand(n, 2, generator=generator) - 0.5) * float(jitter) if jitter else None
        o, d, rgba = self.data.rays_of(idx, at)
        return o, d, rgba, idx

    def cells_of(self, idx: torch.Tensor) -> torch.Tensor:
        img = torch.searchsorted(self.data.starts, idx, right=True) - 1
        local = idx - self.data.starts[img]
        w, h = self.data.widths[img], self.heights[img]
        py, px = local // w, local % w
        # the inverse of sample's cell bounds (cell c starts at floor(c * w / g))
        g = self.g
        return img * g * g + ((py + 1) * g - 1) // h * g + ((px + 1) * g - 1) // w

    def update(self, idx: torch.Tensor, error: torch.Tensor) -> None:
        """Per-ray squared errors (n,) of the rays at pixels idx (n,) into their cells."""
        cell = self.cells_of(idx)
        sums = torch.zeros_like(self.error).index_add_(0, cell, error.float())
        counts = torch.bincount(cell, minlength=len(self.error))
        seen = counts > 0
        mean = sums[seen] / counts[seen]
        self.error[seen] = DECAY * self.error[seen] + (1 - DECAY) * mean
