"""core.storage.atomic_write_bytes: the new file is on disk (the file and its folder entry
fsynced) before the call returns."""

from __future__ import annotations

import os

from core import storage


def test_file_then_folder_fsynced(tmp_path, monkeypatch):
    synced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real_fsync(fd)

    monkeypatch.setattr(storage.os, "fsync", recording_fsync)
    target = tmp_path / "sub" / "latest"
    storage.atomic_write_bytes(target, b"12")
    assert target.read_bytes() == b"12"
    # the temp file (renamed to `latest` afterwards), then the folder holding the new name
    assert len(synced) == 2 and ".latest." in synced[0], synced
    assert synced[1] == str(target.parent)
    assert os.listdir(target.parent) == ["latest"]  # no temp file left
