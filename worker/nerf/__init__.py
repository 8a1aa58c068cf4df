"""Instant-ngp-style radiance field for `kind=nerf`: `model` (hash grid -> density MLP -> colour
MLP), `rendering` (march, cull, composite; chunked), `trainer` (one optimisation loop with
checkpoint state). Cameras, data, encodings and metrics are worker.scene's, shared with splat."""
