"""Render request types.

Image jobs read only width/height/format. Scene kinds add a camera in the dataset's own world
frame (OpenGL axes: x right, y up, camera looks down -z) and intrinsics beside it. Degenerate
cameras are rejected here, so every kind gets the same 422s. A path is a list of poses, an orbit,
or nerfstudio's camera_path.json (`camera_path`, with the `frame` its poses are in)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# One definition of a pose for every request: c2w must be rigid, and look_at/orbit without `up`
# take the dataset's own world up (Blender scenes are z-up, COLMAP ones mostly -y).
from api_schemas.camera import Orbit, check_c2w
from api_schemas.camera import Pose as Camera

MAX_PATH_SIDE = 4096


class Intrinsics(BaseModel):
    """Field of view in degrees (horizontal or vertical), or pixel focal lengths; default: the dataset's."""

    fov_x_deg: float | None = Field(None, gt=0, lt=180)
    fov_y_deg: float | None = Field(None, gt=0, lt=180)
    fx: float | None = Field(None, gt=0)
    fy: float | None = Field(None, gt=0)
    cx: float | None = None
    cy: float | None = None
    output: Literal["rgb", "depth", "alpha"] = "rgb"
    background: Literal["white", "black"] | tuple[float, float, float] | None = Field(
        None, description="colour behind the scene; default white"
    )

    @field_validator("background")
    @classmethod
    def _rgb(cls, v):
        if isinstance(v, tuple) and not all(0.0 <= x <= 1.0 for x in v):
            raise ValueError("background components must lie in [0, 1]")
        return v


class RenderRequest(Intrinsics):
    model_config = ConfigDict(extra="forbid")

    width: int = Field(..., ge=1, le=16384)
    height: int = Field(..., ge=1, le=16384)
    camera: Camera | None = Field(
        None, description="required for scene kinds, refused by image jobs"
    )
    format: Literal["png", "jpeg", "png16", "npy"] = Field(
        "png",
        description="png16: depth as 16-bit millimetres of world distance; npy: depth as "
        "float32 world distance (both with output depth; 0 = no surface)",
    )
    mode: Literal["wait", "job"] | None = Field(
        None,
        description="wait: answer with the frame; job: 202 and a render job to poll (rendered in "
        "tiles, with progress); default: a job when the frame is over RENDER_WAIT_PIXELS or the "
        "job's measured render speed says it would not finish within half of RENDER_TIMEOUT_S",
    )

    @model_validator(mode="after")
    def _depth_formats(self):
        if self.format in ("png16", "npy") and self.output != "depth":
            raise ValueError(f"format {self.format} holds depth: ask for output depth")
        return self


class NerfstudioPose(BaseModel):
    """One entry of nerfstudio's `camera_path`; its other keys are the viewer's and ignored."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    camera_to_world: list[float] = Field(
        ..., min_length=16, max_length=16, description="4x4 c2w, row-major, OpenGL axes"
    )
    fov: float = Field(..., gt=0, lt=180, description="vertical field of view, degrees")
    aspect: float | None = Field(None, gt=0, description="the viewer's; the size is render_*")

    @field_validator("camera_to_world")
    @classmethod
    def _rigid(cls, v):
        check_c2w([v[0:4], v[4:8], v[8:12], v[12:16]])
        return v


class NerfstudioCameraPath(BaseModel):
    """nerfstudio's camera_path.json (what its viewer exports and `ns-render camera-path` reads).
    Keys other than these (keyframes, smoothness_value, is_cycle, crop, ...) are ignored."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    render_width: int = Field(..., ge=1, le=MAX_PATH_SIDE)
    render_height: int = Field(..., ge=1, le=MAX_PATH_SIDE)
    fps: float | None = Field(None, gt=0, le=240)
    seconds: float | None = Field(None, gt=0)
    camera_type: Literal["perspective"] = Field(
        "perspective", description="only perspective cameras are rendered here"
    )
    camera_path: list[NerfstudioPose] = Field(..., min_length=1, max_length=720)


class DataparserTransform(BaseModel):
    """nerfstudio's dataparser_transforms.json: a nerfstudio-frame point is
    scale * (transform @ [p_world, 1])."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    transform: list[list[float]] = Field(..., description="3x4 [R | t], R a rotation")
    scale: float = Field(..., gt=0)

    @field_validator("transform")
    @classmethod
    def _rigid(cls, v):
        check_c2w(v)
        return v


class PathRequest(Intrinsics):
    """A camera path: poses, an orbit, or a nerfstudio camera path; answered with an animated
    WebP or GIF, an H.264 MP4, or a zip of PNGs. `mode` "job" (or a path over PATH_WAIT_PIXELS
    when `mode` is not given) runs as a path job: 202 with its id, the file lands as an artifact."""

    model_config = ConfigDict(extra="forbid")

    width: int | None = Field(None, ge=1, le=MAX_PATH_SIDE, description="default: render_width")
    height: int | None = Field(None, ge=1, le=MAX_PATH_SIDE)
    poses: list[Camera] | None = Field(None, min_length=1, max_length=720)
    orbit: Orbit | None = None
    camera_path: NerfstudioCameraPath | None = Field(
        None, description="nerfstudio's camera_path.json, as its viewer exports it"
    )
    frame: Literal["world", "nerfstudio"] | None = Field(
        None,
        description="with camera_path, required: the poses are in the dataset's own world frame, "
        "or in nerfstudio's normalised one (dataparser_transform, else nerfstudio's default "
        "orient-and-centre of this dataset's cameras)",
    )
    dataparser_transform: DataparserTransform | None = None
    format: Literal["webp", "zip", "gif", "mp4"] = "webp"
    fps: int | None = Field(
        None, ge=1, le=60, description="default 24, or the camera path's own fps"
    )
    mode: Literal["wait", "job"] | None = Field(
        None, description="wait: answer with the file; job: 202 and a path job; default by size"
    )

    @model_validator(mode="before")
    @classmethod
    def _raw_camera_path(cls, data):
        # The camera_path.json file itself as the body: its own keys are wrapped, ours kept.
        if isinstance(data, dict) and isinstance(data.get("camera_path"), list):
            ours = {k: data[k] for k in cls.model_fields if k in data and k != "camera_path"}
            return {**ours, "camera_path": {k: v for k, v in data.items() if k not in ours}}
        return data

    @model_validator(mode="after")
    def _one_path(self):
        given = [self.poses is not None, self.orbit is not None, self.camera_path is not None]
        if sum(given) != 1:
            raise ValueError("give exactly one of poses or orbit, or a nerfstudio camera_path")
        if self.camera_path is not None:
            if self.frame is None:
                raise ValueError(
                    "camera_path needs frame: world (the dataset's own frame) or nerfstudio"
                )
            self.width = self.width or self.camera_path.render_width
            self.height = self.height or self.camera_path.render_height
        elif self.frame is not None or self.dataparser_transform is not None:
            raise ValueError("frame and dataparser_transform go with camera_path")
        if self.width is None or self.height is None:
            raise ValueError("give width and height")
        if self.format == "mp4" and (self.width % 2 or self.height % 2):
            raise ValueError(
                f"mp4 (H.264, yuv420p) needs an even width and height, not {self.width}x{self.height}"
            )
        return self

    @property
    def frames(self) -> int:
        if self.camera_path is not None:
            return len(self.camera_path.camera_path)
        return len(self.poses) if self.poses is not None else self.orbit.n_frames

    @property
    def frames_per_second(self) -> int:
        if self.fps is not None:
            return self.fps
        cp = self.camera_path
        if cp is not None and cp.fps:
            return max(1, min(60, round(cp.fps)))
        if cp is not None and cp.seconds:
            return max(1, min(60, round(len(cp.camera_path) / cp.seconds)))
        return 24


class PathJob(BaseModel):
    """A render job: a camera path (POST render/path answered 202) or one large frame (POST
    render answered 202, `kind` frame: rendered in tiles, `pixels_done` of `n_pixels`), rendering
    in the background; the file is an artifact of the job once succeeded."""

    id: str
    job_id: str
    kind: Literal["path", "frame"] = "path"
    status: Literal["queued", "running", "succeeded", "failed"]
    format: str
    n_frames: int
    frames_done: int = 0
    n_pixels: int | None = Field(None, description="frame jobs: width x height")
    pixels_done: int | None = Field(None, description="frame jobs: pixels rendered so far")
    checkpoint_step: int | None = Field(None, description="the checkpoint the frames come from")
    artifact: str | None = Field(None, description="the file's artifact name once succeeded")
    url: str = Field(..., description="where this state is polled")
    artifact_url: str | None = None
    error: str | None = None
    created_at: str
    updated_at: str


# A render job's state has one shape whatever it renders.
RenderJob = PathJob
