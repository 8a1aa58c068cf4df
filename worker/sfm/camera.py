"""Which COLMAP camera model SfM fits, and how a fitted camera reads in the normal form."""

from __future__ import annotations

from core.scene_format import DISTORTION_KEYS

# Long side from which a capture counts as phone/camera footage: thousands of keypoints pin down
# OPENCV's eight parameters while mapping, and phone lenses need its radial and tangential terms
# (nerfstudio's ns-process-data fits OPENCV too). Smaller images also get OPENCV, but mapped as
# pinhole cameras and the distortion fitted once at the end over every view: with a few
# hundred keypoints a distortion refined from the first views is poorly constrained (on
# experiments/sfm_capture.py's 200 px views a free SIMPLE_RADIAL settled on k1 = -0.54 and poses
# 12 degrees off), while ignoring it costs a phone lens' worth of pose error (on
# experiments/capture_scene.py's 180x320 photos, k1 = -0.08: PINHOLE 0.41 degrees median, the
# final fit 0.14; experiments/sfm_models.py).
OPENCV_MIN_LONG_SIDE = 1000
MODELS = ("SIMPLE_PINHOLE", "PINHOLE", "SIMPLE_RADIAL", "RADIAL", "OPENCV")


def choose_model(setting: str, width: int, height: int) -> tuple[str, bool]:
    """The COLMAP model SfM fits and whether its distortion waits for the end of mapping.
    `setting`: SFM_CAMERA_MODEL ("auto" or one of MODELS)."""
    if setting != "auto":
        if setting not in MODELS:
            raise ValueError(f"SFM_CAMERA_MODEL {setting!r} is not one of {', '.join(MODELS)}")
        return setting, False
    return "OPENCV", max(width, height) < OPENCV_MIN_LONG_SIDE


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
