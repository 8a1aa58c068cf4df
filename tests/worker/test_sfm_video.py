"""Frame selection from a video (worker/sfm/video.py) on real H.264 files encoded with PyAV:
the sharpest frame of each run is kept, runs spread over the whole video, and files that
yield no frames fail with a readable reason."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image, ImageFilter

from experiments.synthetic_scene import dead_leaves
from worker.sfm.video import VideoError, count_frames, extract_frames

N, RUN, SIZE = 40, 4, 128


def _encode(path, frames: list[np.ndarray]) -> None:
    import av

    with av.open(str(path), "w", format="mp4") as out:
        stream = out.add_stream("libx264", rate=24)
        stream.width, stream.height = frames[0].shape[1], frames[0].shape[0]
        stream.pix_fmt = "yuv420p"
        stream.options = {"crf": "12"}
        for im in frames:
            for pkt in stream.encode(av.VideoFrame.from_ndarray(im, format="rgb24")):
                out.mux(pkt)
        for pkt in stream.encode():
            out.mux(pkt)


@pytest.fixture(scope="module")
def video(tmp_path_factory):
    """A texture panning sideways; in every run of RUN frames one (at a varying place) is sharp,
    the others are blurred as by camera shake."""
    tex = (dead_leaves(size=256, seed=1) * 255).astype(np.uint8)
    rng = np.random.default_rng(0)
    sharp = [k * RUN + int(rng.integers(RUN)) for k in range(N // RUN)]
    frames = []
    for i in range(N):
        im = Image.fromarray(np.stack([tex[:SIZE, i : i + SIZE]] * 3, -1))
        if i not in sharp:
            im = im.filter(ImageFilter.GaussianBlur(2.0))
        frames.append(np.asarray(im))
    path = tmp_path_factory.mktemp("video") / "pan.mp4"
    _encode(path, frames)
    return path, sharp


def test_the_sharpest_frame_of_each_run_is_kept(video, tmp_path):
    path, sharp = video
    seen = []
    got = extract_frames(path, tmp_path, N // RUN, 1000, progress=lambda k, n: seen.append((k, n)))
    assert got.n_video_frames == got.n_decoded == N
    picked = [int(n[len("frame_") : -len(".jpg")]) for n in got.names]
    assert picked == sharp
    assert all((tmp_path / n).is_file() for n in got.names)
    assert (got.width, got.height) == (SIZE, SIZE)
    assert seen[-1] == (N, N) and [k for k, _ in seen] == sorted(k for k, _ in seen)


def test_frames_are_downscaled_to_the_long_side(video, tmp_path):
    path, _ = video
    got = extract_frames(path, tmp_path, 3, 64)
    assert len(got.names) == 3 and (got.width, got.height) == (64, 64)
    with Image.open(tmp_path / got.names[0]) as im:
        assert im.size == (64, 64)


def test_a_short_video_gives_every_frame(video, tmp_path):
    path, _ = video
    got = extract_frames(path, tmp_path, 1000, 1000)
    assert len(got.names) == N


def test_unreadable_videos_fail_readably(tmp_path):
    junk = tmp_path / "junk.mp4"
    junk.write_bytes(b"not a video at all" * 50)
    with pytest.raises(VideoError, match="could not be read"):
        count_frames(junk)
    one = tmp_path / "one.mp4"
    _encode(one, [np.zeros((64, 64, 3), np.uint8)])
    with pytest.raises(VideoError, match="1 frame"):
        extract_frames(one, tmp_path / "out", 10, 1000)
