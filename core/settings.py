"""All runtime settings, read from the environment. The API and the worker share this class."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_file=None, extra="ignore", case_sensitive=False)

    data_dir: Path = Field(
        Path("./data"), description="job folders, and the broker/results in embedded mode"
    )
    host: str = "127.0.0.1"
    port: int = 8000
    redis_url: str | None = Field(
        None, description="unset: Celery filesystem broker + file results under DATA_DIR"
    )

    max_upload_mb: float = Field(512, gt=0, description="multipart upload cap (413 past it)")
    max_image_pixels: int = Field(
        40_000_000, gt=0, description="width*height cap for uploaded photos"
    )
    max_archive_entries: int = Field(
        10_000, gt=0, description="members of one uploaded archive (413 past it)"
    )
    max_extracted_mb: float = Field(
        2048, gt=0, description="bytes an uploaded archive may extract to, in MiB (413)"
    )
    max_compression_ratio: float = Field(
        200.0, gt=1, description="extracted / compressed size of an archive or member (413)"
    )
    train_long_side: int = Field(
        800,
        ge=16,
        description="scene uploads are downsized to this long side unless the config says",
    )
    max_render_pixels: int = Field(
        4_194_304, gt=0, description="width*height cap for one rendered frame"
    )
    render_timeout_s: float = Field(
        60.0, gt=0, description="how long the API waits for a render task"
    )
    max_path_frames: int = Field(360, gt=0, description="frames cap for one camera path render")
    max_path_pixels: int = Field(
        100_000_000, gt=0, description="frames*width*height cap for one path render"
    )
    # 512^3 density queries take minutes on a CPU worker and ~1 GiB of grid; meshes past it are
    # mostly triangles smaller than the field's own detail.
    max_export_resolution: int = Field(
        512, ge=16, description="cap of a mesh export's marching-cubes resolution (422 past it)"
    )

    # API keys (service/auth.py): `token` or `name:token`, comma separated, and/or one per line in a file.
    api_keys: str | None = Field(
        None, repr=False, description="bearer tokens; unset everywhere: /v1 answers 401"
    )
    api_keys_file: Path | None = Field(
        None, description="file with one `name:token` (or `token`) per line"
    )
    render_rate_per_min: float = Field(
        120.0, gt=0, description="render + path requests per key per minute"
    )
    render_burst: int = Field(30, ge=1, description="render + path requests a key may send at once")

    # Worker side.
    torch_threads: int = Field(
        2, ge=0, description="torch.set_num_threads in the worker; 0 = torch default"
    )
    progress_interval_s: float = Field(
        0.5, gt=0, le=1.0, description="progress written at least this often"
    )
    checkpoint_interval_s: float = Field(
        30.0, gt=0, description="seconds between training checkpoints"
    )
    checkpoints_kept: int = Field(3, ge=1)
    # Redis redelivers an unacked (acks_late) task after this; it must outlast the longest
    # training, otherwise a second worker would train the same job concurrently.
    visibility_timeout_s: int = Field(43_200, gt=0)
    broker_polling_interval_s: float = Field(0.2, gt=0, description="filesystem broker poll period")
    device: str | None = Field(
        None, description="torch device for the worker; default cuda if available"
    )

    @field_validator("redis_url", "api_keys", "api_keys_file", mode="before")
    @classmethod
    def _empty_is_unset(cls, v: str | None) -> str | None:
        return v or None

    @property
    def max_upload_bytes(self) -> int:
        return int(self.max_upload_mb * 1024 * 1024)

    @property
    def jobs_dir(self) -> Path:
        return self.data_dir.resolve() / "jobs"


@lru_cache
def get_settings() -> Settings:
    return Settings()
