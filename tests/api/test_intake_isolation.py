"""No upload can take the API down: each hostile file below is sent to the real uvicorn process,
which must refuse it with a 4xx while its peak resident memory (VmHWM, reset before each upload)
grows by less than MEMORY_BOUND and /healthz keeps answering within HEALTHZ_BOUND_S. The files
are a few MB on disk; every one grew the API by hundreds of MB when it parsed uploads itself."""

from __future__ import annotations

import io
import struct
import tarfile
import threading
import time
import zipfile
import zlib

import httpx
import pytest

from tests.support.stack import png_bytes, stack_maker

MEMORY_BOUND = 48 << 20
HEALTHZ_BOUND_S = 1.0
MiB = 1 << 20

# /healthz's bound is judged under the uploads' own load only: nothing may run beside these.
pytestmark = pytest.mark.alone


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    with stack_maker(tmp_path_factory) as make:
        # Every upload here is refused, so nothing trains; a lower entry cap keeps the folder
        # test short.
        yield make(queues=None, env={"MAX_ARCHIVE_ENTRIES": "2000"})


def _status(pid: int, field: str) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def send_measured(api, data: bytes, filename: str, kind: str = "nerf"):
    """Upload `data`; returns (response, peak RSS growth in bytes, slowest /healthz in s)."""
    pid = api.api.pid
    with open(f"/proc/{pid}/clear_refs", "w") as fh:
        fh.write("5")  # resets VmHWM to the current RSS
    base = _status(pid, "VmHWM")
    slowest, done = [0.0], threading.Event()

    def probe():
        with httpx.Client(base_url=api.base_url, timeout=30) as c:
            while not done.is_set():
                t = time.monotonic()
                assert c.get("/healthz").status_code == 200
                slowest[0] = max(slowest[0], time.monotonic() - t)
                time.sleep(0.05)

    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    try:
        r = api.submit(data, filename=filename, kind=kind)
    finally:
        done.set()
        prober.join()
    return r, _status(pid, "VmHWM") - base, slowest[0]


def assert_contained(r, growth: int, slowest: float, status: tuple[int, ...], words: str):
    assert growth < MEMORY_BOUND, f"the API's peak memory grew by {growth / MiB:.0f} MiB"
    assert slowest < HEALTHZ_BOUND_S, f"/healthz took {slowest:.2f} s"
    assert r.status_code in status, r.text
    assert words in r.json()["detail"], r.json()["detail"]


# -- tar: one extended header that tarfile reads whole ---------------------------------------
def tar_meta_bomb(typeflag: bytes, size: int) -> bytes:
    """A .tar.gz whose first member is a pax (`x`) or GNU long-name (`L`) header declaring
    `size` bytes of one path record, streamed through gzip so it is small on disk."""
    header = tarfile.TarInfo("././@PaxHeader" if typeflag == b"x" else "././@LongLink")
    header.type, header.size = typeflag, size
    head = header.tobuf(format=tarfile.USTAR_FORMAT)
    if typeflag == b"x":
        prefix = f"{size} path=".encode()
        body_start, filler, tail = prefix, size - len(prefix) - 1, b"\n"
    else:
        body_start, filler, tail = b"", size - 1, b"\0"
    gz = zlib.compressobj(6, zlib.DEFLATED, 31)
    out = [gz.compress(head), gz.compress(body_start)]
    chunk = b"a" * MiB
    while filler > 0:
        out.append(gz.compress(chunk[: min(filler, MiB)]))
        filler -= MiB
    out.append(gz.compress(tail + b"\0" * (-size % 512)))
    member = tarfile.TarInfo("transforms.json")
    member.size = 2
    out.append(gz.compress(member.tobuf(format=tarfile.USTAR_FORMAT) + b"{}" + b"\0" * 510))
    out.append(gz.compress(b"\0" * 1024))
    out.append(gz.flush())
    return b"".join(out)


@pytest.mark.parametrize("typeflag", [b"x", b"L"], ids=["pax", "gnu-longname"])
def test_tar_extended_header_bomb(api, typeflag):
    data = tar_meta_bomb(typeflag, 160 * MiB)
    assert len(data) < 1 * MiB
    r, growth, slowest = send_measured(api, data, "scene.tar.gz")
    assert_contained(r, growth, slowest, (413,), "extended (pax / long name) header")


# -- zip: a central directory of many tiny records ---------------------------------------------
def zip_of_records(n: int, declared: int) -> bytes:
    """`n` central-directory records of empty stored files (no local data: zipfile parses the
    directory before it reads any member), under an end record that declares `declared`."""
    local = struct.pack("<4s2B4HL2L2H", b"PK\x03\x04", 20, 0, 0, 0, 0, 0, 0, 0, 0, 7, 0)
    local += b"0000000"
    record = struct.pack(
        "<4s4B4HL2L5H2L",
        b"PK\x01\x02",
        20,
        3,
        20,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        7,
        0,
        0,
        0,
        0,
        0x81A4 << 16,
        0,
    )
    cd = b"".join(record + f"{i:07d}".encode() for i in range(n))
    count = min(declared, 0xFFFF)
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, count, count, len(cd), len(local), 0)
    return local + cd + end


@pytest.mark.parametrize("declared", ["honest", "lying"])
def test_zip_central_directory_of_many_records(api, declared):
    n = 400_000
    data = zip_of_records(n, n if declared == "honest" else 1)
    r, growth, slowest = send_measured(api, data, "scene.zip")
    assert_contained(r, growth, slowest, (413,), "MAX_ARCHIVE_ENTRIES")


# -- pose file: a transforms.json far past any real one ---------------------------------------
def transforms_bomb(n_frames: int) -> bytes:
    """A zip holding one transforms.json of `n_frames` frames of ~1.1 kB, deflated well under
    MAX_COMPRESSION_RATIO (each frame carries a few random digits) so the ratio checks pass."""
    import random

    rng = random.Random(0)
    frame = (
        '{"file_path": "images/%06d", "transform_matrix": [[1, 0, 0, 0], [0, 1, 0, 0], '
        '[0, 0, 1, 0], [0, 0, 0, 1]], "fl_x": 500.%03d, "note": "' + "x" * 1000 + '"}'
    )
    frames = ",".join(frame % (rng.randrange(10**6), rng.randrange(1000)) for _ in range(n_frames))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("transforms.json", '{"camera_angle_x": 0.8, "frames": [' + frames + "]}")
    return buf.getvalue()


def test_pose_file_bomb(api):
    data = transforms_bomb(36_000)  # 39 MiB of JSON
    assert len(data) < 1 * MiB
    r, growth, slowest = send_measured(api, data, "scene.zip")
    assert_contained(r, growth, slowest, (413,), "limit of a pose file")


# -- folders: deep paths create far more folders than entries ---------------------------------
def deep_folders(n_files: int, depth: int) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for i in range(n_files):
            zf.writestr("/".join([f"d{i}"] + ["f"] * depth) + "/x.txt", b"x")
    return buf.getvalue()


def test_implied_folders_count_as_entries(api):
    data = deep_folders(100, 30)  # 100 files, 3,100 folders: over MAX_ARCHIVE_ENTRIES (2,000)
    r, growth, slowest = send_measured(api, data, "scene.zip")
    assert_contained(r, growth, slowest, (413,), "counting the folders")
    assert not list((api.data_dir / "jobs").glob("*/upload")), "the extraction was left behind"


# -- video: a frame too big to decode ----------------------------------------------------------
def big_frame_video(width: int, height: int, frames: int = 8) -> bytes:
    """MJPEG frames of one black picture (encoded once, muxed `frames` times) in Matroska."""
    import av
    import numpy as np

    buf = io.BytesIO()
    with av.open(buf, "w", format="matroska") as out:
        stream = out.add_stream("mjpeg", rate=4)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuvj420p"
        img = av.VideoFrame.from_ndarray(np.zeros((height, width, 3), np.uint8), format="rgb24")
        first = [*stream.encode(img), *stream.encode()][0]
        for i in range(frames):
            packet = av.Packet(bytes(first))
            packet.stream, packet.time_base, packet.pts, packet.dts = stream, first.time_base, i, i
            out.mux(packet)
    return buf.getvalue()


def test_video_frame_over_the_pixel_cap(api):
    data = big_frame_video(7000, 6000)  # 42 MP per frame, over MAX_IMAGE_PIXELS (40 MP)
    r, growth, slowest = send_measured(api, data, "walk.mkv")
    assert_contained(r, growth, slowest, (422,), "MAX_IMAGE_PIXELS")


def test_an_honest_upload_still_passes(api):
    r, growth, slowest = send_measured(api, png_bytes(32, 32), "photo.png", kind="image")
    assert r.status_code == 202, r.text
    assert growth < MEMORY_BOUND and slowest < HEALTHZ_BOUND_S
