"""What the scene kinds (nerf, splat) share: `cameras` (poses, intrinsics, rays, normalisation),
`dataset` (the normal form -> pixels and rays), `requests` (render requests -> cameras, outputs),
`encode` (PNG/JPEG/16-bit PNG/npy, WebP/GIF/zip/MP4), `metrics` (PSNR, SSIM, LPIPS where its
weights are present), `evaluate` (per-view test metrics and renders)."""
