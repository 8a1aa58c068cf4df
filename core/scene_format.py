"""The normal-form scene dataset that intake writes and the worker reads (`dataset/cameras.json`
beside `dataset/images/` and, for masked captures, `dataset/masks/`; docs/architecture.md has the
schema). Constants both sides must agree on live here so neither imports the other;
`core.scene_build` writes the form."""

from __future__ import annotations

from api_schemas.camera import RIGID_TOL as REQUEST_RIGID_TOL  # noqa: F401  (render requests)

FORMAT_VERSION = 1
CAMERAS_FILE = "cameras.json"
IMAGES_DIR = "images"
MASKS_DIR = "masks"

# Camera models of a frame's `camera_model` (COLMAP's names). PINHOLE frames may carry OpenCV
# radial-tangential `distortion`; OPENCV_FISHEYE frames carry the Kannala-Brandt equidistant
# coefficients. Both act on normalised image coordinates with y down.
PINHOLE = "PINHOLE"
FISHEYE = "OPENCV_FISHEYE"
DISTORTION_KEYS = ("k1", "k2", "k3", "p1", "p2")
FISHEYE_KEYS = ("k1", "k2", "k3", "k4")

# Largest |R^T R - I| entry accepted for an uploaded camera rotation. Exporters write poses as
# float32 or rounded decimals; anything looser is a scaled or sheared matrix, not a camera.
UPLOAD_RIGID_TOL = 2e-3

# Every TEST_EVERY-th frame (file order) is held out when the upload names no test split
# (the LLFF / mip-NeRF 360 convention).
TEST_EVERY = 8
MIN_TRAIN_VIEWS = 3


class SceneError(ValueError):
    """Input that cannot become a normal-form dataset; the message is for the uploader."""
