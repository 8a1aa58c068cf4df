"""The normal-form scene dataset that intake writes and the worker reads (`dataset/cameras.json`
beside `dataset/images/`; docs/architecture.md has the schema). Constants both sides must agree
on live here so neither imports the other."""

from __future__ import annotations

from api_schemas.camera import RIGID_TOL as REQUEST_RIGID_TOL  # noqa: F401  (render requests)

FORMAT_VERSION = 1
CAMERAS_FILE = "cameras.json"
IMAGES_DIR = "images"

# OpenCV radial-tangential coefficients, in normalised image coordinates with y down.
DISTORTION_KEYS = ("k1", "k2", "k3", "p1", "p2")

# Largest |R^T R - I| entry accepted for an uploaded camera rotation. Exporters write poses as
# float32 or rounded decimals; anything looser is a scaled or sheared matrix, not a camera.
UPLOAD_RIGID_TOL = 2e-3

# Every TEST_EVERY-th frame (file order) is held out when the upload names no test split
# (the LLFF / mip-NeRF 360 convention).
TEST_EVERY = 8
MIN_TRAIN_VIEWS = 3
