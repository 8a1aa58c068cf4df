"""Archive safety: hostile .zip / .tar uploads are refused and never write outside their folder."""

from __future__ import annotations

import io
import os
import stat
import struct
import tarfile
import zipfile
from pathlib import Path

import pytest

from core.settings import Settings
from service.intake import IntakeError
from service.intake.archive import ArchiveLimits, extract_archive
from service.intake.nerf import validate_upload


def make_zip(
    entries: list[tuple[zipfile.ZipInfo | str, bytes]], method=zipfile.ZIP_DEFLATED
) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", method) as zf:
        for info, data in entries:
            if isinstance(info, str):
                info = zipfile.ZipInfo(info)
                info.compress_type = method
            zf.writestr(info, data)
    return buf.getvalue()


def make_tar(members: list[tuple[tarfile.TarInfo, bytes | None]], mode="w") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as tf:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tf.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def tinfo(name: str, kind=tarfile.REGTYPE, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    return info


def extract(tmp_path: Path, data: bytes, limits: ArchiveLimits | None = None):
    """Extract into tmp/box/out; returns (files, out). Everything outside tmp/box is checked untouched."""
    box = tmp_path / "box"
    box.mkdir(parents=True, exist_ok=True)
    src = box / "upload.bin"
    src.write_bytes(data)
    before = sorted(str(p) for p in tmp_path.rglob("*") if not str(p).startswith(str(box / "out")))
    try:
        return extract_archive(src, box / "out", limits), box / "out"
    finally:
        after = sorted(
            str(p) for p in tmp_path.rglob("*") if not str(p).startswith(str(box / "out"))
        )
        assert after == before, "something was written outside the extraction folder"


def refused(tmp_path, data, status, *words, limits=None) -> str:
    with pytest.raises(IntakeError) as ei:
        extract(tmp_path, data, limits)
    assert ei.value.status_code == status, ei.value.detail
    for w in words:
        assert w.lower() in ei.value.detail.lower(), ei.value.detail
    return ei.value.detail


def test_good_zip_and_tar_extract(tmp_path):
    files = {"a/b.txt": b"hello", "a/c/d.bin": os.urandom(3000), "top.json": b"{}"}
    got, out = extract(tmp_path / "z", make_zip(list(files.items())))
    assert sorted(map(str, got)) == sorted(files)
    for name, data in files.items():
        assert (out / name).read_bytes() == data
    tar = make_tar(
        [(tinfo(n), d) for n, d in files.items()] + [(tinfo("a/emptydir", tarfile.DIRTYPE), None)],
        mode="w:gz",
    )
    got, out = extract(tmp_path / "t", tar)
    assert sorted(map(str, got)) == sorted(files)
    assert (out / "a/emptydir").is_dir()


@pytest.mark.parametrize(
    "name, words",
    [
        ("../evil.txt", ("outside",)),
        ("ok/../../evil.txt", ("outside",)),
        ("..\\evil.txt", ("outside",)),
        ("/tmp/evil_abs.txt", ("absolute",)),
        ("C:/evil.txt", ("absolute",)),
    ],
)
def test_zip_slip_and_absolute_paths(tmp_path, name, words):
    refused(tmp_path, make_zip([("fine.txt", b"x"), (name, b"pwned")]), 400, *words)
    assert not Path("/tmp/evil_abs.txt").exists()


@pytest.mark.parametrize("name", ["../evil.txt", "/tmp/evil_abs_tar.txt", "a/../../evil.txt"])
def test_tar_slip(tmp_path, name):
    refused(tmp_path, make_tar([(tinfo(name), b"pwned")]), 400)
    assert not Path("/tmp/evil_abs_tar.txt").exists()


def test_zip_symlink(tmp_path):
    info = zipfile.ZipInfo("link")
    info.external_attr = (stat.S_IFLNK | 0o777) << 16
    refused(tmp_path, make_zip([(info, b"/etc/passwd")]), 400, "symbolic link")


def test_zip_device_file(tmp_path):
    info = zipfile.ZipInfo("dev")
    info.external_attr = (stat.S_IFCHR | 0o666) << 16
    refused(tmp_path, make_zip([(info, b"")]), 400, "special file")


@pytest.mark.parametrize(
    "kind, words",
    [
        (tarfile.SYMTYPE, ("symbolic link",)),
        (tarfile.LNKTYPE, ("hard link",)),
        (tarfile.CHRTYPE, ("special file",)),
        (tarfile.BLKTYPE, ("special file",)),
        (tarfile.FIFOTYPE, ("special file",)),
    ],
)
def test_tar_links_and_devices(tmp_path, kind, words):
    data = make_tar([(tinfo("ok.txt"), b"fine"), (tinfo("x", kind, linkname="ok.txt"), None)])
    refused(tmp_path, data, 400, *words)


def test_symlink_then_write_through_it(tmp_path):
    # The classic two-step: a link to outside, then a file "through" it.
    data = make_tar(
        [(tinfo("d", tarfile.SYMTYPE, linkname=str(tmp_path)), None), (tinfo("d/evil.txt"), b"x")]
    )
    refused(tmp_path, data, 400, "link")
    assert not (tmp_path / "evil.txt").exists()


def test_zip_bomb_by_ratio_from_headers(tmp_path):
    detail = refused(tmp_path, make_zip([("zeros.bin", bytes(20 << 20))]), 413, "zip bomb")
    assert "zeros.bin" in detail


def test_tar_gz_bomb_stopped_while_streaming(tmp_path):
    # Tar headers carry no compressed size: only counting what is written catches this one.
    data = make_tar([(tinfo("zeros.bin"), bytes(8 << 20))], mode="w:gz")
    refused(tmp_path, data, 413, "zip bomb")
    assert not list((tmp_path / "box" / "out").rglob("zeros.bin")) or (
        tmp_path / "box/out/zeros.bin"
    ).stat().st_size < (8 << 20)


def test_total_size_limit(tmp_path):
    data = make_zip([("a.bin", os.urandom(3000)), ("b.bin", os.urandom(3000))])
    refused(tmp_path, data, 413, "over the limit", limits=ArchiveLimits(max_total_bytes=5000))
    tar = make_tar([(tinfo("a.bin"), os.urandom(3000)), (tinfo("b.bin"), os.urandom(3000))])
    refused(tmp_path / "t", tar, 413, "over the limit", limits=ArchiveLimits(max_total_bytes=5000))


def test_entry_count_limit(tmp_path):
    entries = [(f"f{i}.txt", b"x") for i in range(11)]
    refused(tmp_path, make_zip(entries), 413, "entries", limits=ArchiveLimits(max_entries=10))
    tar = make_tar([(tinfo(n), d) for n, d in entries])
    refused(tmp_path / "t", tar, 413, "entries", limits=ArchiveLimits(max_entries=10))


def _patch_sizes(data: bytes, new_size: int) -> bytes:
    """Rewrite the uncompressed size in the local header and the central directory (a lying header)."""
    b = bytearray(data)
    local = b.find(b"PK\x03\x04")
    struct.pack_into("<I", b, local + 22, new_size)
    central = b.find(b"PK\x01\x02")
    struct.pack_into("<I", b, central + 24, new_size)
    return bytes(b)


def test_zip_header_lying_about_size(tmp_path):
    real = os.urandom(50_000)
    data = _patch_sizes(make_zip([("lie.bin", real)], method=zipfile.ZIP_STORED), 1000)
    refused(tmp_path, data, 400, "lie.bin")
    out = tmp_path / "box" / "out" / "lie.bin"
    assert not out.exists() or out.stat().st_size <= 1000


def test_duplicate_entries(tmp_path):
    with pytest.warns(UserWarning):
        data = make_zip([("same.txt", b"first"), ("same.txt", b"second")])
    refused(tmp_path, data, 400, "twice")


def test_not_an_archive_and_corrupt(tmp_path):
    refused(tmp_path, b"just some text, not an archive", 415, "not a .zip")
    good = make_zip([("a.bin", os.urandom(5000))])
    refused(tmp_path / "c", good[: len(good) // 2] + b"\0" * 22, 400)
    tar = make_tar([(tinfo("a.bin"), os.urandom(5000))], mode="w:gz")
    refused(tmp_path / "t", tar[: len(tar) // 2], 400)


def test_validate_upload_cleans_up_after_an_attack(tmp_path):
    job = tmp_path / "jobs" / "j"
    (job / "upload").mkdir(parents=True)
    src = job / "upload" / "x.zip"
    src.write_bytes(
        make_zip([("transforms_train.json", b"{}"), ("../../../escaped.txt", b"pwned")])
    )
    with pytest.raises(IntakeError) as ei:
        validate_upload(src, "x.zip", {}, job, Settings(data_dir=tmp_path))
    assert ei.value.status_code == 400
    assert not list(tmp_path.rglob("escaped.txt"))
    assert sorted(p.name for p in job.rglob("*")) == ["upload", "x.zip"]


def test_file_and_folder_with_the_same_name(tmp_path):
    refused(tmp_path, make_zip([("a", b"file"), ("a/b.txt", b"x")]), 400, "clashes")
    refused(
        tmp_path / "t", make_tar([(tinfo("a"), b"file"), (tinfo("a/b.txt"), b"x")]), 400, "clashes"
    )


@pytest.mark.parametrize("mode", ["zip", "tgz"])
def test_damaged_archives_give_4xx_never_a_crash(tmp_path, mode):
    """Random byte damage to a valid dataset archive: accepted, or refused with IntakeError, nothing else."""
    import random

    from experiments.synthetic_scene import scene_files

    files = scene_files(size=16, n_train=8, n_test=2)
    if mode == "zip":
        good = make_zip(list(files.items()))
    else:
        good = make_tar([(tinfo(n), d) for n, d in files.items()], mode="w:gz")
    rnd = random.Random(1)
    outcomes = {"accepted": 0, "refused": 0}
    for k in range(120):
        data = bytearray(good)
        for _ in range(rnd.randint(1, 6)):
            data[rnd.randrange(len(data))] = rnd.randrange(256)
        job = tmp_path / f"j{k}"
        (job / "upload").mkdir(parents=True)
        (job / "upload" / "x").write_bytes(bytes(data))
        try:
            validate_upload(job / "upload" / "x", "x", {}, job, Settings(data_dir=tmp_path))
            outcomes["accepted"] += 1
        except IntakeError as exc:
            assert 400 <= exc.status_code < 500
            outcomes["refused"] += 1
    assert outcomes["refused"] > 0
