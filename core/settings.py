"""All runtime settings, read from the environment. The API and the worker share this class."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_file=None, extra="ignore", case_sensitive=False)

    data_dir: Path = Field(
        Path("./data"), description="job folders, and the broker/results in embedded mode"
    )
    # Job files (core/storage.py): a local directory by default, or an S3-compatible bucket.
    storage_url: str | None = Field(
        None,
        description="unset: job files under DATA_DIR; file:///path: under path; "
        "s3://bucket/prefix: in an S3-compatible bucket (credentials: the AWS environment/config)",
    )
    s3_endpoint_url: str | None = Field(
        None, description="S3 API endpoint for MinIO, R2 and the like; unset: AWS"
    )
    s3_public_endpoint_url: str | None = Field(
        None,
        description="endpoint presigned download URLs name, where clients reach the store "
        "another way than the services do; unset: S3_ENDPOINT_URL",
    )
    scratch_dir: Path | None = Field(
        None, description="local working copies of S3 job files; unset: DATA_DIR/scratch"
    )
    scratch_max_gb: float = Field(
        50, gt=0, description="a worker's scratch copies are evicted past this size (GiB)"
    )
    host: str = "127.0.0.1"
    port: int = 8000
    redis_url: str | None = Field(
        None, description="unset: Celery filesystem broker + file results under DATA_DIR"
    )
    database_url: str | None = Field(
        None,
        repr=False,
        description="job state; postgresql+psycopg://user:pass@host/db, unset: SQLite file "
        "DATA_DIR/service.db",
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
    # The child process that inspects each upload (service/intake/sandbox.py).
    intake_memory_mb: float = Field(
        4096, gt=0, description="address space of the process inspecting one upload (422 past it)"
    )
    intake_timeout_s: float = Field(
        600, gt=0, description="CPU and wall time to inspect one upload (422 past it)"
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
    max_render_job_s: float = Field(
        3600.0, gt=0, description="ceiling on one render job's (path, large frame) wall time"
    )
    max_path_pixels: int = Field(
        100_000_000, gt=0, description="frames*width*height cap for one path render"
    )
    # 512^3 density queries take minutes on a CPU worker and ~1 GiB of grid; meshes past it are
    # mostly triangles smaller than the field's own detail.
    max_export_resolution: int = Field(
        512, ge=16, description="cap of a mesh export's marching-cubes resolution (422 past it)"
    )
    render_wait_pixels: int = Field(
        1_048_576,
        ge=0,
        description="a frame over this many width*height pixels, without `mode`, runs as a "
        "render job (202, rendered in tiles) instead of in the HTTP wait; so does one the job's "
        "measured render speed says would take over half of RENDER_TIMEOUT_S",
    )
    path_wait_pixels: int = Field(
        16_777_216,
        ge=0,
        description="a path over this many frames*width*height pixels, without `mode`, runs as "
        "a path job (202) instead of in the HTTP wait",
    )

    # API keys (service/auth.py): `token` or `name:token`, comma separated, and/or one per line in a file.
    api_keys: str | None = Field(
        None, repr=False, description="bearer tokens; unset everywhere: /v1 answers 401"
    )
    api_keys_file: Path | None = Field(
        None, description="file with one `name:token` (or `token`) per line"
    )
    key_id_secret: str | None = Field(
        None,
        repr=False,
        description="HMAC secret of the key ids jobs record as owners; unset: made once and kept in the database",
    )
    render_pixels_per_min: float = Field(
        200_000_000, gt=0, description="rendered pixels (w*h*frames) per key per minute"
    )
    render_pixel_burst: float = Field(
        100_000_000, ge=1, description="rendered pixels a key may ask for at once"
    )
    max_render_result_mb: float = Field(
        256, gt=0, description="cap on one encoded render result (413 past it)"
    )
    max_json_body_kb: float = Field(
        64, gt=0, description="cap on every /v1 request body but the upload (413 past it)"
    )
    max_streams_per_key: int = Field(8, ge=1, description="open event streams per key (429)")

    # Per-key quotas (service/quotas.py); 429 + Retry-After, 413 or 422 naming the setting.
    quota_active_jobs: int = Field(4, ge=1, description="queued + running jobs per key")
    quota_jobs_per_hour: int = Field(30, ge=1, description="jobs a key may submit per hour")
    quota_stored_mb: float = Field(
        20_480, gt=0, description="job folders (uploads, checkpoints, artifacts) per key"
    )
    max_train_steps: int = Field(200_000, ge=1, description="ceiling on a job's `steps`")
    max_train_s: float = Field(
        86_400, gt=0, description="ceiling on one training run's wall time (job fails past it)"
    )

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
    # Poison and stranded jobs (worker/tasks.py).
    max_worker_losses: int = Field(
        3, ge=1, description="a training whose worker died this often fails"
    )
    lease_ttl_s: float = Field(
        60.0, gt=0, description="a running job whose trainer stopped renewing this long is requeued"
    )
    reaper_interval_s: float = Field(
        30.0, gt=0, description="how often train workers look for stranded jobs"
    )
    queued_grace_s: float = Field(
        30.0, ge=0, description="a queued job missing from the broker this long is re-sent"
    )
    stale_upload_s: float = Field(
        3600.0,
        gt=0,
        description="an upload admitted but never completed (a reserved job) idle this long is removed",
    )
    broker_polling_interval_s: float = Field(0.2, gt=0, description="filesystem broker poll period")
    device: str | None = Field(
        None, description="torch device for the worker; default cuda if available"
    )
    lpips_model: Path | None = Field(
        None,
        description="TorchScript LPIPS on the worker (worker/scene/metrics.py); unset: no LPIPS",
    )

    # Structure from motion (photos without poses, videos): the `preprocess` queue's workers.
    sfm_min_registered_share: float = Field(
        0.5, ge=0, le=1, description="SfM fails the job when fewer images than this share register"
    )
    sfm_num_frames_target: int = Field(
        300, ge=8, le=5000, description="frames taken from a video (ns-process-data's default)"
    )
    sfm_max_image_size: int = Field(
        1600, ge=64, le=10_000, description="long side SfM extracts features at; video frames kept"
    )
    sfm_threads: int = Field(0, ge=0, description="threads of one SfM run; 0 = all cores")
    sfm_max_seconds: int = Field(
        7200, ge=0, description="SfM running longer fails the job; 0 = no limit"
    )
    sfm_camera_model: Literal[
        "auto", "SIMPLE_PINHOLE", "PINHOLE", "SIMPLE_RADIAL", "RADIAL", "OPENCV"
    ] = Field(
        "auto",
        description="camera model SfM fits; auto: OPENCV fitted after mapping (docs/capture.md)",
    )
    sfm_exhaustive_max_images: int = Field(
        300, ge=2, description="photo sets up to this size match every pair"
    )
    sfm_mapper: Literal["auto", "incremental", "global"] = Field(
        "auto",
        description="COLMAP's incremental mapper or GLOMAP's global one; auto: global from "
        "SFM_GLOBAL_MIN_IMAGES photos on",
    )
    sfm_global_min_images: int = Field(
        500, ge=2, description="sfm_mapper auto: photo sets this large map globally (GLOMAP)"
    )
    sfm_vocab_tree_path: Path | None = Field(
        None, description="COLMAP vocabulary tree; larger photo sets match by it when set"
    )

    # Webhooks (core/webhooks.py, docs/webhooks.md), sent by the train workers.
    webhook_allow_private: bool = Field(
        False, description="callback URLs may resolve to loopback, private or link-local addresses"
    )
    webhook_max_attempts: int = Field(
        8, ge=1, le=30, description="attempts of one webhook delivery before it is given up"
    )
    webhook_retry_base_s: float = Field(
        10.0, gt=0, description="attempt n+1 of a delivery waits this * 2^(n-1) s (at most 1 h)"
    )
    webhook_timeout_s: float = Field(
        10.0, gt=0, description="how long one attempt waits for the receiver's answer"
    )

    # Observability (core/metrics.py, core/logs.py, docs/deploy.md).
    metrics_token: str | None = Field(
        None, repr=False, description="set: GET /metrics wants `Authorization: Bearer <it>`"
    )
    worker_metrics_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="set: a worker answers GET /metrics on this port with its host's samples "
        "(PROMETHEUS_MULTIPROC_DIR), for worker hosts the API's /metrics cannot see; "
        "METRICS_TOKEN applies",
    )
    worker_metrics_host: str = Field(
        "0.0.0.0", description="address the worker's /metrics listens on (WORKER_METRICS_PORT)"
    )
    log_format: Literal["text", "json"] = Field(
        "text", description="json: one JSON object per log line, with the request id"
    )

    @field_validator(
        "redis_url",
        "database_url",
        "api_keys",
        "api_keys_file",
        "key_id_secret",
        "sfm_vocab_tree_path",
        "lpips_model",
        "metrics_token",
        "storage_url",
        "s3_endpoint_url",
        "s3_public_endpoint_url",
        "scratch_dir",
        mode="before",
    )
    @classmethod
    def _empty_is_unset(cls, v: str | None) -> str | None:
        return v or None

    @property
    def max_upload_bytes(self) -> int:
        return int(self.max_upload_mb * 1024 * 1024)

    @property
    def max_json_body_bytes(self) -> int:
        return int(self.max_json_body_kb * 1024)

    @property
    def max_render_result_bytes(self) -> int:
        return int(self.max_render_result_mb * 1024 * 1024)

    @property
    def scratch_path(self) -> Path:
        """SCRATCH_DIR, or DATA_DIR/scratch."""
        return (self.scratch_dir or self.data_dir / "scratch").resolve()

    @property
    def jobs_dir(self) -> Path:
        return self.data_dir.resolve() / "jobs"


@lru_cache
def get_settings() -> Settings:
    return Settings()
