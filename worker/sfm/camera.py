"""Which COLMAP camera model SfM fits, and how a fitted camera reads in the normal form."""

from __future__ import annotations

from core.scene_format import DISTORTION_KEYS

# `auto` fits OPENCV (phone lenses need its radial and tangential terms; nerfstudio's
# ns-process-data fits it too), mapped as pinhole cameras with the distortion fitted once at the
# end over every view: a distortion refined from the first views while mapping is poorly pinned
# down and drifts. On instant-ngp's fox (50 photos at 1080x1920, SIFT at 1600 px) a free OPENCV
# placed 9 cameras 2.25 camera spreads off COLMAP's reference poses, rigidly shifted along the
# repeating wallpaper, in each of 3 runs; fitted at the end every camera is within 0.42 %. On
# experiments/sfm_capture.py's 200 px views a free SIMPLE_RADIAL settled on k1 = -0.54 and poses 12
# degrees off, while ignoring the lens costs a phone lens' worth of pose error (on
# experiments/capture_scene.py's 180x320 photos, k1 = -0.08: PINHOLE 0.41 degrees median, the final
# fit 0.14; experiments/sfm_models.py).
MODELS = ("SIMPLE_PINHOLE", "PINHOLE", "SIMPLE_RADIAL", "RADIAL", "OPENCV")


def choose_model(setting: str) -> tuple[str, bool]:
    """The COLMAP model SfM fits and whether its distortion waits for the end of mapping.
    `setting`: SFM_CAMERA_MODEL ("auto" or one of MODELS)."""
    if setting != "auto":
        if setting not in MODELS:
            raise ValueError(f"SFM_CAMERA_MODEL {setting!r} is not one of {', '.join(MODELS)}")
        return setting, False
    return "OPENCV", True


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
