"""3D Gaussian splatting for kind=splat: the Gaussians and their rendering (model), training with
densification (trainer), SSIM loss (ssim) and the standard 3DGS PLY export (ply)."""
