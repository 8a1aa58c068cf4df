"""Which COLMAP camera model SfM fits, and how a fitted camera reads in the normal form."""

from __future__ import annotations

from core.scene_format import DISTORTION_KEYS

# Long side from which a capture counts as phone/camera footage: thousands of keypoints pin down
# OPENCV's eight parameters, and phone lenses need its radial and tangential terms (nerfstudio's
# ns-process-data fits OPENCV too). Smaller images get PINHOLE: with a few hundred keypoints a
# free distortion term is poorly constrained (on experiments/sfm_capture.py's 200 px views
# SIMPLE_RADIAL settled on k1 = -0.54 and poses 12 degrees off; PINHOLE: 0.3 degrees), and a
# lens' distortion at that size is about a pixel.
OPENCV_MIN_LONG_SIDE = 1000
MODELS = ("SIMPLE_PINHOLE", "PINHOLE", "SIMPLE_RADIAL", "RADIAL", "OPENCV")


def choose_model(setting: str, width: int, height: int) -> str:
    """`setting`: SFM_CAMERA_MODEL ("auto" or one of MODELS)."""
    if setting != "auto":
        if setting not in MODELS:
            raise ValueError(f"SFM_CAMERA_MODEL {setting!r} is not one of {', '.join(MODELS)}")
        return setting
    return "OPENCV" if max(width, height) >= OPENCV_MIN_LONG_SIDE else "PINHOLE"


def intrinsics(model: str, params_info: str, params) -> dict:
    """fx, fy, cx, cy (pixels; COLMAP and the normal form both put pixel centres at +0.5) and the
    OpenCV `distortion` of a fitted COLMAP camera."""
    if model not in MODELS:
        raise ValueError(f"camera model {model} has no normal form")
    named = dict(zip((n.strip() for n in params_info.split(",")), (float(v) for v in params)))
    if "f" in named:
        named["fx"] = named["fy"] = named.pop("f")
    if "k" in named:
        named["k1"] = named.pop("k")
    dist = {k: named[k] for k in DISTORTION_KEYS if named.get(k)}
    return {
        "fx": named["fx"],
        "fy": named["fy"],
        "cx": named["cx"],
        "cy": named["cy"],
        "distortion": dist,
    }
