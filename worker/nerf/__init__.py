"""Instant-ngp-style radiance field for `kind=nerf`: model, data, rendering, training.

Modules: `model` (hash grid -> density MLP -> colour MLP), `data` (cameras.json -> pixels and
rays), `rendering` (march, cull, composite; chunked), `trainer` (one optimisation loop with
checkpoint state), `evaluate` (test-split PSNR/SSIM), `encode` (PNG/JPEG/WebP/zip).
"""
