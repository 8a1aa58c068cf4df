"""The Gaussians as glTF 2.0 (binary .glb) with Khronos' KHR_gaussian_splatting extension: one mesh
of one POINTS primitive whose attributes are, per Gaussian (all float32, as the extension defines
them for its `ellipse` kernel):

    POSITION                                   VEC3  centre (accessor min/max as glTF requires)
    COLOR_0                                    VEC4  u8 normalised: SH_C0 * DC + 0.5 and opacity,
                                                     for viewers that draw only points
    KHR_gaussian_splatting:ROTATION            VEC4  unit quaternion (x, y, z, w)
    KHR_gaussian_splatting:SCALE               VEC3  linear scales (exp of the log scales)
    KHR_gaussian_splatting:OPACITY             SCALAR sigmoid(opacity logit), in [0, 1]
    KHR_gaussian_splatting:SH_DEGREE_0_COEF_0  VEC3  DC coefficients (RGB)
    KHR_gaussian_splatting:SH_DEGREE_l_COEF_n  VEC3  l = 1..3, n = 0..2l: the other bands (RGB)

and the primitive's extension object says kernel `ellipse`, colour space `srgb_rec709_display`
(3DGS trains on display-referred sRGB photos), sorting `cameraDistance`, projection
`perspective`. glTF is y-up with the camera looking along -z (RUB), so the Gaussians are turned
from the 3DGS PLY's axes as for `.spz` (y and z negated, rotations and SH bands to match): the
same coordinates as the job's .spz. The extension has no field for mip-splatting's filter; a
job trained with it says so in the primitive's `extras` (`{"antialiased": true}`)."""

from __future__ import annotations

import json
import struct

import numpy as np
import torch

from worker.exports.splat_files import nonempty_world_table
from worker.exports.spz import SH_FLIP_RDF_RUB
from worker.splat.model import SH_C0

EXTENSION = "KHR_gaussian_splatting"
FLOAT, UNSIGNED_BYTE, ARRAY_BUFFER, POINTS = 5126, 5121, 34962, 0
GLB_MAGIC, JSON_CHUNK, BIN_CHUNK = 0x46546C67, 0x4E4F534A, 0x004E4942
FLIP = np.array([1.0, -1.0, -1.0])  # PLY's RDF axes -> glTF's RUB


def _pad4(data: bytes, fill: bytes = b"\0") -> bytes:
    return data + fill * (-len(data) % 4)


def glb_bytes(
    params: dict[str, torch.Tensor],
    normalization: dict | None,
    antialiased: bool = False,
    min_opacity: float = 0.0,
) -> tuple[bytes, int]:
    """(.glb bytes, number of Gaussians written)."""
    g = nonempty_world_table(params, normalization, min_opacity)
    n = len(g["means"])
    pos = g["means"] * FLIP
    wxyz = g["quats"] * np.array([1.0, 1.0, -1.0, -1.0])  # q_x(180) q q_x(180)^-1
    rest = g["sh_rest"] * SH_FLIP_RDF_RUB[: g["sh_rest"].shape[1], None]
    rgba = np.concatenate([SH_C0 * g["sh_dc"] + 0.5, g["opacity"][:, None]], 1)
    attrs: list[tuple[str, np.ndarray, str]] = [
        ("POSITION", pos.astype("<f4"), "VEC3"),
        ("COLOR_0", np.clip(np.round(rgba * 255), 0, 255).astype(np.uint8), "VEC4"),
        (f"{EXTENSION}:ROTATION", wxyz[:, [1, 2, 3, 0]].astype("<f4"), "VEC4"),
        (f"{EXTENSION}:SCALE", np.exp(g["log_scales"]).astype("<f4"), "VEC3"),
        (f"{EXTENSION}:OPACITY", g["opacity"].astype("<f4"), "SCALAR"),
        (f"{EXTENSION}:SH_DEGREE_0_COEF_0", g["sh_dc"].astype("<f4"), "VEC3"),
    ]
    first = 0
    for degree in range(1, g["degree"] + 1):
        for c in range(2 * degree + 1):
            name = f"{EXTENSION}:SH_DEGREE_{degree}_COEF_{c}"
            attrs.append((name, rest[:, first + c].astype("<f4"), "VEC3"))
        first += 2 * degree + 1

    blob, views, accessors, attributes = b"", [], [], {}
    for i, (name, arr, kind) in enumerate(attrs):
        data = np.ascontiguousarray(arr).tobytes()
        views.append(
            {"buffer": 0, "byteOffset": len(blob), "byteLength": len(data), "target": ARRAY_BUFFER}
        )
        acc = {"bufferView": i, "componentType": FLOAT, "count": n, "type": kind}
        if arr.dtype == np.uint8:
            acc.update(componentType=UNSIGNED_BYTE, normalized=True)
        if name == "POSITION":
            acc.update(min=arr.min(0).tolist(), max=arr.max(0).tolist())
        accessors.append(acc)
        attributes[name] = i
        blob += _pad4(data)
    primitive = {
        "attributes": attributes,
        "mode": POINTS,
        "extensions": {
            EXTENSION: {
                "kernel": "ellipse",
                "colorSpace": "srgb_rec709_display",
                "sortingMethod": "cameraDistance",
                "projection": "perspective",
            }
        },
    }
    if antialiased:
        primitive["extras"] = {"antialiased": True}
    gltf = {
        "asset": {"version": "2.0", "generator": "neural-field-service"},
        "extensionsUsed": [EXTENSION],
        "scene": 0,
        "scenes": [{"nodes": [0]}],
        "nodes": [{"mesh": 0}],
        "meshes": [{"primitives": [primitive]}],
        "buffers": [{"byteLength": len(blob)}],
        "bufferViews": views,
        "accessors": accessors,
    }
    js = _pad4(json.dumps(gltf, separators=(",", ":")).encode(), b" ")
    total = 12 + 8 + len(js) + 8 + len(blob)
    out = struct.pack("<III", GLB_MAGIC, 2, total)
    out += struct.pack("<II", len(js), JSON_CHUNK) + js + struct.pack("<II", len(blob), BIN_CHUNK)
    return out + blob, n
