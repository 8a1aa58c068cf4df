"""Structure from motion with pycolmap: SIFT features, matching, incremental or global mapping.

pycolmap's calls release the GIL, so a watcher thread can cancel them through a
CancellationToken while they run. They report nothing on the way, so progress comes from
running feature extraction in chunks and from the mapper's per-image callback. (COLMAP's
SQLite database must not be read while it writes: a reader's lock makes it abort the process.)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

# Progress through the stage, in percent, at the end of each step (video decoding comes first).
EXTRACT_END, MATCH_END, MAP_END = 40, 60, 100
EXTRACT_CHUNKS = 20
# COLMAP's mapper defaults (100 inliers to start a model, 30 to register an image) assume the
# ~8k SIFT keypoints of a multi-megapixel photo; below MANY_KEYPOINTS per image they are scaled
# down, as COLMAP's own docs advise for low-resolution captures, so small images still map.
MANY_KEYPOINTS = 2000
SMALL_INIT_INLIERS, SMALL_ABS_POSE_INLIERS, SMALL_INIT_TRI_ANGLE = 40, 15, 8.0
# RANSAC (two-view and mapper) and initial-pair choice. COLMAP's generators are per thread, so
# with several threads a capture still maps slightly differently from run to run.
SEED = 0
# Models whose parameters beyond focal length and principal point are lens distortion.
NO_DISTORTION_MODELS = ("SIMPLE_PINHOLE", "PINHOLE")
PINHOLE_PARAMS = ("f", "fx", "fy", "cx", "cy")
# A lens fitted after mapping is kept when it lowers the mean reprojection error by this share:
# the capture-like scene's phone lens (k1 -0.08) by 11 %, a fit on undistorted views by < 0.1 %.
MIN_LENS_GAIN = 0.05


class SfmCancelled(Exception):
    pass


@dataclass
class SfmOptions:
    camera_model: str  # a COLMAP model name
    matcher: str  # "sequential" (video) | "exhaustive" | "vocab_tree"
    threads: int = 0  # 0: all cores
    max_image_size: int = 1600
    single_camera: bool = True  # one camera shared by every image (one device, one zoom)
    vocab_tree_path: Path | None = None
    mapper: str = "incremental"  # COLMAP's incremental mapper | "global" (GLOMAP)
    # the incremental mapper maps pinhole cameras, which then become `camera_model` with zero
    # distortion, fitted by one bundle adjustment over every view (small images:
    # worker.sfm.camera)
    distortion_after_mapping: bool = False


@dataclass
class Registered:
    name: str
    world_from_cam: np.ndarray  # 3x4, OpenCV camera axes (COLMAP)
    model: str
    width: int
    height: int
    params_info: str
    params: list[float]


@dataclass
class SfmResult:
    n_images: int
    registered: list[Registered]  # of the largest model, sorted by name
    points_xyz: np.ndarray  # (N, 3) world frame
    points_rgb: np.ndarray  # (N, 3) uint8
    n_models: int
    mean_keypoints: float
    model_dir: Path | None = None  # the largest model, COLMAP binary
    seconds: dict[str, float] = field(default_factory=dict)
    distortion_fixed_while_mapping: bool = False


def read_model(rec) -> tuple[list[Registered], np.ndarray, np.ndarray]:
    """Registered images (sorted by name) and sparse points of a pycolmap Reconstruction."""
    registered: list[Registered] = []
    xyz = np.zeros((0, 3))
    rgb = np.zeros((0, 3), np.uint8)
    if rec is None:
        return registered, xyz, rgb
    for img in rec.images.values():
        if not img.has_pose:
            continue
        cam = rec.cameras[img.camera_id]
        registered.append(
            Registered(
                name=img.name,
                world_from_cam=img.cam_from_world().inverse().matrix(),
                model=cam.model.name,
                width=int(cam.width),
                height=int(cam.height),
                params_info=cam.params_info,
                params=[float(v) for v in cam.params],
            )
        )
    pts = list(rec.points3D.values())
    if pts:
        xyz = np.array([p.xyz for p in pts], dtype=np.float64)
        rgb = np.array([p.color for p in pts], dtype=np.uint8)
    registered.sort(key=lambda r: r.name)
    return registered, xyz, rgb


def undistort(result: SfmResult, image_dir: Path, out_dir: Path) -> tuple[SfmResult, Path]:
    """The registered images resampled to PINHOLE cameras by COLMAP's undistorter (for
    rasterisers that take no lens distortion); returns the result over them and their folder."""
    import pycolmap

    pycolmap.undistort_images(out_dir, result.model_dir, image_dir, output_type="COLMAP")
    registered, xyz, rgb = read_model(pycolmap.Reconstruction(out_dir / "sparse"))
    out = SfmResult(
        n_images=result.n_images,
        registered=registered,
        points_xyz=xyz,
        points_rgb=rgb,
        n_models=result.n_models,
        mean_keypoints=result.mean_keypoints,
        seconds=result.seconds,
        model_dir=out_dir / "sparse",
    )
    return out, out_dir / "images"


def _threads(n: int) -> int:
    return n if n > 0 else -1


class _Watcher:
    """Cancels the running pycolmap call once `cancelled()` says so."""

    def __init__(self, cancelled: Callable[[], bool] | None):
        import pycolmap

        self.token = pycolmap.CancellationToken()
        self._cancelled = cancelled
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sfm-cancel", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            if self._cancelled is not None and self._cancelled():
                self.token.cancel()
                return

    def check(self) -> None:
        if self.token.is_cancelled or (self._cancelled is not None and self._cancelled()):
            raise SfmCancelled()

    def __enter__(self) -> _Watcher:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=2)


def _mapping_options(opts: SfmOptions, mean_keypoints: float, fix_distortion: bool = False):
    import pycolmap

    po = pycolmap.IncrementalPipelineOptions()
    po.num_threads = _threads(opts.threads)
    po.random_seed = SEED
    po.mapper.random_seed = SEED
    if mean_keypoints < MANY_KEYPOINTS:
        po.mapper.init_min_num_inliers = SMALL_INIT_INLIERS
        po.mapper.abs_pose_min_num_inliers = SMALL_ABS_POSE_INLIERS
        po.mapper.init_min_tri_angle = SMALL_INIT_TRI_ANGLE
    if fix_distortion:
        po.ba_refine_extra_params = False
        po.mapper.abs_pose_refine_extra_params = False
    return po


def _map(db, image_dir, out_dir, po, callback, token, input_path: Path | None = None) -> dict:
    import pycolmap

    return pycolmap.incremental_mapping(
        db,
        image_dir,
        out_dir,
        options=po,
        input_path=str(input_path or ""),
        next_image_callback=callback,
        cancellation_token=token,
    )


def _continue(db, image_dir, work_dir: Path, best, po, token):
    """The incremental mapper once more, from `best`: it can stop with images it has not placed
    yet that the finished model's points place (a 24-frame video of experiments/sfm_capture.py
    registered 21 in about one run of 25). Returns the model that registered more."""
    start = work_dir / "partial"
    start.mkdir(parents=True, exist_ok=True)
    best.write(start)
    more = _largest(_map(db, image_dir, work_dir / "continued", po, lambda: None, token, start))
    return more if more is not None and more.num_reg_images() > best.num_reg_images() else best


def _global_options(opts: SfmOptions):
    import pycolmap

    go = pycolmap.GlobalPipelineOptions()
    go.num_threads = _threads(opts.threads)
    go.random_seed = SEED
    go.mapper.random_seed = SEED
    return go


def _global_map(db, image_dir, out_dir, opts: SfmOptions) -> dict:
    """GLOMAP (rotation averaging, then all positions and points at once). pycolmap's global
    mapper takes no cancellation token and reports nothing: a cancel or SFM_MAX_SECONDS is
    seen once it returns."""
    import pycolmap

    out_dir.mkdir(parents=True, exist_ok=True)
    return pycolmap.global_mapping(db, image_dir, out_dir, options=_global_options(opts))


def _largest(models: dict):
    return max(models.values(), key=lambda r: r.num_reg_images(), default=None)


def _with_model(rec, model: str) -> None:
    """Turns the reconstruction's PINHOLE cameras into `model` (OPENCV, RADIAL, ...) with the
    same focal lengths and principal point and zero distortion."""
    import pycolmap

    for cam in rec.cameras.values():
        fx, fy, cx, cy = cam.params
        new = pycolmap.Camera(model=model, width=cam.width, height=cam.height, params=[])
        known = {"f": (fx + fy) / 2, "fx": fx, "fy": fy, "cx": cx, "cy": cy}
        cam.model = new.model
        cam.params = [known.get(n.strip(), 0.0) for n in new.params_info.split(",")]


def _fit_lens_after_mapping(rec, opts: SfmOptions, token) -> None:
    """`rec`'s PINHOLE cameras become `opts.camera_model`, their distortion fitted over every
    view, kept only where it explains the matches better by MIN_LENS_GAIN (no lens to fit
    otherwise: undistorted views, or too few keypoints to tell)."""
    pinhole_error = rec.compute_mean_reprojection_error()
    _with_model(rec, opts.camera_model)
    _refine_distortion(rec, opts.threads, token)
    if rec.compute_mean_reprojection_error() > (1.0 - MIN_LENS_GAIN) * pinhole_error:
        for cam in rec.cameras.values():
            cam.params = [
                v if n.strip() in PINHOLE_PARAMS else 0.0
                for n, v in zip(cam.params_info.split(","), cam.params)
            ]
        _refine_distortion(rec, opts.threads, token, extra_params=False)


def _refine_distortion(rec, threads: int, token, extra_params: bool = True) -> None:
    """One global bundle adjustment of every parameter, distortion included (unless
    `extra_params` is False), over a model mapped with the distortion held at zero."""
    import pycolmap

    ba = pycolmap.BundleAdjustmentOptions()
    ba.refine_extra_params = extra_params
    ba.print_summary = False
    ba.ceres.solver_options.num_threads = _threads(threads)
    pycolmap.bundle_adjustment(rec, ba, cancellation_token=token)


def run_sfm(
    image_dir: Path,
    names: list[str],
    work_dir: Path,
    opts: SfmOptions,
    progress: Callable[[float], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
    start_pct: float = 0.0,
) -> SfmResult:
    """SfM on `image_dir/<name>` for every name; COLMAP's database and models go to `work_dir`.
    `progress(percent)` runs from `start_pct` to 100. Raises SfmCancelled."""
    try:
        return _run_sfm(image_dir, names, work_dir, opts, progress, cancelled, start_pct)
    except InterruptedError:  # how pycolmap's calls end when their token is cancelled
        raise SfmCancelled() from None


def _run_sfm(image_dir, names, work_dir, opts, progress, cancelled, start_pct) -> SfmResult:
    import pycolmap

    device = pycolmap.Device.cpu
    work_dir.mkdir(parents=True, exist_ok=True)
    db = work_dir / "database.db"
    db.unlink(missing_ok=True)
    span = 100.0 - start_pct
    pct = lambda p: start_pct + span * p / 100.0  # noqa: E731
    report = progress or (lambda _p: None)
    seconds: dict[str, float] = {}

    fit_at_end = (
        opts.distortion_after_mapping
        and opts.mapper != "global"
        and opts.camera_model not in NO_DISTORTION_MODELS
    )
    with _Watcher(cancelled) as watch:
        t0 = time.perf_counter()
        eo = pycolmap.FeatureExtractionOptions()
        eo.num_threads = _threads(opts.threads)
        eo.max_image_size = opts.max_image_size
        mode = pycolmap.CameraMode.SINGLE if opts.single_camera else pycolmap.CameraMode.PER_IMAGE
        chunk = max(1, -(-len(names) // EXTRACT_CHUNKS))
        for start in range(0, len(names), chunk):
            ro = pycolmap.ImageReaderOptions()
            ro.camera_model = "PINHOLE" if fit_at_end else opts.camera_model
            if start and opts.single_camera:
                ro.existing_camera_id = 1  # later chunks join the first chunk's camera
            pycolmap.extract_features(
                db,
                image_dir,
                image_names=names[start : start + chunk],
                camera_mode=mode,
                reader_options=ro,
                extraction_options=eo,
                device=device,
                cancellation_token=watch.token,
            )
            watch.check()
            report(pct(EXTRACT_END * min(len(names), start + chunk) / len(names)))
        with pycolmap.Database.open(db) as database:
            mean_kp = database.num_keypoints() / max(1, database.num_images())
        seconds["extract"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        mo = pycolmap.FeatureMatchingOptions()
        mo.num_threads = _threads(opts.threads)
        vo = pycolmap.TwoViewGeometryOptions()
        vo.ransac.random_seed = SEED
        common = dict(
            matching_options=mo,
            verification_options=vo,
            device=device,
            cancellation_token=watch.token,
        )
        if opts.matcher == "sequential":
            pycolmap.match_sequential(db, **common)
        elif opts.matcher == "vocab_tree":
            pairing = pycolmap.VocabTreePairingOptions()
            pairing.vocab_tree_path = str(opts.vocab_tree_path)
            pycolmap.match_vocabtree(db, pairing_options=pairing, **common)
        else:
            pycolmap.match_exhaustive(db, **common)
        watch.check()
        report(pct(MATCH_END))
        seconds["match"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        done = [0]

        def next_image() -> None:
            done[0] += 1
            report(pct(MATCH_END + (MAP_END - MATCH_END) * min(done[0], len(names)) / len(names)))

        if opts.mapper == "global":
            models = _global_map(db, image_dir, work_dir / "sparse", opts)
        else:
            po = _mapping_options(opts, mean_kp)
            models = _map(db, image_dir, work_dir / "sparse", po, next_image, watch.token)
        watch.check()
        best = _largest(models)
        if opts.mapper != "global" and best is not None and best.num_reg_images() < len(names):
            best = _continue(db, image_dir, work_dir, best, po, watch.token)
            watch.check()
        fixed = False
        if fit_at_end and best is not None:
            _fit_lens_after_mapping(best, opts, watch.token)
            watch.check()
            fixed = True
        seconds["map"] = time.perf_counter() - t0
        n_best = best.num_reg_images() if best is not None else 0
        split = len(models) > 1 and n_best < len(names)
        if (
            split
            and not fit_at_end
            and opts.mapper != "global"
            and opts.camera_model not in NO_DISTORTION_MODELS
        ):
            # Distortion refined from the first few views can drift far enough that later views
            # no longer fit the model, which then splits (on experiments/sfm_capture.py's 200 px
            # views, OPENCV split 15 + 5 of 24 about one run in five). Mapped again with it held
            # at zero and refined once at the end over every view, such a capture stays in one
            # piece; the run that registers more images is kept.
            t0 = time.perf_counter()
            retry = _map(
                db,
                image_dir,
                work_dir / "sparse_fixed",
                _mapping_options(opts, mean_kp, fix_distortion=True),
                lambda: None,  # progress holds where the first run left it
                watch.token,
            )
            watch.check()
            alt = _largest(retry)
            if alt is not None and alt.num_reg_images() > n_best:
                _refine_distortion(alt, opts.threads, watch.token)
                watch.check()
                best, models, fixed = alt, retry, True
            seconds["map_fixed_distortion"] = time.perf_counter() - t0

    model_dir = None
    if best is not None:
        model_dir = work_dir / "model"
        model_dir.mkdir(exist_ok=True)
        best.write(model_dir)
    registered, xyz, rgb = read_model(best)
    report(100.0)
    return SfmResult(
        n_images=len(names),
        registered=registered,
        points_xyz=xyz,
        points_rgb=rgb,
        n_models=len(models),
        model_dir=model_dir,
        mean_keypoints=mean_kp,
        seconds=seconds,
        distortion_fixed_while_mapping=fixed,
    )
